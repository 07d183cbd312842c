"""Checkpointer: order of the sequence, fail-stop, monotonic marks, lastMark naming, reading
marks back (max over dirs, corrupt files)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from vellum.errors import CorruptionError, StorageError
from vellum.format.lastmark import ZERO_MARK, LogMark
from vellum.storage.checkpoint import Checkpointer, last_mark_path, read_last_marks
from vellum.storage.dirs import LedgerDirsManager, current_dir


class FakeJournal:
    def __init__(self, name: str, events: list[str], mark: LogMark) -> None:
        self.name, self.events, self.mark = name, events, mark
        self.gc_calls: list[LogMark] = []
        self.dirs_to_check: list[Path] = []
        self.fail_gc = False

    def current_mark(self) -> LogMark:
        self.events.append(f"mark:{self.name}")
        return self.mark

    def gc_journals(self, mark: LogMark) -> list[Path]:
        # The mark must already be on disk when journals are deleted.
        on_disk = [LogMark.decode(p.read_bytes()) for p in self.dirs_to_check]
        self.events.append(f"gc:{self.name}:{on_disk == [mark] * len(on_disk)}")
        if self.fail_gc:
            raise OSError(5, "Input/output error")
        self.gc_calls.append(mark)
        return []


class FakeStorage:
    def __init__(self, name: str, events: list[str], dirs: list[Path]) -> None:
        self.name, self.events, self.dirs = name, events, dirs
        self.fail = False

    def flush(self) -> None:
        present = any(p.exists() for d in self.dirs for p in current_dir(d).glob("lastMark*"))
        self.events.append(f"flush:{self.name}:mark_on_disk={present}")
        if self.fail:
            raise OSError(28, "No space left on device")


class Usage:
    def __init__(self) -> None:
        self.full: set[Path] = set()

    def __call__(self, p: Path) -> tuple[int, int]:
        return 100, 99 if p in self.full else 10


@pytest.fixture
def ledger_dirs(tmp_path: Path) -> list[Path]:
    out = [tmp_path / "l0", tmp_path / "l1"]
    for d in out:
        current_dir(d).mkdir(parents=True)
    return out


def build(
    ledger_dirs: list[Path], n_journals: int = 1, usage: Usage | None = None
) -> tuple[Checkpointer, list[FakeJournal], list[FakeStorage], list[str]]:
    events: list[str] = []
    journals = [FakeJournal(f"j{i}", events, LogMark(5 + i, 100)) for i in range(n_journals)]
    for i, j in enumerate(journals):
        j.dirs_to_check = [last_mark_path(d, i, n_journals) for d in ledger_dirs]
    storages = [FakeStorage(f"s{i}", events, ledger_dirs) for i in range(2)]
    dm = LedgerDirsManager(ledger_dirs, disk_usage=usage or Usage())
    return Checkpointer(journals, storages, dm), journals, storages, events


def test_sequence_order(ledger_dirs: list[Path]) -> None:
    cp, journals, _, events = build(ledger_dirs)
    assert cp.checkpoint_now() == [LogMark(5, 100)]
    assert events == [
        "mark:j0",
        "flush:s0:mark_on_disk=False",
        "flush:s1:mark_on_disk=False",
        "gc:j0:True",
    ]
    for d in ledger_dirs:
        assert LogMark.decode((current_dir(d) / "lastMark").read_bytes()) == LogMark(5, 100)
        assert not (current_dir(d) / "lastMark.tmp").exists()
    assert journals[0].gc_calls == [LogMark(5, 100)]
    assert cp.checkpoint_count == 1


def test_failing_flush_writes_no_mark_and_deletes_nothing(ledger_dirs: list[Path]) -> None:
    cp, journals, storages, _ = build(ledger_dirs)
    storages[1].fail = True
    with pytest.raises(StorageError, match="flush failed"):
        cp.checkpoint_now()
    assert [p for d in ledger_dirs for p in current_dir(d).glob("lastMark*")] == []
    assert journals[0].gc_calls == []
    # fail-stop: later checkpoints refuse even if the storage recovers
    storages[1].fail = False
    with pytest.raises(StorageError, match="earlier failure"):
        cp.checkpoint_now()
    assert cp.failure is not None


def test_failing_mark_write_deletes_no_journal(ledger_dirs: list[Path]) -> None:
    cp, journals, _, _ = build(ledger_dirs)
    # make the second dir's current/ unusable: lastMark cannot be written there
    current_dir(ledger_dirs[1]).rmdir()
    current_dir(ledger_dirs[1]).write_bytes(b"")
    with pytest.raises(StorageError, match=str(ledger_dirs[1])):
        cp.checkpoint_now()
    assert journals[0].gc_calls == []


def test_mark_never_moves_backwards(ledger_dirs: list[Path]) -> None:
    cp, journals, _, events = build(ledger_dirs)
    journals[0].mark = LogMark(7, 0)
    cp.checkpoint_now()
    journals[0].mark = LogMark(6, 999)
    events.clear()
    with pytest.raises(StorageError, match="never moves backwards"):
        cp.checkpoint_now()
    assert [e for e in events if e.startswith("flush")] == []
    for d in ledger_dirs:
        assert LogMark.decode((current_dir(d) / "lastMark").read_bytes()) == LogMark(7, 0)


def test_initial_marks_guard_against_regression_across_restarts(ledger_dirs: list[Path]) -> None:
    events: list[str] = []
    j = FakeJournal("j0", events, LogMark(1, 0))
    cp = Checkpointer([j], [], LedgerDirsManager(ledger_dirs, disk_usage=Usage()), initial_marks=[LogMark(2, 0)])
    with pytest.raises(StorageError, match="below the persisted mark"):
        cp.checkpoint_now()


def test_multi_journal_naming_and_read_back(ledger_dirs: list[Path]) -> None:
    cp, _, _, events = build(ledger_dirs, n_journals=3)
    marks = cp.checkpoint_now()
    assert marks == [LogMark(5, 100), LogMark(6, 100), LogMark(7, 100)]
    for d in ledger_dirs:
        assert sorted(p.name for p in current_dir(d).iterdir()) == ["lastMark.0", "lastMark.1", "lastMark.2"]
    assert events[:3] == ["mark:j0", "mark:j1", "mark:j2"]
    assert events[-3:] == ["gc:j0:True", "gc:j1:True", "gc:j2:True"]
    assert read_last_marks(ledger_dirs, 3) == marks


def test_mark_goes_only_to_writable_dirs(ledger_dirs: list[Path]) -> None:
    usage = Usage()
    usage.full.add(ledger_dirs[1])
    cp, journals, _, _ = build(ledger_dirs, usage=usage)
    journals[0].dirs_to_check = [last_mark_path(ledger_dirs[0], 0, 1)]
    cp.checkpoint_now()
    assert (current_dir(ledger_dirs[0]) / "lastMark").exists()
    assert not (current_dir(ledger_dirs[1]) / "lastMark").exists()


def test_all_dirs_full_still_persists_the_mark(ledger_dirs: list[Path]) -> None:
    usage = Usage()
    usage.full.update(ledger_dirs)
    cp, _, _, _ = build(ledger_dirs, usage=usage)
    cp.checkpoint_now()
    assert all((current_dir(d) / "lastMark").exists() for d in ledger_dirs)


def test_gc_failure_is_raised_but_not_latched(ledger_dirs: list[Path]) -> None:
    cp, journals, _, _ = build(ledger_dirs)
    journals[0].fail_gc = True
    with pytest.raises(StorageError, match="journal GC"):
        cp.checkpoint_now()
    assert read_last_marks(ledger_dirs, 1) == [LogMark(5, 100)]
    journals[0].fail_gc = False
    cp.checkpoint_now()
    assert cp.failure is None


def test_read_last_marks_takes_the_max_over_dirs(ledger_dirs: list[Path]) -> None:
    assert read_last_marks(ledger_dirs, 1) == [ZERO_MARK]
    (current_dir(ledger_dirs[0]) / "lastMark").write_bytes(LogMark(3, 500).encode())
    (current_dir(ledger_dirs[1]) / "lastMark").write_bytes(LogMark(4, 10).encode())
    assert read_last_marks(ledger_dirs, 1) == [LogMark(4, 10)]


def test_read_last_marks_skips_a_corrupt_copy(ledger_dirs: list[Path], caplog: pytest.LogCaptureFixture) -> None:
    (current_dir(ledger_dirs[0]) / "lastMark").write_bytes(LogMark(3, 500).encode())
    (current_dir(ledger_dirs[1]) / "lastMark").write_bytes(b"\x00" * 7)
    assert read_last_marks(ledger_dirs, 1) == [LogMark(3, 500)]
    assert str(current_dir(ledger_dirs[1]) / "lastMark") in caplog.text


def test_read_last_marks_all_corrupt_names_the_files(ledger_dirs: list[Path]) -> None:
    for d in ledger_dirs:
        (current_dir(d) / "lastMark").write_bytes(b"garbage")
    with pytest.raises(CorruptionError) as exc:
        read_last_marks(ledger_dirs, 1)
    for d in ledger_dirs:
        assert str(current_dir(d) / "lastMark") in str(exc.value)


def test_concurrent_checkpoints_are_serialised(ledger_dirs: list[Path]) -> None:
    overlap: list[bool] = []
    active = [0]
    lock = threading.Lock()

    class SlowStorage:
        def flush(self) -> None:
            with lock:
                active[0] += 1
                overlap.append(active[0] > 1)
            time.sleep(0.005)  # widen the window so overlapping flushes would be seen
            with lock:
                active[0] -= 1

    events: list[str] = []
    j = FakeJournal("j0", events, LogMark(1, 1))
    cp = Checkpointer([j], [SlowStorage()], LedgerDirsManager(ledger_dirs, disk_usage=Usage()))
    threads = [threading.Thread(target=cp.checkpoint_now) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlap == [False] * 8
    assert cp.checkpoint_count == 8


def test_sync_thread_runs_checkpoints(ledger_dirs: list[Path]) -> None:
    cp, journals, _, _ = build(ledger_dirs)
    done = threading.Event()
    original = journals[0].gc_journals

    def gc(mark: LogMark) -> list[Path]:
        out = original(mark)
        done.set()
        return out

    journals[0].gc_journals = gc  # type: ignore[method-assign]
    cp.start(interval_ms=10)
    try:
        assert done.wait(timeout=20)
    finally:
        cp.stop(final_checkpoint=True)
    assert cp.checkpoint_count >= 2
    assert read_last_marks(ledger_dirs, 1) == [LogMark(5, 100)]
