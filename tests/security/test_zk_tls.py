"""TLS on the ZooKeeper connection (``zkTlsEnabled`` and the ``zkTls*`` keys) against Debian's
real ZooKeeper 3.8 serving a ``secureClientPort`` with mutual TLS (``zk_tls_server`` in
``tests/conftest.py``).

Covered: the metadata store works over TLS (format, create and read a ledger, register a
bookie) and the session really is TLS; a bookie process, with the AutoRecovery daemon, and a
client write and read through a cluster whose only ZooKeeper address is the TLS port, and the
shell (``--client-conf``) reads it; every mismatch fails fast with a message naming the
ZooKeeper address and what to check: a plaintext client on the TLS port, a certificate from
another CA, no certificate, a trust store of another CA, a TLS client on the plaintext port, a
certificate that does not name the host; a bookie without the keys exits with the reason; the
keys pass through the bookie's own client settings and Spark's options; bad key combinations
and files are refused before connecting."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from vellum.aio import BookKeeper
from vellum.cli.main import cli
from vellum.client.metadata_security import open_configured_store, zk_tls
from vellum.config import ClientConfig, ServerConfig, build_config
from vellum.errors import ConfigError, MetaStoreError, SecurityError
from vellum.ids import BookieId
from vellum.meta.model import LedgerMetadata
from vellum.meta.zk_tls import diagnose
from vellum.security import pki
from vellum.security.tls import TlsSettings, server_context
from vellum.service import bookie_client_config
from vellum.spark.connection import client_config as spark_client_config
from vellum.testing.local_cluster import LocalCluster
from vellum.testing.zookeeper import TlsTestPki, ZooKeeperServer


def config(keys: dict[str, str]) -> ClientConfig:
    return build_config(ClientConfig, keys, source="test")


def metadata() -> LedgerMetadata:
    return LedgerMetadata(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1,
                          ensembles={0: (BookieId("127.0.0.1:3181"),)}, password=b"pw")


def root_uri(zk: ZooKeeperServer, *, secure: bool = True) -> str:
    root = f"/tls-{uuid.uuid4().hex[:8]}"
    return zk.secure_uri("zk+hierarchical", root) if secure else zk.uri("zk+hierarchical", root)


def test_the_metadata_store_works_over_tls(zk_tls_server: ZooKeeperServer, zk_tls_pki: TlsTestPki) -> None:
    uri = root_uri(zk_tls_server)
    with open_configured_store(uri, config(zk_tls_pki.client_keys())) as store:
        assert isinstance(store.client._connection._socket, ssl.SSLSocket)  # type: ignore[attr-defined]
        store.format()
        ledger_id, _ = store.ledgers.create_ledger(metadata())
        assert store.ledgers.read_ledger(ledger_id).value.password == b"pw"
        store.registration.register_bookie(BookieId("127.0.0.1:3181"), read_only=False)
        assert store.registration.list_bookies() == frozenset({BookieId("127.0.0.1:3181")})
    # a bookie certificate works as well, and a second session sees what the first wrote
    with open_configured_store(uri, config(zk_tls_pki.client_keys(zk_tls_pki.bookie))) as store:
        assert store.is_formatted()
        assert store.ledgers.read_ledger(ledger_id).value.ensemble_size == 1


@pytest.fixture(scope="module")
def tls_cluster(zk_tls_server: ZooKeeperServer, zk_tls_pki: TlsTestPki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    conf = {**zk_tls_pki.client_keys(zk_tls_pki.bookie), "autoRecoveryDaemonEnabled": "true"}
    with LocalCluster(tmp_path_factory.mktemp("zk-tls-cluster"), bookies=1, metadata_uri=root_uri(zk_tls_server),
                      bookie_conf=conf) as cluster:
        yield cluster


def test_a_bookie_and_a_client_work_through_a_tls_zookeeper(
    zk_tls_server: ZooKeeperServer, zk_tls_pki: TlsTestPki, tls_cluster: LocalCluster, tmp_path: Path
) -> None:
    cfg = build_config(ClientConfig, {**zk_tls_pki.client_keys(), "ensembleSize": "1", "writeQuorumSize": "1",
                                      "ackQuorumSize": "1"}, source="test")

    async def main() -> int:
        async with BookKeeper(tls_cluster.metadata_uri, config=cfg) as bk:
            lh = await bk.create_ledger()
            assert await asyncio.gather(*(lh.append_async(b"entry %d" % i) for i in range(20))) == list(range(20))
            await lh.close()
            rh = await bk.open_ledger(lh.ledger_id)
            assert [e.payload for e in await rh.read(0, 19)] == [b"entry %d" % i for i in range(20)]
            return lh.ledger_id

    ledger_id = asyncio.run(main())
    assert tls_cluster.registered()[0] == frozenset(tls_cluster.bookie_ids)

    # the shell, with the same keys in a --client-conf file; the bookie's AutoRecovery daemon
    # (its own client, from the bookie's zkTls* keys) was elected auditor through the TLS port
    conf = tmp_path / "client.conf"
    conf.write_text("".join(f"{k}={v}\n" for k, v in zk_tls_pki.client_keys().items()))
    out = CliRunner().invoke(cli, ["shell", "--client-conf", str(conf), "listledgers", "--uri",
                                   tls_cluster.metadata_uri, "--json"])
    assert out.exit_code == 0, out.output
    assert ledger_id in json.loads(out.output)["ledgers"]
    deadline = time.monotonic() + 30
    while True:
        who = CliRunner().invoke(cli, ["shell", "--client-conf", str(conf), "whoisauditor", "--uri",
                                       tls_cluster.metadata_uri, "--json"])
        assert who.exit_code == 0, who.output
        if json.loads(who.output)["auditor"] == tls_cluster.bookie_ids[0] or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert json.loads(who.output)["auditor"] == tls_cluster.bookie_ids[0]
    # without the keys the shell is refused, with what to set (`vellum` prints it as "error: ...")
    plain = CliRunner().invoke(cli, ["shell", "listbookies", "--uri", tls_cluster.metadata_uri],
                               env={"VELLUM_CLIENT_CONF": ""})
    assert plain.exit_code != 0
    assert "set zkTlsEnabled=true" in str(plain.exception or plain.output)


def refused(uri: str, keys: dict[str, str]) -> str:
    """Open ``uri`` with ``keys``: the MetaStoreError's message; fails if it took long."""
    started = time.monotonic()
    with pytest.raises(MetaStoreError) as info:
        open_configured_store(uri, config(keys), connect_timeout_s=15.0)
    assert time.monotonic() - started < 8.0, "a TLS mismatch must fail early, not at the connect timeout"
    return str(info.value)


