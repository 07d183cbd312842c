"""Entry logs of one ledger directory: allocation, appends, rotation, random and sequential reads.

Files live in ``<ledger_dir>/current/``: ``<hex id>.log`` in BookKeeper's entry-log format
(``vellum.format.entrylog``) and ``lastId`` (hex id of the last allocated log + newline).

Invariants:
- Log ids only grow: a new logger starts after ``max(lastId, largest existing log id)``;
  ``lastId`` is written and fsynced (with the directory) at every allocation, before the log
  is used. A sealed (rotated) log is never reopened for writing.
- Rotation seals a log: buffered records are written, the ledgers map is appended, the header's
  map fields are rewritten in place, and the file is fsynced, in that order.
- A location handed out by ``add_entry`` is durable only after the next ``flush()`` returns.
  A failed write truncates the log back to its last fully written record (nothing half-written
  stays counted); a failed fsync abandons the log (fail-stop for that file: its unsynced tail is
  never trusted) and later adds go to a new log. Either way the error is raised to the caller of
  the add/flush that hit it and ``failure_count`` grows: a caller compares it before and after
  its round (adds + flush) and indexes nothing if it changed, so locations whose bytes were lost
  are never indexed, even if another caller's add hit the failure.
- "Which log is active for this ledger" is decided in exactly one place,
  ``_active_log_for(ledger_id)``: one shared active log, or one per ledger in the
  entry-log-per-ledger mode (seed 000, ``entryLogPerLedgerEnabled``).
- Entry log per ledger: a ledger without an active log gets a freshly allocated one; at most
  ``max_active_logs`` (``maximumNumberOfActiveEntryLogs``) are open, the least recently used is
  sealed to make room; ``rotate_idle`` seals logs idle for ``access_expiry_s``
  (``entrylogMapAccessExpiryTimeInSeconds``); ``rotate_ledger`` seals one ledger's log (the
  advisory "ledger closed"); ``rotate`` seals all of them (checkpoint flushes all, dir full
  seals all). Sealing writes the ledgers map, so a sealed log is immediately usable by GC. The
  file format is the same in both modes, so the flag can change between restarts: a restart
  always starts new logs, and logs written in either mode are read, scanned and collected alike.
- GC / compaction touch only *flushed* logs (``flushed_log_ids``): existing ``.log`` files that
  are neither active, nor reserved by preallocation, nor being written by compaction. In the
  shared mode that is exactly "id < leastUnflushedLogId"; in the per-ledger mode it is
  BookKeeper's later rule (``getFlushedLogIds``), since one long-lived ledger would otherwise
  pin every newer log (BookKeeper issue #2728).
- Compaction output (``CompactionLog``) is written as ``<hex new>.log.compacting``, sealed and
  fsynced, renamed to ``<hex new>.log.<hex old>.compacted`` and hard-linked as
  ``<hex new>.log`` (dir fsynced) before any index entry points to it; the ``.compacted`` name
  is the durable marker of an unfinished compaction (see ``storage/compaction.py``).

Threads: add/flush/rotation run under ``_lock`` (the storage's flush thread, compaction);
reads use ``os.pread`` on reference-counted read-only descriptors and run concurrently.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from vellum.errors import CorruptionError, DiskFullError, StorageError
from vellum.format import entrylog as fmt
from vellum.ids import MAX_LOG_ID, location_log_id, location_offset, make_location

LOG_SUFFIX = ".log"
COMPACTING_SUFFIX = ".log.compacting"
COMPACTED_SUFFIX = ".compacted"
LAST_ID_FILE = "lastId"
WRITE_BUFFER_SIZE = 65536  # BookKeeper's writeBufferSizeBytes


def log_file_name(log_id: int) -> str:
    """BookKeeper's name: lowercase hex, no padding."""
    return f"{log_id:x}{LOG_SUFFIX}"


def parse_log_file_name(name: str) -> int | None:
    if not name.endswith(LOG_SUFFIX):
        return None
    stem = name[: -len(LOG_SUFFIX)]
    try:
        value = int(stem, 16)
    except ValueError:
        return None
    return value if 0 <= value <= MAX_LOG_ID and stem == f"{value:x}" else None


#: largest single pread of ``read_run`` (longer runs take several)
_RUN_CHUNK_MAX = 16 << 20


class FileOps:
    """The system calls the entry logger writes through; tests inject failures by subclassing."""

    def write(self, fd: int, data: bytes | memoryview) -> int:
        return os.write(fd, data)

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        return os.pwrite(fd, data, offset)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def ftruncate(self, fd: int, length: int) -> None:
        os.ftruncate(fd, length)


def _io_error(e: OSError, what: str) -> StorageError:
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFullError(f"{what}: no space left on device")
    return StorageError(f"{what}: {e.strerror or e}")


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class _ActiveLog:
    """An unsealed log being appended to."""

    log_id: int
    path: Path
    fd: int
    pos: int = fmt.HEADER_SIZE  # logical end, buffered records included
    file_pos: int = fmt.HEADER_SIZE  # bytes handed to the file
    synced_pos: int = fmt.HEADER_SIZE
    buf: bytearray = field(default_factory=bytearray)
    sizes: dict[int, int] = field(default_factory=dict)  # per ledger, records written to the file
    buf_sizes: dict[int, int] = field(default_factory=dict)  # per ledger, records still buffered


