"""No socket of a refused client outlives ``BookieClient.close()``.

A bookie that refuses a TLS client's AUTH answers EUA and closes; the client closes its TLS
transport, which sends close_notify and waits for the bookie's before it closes the socket. The
fake bookie here (a thread with blocking sockets, real TLS) answers START_TLS and AUTH like a
bookie, refuses the token, then holds the connection open without reading: the client's TLS
close cannot finish by itself, so only ``close()`` can end the socket. Checked from both ends:
the fake bookie sees the socket closed once ``close()`` has returned, and uvloop closes its
loop without finding a transport still open (it raises ``OSError: [Errno 16] Device or resource
busy`` when it does)."""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

import pytest
from security_testkit import Pki, client_settings, run, server_settings

from vellum.client.bookie_client import BookieClient
from vellum.errors import EOK, EUA, SecurityError
from vellum.format.entry import DigestManager, DigestType, master_key
from vellum.proto import FrameDecoder, encode
from vellum.proto import messages as m
from vellum.security.auth import ClientAuth
from vellum.security.tls import ReloadingContext, server_context

HOLD_S = 5.0  # how long the fake bookie waits for the client's socket to close (a bound, not a speed)


class RefusingBookie:
    """Accepts one connection: START_TLS, TLS, START_TLS confirmed, AUTH refused (EUA); then
    holds the socket open, reading nothing, until ``client_closed()`` is asked."""

    def __init__(self, p: Pki) -> None:
        self.context = server_context(server_settings(p, mutual=False))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.bookie_id = f"127.0.0.1:{self.port}"
        self.refused = threading.Event()
        self.check = threading.Event()
        self.closed_by_client: bool | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            self.listener.settimeout(HOLD_S)
            sock, _ = self.listener.accept()
            sock.settimeout(HOLD_S)
            decoder = FrameDecoder(m.DEFAULT_MAX_FRAME_SIZE, side="server")
            start = self._one(sock, decoder)
            assert isinstance(start, m.StartTlsRequest), start
            sock.sendall(encode(m.StartTlsResponse(start.request_id, EOK)))
            tls = self.context.wrap_socket(sock, server_side=True)
            confirm = self._one(tls, decoder)
            assert isinstance(confirm, m.StartTlsRequest), confirm
            tls.sendall(encode(m.StartTlsResponse(confirm.request_id, EOK)))
            auth = self._one(tls, decoder)
            assert isinstance(auth, m.AuthRequest), auth
            tls.sendall(encode(m.AuthResponse(auth.request_id, EUA, "authentication refused: token refused")))
            self.refused.set()
            # Hold the connection: no close, no answer to the client's close_notify.
            self.check.wait(HOLD_S)
            raw = socket.socket(fileno=os.dup(tls.fileno()))  # the TCP bytes, not TLS
            raw.settimeout(HOLD_S)
            try:
                while raw.recv(65536):  # the client's close_notify, then EOF
                    pass
                self.closed_by_client = True
            except ConnectionResetError:  # an aborted socket
                self.closed_by_client = True
            except TimeoutError:
                self.closed_by_client = False
            finally:
                raw.close()
                tls.close()
        except BaseException as exc:
            self.error = exc
        finally:
            self.listener.close()

    @staticmethod
    def _one(sock: socket.socket, decoder: FrameDecoder) -> Any:
        while True:
            data = sock.recv(65536)
            assert data, "the client closed early"
            got = decoder.feed(data)
            if got:
                (msg,) = got
                return msg

    def client_closed(self) -> bool | None:
        """Did the client's socket close (asked once the client's close() returned)?"""
        self.check.set()
        self.thread.join(HOLD_S + 5)
        if self.error is not None:
            raise self.error
        return self.closed_by_client


@pytest.mark.parametrize("use_uvloop", [True, False], ids=["uvloop", "asyncio"])
def test_a_refused_tls_client_closes_its_socket_before_close_returns(pki_set: Pki, use_uvloop: bool) -> None:
    bookie = RefusingBookie(pki_set)
    closed_in_time: list[bool | None] = []

    async def main() -> None:
        client = BookieClient(tls=ReloadingContext.for_client(client_settings(pki_set, None)),
                              auth=ClientAuth.token(token="not.a.token"))
        stored = DigestManager(1, DigestType.CRC32C).compute(0, -1, 4, b"nope")
        try:
            with pytest.raises(SecurityError, match=f"bookie {bookie.bookie_id} refused this client"):
                await client.add(bookie.bookie_id, master_key(b"pw"), stored)
        finally:
            await client.close()
        # Asked only now, from another thread, while this loop does nothing more for the client.
        closed_in_time.append(bookie.client_closed())

    run(main(), use_uvloop=use_uvloop)  # uvloop: loop.close() raises if a transport is still open
    assert bookie.refused.is_set()
    assert closed_in_time == [True], "the client's socket outlived BookieClient.close()"