def test_a_plaintext_client_on_the_tls_port_is_told_to_switch_tls_on(zk_tls_server: ZooKeeperServer, zk_tls_pki: TlsTestPki) -> None:
    message = refused(root_uri(zk_tls_server), {})
    assert f"ZooKeeper at {zk_tls_server.secure_hosts} speaks TLS on this port" in message
    assert "set zkTlsEnabled=true with zkTlsTrustStore" in message


def test_a_certificate_from_another_ca_is_refused(zk_tls_server: ZooKeeperServer, zk_tls_pki: TlsTestPki) -> None:
    message = refused(root_uri(zk_tls_server), zk_tls_pki.client_keys(zk_tls_pki.stranger))
    assert f"ZooKeeper at {zk_tls_server.secure_hosts} refused this client's certificate" in message
    assert str(zk_tls_pki.stranger.cert) in message
    assert "issued by a CA in ZooKeeper's ssl.trustStore.location" in message


def test_a_client_without_a_certificate_is_told_it_needs_one(zk_tls_server: ZooKeeperServer, zk_tls_pki: TlsTestPki) -> None:
    keys = {"zkTlsEnabled": "true", "zkTlsTrustStore": str(zk_tls_pki.ca)}
    message = refused(root_uri(zk_tls_server), keys)
    assert f"ZooKeeper at {zk_tls_server.secure_hosts} refused the TLS connection" in message
    assert "requires a client certificate" in message and "zkTlsCertificatePath" in message


def test_a_trust_store_of_another_ca_does_not_trust_zookeeper(zk_tls_server: ZooKeeperServer, zk_tls_pki: TlsTestPki) -> None:
    keys = zk_tls_pki.client_keys(trust=zk_tls_pki.stranger.ca)
    message = refused(root_uri(zk_tls_server), keys)
    assert f"the TLS certificate of ZooKeeper at {zk_tls_server.secure_hosts} is not trusted" in message
    assert f"zkTlsTrustStore ({zk_tls_pki.stranger.ca})" in message


def test_a_tls_client_on_the_plaintext_port_is_told_to_use_the_secure_port(zk_tls_server: ZooKeeperServer, zk_tls_pki: TlsTestPki) -> None:
    message = refused(root_uri(zk_tls_server, secure=False), zk_tls_pki.client_keys())
    assert f"ZooKeeper at {zk_tls_server.hosts} answers in plaintext on this port" in message
    assert "secureClientPort" in message


def test_hostname_verification_is_on_by_default(zk_tls_server: ZooKeeperServer, zk_tls_pki: TlsTestPki) -> None:
    # the certificate names 127.0.0.1 and localhost: both pass; its CN "zookeeper" is no name to check
    uri = root_uri(zk_tls_server).replace("127.0.0.1", "localhost")
    with open_configured_store(uri, config(zk_tls_pki.client_keys())):
        pass
    assert config(zk_tls_pki.client_keys()).zk_tls_hostname_verification_enabled


