"""Marker files in ledger dirs: the unclean-shutdown marker, the bookie status file, and the
lock that keeps two processes off the same directories.

- ``<ledgerDir>/current/DIRTY``: created (durably) when the bookie starts, removed on clean
  shutdown. Found at start -> the previous run did not shut down cleanly (crash, kill -9), so
  the bookie knows the index may lag the entry logs and journal replay matters.
- ``<ledgerDir>/current/BOOKIE_STATUS`` (``persistBookieStatusEnabled``): one line
  ``<layoutVersion>,<READ_ONLY|READ_WRITE>,<lastUpdateTimeMillis>,<manual true|false>\\n``,
  layout version 1, written to every ledger dir; on read the newest valid copy wins.
- ``<ledgerDir>/current/INTEGRITY_CHECK_NEEDED``: written (durably, in every ledger dir)
  before the cookies of a bookie that lost data are stamped over (``dataIntegrityChecking``),
  removed once every ledger it may have held is marked limbo (``bookie/integrity.py``). Found at
  start -> the marking was interrupted and must run again before the bookie serves.
- ``<dir>/current/.lock``: an exclusive ``fcntl.flock`` held for the life of the bookie (or of
  an offline tool such as ``rebuild-index``); the holder's PID is written into the file so the
  error for a second process names it. The kernel drops the lock when the holder dies, so a
  stale file never blocks a restart.
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from vellum.errors import CorruptionError, StorageError
from vellum.storage.dirs import current_dir
from vellum.storage.durable import fsync_dir, remove_file, write_file_durably

log = logging.getLogger(__name__)

DIRTY_FILENAME = "DIRTY"
INTEGRITY_CHECK_FILENAME = "INTEGRITY_CHECK_NEEDED"
BOOKIE_STATUS_FILENAME = "BOOKIE_STATUS"
LOCK_FILENAME = ".lock"
BOOKIE_STATUS_LAYOUT_VERSION = 1
READ_ONLY = "READ_ONLY"
READ_WRITE = "READ_WRITE"


def _ensure_current(dir: Path | str) -> Path:
    cur = current_dir(dir)
    try:
        cur.mkdir(exist_ok=True)
    except OSError as e:
        raise StorageError(f"cannot create {cur}: {e.strerror or e}") from e
    return cur


# -- unclean shutdown ---------------------------------------------------------------------


def mark_dirty(dirs: Sequence[Path | str]) -> bool:
    """Create ``current/DIRTY`` in every ledger dir; True if any already had one (the previous
    shutdown was unclean)."""
    unclean = False
    for d in dirs:
        cur = _ensure_current(d)
        path = cur / DIRTY_FILENAME
        if path.exists():
            log.warning("%s exists: the previous shutdown of this bookie was unclean", path)
            unclean = True
            continue
        write_file_durably(path, b"")
    return unclean


def mark_clean(dirs: Sequence[Path | str]) -> None:
    """Remove ``current/DIRTY`` from every ledger dir (last step of a clean shutdown)."""
    _remove_from_each(dirs, DIRTY_FILENAME)


def is_dirty(dir: Path | str) -> bool:
    return (current_dir(dir) / DIRTY_FILENAME).exists()


# -- lost data: the limbo marking is pending ----------------------------------------------


def mark_integrity_check_needed(dirs: Sequence[Path | str], reason: str) -> None:
    """Write ``current/INTEGRITY_CHECK_NEEDED`` (the reason, one line) durably in every ledger
    dir: the bookie may have lost data, and its ledgers must be marked limbo before it serves."""
    for d in dirs:
        cur = current_dir(d)
        try:
            if not cur.is_dir():  # a wiped dir may be gone (as in write_cookie)
                cur.mkdir(parents=True, exist_ok=True)
                fsync_dir(cur.parent)
        except OSError as e:
            raise StorageError(f"cannot create {cur}: {e.strerror or e}") from e
        write_file_durably(cur / INTEGRITY_CHECK_FILENAME, reason.encode("utf-8") + b"\n")


def integrity_check_needed(dirs: Sequence[Path | str]) -> str | None:
    """The reason written by ``mark_integrity_check_needed`` if any ledger dir holds the marker."""
    for d in dirs:
        path = current_dir(d) / INTEGRITY_CHECK_FILENAME
        try:
            return path.read_bytes().decode("utf-8", "replace").strip() or "unknown"
        except FileNotFoundError:
            continue
        except OSError as e:
            raise StorageError(f"cannot read {path}: {e.strerror or e}") from e
    return None


def clear_integrity_check_needed(dirs: Sequence[Path | str]) -> None:
    """Remove the marker from every ledger dir (the limbo marking is durable)."""
    _remove_from_each(dirs, INTEGRITY_CHECK_FILENAME)


def _remove_from_each(dirs: Sequence[Path | str], name: str) -> None:
    """Remove ``current/<name>`` durably from every dir (gone already is fine)."""
    for d in dirs:
        path = current_dir(d) / name
        try:
            remove_file(path)
        except OSError as e:
            raise StorageError(f"cannot remove {path}: {e.strerror or e}") from e


# -- bookie status ------------------------------------------------------------------------


@dataclass(frozen=True)
class BookieStatus:
    """Persisted bookie mode (BookKeeper's ``BookieStatus``)."""

    mode: str  # READ_ONLY or READ_WRITE
    last_update_ms: int
    manual: bool = False  # turned read-only by an operator (not by full disks)
    layout_version: int = BOOKIE_STATUS_LAYOUT_VERSION

    def __post_init__(self) -> None:
        if self.mode not in (READ_ONLY, READ_WRITE):
            raise ValueError(f"bookie mode {self.mode!r} is not {READ_ONLY} or {READ_WRITE}")

    @property
    def read_only(self) -> bool:
        return self.mode == READ_ONLY

    def encode(self) -> bytes:
        manual = "true" if self.manual else "false"
        return f"{self.layout_version},{self.mode},{self.last_update_ms},{manual}\n".encode("ascii")

    @classmethod
    def decode(cls, data: bytes, *, where: str = BOOKIE_STATUS_FILENAME) -> BookieStatus:
        try:
            text = data.decode("ascii").strip()
        except UnicodeDecodeError:
            raise CorruptionError(f"{where}: bookie status is not ASCII text") from None
        parts = text.split(",")
        if len(parts) not in (3, 4):
            raise CorruptionError(f"{where}: expected 'version,mode,timestamp[,manual]', found {text[:60]!r}")
        try:
            version = int(parts[0])
            ts = int(parts[2])
        except ValueError:
            raise CorruptionError(f"{where}: bad version or timestamp in {text[:60]!r}") from None
        if version != BOOKIE_STATUS_LAYOUT_VERSION:
            raise CorruptionError(f"{where}: unknown bookie status layout version {version}")
        if parts[1] not in (READ_ONLY, READ_WRITE):
            raise CorruptionError(f"{where}: unknown bookie mode {parts[1]!r}")
        manual = len(parts) == 4 and parts[3].strip().lower() == "true"
        return cls(parts[1], ts, manual, version)


def write_bookie_status(dirs: Sequence[Path | str], status: BookieStatus) -> None:
    """Write ``current/BOOKIE_STATUS`` durably in every ledger dir."""
    for d in dirs:
        write_file_durably(_ensure_current(d) / BOOKIE_STATUS_FILENAME, status.encode())


def read_bookie_status(dirs: Sequence[Path | str]) -> BookieStatus | None:
    """The newest valid status over all ledger dirs (None if none has one). Corrupt copies are
    logged and skipped: the status is advisory, the bookie falls back to its configuration."""
    best: BookieStatus | None = None
    for d in dirs:
        path = current_dir(d) / BOOKIE_STATUS_FILENAME
        try:
            status = BookieStatus.decode(path.read_bytes(), where=str(path))
        except FileNotFoundError:
            continue
        except (OSError, CorruptionError) as e:
            log.warning("ignoring unreadable bookie status %s: %s", path, e)
            continue
        if best is None or status.last_update_ms > best.last_update_ms:
            best = status
    return best


# -- directory lock -----------------------------------------------------------------------


class DirLock:
    """An exclusive flock on ``<dir>/current/.lock``; release() or use as a context manager."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            # Closing the descriptor drops the flock. The file stays: removing it would race
            # with a process that just opened it and is about to lock it.
            os.close(fd)

    def __enter__(self) -> DirLock:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


def acquire_dir_lock(dir: Path | str) -> DirLock:
    """Lock ``dir`` for this process (non-blocking). StorageError naming the dir and the holder's
    PID if another process holds it."""
    cur = _ensure_current(dir)
    path = cur / LOCK_FILENAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise StorageError(f"cannot open lock file {path}: {e.strerror or e}") from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_pid(fd)
        os.close(fd)
        who = f"process {holder}" if holder else "another process"
        raise StorageError(
            f"{dir} is in use by {who} (lock {path}): another bookie or an offline tool "
            "(e.g. rebuild-index) is running on this directory; stop it first"
        ) from None
    except OSError as e:
        os.close(fd)
        raise StorageError(f"cannot lock {path}: {e.strerror or e}") from e
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
    except OSError as e:
        os.close(fd)
        raise StorageError(f"cannot write lock file {path}: {e.strerror or e}") from e
    return DirLock(path, fd)


def acquire_dir_locks(dirs: Sequence[Path | str]) -> list[DirLock]:
    """Lock every dir (deduplicated); on failure release those already taken and re-raise."""
    locks: list[DirLock] = []
    seen: set[Path] = set()
    try:
        for d in dirs:
            key = Path(d).resolve()
            if key in seen:
                continue
            seen.add(key)
            locks.append(acquire_dir_lock(d))
    except BaseException:
        for lock in locks:
            lock.release()
        raise
    return locks


def _read_pid(fd: int) -> int | None:
    try:
        raw = os.pread(fd, 32, 0)
        return int(raw.decode("ascii").strip())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
