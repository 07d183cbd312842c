"""GC and compaction of one ledger storage (real files, real RocksDB): doGcLedgers against a
metadata view, doGcEntryLogs, minor/major compaction, trimmed entries, disk-space states,
suspend/resume, throttling, and entry log per ledger (requirement R1 of docs/correctness.md) including switching the flag
between restarts."""

from __future__ import annotations

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

from vellum.errors import ConfigError, NoSuchEntryError, NoSuchLedgerError
from vellum.storage.compaction import RateLimiter
from vellum.storage.gc import DiskState, GarbageCollectorThread, GcSettings

ENTRIES = 40
NO_COMPACTION = GcSettings(minor_compaction_interval_s=0, major_compaction_interval_s=0)


def _check_all(st, ledgers, entries=ENTRIES, start=0):  # type: ignore[no-untyped-def]
    for lid in ledgers:
        for eid in range(start, start + entries):
            assert st.get_entry(lid, eid) == entry(lid, eid), (lid, eid)


def test_delete_half_of_20_ledgers_and_force_gc(tmp_path: Path) -> None:
    st = open_storage(tmp_path)
    ledgers = list(range(1, 21))
    write_ledgers(st, ledgers, ENTRIES)
    st.entry_logger.rotate()
    dead, live = ledgers[::2], ledgers[1::2]
    dead_bytes = sum(4 + len(entry(lid, e)) for lid in dead for e in range(ENTRIES))
    before = log_bytes(tmp_path)
    live_in = live_entries_by_log(st, live)
    gc = GarbageCollectorThread(st, GcSettings(), lister=FakeLister(live))
    report = gc.run_once(force=True)
    assert sorted(report.deleted_ledgers) == dead
    assert report.kind == "major" and report.compactions
    # Every live entry of each compacted log had its index entry moved, none more.
    for c in report.compactions:
        assert c.entries_moved == len(live_in[c.log_id]), c
    assert sum(c.entries_moved for c in report.compactions) == len(live) * ENTRIES
    _check_all(st, live)
    for lid in dead:
        with pytest.raises(NoSuchLedgerError):
            st.get_entry(lid, 0)
    after = log_bytes(tmp_path)
    # Every deleted byte is given back (the slack: ledgers maps, headers of the new logs).
    assert before - after >= dead_bytes * 0.9
    # No surviving log holds a deleted ledger.
    for log_id in st.entry_logger.log_ids():
        assert not set(st.entry_logger.ledgers_map(log_id)) & set(dead)
    status = gc.status()
    assert status.majorCompactionCounter == 1 and status.deletedLedgers == 10
    st.close()
    # And it all survives a reopen, read through the index alone.
    st = open_storage(tmp_path)
    read_back_through_index(st, [(lid, e) for lid in live for e in range(ENTRIES)])
    _check_all(st, live)
    assert set(st.ledgers()) == set(live)
    st.close()


@pytest.mark.parametrize("failure", ["raises_midway", "empty", "raises_at_once"])
def test_failed_partial_or_empty_listing_deletes_nothing(tmp_path: Path, failure: str) -> None:
    st = open_storage(tmp_path)
    ledgers = list(range(1, 11))
    write_ledgers(st, ledgers, 10)
    lister = FakeLister([] if failure == "empty" else [2, 4, 6, 8, 10], range_size=2)
    if failure == "raises_midway":
        lister.fail_after = 2
    elif failure == "raises_at_once":
        lister.fail_after = 0
    gc = GarbageCollectorThread(st, NO_COMPACTION, lister=lister)
    report = gc.run_once(force=True)
    assert report.deleted_ledgers == [] and report.listing_error
    assert sorted(st.ledgers()) == ledgers
    _check_all(st, ledgers, 10)
    st.close()


