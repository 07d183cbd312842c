"""Helpers shared by the ledger/recovery/blocking tests: a client wired to in-process bookies.

``client_cluster(tmp_path, n, **client_config)`` starts ``n`` in-process bookies (conftest),
an embedded SQLite metadata store (formatted, bookies registered in it) and a started
``vellum.aio.BookKeeper``; ``new_client()`` makes further clients on the same store (a second
writer, a reader). Everything is closed on exit. This module holds no tests.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from client_testkit import InProcessBookie, inprocess_bookies

from vellum.aio import BookKeeper
from vellum.config import ClientConfig
from vellum.ids import BookieId
from vellum.meta import MetadataStore, open_metadata_store

FAST = {"add_entry_timeout_s": 2.0, "read_entry_timeout_s": 2.0, "speculative_read_timeout_ms": 200}


@dataclass
class ClientCluster:
    bk: BookKeeper
    bookies: list[InProcessBookie]
    store: MetadataStore
    uri: str
    config: ClientConfig
    _extra: list[BookKeeper] = field(default_factory=list)

    async def new_client(self, **config: Any) -> BookKeeper:
        cfg = ClientConfig(**{**FAST, **config}) if config else self.config
        bk = BookKeeper(self.uri, config=cfg)
        await bk.start()
        self._extra.append(bk)
        return bk

    def bookie(self, bookie_id: str) -> InProcessBookie:
        return next(b for b in self.bookies if b.bookie_id == bookie_id)


@contextlib.asynccontextmanager
async def client_cluster(
    tmp_path: Path, n: int, *, bookie_overrides: dict[str, Any] | None = None, **config: Any
) -> AsyncIterator[ClientCluster]:
    async with inprocess_bookies(tmp_path, n, **(bookie_overrides or {})) as bookies:
        uri = f"sqlite:///{tmp_path / 'metadata.db'}"
        store = await asyncio.to_thread(open_metadata_store, uri)
        try:
            await asyncio.to_thread(store.format)
            for b in bookies:
                await asyncio.to_thread(store.registration.register_bookie, BookieId(b.bookie_id))
            cfg = ClientConfig(**{**FAST, **config})
            bk = BookKeeper(uri, config=cfg)
            await bk.start()
            cc = ClientCluster(bk, bookies, store, uri, cfg)
            try:
                yield cc
            finally:
                for other in cc._extra:
                    await other.close()
                await bk.close()
        finally:
            await asyncio.to_thread(store.close)
