"""An operator's BookKeeper configuration file loads as it is (docs/operations.md): every key BookKeeper
4.16-4.18 defines is honoured, accepted as not used (with the reason) or refused for values
Vellum cannot honour; a real bookie starts from a file that sets every key of BookKeeper's
shipped ``bk_server.conf`` and from Pulsar's overrides; bad files get errors naming file, line
and key."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from vellum import config_keys
from vellum.cli.main import cli
from vellum.config import ClientConfig, ServerConfig, load_server_config
from vellum.errors import ConfigError
from vellum.meta import open_metadata_store

KEYS_FILE = Path(__file__).parent / "data" / "bookkeeper-config-keys.tsv"
REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "bookkeeper-config-keys.md"


def _bk_keys() -> dict[str, str]:
    """key -> where BookKeeper defines it (Server, Client, Abstract, bk_server.conf, ...)."""
    out = {}
    for line in KEYS_FILE.read_text().splitlines():
        if line and not line.startswith("#"):
            key, _releases, where = line.split("\t")
            out[key] = where
    return out


def _field_keys(cls: type) -> dict[str, dataclasses.Field[object]]:
    return {f.metadata["key"]: f for f in dataclasses.fields(cls)}


def _classify(key: str) -> str:
    if key in _field_keys(ServerConfig) or key in _field_keys(ClientConfig) or key in config_keys.ALIASES:
        return "honoured"
    if key in config_keys.ACCEPTED:
        return "accepted"
    return "unclassified"


def test_the_vendored_key_list_matches_the_reference() -> None:
    if not REFERENCE.exists():
        pytest.skip(f"{REFERENCE} not beside the checkout")
    listed = {line.split("`")[1] for line in REFERENCE.read_text().splitlines() if line.startswith("| `")}
    assert listed == set(_bk_keys())


def test_every_bookkeeper_key_is_classified() -> None:
    keys = _bk_keys()
    assert len(keys) == 337
    unclassified = sorted(k for k in keys if _classify(k) == "unclassified")
    assert not unclassified, f"BookKeeper keys with no class: {unclassified}"
    # Every accepted key says why, and the refusal rules only name known keys.
    assert all(reason.strip() for reason in config_keys.ACCEPTED.values())
    assert set(config_keys.REFUSED_WHEN) <= set(keys)


def _value_for(key: str, tmp: Path) -> str:
    """A value BookKeeper accepts for ``key`` that keeps the bookie on this test's dirs."""
    fields = _field_keys(ServerConfig)
    special = {
        "journalDirectories": str(tmp / "journal"), "journalDirectory": str(tmp / "journal"),
        "ledgerDirectories": str(tmp / "ledgers"), "indexDirectories": str(tmp / "ledgers"),
        "bookiePort": "0", "bookieId": f"compat-{uuid.uuid4().hex[:6]}:3181", "httpServerPort": "0",
        "httpServerEnabled": "true", "ledgerStorageClass": "org.apache.bookkeeper.bookie.storage.ldb.DbLedgerStorage",
        "ledgerManagerFactoryClass": "org.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory",
        "metadataServiceUri": "",
    }
    if key in special:
        return special[key]
    if key in fields:
        default = fields[key].default
        if isinstance(default, tuple):
            return ",".join(default)
        if isinstance(default, bool):
            return str(default).lower()
        return str(default)
    if key in config_keys.REFUSED_WHEN:
        return ""  # unset: TLS, authentication and the like stay off
    lowered = key.lower()
    if lowered.endswith("class") or lowered.endswith("classprefix"):
        return "org.apache.bookkeeper.Example"
    if any(w in lowered for w in ("enable", "allow", "use", "check", "expose", "skip", "reuse", "persist")):
        return "false"
    return "1"


