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


def _storage(tmp_path: Path, **kw: int) -> LedgerStorage:
    args = dict(log_size_limit=1 << 30, write_cache_max_bytes=1 << 22, read_cache_max_bytes=1 << 22,
                read_ahead_batch_size=10, max_throttle_time_ms=1000)
    args.update(kw)
    return LedgerStorage(tmp_path, None, **args)


def test_read_ahead_stops_at_its_byte_bound(tmp_path: Path) -> None:
    storage = _storage(tmp_path, read_ahead_max_bytes=3 * len(_entry(1, 0)))
    try:
        storage.set_master_key(1, b"k" * 20)
        for e in range(50):
            storage.add_entry(_entry(1, e))
        storage.flush()
        assert storage.get_entry(1, 10) == _entry(1, 10)
        assert [storage.read_cache_contains(1, e) for e in range(11, 15)] == [True, True, True, False]
    finally:
        storage.close()


def test_a_miss_inside_a_window_already_read_ahead_reads_only_itself(tmp_path: Path) -> None:
    """Pipelined readers miss on entries whose read-ahead is running (or was evicted): reading
    the same window again would multiply the bytes read."""
    size = len(_entry(1, 0))
    storage = _storage(tmp_path, read_cache_max_bytes=4 * size)  # the window cannot stay cached
    try:
        storage.set_master_key(1, b"k" * 20)
        for e in range(50):
            storage.add_entry(_entry(1, e))
        storage.flush()
        assert storage.get_entry(1, 10) == _entry(1, 10)  # reads ahead 11..20, keeps 17..20
        assert not storage.read_cache_contains(1, 12)
        assert storage.get_entry(1, 12) == _entry(1, 12)  # in the window: no second read-ahead
        assert not storage.read_cache_contains(1, 13)
        assert not storage.read_cache_contains(1, 31)
        assert storage.get_entry(1, 21) == _entry(1, 21)  # past it: reads ahead again (22..31)
        assert storage.read_cache_contains(1, 31)
    finally:
        storage.close()


def test_get_entries_serves_a_run_from_caches_and_disk_without_caching(tmp_path: Path) -> None:
    storage = _storage(tmp_path)
    try:
        storage.set_master_key(1, b"k" * 20)
        storage.set_master_key(2, b"k" * 20)
        for e in range(30):
            storage.add_entry(_entry(1, e))
            storage.add_entry(_entry(2, e))
        storage.flush()
        for e in range(30, 35):  # still in the write cache
            storage.add_entry(_entry(1, e))
        got = storage.get_entries(1, 5, 0, 0)
        assert [bytes(x) for x in got] == [_entry(1, e) for e in range(5, 35)]
        assert not any(storage.read_cache_contains(1, e) for e in range(5, 35))
        size = len(_entry(1, 0))
        assert len(storage.get_entries(1, 0, 7, 0)) == 7
        assert len(storage.get_entries(1, 0, 0, 3 * size + 1)) == 3
        assert len(storage.get_entries(1, 0, 0, 1)) == 1  # the first entry always counts
        assert storage.get_entry(1, 3) == _entry(1, 3)  # a single read still reads ahead
        assert storage.read_cache_contains(1, 4)
        got = storage.get_entries(1, 2, 0, 0)  # cached 4..13 in the middle of a disk run
        assert [bytes(x) for x in got] == [_entry(1, e) for e in range(2, 35)]
    finally:
        storage.close()


def test_get_entries_ends_at_a_gap_and_raises_only_for_the_first(tmp_path: Path) -> None:
    import pytest

    from vellum.errors import NoSuchEntryError, NoSuchLedgerError

    storage = _storage(tmp_path)
    try:
        storage.set_master_key(1, b"k" * 20)
        for e in list(range(10)) + list(range(12, 20)):
            storage.add_entry(_entry(1, e))
        storage.flush()
        assert [bytes(x) for x in storage.get_entries(1, 6, 0, 0)] == [_entry(1, e) for e in range(6, 10)]
        with pytest.raises(NoSuchEntryError):
            storage.get_entries(1, 10, 0, 0)
        with pytest.raises(NoSuchLedgerError):
            storage.get_entries(7, 0, 0, 0)
    finally:
        storage.close()


