"""BATCH_READ and READ_STRIDED runs as ledger storage serves them: ``PackedEntries`` laid out as
the reply carries them, a run stored one after the other in an entry log served as one slice of
the read buffer, runs split across entry logs or across the write cache and the disk, a corrupt
entry inside a run (detected, never served, reported by the read that starts at it), and runs
racing compaction (a stale location is never served as the entry asked for)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from storage_support import open_storage

from vellum.errors import CorruptEntryError
from vellum.format.entry import DigestManager, DigestType, master_key
from vellum.ids import location_log_id, location_offset
from vellum.proto import codec
from vellum.proto import messages as m
from vellum.stats import REGISTRY
from vellum.storage import entry_log_reader, ledger_data
from vellum.storage.compaction import STEP_INDEX_UPDATED, EntryLogMetadata, compact_entry_log
from vellum.storage.ledger_storage import LedgerStorage

LEDGER = 5
PASSWORD = b"pw"


def entry(entry_id: int, digest_type: DigestType = DigestType.CRC32C, ledger_id: int = LEDGER) -> bytes:
    """Entries of uneven sizes (40..~300 payload bytes): runs straddle read buffers anywhere."""
    payload = b"run-%05d|" % entry_id + bytes(range(256))[: 30 + (entry_id * 37) % 250]
    return DigestManager(ledger_id, digest_type, PASSWORD).compute(entry_id, entry_id - 1, 0, payload)


def fill(st: LedgerStorage, ids: range | list[int], digest_type: DigestType = DigestType.CRC32C,
         ledger_id: int = LEDGER) -> None:
    st.set_master_key(ledger_id, master_key(PASSWORD))
    for e in ids:
        st.add_entry(entry(e, digest_type, ledger_id))


def as_bytes(got: m.PackedEntries) -> list[bytes]:
    return [bytes(x) for x in got]


def corrupt_reads(path: Path) -> float:
    return REGISTRY.get_sample_value("bookie_READ_ENTRY_CORRUPT_total", {"ledgerDir": str(path)}) or 0.0


def flip_payload_byte(st: LedgerStorage, entry_id: int) -> None:
    location = st.location_of(LEDGER, entry_id)
    assert location is not None
    at = location_offset(location) + 40  # past the header and the CRC32C digest
    fd = os.open(st.entry_logger.log_path(location_log_id(location)), os.O_RDWR)
    try:
        old = os.pread(fd, 1, at)
        os.pwrite(fd, bytes([old[0] ^ 0x04]), at)
    finally:
        os.close(fd)


def test_a_run_stored_one_after_the_other_is_one_slice_of_the_read_buffer(tmp_path: Path) -> None:
    st = open_storage(tmp_path)
    try:
        fill(st, range(60))
        st.flush()
        got = st.get_entries(LEDGER, 3, 50, 0)
        assert isinstance(got, m.PackedEntries) and as_bytes(got) == [entry(e) for e in range(3, 53)]
        assert len(got.parts) == 1 and isinstance(got.parts[0], memoryview)  # a view: no copy
        # The reply frame is byte for byte the one built from the entries one by one.
        reply = m.BatchReadResponse(0, LEDGER, 3, 9, got)
        assert codec.encode(reply) == codec.encode(m.BatchReadResponse(0, LEDGER, 3, 9, tuple(as_bytes(got))))
        assert len(codec.encode_parts(reply)) == 2  # the fixed part and the run
        assert len(st.get_entries(LEDGER, 0, 0, 0).parts) == 1  # no count bound: to the end
    finally:
        st.close()


def test_a_strided_run_skips_the_entries_between_and_matches_entry_by_entry_reads(tmp_path: Path) -> None:
    """One bookie of a 3,2,2 ledger holds two entries of every three; it serves one in three."""
    st = open_storage(tmp_path)
    try:
        held = [e for e in range(90) if e % 3 != 1]
        fill(st, held)
        st.flush()
        for first in (0, 2, 3):
            got = st.get_strided(LEDGER, first, 3, 100, 0)
            want = [entry(e) for e in range(first, 90, 3)]
            assert as_bytes(got) == want == [bytes(st.get_entry(LEDGER, e, read_ahead=False))
                                             for e in range(first, 90, 3)]
        # A wanted entry that is missing ends the run (entry 1 and its stride are not held).
        with pytest.raises(Exception, match="entry 1 "):
            st.get_strided(LEDGER, 1, 3, 10, 0)
    finally:
        st.close()


def test_a_strided_run_with_nothing_between_is_one_slice_too(tmp_path: Path) -> None:
    """One bookie of a 3,1,1 ledger holds every third entry only: its stored run is the answer."""
    st = open_storage(tmp_path)
    try:
        fill(st, range(2, 60, 3))
        st.flush()
        got = st.get_strided(LEDGER, 2, 3, 100, 0)
        assert as_bytes(got) == [entry(e) for e in range(2, 60, 3)]
        assert len(got.parts) == 1 and isinstance(got.parts[0], memoryview)
    finally:
        st.close()


@pytest.mark.parametrize("stride", [1, 3])
def test_runs_span_read_buffers_entry_logs_and_the_write_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stride: int) -> None:
    # Read buffers of ~1 KiB: runs take several preads and records straddle their ends.
    monkeypatch.setattr(entry_log_reader, "_RUN_CHUNK_MAX", 1000)
    monkeypatch.setattr(entry_log_reader, "_STRIDED_FIRST_READ", 700)
    st = open_storage(tmp_path, log_size_limit=8192)
    try:
        fill(st, range(0, 80))
        st.flush()  # several entry logs of ~8 KiB
        fill(st, range(80, 120))  # still in the write cache
        assert len({location_log_id(st.location_of(LEDGER, e) or 0) for e in range(80)}) >= 3
        got = st.get_strided(LEDGER, 1, stride, 200, 0)
        assert as_bytes(got) == [entry(e) for e in range(1, 120, stride)]
        # BATCH_READ's max_count and max_bytes semantics are unchanged across the sources.
        sizes = [len(entry(e)) for e in range(1, 120, stride)]
        budget = sum(sizes[:25]) + 3
        assert as_bytes(st.get_strided(LEDGER, 1, stride, 200, budget)) == [entry(e) for e in range(1, 120, stride)][:25]
        assert len(st.get_strided(LEDGER, 1, stride, 7, 0)) == 7
        assert len(st.get_strided(LEDGER, 1, stride, 200, 1)) == 1  # the first always counts
        # From the write cache on, and a run of the read-ahead cache.
        cached = st.get_strided(LEDGER, 82, stride, 200, 0)
        assert as_bytes(cached) == [entry(e) for e in range(82, 120, stride)] and len(cached.parts) == 1
    finally:
        st.close()


def test_the_read_ahead_cache_serves_runs_too(tmp_path: Path) -> None:
    st = open_storage(tmp_path, read_ahead_batch_size=20)
    try:
        fill(st, range(40))
        st.flush()
        st.get_entry(LEDGER, 0)  # reads 1..20 ahead
        assert st.read_cache_contains(LEDGER, 20)
        os.unlink(st.entry_logger.log_path(0))  # what is served now comes from memory
        assert as_bytes(st.get_entries(LEDGER, 1, 20, 0)) == [entry(e) for e in range(1, 21)]
    finally:
        st.close()


@pytest.mark.parametrize("digest_type", [DigestType.CRC32C, DigestType.CRC32])
@pytest.mark.parametrize("stride", [1, 2])
def test_a_corrupt_entry_inside_a_run_is_never_served_and_is_reported_when_a_read_starts_at_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, digest_type: DigestType, stride: int) -> None:
    monkeypatch.setattr(entry_log_reader, "_RUN_CHUNK_MAX", 1500)
    st = open_storage(tmp_path)
    try:
        fill(st, range(60), digest_type)
        st.flush()
        flip_payload_byte(st, 30)
        before = corrupt_reads(tmp_path)
        got = st.get_strided(LEDGER, 0, stride, 100, 0)
        assert as_bytes(got) == [entry(e, digest_type) for e in range(0, 30, stride)]  # short, never past it
        assert corrupt_reads(tmp_path) == before  # a short answer reports nothing
        with pytest.raises(CorruptEntryError, match="entry 30: stored copy is corrupt"):
            st.get_strided(LEDGER, 30, stride, 100, 0)
        assert corrupt_reads(tmp_path) == before + 1
        assert as_bytes(st.get_strided(LEDGER, 30 + stride, stride, 100, 0)) == [
            entry(e, digest_type) for e in range(30 + stride, 60, stride)]
    finally:
        st.close()


def test_the_run_check_follows_the_reads_check_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulator's ``serve-unchecked-reads`` regression reverts the check of every read path."""
    st = open_storage(tmp_path)
    try:
        fill(st, range(10))
        st.flush()
        flip_payload_byte(st, 4)
        assert len(st.get_entries(LEDGER, 0, 10, 0)) == 4
        monkeypatch.setattr(ledger_data, "_check_reads", False)
        assert len(st.get_entries(LEDGER, 0, 10, 0)) == 10
    finally:
        st.close()


