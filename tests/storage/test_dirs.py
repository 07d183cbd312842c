"""LedgerDirsManager: thresholds, hysteresis, warn state, listeners, dir choice, durable writes."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from vellum.errors import DiskFullError, StorageError
from vellum.storage import dirs as dirs_module
from vellum.storage.dirs import DiskSpace, LedgerDirsListener, LedgerDirsManager, current_dir, disk_space
from vellum.storage.durable import write_file_durably
from vellum.testing.loop_fs import LoopFsUnavailable, ext4_loop_mount

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


def _statvfs(blocks: int, bfree: int, bavail: int, frsize: int = 4096) -> os.statvfs_result:
    # (bsize, frsize, blocks, bfree, bavail, files, ffree, favail, flag, namemax)
    return os.statvfs_result((frsize, frsize, blocks, bfree, bavail, 1000, 900, 900, 0, 255))


def test_usage_counts_the_blocks_reserved_for_root_as_taken() -> None:
    # ext4 with 5 % reserved: 1000 blocks, 50 reserved for root. The bookie (not root) can use
    # 950; it has used 922 of them (97 %): 78 blocks are free, 28 of them usable.
    st = _statvfs(blocks=1000, bfree=78, bavail=28)
    space = DiskSpace.from_statvfs(st)
    assert (space.total, space.usable, space.used) == (1000 * 4096, 28 * 4096, 922 * 4096)
    assert space.usage == pytest.approx(0.972)  # 1 - usable/total, as BookKeeper measures it
    # nothing usable left = usage 1.0, whatever root could still write in the reserve
    assert DiskSpace.from_statvfs(_statvfs(blocks=1000, bfree=50, bavail=0)).usage == 1.0
    assert DiskSpace.from_statvfs(_statvfs(blocks=0, bfree=0, bavail=0)).usage == 1.0


def test_the_disk_checker_measures_with_statvfs_what_the_bookie_can_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The default measure of ``LedgerDirsManager`` reads ``statvfs``: at 97 % of what the bookie
    can write (92.2 % of the blocks, the rest being free or reserved) the dir is full."""
    figures = {A: _statvfs(blocks=1000, bfree=78, bavail=28), B: _statvfs(blocks=1000, bfree=500, bavail=450)}
    real_statvfs = os.statvfs

    def statvfs(path: str | Path) -> os.statvfs_result:
        return figures[Path(path)] if Path(path) in figures else real_statvfs(path)

    monkeypatch.setattr(dirs_module.os, "statvfs", statvfs)
    m = LedgerDirsManager([A, B])
    assert m.usage(A) == pytest.approx(0.972)
    assert m.usage(B) == pytest.approx(0.55)
    assert m.full_dirs() == [A] and m.writable_dirs() == [B]
    assert disk_space(A).usable == 28 * 4096


@pytest.fixture
def ext4_reserved_5(tmp_path: Path) -> Iterator[Path]:
    """A real ext4 filesystem with 5 % of its blocks reserved for root (mkfs.ext4 -m 5),
    mounted through a loop device; skipped only where this machine cannot mount one."""
    try:
        with ext4_loop_mount(tmp_path / "ext4", size_mb=64, reserved_percent=5) as mount:
            yield mount
    except LoopFsUnavailable as e:
        pytest.skip(f"no loop-mounted ext4 here: {e}")


def _fill(directory: Path, name: str, nbytes: int) -> None:
    fd = os.open(directory / name, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.posix_fallocate(fd, 0, nbytes)
        os.fsync(fd)
    finally:
        os.close(fd)


def test_a_real_ext4_disk_with_reserved_blocks_is_full_before_the_bookie_gets_enospc(
    ext4_reserved_5: Path,
) -> None:
    mount = ext4_reserved_5
    st = os.statvfs(mount)
    assert st.f_bfree > st.f_bavail, "mkfs.ext4 -m 5 reserved no blocks"
    # Fill (as root) until the bookie could use only 3 % of the filesystem any more.
    _fill(mount, "filler-1", (st.f_bavail - st.f_blocks * 3 // 100) * st.f_frsize)
    st = os.statvfs(mount)
    m = LedgerDirsManager([mount])
    assert m.usage(mount) == pytest.approx(1 - st.f_bavail / st.f_blocks)
    assert m.usage(mount) > 0.95, m.usage(mount)
    assert (st.f_blocks - st.f_bfree) / st.f_blocks < 0.95, "used/total would still call this writable"
    assert m.full_dirs() == [mount]
    # Take the rest of what a user may write: the bookie's next write fails with ENOSPC, and the
    # disk checker says 1.0, not the share of blocks in files.
    for i in range(10):
        st = os.statvfs(mount)
        if st.f_bavail == 0:
            break
        _fill(mount, f"filler-rest-{i}", st.f_bavail * st.f_frsize)
    assert os.statvfs(mount).f_bavail == 0
    m.check()
    assert m.usage(mount) == 1.0
    user_dir = mount / "bookie"
    user_dir.mkdir()
    os.chmod(user_dir, 0o777)
    # a user other than root (nobody) writes 1 MiB the way an entry log is written, then fsyncs
    # (cwd: entered before the switch to that user, who may not traverse pytest's 0700 tmp dirs)
    as_user = subprocess.run(["dd", "if=/dev/zero", "of=entry.log", "bs=1M", "count=1", "conv=fsync"],
                             cwd=user_dir, user=65534, env={**os.environ, "LC_ALL": "C"},
                             capture_output=True, text=True, timeout=60, check=False)
    assert as_user.returncode != 0 and "No space left on device" in as_user.stderr, as_user


def test_write_file_durably_replaces_atomically(tmp_path: Path) -> None:
    target = tmp_path / "f"
    write_file_durably(target, b"one")
    write_file_durably(target, b"two")
    assert target.read_bytes() == b"two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]
    with pytest.raises(StorageError, match="missing"):
        write_file_durably(tmp_path / "missing" / "f", b"x")
    assert current_dir(tmp_path) == tmp_path / "current"
