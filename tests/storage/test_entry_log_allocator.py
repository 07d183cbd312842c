"""EntryLogAllocator alone: ids only grow, lastId, preallocation, ids reserved for compaction."""

from __future__ import annotations

from pathlib import Path

import pytest

from vellum.format import entrylog as fmt
from vellum.storage.durable import OS_FILE_OPS
from vellum.storage.entry_log_allocator import (
    EntryLogAllocator,
    list_log_ids,
    log_file_name,
    parse_log_file_name,
)


def allocator(current: Path, *, preallocate: bool = False) -> EntryLogAllocator:
    current.mkdir(parents=True, exist_ok=True)
    return EntryLogAllocator(current, ops=OS_FILE_OPS, preallocate=preallocate, thread_name="test-prealloc")


def test_names_round_trip_and_reject_what_bookkeeper_would_not_write() -> None:
    assert log_file_name(0) == "0.log" and log_file_name(255) == "ff.log"
    assert parse_log_file_name("ff.log") == 255
    for bad in ("FF.log", "0ff.log", "x.log", "1.log.compacting", "1.txn", ".log"):
        assert parse_log_file_name(bad) is None, bad


def test_ids_start_after_lastid_and_after_every_existing_log(tmp_path: Path) -> None:
    current = tmp_path / "current"
    current.mkdir()
    (current / "lastId").write_text("4\n")
    (current / log_file_name(9)).write_bytes(b"")
    a = allocator(current)
    log = a.allocate()
    assert log.log_id == 10 and log.file_pos == fmt.HEADER_SIZE
    assert (current / "lastId").read_text() == "a\n"
    with open(log.path, "rb") as f:
        fmt.decode_header(f.read(fmt.HEADER_SIZE))  # stamped with a valid header
    assert list_log_ids(current) == [9, 10]
    a.close()


def test_a_torn_lastid_is_ignored(tmp_path: Path) -> None:
    current = tmp_path / "current"
    current.mkdir()
    (current / "lastId").write_bytes(b"\x00garbage")
    a = allocator(current)
    assert a.last_id == -1
    assert a.allocate().log_id == 0
    a.close()


def test_preallocated_and_reserved_ids_are_busy_until_used_or_released(tmp_path: Path) -> None:
    a = allocator(tmp_path / "current", preallocate=True)
    first = a.allocate()
    assert first.log_id == 0
    assert a.preallocated_id == 1 and a.busy_ids() == {1}
    reserved = a.reserve()
    assert reserved == 2 and a.busy_ids() == {1, 2} and a.reserved_ids() == {2}
    assert (tmp_path / "current" / "lastId").read_text() == "2\n"
    second = a.allocate()  # the preallocated log, and the next one preallocated
    assert second.log_id == 1 and a.preallocated_id == 3
    a.release(reserved)
    assert a.busy_ids() == {3}
    a.close()  # joins the preallocation thread
    # lastId never moves backwards, whatever order the preallocation thread and compaction
    # wrote it in; the unused preallocated log is removed on close: it holds no entry.
    assert (tmp_path / "current" / "lastId").read_text() == "3\n"
    assert list_log_ids(tmp_path / "current") == [0, 1]


def test_close_without_allocation(tmp_path: Path) -> None:
    a = allocator(tmp_path / "current", preallocate=True)
    a.close()
    assert list_log_ids(tmp_path / "current") == []


def test_listing_a_missing_dir_is_a_storage_error(tmp_path: Path) -> None:
    from vellum.errors import StorageError

    with pytest.raises(StorageError):
        list_log_ids(tmp_path / "nope")