def test_fresh_metadata_must_say_twice_that_a_ledger_is_gone(tmp_path: Path) -> None:
    st = open_storage(tmp_path)
    write_ledgers(st, [1, 2, 3], 5)

    class LaggingListing(FakeLister):
        # The listing misses ledger 3 (created after it passed), a fresh read sees it.
        def ledger_ranges(self):  # type: ignore[no-untyped-def]
            yield [1, 2]

    lister = LaggingListing([1, 2, 3])
    report = GarbageCollectorThread(st, NO_COMPACTION, lister=lister).run_once(force=True)
    assert report.deleted_ledgers == [] and sorted(st.ledgers()) == [1, 2, 3]

    class Flapping(FakeLister):
        # The second fresh read disagrees with the first: keep the ledger.
        def ledger_exists(self, ledger_id: int) -> bool:
            self.exists_calls += 1
            return self.exists_calls % 2 == 0

    flapping = Flapping([1, 2])
    report = GarbageCollectorThread(st, NO_COMPACTION, lister=flapping).run_once(force=True)
    assert report.deleted_ledgers == [] and flapping.exists_calls == 2
    st.close()


def test_gc_entry_logs_deletes_whole_logs_without_compaction(tmp_path: Path) -> None:
    st = open_storage(tmp_path, log_size_limit=16 * 1024)
    # Ledger 1 alone fills some logs, then 2 and 3 share the rest.
    write_ledgers(st, [1], 60)
    st.entry_logger.rotate()
    write_ledgers(st, [2, 3], 20)
    st.entry_logger.rotate()
    logs_of_1 = [i for i in st.entry_logger.log_ids() if set(st.entry_logger.ledgers_map(i)) == {1}]
    assert logs_of_1
    report = GarbageCollectorThread(st, NO_COMPACTION, lister=FakeLister([2, 3])).run_once(force=True)
    assert report.kind == "" and not report.compactions
    assert set(logs_of_1) <= set(report.deleted_logs)
    _check_all(st, [2, 3], 20)
    st.close()


def test_trimmed_entries_count_as_dead_and_are_not_resurrected(tmp_path: Path) -> None:
    st = open_storage(tmp_path)
    write_ledgers(st, [1, 2], ENTRIES)
    st.entry_logger.rotate()
    st.trim(1, 30)  # a forced shrink: entries 0..29 of ledger 1 are gone
    st.flush()
    assert sum(st.trimmed_bytes().values()) == sum(4 + len(entry(1, e)) for e in range(30))
    gc = GarbageCollectorThread(st, GcSettings(), lister=FakeLister([1, 2]))
    report = gc.run_once(force=True)
    assert report.compactions
    _check_all(st, [2], ENTRIES)
    _check_all(st, [1], ENTRIES - 30, start=30)
    for eid in range(30):
        with pytest.raises(NoSuchEntryError):
            st.get_entry(1, eid)
    # The copies hold no trimmed entry: scanning every log finds ledger 1 only from entry 30.
    for log_id in st.entry_logger.log_ids():
        for rec in st.entry_logger.scan(log_id):
            assert rec.ledger_id != 1 or rec.entry_id >= 30
    st.close()


def test_minor_vs_major_thresholds_and_emptiest_first(tmp_path: Path) -> None:
    st = open_storage(tmp_path, log_size_limit=32 * 1024)
    # Log A: ledgers 1 (10%) + 2 (90%); log B: ledgers 3 (50%) + 4 (50%).
    write_ledgers(st, [1], 6)
    write_ledgers(st, [2], 54)
    st.entry_logger.rotate()
    write_ledgers(st, [3, 4], 25)
    st.entry_logger.rotate()
    lister = FakeLister([1, 3])  # A keeps ~10%, B keeps ~50%
    settings = GcSettings(gc_wait_time_ms=1000)
    gc = GarbageCollectorThread(st, settings, lister=lister)
    report = gc.run_once(force=True, force_major=False, force_minor=True)
    assert report.kind == "minor"
    moved = [c.log_id for c in report.compactions]
    assert len(moved) >= 1  # only logs below 0.2 usage
    usages = {row["logId"]: row["usage"] for row in gc.log_usage() if not row["active"]}
    assert all(u >= 0.2 for u in usages.values())
    report = gc.run_once(force=True)
    assert report.kind == "major"
    assert all(row["usage"] >= 0.8 for row in gc.log_usage() if not row["active"])
    _check_all(st, [1], 6)
    _check_all(st, [3], 25)
    st.close()