def test_a_bookie_starts_from_a_file_with_every_bk_server_conf_key(tmp_path: Path, zk_server: object) -> None:
    keys = [k for k, where in _bk_keys().items() if "bk_server.conf" in where]
    assert len(keys) > 200
    root = f"/compat-{uuid.uuid4().hex[:8]}/ledgers"
    values = {k: _value_for(k, tmp_path) for k in keys}
    values.pop("metadataServiceUri", None)  # the older spelling names the store
    values["zkServers"] = zk_server.hosts  # type: ignore[attr-defined]
    values["zkLedgersRootPath"] = root
    conf = tmp_path / "bk_server.conf"
    conf.write_text("".join(f"{k}={v}\n" for k, v in values.items()))

    accepted: dict[str, str] = {}
    cfg = load_server_config(conf, accepted=accepted)
    assert cfg.metadata_service_uri == f"zk+hierarchical://{zk_server.hosts}{root}"  # type: ignore[attr-defined]
    assert "ledgerStorageClass" in accepted and "numAddWorkerThreads" in accepted
    with open_metadata_store(cfg.metadata_service_uri) as store:
        store.format("hierarchical")

    log = tmp_path / "bookie.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "vellum.cli.main", "bookie", "--conf", str(conf)],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while "READY " not in log.read_text(errors="replace"):
            assert proc.poll() is None, f"bookie exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        text = log.read_text()
        assert "BookKeeper keys accepted, not used" in text
        assert "accepted, not used: " in text and "numAddWorkerThreads" in text
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


def test_pulsars_overrides_load(tmp_path: Path) -> None:
    conf = tmp_path / "bookkeeper.conf"
    conf.write_text(
        "ledgerStorageClass=org.apache.bookkeeper.bookie.storage.ldb.DbLedgerStorage\n"
        "journalFormatVersionToWrite=5\njournalAlignmentSize=4096\njournalMaxGroupWaitMSec=1\n"
        "numJournalCallbackThreads=8\nnumAddWorkerThreads=0\nmaxPendingReadRequestsPerThread=2500\n"
        "gcWaitTime=900000\nmajorCompactionThreshold=0.5\nforceAllowCompaction=true\nflushInterval=60000\n"
        "flushEntrylogBytes=33554432\nreadBufferSizeBytes=4096\nautoRecoveryDaemonEnabled=true\n"
        "useV2WireProtocol=true\nrereplicationEntryBatchSize=100\nfileInfoFormatVersionToWrite=0\n"
        "nettyMaxFrameSizeBytes=5253120\n"
        "reppDnsResolverClass=org.apache.pulsar.zookeeper.ZkBookieRackAffinityMapping\n"
        "zkServers=zk1:2181,zk2:2181\n"
    )
    accepted: dict[str, str] = {}
    cfg = load_server_config(conf, accepted=accepted)
    assert (cfg.journal_format_version_to_write, cfg.journal_alignment_size_bytes) == (5, 4096)
    assert (cfg.gc_wait_time_ms, cfg.flush_interval_ms, cfg.netty_max_frame_size_bytes) == (900000, 60000, 5253120)
    assert cfg.metadata_service_uri == "zk://zk1:2181;zk2:2181/ledgers"
    assert cfg.auto_recovery_daemon_enabled and cfg.rereplication_entry_batch_size == 100  # honoured
    assert set(accepted) >= {"numJournalCallbackThreads", "numAddWorkerThreads", "useV2WireProtocol"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ledgerStorageClass=org.apache.bookkeeper.bookie.InterleavedLedgerStorage\n",
         r"bk_server.conf:1 is refused: Vellum stores ledgers the DbLedgerStorage way"),
        ("bookiePort=3181\ntlsProviderFactoryClass=com.example.MyTlsFactory\n",
         r"tlsProviderFactoryClass=com.example.MyTlsFactory is refused: Vellum's TLS is BookKeeper's "
         r"TLSContextFactory.* in .*bk_server.conf"),
        ("tlsProviderFactoryClass=org.apache.bookkeeper.tls.TLSContextFactory\ntlsKeyStoreType=JKS\n"
         "tlsKeyStore=/k.pem\ntlsCertificatePath=/c.pem\n",
         r"tlsKeyStoreType=JKS is refused: Vellum reads PEM files only; convert the store"),
        ("tlsProviderFactoryClass=org.apache.bookkeeper.tls.TLSContextFactory\n",
         r"tlsProviderFactoryClass turns TLS on: set tlsCertificatePath and tlsKeyStore too"),
        ("zkEnableSecurity=true\n", r"zkEnableSecurity=true needs zkDigestAuthFile.* in .*bk_server.conf"),
        ("bookieAuthProviderFactoryClass=com.example.SaslAuth\n",
         r"bookieAuthProviderFactoryClass=com.example.SaslAuth is refused: Vellum's authentication providers"),
        ("authorizedRoles=client\n", r"authorizedRoles needs bookieAuthProviderFactoryClass"),
        ("zkServers=zk1:2181\nmetadataServiceUri=zk://zk9:2181/ledgers\n",
         r"zkServers/zkLedgersRootPath in .* say zk://zk1:2181/ledgers but metadataServiceUri says zk://zk9"),
        ("journalDirectory=/a\njournalDirectories=/b\n", r"journalDirectory=/a in .* disagrees with journalDirectories"),
        ("gcWaitTime=1000\n\ngcWaitTime=2000\n", r"bk_server.conf:3: gcWaitTime is given twice \(first on line 1\)"),
        ("flushInterval=1000\njournalMaxSizeMB=2 GB\n", r"journalMaxSizeMB='2 GB' is not a valid int: write a plain "
         r"number, without a unit.* in .*bk_server.conf:2"),
        ("bookiePort = 31 81\n", r"bookiePort='31 81' is not a valid int in .*bk_server.conf:1"),
        ("journalMaxGroupWaitMsec=5\n", r"unknown configuration key 'journalMaxGroupWaitMsec' in .*:1; did you mean"),
        ("ledgerManagerFactoryClass=com.example.MyManager\nzkServers=zk1:2181\n", "is not a ledger manager Vellum knows"),
    ],
)
def test_bad_files_name_the_file_the_line_and_the_key(tmp_path: Path, text: str, message: str) -> None:
    conf = tmp_path / "bk_server.conf"
    conf.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_server_config(conf)