def _stale_locations(st: LedgerStorage, stale: Callable[[int, int], int | None]) -> list[tuple[int, int]]:
    """Make the reader's next location lookup answer ``stale(ledger, entry)`` (as if compaction
    moved the entry right after it); later lookups answer the index. Returns the calls made."""
    index = st._reader.locations
    real = index.get_location
    calls: list[tuple[int, int]] = []

    def lookup(ledger_id: int, entry_id: int) -> int | None:
        calls.append((ledger_id, entry_id))
        if len(calls) == 1:
            return stale(ledger_id, entry_id)
        return real(ledger_id, entry_id)

    index.get_location = lookup  # type: ignore[method-assign]
    return calls


def _compact(st: LedgerStorage, log_id: int, hook: Callable[[str], None] | None = None) -> None:
    result = compact_entry_log(st, EntryLogMetadata.extract(st, log_id), hook=hook)
    assert result.new_log_id is not None and not result.unreadable


@pytest.mark.parametrize("stride", [1, 3])
def test_a_run_whose_log_compaction_deleted_after_the_lookup_is_read_at_the_new_place(
        tmp_path: Path, stride: int) -> None:
    st = open_storage(tmp_path)
    try:
        fill(st, range(40))
        fill(st, range(40), ledger_id=LEDGER + 1)  # a second ledger: compaction has work
        st.flush()
        st.rotate_entry_logs()
        old_log = location_log_id(st.location_of(LEDGER, 0) or 0)
        olds = {e: st.location_of(LEDGER, e) for e in range(40)}
        _compact(st, old_log)
        assert not st.entry_logger.log_path(old_log).exists()
        calls = _stale_locations(st, lambda _lid, eid: olds[eid])
        got = st.get_strided(LEDGER, 0, stride, 100, 0)
        assert as_bytes(got) == [entry(e) for e in range(0, 40, stride)]
        assert len(calls) >= 2  # the stale run failed, the entry was looked up again
    finally:
        st.close()


