"""TLS end to end on real bookie processes (``LocalCluster``): two bookies configured from
``bk_server.conf`` with mutual TLS (BookKeeper's keys, PEM files made by ``vellum.security.pki``)
and a one-second certificate refresh; clients from ``ClientConfig``.

An authorized TLS client writes and reads; a plaintext client, a client certificate from another
CA and an expired one are refused with a clear error on the client and a log line on the bookie
naming the peer and the reason, and store nothing; a replaced bookie certificate is presented to
new connections without a restart."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from security_testkit import Pki, client_settings, make_pki, presented_certificate, run

from vellum.aio import BookKeeper
from vellum.config import TLS_CONTEXT_FACTORY, ClientConfig
from vellum.errors import NoSuchLedgerError, SecurityError
from vellum.security import pki
from vellum.security.pki import CertificateFiles
from vellum.testing.local_cluster import LocalCluster


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Pki]]:
    p = make_pki(tmp_path_factory.mktemp("pki"))
    conf = {
        "tlsProviderFactoryClass": TLS_CONTEXT_FACTORY,
        "tlsKeyStoreType": "PEM",
        "tlsKeyStore": str(p.bookie.key),
        "tlsCertificatePath": str(p.bookie.cert),
        "tlsTrustStoreType": "PEM",
        "tlsTrustStore": str(p.ca.cert),
        "tlsClientAuthentication": "true",
        "tlsCertFilesRefreshDurationSeconds": "1",
    }
    with LocalCluster(tmp_path_factory.mktemp("cluster"), bookies=2, bookie_conf=conf) as cluster:
        yield cluster, p


def client_config(p: Pki, cert: CertificateFiles | None, *, tls: bool = True) -> ClientConfig:
    base = {"ensemble_size": 2, "write_quorum_size": 2, "ack_quorum_size": 2,
            "add_entry_timeout_s": 5.0, "read_entry_timeout_s": 5.0}
    if not tls:
        return ClientConfig(**base)
    keys = {"tls_certificate_path": str(cert.cert), "tls_key_store": str(cert.key)} if cert else {}
    return ClientConfig(tls_provider_factory_class=TLS_CONTEXT_FACTORY, tls_trust_store=str(p.ca.cert),
                        **keys, **base)


def logs(cluster: LocalCluster) -> str:
    return "".join(cluster.log_text(i) for i in range(len(cluster.bookie_ids)))


def wait_for_log(cluster: LocalCluster, text: str, timeout_s: float = 10.0) -> None:
    cluster.wait_until(lambda: text in logs(cluster), timeout_s=timeout_s, what=f"bookie log line {text!r}")


def test_a_tls_client_writes_and_reads(secured: tuple[LocalCluster, Pki]) -> None:
    cluster, p = secured

    async def main() -> None:
        async with BookKeeper(cluster.metadata_uri, config=client_config(p, p.client)) as bk:
            lh = await bk.create_ledger()
            assert await asyncio.gather(*(lh.append_async(b"secret %d" % i) for i in range(50))) == list(range(50))
            await lh.close()
        async with BookKeeper(cluster.metadata_uri, config=client_config(p, p.admin)) as bk:
            rh = await bk.open_ledger(lh.ledger_id)
            assert [e.payload for e in await rh.read(0, 49)] == [b"secret %d" % i for i in range(50)]

    run(main())
    wait_for_log(cluster, "principal 'alice', roles ['client']")
    assert "principal 'root', roles ['admin']" in logs(cluster)


@pytest.mark.parametrize(
    ("who", "client_says", "bookie_says"),
    [
        ("plaintext", "requires TLS and this client is configured without it", "plaintext request refused: this "
                                                                                "bookie requires TLS (peer ('127.0.0.1'"),
        ("other_ca_client", "refused this client", "failed: unable to get local issuer certificate"),
        ("expired_client", "refused this client", "failed: certificate has expired"),
    ],
)
def test_refused_clients_get_a_clear_error_and_store_nothing(
    secured: tuple[LocalCluster, Pki], who: str, client_says: str, bookie_says: str
) -> None:
    cluster, p = secured
    config = client_config(p, None, tls=False) if who == "plaintext" else client_config(p, getattr(p, who))

    async def main() -> int:
        async with BookKeeper(cluster.metadata_uri, config=config) as bk:
            lh = await bk.create_ledger()
            with pytest.raises(SecurityError, match=client_says):
                await lh.append(b"must not be stored")
            return lh.ledger_id

    ledger_id = run(main())
    wait_for_log(cluster, bookie_says)

    async def nothing_stored() -> None:
        async with BookKeeper(cluster.metadata_uri, config=client_config(p, p.admin)) as bk:
            for bookie_id in cluster.bookie_ids:
                with pytest.raises(NoSuchLedgerError):  # not one entry of it reached a bookie
                    await bk.bookie_client.list_entries(bookie_id, ledger_id)

    run(nothing_stored())


def test_a_replaced_certificate_is_used_without_a_restart(secured: tuple[LocalCluster, Pki], tmp_path: Path) -> None:
    cluster, p = secured
    settings = client_settings(p, p.client)
    port = int(cluster.bookie_ids[0].rsplit(":", 1)[1])
    assert pki.principal_of(run(presented_certificate(port, settings))) == "bookie-1"
    ready_lines = logs(cluster).count("READY ")

    # Rotation as an operator does it: new files written next to the old, renamed over them.
    ca = pki.load_ca(p.base / "ca")
    staged = pki.write_certificate(pki.issue_certificate(ca, name="bookie-1-renewed", role="bookie"), tmp_path)
    shutil.copy(staged.key, p.bookie.key.with_suffix(".new"))
    shutil.copy(staged.cert, p.bookie.cert.with_suffix(".new"))
    p.bookie.key.with_suffix(".new").replace(p.bookie.key)
    p.bookie.cert.with_suffix(".new").replace(p.bookie.cert)

    deadline = time.monotonic() + 15
    while pki.principal_of(run(presented_certificate(port, settings))) != "bookie-1-renewed":
        assert time.monotonic() < deadline, "the bookie still presents its old certificate"
        time.sleep(0.3)
    wait_for_log(cluster, "server TLS certificates reloaded")
    assert logs(cluster).count("READY ") == ready_lines, "no bookie restarted"
    test_a_tls_client_writes_and_reads(secured)
