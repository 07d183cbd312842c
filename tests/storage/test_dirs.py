"""LedgerDirsManager: thresholds, hysteresis, warn state, listeners, dir choice, durable writes."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from vellum.errors import DiskFullError, StorageError
from vellum.storage.dirs import LedgerDirsListener, LedgerDirsManager, current_dir
from vellum.storage.durable import write_file_durably

A, B = Path("/disks/a"), Path("/disks/b")


class FakeDisks:
    """disk_usage replacement: usage fractions set by the test (total 1000 bytes)."""

    def __init__(self, **usage: float) -> None:
        self.usage = {Path(f"/disks/{k}"): v for k, v in usage.items()}
        self.broken: set[Path] = set()

    def __call__(self, path: Path) -> tuple[int, int]:
        if path in self.broken:
            raise OSError(5, "Input/output error")
        return 1000, round(self.usage[path] * 1000)


class Recorder(LedgerDirsListener):
    def __init__(self) -> None:
        self.events: list[tuple[str, Path | None]] = []

    def on_dir_full(self, dir: Path) -> None:
        self.events.append(("full", dir))

    def on_dir_writable(self, dir: Path) -> None:
        self.events.append(("writable", dir))

    def on_all_full(self) -> None:
        self.events.append(("all_full", None))

    def on_any_writable(self) -> None:
        self.events.append(("any_writable", None))


def manager(disks: FakeDisks, **kw: float) -> tuple[LedgerDirsManager, Recorder]:
    m = LedgerDirsManager([A, B], disk_usage=disks, **kw)
    rec = Recorder()
    m.add_listener(rec)
    return m, rec


def test_initial_state_is_measured() -> None:
    m, _ = manager(FakeDisks(a=0.5, b=0.97))
    assert m.writable_dirs() == [A]
    assert m.full_dirs() == [B]
    assert m.is_writable(A) and not m.is_writable(B)
    assert m.usage(B) == pytest.approx(0.97)
    assert not m.all_full()


def test_full_transition_and_all_full_then_back() -> None:
    disks = FakeDisks(a=0.5, b=0.5)
    m, rec = manager(disks)
    disks.usage[A] = 0.96
    m.check()
    assert rec.events == [("full", A)]
    assert m.writable_dirs() == [B]
    disks.usage[B] = 0.99
    m.check()
    assert rec.events[1:] == [("full", B), ("all_full", None)]
    assert m.all_full()
    m.check()  # no new transitions -> no repeated events
    assert len(rec.events) == 3
    disks.usage[B] = 0.5
    m.check()
    assert rec.events[3:] == [("writable", B), ("any_writable", None)]
    assert not m.all_full()


def test_lwm_hysteresis_keeps_a_full_dir_full_until_below_lwm() -> None:
    disks = FakeDisks(a=0.5, b=0.5)
    m, rec = manager(disks, usage_threshold=0.95, lwm_threshold=0.85, warn_threshold=0.80)
    disks.usage[A] = 0.96
    m.check()
    assert not m.is_writable(A)
    disks.usage[A] = 0.90  # below the threshold but above the low-water mark
    m.check()
    assert not m.is_writable(A)
    assert rec.events == [("full", A)]
    disks.usage[A] = 0.84
    m.check()
    assert m.is_writable(A)
    assert rec.events == [("full", A), ("writable", A)]


def test_warn_state() -> None:
    disks = FakeDisks(a=0.5, b=0.5)
    m, rec = manager(disks)
    assert not m.any_above_warn()
    disks.usage[B] = 0.92
    m.check()
    assert m.any_above_warn()
    assert m.is_writable(B)
    assert rec.events == []
    disks.usage[B] = 0.5
    m.check()
    assert not m.any_above_warn()


def test_pick_writable_dir_prefers_fewest_then_least_used() -> None:
    disks = FakeDisks(a=0.6, b=0.3)
    m, _ = manager(disks)
    assert m.pick_writable_dir() == B  # least used
    active = {A: 1, B: 4}
    assert m.pick_writable_dir(lambda d: active[d]) == A
    disks.usage[A] = 0.99
    m.check()
    assert m.pick_writable_dir(lambda d: active[d]) == B  # a full dir is never picked
    disks.usage[B] = 0.99
    m.check()
    with pytest.raises(DiskFullError) as exc:
        m.pick_writable_dir()
    assert str(A) in str(exc.value) and str(B) in str(exc.value)


def test_unmeasurable_dir_counts_as_full() -> None:
    disks = FakeDisks(a=0.1, b=0.1)
    m, rec = manager(disks)
    disks.broken.add(A)
    m.check()
    assert rec.events == [("full", A)]


def test_failing_listener_does_not_stop_others() -> None:
    disks = FakeDisks(a=0.1, b=0.1)
    m = LedgerDirsManager([A, B], disk_usage=disks)

    class Boom(LedgerDirsListener):
        def on_dir_full(self, dir: Path) -> None:
            raise RuntimeError("boom")

    rec = Recorder()
    m.add_listener(Boom())
    m.add_listener(rec)
    disks.usage[A] = 0.99
    m.check()
    assert rec.events == [("full", A)]


def test_unknown_dir_and_bad_thresholds_are_rejected() -> None:
    m, _ = manager(FakeDisks(a=0.1, b=0.1))
    with pytest.raises(ValueError, match="not a ledger dir"):
        m.is_writable(Path("/elsewhere"))
    with pytest.raises(ValueError, match="lwm"):
        LedgerDirsManager([A], lwm_threshold=0.99, disk_usage=FakeDisks(a=0.1))
    with pytest.raises(ValueError, match="warn"):
        LedgerDirsManager([A], warn_threshold=0.99, disk_usage=FakeDisks(a=0.1))


def test_background_checker_notices_a_full_dir() -> None:
    disks = FakeDisks(a=0.1, b=0.1)
    m = LedgerDirsManager([A, B], disk_usage=disks)
    went_full = threading.Event()

    class L(LedgerDirsListener):
        def on_all_full(self) -> None:
            went_full.set()

    m.add_listener(L())
    disks.usage[A] = disks.usage[B] = 0.99
    m.start(interval_ms=10)
    try:
        assert went_full.wait(timeout=20)
    finally:
        m.stop()
    assert m.all_full()


def test_real_disk_usage_of_tmp(tmp_path: Path) -> None:
    m = LedgerDirsManager([tmp_path])
    assert 0.0 <= m.usage(tmp_path) <= 1.0


def test_write_file_durably_replaces_atomically(tmp_path: Path) -> None:
    target = tmp_path / "f"
    write_file_durably(target, b"one")
    write_file_durably(target, b"two")
    assert target.read_bytes() == b"two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]
    with pytest.raises(StorageError, match="missing"):
        write_file_durably(tmp_path / "missing" / "f", b"x")
    assert current_dir(tmp_path) == tmp_path / "current"
