"""TLS on the bookie port, in-process: contexts from PEM settings, certificate reloading, and
START_TLS between the real ``BookieServer`` and ``BookieClient`` (a fake ``AsyncBookie`` keeps
entries in memory), with certificates made by ``vellum.security.pki``.

Covered: a TLS client adds and reads (on uvloop and on the stdlib loop); mutual TLS stores the
client certificate's principal and roles on the server connection; a plaintext client, a
client with no certificate, one from another CA and one with an expired certificate are refused
with clear errors on both sides; a TLS client facing a bookie without TLS is told so; a rotated
server certificate is presented to new connections after the refresh interval; bytes sent in
clear after START_TLS are never taken as TLS traffic."""

from __future__ import annotations

import asyncio
import logging
import ssl
from pathlib import Path
from typing import Any

import pytest
from security_testkit import (
    Pki,
    client_settings,
    close,
    make_pki,
    presented_certificate,
    run,
    server_settings,
)

from vellum.client.bookie_client import TLS_FLUSH_BYTES, BookieClient
from vellum.errors import EBADREQ, EOK, EUA, SecurityError
from vellum.format.entry import DigestManager, DigestType, master_key
from vellum.proto import FrameDecoder, encode
from vellum.proto import messages as m
from vellum.security import pki
from vellum.security.tls import (
    ReloadingContext,
    TlsSettings,
    client_context,
    server_context,
)
from vellum.testing.memory_bookie import MemoryBookieServer as Bookie

KEY = master_key(b"pw")
SERVER_LOG = "vellum.server.bookie_server"


def entry(ledger_id: int, entry_id: int, payload: bytes) -> bytes:
    return DigestManager(ledger_id, DigestType.CRC32C).compute(entry_id, entry_id - 1, len(payload), payload)


async def add_and_read(client: BookieClient, bookie_id: str, ledger_id: int = 1) -> bytes:
    stored = entry(ledger_id, 0, b"over TLS")
    await client.add(bookie_id, KEY, stored)
    got = await client.read(bookie_id, ledger_id, 0)
    return bytes(got)


# ------------------------------------------------------------------------------- contexts


def test_contexts_need_tls_1_2_or_later_and_pem(pki_set: Pki) -> None:
    ctx = server_context(server_settings(pki_set))
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2 and ctx.verify_mode == ssl.CERT_REQUIRED
    assert server_context(server_settings(pki_set, mutual=False)).verify_mode == ssl.CERT_NONE
    client = client_context(client_settings(pki_set, pki_set.client))
    assert client.minimum_version == ssl.TLSVersion.TLSv1_2 and client.verify_mode == ssl.CERT_REQUIRED
    assert not client.check_hostname  # BookKeeper's tlsHostnameVerificationEnabled default
    only13 = server_context(TlsSettings(**{**server_settings(pki_set).__dict__, "enabled_protocols": ("TLSv1.3",)}))
    assert only13.minimum_version == ssl.TLSVersion.TLSv1_3
    with pytest.raises(SecurityError, match=r"tlsEnabledProtocols names TLSv1.1: Vellum requires TLSv1.2 or later"):
        server_context(TlsSettings(**{**server_settings(pki_set).__dict__, "enabled_protocols": ("TLSv1.1",)}))
    with pytest.raises(SecurityError, match="tlsKeyStoreType=JKS: Vellum reads PEM files only"):
        server_context(TlsSettings(**{**server_settings(pki_set).__dict__, "key_store_type": "JKS"}))
    with pytest.raises(SecurityError, match="no cipher suite matches; use OpenSSL names"):
        client_context(TlsSettings(**{**client_settings(pki_set, None).__dict__,
                                      "enabled_cipher_suites": ("TLS_ECDHE_NOT_A_SUITE",)}))


def test_missing_or_mismatched_files_are_named(pki_set: Pki, tmp_path: Path) -> None:
    with pytest.raises(SecurityError, match="TLS on the server needs tlsCertificatePath"):
        server_context(TlsSettings(key_store=str(pki_set.bookie.key)))
    with pytest.raises(SecurityError, match=r"tlsKeyStore=.*nope: no such file"):
        server_context(TlsSettings(certificate_path=str(pki_set.bookie.cert), key_store=str(tmp_path / "nope")))
    with pytest.raises(SecurityError, match=r"cannot load tlsCertificatePath=.* with tlsKeyStore=.*is the key the cert"):
        server_context(TlsSettings(certificate_path=str(pki_set.bookie.cert), key_store=str(pki_set.client.key)))
    with pytest.raises(SecurityError, match="TLS on the client needs tlsTrustStore"):
        client_context(TlsSettings())
    with pytest.raises(SecurityError, match="tlsClientAuthentication=true on the client needs"):
        client_context(TlsSettings(trust_store=str(pki_set.ca.cert), client_authentication=True))


