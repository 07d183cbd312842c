"""A real ext4 filesystem in a file, for tests of disk faults (a full disk, a stalled disk).

Responsibility: make an ext4 image with ``mkfs.ext4`` (Debian's ``e2fsprogs``), with the share
of blocks reserved for root that the test asks for (``-m``, ext4's default is 5 %), mount it
through a loop device (``mount -o loop``) on a private directory, and take it away again.
``frozen(mount)`` freezes the filesystem (``fsfreeze``): every write and fsync to it blocks
until it is thawed, as on a disk that stopped answering; ``shut_down(mount)`` makes every
later write and fsync to it fail with EIO, as on a disk that died.

Invariants:
- mounting needs root; ``missing_reason()`` says why a machine cannot do it (tests skip then);
- what is set up is taken down on exit, in reverse order, even when the test failed: a frozen
  filesystem is thawed first, then unmounted (lazily if a file is still open: the loop device
  goes away once the last file is closed), then the image file is removed;
- every external command is bounded by a timeout.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

_TIMEOUT_S = 60.0
_SBIN = "/usr/sbin:/sbin"


class LoopFsUnavailable(RuntimeError):
    """This machine cannot make or mount a loop filesystem (the message says why)."""


def _tool(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path=_SBIN)


def missing_reason() -> str | None:
    """Why an ext4 loop filesystem cannot be mounted here, or None if it probably can."""
    if os.geteuid() != 0:
        return "mounting a loop filesystem needs root"
    for tool, package in (("mkfs.ext4", "e2fsprogs"), ("mount", "mount"), ("umount", "mount"),
                          ("fsfreeze", "util-linux")):
        if _tool(tool) is None:
            return f"{tool} not found (install Debian's {package})"
    return None


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    tool = _tool(argv[0]) or argv[0]
    return subprocess.run([tool, *argv[1:]], capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)


def _must(*argv: str) -> None:
    done = _run(*argv)
    if done.returncode != 0:
        raise LoopFsUnavailable(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")


@contextlib.contextmanager
def ext4_loop_mount(workdir: Path, *, size_mb: int = 32, reserved_percent: int = 5) -> Iterator[Path]:
    """A fresh ext4 filesystem of ``size_mb`` MiB (4 KiB blocks, ``reserved_percent`` % of
    them reserved for root) mounted on ``workdir/mnt``; yields the mount point. Raises
    ``LoopFsUnavailable`` when it cannot be made or mounted."""
    reason = missing_reason()
    if reason is not None:
        raise LoopFsUnavailable(reason)
    workdir.mkdir(parents=True, exist_ok=True)
    image, mount = workdir / "ext4.img", workdir / "mnt"
    mount.mkdir(exist_ok=True)
    with open(image, "wb") as f:
        f.truncate(size_mb * 1024 * 1024)
    try:
        _must("mkfs.ext4", "-q", "-F", "-b", "4096", "-m", str(reserved_percent), "-E", "nodiscard", str(image))
        _must("mount", "-o", "loop", str(image), str(mount))
        try:
            yield mount
        finally:
            _run("fsfreeze", "-u", str(mount))  # in case a test left it frozen; fails harmlessly if not
            if _run("umount", str(mount)).returncode != 0:
                _run("umount", "-l", str(mount))  # a file is still open: detach when it closes
    finally:
        image.unlink(missing_ok=True)


@contextlib.contextmanager
def frozen(mount: Path) -> Iterator[None]:
    """Freeze the filesystem mounted on ``mount`` (writes and fsyncs to it block), thaw on exit."""
    _must("fsfreeze", "-f", str(mount))
    try:
        yield
    finally:
        _must("fsfreeze", "-u", str(mount))


#: ``EXT4_IOC_SHUTDOWN`` (``_IOR('X', 125, __u32)``) and its ``EXT4_GOING_FLAGS_NOLOGFLUSH``
_EXT4_IOC_SHUTDOWN = 0x8004587D
_EXT4_GOING_FLAGS_NOLOGFLUSH = 2


def shut_down(mount: Path) -> None:
    """The disk under ``mount`` fails for good: ext4's shutdown ioctl (what ``xfs_io -c
    shutdown`` does), after which every write, fsync and open on it answers EIO, as a dead disk
    does. Unmounting still works."""
    fd = os.open(mount, os.O_RDONLY)
    try:
        fcntl.ioctl(fd, _EXT4_IOC_SHUTDOWN, struct.pack("I", _EXT4_GOING_FLAGS_NOLOGFLUSH))
    finally:
        os.close(fd)
