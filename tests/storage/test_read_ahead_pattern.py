"""Read-ahead follows readers that go in order and stays out of the way of random readers."""

from __future__ import annotations

import struct
from pathlib import Path

from vellum.storage.ledger_storage import LedgerStorage


def _entry(lid: int, eid: int) -> bytes:
    return struct.pack(">qqqq", lid, eid, eid - 1, 0) + b"x" * 100


def test_read_ahead_only_for_sequential_readers(tmp_path: Path) -> None:
    storage = LedgerStorage(tmp_path, None, log_size_limit=1 << 30, write_cache_max_bytes=1 << 22,
                            read_cache_max_bytes=1 << 22, read_ahead_batch_size=10, max_throttle_time_ms=1000)
    try:
        storage.set_master_key(1, b"k" * 20)
        for e in range(200):
            storage.add_entry(_entry(1, e))
        storage.flush()
        assert storage.get_entry(1, 50) == _entry(1, 50)      # first miss: read ahead
        assert storage.read_cache_contains(1, 51)
        assert storage.get_entry(1, 120) == _entry(1, 120)    # a jump: no read-ahead
        assert not storage.read_cache_contains(1, 121)
        assert storage.get_entry(1, 121) == _entry(1, 121)    # in order again: read ahead
        assert storage.read_cache_contains(1, 122)
        for e in range(122, 132):                             # served from the read-ahead ...
            assert storage.get_entry(1, e) == _entry(1, e)
        assert storage.get_entry(1, 132) == _entry(1, 132)    # ... and the next batch follows
        assert storage.read_cache_contains(1, 133)
    finally:
        storage.close()