def test_disk_states_suspend_compaction_unless_forced_gc_allowed(tmp_path: Path) -> None:
    st = open_storage(tmp_path)
    write_ledgers(st, [1, 2], 10)
    st.entry_logger.rotate()
    state = [DiskState.WARN]
    gc = GarbageCollectorThread(st, GcSettings(), lister=FakeLister([1, 2]), disk_state=lambda: state[0])
    assert gc.run_once(force=True).kind == "minor"  # warn: major suspended
    state[0] = DiskState.FULL
    assert gc.run_once(force=True).kind == ""  # full: both suspended
    allowed = GarbageCollectorThread(
        st, GcSettings(is_force_gc_allow_when_no_space=True), lister=FakeLister([1, 2]),
        disk_state=lambda: DiskState.FULL,
    )
    assert allowed.run_once().kind == "major"  # no force asked: low space forces it
    st.close()


def test_suspend_and_resume(tmp_path: Path) -> None:
    st = open_storage(tmp_path)
    gc = GarbageCollectorThread(st, GcSettings(), lister=FakeLister([]))
    gc.suspend(major=True)
    assert gc.run_once(force=True).kind == "minor"
    gc.suspend(minor=True)
    assert gc.run_once(force=True).kind == ""
    gc.resume(major=True, minor=True)
    assert gc.run_once(force=True).kind == "major"
    st.close()


def test_gc_thread_runs_forced_pass_and_reports(tmp_path: Path) -> None:
    st = open_storage(tmp_path)
    write_ledgers(st, [1, 2], 10)
    st.entry_logger.rotate()
    gc = GarbageCollectorThread(st, GcSettings(), lister=FakeLister([2]))
    gc.start()
    try:
        gc.trigger()
        assert gc.in_force_gc or gc.status().gcCounter >= 1
        import time

        deadline = time.monotonic() + 30
        while gc.in_force_gc:
            assert time.monotonic() < deadline, "forced GC did not finish"
            time.sleep(0.02)
        assert gc.status().gcCounter == 1 and gc.status().majorCompactionCounter == 1
        assert list(st.ledgers()) == [2]
    finally:
        gc.stop()
        st.close()


def test_settings_validation_follows_bookkeeper() -> None:
    with pytest.raises(ConfigError):
        GcSettings(minor_compaction_threshold=1.5)
    with pytest.raises(ConfigError):
        GcSettings(minor_compaction_threshold=0.9, major_compaction_threshold=0.5)
    with pytest.raises(ConfigError):
        GcSettings(gc_wait_time_ms=7200_000)  # minor interval (3600 s) shorter than gcWaitTime
    GcSettings(minor_compaction_interval_s=0, minor_compaction_threshold=0.9, major_compaction_threshold=0.5)


def test_rate_limiter_by_entries_and_bytes() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    rl = RateLimiter(100, clock=lambda: now[0], sleep=sleep)
    for _ in range(300):
        rl.acquire(1)
    # 100 permits of burst, then 200 more at 100/s: two seconds of waiting.
    assert abs(sum(slept) - 2.0) < 1e-6
    big = RateLimiter(1000, clock=lambda: now[0], sleep=sleep)
    slept.clear()
    big.acquire(5000)  # larger than a second's budget: let through, paid by waiting
    assert abs(sum(slept) - 4.0) < 1e-6


# ---------------------------------------------------------------------------------------------
# Entry log per ledger (requirement R1 of docs/correctness.md)


