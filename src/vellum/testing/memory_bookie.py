"""A real ``BookieServer`` (transport, session, processors) over an in-memory bookie, for tests
of what happens on the wire before storage: TLS, authentication, framing.

``MemoryBookie`` is the part of ``AsyncBookie`` the processors use for adds and reads: every
add is kept (by ledger and entry id) and answered at once as durable; every entry read is
served from that memory. ``MemoryBookieServer`` runs the server on a free loopback port
(``start``/``stop`` are the server's own); ``memory.entries`` shows what reached the bookie.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

from vellum.bookie.executor import AsyncBookie
from vellum.errors import NoSuchEntryError
from vellum.proto.messages import AddBatch
from vellum.security.auth import BookieAuthenticator
from vellum.security.tls import ReloadingContext
from vellum.server.bookie_server import BookieServer, ServerLimits
from vellum.server.metrics import ServerMetrics


class MemoryBookie:
    """Adds kept in a dict, answered durable at once; reads served from it."""

    def __init__(self) -> None:
        self.entries: dict[tuple[int, int], bytes] = {}

    def add_batch_cb(self, batch: AddBatch, on_result: Any) -> None:
        for data, lid, eid in zip(batch.entries, batch.ledger_ids, batch.entry_ids, strict=True):
            self.entries[(lid, eid)] = bytes(data)
        asyncio.get_running_loop().call_soon(on_result, [None] * len(batch), None)

    def read_cb(self, ledger_id: int, entry_id: int, fence_key: bytes | None,
                done: Callable[[bytes | None, BaseException | None], None]) -> None:
        entry = self.entries.get((ledger_id, entry_id))
        if entry is None:
            done(None, NoSuchEntryError(f"entry {ledger_id}:{entry_id} was never added to this memory bookie"))
        else:
            done(entry, None)


class MemoryBookieServer:
    """A ``BookieServer`` on a free loopback port over a ``MemoryBookie``, with the given TLS
    (None: plaintext only) and authentication (None: none)."""

    def __init__(self, tls: ReloadingContext | None = None, auth: BookieAuthenticator | None = None) -> None:
        from prometheus_client import CollectorRegistry

        self.memory = MemoryBookie()
        self.server = BookieServer(cast(AsyncBookie, self.memory), host="127.0.0.1", port=0, limits=ServerLimits(),
                                   metrics=ServerMetrics(CollectorRegistry(auto_describe=True)), tls=tls, auth=auth)

    @property
    def bookie_id(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def connections(self) -> list[Any]:
        return list(self.server._connections)