def test_an_encrypted_key_loads_with_its_password_file(pki_set: Pki) -> None:
    settings = TlsSettings(**{**client_settings(pki_set, pki_set.encrypted_client).__dict__,
                              "key_store_password_path": str(pki_set.password_file)})
    client_context(settings)
    with pytest.raises(SecurityError, match=r"tlsKeyStore=.*carol.key.pem is encrypted: set tlsKeyStorePasswordPath"):
        client_context(client_settings(pki_set, pki_set.encrypted_client))
    wrong = pki_set.base / "wrong-password"
    wrong.write_text("nope\n")
    with pytest.raises(SecurityError, match="password in tlsKeyStorePasswordPath right"):
        client_context(TlsSettings(**{**settings.__dict__, "key_store_password_path": str(wrong)}))


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_reloading_context_follows_its_files(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    p = make_pki(tmp_path)
    clock = FakeClock()
    holder = ReloadingContext.for_server(server_settings(p, refresh_s=30), clock=clock)
    first = holder.get()
    ca = pki.load_ca(p.base / "ca")
    pki.write_certificate(pki.issue_certificate(ca, name="bookie-1b", role="bookie"), p.bookie.cert.parent,
                          overwrite=True, stem="bookie-1")
    assert holder.get() is first, "not before the refresh interval"
    clock.now += 31
    assert holder.get() is not first and holder.reloads == 1
    second = holder.get()
    clock.now += 31
    assert holder.get() is second, "nothing changed: no rebuild"
    never = ReloadingContext.for_server(server_settings(p, refresh_s=0), clock=clock)
    # A half-done rotation (a key that is not the certificate's) keeps the working context.
    p.bookie.key.write_bytes(pki.private_key_pem(pki.generate_key()))
    clock.now += 31
    with caplog.at_level(logging.WARNING, logger="vellum.security.tls"):
        assert holder.get() is second
    assert "cannot be loaded (keeping the previous certificates" in caplog.text
    clock.now += 10_000
    assert never.get() is never.get() and never.reloads == 0


# ------------------------------------------------------------------------ START_TLS on the wire


@pytest.mark.parametrize("use_uvloop", [True, False], ids=["uvloop", "asyncio"])
def test_a_tls_client_adds_and_reads_and_the_bookie_knows_who_it_is(pki_set: Pki, use_uvloop: bool) -> None:
    async def main() -> None:
        bookie = Bookie(ReloadingContext.for_server(server_settings(pki_set)))
        await bookie.server.start()
        client = BookieClient(tls=ReloadingContext.for_client(client_settings(pki_set, pki_set.client)))
        try:
            assert await add_and_read(client, bookie.bookie_id) == entry(1, 0, b"over TLS")
            # pipelined traffic right after the upgrade
            await asyncio.gather(*(client.add(bookie.bookie_id, KEY, entry(2, i, b"x" * 70000)) for i in range(20)))
            assert len(bookie.memory.entries) == 21
            (conn,) = bookie.connections()
            assert (conn.principal, conn.roles) == ("alice", ("client",))
        finally:
            await client.close()
            await bookie.server.stop()

    run(main(), use_uvloop=use_uvloop)


@pytest.mark.parametrize("use_uvloop", [True, False], ids=["uvloop", "asyncio"])
def test_a_burst_of_big_adds_leaves_in_slices_as_it_is_queued_and_arrives_intact(
    pki_set: Pki, use_uvloop: bool
) -> None:
    async def main() -> None:
        bookie = Bookie(ReloadingContext.for_server(server_settings(pki_set)))
        await bookie.server.start()
        client = BookieClient(tls=ReloadingContext.for_client(client_settings(pki_set, pki_set.client)))
        try:
            await add_and_read(client, bookie.bookie_id)  # connected and upgraded
            conn = client._conns[bookie.bookie_id]
            sent = [entry(3, i, bytes([i]) * (60_000 + i)) for i in range(24)]  # ~1.4 MiB
            loop = asyncio.get_running_loop()
            done: list[asyncio.Future[None]] = []
            for stored in sent:  # one loop iteration: nothing is awaited in between
                fut: asyncio.Future[None] = loop.create_future()

                def answered(exc: BaseException | None, fut: asyncio.Future[None] = fut) -> None:
                    if exc is None:
                        fut.set_result(None)
                    else:
                        fut.set_exception(exc)

                client.add_cb(bookie.bookie_id, KEY, stored, False, answered, 5.0)
                done.append(fut)
            # Under TLS the burst was handed to the transport slice by slice while it was queued
            # (TLS_FLUSH_BYTES at a time), not all at the end of the loop iteration.
            queued = sum(len(part) for part in conn.out)
            assert queued < TLS_FLUSH_BYTES < sum(len(stored) for stored in sent) // 2
            await asyncio.gather(*done)
            await asyncio.sleep(0)
            for i, stored in enumerate(sent):
                assert bookie.memory.entries[(3, i)] == stored
        finally:
            await client.close()
            await bookie.server.stop()

    run(main(), use_uvloop=use_uvloop)


def test_a_plaintext_client_is_refused_saying_the_bookie_requires_tls(
    pki_set: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        bookie = Bookie(ReloadingContext.for_server(server_settings(pki_set)))
        await bookie.server.start()
        client = BookieClient()
        try:
            with pytest.raises(SecurityError, match=f"bookie {bookie.bookie_id} requires TLS and this client is "
                                                    "configured without it: set tlsProviderFactoryClass"):
                await add_and_read(client, bookie.bookie_id)
            # A raw v2 client gets its ADD answered EUA after the notice, and nothing is stored.
            reader, writer = await asyncio.open_connection("127.0.0.1", bookie.server.port)
            writer.write(encode(m.AddRequest(KEY, entry(5, 0, b"sneaky"))))
            decoder = FrameDecoder(m.DEFAULT_MAX_FRAME_SIZE, side="client")
            got: list[Any] = []
            while len(got) < 2:
                got += decoder.feed(await reader.read(4096))
            assert got == [m.ErrorResponse(EUA, opcode=m.OP_START_TLS), m.AddResponse(EUA, 5, 0)]
            await close(writer)
            assert bookie.memory.entries == {}
        finally:
            await client.close()
            await bookie.server.stop()

    with caplog.at_level(logging.WARNING, logger=SERVER_LOG):
        run(main())
    assert "plaintext request refused: this bookie requires TLS (peer ('127.0.0.1'" in caplog.text


def test_a_tls_client_is_told_when_the_bookie_does_not_offer_tls(pki_set: Pki) -> None:
    async def main() -> None:
        bookie = Bookie(None)
        await bookie.server.start()
        client = BookieClient(tls=ReloadingContext.for_client(client_settings(pki_set, pki_set.client)))
        try:
            with pytest.raises(SecurityError, match=f"bookie {bookie.bookie_id} does not offer TLS \\(it answered "
                                                    "START_TLS with EBADREQ\\)"):
                await add_and_read(client, bookie.bookie_id)
            # and the plaintext bookie keeps serving plaintext clients
            plain = BookieClient()
            assert await add_and_read(plain, bookie.bookie_id, 3) == entry(3, 0, b"over TLS")
            await plain.close()
        finally:
            await client.close()
            await bookie.server.stop()

    run(main())


@pytest.mark.parametrize(
    ("who", "client_says", "bookie_says"),
    [
        ("other_ca_client", "refused this client", "unable to get local issuer certificate"),
        ("expired_client", "refused this client", "certificate has expired"),
        (None, "refused this client", "peer did not return a certificate"),
    ],
    ids=["another-CA", "expired", "no-certificate"],
)
@pytest.mark.parametrize("use_uvloop", [True, False], ids=["uvloop", "asyncio"])
def test_mutual_tls_refuses_bad_client_certificates(
    pki_set: Pki, caplog: pytest.LogCaptureFixture, who: str | None, client_says: str, bookie_says: str,
    use_uvloop: bool,
) -> None:
    cert = getattr(pki_set, who) if who else None

    async def main() -> None:
        bookie = Bookie(ReloadingContext.for_server(server_settings(pki_set)))
        await bookie.server.start()
        client = BookieClient(tls=ReloadingContext.for_client(client_settings(pki_set, cert)))
        try:
            # TLS 1.2 fails the client's handshake; with TLS 1.3 the client's side completes
            # first and the bookie's refusal arrives as the connection closing: both say so.
            with pytest.raises(SecurityError, match=client_says):
                await add_and_read(client, bookie.bookie_id)
            assert bookie.memory.entries == {}
        finally:
            await client.close()
            await bookie.server.stop()

    with caplog.at_level(logging.WARNING, logger=SERVER_LOG):
        run(main(), use_uvloop=use_uvloop)
    assert "TLS handshake with ('127.0.0.1'" in caplog.text and bookie_says in caplog.text


@pytest.mark.parametrize("who", ["expired_bookie", "other_ca_bookie"])
@pytest.mark.parametrize("use_uvloop", [True, False], ids=["uvloop", "asyncio"])
def test_the_client_refuses_a_bookie_certificate_it_cannot_trust(pki_set: Pki, who: str, use_uvloop: bool) -> None:
    async def main() -> None:
        bookie = Bookie(ReloadingContext.for_server(server_settings(pki_set, cert=getattr(pki_set, who))))
        await bookie.server.start()
        client = BookieClient(tls=ReloadingContext.for_client(client_settings(pki_set, pki_set.client)))
        try:
            expected = "certificate has expired" if who == "expired_bookie" else "unable to get local issuer"
            with pytest.raises(SecurityError, match=f"TLS handshake with bookie {bookie.bookie_id} failed: {expected}"):
                await add_and_read(client, bookie.bookie_id)
        finally:
            await client.close()
            await bookie.server.stop()

    run(main(), use_uvloop=use_uvloop)


def test_a_rotated_certificate_is_used_by_new_connections_after_the_refresh(tmp_path: Path) -> None:
    p = make_pki(tmp_path)

    async def main() -> None:
        holder = ReloadingContext.for_server(server_settings(p, refresh_s=0.5))
        bookie = Bookie(holder)
        await bookie.server.start()
        settings = client_settings(p, p.client)
        try:
            old = await presented_certificate(bookie.server.port, settings)
            assert pki.principal_of(old) == "bookie-1"
            ca = pki.load_ca(p.base / "ca")
            pki.write_certificate(pki.issue_certificate(ca, name="bookie-1-renewed", role="bookie"),
                                  p.bookie.cert.parent, overwrite=True, stem="bookie-1")
            await asyncio.sleep(0.6)
            new = await presented_certificate(bookie.server.port, settings)
            assert pki.principal_of(new) == "bookie-1-renewed" and holder.reloads == 1
            # and a whole client round trip works on the new certificate
            client = BookieClient(tls=ReloadingContext.for_client(settings))
            assert await add_and_read(client, bookie.bookie_id) == entry(1, 0, b"over TLS")
            await client.close()
        finally:
            await bookie.server.stop()

    run(main())


def test_clear_bytes_after_start_tls_are_never_taken_as_tls_traffic(
    pki_set: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    # STARTTLS command injection: an ADD sent in clear right behind START_TLS, in one write.
    async def main() -> None:
        bookie = Bookie(ReloadingContext.for_server(server_settings(pki_set)))
        await bookie.server.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", bookie.server.port)
            writer.write(encode(m.StartTlsRequest(1)) + encode(m.AddRequest(KEY, entry(9, 0, b"injected"))))
            assert await asyncio.wait_for(reader.read(), 5) == b"", "closed without an answer"
            await close(writer)
            # a handshake of garbage fails alone; the bookie serves the next client
            reader, writer = await asyncio.open_connection("127.0.0.1", bookie.server.port)
            writer.write(encode(m.StartTlsRequest(1)))
            assert FrameDecoder(1 << 20, side="client").feed(await reader.readexactly(20)) == [
                m.StartTlsResponse(1, EOK)]
            writer.write(b"GET / HTTP/1.1\r\nHost: bookie\r\n\r\n")
            await asyncio.wait_for(reader.read(), 5)
            await close(writer)
            client = BookieClient(tls=ReloadingContext.for_client(client_settings(pki_set, pki_set.client)))
            assert await add_and_read(client, bookie.bookie_id) == entry(1, 0, b"over TLS")
            await client.close()
            assert (9, 0) not in bookie.memory.entries
        finally:
            await bookie.server.stop()

    with caplog.at_level(logging.WARNING, logger=SERVER_LOG):
        run(main())
    assert "data after START_TLS before its answer" in caplog.text
    assert "TLS handshake with" in caplog.text


def test_start_tls_on_a_bookie_without_tls_is_answered_ebadreq_and_the_connection_serves_on() -> None:
    async def main() -> list[Any]:
        bookie = Bookie(None)
        await bookie.server.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", bookie.server.port)
            writer.write(encode(m.StartTlsRequest(4)) + encode(m.AddRequest(KEY, entry(1, 0, b"clear"))))
            decoder = FrameDecoder(1 << 20, side="client")
            got: list[Any] = []
            while len(got) < 2:
                got += decoder.feed(await reader.read(4096))
            await close(writer)
            return got
        finally:
            await bookie.server.stop()

    assert run(main()) == [m.StartTlsResponse(4, EBADREQ), m.AddResponse(EOK, 1, 0)]
