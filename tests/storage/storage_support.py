"""Helpers shared by the ledger-storage tests (imported by name: tests/ has no packages)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vellum.storage.ledger_storage import LedgerStorage


def open_storage(path: Path, index_dir: Path | None = None, **kw: Any) -> LedgerStorage:
    """A small ``LedgerStorage`` in ``path`` (1 MiB logs and caches, no preallocation)."""
    args: dict[str, Any] = dict(
        log_size_limit=1 << 20,
        write_cache_max_bytes=1 << 20,
        read_cache_max_bytes=1 << 20,
        read_ahead_batch_size=10,
        max_throttle_time_ms=10_000,
        preallocate=False,
    )
    args.update(kw)
    return LedgerStorage(path, index_dir, **args)
