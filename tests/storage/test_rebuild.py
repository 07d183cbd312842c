"""Rebuilding the location index from the entry logs."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import crc32c
import pytest

from vellum.errors import StorageError
from vellum.storage.index import EntryLocationIndex, LedgerMetadataIndex
from vellum.storage.ledger_storage import LedgerStorage
from vellum.storage.markers import acquire_dir_lock
from vellum.storage.rebuild import rebuild_index


def make_entry(ledger_id: int, entry_id: int, payload: bytes = b"") -> bytes:
    ids = struct.pack(">qq", ledger_id, entry_id)
    return ids + struct.pack(">I", crc32c.crc32c(ids + payload)) + payload


def fill(path: Path) -> None:
    st = LedgerStorage(
        path,
        log_size_limit=8192,
        write_cache_max_bytes=1 << 16,
        read_cache_max_bytes=1 << 16,
        read_ahead_batch_size=4,
        max_throttle_time_ms=10_000,
        preallocate=False,
    )
    try:
        for lid in (1, 2, 3):
            st.set_master_key(lid, b"k%d" % lid)
        for e in range(150):
            for lid in (1, 2, 3):
                st.add_entry(make_entry(lid, e, b"p" * (e % 40)))
            if e % 50 == 49:
                st.flush()
        # the same entries written again later (as after a failed-and-retried flush): newer wins
        for e in range(5):
            st.add_entry(make_entry(2, e, b"p" * (e % 40)))
        st.set_fenced(3)
        st.flush()
    finally:
        st.close()


def index_items(path: Path) -> list[tuple[int, int, int]]:
    idx = EntryLocationIndex(path)
    try:
        return list(idx.items())
    finally:
        idx.close()


def test_rebuild_equals_original(tmp_path: Path) -> None:
    fill(tmp_path)
    original = index_items(tmp_path)
    assert len(original) == 450
    shutil.rmtree(tmp_path / "current" / "locations")
    seen: list[tuple[int, int, int]] = []
    report = rebuild_index(tmp_path, progress=lambda d, t, n: seen.append((d, t, n)))
    assert index_items(tmp_path) == original
    assert report.ledgers == {1, 2, 3} and report.only_known_ledgers
    assert report.problems == []
    assert seen[-1][0] == seen[-1][1] == report.logs and seen[-1][2] == report.entries
    # ledger data was kept (fenced stays fenced, keys unchanged)
    ledgers = LedgerMetadataIndex(tmp_path)
    try:
        data = ledgers.get(3)
        assert data is not None and data.fenced and data.master_key == b"k3"
    finally:
        ledgers.close()


def test_rebuild_with_lost_ledgers_db_fences_every_found_ledger(tmp_path: Path) -> None:
    fill(tmp_path)
    original = index_items(tmp_path)
    shutil.rmtree(tmp_path / "current" / "locations")
    shutil.rmtree(tmp_path / "current" / "ledgers")
    report = rebuild_index(tmp_path)
    assert not report.only_known_ledgers
    assert index_items(tmp_path) == original
    st = LedgerStorage(
        tmp_path,
        log_size_limit=8192,
        write_cache_max_bytes=1 << 16,
        read_cache_max_bytes=1 << 16,
        read_ahead_batch_size=4,
        max_throttle_time_ms=10_000,
    )
    try:
        assert list(st.ledgers()) == [1, 2, 3]
        assert all(st.is_fenced(lid) for lid in (1, 2, 3))
        assert st.get_entry(2, 149) == make_entry(2, 149, b"p" * (149 % 40))
    finally:
        st.close()


def test_rebuild_skips_deleted_ledgers_and_reports_damage(tmp_path: Path) -> None:
    fill(tmp_path)
    st = LedgerStorage(
        tmp_path,
        log_size_limit=8192,
        write_cache_max_bytes=1 << 16,
        read_cache_max_bytes=1 << 16,
        read_ahead_batch_size=4,
        max_throttle_time_ms=10_000,
        preallocate=False,
    )
    st.delete_ledger(1)
    st.close()
    logs = sorted((tmp_path / "current").glob("*.log"))
    with open(logs[0], "ab") as f:
        f.write(struct.pack(">i", 5000) + b"torn")
    report = rebuild_index(tmp_path)
    assert report.ledgers == {2, 3}
    assert report.skipped_entries == 150
    assert any("truncated" in p and logs[0].name in p for p in report.problems)


def test_rebuild_refuses_while_in_use(tmp_path: Path) -> None:
    fill(tmp_path)
    st = LedgerStorage(
        tmp_path,
        log_size_limit=8192,
        write_cache_max_bytes=1 << 16,
        read_cache_max_bytes=1 << 16,
        read_ahead_batch_size=4,
        max_throttle_time_ms=10_000,
    )
    try:
        with pytest.raises(StorageError, match="in use"):
            rebuild_index(tmp_path)
    finally:
        st.close()


def test_rebuild_refuses_while_a_bookie_holds_the_dir_lock(tmp_path: Path) -> None:
    fill(tmp_path)
    with acquire_dir_lock(tmp_path), pytest.raises(StorageError, match=r"in use by process \d+"):
        rebuild_index(tmp_path)
    rebuild_index(tmp_path)  # released: runs
