"""Durable files (storage/durable.py): the order of operations, and what a failure or a crash at
each step leaves behind."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from file_ops_recorder import Crash, RecordingOps

from vellum.errors import StorageError
from vellum.storage.durable import (
    FileOps,
    fsync_dir,
    publish,
    remove_file,
    replace_file,
    temp_path,
    write_all,
    write_file_durably,
)

#: the steps of replace_file, in the only order that is crash-safe
REPLACE_STEPS = [
    ("open", "f.tmp"),
    ("write", "f.tmp"),
    ("fsync", "f.tmp"),
    ("close", "f.tmp"),
    ("rename", "f.tmp", "f"),
    ("fsync_dir", "d"),
]


@pytest.fixture
def target(tmp_path: Path) -> Path:
    d = tmp_path / "d"
    d.mkdir()
    path = d / "f"
    path.write_bytes(b"old content")
    return path


def test_replace_file_writes_tmp_fsyncs_renames_then_fsyncs_the_dir(target: Path) -> None:
    ops = RecordingOps()
    replace_file(target, b"new content", ops=ops)
    assert ops.calls == REPLACE_STEPS
    assert target.read_bytes() == b"new content"
    assert sorted(p.name for p in target.parent.iterdir()) == ["f"]


def test_replace_file_without_dir_fsync_leaves_it_to_the_caller(target: Path) -> None:
    ops = RecordingOps()
    replace_file(target, b"new", ops=ops, sync_dir=False)
    assert ops.calls == REPLACE_STEPS[:-1]
    assert target.read_bytes() == b"new"


@pytest.mark.parametrize("step", REPLACE_STEPS, ids=lambda s: s[0])
def test_a_failure_at_each_step_is_raised_and_never_tears_the_file(target: Path, step: tuple[str, ...]) -> None:
    ops = RecordingOps(fail_at=(step[0], step[1]))
    with pytest.raises(OSError, match="injected failure"):
        replace_file(target, b"new content", ops=ops)
    failed = ops.calls.index(step)
    assert ops.calls[:failed] == REPLACE_STEPS[:failed]  # in order up to the failure
    assert set(ops.calls[failed + 1 :]) <= {("close", "f.tmp"), ("unlink", "f.tmp")}  # then cleanup only
    if step[0] == "fsync_dir":
        # The rename is atomic and done: the whole new content, and an error that tells the
        # caller it may not survive a crash.
        assert target.read_bytes() == b"new content"
    else:
        assert target.read_bytes() == b"old content"
    assert not temp_path(target).exists()  # a reported failure leaves no temporary behind


@pytest.mark.parametrize("crash_index", range(len(REPLACE_STEPS)))
def test_a_crash_at_each_step_leaves_the_old_or_the_new_content(target: Path, crash_index: int) -> None:
    step = REPLACE_STEPS[crash_index]
    ops = RecordingOps(fail_at=(step[0], step[1]), crash=True)
    with pytest.raises(Crash):
        replace_file(target, b"new content", ops=ops)
    renamed = crash_index > REPLACE_STEPS.index(("rename", "f.tmp", "f"))
    assert target.read_bytes() == (b"new content" if renamed else b"old content")
    # The next replacement after the "restart" works over whatever temporary was left.
    replace_file(target, b"after restart")
    assert target.read_bytes() == b"after restart"
    assert sorted(p.name for p in target.parent.iterdir()) == ["f"]


def test_write_file_durably_names_the_file_in_its_error(target: Path) -> None:
    with pytest.raises(StorageError, match=str(target)):
        write_file_durably(target, b"x", ops=RecordingOps(fail_at=("fsync", "f.tmp")))
    assert target.read_bytes() == b"old content"


def test_publish_renames_then_fsyncs_the_dir(target: Path) -> None:
    tmp = temp_path(target)
    tmp.write_bytes(b"written by the caller")
    ops = RecordingOps()
    publish(tmp, target, ops=ops)
    assert ops.calls == [("rename", "f.tmp", "f"), ("fsync_dir", "d")]
    assert target.read_bytes() == b"written by the caller"


def test_remove_file_unlinks_then_fsyncs_the_dir_even_if_already_gone(target: Path) -> None:
    ops = RecordingOps()
    assert remove_file(target, ops=ops) is True
    assert ops.calls == [("unlink", "f"), ("fsync_dir", "d")]
    ops = RecordingOps()
    assert remove_file(target, ops=ops) is False  # an earlier unlink may not be durable yet
    assert ops.calls == [("unlink", "f"), ("fsync_dir", "d")]


def test_fsync_dir_refuses_a_file(target: Path) -> None:
    fsync_dir(target.parent)
    with pytest.raises(NotADirectoryError):
        fsync_dir(target)


def test_write_all_continues_short_writes_and_fails_on_zero(tmp_path: Path) -> None:
    class ShortOps(FileOps):
        def __init__(self, zero_after: int) -> None:
            self.sizes: list[int] = []
            self.zero_after = zero_after

        def write(self, fd: int, data: bytes | memoryview) -> int:
            if len(self.sizes) == self.zero_after:
                return 0
            n = super().write(fd, bytes(data[:3]))
            self.sizes.append(n)
            return n

    path = tmp_path / "w"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        ops = ShortOps(zero_after=100)
        write_all(fd, b"0123456789", ops)
        assert ops.sizes == [3, 3, 3, 1]
        with pytest.raises(OSError) as e:
            write_all(fd, b"abc", ShortOps(zero_after=0))
        assert e.value.errno == errno.EIO
    finally:
        os.close(fd)
    assert path.read_bytes() == b"0123456789"