def test_a_run_read_from_the_old_log_while_compaction_moves_it_is_the_same_entries(tmp_path: Path) -> None:
    """Compaction copied the entries and moved the index; the old log is not deleted yet, and a
    reader that looked up the old location reads the run there: the same entries, checked."""
    st = open_storage(tmp_path)
    try:
        fill(st, range(40))
        fill(st, range(40), ledger_id=LEDGER + 1)
        st.flush()
        st.rotate_entry_logs()
        old_log = location_log_id(st.location_of(LEDGER, 0) or 0)
        olds = {e: st.location_of(LEDGER, e) for e in range(40)}
        served: list[list[bytes]] = []

        def hook(step: str) -> None:
            if step == STEP_INDEX_UPDATED:
                assert st.location_of(LEDGER, 0) != olds[0]
                _stale_locations(st, lambda _lid, eid: olds[eid])
                got = st.get_entries(LEDGER, 0, 100, 0)
                assert len(got.parts) == 1  # one run, read from the old log
                served.append(as_bytes(got))

        _compact(st, old_log, hook)
        assert served == [[entry(e) for e in range(40)]]
    finally:
        st.close()


def test_a_location_that_points_at_another_record_is_never_served_as_the_entry_asked_for(tmp_path: Path) -> None:
    """The stored ids of every record of a run are checked against the ones asked for."""
    st = open_storage(tmp_path)
    try:
        fill(st, range(20))
        st.flush()
        wrong = st.location_of(LEDGER, 7)
        calls = _stale_locations(st, lambda _lid, _eid: wrong)
        assert as_bytes(st.get_entries(LEDGER, 5, 10, 0)) == [entry(e) for e in range(5, 15)]
        assert len(calls) >= 2
    finally:
        st.close()


def test_a_run_ends_where_the_next_ledgers_records_start(tmp_path: Path) -> None:
    """The sorted flush puts the next ledger's records right after this one's: even where their
    entry ids would continue this ledger's run, they are not this ledger's entries."""
    st = open_storage(tmp_path)
    try:
        fill(st, range(10))
        fill(st, range(10, 20), ledger_id=LEDGER + 1)
        st.flush()
        assert as_bytes(st.get_entries(LEDGER, 0, 20, 0)) == [entry(e) for e in range(10)]
        assert as_bytes(st.get_strided(LEDGER, 1, 3, 20, 0)) == [entry(e) for e in range(1, 10, 3)]
    finally:
        st.close()
