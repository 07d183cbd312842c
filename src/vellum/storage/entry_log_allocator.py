"""Allocation of the entry-log files of one ledger directory: ids, ``lastId``, preallocation.

Files live in ``<ledger_dir>/current/``: ``<hex id>.log`` (BookKeeper's name: lowercase hex, no
padding) and ``lastId`` (hex id of the last allocated log + newline).

Invariants:
- Log ids only grow: allocation starts after ``max(lastId, largest existing log id)`` and skips
  ids whose file exists. A torn ``lastId`` is ignored (the existing logs bound the next id).
- A new log is created with ``O_EXCL``, its header written and fsynced, ``lastId`` replaced
  (``durable.replace_file``) and the directory fsynced (one fsync for both names), all before
  the log is handed out. ``lastId`` never moves backwards, even when the preallocation thread
  and compaction allocate out of order.
- Preallocation: one log is created ahead on a thread of its own. Its id is reserved by the
  caller (under the entry logger's lock); the thread only creates the file, and it is joined
  before the next allocation, so two ``lastId`` writes never race over the same id.
- Compaction outputs reserve an id (``reserve``) until finished or aborted (``release``). The
  preallocated and the reserved ids are ``busy``: GC and compaction never touch them.
- Direct I/O (``direct``): the header is still written and fsynced through a buffered
  descriptor; the log is then reopened with ``O_DIRECT`` and its first block written again through
  it (the probe) before it is handed out with ``ActiveLog.direct`` set. A filesystem that refuses
  (``EINVAL``) gets a warning naming the directory and buffered logs from then on.

Threads: every method except ``close`` is called under the entry logger's lock; ``lastId``
writes (the preallocation thread and compaction) are serialised by a lock of their own.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from vellum.errors import DiskFullError, StorageError
from vellum.format import entrylog as fmt
from vellum.ids import MAX_LOG_ID
from vellum.storage import direct_io as dio
from vellum.storage.direct_io import AlignedAppender
from vellum.storage.durable import FileOps, replace_file

log = logging.getLogger(__name__)

LOG_SUFFIX = ".log"
COMPACTING_SUFFIX = ".log.compacting"
COMPACTED_SUFFIX = ".compacted"
LAST_ID_FILE = "lastId"


def log_file_name(log_id: int) -> str:
    """BookKeeper's name: lowercase hex, no padding."""
    return f"{log_id:x}{LOG_SUFFIX}"


def parse_log_file_name(name: str) -> int | None:
    """The id of a ``<hex id>.log`` name exactly as ``log_file_name`` writes it, else None."""
    if not name.endswith(LOG_SUFFIX):
        return None
    stem = name[: -len(LOG_SUFFIX)]
    try:
        value = int(stem, 16)
    except ValueError:
        return None
    return value if 0 <= value <= MAX_LOG_ID and stem == f"{value:x}" else None


def list_log_ids(current_dir: Path) -> list[int]:
    """Ids of the ``.log`` files in ``current_dir``, ascending (compaction temporaries excluded)."""
    try:
        names = os.listdir(current_dir)
    except OSError as e:
        raise StorageError(f"{current_dir}: cannot list: {e.strerror}") from None
    return sorted(i for i in (parse_log_file_name(n) for n in names) if i is not None)


