"""Fixtures shared by every suite: one real ZooKeeper server per test session, and (for the
tests of TLS to ZooKeeper) one that also serves a TLS ``secureClientPort``."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from vellum.testing.zookeeper import TlsTestPki, ZooKeeperServer, missing_reason


def _require_zookeeper() -> None:
    reason = missing_reason()
    if reason is not None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI requires a real ZooKeeper: {reason}")
        pytest.skip(f"real ZooKeeper unavailable: {reason}")


@pytest.fixture(scope="session")
def zk_server() -> Iterator[ZooKeeperServer]:
    """Debian's ZooKeeper on 127.0.0.1 (free port, temp dir). Under CI it must exist."""
    _require_zookeeper()
    with ZooKeeperServer() as server:
        yield server


@pytest.fixture(scope="session")
def zk_tls_pki(tmp_path_factory: pytest.TempPathFactory) -> TlsTestPki:
    """PEM files for ``zk_tls_server`` and its clients (``vellum.security.pki``): the CA,
    ZooKeeper's key store, client / bookie certificates and a stranger's from another CA."""
    return TlsTestPki.create(tmp_path_factory.mktemp("zk-tls-pki"))


@pytest.fixture(scope="session")
def zk_tls_server(zk_tls_pki: TlsTestPki) -> Iterator[ZooKeeperServer]:
    """Debian's ZooKeeper 3.8 with a ``secureClientPort`` (Netty, PEM key and trust stores from
    ``zk_tls_pki``, ``ssl.clientAuth=need``) besides its plaintext port, on 127.0.0.1 only;
    stopped at the end of the session."""
    _require_zookeeper()
    with ZooKeeperServer(tls=zk_tls_pki.server_tls()) as server:
        yield server
