"""A TCP link on loopback that a test cuts at a moment of its choosing (for ZooKeeper clients).

Responsibility: relay every connection accepted on 127.0.0.1 (a free port) to one target, and
let a test make the failures a client meets when a server restarts or a network blips, at an
exact point instead of by chance:

- ``hold_replies()``: answers from the target stay unread in the link (requests still go
  through), so a request is in flight with its reply on the way;
- ``cut()``: every relayed connection is shut down (the held replies are lost with them); the
  client sees its connection end and reconnects;
- ``refuse()`` / ``accept()``: new connections are closed at once, or relayed again, so a
  client stays disconnected until the test lets it back.

Invariants: bytes are relayed in order and unchanged; nothing is dropped except by ``cut()``;
threads are daemons and ``close()`` ends every connection.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class CuttableLink:
    """See the module docstring. ``port`` is where clients connect."""

    def __init__(self, target: tuple[str, int]) -> None:
        self._target = target
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._server.getsockname()[1])
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._replies = threading.Event()
        self._replies.set()
        self._refusing = False
        self.cuts = 0
        threading.Thread(target=self._accept, name="tcp-link-accept", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return  # closed
            if self._refusing:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self._target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._socks += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, None), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, self._replies), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, gate: threading.Event | None) -> None:
        try:
            while data := src.recv(65536):
                if gate is not None:
                    gate.wait()  # held: the reply waits here until it flows again or the cut drops it
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def hold_replies(self) -> None:
        self._replies.clear()

    def cut(self) -> None:
        """End every relayed connection; replies held so far are lost, later ones flow again."""
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        self.cuts += 1
        self._replies.set()

    def refuse(self) -> None:
        self._refusing = True

    def accept(self) -> None:
        self._refusing = False

    def close(self) -> None:
        self._server.close()
        self.cut()
