"""Shared fixtures of the security tests: a real PKI made with ``vellum.security.pki``.

``make_pki(dir)`` writes a cluster CA and every certificate the tests need under ``dir``; the
``pki`` fixture is one such set per test session (read-only: a test that rewrites files makes
its own with ``make_pki(tmp_path)``). Also ``run(coro)`` (a fresh loop, uvloop or asyncio,
bounded in time), ``server_settings`` / ``client_settings`` (``TlsSettings`` from a PKI) and
``presented_certificate(port, settings)`` (the certificate a bookie shows a new connection). Test modules import the helpers with
``from security_testkit import ...`` (this conftest registers itself under that name, so it is
never confused with another directory's conftest).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl
import sys
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from cryptography import x509

from vellum.errors import EOK
from vellum.proto import FrameDecoder, encode
from vellum.proto import messages as m
from vellum.security import pki
from vellum.security.tls import TlsSettings, client_context, peer_certificate

sys.modules.setdefault("security_testkit", sys.modules[__name__])

_T = TypeVar("_T")
KEY_PASSWORD = b"correct horse"


@dataclass(frozen=True)
class Pki:
    """Paths of a test PKI: the cluster CA, certificates it issued, and strangers."""

    base: Path
    ca: pki.CaFiles
    bookie: pki.CertificateFiles
    client: pki.CertificateFiles
    admin: pki.CertificateFiles
    encrypted_client: pki.CertificateFiles  # key encrypted with KEY_PASSWORD
    password_file: Path
    expired_client: pki.CertificateFiles
    expired_bookie: pki.CertificateFiles
    other_ca_client: pki.CertificateFiles  # issued by another CA
    other_ca_bookie: pki.CertificateFiles


def make_pki(base: Path) -> Pki:
    ca = pki.create_ca("Test cluster CA")
    ca_files = pki.write_ca(ca, base / "ca")
    long_ago = dt.datetime.now(dt.UTC) - dt.timedelta(days=10)
    other = pki.create_ca("Some other CA")

    def issue(authority: pki.CertificateAuthority, name: str, role: str, out: str, **kw: Any) -> pki.CertificateFiles:
        return pki.write_certificate(pki.issue_certificate(authority, name=name, role=role, **{
            k: v for k, v in kw.items() if k != "key_password"}), base / out, key_password=kw.get("key_password"))

    password_file = base / "key-password"
    password_file.write_bytes(KEY_PASSWORD + b"\n")
    return Pki(
        base=base,
        ca=ca_files,
        bookie=issue(ca, "bookie-1", "bookie", "bookie"),
        client=issue(ca, "alice", "client", "client"),
        admin=issue(ca, "root", "admin", "admin"),
        encrypted_client=issue(ca, "carol", "client", "encrypted", key_password=KEY_PASSWORD),
        password_file=password_file,
        expired_client=issue(ca, "old-client", "client", "expired-client", valid_from=long_ago, days=1),
        expired_bookie=issue(ca, "old-bookie", "bookie", "expired-bookie", valid_from=long_ago, days=1),
        other_ca_client=issue(other, "mallory", "client", "other-client"),
        other_ca_bookie=issue(other, "fake-bookie", "bookie", "other-bookie"),
    )


@pytest.fixture(scope="session")
def pki_set(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def server_settings(p: Pki, *, cert: pki.CertificateFiles | None = None, mutual: bool = True,
                    refresh_s: float = 0.0) -> TlsSettings:
    c = cert or p.bookie
    return TlsSettings(key_store=str(c.key), certificate_path=str(c.cert), trust_store=str(p.ca.cert),
                       client_authentication=mutual, refresh_s=refresh_s)


def client_settings(p: Pki, cert: pki.CertificateFiles | None, **kw: Any) -> TlsSettings:
    if cert is None:
        return TlsSettings(trust_store=str(p.ca.cert), **kw)
    return TlsSettings(key_store=str(cert.key), certificate_path=str(cert.cert), trust_store=str(p.ca.cert), **kw)


async def presented_certificate(port: int, settings: TlsSettings) -> x509.Certificate:
    """Open a connection the way a client does (START_TLS, then the handshake) and return the
    certificate the bookie presented."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(encode(m.StartTlsRequest(1)))
        answer = FrameDecoder(m.DEFAULT_MAX_FRAME_SIZE, side="client").feed(await reader.readexactly(20))
        assert answer == [m.StartTlsResponse(1, EOK)], answer
        await writer.start_tls(client_context(settings))
        cert = peer_certificate(writer.get_extra_info("ssl_object"))
        assert cert is not None
        return cert
    finally:
        await close(writer)


async def close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    try:
        await writer.wait_closed()
    except (ssl.SSLError, ConnectionError):
        pass


def run(coro: Coroutine[Any, Any, _T], *, use_uvloop: bool = True, timeout_s: float = 60.0) -> _T:
    async def bounded() -> _T:
        return await asyncio.wait_for(coro, timeout_s)

    if use_uvloop:
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(bounded())
    return asyncio.run(bounded())
