"""One entry read from disk (``LedgerStorage.get_entry``) racing compaction and a trim: a copy
whose log compaction deleted after the lookup is read where the index now puts it (never
reported corrupt), and a read-ahead that a trim overtook caches nothing of the trimmed range."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from storage_support import open_storage

from vellum.errors import CorruptEntryError, StorageError
from vellum.format.entry import DigestManager, DigestType, master_key
from vellum.ids import location_log_id
from vellum.stats import REGISTRY
from vellum.storage.compaction import EntryLogMetadata, compact_entry_log
from vellum.storage.ledger_storage import LedgerStorage

LEDGER = 9
PASSWORD = b"pw"


def entry(entry_id: int, ledger_id: int = LEDGER) -> bytes:
    payload = b"one-%05d|" % entry_id + bytes(range(200))
    return DigestManager(ledger_id, DigestType.CRC32C, PASSWORD).compute(entry_id, entry_id - 1, 0, payload)


def fill(st: LedgerStorage, n: int, ledger_id: int = LEDGER) -> None:
    st.set_master_key(ledger_id, master_key(PASSWORD))
    for e in range(n):
        st.add_entry(entry(e, ledger_id))


def corrupt_reads(path: Path) -> float:
    return REGISTRY.get_sample_value("bookie_READ_ENTRY_CORRUPT_total", {"ledgerDir": str(path)}) or 0.0


def test_a_read_whose_log_compaction_deleted_after_the_lookup_is_read_at_the_new_place(tmp_path: Path) -> None:
    st = open_storage(tmp_path)
    try:
        fill(st, 20)
        fill(st, 20, ledger_id=LEDGER + 1)  # a second ledger: compaction has work
        st.flush()
        st.rotate_entry_logs()
        old = st.location_of(LEDGER, 7)
        assert old is not None
        result = compact_entry_log(st, EntryLogMetadata.extract(st, location_log_id(old)))
        assert result.new_log_id is not None and not st.entry_logger.log_path(location_log_id(old)).exists()
        index = st._reader.locations
        real = index.get_location
        lookups: list[int] = []

        def lookup(ledger_id: int, entry_id: int) -> int | None:
            """The first lookup answers where the entry was before compaction moved it."""
            lookups.append(entry_id)
            return old if len(lookups) == 1 else real(ledger_id, entry_id)

        index.get_location = lookup  # type: ignore[method-assign]
        before = corrupt_reads(tmp_path)
        assert bytes(st.get_entry(LEDGER, 7, read_ahead=False)) == entry(7)
        assert lookups == [7, 7]  # the copy at the old place failed: looked up again, read there
        assert corrupt_reads(tmp_path) == before
    finally:
        st.close()


def test_a_read_ahead_overtaken_by_a_trim_caches_nothing_of_the_trimmed_range(tmp_path: Path) -> None:
    st = open_storage(tmp_path, read_ahead_batch_size=8)
    try:
        fill(st, 30)
        st.flush()
        logger = st._reader.entry_logger
        real = logger.read_records
        trimmed: list[int] = []

        def read_records(*args: object, **kw: object) -> object:
            """The trim lands while the read-ahead reads its window (after the entry's lookup)."""
            if not trimmed:
                st.trim(LEDGER, 20)
                trimmed.append(20)
            return real(*args, **kw)  # type: ignore[arg-type]

        logger.read_records = read_records  # type: ignore[method-assign,assignment]
        assert bytes(st.get_entry(LEDGER, 0)) == entry(0)  # the read itself was before the trim
        assert trimmed == [20]
        assert not any(st.read_cache_contains(LEDGER, e) for e in range(1, 20))
        logger.read_records = real  # type: ignore[method-assign]
        # Later reads are not affected: a forward reader from the trim point reads ahead again.
        assert [bytes(st.get_entry(LEDGER, e)) for e in (20, 21)] == [entry(20), entry(21)]
        assert st.read_cache_contains(LEDGER, 22)
    finally:
        st.close()


def misdirect_entry_3(st: LedgerStorage, where: Callable[[int, int], int]) -> list[int]:
    """Fill 5 entries, flush, and make the index answer ``where(real location of entry 3, n)``
    at the n-th lookup (1, 2, ...); the entry ids looked up are recorded in the list returned."""
    fill(st, 5)
    st.flush()
    index = st._reader.locations
    real = index.get_location(LEDGER, 3)
    assert real is not None
    lookups: list[int] = []

    def lookup(ledger_id: int, entry_id: int) -> int | None:
        lookups.append(entry_id)
        return where(real, len(lookups))

    index.get_location = lookup  # type: ignore[method-assign]
    return lookups


def test_a_location_that_keeps_changing_is_a_storage_error_never_a_corrupt_entry(tmp_path: Path) -> None:
    """Each lookup answers another place whose copy fails its checks (as if compaction moved the
    entry again and again between lookup and read): the read locates it three times at most and
    gives up with a storage error; no copy is reported corrupt, since the index never pointed
    twice at the one that failed."""
    st = open_storage(tmp_path)
    try:
        # a few bytes before the record, another place at each lookup: never its copy
        lookups = misdirect_entry_3(st, lambda real, n: real - 1 - n)
        before = corrupt_reads(tmp_path)
        with pytest.raises(StorageError, match="location kept changing") as info:
            st.get_entry(LEDGER, 3, read_ahead=False)
        assert not isinstance(info.value, CorruptEntryError)
        assert lookups == [3, 3, 3]
        assert corrupt_reads(tmp_path) == before
    finally:
        st.close()


def test_a_copy_that_fails_where_the_index_still_points_is_corrupt_once(tmp_path: Path) -> None:
    """A copy that fails its checks is located again; the index pointing at it again makes it
    corrupt: EIO, counted once, after two lookups and one read."""
    st = open_storage(tmp_path)
    try:
        lookups = misdirect_entry_3(st, lambda real, n: real - 1)  # one byte before the record, every time
        before = corrupt_reads(tmp_path)
        with pytest.raises(CorruptEntryError, match="entry 3: stored copy is corrupt"):
            st.get_entry(LEDGER, 3, read_ahead=False)
        assert lookups == [3, 3]
        assert corrupt_reads(tmp_path) == before + 1
    finally:
        st.close()
