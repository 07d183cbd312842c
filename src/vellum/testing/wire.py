"""A blocking wire-protocol connection to a bookie, for tests that must send exact frames
(good or deliberately bad) without the client library in between."""

from __future__ import annotations

import socket
from typing import Any

from vellum.proto import codec
from vellum.proto import messages as m


class RawConnection:
    def __init__(self, bookie_id: str, *, timeout_s: float = 30.0) -> None:
        host, port = bookie_id.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        self.decoder = codec.FrameDecoder(m.DEFAULT_MAX_FRAME_SIZE, side="client")
        self.pending: list[Any] = []

    def send(self, msg: Any) -> None:
        self.sock.sendall(codec.encode(msg))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self) -> Any:
        """The next decoded answer (blocks up to the socket timeout)."""
        while not self.pending:
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("bookie closed the connection")
            self.pending.extend(self.decoder.feed(data))
        return self.pending.pop(0)

    def closed_by_peer(self) -> bool:
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