def test_get_strided_reads_every_stride_th_entry_without_read_ahead(tmp_path: Path) -> None:
    import pytest

    from vellum.errors import NoSuchEntryError

    storage = _storage(tmp_path)
    try:
        storage.set_master_key(1, b"k" * 20)
        for e in range(30):
            if e % 3 != 1:  # what one bookie of a 3-wide, 2-deep stripe holds
                storage.add_entry(_entry(1, e))
        storage.flush()
        got = storage.get_strided(1, 0, 3, 100, 0)
        assert [bytes(x) for x in got] == [_entry(1, e) for e in range(0, 30, 3)]
        assert not storage.read_cache_contains(1, 2)  # nothing read ahead
        assert len(storage.get_strided(1, 2, 3, 4, 0)) == 4
        assert len(storage.get_strided(1, 0, 3, 100, 2 * len(_entry(1, 0)))) == 2
        assert [bytes(x) for x in storage.get_strided(1, 0, 2, 100, 0)] == [_entry(1, 0), _entry(1, 2)]  # 4: gap
    finally:
        storage.close()
    storage = _storage(tmp_path / "b")
    try:
        storage.set_master_key(1, b"k" * 20)
        for e in (0, 2, 6):
            storage.add_entry(_entry(1, e))
        storage.flush()
        assert [bytes(x) for x in storage.get_strided(1, 0, 2, 10, 0)] == [_entry(1, 0), _entry(1, 2)]  # 4 missing
        with pytest.raises(NoSuchEntryError):
            storage.get_strided(1, 4, 2, 10, 0)
    finally:
        storage.close()


def test_get_strided_serves_a_stored_run_in_one_read(tmp_path: Path) -> None:
    """READ_STRIDED of entries stored one after the other (the other replicas' entries in
    between) costs one pread and one index lookup per run, not one each per entry; runs split by
    another ledger's records, a second flush or the write cache still give exactly the wanted
    entries."""
    storage = _storage(tmp_path)
    try:
        storage.set_master_key(1, b"k" * 20)
        storage.set_master_key(2, b"k" * 20)
        held = [e for e in range(300) if e % 3 != 1]  # what one bookie of a 3-wide, 2-deep stripe holds
        for e in held[:150]:
            storage.add_entry(_entry(1, e))
            storage.add_entry(_entry(2, e))
        storage.flush()
        for e in held[150:190]:
            storage.add_entry(_entry(1, e))
        storage.flush()
        for e in held[190:]:  # still in the write cache
            storage.add_entry(_entry(1, e))
        reader = storage.entry_logger._reader
        preads = 0
        real = reader._pread

        def counting(*args: object) -> bytes:
            nonlocal preads
            preads += 1
            return real(*args)  # type: ignore[arg-type]

        reader._pread = counting  # type: ignore[method-assign]
        lookups = 0
        real_get = storage.locations.get_location

        def counting_get(lid: int, eid: int) -> int | None:
            nonlocal lookups
            lookups += 1
            return real_get(lid, eid)

        storage.locations.get_location = counting_get  # type: ignore[method-assign]
        for first in (0, 2):
            got = storage.get_strided(1, first, 3, 1000, 0)
            assert [bytes(x) for x in got] == [_entry(1, e) for e in range(first, 300, 3)]
        assert preads <= 8 and lookups <= 8, (preads, lookups)  # entry by entry: ~130 each
        size = len(_entry(1, 0))
        assert [bytes(x) for x in storage.get_strided(1, 3, 3, 1000, 5 * size)] == [
            _entry(1, e) for e in (3, 6, 9, 12, 15)]
        assert len(storage.get_strided(1, 0, 3, 7, 0)) == 7
    finally:
        storage.close()
