"""Compaction passes on real storage (real entry log files, real RocksDB): the max run time
limits the pass, never the log in hand; the throttle by bytes; a ledger deleted while its log is
being compacted; and logs with unreadable records, which are skipped, logged and counted and
never a reason to lose (or resurrect) an entry.

Time is injected (``monotonic``/``sleep`` of ``GarbageCollectorThread``): the throttle's waits
advance a fake clock, so durations are computed, never measured."""

from __future__ import annotations

import logging
import struct
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from gc_support import (
    FakeLister,
    entry,
    live_entries_by_log,
    log_bytes,
    open_storage,
    read_back_through_index,
    write_ledgers,
)

from vellum.errors import CorruptEntryError, NoSuchLedgerError
from vellum.stats import REGISTRY
from vellum.storage.compaction import STEP_COPIED
from vellum.storage.gc import GarbageCollectorThread, GcSettings


class FakeTime:
    """A monotonic clock that only the throttle's sleeps move."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def _metric(name: str, ledger_dir: Path) -> float:
    return REGISTRY.get_sample_value(name, {"ledgerDir": str(ledger_dir)}) or 0.0


# ---------------------------------------------------------------------------------------------
# Max run time: checked before each log, the log in hand is finished


def test_max_run_time_limits_the_pass_and_finishes_the_log_in_hand(tmp_path: Path) -> None:
    st = open_storage(tmp_path, log_size_limit=24 * 1024)
    ledgers = list(range(1, 11))
    write_ledgers(st, ledgers, 24)
    st.entry_logger.rotate()
    live = ledgers[1::2]
    live_in = live_entries_by_log(st, live)
    logs = sorted(live_in)
    # At 5 entries/s (burst 5) a log with more than 10 live entries takes over a second: each
    # log alone outlasts the 1 s limit.
    assert len(logs) >= 3 and all(len(v) > 10 for v in live_in.values()), {k: len(v) for k, v in live_in.items()}
    clock = FakeTime()
    settings = GcSettings(major_compaction_max_time_ms=1000, compaction_rate_by_entries=5)
    gc = GarbageCollectorThread(st, settings, lister=FakeLister(live), monotonic=clock.monotonic, sleep=clock.sleep)
    compacted: list[int] = []
    for _ in logs:
        start = clock.now
        report = gc.run_once(force=True)
        assert report.kind == "major"
        # One log per pass, finished although it took longer than the limit; the next log
        # waits for the next pass instead of being started and thrown away.
        (c,) = report.compactions
        assert not c.aborted and c.new_log_id is not None, c
        assert c.entries_moved == len(live_in[c.log_id])
        assert clock.now - start > 1.0
        assert not st.entry_logger.log_path(c.log_id).exists()
        compacted.append(c.log_id)
    assert sorted(compacted) == logs
    report = gc.run_once(force=True)
    assert report.compactions == []  # nothing eligible is left
    st.close()
    st = open_storage(tmp_path)
    read_back_through_index(st, [(lid, e) for lid in live for e in range(24)])
    st.close()


# ---------------------------------------------------------------------------------------------
# Throttle by bytes


def test_throttle_by_bytes_paces_compaction_by_the_bytes_moved(tmp_path: Path) -> None:
    st = open_storage(tmp_path, log_size_limit=1 << 20)
    write_ledgers(st, [1, 2, 3, 4], 30)
    st.entry_logger.rotate()
    live = [2, 4]
    rate = 4000
    clock = FakeTime()
    # By entries the pass would not wait at all (60 entries, a million per second allowed).
    settings = GcSettings(is_throttle_by_bytes=True, compaction_rate_by_bytes=rate,
                          compaction_rate_by_entries=1_000_000)
    gc = GarbageCollectorThread(st, settings, lister=FakeLister(live), monotonic=clock.monotonic, sleep=clock.sleep)
    report = gc.run_once(force=True)
    assert sum(c.entries_moved for c in report.compactions) == 60
    moved = sum(len(entry(lid, e)) for lid in live for e in range(30))
    # One second's worth of bytes passes at once; the rest is paid for at `rate` bytes/s.
    assert moved > 4 * rate
    assert sum(clock.sleeps) == pytest.approx((moved - rate) / rate)
    assert len(clock.sleeps) >= 50  # paced entry by entry, not in one wait at the end
    st.close()


# ---------------------------------------------------------------------------------------------
# A ledger deleted while its log is being compacted


@pytest.mark.parametrize("when", ["while_copying", "after_copy"])
def test_ledger_deleted_while_its_log_is_compacted(tmp_path: Path, when: str) -> None:
    st = open_storage(tmp_path, log_size_limit=1 << 20)
    write_ledgers(st, [1, 2, 3, 4], 40)
    st.entry_logger.rotate()
    lister = FakeLister([2, 3, 4])  # ledger 1 was deleted before the pass
    victim, survivors = 3, [2, 4]
    clock = FakeTime()
    deleted: list[int] = []

    def delete_victim() -> None:
        # What doGcLedgers does (here, or another ledger dir's GC thread for a ledger with
        # homes in both dirs): the ledger is gone from metadata and from the local index.
        if not deleted:
            lister.live.discard(victim)
            st.delete_ledger(victim)
            deleted.append(victim)

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if when == "while_copying" and len(clock.sleeps) == 5:
            delete_victim()

    def hook(step: str) -> None:
        if when == "after_copy" and step == STEP_COPIED:
            delete_victim()

    settings = GcSettings(compaction_rate_by_entries=10)  # the throttle's waits: points inside the copy
    gc = GarbageCollectorThread(st, settings, lister=lister, step_hook=hook,
                                monotonic=clock.monotonic, sleep=sleep)
    report = gc.run_once(force=True)
    assert deleted == [victim]
    (c,) = report.compactions
    assert not c.aborted and c.new_log_id is not None
    # Some of the victim's entries were copied before it was deleted, but the index update
    # moves only entries whose index entry still points where compaction read them.
    assert c.entries_moved == 80
    for eid in range(40):
        assert st.location_of(victim, eid) is None
    with pytest.raises(NoSuchLedgerError):
        st.get_entry(victim, 0)
    st.close()
    st = open_storage(tmp_path)
    read_back_through_index(st, [(lid, e) for lid in survivors for e in range(40)])
    for eid in range(40):
        assert st.location_of(victim, eid) is None
    with pytest.raises(NoSuchLedgerError):
        st.get_entry(victim, 0)
    # Later passes reclaim the copies: doGcEntryLogs drops the deleted ledger from the new log's
    # metadata, and a compaction of any log with a dead byte (threshold 1.0) copies them away.
    gc = GarbageCollectorThread(st, GcSettings(major_compaction_threshold=1.0), lister=FakeLister(survivors))
    gc.run_once(force=True)
    for log_id in st.entry_logger.log_ids():
        assert not {rec.ledger_id for rec in st.entry_logger.scan(log_id)} & {1, victim}
    live_bytes = sum(4 + len(entry(lid, e)) for lid in survivors for e in range(40))
    assert log_bytes(tmp_path) <= live_bytes + 3 * 1024 + 4096  # headers and ledgers maps
    st.close()
    st = open_storage(tmp_path)
    read_back_through_index(st, [(lid, e) for lid in survivors for e in range(40)])
    st.close()


# ---------------------------------------------------------------------------------------------
# Unreadable records


def _damage(st, ledger_id: int, entry_id: int, how: str) -> tuple[Path, int]:  # type: ignore[no-untyped-def]
    """Damage one stored record in place; returns its log's path and the record's offset."""
    loc = st.location_of(ledger_id, entry_id)
    assert loc is not None
    path, body = st.entry_logger.log_path(loc >> 32), loc & 0xFFFFFFFF
    with open(path, "r+b") as f:
        if how == "size_too_small":
            f.seek(body - 4)
            f.write(struct.pack(">i", 7))
        elif how == "negative_ids":
            f.seek(body)
            f.write(struct.pack(">q", -12345))
        elif how == "size_past_end":
            f.seek(body - 4)
            f.write(struct.pack(">i", 0x3FFFFFFF))
        else:
            raise AssertionError(how)
    return path, body - 4


def _log_of_six_ledgers(path: Path, *, sealed: bool, first: int = 1):  # type: ignore[no-untyped-def]
    """One log holding ledgers first..first+5 (20 entries each, interleaved), sealed (ledgers map
    at its end) or not (the log a crash or a restart left: GC scans it)."""
    st = open_storage(path, log_size_limit=1 << 20)
    write_ledgers(st, range(first, first + 6), 20)
    if sealed:
        st.entry_logger.rotate()
    return st


@pytest.mark.parametrize("sealed", [False, True], ids=["scanned", "sealed"])
@pytest.mark.parametrize("how", ["size_too_small", "negative_ids", "size_past_end"])
def test_unreadable_dead_record_does_not_stop_gc_of_its_log(
    tmp_path: Path, sealed: bool, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    st = _log_of_six_ledgers(tmp_path, sealed=sealed)
    live = [2, 4, 6]
    path, offset = _damage(st, 1, 10, how)  # a record of a ledger about to be deleted
    st.close()
    st = open_storage(tmp_path, log_size_limit=1 << 20)  # a new active log; the damaged one is flushed
    before = _metric("bookie_GC_ENTRY_LOG_UNREADABLE_SPANS_total", tmp_path)
    caplog.set_level(logging.ERROR, logger="vellum.storage.gc")
    report = GarbageCollectorThread(st, GcSettings(), lister=FakeLister(live)).run_once(force=True)
    # The damaged log was compacted: every live entry moved out of it, then it was deleted.
    assert not path.exists()
    (c,) = [c for c in report.compactions if st.entry_logger.log_path(c.log_id) == path]
    assert not c.held and c.entries_moved == 60 and c.skipped
    assert _metric("bookie_GC_ENTRY_LOG_UNREADABLE_SPANS_total", tmp_path) > before
    assert f"entry log {path}: skipped" in caplog.text and f"at offset {offset}" in caplog.text
    st.close()
    st = open_storage(tmp_path)
    read_back_through_index(st, [(lid, e) for lid in live for e in range(20)])
    st.close()


def test_unreadable_live_entry_holds_its_log_until_its_ledger_is_deleted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    st = open_storage(tmp_path, log_size_limit=1 << 20)
    write_ledgers(st, range(1, 7), 20)
    st.entry_logger.rotate()
    write_ledgers(st, range(11, 17), 20)  # a second log, left unsealed: GC scans it
    st.close()
    st = open_storage(tmp_path, log_size_limit=1 << 20)
    live = [2, 4, 6, 12, 14, 16]
    damaged, offset = _damage(st, 2, 10, "size_too_small")  # a live entry
    _damage(st, 11, 5, "negative_ids")  # and a dead one in the other log
    other = st.entry_logger.log_path(st.location_of(12, 0) >> 32)  # type: ignore[operator]
    st.close()
    st = open_storage(tmp_path, log_size_limit=1 << 20)
    caplog.set_level(logging.ERROR, logger="vellum.storage.gc")
    lister = FakeLister(live)
    gc = GarbageCollectorThread(st, GcSettings(), lister=lister)
    report = gc.run_once(force=True)
    # The other log is collected; the one with an unreadable live entry is kept as it was.
    assert not other.exists() and damaged.exists()
    (held,) = [c for c in report.compactions if c.held]
    assert [(lid, eid) for lid, eid, _o, _w in held.unreadable] == [(2, 10)]
    assert f"entry log {damaged}: live entry (ledger 2, entry 10) at offset {offset + 4}" in caplog.text
    assert _metric("bookie_GC_ENTRY_LOGS_HELD", tmp_path) == 1
    rows = {r["logId"]: r for r in gc.log_usage()}
    assert rows[damaged.name.removesuffix(".log")]["held"]
    # Every other live entry is readable through the index; the damaged one answers EIO.
    expected = [(lid, e) for lid in live for e in range(20) if (lid, e) != (2, 10)]
    read_back_through_index(st, expected)
    with pytest.raises(CorruptEntryError):
        st.get_entry(2, 10, read_ahead=False)
    # Not retried pass after pass.
    assert gc.run_once(force=True).compactions == []
    # Once the ledger of the unreadable entry is deleted, the log is compacted and deleted.
    lister.live.discard(2)
    report = gc.run_once(force=True)
    assert 2 in report.deleted_ledgers
    assert not damaged.exists()
    assert _metric("bookie_GC_ENTRY_LOGS_HELD", tmp_path) == 0
    st.close()
    st = open_storage(tmp_path)
    read_back_through_index(st, [(lid, e) for lid in live if lid != 2 for e in range(20)])
    st.close()


def test_live_entry_swallowed_by_a_skipped_span_is_found_through_the_index(tmp_path: Path) -> None:
    """Two damaged dead records around a live one: the scan cannot tell where the live record
    starts and skips it with them. The log must not be deleted as "only dead ledgers": the
    index still points into it, so GC counts that ledger and compaction reads the entry by its
    indexed location."""
    st = open_storage(tmp_path, log_size_limit=1 << 20)
    write_ledgers(st, [6], 20)
    write_ledgers(st, [7], 1)  # one live entry, between two dead ledgers' records
    write_ledgers(st, [8], 20)
    _damage(st, 6, 19, "negative_ids")
    path, _ = _damage(st, 8, 0, "negative_ids")
    live_loc = st.location_of(7, 0)
    assert live_loc is not None
    st.close()  # unsealed: GC works out its ledgers by scanning
    st = open_storage(tmp_path, log_size_limit=1 << 20)
    report = GarbageCollectorThread(st, GcSettings(), lister=FakeLister([7])).run_once(force=True)
    (c,) = [c for c in report.compactions if st.entry_logger.log_path(c.log_id) == path]
    body = live_loc & 0xFFFFFFFF
    assert any(sp.offset <= body < sp.resume for sp in c.skipped), c.skipped  # the scan skipped it
    assert c.entries_moved == 1 and not path.exists()
    st.close()
    st = open_storage(tmp_path)
    read_back_through_index(st, [(7, 0)])
    st.close()