def test_entry_log_per_ledger_gc_reclaims_whole_files_without_compaction(tmp_path: Path) -> None:
    st = open_storage(tmp_path, entry_log_per_ledger=True)
    ledgers = list(range(1, 11))
    write_ledgers(st, ledgers, 20)
    # Each ledger has its own log: every log holds exactly one ledger.
    active = st.entry_logger.active_ledgers()
    assert sorted(active) == ledgers and len(set(active.values())) == 10
    for lid in ledgers[:5]:
        st.note_ledger_closed(lid)
    for lid in ledgers[5:]:
        st.note_ledger_closed(lid)
    st.flush()  # the checkpoint after the closed ledgers' entries are flushed seals their logs
    assert st.entry_logger.active_ledgers() == {}
    for log_id in st.entry_logger.log_ids():
        assert len(st.entry_logger.ledgers_map(log_id)) <= 1
    before = log_bytes(tmp_path)
    gc = GarbageCollectorThread(st, NO_COMPACTION, lister=FakeLister(ledgers[5:]))
    report = gc.run_once(force=True)
    assert sorted(report.deleted_ledgers) == ledgers[:5]
    assert len(report.deleted_logs) >= 5 and not report.compactions
    dead_bytes = sum(4 + len(entry(lid, e)) for lid in ledgers[:5] for e in range(20))
    assert before - log_bytes(tmp_path) >= dead_bytes
    _check_all(st, ledgers[5:], 20)
    st.close()


def test_entry_log_per_ledger_rotation_rules(tmp_path: Path) -> None:
    now = [1000.0]
    st = open_storage(tmp_path, entry_log_per_ledger=True, max_active_entry_logs=3, entry_log_map_expiry_s=60,
                      entry_log_clock=lambda: now[0])
    write_ledgers(st, [1, 2, 3], 2)
    assert sorted(st.entry_logger.active_ledgers()) == [1, 2, 3]
    write_ledgers(st, [4], 2)  # the cap: the least recently used mapping is sealed
    assert sorted(st.entry_logger.active_ledgers()) == [2, 3, 4]
    now[0] += 30
    write_ledgers(st, [2], 1, start=2)
    now[0] += 45  # 3 and 4 idle for 75 s, 2 for 45 s
    st.flush()
    assert sorted(st.entry_logger.active_ledgers()) == [2]
    # Closed, but with entries still unflushed: sealed only once they are flushed.
    st.note_ledger_closed(2)
    st.add_entry(entry(2, 3))
    st.flush()
    assert st.entry_logger.active_ledgers() == {}
    # Rotation at capacity: a ledger writing past logSizeLimit moves to a new log.
    rotations = st.entry_logger.rotations
    write_ledgers(st, [9], 400, start=0)
    assert st.entry_logger.rotations > rotations + 1
    # A full dir seals everything.
    st.rotate_entry_logs()
    assert st.entry_logger.active_ledgers() == {}
    _check_all(st, [1, 3, 4], 2)
    _check_all(st, [2], 4)
    _check_all(st, [9], 400)
    st.close()


def test_entry_log_per_ledger_flag_switched_between_restarts(tmp_path: Path) -> None:
    st = open_storage(tmp_path)
    write_ledgers(st, [1, 2, 3, 4], 10)
    st.close()
    st = open_storage(tmp_path, entry_log_per_ledger=True)
    write_ledgers(st, [1, 2, 3, 4], 10, start=10)
    _check_all(st, [1, 2, 3, 4], 20)
    report = GarbageCollectorThread(st, GcSettings(), lister=FakeLister([1, 2])).run_once(force=True)
    assert sorted(report.deleted_ledgers) == [3, 4]
    st.close()
    st = open_storage(tmp_path)  # and back to the shared log
    write_ledgers(st, [1, 2], 10, start=20)
    st.entry_logger.rotate()
    GarbageCollectorThread(st, GcSettings(), lister=FakeLister([1, 2])).run_once(force=True)
    _check_all(st, [1, 2], 30)
    st.close()


