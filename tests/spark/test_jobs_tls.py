"""The offline jobs on a secured cluster: three bookies with mutual TLS (``bk_server.conf`` keys,
PEM files of the shared ``zk_tls_pki``), a client settings file given as ``vellum spark
--client-conf`` or ``$VELLUM_CLIENT_CONF`` (the same option as ``vellum shell``).

``replica-check`` with the settings finds every copy; without them, or with a bookie down, the
bookies it cannot ask are reported *unreachable* with their error, never as missing copies, and
ledgers the lost bookie never held stay clean.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from vellum.cli.main import cli
from vellum.config import TLS_CONTEXT_FACTORY, load_client_config
from vellum.testing.local_cluster import LocalCluster
from vellum.testing.zookeeper import TlsTestPki


def _bookie_tls(p: TlsTestPki) -> dict[str, str]:
    return {
        "tlsProviderFactoryClass": TLS_CONTEXT_FACTORY, "tlsKeyStoreType": "PEM",
        "tlsKeyStore": str(p.bookie.key), "tlsCertificatePath": str(p.bookie.cert),
        "tlsTrustStoreType": "PEM", "tlsTrustStore": str(p.ca), "tlsClientAuthentication": "true",
    }


def _client_conf(p: TlsTestPki, path: Path) -> Path:
    path.write_text(f"tlsProviderFactoryClass={TLS_CONTEXT_FACTORY}\ntlsTrustStore={p.ca}\n"
                    f"tlsCertificatePath={p.client.cert}\ntlsKeyStore={p.client.key}\n"
                    "readEntryTimeoutSec=5\naddEntryTimeoutSec=5\n")
    return path


def _check(uri: str, *args: str, env: dict[str, str | None] | None = None) -> dict[str, Any]:
    res = CliRunner().invoke(cli, ["spark", *args, "replica-check", "--metadata-uri", uri, "--json"], env=env)
    assert res.exit_code == 0, (res.output, res.exception)
    out: dict[str, Any] = json.loads(res.stdout)
    return out


def test_replica_check_on_a_tls_cluster(spark: Any, zk_tls_pki: TlsTestPki, tmp_path: Path) -> None:
    import vellum

    conf_file = _client_conf(zk_tls_pki, tmp_path / "client.conf")
    with LocalCluster(tmp_path / "c", bookies=3, bookie_conf=_bookie_tls(zk_tls_pki)) as cluster:
        uri = cluster.metadata_uri
        lost = cluster.bookie_ids[0]
        on_lost: set[int] = set()
        elsewhere: set[int] = set()
        with vellum.BookKeeper(uri, config=load_client_config(conf_file)) as bk:
            for _ in range(40):  # E=2 of 3 bookies: ledgers with and without the bookie to lose
                if len(on_lost) >= 2 and len(elsewhere) >= 2:
                    break
                lh = bk.create_ledger(ensemble_size=2, write_quorum_size=2, ack_quorum_size=2)
                for i in range(5):
                    lh.append(b"entry-%d" % i)
                lh.close()
                (on_lost if lost in {str(b) for b in lh.metadata.last_ensemble} else elsewhere).add(int(lh.ledger_id))
        assert len(on_lost) >= 2 and len(elsewhere) >= 2, (on_lost, elsewhere)
        everything = on_lost | elsewhere

        # With the client settings (flag, or the environment variable): every copy is found.
        for args, env in (((f"--client-conf={conf_file}",), None), ((), {"VELLUM_CLIENT_CONF": str(conf_file)})):
            got = _check(uri, *args, env=env)
            assert got["ledgersChecked"] == len(everything) and got["problems"] == [], got

        # Without them the TLS bookies refuse the checker: unreachable, with the reason; no
        # copy is reported missing.
        got = _check(uri, env={"VELLUM_CLIENT_CONF": None})
        assert {p["ledgerId"] for p in got["problems"]} == everything, got
        for p in got["problems"]:
            assert p["status"] == "unreachable" and p["missingCopies"] == 0, p
            assert p["unreachable"] and all(err for err in p["unreachable"].values()), p

        # A lost bookie: only the ledgers it held are flagged, as unreachable there.
        cluster.kill(0)
        got = _check(uri, f"--client-conf={conf_file}")
        assert got["ledgersChecked"] == len(everything)
        assert {p["ledgerId"] for p in got["problems"]} == on_lost, got
        for p in got["problems"]:
            assert (p["status"], p["missingCopies"], list(p["unreachable"])) == ("unreachable", 0, [lost]), p
            assert p["unreachable"][lost], p

        # The readable table says which bookie could not be asked, and why.
        res = CliRunner().invoke(cli, ["spark", "--client-conf", str(conf_file), "replica-check",
                                       "--metadata-uri", uri])
        assert res.exit_code == 0, res.output
        assert "unreachable" in res.stdout and lost in res.stdout
        assert f"could not ask {lost}" in res.stderr