def test_the_keys_reach_every_client_of_the_cluster(zk_tls_server: ZooKeeperServer, zk_tls_pki: TlsTestPki, tmp_path: Path) -> None:
    # a bookie's own client (re-replication, AutoRecovery, `vellum autorecovery`)
    server = build_config(ServerConfig, zk_tls_pki.client_keys(zk_tls_pki.bookie), source="bk_server.conf")
    own = bookie_client_config(server, "the AutoRecovery client")
    assert own.zk_tls_enabled and own.zk_tls_key_store == str(zk_tls_pki.bookie.key)
    assert own.zk_tls_trust_store == str(zk_tls_pki.ca) and own.zk_tls_hostname_verification_enabled
    # Spark: options arrive lower-cased (bookkeeper.zkTlsEnabled -> zktlsenabled)
    options = tuple((k.lower(), v) for k, v in zk_tls_pki.client_keys().items())
    spark = spark_client_config(zk_tls_server.secure_uri(), options)
    assert spark.zk_tls_enabled and spark.zk_tls_certificate_path == str(zk_tls_pki.client.cert)
    # ZooKeeper's PEM key store layout (key and certificate in one file) given as one key
    combined = tmp_path / "alice.pem"
    combined.write_bytes(zk_tls_pki.client.key.read_bytes() + zk_tls_pki.client.cert.read_bytes())
    combined.chmod(0o600)
    one_file = {"zkTlsEnabled": "true", "zkTlsTrustStore": str(zk_tls_pki.ca), "zkTlsKeyStore": str(combined)}
    with open_configured_store(root_uri(zk_tls_server), config(one_file)):
        pass


def test_bad_zk_tls_settings_are_refused_before_connecting(zk_tls_pki: TlsTestPki, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="zkTlsEnabled=true needs zkTlsTrustStore"):
        config({"zkTlsEnabled": "true"})
    with pytest.raises(ConfigError, match="zkTlsKeyStorePasswordPath needs zkTlsKeyStore"):
        config({"zkTlsKeyStorePasswordPath": "/etc/pw"})
    missing = {**zk_tls_pki.client_keys(), "zkTlsTrustStore": str(tmp_path / "nope.pem")}
    with pytest.raises(SecurityError, match=r"zkTlsTrustStore=.*nope.pem: no such file"):
        zk_tls(config(missing))
    wrong_key = {**zk_tls_pki.client_keys(), "zkTlsKeyStore": str(zk_tls_pki.bookie.key)}
    with pytest.raises(SecurityError, match=r"cannot load zkTlsCertificatePath=.* with zkTlsKeyStore="):
        zk_tls(config(wrong_key))
    # TLS settings do not matter to the embedded store
    with open_configured_store(f"sqlite:///{tmp_path / 'm.db'}", config(missing)) as store:
        assert not store.is_formatted()


def test_a_certificate_that_does_not_name_the_host_is_reported(zk_tls_pki: TlsTestPki, tmp_path: Path) -> None:
    # ZooKeeper's certificate names 127.0.0.1: a TLS server whose certificate names only another
    # host stands in for a ZooKeeper reached under a name its certificate lacks
    ca = pki.load_ca(zk_tls_pki.ca.parent)
    elsewhere = pki.write_certificate(pki.issue_certificate(ca, name="zk", role="bookie", dns_names=("zk.example",),
                                                            ip_addresses=()), tmp_path / "elsewhere")
    server_ctx = server_context(TlsSettings(key_store=str(elsewhere.key), certificate_path=str(elsewhere.cert)))
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def serve() -> None:
            conn, _ = listener.accept()
            with conn, contextlib.suppress(OSError):
                server_ctx.wrap_socket(conn, server_side=True)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        message = diagnose(f"127.0.0.1:{port}", zk_tls(config(zk_tls_pki.client_keys())))
        thread.join(5)
    assert message is not None
    assert f"the TLS certificate of ZooKeeper at 127.0.0.1:{port} does not name 127.0.0.1" in message
    assert "zkTlsHostnameVerificationEnabled=false" in message


def test_a_bookie_without_the_keys_exits_with_the_reason(zk_tls_server: ZooKeeperServer, tmp_path: Path) -> None:
    conf = tmp_path / "bk_server.conf"
    conf.write_text(f"metadataServiceUri={root_uri(zk_tls_server)}\nbookiePort=0\nbookieId=127.0.0.1:3999\n"
                    f"journalDirectories={tmp_path / 'journal'}\nledgerDirectories={tmp_path / 'ledgers'}\n"
                    "httpServerEnabled=false\n")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "vellum.cli.main", "bookie", "--conf", str(conf)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"error: ZooKeeper at {zk_tls_server.secure_hosts} speaks TLS on this port" in proc.stderr
    assert time.monotonic() - started < 20


def test_digest_acls_work_over_tls(zk_tls_server: ZooKeeperServer, zk_tls_pki: TlsTestPki, tmp_path: Path) -> None:
    creds = tmp_path / "zk-digest"
    creds.write_text("vellum:s3cret\n")
    creds.chmod(0o600)
    keys = {**zk_tls_pki.client_keys(), "zkEnableSecurity": "true", "zkDigestAuthFile": str(creds)}
    uri = root_uri(zk_tls_server)
    with open_configured_store(uri, config(keys)) as store:
        store.format()
        acls, _ = store.client.get_acls(store.root)  # type: ignore[attr-defined]
        assert [(a.id.scheme, a.id.id.split(":")[0]) for a in acls] == [("digest", "vellum")]
    tls_only = {k: v for k, v in keys.items() if k.startswith("zkTls")}
    with pytest.raises(MetaStoreError, match="protected by ZooKeeper ACLs: set zkEnableSecurity=true"):
        open_configured_store(uri, config(tls_only))
