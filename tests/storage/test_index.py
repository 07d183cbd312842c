"""RocksDB location and ledger indexes on real databases."""

from __future__ import annotations

from pathlib import Path

import pytest
import rocksdict

from vellum.errors import CorruptionError, StorageError
from vellum.format.ledger_index import LedgerData, location_key
from vellum.storage.index import EntryLocationIndex, LedgerMetadataIndex


def test_locations_round_trip_and_last_entry(tmp_path: Path) -> None:
    idx = EntryLocationIndex(tmp_path)
    try:
        idx.put_locations([(1, e, 100 + e) for e in range(10)] + [(2, 0, 7), (0, 5, 9)])
        assert idx.get_location(1, 3) == 103
        assert idx.get_location(1, 10) is None
        assert idx.get_last_entry(1) == (9, 109)
        assert idx.get_last_entry(0) == (5, 9)
        assert idx.get_last_entry(3) is None
        assert idx.entry_ids(1) == list(range(10))
        assert [e for e, _ in idx.iter_ledger(1, 7)] == [7, 8, 9]
        idx.sync()
    finally:
        idx.close()
    idx = EntryLocationIndex(tmp_path)
    try:
        assert idx.get_location(2, 0) == 7
        assert list(idx.items())[:2] == [(0, 5, 9), (1, 0, 100)]
    finally:
        idx.close()


def test_a_run_is_stored_as_its_entries_one_by_one(tmp_path: Path) -> None:
    ids, locs = [0, 1, 2**40, 2**63 - 1], [5, 6, 2**40 + 7, 8]
    one, run = EntryLocationIndex(tmp_path / "one"), EntryLocationIndex(tmp_path / "run")
    try:
        one.put_locations((9, e, loc) for e, loc in zip(ids, locs))
        run.put_run(9, ids, locs)
        assert list(run.items()) == list(one.items()) == [(9, e, loc) for e, loc in zip(ids, locs)]
        with pytest.raises(ValueError, match="ledger 9: 2 entry ids for 1 locations"):
            run.put_run(9, [3, 4], [1])
        assert run.get_location(9, 3) is None
    finally:
        one.close()
        run.close()


def test_negative_ids_sort_after_and_are_ignored(tmp_path: Path) -> None:
    idx = EntryLocationIndex(tmp_path)
    try:
        idx.put_locations([(4, 1, 11), (4, 2**63 - 1, 12)])
        # a stray negative entry id of the same ledger (bytewise: after MAX) is not "last"
        idx._store().put(location_key(4, -2), (13).to_bytes(8, "big"))
        idx._store().put(location_key(-1, 0), (14).to_bytes(8, "big"))
        assert idx.get_last_entry(4) == (2**63 - 1, 12)
        assert idx.entry_ids(4) == [1, 2**63 - 1]
        assert [lid for lid, _, _ in idx.items()] == [4, 4]
        idx.delete_ledger(4)
        assert idx.get_last_entry(4) is None
        assert idx._store().get(location_key(4, -2)) is None  # the whole ledger's range is gone
    finally:
        idx.close()


def test_delete_range_trims(tmp_path: Path) -> None:
    idx = EntryLocationIndex(tmp_path)
    try:
        idx.put_locations([(1, e, e) for e in range(10)] + [(2, 0, 1)])
        idx.delete_range(1, 0, 4)
        assert idx.entry_ids(1) == list(range(4, 10))
        idx.delete_ledger(1)
        assert idx.entry_ids(1) == [] and idx.entry_ids(2) == [0]
    finally:
        idx.close()


def test_ledgers_index(tmp_path: Path) -> None:
    idx = LedgerMetadataIndex(tmp_path)
    try:
        idx.put(3, LedgerData(True, False, b"key"))
        idx.put(1, LedgerData(True, True, b"k1", explicit_lac=b"lac"))
        idx.set_storage_flags(1)
        assert list(idx.ledgers()) == [1, 3]  # the flags key (-0xeefd) is not a ledger
        assert idx.get(1) == LedgerData(True, True, b"k1", b"lac")
        idx.delete(3)
        idx.sync()
    finally:
        idx.close()
    idx = LedgerMetadataIndex(tmp_path)
    try:
        assert list(idx.ledgers()) == [1]
        assert idx.get_storage_flags() == 1
        with pytest.raises(ValueError):
            idx.put(-5, LedgerData())
    finally:
        idx.close()


def test_open_errors_name_the_path(tmp_path: Path) -> None:
    idx = EntryLocationIndex(tmp_path)
    try:
        with pytest.raises(StorageError, match=r"current/locations.*in use"):
            EntryLocationIndex(tmp_path)
    finally:
        idx.close()
    bad = tmp_path / "other" / "current" / "ledgers"
    bad.mkdir(parents=True)
    (bad / "CURRENT").write_text("garbage\n")
    with pytest.raises(CorruptionError, match=r"other/current/ledgers"):
        LedgerMetadataIndex(tmp_path / "other")


def test_closed_index_refuses(tmp_path: Path) -> None:
    idx = LedgerMetadataIndex(tmp_path)
    idx.close()
    with pytest.raises(StorageError, match="closed"):
        idx.get(1)


def test_raw_layout_is_bookkeepers(tmp_path: Path) -> None:
    idx = EntryLocationIndex(tmp_path)
    idx.put_location(1, 2, (3 << 32) | 1028)
    idx.close()
    opts = rocksdict.Options(raw_mode=True)
    db = rocksdict.Rdict(str(tmp_path / "current" / "locations"), opts)
    try:
        assert db.get(bytes.fromhex("00000000000000010000000000000002")) == bytes.fromhex("0000000300000404")
    finally:
        db.close()
