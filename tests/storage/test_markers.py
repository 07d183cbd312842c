"""Markers: DIRTY (unclean shutdown), BOOKIE_STATUS, and the dir lock across processes."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from vellum.errors import CorruptionError, StorageError
from vellum.storage.dirs import current_dir
from vellum.storage.markers import (
    READ_ONLY,
    READ_WRITE,
    BookieStatus,
    acquire_dir_lock,
    acquire_dir_locks,
    is_dirty,
    mark_clean,
    mark_dirty,
    read_bookie_status,
    write_bookie_status,
)


def test_clean_then_unclean_shutdown_is_detected(tmp_path: Path) -> None:
    dirs = [tmp_path / "l0", tmp_path / "l1"]
    for d in dirs:
        d.mkdir()
    assert mark_dirty(dirs) is False  # first start
    assert all(is_dirty(d) for d in dirs)
    mark_clean(dirs)
    assert not any(is_dirty(d) for d in dirs)
    assert mark_dirty(dirs) is False  # previous shutdown was clean
    # crash: DIRTY stays behind
    assert mark_dirty(dirs) is True
    mark_clean(dirs)
    mark_clean(dirs)  # idempotent


def test_one_dirty_dir_is_enough(tmp_path: Path) -> None:
    dirs = [tmp_path / "l0", tmp_path / "l1"]
    for d in dirs:
        d.mkdir()
    mark_dirty(dirs[1:])
    assert mark_dirty(dirs) is True
    assert all(is_dirty(d) for d in dirs)


def test_bookie_status_format_and_newest_wins(tmp_path: Path) -> None:
    dirs = [tmp_path / "l0", tmp_path / "l1"]
    for d in dirs:
        d.mkdir()
    assert read_bookie_status(dirs) is None
    write_bookie_status(dirs, BookieStatus(READ_ONLY, 1700000000000, manual=True))
    assert (current_dir(dirs[0]) / "BOOKIE_STATUS").read_text() == "1,READ_ONLY,1700000000000,true\n"
    write_bookie_status(dirs[1:], BookieStatus(READ_WRITE, 1700000000500))
    status = read_bookie_status(dirs)
    assert status == BookieStatus(READ_WRITE, 1700000000500, manual=False)
    assert status is not None and not status.read_only
    # a corrupt copy is skipped
    (current_dir(dirs[1]) / "BOOKIE_STATUS").write_text("garbage")
    assert read_bookie_status(dirs) == BookieStatus(READ_ONLY, 1700000000000, manual=True)


def test_bookie_status_decode_errors() -> None:
    assert BookieStatus.decode(b"1,READ_WRITE,5\n") == BookieStatus(READ_WRITE, 5)
    with pytest.raises(CorruptionError, match="unknown bookie mode"):
        BookieStatus.decode(b"1,SLEEPING,5,false\n")
    with pytest.raises(CorruptionError, match="layout version 2"):
        BookieStatus.decode(b"2,READ_ONLY,5,false\n")


_HOLDER = """
import sys, time
from vellum.storage.markers import acquire_dir_lock
lock = acquire_dir_lock(sys.argv[1])
print("locked", flush=True)
sys.stdin.readline()
lock.release()
"""


@contextmanager
def lock_held_by_other_process(d: Path) -> Iterator[subprocess.Popen[str]]:
    """A child process holding the dir lock until the block ends."""
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(d)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdin is not None and holder.stdout is not None
    try:
        assert holder.stdout.readline().strip() == "locked"
        yield holder
    finally:
        try:
            holder.stdin.write("\n")
            holder.stdin.close()
        except OSError:  # already dead (killed by the test)
            pass
        holder.wait(timeout=30)
        holder.stdout.close()


def test_lock_conflict_between_processes(tmp_path: Path) -> None:
    d = tmp_path / "ledgers"
    d.mkdir()
    with lock_held_by_other_process(d) as holder:
        with pytest.raises(StorageError) as exc:
            acquire_dir_lock(d)
        assert str(d) in str(exc.value)
        assert f"process {holder.pid}" in str(exc.value)
    # the holder is gone: the lock is free again
    with acquire_dir_lock(d) as lock:
        assert lock.held
    assert not lock.held


def test_lock_of_a_killed_holder_is_released(tmp_path: Path) -> None:
    d = tmp_path / "ledgers"
    d.mkdir()
    with lock_held_by_other_process(d) as holder:
        holder.kill()
        holder.wait(timeout=30)
        acquire_dir_lock(d).release()  # the kernel dropped the dead holder's lock


def test_acquire_dir_locks_releases_on_failure(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    with lock_held_by_other_process(b):
        with pytest.raises(StorageError, match=str(b)):
            acquire_dir_locks([a, b])
        acquire_dir_lock(a).release()  # a was released after the failure
    locks = acquire_dir_locks([a, b, a])
    assert len(locks) == 2
    for lock in locks:
        lock.release()
