"""Ledger storage verifies what it reads back from its entry logs (defect D5 of docs/correctness.md).

A stored entry whose payload was damaged on disk must be answered as an I/O error (never "no
such entry", never as a good entry), logged with ledger, entry, log and offset, and counted;
a good entry of any digest type (CRC32, CRC32C, HMAC, DUMMY) must never be flagged.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from storage_support import open_storage

from vellum import errors as E
from vellum.errors import CorruptEntryError, NoSuchEntryError
from vellum.format.entry import DigestManager, DigestType, digest_length, master_key
from vellum.format.ledger_index import DIGEST_NOT_CHECKABLE
from vellum.ids import location_log_id, location_offset
from vellum.stats import REGISTRY
from vellum.storage import ledger_data
from vellum.storage.ledger_storage import LedgerStorage

LEDGER = 7
ENTRIES = 20
BAD = 12
PASSWORD = b"pw"


def payload(entry_id: int) -> bytes:
    return b"payload-%04d-" % entry_id + bytes(range(64))


def write_ledger(path: Path, digest_type: DigestType, ledger_id: int = LEDGER) -> list[bytes]:
    """A ledger of ENTRIES entries as a client writes them, flushed to the entry log (synced)."""
    dm = DigestManager(ledger_id, digest_type, PASSWORD)
    entries: list[bytes] = []
    length = 0
    st = open_storage(path)
    try:
        st.set_master_key(ledger_id, master_key(PASSWORD))
        for eid in range(ENTRIES):
            length += len(payload(eid))
            entries.append(dm.compute(eid, eid - 1, length, payload(eid)))
            st.add_entry(entries[-1])
        st.flush()
    finally:
        st.close()
    return entries


def flip_payload_byte(path: Path, digest_type: DigestType, ledger_id: int = LEDGER, entry_id: int = BAD) -> int:
    """Flip one payload byte of the entry in its (closed, synced) entry log; returns its location."""
    st = open_storage(path)
    try:
        location = st.location_of(ledger_id, entry_id)
        assert location is not None
        log_path = st.entry_logger.log_path(location_log_id(location))
    finally:
        st.close()
    at = location_offset(location) + 32 + digest_length(digest_type) + 5
    fd = os.open(log_path, os.O_RDWR)
    try:
        old = os.pread(fd, 1, at)
        os.pwrite(fd, bytes([old[0] ^ 0x10]), at)
        os.fsync(fd)
    finally:
        os.close(fd)
    return location


def corrupt_reads(path: Path) -> float:
    return REGISTRY.get_sample_value("bookie_READ_ENTRY_CORRUPT_total", {"ledgerDir": str(path)}) or 0.0


def read_everything(st: LedgerStorage, ledger_id: int = LEDGER) -> list[bytes]:
    """Every entry through each read path: get_entry with read-ahead (sequential), get_entry
    without, BATCH_READ runs, READ_STRIDED; all must agree."""
    seq = [bytes(st.get_entry(ledger_id, e)) for e in range(ENTRIES)]
    single = [bytes(st.get_entry(ledger_id, e, read_ahead=False)) for e in reversed(range(ENTRIES))][::-1]
    batch = [bytes(x) for x in st.get_entries(ledger_id, 0, ENTRIES, 0)]
    strided = [bytes(x) for x in st.get_strided(ledger_id, 0, 3, ENTRIES, 0)]
    assert seq == single == batch and strided == seq[::3]
    return seq


@pytest.mark.parametrize("digest_type", [DigestType.CRC32, DigestType.CRC32C])
def test_flipped_payload_byte_in_synced_entry_log_is_an_io_error(
    tmp_path: Path, digest_type: DigestType, caplog: pytest.LogCaptureFixture
) -> None:
    entries = write_ledger(tmp_path, digest_type)
    location = flip_payload_byte(tmp_path, digest_type)
    before = corrupt_reads(tmp_path)
    st = open_storage(tmp_path)
    try:
        with caplog.at_level(logging.ERROR, logger="vellum.storage.ledger_storage"), \
                pytest.raises(CorruptEntryError) as info:
            st.get_entry(LEDGER, BAD)
        err = info.value
        assert not isinstance(err, NoSuchEntryError)
        assert E.wire_status_for(err) == E.EIO
        assert corrupt_reads(tmp_path) == before + 1
        line = caplog.records[-1].getMessage()
        offset = location_offset(location)
        assert f"ledger {LEDGER} entry {BAD} " in line and f"at offset {offset} " in line
        assert str(st.entry_logger.log_path(location_log_id(location))) in line
        assert f"{digest_type.name} digest mismatch" in line
        # Its neighbours are good, through every read path.
        assert [bytes(st.get_entry(LEDGER, e)) for e in range(BAD)] == entries[:BAD]
        assert bytes(st.get_entry(LEDGER, BAD + 1, read_ahead=False)) == entries[BAD + 1]
    finally:
        st.close()


@pytest.mark.parametrize("digest_type", [DigestType.CRC32, DigestType.CRC32C])
def test_multi_entry_reads_stop_before_a_corrupt_entry_and_fail_on_it(tmp_path: Path, digest_type: DigestType) -> None:
    entries = write_ledger(tmp_path, digest_type)
    flip_payload_byte(tmp_path, digest_type)
    st = open_storage(tmp_path)
    try:
        before = corrupt_reads(tmp_path)
        # BATCH_READ: the entries before it, then (a read starting at it) the error.
        assert [bytes(x) for x in st.get_entries(LEDGER, 3, ENTRIES, 0)] == entries[3:BAD]
        assert corrupt_reads(tmp_path) == before  # a short answer reports nothing
        with pytest.raises(CorruptEntryError):
            st.get_entries(LEDGER, BAD, ENTRIES, 0)
        assert corrupt_reads(tmp_path) == before + 1
        assert [bytes(x) for x in st.get_entries(LEDGER, BAD + 1, ENTRIES, 0)] == entries[BAD + 1 :]
        # READ_STRIDED likewise (stride 4 from 0: 0, 4, 8, 12=BAD).
        assert [bytes(x) for x in st.get_strided(LEDGER, 0, 4, ENTRIES, 0)] == entries[0:BAD:4]
        with pytest.raises(CorruptEntryError):
            st.get_strided(LEDGER, BAD, 4, ENTRIES, 0)
        assert corrupt_reads(tmp_path) == before + 2
        # Read-ahead after a miss caches only verified copies: the corrupt one is not served
        # from memory, it is read (and refused) again.
        st.get_entry(LEDGER, BAD - 2)
        assert st.read_cache_contains(LEDGER, BAD - 1)
        assert not st.read_cache_contains(LEDGER, BAD)
        assert st.get_cached_entry(LEDGER, BAD) is None
        with pytest.raises(CorruptEntryError):
            st.get_entry(LEDGER, BAD)
        assert corrupt_reads(tmp_path) == before + 3
    finally:
        st.close()


@pytest.mark.parametrize("digest_type", list(DigestType))
def test_good_ledgers_of_every_digest_type_raise_no_false_alarm(tmp_path: Path, digest_type: DigestType) -> None:
    entries = write_ledger(tmp_path, digest_type)
    before = corrupt_reads(tmp_path)
    st = open_storage(tmp_path)
    try:
        assert read_everything(st) == entries
        assert corrupt_reads(tmp_path) == before
        # What the bookie learnt, durably: CRC ledgers are checked, HMAC and DUMMY never.
        learnt = st.ledgers_index.get(LEDGER)
        assert learnt is not None
        checked = digest_type in (DigestType.CRC32, DigestType.CRC32C)
        assert learnt.digest_type == (int(digest_type) if checked else DIGEST_NOT_CHECKABLE)
    finally:
        st.close()


@pytest.mark.parametrize("digest_type", [DigestType.HMAC, DigestType.DUMMY])
def test_ledgers_without_a_keyless_digest_are_never_checked(tmp_path: Path, digest_type: DigestType) -> None:
    """The bookie cannot tell a damaged HMAC or DUMMY entry from a good one: it returns it as
    stored, and the reading client's digest check (which has the password) catches it."""
    entries = write_ledger(tmp_path, digest_type)
    flip_payload_byte(tmp_path, digest_type)
    st = open_storage(tmp_path)
    try:
        got = bytes(st.get_entry(LEDGER, BAD))
        assert got != entries[BAD] and len(got) == len(entries[BAD])
    finally:
        st.close()


