"""LedgerStorage (DbLedgerStorage semantics) on real files and RocksDB."""

from __future__ import annotations

import errno
import os
import struct
import threading
from pathlib import Path

import crc32c
import pytest
from storage_support import open_storage

from vellum.errors import (
    NoSuchEntryError,
    NoSuchLedgerError,
    OperationRejectedError,
    StorageError,
    UnauthorizedAccessError,
)
from vellum.storage.entry_logger import FileOps


def make_entry(ledger_id: int, entry_id: int, payload: bytes = b"") -> bytes:
    ids = struct.pack(">qq", ledger_id, entry_id)
    return ids + struct.pack(">I", crc32c.crc32c(ids + payload)) + payload


def test_add_read_before_and_after_flush_and_reopen(tmp_path: Path) -> None:
    st = open_storage(tmp_path)
    try:
        for lid in (1, 2):
            st.set_master_key(lid, b"key%d" % lid)
            for e in range(20):
                st.add_entry(make_entry(lid, e, b"payload-%d-%d" % (lid, e)))
        assert st.get_entry(1, 5) == make_entry(1, 5, b"payload-1-5")  # from the write cache
        assert st.get_last_entry_id(2) == 19
        st.flush()
        assert st.get_entry(2, 7) == make_entry(2, 7, b"payload-2-7")  # from the entry log
        assert st.get_entry(1, -1) == make_entry(1, 19, b"payload-1-19")
    finally:
        st.close()
    st = open_storage(tmp_path)
    try:
        assert list(st.ledgers()) == [1, 2]
        assert st.entry_ids(1) == list(range(20))
        assert st.get_entry(2, 19) == make_entry(2, 19, b"payload-2-19")
        assert st.get_last_entry_id(1) == 19
        assert st.has_entry(1, 3) and not st.has_entry(1, 20)
        with pytest.raises(NoSuchEntryError):
            st.get_entry(1, 20)
        with pytest.raises(NoSuchLedgerError):
            st.get_entry(9, 0)
        assert st.get_last_entry_id(9) == -1
    finally:
        st.close()


def test_flush_sorts_by_ledger_then_entry(tmp_path: Path) -> None:
    st = open_storage(tmp_path)
    try:
        for e in (3, 1, 2, 0):
            for lid in (2, 1):
                st.add_entry(make_entry(lid, e))
        st.flush()
        order = [(r.ledger_id, r.entry_id) for r in st.entry_logger.scan(0)]
        assert order == [(1, 0), (1, 1), (1, 2), (1, 3), (2, 0), (2, 1), (2, 2), (2, 3)]
    finally:
        st.close()


def test_ledger_data_persists_after_flush(tmp_path: Path) -> None:
    st = open_storage(tmp_path)
    try:
        st.set_master_key(5, b"mk")
        st.set_master_key(5, b"mk")  # same key again is fine
        with pytest.raises(UnauthorizedAccessError):
            st.set_master_key(5, b"other")
        assert st.set_fenced(5) is True
        assert st.set_fenced(5) is False
        st.set_explicit_lac(5, b"\x01lac")
        with pytest.raises(NoSuchLedgerError):
            st.set_fenced(6)
        assert st.get_master_key(6) is None
        st.flush()
    finally:
        st.close()
    st = open_storage(tmp_path)
    try:
        assert st.ledger_exists(5)
        assert st.is_fenced(5)
        assert st.get_master_key(5) == b"mk"
        assert st.get_explicit_lac(5) == b"\x01lac"
        with pytest.raises(UnauthorizedAccessError):
            st.set_master_key(5, b"x")
    finally:
        st.close()


def test_delete_and_trim(tmp_path: Path) -> None:
    st = open_storage(tmp_path)
    try:
        for e in range(10):
            st.add_entry(make_entry(1, e))
            st.add_entry(make_entry(2, e))
        st.flush()
        st.add_entry(make_entry(1, 10))  # cached, not yet flushed
        st.get_entry(1, 0)  # fills the read-ahead cache
        st.delete_ledger(1)
        assert not st.ledger_exists(1)
        with pytest.raises(NoSuchLedgerError):
            st.get_entry(1, 3)
        with pytest.raises(NoSuchLedgerError):
            st.get_entry(1, 10)
        st.trim(2, 6)
        assert st.entry_ids(2) == [6, 7, 8, 9]
        with pytest.raises(NoSuchEntryError):
            st.get_entry(2, 2)
        st.flush()
    finally:
        st.close()
    st = open_storage(tmp_path)
    try:
        assert list(st.ledgers()) == [2]
        assert st.entry_ids(1) == []
        assert st.entry_ids(2) == [6, 7, 8, 9]
    finally:
        st.close()


def test_read_ahead_fills_the_read_cache(tmp_path: Path) -> None:
    st = open_storage(tmp_path, read_ahead_batch_size=3)
    try:
        for e in range(10):
            st.add_entry(make_entry(1, e, b"x" * 10))
        st.flush()
        assert not st.read_cache_contains(1, 1)
        assert st.get_entry(1, 0) == make_entry(1, 0, b"x" * 10)
        assert [st.read_cache_contains(1, e) for e in range(6)] == [False, True, True, True, False, False]
        # served from the read cache even with the log gone
        os.unlink(st.entry_logger.log_path(0))
        assert st.get_entry(1, 2) == make_entry(1, 2, b"x" * 10)
    finally:
        st.close()


