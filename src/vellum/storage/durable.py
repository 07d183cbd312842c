"""Durable files: the one place that knows how a file or a name survives a crash.

Rule 7 of docs/correctness.md (``lastMark`` only moves forward) and rule 8 of
docs/correctness.md (compaction writes and fsyncs its new log and the directory before the index
points to it) rest on these sequences, so they are written once, here, and every storage module
goes through them:

- ``replace_file(path, data)``: write ``<name>.tmp``, fsync it, rename it over ``path``, fsync
  the directory, in that order. A crash or a failure at any step before the rename leaves the
  old ``path`` untouched (and no ``.tmp`` behind when the failure is reported); once the rename
  is done ``path`` holds the whole new content, and it survives a crash once the directory
  fsync returned. Never a torn file.
- ``publish(tmp, path)``: the last two steps for a file the caller wrote and fsynced itself
  (a new journal: header and first preallocation written through its own descriptor).
- ``remove_file(path)``: unlink, then fsync the directory, so a deleted entry log or marker
  does not come back after a crash.
- ``fsync_dir(path)``: the directory fsync itself (``O_DIRECTORY``: a path that is not a
  directory is an error, not a silent fsync of a file).

Every system call goes through a ``FileOps``; tests substitute one that records the order of
operations or fails a chosen step. The entry logger writes its data through the same
``FileOps`` (its tests inject ENOSPC, EIO and short writes there).

Errors: the ``*_file`` and ``publish`` functions raise ``OSError`` and leave the mapping to the
caller (the entry logger turns ENOSPC into ``DiskFullError``); ``write_file_durably`` is
``replace_file`` raising ``StorageError`` naming the file, for small metadata files (cookie,
``lastMark``, ``DIRTY``, bookie status, trimmed-bytes counts).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from vellum.errors import StorageError

TMP_SUFFIX = ".tmp"


class FileOps:
    """The system calls storage writes files through; tests subclass it to record or fail them."""

    def open(self, path: Path, flags: int, mode: int = 0o644) -> int:
        return os.open(path, flags, mode)

    def write(self, fd: int, data: bytes | memoryview) -> int:
        return os.write(fd, data)

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        return os.pwrite(fd, data, offset)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def ftruncate(self, fd: int, length: int) -> None:
        os.ftruncate(fd, length)

    def close(self, fd: int) -> None:
        os.close(fd)

    def rename(self, src: Path, dst: Path) -> None:
        os.replace(src, dst)

    def link(self, src: Path, dst: Path) -> None:
        os.link(src, dst)

    def unlink(self, path: Path) -> None:
        os.unlink(path)

    def fsync_dir(self, path: Path) -> None:
        fsync_dir(path)


#: the real system calls
OS_FILE_OPS = FileOps()


def fsync_dir(path: Path) -> None:
    """fsync a directory so a create, rename or unlink inside it survives a crash."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_path(path: Path) -> Path:
    """``<name>.tmp`` next to ``path``: where a replacement is written before the rename."""
    return path.with_name(path.name + TMP_SUFFIX)


def write_all(fd: int, data: bytes | bytearray | memoryview, ops: FileOps = OS_FILE_OPS) -> None:
    """Write every byte of ``data`` (short writes continue; a write of 0 bytes is EIO)."""
    view = memoryview(data)
    while view:
        n = ops.write(fd, view)
        if n <= 0:
            raise OSError(errno.EIO, "write returned 0")
        view = view[n:]


def replace_file(path: Path, data: bytes, *, ops: FileOps = OS_FILE_OPS, sync_dir: bool = True) -> None:
    """Replace ``path`` with ``data``: write tmp -> fsync tmp -> rename -> fsync dir.

    ``sync_dir=False`` leaves the directory fsync to a caller that fsyncs the same directory
    right after for another change as well (an entry-log allocation: the new log and
    ``lastId`` in one directory fsync). Raises ``OSError``; a failure before the rename
    removes the temporary file and leaves ``path`` as it was.
    """
    tmp = temp_path(path)
    renamed = False
    try:
        fd = ops.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            write_all(fd, data, ops)
            ops.fsync(fd)
        finally:
            ops.close(fd)
        ops.rename(tmp, path)
        renamed = True
        if sync_dir:
            ops.fsync_dir(path.parent)
    except OSError:
        if not renamed:
            try:
                ops.unlink(tmp)
            except OSError:
                pass
        raise


def publish(tmp: Path, path: Path, *, ops: FileOps = OS_FILE_OPS) -> None:
    """Give a written and fsynced ``tmp`` its final name durably: rename -> fsync dir."""
    ops.rename(tmp, path)
    ops.fsync_dir(path.parent)


def remove_file(path: Path, *, ops: FileOps = OS_FILE_OPS) -> bool:
    """Unlink ``path`` if it exists, then fsync its directory, also when it was already gone:
    an earlier unlink (before a crash, or by a caller that failed at the fsync) may not be
    durable yet. Returns whether this call removed it."""
    try:
        ops.unlink(path)
        removed = True
    except FileNotFoundError:
        removed = False
    ops.fsync_dir(path.parent)
    return removed


def write_file_durably(path: Path, data: bytes, *, ops: FileOps = OS_FILE_OPS) -> None:
    """``replace_file`` for small metadata files: a crash leaves the old or the new content,
    never a torn file. Raises ``StorageError`` naming the file."""
    try:
        replace_file(path, data, ops=ops)
    except OSError as e:
        raise StorageError(f"cannot write {path}: {e.strerror or e}") from e