def test_a_later_add_that_disagrees_turns_checks_off(tmp_path: Path) -> None:
    """An HMAC entry matching CRC32C by chance (2**-32) would make every read of its ledger a
    false alarm: the next add that does not verify turns the checks off for good."""
    crc = DigestManager(LEDGER, DigestType.CRC32C, PASSWORD)
    hmac = DigestManager(LEDGER, DigestType.HMAC, PASSWORD)
    st = open_storage(tmp_path)
    try:
        st.set_master_key(LEDGER, master_key(PASSWORD))
        st.add_entry(crc.compute(0, -1, 1, b"a"))  # stands for the chance match
        assert st.ledgers_index.get(LEDGER).digest_type == DigestType.CRC32C  # type: ignore[union-attr]
        st.add_entry(hmac.compute(1, 0, 2, b"b"))
        assert st.ledgers_index.get(LEDGER).digest_type == DIGEST_NOT_CHECKABLE  # type: ignore[union-attr]
        st.add_entry(crc.compute(2, 1, 3, b"c"))  # never checkable again
        st.flush()
    finally:
        st.close()
    flip_payload_byte(tmp_path, DigestType.HMAC, entry_id=1)
    st = open_storage(tmp_path)
    try:
        assert st.ledgers_index.get(LEDGER).digest_type == DIGEST_NOT_CHECKABLE  # type: ignore[union-attr]
        st.get_entry(LEDGER, 1)  # not checked: returned as stored
    finally:
        st.close()