def test_rotation_across_logs_and_reads(tmp_path: Path) -> None:
    st = open_storage(tmp_path, log_size_limit=4096, write_cache_max_bytes=8192)
    try:
        for e in range(200):
            st.add_entry(make_entry(3, e, bytes([e % 256]) * 50))
        st.flush()
        assert len(st.entry_logger.log_ids()) > 3
        for e in range(200):
            assert st.get_entry(3, e) == make_entry(3, e, bytes([e % 256]) * 50)
    finally:
        st.close()


def test_write_cache_swap_and_back_pressure(tmp_path: Path) -> None:
    gate = threading.Event()
    entered = threading.Event()

    def slow_flush() -> None:
        entered.set()
        gate.wait()

    entry_size = len(make_entry(1, 0, b"y" * 80))
    st = open_storage(
        tmp_path, write_cache_max_bytes=2 * 4 * entry_size, max_throttle_time_ms=50, flush_hook=slow_flush
    )
    try:
        accepted = 0
        with pytest.raises(OperationRejectedError, match="write cache full"):
            for e in range(100):
                st.add_entry(make_entry(1, e, b"y" * 80))
                accepted += 1
        assert entered.wait(60)  # the first full cache was swapped and handed to the flush thread
        assert accepted == 8  # one cache being flushed + one full active cache
        for e in range(accepted):  # both caches are readable meanwhile
            assert st.get_entry(1, e) == make_entry(1, e, b"y" * 80)
        gate.set()
        st.flush()
        st.add_entry(make_entry(1, accepted, b"y" * 80))  # room again
        st.flush()
        assert st.entry_ids(1) == list(range(accepted + 1))
    finally:
        gate.set()
        st.close()


class FailingOps(FileOps):
    def __init__(self) -> None:
        self.fail = False

    def write(self, fd: int, data: bytes | memoryview) -> int:
        if self.fail and len(data) > 20:
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(fd, data)


def test_enospc_keeps_entries_in_the_cache(tmp_path: Path) -> None:
    ops = FailingOps()
    st = open_storage(tmp_path, file_ops=ops)
    try:
        for e in range(5):
            st.add_entry(make_entry(1, e, b"z"))
        ops.fail = True
        with pytest.raises(StorageError, match="no space"):
            st.flush()
        assert st.get_entry(1, 3) == make_entry(1, 3, b"z")  # still served from the cache
        assert st.locations.get_location(1, 3) is None  # nothing indexed
        ops.fail = False
        st.flush()
        assert st.locations.get_location(1, 3) is not None
    finally:
        st.close()
    st = open_storage(tmp_path)
    try:
        assert [st.get_entry(1, e) for e in range(5)] == [make_entry(1, e, b"z") for e in range(5)]
    finally:
        st.close()


def test_index_dir_separate_and_concurrent_readers(tmp_path: Path) -> None:
    st = open_storage(tmp_path / "ledgers", tmp_path / "index", write_cache_max_bytes=16 * 1024)
    errors: list[BaseException] = []
    stop = threading.Event()
    done: list[int] = []

    def reader() -> None:
        while not stop.is_set():
            for e in list(done):
                try:
                    assert st.get_entry(1, e) == make_entry(1, e, b"r" * 40)
                except BaseException as ex:
                    errors.append(ex)
                    return

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for e in range(1500):
            st.add_entry(make_entry(1, e, b"r" * 40))
            done.append(e)
        st.flush()
    finally:
        stop.set()
        for t in threads:
            t.join()
        st.close()
    assert errors == []
    assert (tmp_path / "index" / "current" / "locations").is_dir()
    assert (tmp_path / "ledgers" / "current" / "0.log").is_file()
    assert not (tmp_path / "ledgers" / "current" / "locations").exists()


def test_flush_never_replaces_a_cache_an_add_swapped_in_meanwhile(tmp_path: Path) -> None:
    """A checkpoint's flush writes out the flushing cache, then swaps the active one; an add
    that fills the active cache in between swaps it first. That cache must be written out, not
    replaced (it held every entry added before the flush: losing it lost acknowledged data)."""
    st = open_storage(tmp_path, write_cache_max_bytes=8 * 1024)
    try:
        st.set_master_key(1, b"k")
        added = 0
        for _ in range(5):
            st.add_entry(make_entry(1, added, b"p" * 200))
            added += 1
        flusher = st._flusher  # the part that swaps and writes out (storage/storage_flush.py)
        first_write_out = flusher._flush_swapped
        calls = 0

        def then_an_add_swaps() -> None:
            nonlocal calls, added
            first_write_out()
            calls += 1
            if calls == 1:  # the window between the flush's write-out and its own swap
                swapped = flusher._caches.flushing
                while flusher._caches.flushing is swapped:
                    st.add_entry(make_entry(1, added, b"p" * 200))
                    added += 1

        flusher._flush_swapped = then_an_add_swaps  # type: ignore[method-assign]
        st.flush()
        del flusher._flush_swapped
        st.flush()
        assert [e for e in range(added) if not st.has_entry(1, e)] == []
    finally:
        st.close()
    st = open_storage(tmp_path)
    try:
        assert st.entry_ids(1) == list(range(added))
    finally:
        st.close()
