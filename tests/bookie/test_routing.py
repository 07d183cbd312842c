"""LedgerRouter (design rule 13): a ledger is served from the ledger dir that holds it, live or
as a tombstone, whatever the number of dirs; only a ledger no dir knows goes to id % dirs."""

from __future__ import annotations

from pathlib import Path

from vellum.bookie.routing import LedgerRouter
from vellum.storage.ledger_storage import LedgerStorage


def _storage(d: Path) -> LedgerStorage:
    return LedgerStorage(d, log_size_limit=1 << 20, write_cache_max_bytes=1 << 16, read_cache_max_bytes=1 << 16,
                         read_ahead_batch_size=4, max_throttle_time_ms=1000, preallocate=False)


def test_a_ledger_is_routed_where_its_data_is(tmp_path: Path) -> None:
    storages = [_storage(tmp_path / f"l{i}") for i in range(3)]
    try:
        storages[0].set_master_key(1, b"k")   # 1 % 3 == 1, but it lives in dir 0 (added dirs)
        storages[0].set_master_key(2, b"k")
        storages[0].delete_ledger(2)          # a tombstone counts as home too
        router = LedgerRouter(storages)
        assert router.storage_of(1) is storages[0]
        assert router.storage_of(2) is storages[0]
        assert router.storage_of(5) is storages[5 % 3]   # unknown everywhere: the default dir
        storages[2].set_master_key(5, b"k")
        assert router.storage_of(5) is storages[2]       # ... and from its first write on, there
        router.forget(1)
        assert router.storage_of(1) is storages[0]       # found again after a forget
        assert LedgerRouter(storages[:1]).storage_of(7) is storages[0]
    finally:
        for s in storages:
            s.close()