def test_digest_type_is_learnt_again_by_journal_replay_style_adds(tmp_path: Path) -> None:
    """Adds of a ledger made known by its entries alone (journal replay, no master key first)
    teach its digest type as well."""
    dm = DigestManager(LEDGER, DigestType.CRC32, PASSWORD)
    st = open_storage(tmp_path)
    try:
        st.add_entry(dm.compute(0, -1, 1, b"x"))
        assert st.ledgers_index.get(LEDGER).digest_type == DigestType.CRC32  # type: ignore[union-attr]
    finally:
        st.close()


def test_the_reads_check_flag_turns_off_what_reads_check_and_nothing_else(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulator's ``serve-unchecked-reads`` regression lives with the read digest
    (``ledger_data._check_reads``): a single read and a multi-entry read then serve the bad copy,
    uncounted; compaction's intact check (``entry_intact``, which decides whether a copy is
    carried into a new log) still sees it is bad."""
    entries = write_ledger(tmp_path, DigestType.CRC32C)
    flip_payload_byte(tmp_path, DigestType.CRC32C)
    st = open_storage(tmp_path)
    try:
        monkeypatch.setattr(ledger_data, "_check_reads", False)
        before = corrupt_reads(tmp_path)
        served = bytes(st.get_entry(LEDGER, BAD, read_ahead=False))
        assert served != entries[BAD] and len(served) == len(entries[BAD])
        assert len(st.get_entries(LEDGER, 0, ENTRIES, 0)) == ENTRIES
        assert corrupt_reads(tmp_path) == before
        assert not st.entry_intact(LEDGER, served)
        assert st.entry_intact(LEDGER, entries[BAD])
    finally:
        st.close()
