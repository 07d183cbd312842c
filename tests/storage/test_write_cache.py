"""The write caches alone: the swap never drops a cache that was not written out; a write-out
indexes a round only once the entry log is durable, and nothing of a round that failed."""

from __future__ import annotations

import errno
import struct
from collections.abc import Sequence
from pathlib import Path

import pytest

from vellum.errors import StorageError
from vellum.storage.entry_logger import EntryLogger, FileOps
from vellum.storage.write_cache import WriteCaches, write_out


def entry(ledger_id: int, entry_id: int, size: int = 40) -> bytes:
    return struct.pack(">qq", ledger_id, entry_id) + b"x" * (size - 16)


def test_swap_fills_a_free_flushing_slot_only() -> None:
    caches = WriteCaches(100)
    caches.active.put(1, 0, entry(1, 0))
    assert caches.swap()
    flushing = caches.flushing
    assert flushing is not None and flushing.get(1, 0) == entry(1, 0) and not caches.active
    caches.active.put(1, 1, entry(1, 1))
    assert not caches.swap()  # the flushing cache is not written out yet: never replaced
    assert caches.flushing is flushing and caches.active.get(1, 1) == entry(1, 1)


def test_put_new_puts_a_ledgers_entries_at_once_only_when_none_is_held() -> None:
    cache = WriteCaches(10_000).active
    cache.put(1, 3, entry(1, 3))
    batch = [entry(2, e, 30 + e) for e in range(4)]
    assert cache.put_new(2, [0, 1, 2, 3], batch, sum(map(len, batch)))
    assert cache.size == 40 + sum(map(len, batch)) and cache.last == {1: 3, 2: 3}
    assert [cache.get(2, e) for e in range(4)] == batch
    # one of them held already: nothing put (``put`` each replaces and re-counts)
    again = [entry(1, e, 50) for e in (4, 3)]
    assert not cache.put_new(1, [4, 3], again, 100)
    assert cache.get(1, 4) is None and cache.get(1, 3) == entry(1, 3)
    assert cache.size == 40 + sum(map(len, batch)) and cache.last[1] == 3


def test_put_new_counts_an_id_given_twice_in_one_batch_once() -> None:
    cache = WriteCaches(10_000).active
    twice = [entry(4, 0, 30), entry(4, 1, 30), entry(4, 0, 50)]
    assert cache.put_new(4, [0, 1, 0], twice, sum(map(len, twice)))
    assert cache.get(4, 0) == entry(4, 0, 50)  # the later one, as ``put`` after ``put`` keeps
    assert cache.size == 80 and cache.last == {4: 1}
    cache.drop_ledger(4)
    assert cache.size == 0 and not cache


def test_lookups_see_both_caches() -> None:
    caches = WriteCaches(1000)
    caches.active.put(1, 0, entry(1, 0))
    caches.active.put(1, 1, entry(1, 1))
    caches.swap()
    caches.active.put(1, 2, entry(1, 2))
    caches.active.put(2, 0, entry(2, 0))
    assert caches.get((1, 0)) == entry(1, 0) and caches.get((1, 2)) == entry(1, 2)
    assert caches.get((1, 3)) is None
    assert caches.contains((1, 1)) and not caches.contains((3, 0))
    assert caches.last_entry_id(1) == 2 and caches.last_entry_id(3) == -1
    assert caches.entry_ids(1) == {0, 1, 2}
    assert caches.holds_ledger(2) and not caches.holds_ledger(3)
    caches.drop_ledger(1, below=2)
    assert caches.entry_ids(1) == {2}
    caches.drop_ledger(1)
    assert not caches.holds_ledger(1) and caches.last_entry_id(1) == -1


class RecordingIndex:
    def __init__(self, events: list[str]) -> None:
        self.events = events
        self.locations: dict[tuple[int, int], int] = {}

    def put_run(self, ledger_id: int, entry_ids: Sequence[int], locations: Sequence[int]) -> None:
        self.events.append("index put")
        for eid, loc in zip(entry_ids, locations, strict=True):
            self.locations[(ledger_id, eid)] = loc

    def sync(self) -> None:
        self.events.append("index sync")


class SyncRecordingOps(FileOps):
    def __init__(self, events: list[str]) -> None:
        self.events = events
        self.fail_write = False

    def fsync(self, fd: int) -> None:
        self.events.append("entry log fsync")
        super().fsync(fd)

    def write(self, fd: int, data: bytes | memoryview) -> int:
        if self.fail_write and len(data) > 20:
            raise OSError(errno.EIO, "injected")
        return super().write(fd, data)


def test_write_out_appends_sorted_then_indexes_after_the_entry_log_fsync(tmp_path: Path) -> None:
    events: list[str] = []
    ops = SyncRecordingOps(events)
    index = RecordingIndex(events)
    caches = WriteCaches(1 << 20)
    for eid in (2, 0, 1):
        for lid in (5, 3):
            caches.active.put(lid, eid, entry(lid, eid))
    caches.swap()
    assert caches.flushing is not None
    with EntryLogger(tmp_path, log_size_limit=1 << 20, preallocate=False, file_ops=ops) as el:
        del events[:]
        write_out(caches.flushing, el, index)  # type: ignore[arg-type]
        assert events[0] == "entry log fsync" and events[-1] == "index sync"
        assert "index put" not in events[: events.index("entry log fsync") + 1]
        order = sorted(index.locations, key=lambda k: index.locations[k])
        assert order == [(3, 0), (3, 1), (3, 2), (5, 0), (5, 1), (5, 2)]  # sorted by (ledger, entry)
        for (lid, eid), loc in index.locations.items():
            assert el.read_entry(lid, eid, loc) == entry(lid, eid)


def test_write_out_indexes_nothing_of_a_failed_round(tmp_path: Path) -> None:
    events: list[str] = []
    ops = SyncRecordingOps(events)
    index = RecordingIndex(events)
    caches = WriteCaches(1 << 20)
    for eid in range(3):
        caches.active.put(1, eid, entry(1, eid, 4000))
    caches.swap()
    assert caches.flushing is not None
    with EntryLogger(tmp_path, log_size_limit=1 << 20, preallocate=False, file_ops=ops,
                     write_buffer_size=1024) as el:
        ops.fail_write = True
        with pytest.raises(StorageError):
            write_out(caches.flushing, el, index)  # type: ignore[arg-type]
        assert index.locations == {}
        ops.fail_write = False
        write_out(caches.flushing, el, index)  # the same cache, retried whole
        assert sorted(index.locations) == [(1, 0), (1, 1), (1, 2)]