def io_error(e: OSError, what: str) -> StorageError:
    """The storage error for a failed entry-log system call: ENOSPC/EDQUOT is ``DiskFullError``."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFullError(f"{what}: no space left on device")
    return StorageError(f"{what}: {e.strerror or e}")


@dataclass
class ActiveLog:
    """An unsealed log being appended to (its fields belong to the entry logger's writer)."""

    log_id: int
    path: Path
    fd: int
    pos: int = fmt.HEADER_SIZE  # logical end, buffered records included
    file_pos: int = fmt.HEADER_SIZE  # bytes handed to the file
    synced_pos: int = fmt.HEADER_SIZE
    buf: bytearray = field(default_factory=bytearray)
    sizes: dict[int, int] = field(default_factory=dict)  # per ledger, records written to the file
    buf_sizes: dict[int, int] = field(default_factory=dict)  # per ledger, records still buffered
    direct: bool = False  # ``fd`` was opened with O_DIRECT: writes go through ``appender``
    appender: AlignedAppender | None = None  # the aligned tail buffer (direct logs, made on first write)

    @property
    def on_file(self) -> int:
        """Bytes of the log that a read of the file sees (a direct log's unwritten tail is not)."""
        if self.appender is not None:
            return self.appender.written_end
        return self.file_pos


class EntryLogAllocator:
    """Hands out new entry logs of one directory (see the module docstring)."""

    def __init__(
        self, current_dir: Path, *, ops: FileOps, preallocate: bool, thread_name: str, direct: bool = False
    ) -> None:
        self.current_dir = current_dir
        self._ops = ops
        self.direct = direct and bool(dio.O_DIRECT)
        if direct and not self.direct:
            log.warning("entry logs in %s: O_DIRECT is not available on this platform; writing buffered",
                        current_dir)
        self._preallocate = preallocate
        self._thread_name = thread_name
        self._reserved: set[int] = set()  # ids of compaction outputs still being written
        self._prealloc_id: int | None = None  # id reserved by the preallocation thread
        self._preallocated: ActiveLog | None = None
        self._prealloc_thread: threading.Thread | None = None
        self._prealloc_error: BaseException | None = None
        self._last_id = max([self._read_last_id(), *list_log_ids(current_dir)], default=-1)
        self._last_id_lock = threading.Lock()
        self._written_last_id = -1

    @property
    def last_id(self) -> int:
        """The largest id allocated, preallocated or reserved so far (-1: none)."""
        return self._last_id

    def busy_ids(self) -> set[int]:
        """Ids whose file is being written outside the active logs: preallocated or reserved."""
        busy = set(self._reserved)
        if self._prealloc_id is not None:
            busy.add(self._prealloc_id)
        return busy

    @property
    def preallocated_id(self) -> int | None:
        """The id of the log the preallocation thread creates (or created), if any."""
        return self._prealloc_id

    def reserved_ids(self) -> set[int]:
        """Ids of compaction outputs still being written."""
        return set(self._reserved)

    # ------------------------------------------------------------------ lastId

    def _read_last_id(self) -> int:
        path = self.current_dir / LAST_ID_FILE
        try:
            text = path.read_text(encoding="ascii").strip()
        except FileNotFoundError:
            return -1
        except OSError as e:
            raise StorageError(f"{path}: cannot read: {e.strerror}") from None
        try:
            return int(text, 16)
        except ValueError:
            # A torn lastId must not stop the bookie: the existing logs bound the next id anyway.
            return -1

    def _write_last_id(self, log_id: int) -> None:
        """Replace ``lastId``; the caller fsyncs the directory (allocation: together with the
        new log's name; compaction: when its output is finished)."""
        # The preallocation thread and compaction both allocate: serialise the writes (one
        # temp file name) and never let lastId move backwards.
        with self._last_id_lock:
            if log_id <= self._written_last_id:
                return
            path = self.current_dir / LAST_ID_FILE
            try:
                replace_file(path, f"{log_id:x}\n".encode("ascii"), ops=self._ops, sync_dir=False)
            except OSError as e:
                raise io_error(e, f"{path}") from None
            self._written_last_id = log_id

    def _next_log_id(self) -> int:
        candidate = self._last_id
        for _ in range(MAX_LOG_ID + 1):
            candidate = 0 if candidate >= MAX_LOG_ID else candidate + 1
            if not (self.current_dir / log_file_name(candidate)).exists():
                self._last_id = candidate
                return candidate
        raise StorageError(f"{self.current_dir}: no free entry log id")

    # ------------------------------------------------------------------ new logs

    def _create_log(self, log_id: int) -> ActiveLog:
        """Create, stamp and fsync a new log and record it in ``lastId`` before anyone uses it."""
        ops = self._ops
        path = self.current_dir / log_file_name(log_id)
        try:
            fd = ops.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        except OSError as e:
            raise io_error(e, f"{path}: cannot create entry log") from None
        try:
            header = fmt.encode_header()
            n = ops.write(fd, header)
            if n != len(header):
                raise OSError(errno.EIO, f"short header write ({n} of {len(header)} bytes)")
            ops.fsync(fd)
        except OSError as e:
            ops.close(fd)
            try:
                ops.unlink(path)
            except OSError:
                pass
            raise io_error(e, f"{path} offset 0") from None
        try:
            self._write_last_id(log_id)
            try:
                ops.fsync_dir(self.current_dir)  # the new log's name and lastId in one fsync
            except OSError as e:
                raise io_error(e, f"{self.current_dir}: fsync") from None
        except BaseException:
            ops.close(fd)
            raise
        if self.direct:
            return self._reopen_direct(log_id, path, fd)
        return ActiveLog(log_id, path, fd)

    def _reopen_direct(self, log_id: int, path: Path, fd: int) -> ActiveLog:
        """The new log ``path`` (header durable through ``fd``) reopened with ``O_DIRECT`` and
        probed; the buffered ``fd`` back (and buffered logs from then on) if refused."""
        ops = self._ops
        try:
            dfd = dio.open_probed(path, os.O_WRONLY, fmt.encode_header(), dio.ENTRY_LOG_ALIGNMENT,
                                  opener=ops.open, close=ops.close)
        except dio.Refused as r:
            return self._refused(log_id, path, fd, r.why, r.what)
        except OSError as e:
            ops.close(fd)
            raise io_error(e, f"{path}: reopening with O_DIRECT and rewriting its first block") from None
        try:
            ops.ftruncate(dfd, fmt.HEADER_SIZE)  # the probe wrote a whole block: back to the header
        except OSError as e:
            ops.close(dfd)
            ops.close(fd)
            raise io_error(e, f"{path} offset 0") from None
        ops.close(fd)
        return ActiveLog(log_id, path, dfd, direct=True)

    def _refused(self, log_id: int, path: Path, fd: int, why: str, what: str) -> ActiveLog:
        if self.direct:
            log.warning(
                "entry logs in %s: the filesystem refused direct I/O at %s (%s); writing entry logs "
                "buffered from now on (dbStorage_directIOEntryLogger=false avoids the attempt)",
                self.current_dir, what, why,
            )
        self.direct = False
        return ActiveLog(log_id, path, fd)

    def allocate(self) -> ActiveLog:
        """The next log: the preallocated one if ready, else a fresh one; then preallocate again."""
        log: ActiveLog | None = None
        if self._prealloc_thread is not None:
            self._prealloc_thread.join()
            self._prealloc_thread = None
            log, self._preallocated = self._preallocated, None
            self._prealloc_error = None  # a failed preallocation is retried synchronously below
            self._prealloc_id = None
        if log is None:
            log = self._create_log(self._next_log_id())
        if self._preallocate:
            self._start_preallocation()
        return log

    def _start_preallocation(self) -> None:
        # The id is reserved here, under the logger's lock; the thread only creates the file.
        # It is always joined before the next allocation, so lastId writes never race.
        log_id = self._next_log_id()
        self._prealloc_id = log_id

        def run() -> None:
            try:
                self._preallocated = self._create_log(log_id)
            except BaseException as e:  # the next allocation then creates a log synchronously
                self._prealloc_error = e

        self._prealloc_thread = threading.Thread(target=run, name=self._thread_name, daemon=True)
        self._prealloc_thread.start()

    def reserve(self) -> int:
        """A new id for a compaction output, recorded in ``lastId`` (the output's ``finish``
        fsyncs the directory); busy until ``release``."""
        log_id = self._next_log_id()
        self._reserved.add(log_id)
        try:
            self._write_last_id(log_id)
        except BaseException:
            self._reserved.discard(log_id)
            raise
        return log_id

    def release(self, log_id: int) -> None:
        """A compaction output was finished or aborted."""
        self._reserved.discard(log_id)

    def close(self) -> None:
        """Wait for the preallocation thread; remove an unused preallocated log (it holds no
        entry, and the next logger starts a new log anyway). No allocation may follow."""
        thread = self._prealloc_thread
        if thread is not None:
            thread.join()
        spare, self._preallocated = self._preallocated, None
        if spare is not None:
            self._ops.close(spare.fd)
            try:
                self._ops.unlink(spare.path)
            except OSError:
                pass