@dataclass
class _Reader:
    fd: int
    users: int = 0
    closing: bool = False


@dataclass(frozen=True)
class LogInfo:
    log_id: int
    size: int
    ledgers: dict[int, int]
    from_map: bool
    active: bool


class EntryLogger:
    """The entry logs of one ledger directory (see the module docstring for the invariants)."""

    def __init__(
        self,
        ledger_dir: Path,
        *,
        log_size_limit: int,
        preallocate: bool = True,
        flush_entrylog_bytes: int = 0,
        write_buffer_size: int = WRITE_BUFFER_SIZE,
        file_ops: FileOps | None = None,
        entry_log_per_ledger: bool = False,
        max_active_logs: int = 500,
        access_expiry_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_active_logs < 1:
            raise ValueError(f"max_active_logs {max_active_logs} must be at least 1")
        if log_size_limit <= fmt.HEADER_SIZE:
            raise ValueError(f"log_size_limit {log_size_limit} must exceed the {fmt.HEADER_SIZE}-byte header")
        if log_size_limit >= 1 << 32:
            raise ValueError(f"log_size_limit {log_size_limit} does not fit a 32-bit location offset")
        self.ledger_dir = Path(ledger_dir)
        self.current_dir = self.ledger_dir / "current"
        self.current_dir.mkdir(parents=True, exist_ok=True)
        self.log_size_limit = log_size_limit
        self.flush_entrylog_bytes = flush_entrylog_bytes
        self.write_buffer_size = write_buffer_size
        self._ops = file_ops or FileOps()
        self._preallocate = preallocate
        self._lock = threading.RLock()
        self._readers_lock = threading.Lock()
        self._readers: dict[int, _Reader] = {}
        self._current: _ActiveLog | None = None
        self.entry_log_per_ledger = entry_log_per_ledger
        self.max_active_logs = max_active_logs
        self.access_expiry_s = access_expiry_s
        self._clock = clock
        # Entry log per ledger: ledger -> its active log, least recently used first.
        self._per_ledger: OrderedDict[int, _ActiveLog] = OrderedDict()
        self._last_access: dict[int, float] = {}
        self._reserved_ids: set[int] = set()  # ids of compaction outputs still being written
        self._prealloc_id: int | None = None  # id reserved by the preallocation thread
        self.rotations = 0  # logs sealed (observability and tests)
        self._pool: ThreadPoolExecutor | None = None  # concurrent fsyncs of many active logs
        self._preallocated: _ActiveLog | None = None
        self._prealloc_thread: threading.Thread | None = None
        self._prealloc_error: BaseException | None = None
        self.failure_count = 0
        self._closed = False
        existing = self.log_ids()
        self._last_id = max([self._read_last_id(), *existing], default=-1)
        self._last_id_lock = threading.Lock()
        self._written_last_id = -1

    # ------------------------------------------------------------------ allocation

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
        # The preallocation thread and compaction both allocate: serialise the writes (one
        # temp file name) and never let lastId move backwards.
        with self._last_id_lock:
            if log_id <= self._written_last_id:
                return
            self._write_last_id_locked(log_id)
            self._written_last_id = log_id

    def _write_last_id_locked(self, log_id: int) -> None:
        path = self.current_dir / LAST_ID_FILE
        tmp = path.with_name(LAST_ID_FILE + ".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                self._ops.write(fd, f"{log_id:x}\n".encode("ascii"))
                self._ops.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except OSError as e:
            raise _io_error(e, f"{path}") from None

    def _next_log_id(self) -> int:
        candidate = self._last_id
        for _ in range(MAX_LOG_ID + 1):
            candidate = 0 if candidate >= MAX_LOG_ID else candidate + 1
            if not (self.current_dir / log_file_name(candidate)).exists():
                return candidate
        raise StorageError(f"{self.current_dir}: no free entry log id")

    def _create_log(self, log_id: int) -> _ActiveLog:
        """Create, stamp and fsync a new log and record it in ``lastId`` before anyone uses it."""
        path = self.current_dir / log_file_name(log_id)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError as e:
            raise _io_error(e, f"{path}: cannot create entry log") from None
        try:
            header = fmt.encode_header()
            n = self._ops.write(fd, header)
            if n != len(header):
                raise OSError(errno.EIO, f"short header write ({n} of {len(header)} bytes)")
            self._ops.fsync(fd)
        except OSError as e:
            os.close(fd)
            try:
                path.unlink()
            except OSError:
                pass
            raise _io_error(e, f"{path} offset 0") from None
        self._write_last_id(log_id)
        try:
            fsync_dir(self.current_dir)
        except OSError as e:
            os.close(fd)
            raise _io_error(e, f"{self.current_dir}: fsync") from None
        return _ActiveLog(log_id, path, fd)

    def _allocate(self) -> _ActiveLog:
        """The next log: the preallocated one if ready, else a fresh one; then preallocate again."""
        log: _ActiveLog | None = None
        if self._prealloc_thread is not None:
            self._prealloc_thread.join()
            self._prealloc_thread = None
            log, self._preallocated = self._preallocated, None
            self._prealloc_error = None  # a failed preallocation is retried synchronously below
            self._prealloc_id = None
        if log is None:
            log_id = self._next_log_id()
            self._last_id = log_id
            log = self._create_log(log_id)
        if self._preallocate:
            self._start_preallocation()
        return log

    def _start_preallocation(self) -> None:
        # The id is reserved here, under _lock; the thread only creates the file. It is always
        # joined before the next allocation, so lastId writes never race.
        log_id = self._next_log_id()
        self._last_id = log_id
        self._prealloc_id = log_id

        def run() -> None:
            try:
                self._preallocated = self._create_log(log_id)
            except BaseException as e:  # the next allocation then creates a log synchronously
                self._prealloc_error = e

        self._prealloc_thread = threading.Thread(
            target=run, name=f"entrylog-prealloc-{self.ledger_dir}", daemon=True
        )
        self._prealloc_thread.start()

    def _active_log_for(self, ledger_id: int) -> _ActiveLog:
        """THE decision "which log receives this ledger's next entry".

        Shared mode: the one active log. Entry log per ledger (seed 000): the ledger's own log,
        allocated on first use; when ``max_active_logs`` are open the least recently used one is
        sealed first. Caller holds ``_lock``.
        """
        if not self.entry_log_per_ledger:
            if self._current is None:
                self._current = self._allocate()
            return self._current
        log = self._per_ledger.get(ledger_id)
        if log is None:
            while len(self._per_ledger) >= self.max_active_logs:
                _lid, victim = next(iter(self._per_ledger.items()))
                self._seal(victim)  # drops its mapping through _forget_active
            log = self._allocate()
            self._per_ledger[ledger_id] = log
        else:
            self._per_ledger.move_to_end(ledger_id)
        self._last_access[ledger_id] = self._clock()
        return log

    def _active_logs(self) -> list[_ActiveLog]:
        if not self.entry_log_per_ledger:
            return [self._current] if self._current is not None else []
        return list(self._per_ledger.values())

    def _forget_active(self, log: _ActiveLog) -> None:
        if self._current is log:
            self._current = None
        for lid in [lid for lid, active in self._per_ledger.items() if active is log]:
            del self._per_ledger[lid]
            self._last_access.pop(lid, None)

    # ------------------------------------------------------------------ writes

    def add_entry(self, ledger_id: int, entry: bytes) -> int:
        """Append ``entry`` (its first 16 bytes are ledgerId, entryId) and return its location.

        The location is durable only after ``flush()``.
        """
        return self.add_entries(ledger_id, (entry,))[0]

    def add_entries(self, ledger_id: int, entries: Sequence[bytes | memoryview]) -> list[int]:
        """Append a run of one ledger's entries (a sorted flush hands them so) and return their
        locations: one lock and one log decision per run. A log that would pass ``logSizeLimit``
        is sealed and the rest of the run goes to the next one. A write failure raises after
        dropping the buffered records. Durable only after ``flush()``.
        """
        for e in entries:
            if len(e) < fmt.MIN_SANE_ENTRY_SIZE:
                raise ValueError(f"entry of {len(e)} bytes is shorter than {fmt.MIN_SANE_ENTRY_SIZE}")
        out: list[int] = []
        append = out.append
        pack = fmt.encode_size
        limit = self.log_size_limit
        wbs = self.write_buffer_size
        n = len(entries)
        i = 0
        with self._lock:
            self._check_open()
            while i < n:
                log = self._active_log_for(ledger_id)
                base = make_location(log.log_id, 0)
                buf = log.buf
                pos = log.pos
                pending = 0  # record bytes of this ledger buffered since the last accounting
                while i < n:
                    entry = entries[i]
                    record_len = fmt.SIZE_FIELD + len(entry)
                    if pos + record_len > limit and pos > fmt.HEADER_SIZE:
                        break
                    append(base | (pos + fmt.SIZE_FIELD))
                    buf += pack(len(entry))
                    buf += entry
                    pos += record_len
                    pending += record_len
                    i += 1
                    if len(buf) >= wbs:
                        log.pos = pos
                        log.buf_sizes[ledger_id] = log.buf_sizes.get(ledger_id, 0) + pending
                        pending = 0
                        self._write_out(log)
                        if (
                            self.flush_entrylog_bytes > 0
                            and log.file_pos - log.synced_pos >= self.flush_entrylog_bytes
                        ):
                            self._sync(log)
                log.pos = pos
                if pending:
                    log.buf_sizes[ledger_id] = log.buf_sizes.get(ledger_id, 0) + pending
                if i < n:
                    self._seal(log)  # full: the rest of the run goes to the next log
        return out

    def _write_out(self, log: _ActiveLog) -> None:
        """Hand the buffered records to the file; on failure truncate back and drop them."""
        if not log.buf:
            return
        start = log.file_pos
        written = 0
        error: OSError | None = None
        # Written from a view of the buffer (no copy); the view is released before the buffer
        # is touched again (a live view would make clearing it fail).
        with memoryview(log.buf) as data:
            try:
                while written < len(data):
                    n = self._ops.write(log.fd, data[written:])
                    if n <= 0:
                        raise OSError(errno.EIO, "write returned 0")
                    written += n
            except OSError as e:
                error = e.with_traceback(None)  # its frames would keep views of the buffer alive
        if error is not None:
            err = _io_error(error, f"{log.path} offset {start + written}")
            self._discard_buffer(log)
            raise err from None
        log.file_pos += written
        for lid, size in log.buf_sizes.items():
            log.sizes[lid] = log.sizes.get(lid, 0) + size
        log.buf.clear()
        log.buf_sizes.clear()

    def _discard_buffer(self, log: _ActiveLog) -> None:
        """After a failed write: cut the file back to the last whole record, or abandon the log."""
        self.failure_count += 1
        log.buf.clear()
        log.buf_sizes.clear()
        try:
            self._ops.ftruncate(log.fd, log.file_pos)
            os.lseek(log.fd, log.file_pos, os.SEEK_SET)
            log.pos = log.file_pos
        except OSError:
            self._abandon(log)

    def _abandon(self, log: _ActiveLog) -> None:
        """Stop writing to a log whose tail cannot be trusted; it stays readable and unsealed."""
        self._forget_active(log)
        try:
            os.close(log.fd)
        except OSError:
            pass

    def _sync(self, log: _ActiveLog) -> None:
        try:
            self._ops.fsync(log.fd)
        except OSError as e:
            err = _io_error(e, f"{log.path}: fsync")
            # Fail-stop for this file: after a failed fsync the kernel may have dropped dirty pages,
            # so nothing after the last good sync is trusted; writers move on to a new log.
            self.failure_count += 1
            self._abandon(log)
            raise err from None
        log.synced_pos = log.file_pos

    def _seal(self, log: _ActiveLog) -> None:
        """Rotate: write the ledgers map, rewrite the header fields, fsync, close. Never reopened."""
        self._write_out(log)
        map_offset = log.file_pos
        sizes = dict(log.sizes)
        if sizes:
            log.buf += fmt.encode_ledgers_map(sizes)
            log.pos += len(log.buf)
            self._write_out(log)
        try:
            n = self._ops.pwrite(
                log.fd,
                fmt.encode_header_map_fields(map_offset if sizes else 0, len(sizes)),
                fmt.HEADER_MAP_FIELDS_OFFSET,
            )
            if n != 12:
                raise OSError(errno.EIO, f"short header write ({n} of 12 bytes)")
        except OSError as e:
            err = _io_error(e, f"{log.path} offset {fmt.HEADER_MAP_FIELDS_OFFSET}")
            self.failure_count += 1
            self._abandon(log)
            raise err from None
        self._sync(log)
        self._forget_active(log)
        os.close(log.fd)
        self.rotations += 1

    def flush(self) -> None:
        """Make every location handed out so far durable: write buffers, fsync the active log(s)."""
        with self._lock:
            self._check_open()
            logs = self._active_logs()
            for log in logs:
                self._write_out(log)
            pending = [log for log in logs if log.synced_pos < log.file_pos]
            if len(pending) <= 1:
                for log in pending:
                    self._sync(log)
                return
            # Entry log per ledger: a checkpoint fsyncs every active log. Issued concurrently
            # (fsync releases the GIL) so the filesystem can batch them in one journal commit;
            # the outcomes are then applied one by one, exactly as _sync would.
            outcomes = list(self._fsync_pool().map(self._fsync_quietly, pending))
            first_error: StorageError | None = None
            for log, error in zip(pending, outcomes):
                if error is None:
                    log.synced_pos = log.file_pos
                    continue
                self.failure_count += 1
                self._abandon(log)
                first_error = first_error or _io_error(error, f"{log.path}: fsync")
            if first_error is not None:
                raise first_error

    def _fsync_quietly(self, log: _ActiveLog) -> OSError | None:
        try:
            self._ops.fsync(log.fd)
        except OSError as e:
            return e
        return None

    def _fsync_pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="entrylog-fsync")
        return self._pool

    def rotate(self) -> None:
        """Seal the active log(s) now (e.g. before compaction of the current log, or in tests)."""
        with self._lock:
            self._check_open()
            for log in self._active_logs():
                self._seal(log)

    def rotate_ledger(self, ledger_id: int) -> bool:
        """Entry log per ledger: seal this ledger's active log (advisory "ledger closed").
        Returns whether a log was sealed; a no-op in the shared mode."""
        with self._lock:
            self._check_open()
            log = self._per_ledger.get(ledger_id)
            if log is None:
                return False
            self._seal(log)
            return True

    def rotate_idle(self) -> int:
        """Entry log per ledger: seal the logs of mappings not accessed for ``access_expiry_s``
        (BookKeeper's access-expiry eviction); returns how many logs were sealed."""
        with self._lock:
            self._check_open()
            if not self.entry_log_per_ledger:
                return 0
            cutoff = self._clock() - self.access_expiry_s
            idle = {id(log): log for lid, log in self._per_ledger.items() if self._last_access.get(lid, 0.0) <= cutoff}
            for log in idle.values():
                self._seal(log)
            return len(idle)

    def active_ledgers(self) -> dict[int, int]:
        """Entry log per ledger: ``{ledger_id: active log id}``."""
        with self._lock:
            return {lid: log.log_id for lid, log in self._per_ledger.items()}

    def least_unflushed_log_id(self) -> int:
        """Logs below this id are sealed and safe for GC/compaction (BookKeeper's name)."""
        with self._lock:
            active = [log.log_id for log in self._active_logs()]
            reserved = [*self._reserved_ids, *active]
            if self._prealloc_id is not None:
                reserved.append(self._prealloc_id)
            return min(reserved) if reserved else self._last_id + 1

    def active_log_usage(self) -> list[tuple[int, int, dict[int, int]]]:
        """``(log id, bytes in the file, {ledger: record bytes})`` of every active log, as far
        as its records reached the file (buffered records are not on disk yet)."""
        with self._lock:
            return [(log.log_id, log.file_pos, dict(log.sizes)) for log in self._active_logs()]

    def flushed_log_ids(self) -> list[int]:
        """Logs GC and compaction may read and delete: ``.log`` files that are not active, not
        reserved by preallocation and not being written by compaction (module docstring)."""
        with self._lock:
            busy = {log.log_id for log in self._active_logs()} | self._reserved_ids
            if self._prealloc_id is not None:
                busy.add(self._prealloc_id)
            ids = [i for i in self.log_ids() if i not in busy]
            if not self.entry_log_per_ledger:
                # Shared mode: BookKeeper's rule, identical to the set above but stated as such.
                least = min([*busy], default=self._last_id + 1)
                ids = [i for i in ids if i < least]
            return ids

    def active_log_ids(self) -> list[int]:
        with self._lock:
            return [log.log_id for log in self._active_logs()]

    def record_size(self, location: int) -> int | None:
        """Bytes the record at ``location`` occupies (size field included), or None if unreadable."""
        log_id, offset = location_log_id(location), location_offset(location)
        try:
            self._make_readable(log_id, offset)
            reader = self._acquire_reader(log_id)
        except (CorruptionError, StorageError):
            return None
        try:
            head = self._pread(reader, fmt.SIZE_FIELD, offset - fmt.SIZE_FIELD, log_id)
        except StorageError:
            return None
        finally:
            self._release_reader(reader)
        return fmt.SIZE_FIELD + fmt.decode_size(head) if len(head) == fmt.SIZE_FIELD else None

    # ------------------------------------------------------------------ compaction output

    def new_compaction_log(self, source_log_id: int) -> CompactionLog:
        """A new log for the live entries of ``source_log_id`` (see ``CompactionLog``)."""
        with self._lock:
            self._check_open()
            log_id = self._next_log_id()
            self._last_id = log_id
            self._reserved_ids.add(log_id)
            try:
                self._write_last_id(log_id)
                return CompactionLog(self, log_id, source_log_id)
            except BaseException:
                self._reserved_ids.discard(log_id)
                raise

    def _release_reserved(self, log_id: int) -> None:
        with self._lock:
            self._reserved_ids.discard(log_id)

    def compaction_files(self) -> tuple[list[Path], list[tuple[int, int, Path]]]:
        """Leftovers of interrupted compactions: ``*.log.compacting`` files, and
        ``(new_id, old_id, path)`` for every ``<new>.log.<old>.compacted`` marker."""
        compacting: list[Path] = []
        compacted: list[tuple[int, int, Path]] = []
        with self._lock:
            busy = set(self._reserved_ids)
        for name in sorted(os.listdir(self.current_dir)):
            if name.endswith(COMPACTING_SUFFIX):
                new_id = parse_log_file_name(name[: -len(".compacting")])
                if new_id is not None and new_id not in busy:
                    compacting.append(self.current_dir / name)
            elif name.endswith(COMPACTED_SUFFIX):
                parts = name[: -len(COMPACTED_SUFFIX)].split(".")
                if len(parts) == 3 and parts[1] == "log":
                    new_id = parse_log_file_name(parts[0] + LOG_SUFFIX)
                    old_id = parse_log_file_name(parts[2] + LOG_SUFFIX)
                    if new_id is not None and old_id is not None and new_id not in busy:
                        compacted.append((new_id, old_id, self.current_dir / name))
        return compacting, compacted

    # ------------------------------------------------------------------ reads

    def log_path(self, log_id: int) -> Path:
        return self.current_dir / log_file_name(log_id)

    def _acquire_reader(self, log_id: int) -> _Reader:
        with self._readers_lock:
            reader = self._readers.get(log_id)
            if reader is None:
                path = self.log_path(log_id)
                try:
                    fd = os.open(path, os.O_RDONLY)
                except FileNotFoundError:
                    raise CorruptionError(f"{path}: entry log does not exist") from None
                except OSError as e:
                    raise StorageError(f"{path}: cannot open: {e.strerror}") from None
                reader = self._readers[log_id] = _Reader(fd)
            reader.users += 1
            return reader

    def _release_reader(self, reader: _Reader) -> None:
        with self._readers_lock:
            reader.users -= 1
            if reader.closing and reader.users == 0:
                os.close(reader.fd)

    def _make_readable(self, log_id: int, end: int) -> None:
        """Bytes of the active log below ``end`` may still be buffered: hand them to the file."""
        current = [log for log in self._active_logs() if log.log_id == log_id]
        if current and current[0].file_pos < end:
            with self._lock:
                for log in self._active_logs():
                    if log.log_id == log_id and log.file_pos < end:
                        self._write_out(log)

    def _pread(self, reader: _Reader, n: int, offset: int, log_id: int) -> bytes:
        try:
            return os.pread(reader.fd, n, offset)
        except OSError as e:
            raise StorageError(
                f"{self.log_path(log_id)} offset {offset}: read failed: {e.strerror}"
            ) from None

    def read_entry(self, ledger_id: int, entry_id: int, location: int) -> bytes:
        """The entry stored at ``location``; the size and ids there must match the request."""
        log_id, offset = location_log_id(location), location_offset(location)
        path = self.log_path(log_id)
        if offset < fmt.HEADER_SIZE + fmt.SIZE_FIELD:
            raise CorruptionError(f"{path} offset {offset}: location points into the header")
        self._make_readable(log_id, offset + fmt.MIN_SANE_ENTRY_SIZE)
        reader = self._acquire_reader(log_id)
        try:
            head = self._pread(
                reader, fmt.SIZE_FIELD + fmt.MIN_SANE_ENTRY_SIZE, offset - fmt.SIZE_FIELD, log_id
            )
            if len(head) < fmt.SIZE_FIELD + fmt.MIN_SANE_ENTRY_SIZE:
                raise CorruptionError(f"{path} offset {offset}: entry runs past the end of the log")
            size = fmt.decode_size(head)
            if size < fmt.MIN_SANE_ENTRY_SIZE:
                raise CorruptionError(f"{path} offset {offset - fmt.SIZE_FIELD}: insane entry size {size}")
            lid, eid = fmt.entry_ids(head[fmt.SIZE_FIELD :])
            if (lid, eid) != (ledger_id, entry_id):
                raise CorruptionError(
                    f"{path} offset {offset}: expected ledger {ledger_id} entry {entry_id}, "
                    f"found ledger {lid} entry {eid}"
                )
            self._make_readable(log_id, offset + size)
            entry = self._pread(reader, size, offset, log_id)
            if len(entry) != size:
                raise CorruptionError(
                    f"{path} offset {offset}: entry of {size} bytes runs past the end of the log"
                )
            return entry
        finally:
            self._release_reader(reader)

    def read_following(
        self, ledger_id: int, location: int, *, max_entries: int, max_bytes: int = 1 << 20
    ) -> list[tuple[int, int, memoryview]]:
        """Read-ahead: up to ``max_entries`` records after ``location`` while they belong to
        ``ledger_id`` (a sorted flush keeps a ledger's entries adjacent) and their bytes stay
        within ``max_bytes`` (``<= 0``: no byte bound). Returns ``(entry_id, location, entry)``
        with each entry a view into one read buffer; stops quietly at anything unexpected."""
        return self.read_run(ledger_id, location, max_entries=max_entries, max_bytes=max_bytes,
                             include_first=False, first_counts=False)

    def read_run(
        self, ledger_id: int, location: int, *, max_entries: int, max_bytes: int,
        include_first: bool = True, first_counts: bool = True,
    ) -> list[tuple[int, int, memoryview]]:
        """The records of ``ledger_id`` stored one after the other from ``location`` (that
        record itself with ``include_first``), as ``(entry_id, location, entry)``.

        Reads the run in one pread, sized from its first record (more only if later records are
        bigger), and returns views into it: no copy per entry. Stops at ``max_entries``, before
        the record that would take the bytes past ``max_bytes`` (``<= 0``: no bound; with
        ``first_counts`` the first record is returned whatever its size), at a record of another
        ledger, at the end of what is readable, or quietly at anything unexpected (the caller
        reads entries one by one from there, with full checks). Entry ids are as stored: the
        caller decides whether they are the ones it wants.
        """
        log_id, offset = location_log_id(location), location_offset(location)
        out: list[tuple[int, int, memoryview]] = []
        if max_entries <= 0 or offset < fmt.HEADER_SIZE + fmt.SIZE_FIELD:
            return out
        reader = self._acquire_reader(log_id)
        try:
            if include_first:
                pos = offset - fmt.SIZE_FIELD  # start of the record's size field
            else:
                head = self._pread(reader, fmt.SIZE_FIELD, offset - fmt.SIZE_FIELD, log_id)
                if len(head) < fmt.SIZE_FIELD:
                    return out
                pos = offset + fmt.decode_size(head)  # start of the next record's size field
            with self._lock:
                limit = self._readable_end(log_id)
            if limit is not None and pos + fmt.SIZE_FIELD + fmt.MIN_SANE_ENTRY_SIZE > limit:
                return out
            head = self._pread(reader, fmt.SIZE_FIELD, pos, log_id)
            if len(head) < fmt.SIZE_FIELD:
                return out
            first_size = fmt.decode_size(head)
            if first_size < fmt.MIN_SANE_ENTRY_SIZE or (0 < max_bytes < first_size and not first_counts):
                return out
            # The whole run in one pread if its records are about the size of the first; a
            # record that straddles the end of a chunk is read again from its start.
            chunk_len = max_entries * (fmt.SIZE_FIELD + first_size)
            if max_bytes > 0:
                chunk_len = min(chunk_len, max(first_size, max_bytes) + fmt.SIZE_FIELD * max_entries)
            chunk_len = max(fmt.SIZE_FIELD + first_size, min(chunk_len, _RUN_CHUNK_MAX))
            chunk = memoryview(b"")
            base = pos
            total = 0
            while len(out) < max_entries:
                if limit is not None and pos + fmt.SIZE_FIELD + fmt.MIN_SANE_ENTRY_SIZE > limit:
                    return out
                rel = pos - base
                if rel + fmt.SIZE_FIELD > len(chunk):
                    base, rel = pos, 0
                    chunk = memoryview(self._pread(reader, chunk_len, pos, log_id))
                    if len(chunk) < fmt.SIZE_FIELD:
                        return out
                size = fmt.decode_size(chunk, rel)
                if size < fmt.MIN_SANE_ENTRY_SIZE or (
                    limit is not None and pos + fmt.SIZE_FIELD + size > limit
                ):
                    return out
                if (out or not first_counts) and 0 < max_bytes < total + size:
                    return out
                if rel + fmt.SIZE_FIELD + size > len(chunk):
                    base, rel = pos, 0
                    chunk = memoryview(self._pread(reader, max(chunk_len, fmt.SIZE_FIELD + size), pos, log_id))
                    if len(chunk) < fmt.SIZE_FIELD + size:
                        return out
                body = chunk[rel + fmt.SIZE_FIELD : rel + fmt.SIZE_FIELD + size]
                lid, eid = fmt.entry_ids(body)
                if lid != ledger_id:
                    return out
                out.append((eid, make_location(log_id, pos + fmt.SIZE_FIELD), body))
                total += size
                pos += fmt.SIZE_FIELD + size
            return out
        finally:
            self._release_reader(reader)

    def _readable_end(self, log_id: int) -> int | None:
        for log in self._active_logs():
            if log.log_id == log_id:
                return log.file_pos
        return None

    def log_ids(self) -> list[int]:
        """Ids of the ``.log`` files in ``current/``, ascending (compaction temporaries excluded)."""
        try:
            names = os.listdir(self.current_dir)
        except OSError as e:
            raise StorageError(f"{self.current_dir}: cannot list: {e.strerror}") from None
        return sorted(i for i in (parse_log_file_name(n) for n in names) if i is not None)

    def _log_end(self, log_id: int) -> int:
        with self._lock:
            for log in self._active_logs():
                if log.log_id == log_id:
                    self._write_out(log)
                    return log.file_pos
        path = self.log_path(log_id)
        try:
            return path.stat().st_size
        except FileNotFoundError:
            raise CorruptionError(f"{path}: entry log does not exist") from None

    def scan(self, log_id: int, *, verify: fmt.VerifyFn | None = None) -> Iterator[fmt.LogRecord]:
        """Scan one log's records in file order (see ``EntryLogScanner``); the header is checked."""
        scanner = self.scanner(log_id, verify=verify)
        yield from scanner

    def scanner(self, log_id: int, *, verify: fmt.VerifyFn | None = None) -> fmt.EntryLogScanner:
        """A scanner over one log; its ``report`` says where it stopped once iterated."""
        end = self._log_end(log_id)
        path = self.log_path(log_id)
        reader = self._acquire_reader(log_id)
        # The scanner reads lazily: keep the descriptor referenced until the logger closes.
        read = self._read_fn(reader, log_id)
        try:
            fmt.decode_header(read(0, fmt.HEADER_SIZE), where=str(path))
        except Exception:
            self._release_reader(reader)
            raise
        return _OwningScanner(
            read, end=end, verify=verify, where=str(path), release=lambda: self._release_reader(reader)
        )

    def _read_fn(self, reader: _Reader, log_id: int) -> Callable[[int, int], bytes]:
        return lambda off, n: self._pread(reader, n, off, log_id)

    def ledgers_map(self, log_id: int) -> dict[int, int]:
        """``{ledger_id: bytes}`` of a log: the map at its end, else a full scan (BookKeeper's rule).

        For the active log: the in-memory map of what has been appended so far.
        """
        with self._lock:
            for log in self._active_logs():
                if log.log_id == log_id:
                    sizes = dict(log.sizes)
                    for lid, size in log.buf_sizes.items():
                        sizes[lid] = sizes.get(lid, 0) + size
                    return sizes
        info = self.log_info(log_id)
        return info.ledgers

    def log_info(self, log_id: int) -> LogInfo:
        """Size and ledgers of one log, saying whether the ledgers map or a scan provided them."""
        with self._lock:
            active = log_id in [log.log_id for log in self._active_logs()]
        if active:
            return LogInfo(log_id, self._log_end(log_id), self.ledgers_map(log_id), False, True)
        end = self._log_end(log_id)
        path = self.log_path(log_id)
        reader = self._acquire_reader(log_id)
        try:
            sizes = fmt.read_ledgers_map(self._read_fn(reader, log_id), end, where=str(path))
        finally:
            self._release_reader(reader)
        if sizes is not None:
            return LogInfo(log_id, end, sizes, True, False)
        records = self.scan(log_id)
        scanned: dict[int, int] = {}
        for rec in records:
            scanned[rec.ledger_id] = scanned.get(rec.ledger_id, 0) + fmt.SIZE_FIELD + rec.size
        return LogInfo(log_id, end, scanned, False, False)

    def delete_log(self, log_id: int) -> None:
        """Remove a sealed log (GC/compaction). The active log cannot be deleted."""
        with self._lock:
            if log_id in self._reserved_ids:
                raise StorageError(f"{self.log_path(log_id)}: cannot delete a log being written")
            if log_id in [log.log_id for log in self._active_logs()]:
                raise StorageError(f"{self.log_path(log_id)}: cannot delete the active entry log")
            if self._prealloc_id == log_id:
                raise StorageError(f"{self.log_path(log_id)}: cannot delete the preallocated entry log")
            path = self.log_path(log_id)
            with self._readers_lock:
                reader = self._readers.pop(log_id, None)
                if reader is not None:
                    reader.closing = True
                    if reader.users == 0:
                        os.close(reader.fd)
            try:
                path.unlink()
                fsync_dir(self.current_dir)
            except FileNotFoundError:
                pass
            except OSError as e:
                raise _io_error(e, f"{path}: delete") from None

    # ------------------------------------------------------------------ lifecycle

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError(f"{self.current_dir}: entry logger is closed")

    def close(self) -> None:
        """Flush the active log(s) (not sealed: a sealed log is never reopened, and the next
        logger starts a new one anyway) and release every descriptor."""
        with self._lock:
            if self._closed:
                return
            try:
                for log in self._active_logs():
                    self._write_out(log)
                    if log.synced_pos < log.file_pos:
                        self._sync(log)
            finally:
                self._closed = True
                for log in self._active_logs():
                    self._abandon(log)
                thread = self._prealloc_thread
        if thread is not None:
            thread.join()
        with self._lock:
            spare, self._preallocated = self._preallocated, None
            if spare is not None:
                # An unused preallocated log holds no entry: remove it rather than leave an empty file.
                os.close(spare.fd)
                try:
                    spare.path.unlink()
                except OSError:
                    pass
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        with self._readers_lock:
            for reader in self._readers.values():
                reader.closing = True
                if reader.users == 0:
                    os.close(reader.fd)
            self._readers.clear()

    def __enter__(self) -> EntryLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class CompactionLog:
    """A new entry log receiving the live entries of one compacted log.

    Written as ``<hex id>.log.compacting``; ``finish()`` seals it (ledgers map, header), fsyncs
    it, renames it to ``<hex id>.log.<hex source>.compacted``, hard-links it as ``<hex id>.log``
    and fsyncs the directory: after ``finish()`` returns, the copies are durable and readable and
    the ``.compacted`` marker says which compaction still has to finish (index update, delete of
    the source, then ``done()`` removes the marker). ``abort()`` removes the unfinished file.
    Used by the GC thread only; writes bypass the logger's lock (the file is private until
    ``finish``).
    """

    def __init__(self, logger: EntryLogger, log_id: int, source_log_id: int) -> None:
        self._logger = logger
        self.log_id = log_id
        self.source_log_id = source_log_id
        self.path = logger.current_dir / (f"{log_id:x}" + COMPACTING_SUFFIX)
        self.marker = logger.current_dir / f"{log_id:x}.log.{source_log_id:x}{COMPACTED_SUFFIX}"
        self._ops = logger._ops
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        self._buf = bytearray(fmt.encode_header())
        self._pos = fmt.HEADER_SIZE
        self.sizes: dict[int, int] = {}
        self.bytes_written = 0
        self._done = False

    @property
    def room(self) -> int:
        return self._logger.log_size_limit - self._pos

    def add_entry(self, ledger_id: int, entry: bytes) -> int:
        record = fmt.encode_record(entry)
        location = make_location(self.log_id, self._pos + fmt.SIZE_FIELD)
        self._buf += record
        self._pos += len(record)
        self.sizes[ledger_id] = self.sizes.get(ledger_id, 0) + len(record)
        self.bytes_written += len(record)
        if len(self._buf) >= self._logger.write_buffer_size:
            self._write_out()
        return location

    def _write_out(self) -> None:
        view = memoryview(bytes(self._buf))
        try:
            while view:
                n = self._ops.write(self._fd, view)
                if n <= 0:
                    raise OSError(errno.EIO, "write returned 0")
                view = view[n:]
        except OSError as e:
            raise _io_error(e, f"{self.path}") from None
        self._buf.clear()

    def finish(self) -> None:
        """Seal + fsync the file, then make it ``<id>.log`` durably (module docstring order)."""
        map_offset = self._pos
        if self.sizes:
            self._buf += fmt.encode_ledgers_map(self.sizes)
        self._write_out()
        try:
            self._ops.pwrite(
                self._fd,
                fmt.encode_header_map_fields(map_offset if self.sizes else 0, len(self.sizes)),
                fmt.HEADER_MAP_FIELDS_OFFSET,
            )
            self._ops.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1
            os.rename(self.path, self.marker)
            os.link(self.marker, self._logger.log_path(self.log_id))
            fsync_dir(self._logger.current_dir)
        except OSError as e:
            raise _io_error(e, f"{self.path}: finishing compaction output") from None
        finally:
            self._logger._release_reserved(self.log_id)

    def done(self) -> None:
        """The compaction is complete (index updated, source deleted): drop the marker."""
        try:
            self.marker.unlink()
            fsync_dir(self._logger.current_dir)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise _io_error(e, f"{self.marker}: delete") from None

    def abort(self) -> None:
        """Nothing points into an unfinished file: close and remove it."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            try:
                self.path.unlink()
            except OSError:
                pass
        self._logger._release_reserved(self.log_id)


class _OwningScanner(fmt.EntryLogScanner):
    """A scanner that releases its read descriptor when iteration ends."""

    def __init__(
        self,
        read: fmt.ReadFn,
        *,
        end: int,
        verify: fmt.VerifyFn | None,
        where: str,
        release: Callable[[], None],
    ) -> None:
        super().__init__(read, end=end, verify=verify, where=where)
        self._release = release
        self._released = False

    def __iter__(self) -> Iterator[fmt.LogRecord]:
        try:
            yield from super().__iter__()
        finally:
            if not self._released:
                self._released = True
                self._release()
