"""Write-cache back-pressure stalls writers, not the event loop: while adds wait for a slow
flush on the bookie's add thread, the loop still serves reads."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

from vellum.bookie.assembly import open_bookie
from vellum.bookie.executor import AsyncBookie
from vellum.config import ServerConfig
from vellum.format.entry import DigestManager, DigestType, master_key


def test_loop_serves_reads_while_adds_wait_for_a_full_write_cache(tmp_path: Path) -> None:
    config = ServerConfig(journal_directories=(str(tmp_path / "j"),), ledger_directories=(str(tmp_path / "l"),),
                          db_storage_write_cache_max_size_mb=1, db_storage_max_throttle_time_ms=20_000,
                          http_server_enabled=False)
    opened = open_bookie(config, bookie_id="b:1")
    release = threading.Event()
    storage = opened.bookie._storages[0]
    storage._flusher._flush_hook = lambda: release.wait(20)  # every flush waits until released
    key = master_key(b"k")
    dm = DigestManager(1, DigestType.CRC32C, b"k")
    entries = [dm.compute(e, e - 1, 0, bytes(16 * 1024)) for e in range(200)]  # ~3.2 MB > 2 caches

    async def main() -> None:
        ab = AsyncBookie(opened.bookie, asyncio.get_running_loop())
        results: list[tuple[list[BaseException | None], BaseException | None]] = []
        finished = asyncio.Event()

        def on_result(refused: list[BaseException | None], exc: BaseException | None) -> None:
            results.append((refused, exc))
            if len(results) == 2:
                finished.set()

        ab.add_entries_cb([(e, key, False) for e in entries[:10]], on_result)
        ab.add_entries_cb([(e, key, False) for e in entries[10:]], on_result)  # blocks on the cache
        await asyncio.sleep(0.3)
        t0 = time.perf_counter()
        read: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        ab.read_cb(1, 3, None, lambda entry, exc: read.set_result(entry) if exc is None else read.set_exception(exc))
        got = await asyncio.wait_for(read, 5)   # the loop is free
        assert got == entries[3]
        assert time.perf_counter() - t0 < 5
        assert not finished.is_set(), "the second batch should still be waiting for the flush"
        release.set()
        await asyncio.wait_for(finished.wait(), 30)
        assert all(exc is None and all(r is None for r in refused) for refused, exc in results)
        ab.close()

    try:
        asyncio.run(main())
    finally:
        release.set()
        opened.close()