def test_a_file_in_another_encoding_is_named_with_its_line(tmp_path: Path) -> None:
    conf = tmp_path / "bk_server.conf"
    conf.write_bytes("bookiePort=3181\n# r\u00e9pertoire des journaux\njournalDirectories=/a\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"bk_server.conf:2: byte 0xe9 is not UTF-8.*save it as UTF-8"):
        load_server_config(conf)


def test_config_show_says_what_each_key_of_the_file_does(tmp_path: Path) -> None:
    conf = tmp_path / "bk_server.conf"
    conf.write_text("bookiePort=3999\ngcWaitTime=600000\nnumAddWorkerThreads=0\nstatsProviderClass=x.Prom\n")
    run = CliRunner().invoke
    r = run(cli, ["config", "show", "--conf", str(conf), "--json"])
    assert r.exit_code == 0, r.output
    rows = {row["key"]: row for row in json.loads(r.output)}
    assert rows["bookiePort"]["status"] == "honoured" and rows["bookiePort"]["value"] == 3999
    assert rows["gcWaitTime"]["status"] == "honoured"  # set in the file, to the default
    assert rows["journalMaxSizeMB"]["status"] == "default"
    assert rows["numAddWorkerThreads"]["status"] == "accepted, not used"
    assert "thread" in rows["numAddWorkerThreads"]["description"]
    assert "Prometheus" in rows["statsProviderClass"]["description"]
    r = run(cli, ["config", "show", "--conf", str(conf), "--diff", "--json"])
    diff = {row["key"] for row in json.loads(r.output)}
    assert diff == {"bookiePort", "numAddWorkerThreads", "statsProviderClass"}
    r = run(cli, ["config", "show", "--conf", str(conf), "--diff"])
    assert r.exit_code == 0 and "accepted, not used" in r.output and "differences only" in r.output