@pytest.mark.parametrize("allow", [False, True])
def test_force_allow_compaction_when_intervals_disable_it(tmp_path: Path, allow: bool) -> None:
    """BookKeeper's forceAllowCompaction: with both intervals 0 a forced GC compacts only if
    allowed (thresholds in (0, 1)); the scheduled runs stay off either way."""
    st = open_storage(tmp_path, log_size_limit=32 * 1024)
    write_ledgers(st, [1], 6)
    write_ledgers(st, [2], 54)
    st.entry_logger.rotate()
    settings = GcSettings(minor_compaction_interval_s=0, major_compaction_interval_s=0,
                          force_allow_compaction=allow)
    gc = GarbageCollectorThread(st, settings, lister=FakeLister([1]))
    assert gc.run_once().kind == ""  # not forced: nothing scheduled
    report = gc.run_once(force=True)
    assert report.kind == ("major" if allow else "")
    assert bool(report.compactions) == allow
    _check_all(st, [1], 6)
    st.close()


def test_trimmed_bytes_survive_a_restart(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The per-log trim counts are saved at the flush after a trim, so GC still sees those
    bytes as dead after a restart; an unreadable file is reported and ignored."""
    from vellum.storage.ledger_storage import TRIMMED_FILE

    st = open_storage(tmp_path)
    write_ledgers(st, [1, 2], ENTRIES)
    st.entry_logger.rotate()
    st.trim(1, 30)
    st.flush()
    before = st.trimmed_bytes()
    assert before
    st.close()
    st = open_storage(tmp_path)
    assert st.trimmed_bytes() == before
    # GC of a log drops it from the saved counts too
    gone = next(iter(before))
    st.forget_log(gone)
    st.flush()
    st.close()
    st = open_storage(tmp_path)
    assert gone not in st.trimmed_bytes()
    st.close()
    (tmp_path / "current" / TRIMMED_FILE).write_text("{not json")
    st = open_storage(tmp_path)
    assert st.trimmed_bytes() == {}
    assert "not a valid trimmed-bytes file" in caplog.text
    st.close()


def test_request_pass_answers_after_a_pass_that_started_later(tmp_path: Path) -> None:
    """A forced shrink's collection on one ledger dir: trim, seal the active log holding the
    ledger, ask the GC thread for a pass, and be answered once a pass that began after the
    request is done: the trimmed records are off the disk by then."""
    import threading

    from vellum.errors import VellumError
    from vellum.storage.gc import GcReport

    st = open_storage(tmp_path)
    write_ledgers(st, [1, 2], ENTRIES)
    gc = GarbageCollectorThread(st, GcSettings(), lister=FakeLister([1, 2]))
    with pytest.raises(VellumError, match="not running"):
        gc.request_pass(lambda r: None)  # nothing would ever answer
    gc.start()
    try:
        st.trim(1, ENTRIES - 5)
        assert st.seal_logs_holding(1) == 1  # the shared active log held ledger 1: sealed
        assert st.seal_logs_holding(3) == 0
        before = log_bytes(tmp_path)
        answers: list[GcReport] = []
        done = threading.Event()
        gc.request_pass(lambda r: (answers.append(r), done.set()))
        gc.request_pass(lambda r: answers.append(r))  # before that pass starts: shares it
        assert done.wait(60), "no pass answered the request"
        assert len(answers) == 2 and answers[0] is answers[1] and not answers[0].error
        report = answers[0]
        assert report.kind == "major" and report.reclaimed_bytes > 0
        assert before - log_bytes(tmp_path) >= report.reclaimed_bytes * 0.9
        assert gc.garbage_bytes() == 0  # the only dead bytes were the trimmed ones
        _check_all(st, [1], entries=5, start=ENTRIES - 5)
        _check_all(st, [2])
        with pytest.raises(NoSuchEntryError):
            st.get_entry(1, 0)
    finally:
        gc.stop()
    stopped: list[GcReport] = []
    gc2 = GarbageCollectorThread(st, GcSettings(), lister=FakeLister([1, 2]))
    gc2.start()
    with gc2._cond:  # a request still waiting when the thread stops is answered, with an error
        gc2._pass_waiters.append((10**9, stopped.append))
    gc2.stop()
    assert len(stopped) == 1 and "stopped" in stopped[0].error
    st.close()
