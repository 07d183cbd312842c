"""Entry logs of one ledger directory: the facade over allocation, active-log choice and reads,
and the write path itself (appends, rotation, flush).

Files live in ``<ledger_dir>/current/``: ``<hex id>.log`` in BookKeeper's entry-log format
(``vellum.format.entrylog``) and ``lastId``. Roles, each in its own class:

- ``EntryLogAllocator`` (``entry_log_allocator``): log ids, ``lastId``, creating and
  preallocating logs, ids reserved for compaction outputs;
- ``ActiveLogPolicy`` (``entry_log_policy``): "which log is active for this ledger": one
  shared active log (``SharedActiveLog``) or one per ledger (``PerLedgerActiveLogs``, requirement
  R1 of docs/correctness.md, ``entryLogPerLedgerEnabled``);
- ``EntryLogReader`` (``entry_log_reader``): reads by location, runs, scans, ledgers maps;
- ``EntryLogger`` (here): appends, buffering, rotation (sealing), flush, and the facade the
  rest of the bookie uses (ledger storage, GC, compaction, index rebuild, shell commands);
- ``CompactionLog`` (here): the output log of one compaction.

Invariants:
- Log ids only grow, and a log is durable (header fsynced, ``lastId`` and its name durable)
  before it is used (``EntryLogAllocator``). A sealed (rotated) log is never reopened.
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
  ``ActiveLogPolicy.log_for``. Entry log per ledger: ``rotate_idle`` seals logs idle for
  ``access_expiry_s``; ``rotate_ledger`` seals one ledger's log (the advisory "ledger
  closed"); ``rotate`` seals all of them (checkpoint flushes all, dir full seals all). Sealing
  writes the ledgers map, so a sealed log is immediately usable by GC. The file format is the
  same in both modes, so the flag can change between restarts: a restart always starts new
  logs, and logs written in either mode are read, scanned and collected alike.
- GC / compaction touch only *flushed* logs (``flushed_log_ids``): existing ``.log`` files that
  are neither active, nor reserved by preallocation, nor being written by compaction
  (``ActiveLogPolicy.flushed`` states each mode's rule).
- Compaction output (``CompactionLog``) is written as ``<hex new>.log.compacting``, sealed and
  fsynced, renamed to ``<hex new>.log.<hex old>.compacted`` and hard-linked as
  ``<hex new>.log`` (dir fsynced) before any index entry points to it; the ``.compacted`` name
  is the durable marker of an unfinished compaction (see ``storage/compaction.py``).

Direct I/O (``direct_io``, ``dbStorage_directIOEntryLogger``; not with entry log per ledger, as in
BookKeeper): the allocator hands out logs opened with ``O_DIRECT``. Records are staged in the
log's buffer as in buffered mode; a write-out copies them into the log's aligned tail buffer
(``direct_io.AlignedAppender``, ``direct_write_buffer_size`` bytes, made on the first write),
which writes itself whole when full. Whatever must be in the file (an fsync, a read of those
bytes, sealing, closing) first writes the tail too, its partial last block zero-padded; the next
write rewrites that block with the same leading bytes. Reads stay buffered preads and never go
past ``ActiveLog.on_file``. Sealing and closing cut the padding off (``ftruncate``) and sealing
rewrites the header fields through a buffered descriptor, so a finished log is byte for byte
what buffered mode writes; a crash may leave up to one block of zeros after the last record,
which scanners skip as padding (BookKeeper's rule). A failed direct write abandons the log.

Threads: add/flush/rotation and allocation run under ``_lock`` (the storage's flush thread,
compaction); reads use ``os.pread`` on reference-counted read-only descriptors and run
concurrently.
"""

from __future__ import annotations

import bisect
import errno
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from vellum.errors import StorageError
from vellum.format import entrylog as fmt
from vellum.ids import make_location
from vellum.storage import direct_io as dio
from vellum.storage.durable import OS_FILE_OPS, FileOps, remove_file, write_all
from vellum.storage.entry_log_allocator import (
    COMPACTED_SUFFIX,
    COMPACTING_SUFFIX,
    LAST_ID_FILE,
    LOG_SUFFIX,
    ActiveLog,
    EntryLogAllocator,
    io_error,
    log_file_name,
    parse_log_file_name,
)
from vellum.storage.entry_log_policy import ActiveLogPolicy, PerLedgerActiveLogs, SharedActiveLog
from vellum.storage.entry_log_reader import EntryLogReader, RecordRun

# Names other modules import from here (shell commands, Spark jobs, tests).
__all__ = [
    "COMPACTED_SUFFIX",
    "COMPACTING_SUFFIX",
    "LAST_ID_FILE",
    "LOG_SUFFIX",
    "WRITE_BUFFER_SIZE",
    "CompactionLog",
    "EntryLogger",
    "FileOps",
    "LogInfo",
    "log_file_name",
    "parse_log_file_name",
]

WRITE_BUFFER_SIZE = 65536  # BookKeeper's writeBufferSizeBytes
#: aligned tail buffer of a direct-I/O log when not given (direct writes below ~1 MiB were 2-4x
#: slower than 1 MiB writes on the benchmark disk)
DIRECT_WRITE_BUFFER_SIZE = 4 << 20


@dataclass(frozen=True)
class LogInfo:
    """Size and ledgers of one log, and whether its ledgers map (else a scan or, for an active
    log, memory) gave them."""

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
        direct_io: bool = False,
        direct_write_buffer_size: int = DIRECT_WRITE_BUFFER_SIZE,
    ) -> None:
        if direct_io and entry_log_per_ledger:
            raise ValueError(
                f"{ledger_dir}: the direct-I/O entry logger does not support entry log per ledger "
                "(one aligned buffer per active log); turn one of them off"
            )
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
        self._ops = file_ops or OS_FILE_OPS
        self._lock = threading.RLock()
        self.direct_write_buffer_size = max(direct_write_buffer_size, 2 * dio.ENTRY_LOG_ALIGNMENT)
        self._allocator = EntryLogAllocator(
            self.current_dir, ops=self._ops, preallocate=preallocate,
            thread_name=f"entrylog-prealloc-{self.ledger_dir}", direct=direct_io,
        )
        self._policy: ActiveLogPolicy
        if entry_log_per_ledger:
            self._policy = PerLedgerActiveLogs(
                self._allocator.allocate, self._seal,
                max_active_logs=max_active_logs, access_expiry_s=access_expiry_s, clock=clock,
            )
        else:
            self._policy = SharedActiveLog(self._allocator.allocate)
        self._reader = EntryLogReader(
            self.current_dir, make_readable=self._make_readable, readable_end=self._readable_end
        )
        self.rotations = 0  # logs sealed (observability and tests)
        self._pool: ThreadPoolExecutor | None = None  # concurrent fsyncs of many active logs
        self.failure_count = 0
        self._closed = False

    @property
    def direct_io(self) -> bool:
        """Whether new logs are written with ``O_DIRECT`` (false once a filesystem refused)."""
        return self._allocator.direct

    @property
    def entry_log_per_ledger(self) -> bool:
        """Whether each ledger has a log of its own (``entryLogPerLedgerEnabled``)."""
        return self._policy.per_ledger

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

        The run is handled as slices, not entry by entry: the records' end positions are summed
        once (``accumulate``), each slice is the entries up to the one that fills the write
        buffer (``write_buffer_size``, as an entry-by-entry append would write it out) or the
        log, found by bisection, and its locations are made with one ``map``; what is left per
        entry is copying it into the buffer. The bytes, the locations and the points where the
        buffer is written out are those of appending the entries one at a time.
        """
        n = len(entries)
        if n == 0:
            return []
        sizes = list(map(len, entries))
        if min(sizes) < fmt.MIN_SANE_ENTRY_SIZE:
            short = next(s for s in sizes if s < fmt.MIN_SANE_ENTRY_SIZE)
            raise ValueError(f"entry of {short} bytes is shorter than {fmt.MIN_SANE_ENTRY_SIZE}")
        field = fmt.SIZE_FIELD
        out: list[int] = []
        pack = fmt.encode_size
        # entries of one size (one-row entries): records' ends in a range, one size field for all
        uniform = sizes.count(sizes[0]) == n
        stride = field + sizes[0]
        one_field = pack(sizes[0])
        limit = self.log_size_limit
        wbs = self.write_buffer_size
        i = 0
        with self._lock:
            self._check_open()
            while i < n:
                log = self._policy.log_for(ledger_id)
                buf = log.buf
                start = log.pos
                # ends[k]: the log's end once the run's entries i .. i+k-1 are appended
                ends: Sequence[int] = (
                    range(start, start + (n - i + 1) * stride, stride) if uniform
                    else list(itertools.accumulate(map(field.__add__, itertools.islice(sizes, i, None)),
                                                   initial=start)))
                # entries that end within the limit (none when an oversized entry filled the log)
                fit = max(0, bisect.bisect_right(ends, limit) - 1)
                if fit == 0 and start <= fmt.HEADER_SIZE:
                    fit = 1  # an empty log takes one entry bigger than the limit
                record_base = make_location(log.log_id, 0) + field
                k = 0
                while k < fit:
                    # up to the entry whose record fills the write buffer, or the last that fits
                    full = bisect.bisect_left(ends, ends[k] + wbs - len(buf), k + 1, fit + 1)
                    q = min(full, fit)
                    out.extend(map(record_base.__add__, ends[k:q]))
                    if uniform:  # one size field for all
                        for entry in entries[i + k:i + q]:
                            buf += one_field  # two appends: cheaper than joining the slice first
                            buf += entry
                    else:
                        for size_field, entry in zip(map(pack, sizes[i + k:i + q]), entries[i + k:i + q]):
                            buf += size_field
                            buf += entry
                    log.pos = ends[q]
                    log.buf_sizes[ledger_id] = log.buf_sizes.get(ledger_id, 0) + ends[q] - ends[k]
                    k = q
                    if len(buf) >= wbs:
                        self._write_out(log)
                        if (
                            self.flush_entrylog_bytes > 0
                            and log.file_pos - log.synced_pos >= self.flush_entrylog_bytes
                        ):
                            self._sync(log)
                i += fit
                if i < n:
                    self._seal(log)  # full: the rest of the run goes to the next log
        return out

    def _write_out(self, log: ActiveLog) -> None:
        """Hand the buffered records to the file (a direct log: to its aligned tail buffer, which
        writes whole buffers as it fills); on failure truncate back (or abandon) and drop them."""
        if not log.buf:
            return
        start = log.file_pos
        written = 0
        error: OSError | None = None
        if log.direct:
            try:
                self._appender(log).append(log.buf)
                written = len(log.buf)
            except OSError as e:
                error = e.with_traceback(None)
        else:
            # Written from a view of the buffer (no copy); the view is released before the
            # buffer is touched again (a live view would make clearing it fail).
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
            err = io_error(error, f"{log.path} offset {start + written}")
            self._discard_buffer(log)
            raise err from None
        log.file_pos += written
        for lid, size in log.buf_sizes.items():
            log.sizes[lid] = log.sizes.get(lid, 0) + size
        log.buf.clear()
        log.buf_sizes.clear()

    def _appender(self, log: ActiveLog) -> dio.AlignedAppender:
        """The aligned tail buffer of a direct log, made on its first write (a new log: the file
        holds the header only, the bytes of the first block the first write rewrites)."""
        appender = log.appender
        if appender is None:
            assert log.file_pos == fmt.HEADER_SIZE < dio.ENTRY_LOG_ALIGNMENT, log.file_pos
            appender = dio.AlignedAppender(
                self.direct_write_buffer_size, dio.ENTRY_LOG_ALIGNMENT, pwrite=self._ops.pwrite
            )
            appender.reset(log.fd, fmt.HEADER_SIZE, fmt.encode_header())
            log.appender = appender
        return appender

    def _to_file(self, log: ActiveLog) -> None:
        """Make every byte handed over readable from the file: write the buffered records and,
        for a direct log, its tail (the partial last block zero-padded). A failure abandons a
        direct log (its tail cannot be trusted)."""
        self._write_out(log)
        appender = log.appender
        if appender is None or appender.written_end >= log.file_pos:
            return
        try:
            appender.write_all()
            return
        except OSError as e:
            err = io_error(e, f"{log.path} offset {appender.written_end}")
        self.failure_count += 1
        self._abandon(log)
        raise err from None

    def _cut_padding(self, log: ActiveLog) -> bool:
        """A direct log's file may end in the zero padding of its last block: cut it off so the
        file ends at its last record, as a buffered log does. Returns whether it did (raises
        OSError)."""
        if log.appender is not None and os.fstat(log.fd).st_size > log.file_pos:
            self._ops.ftruncate(log.fd, log.file_pos)
            return True
        return False

    def _discard_buffer(self, log: ActiveLog) -> None:
        """After a failed write: cut the file back to the last whole record, or abandon the log
        (always for a direct log: what its aligned buffer had written is unknown)."""
        self.failure_count += 1
        log.buf.clear()
        log.buf_sizes.clear()
        if log.direct:
            self._abandon(log)
            return
        try:
            self._ops.ftruncate(log.fd, log.file_pos)
            os.lseek(log.fd, log.file_pos, os.SEEK_SET)
            log.pos = log.file_pos
        except OSError:
            self._abandon(log)

    def _abandon(self, log: ActiveLog) -> None:
        """Stop writing to a log whose tail cannot be trusted; it stays readable and unsealed."""
        self._policy.forget(log)
        if log.appender is not None:
            log.appender.close()
            log.appender = None
        try:
            os.close(log.fd)
        except OSError:
            pass

    def _sync(self, log: ActiveLog) -> None:
        self._to_file(log)
        try:
            self._ops.fsync(log.fd)
        except OSError as e:
            err = io_error(e, f"{log.path}: fsync")
            # Fail-stop for this file: after a failed fsync the kernel may have dropped dirty pages,
            # so nothing after the last good sync is trusted; writers move on to a new log.
            self.failure_count += 1
            self._abandon(log)
            raise err from None
        log.synced_pos = log.file_pos

    def _seal(self, log: ActiveLog) -> None:
        """Rotate: write the ledgers map, rewrite the header fields, fsync, close. Never reopened."""
        self._write_out(log)
        map_offset = log.file_pos
        sizes = dict(log.sizes)
        if sizes:
            log.buf += fmt.encode_ledgers_map(sizes)
            log.pos += len(log.buf)
            self._write_out(log)
        self._to_file(log)
        fields = fmt.encode_header_map_fields(map_offset if sizes else 0, len(sizes))
        try:
            if log.direct:
                # 12 bytes at offset 8 are no aligned write: rewrite them through a buffered
                # descriptor, synced before the log's own fsync below (ordered as in buffered mode)
                self._cut_padding(log)
                wfd = self._ops.open(log.path, os.O_WRONLY)
                try:
                    n = self._ops.pwrite(wfd, fields, fmt.HEADER_MAP_FIELDS_OFFSET)
                    if n == 12:
                        self._ops.fsync(wfd)
                finally:
                    self._ops.close(wfd)
            else:
                n = self._ops.pwrite(log.fd, fields, fmt.HEADER_MAP_FIELDS_OFFSET)
            if n != 12:
                raise OSError(errno.EIO, f"short header write ({n} of 12 bytes)")
        except OSError as e:
            err = io_error(e, f"{log.path} offset {fmt.HEADER_MAP_FIELDS_OFFSET}")
            self.failure_count += 1
            self._abandon(log)
            raise err from None
        self._sync(log)
        self._policy.forget(log)
        if log.appender is not None:
            log.appender.close()
            log.appender = None
        os.close(log.fd)
        self.rotations += 1

    def flush(self) -> None:
        """Make every location handed out so far durable: write buffers, fsync the active log(s)."""
        with self._lock:
            self._check_open()
            logs = self._policy.logs()
            for log in logs:
                self._to_file(log)
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
                first_error = first_error or io_error(error, f"{log.path}: fsync")
            if first_error is not None:
                raise first_error

    def _fsync_quietly(self, log: ActiveLog) -> OSError | None:
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
            for log in self._policy.logs():
                self._seal(log)

    def rotate_ledger(self, ledger_id: int) -> bool:
        """Entry log per ledger: seal this ledger's active log (advisory "ledger closed").
        Returns whether a log was sealed; a no-op in the shared mode."""
        with self._lock:
            self._check_open()
            log = self._policy.log_of(ledger_id)
            if log is None:
                return False
            self._seal(log)
            return True

    def rotate_idle(self) -> int:
        """Entry log per ledger: seal the logs of mappings not accessed for ``access_expiry_s``
        (BookKeeper's access-expiry eviction); returns how many logs were sealed."""
        with self._lock:
            self._check_open()
            idle = self._policy.idle_logs()
            for log in idle:
                self._seal(log)
            return len(idle)

    def active_ledgers(self) -> dict[int, int]:
        """Entry log per ledger: ``{ledger_id: active log id}``."""
        with self._lock:
            return self._policy.ledgers()

    def _busy_ids(self) -> set[int]:
        """Active, preallocated and reserved ids. Caller holds ``_lock``."""
        return {log.log_id for log in self._policy.logs()} | self._allocator.busy_ids()

    def least_unflushed_log_id(self) -> int:
        """Logs below this id are sealed and safe for GC/compaction (BookKeeper's name)."""
        with self._lock:
            return min(self._busy_ids(), default=self._allocator.last_id + 1)

    def active_log_usage(self) -> list[tuple[int, int, dict[int, int]]]:
        """``(log id, bytes in the file, {ledger: record bytes})`` of every active log, as far
        as its records reached the file (buffered records are not on disk yet)."""
        with self._lock:
            return [(log.log_id, log.file_pos, dict(log.sizes)) for log in self._policy.logs()]

    def flushed_log_ids(self) -> list[int]:
        """Logs GC and compaction may read and delete: ``.log`` files that are not active, not
        reserved by preallocation and not being written by compaction (module docstring)."""
        with self._lock:
            return self._policy.flushed(self.log_ids(), self._busy_ids(), self._allocator.last_id + 1)

    def active_log_ids(self) -> list[int]:
        with self._lock:
            return [log.log_id for log in self._policy.logs()]

    # ------------------------------------------------------------------ compaction output

    def new_compaction_log(self, source_log_id: int) -> CompactionLog:
        """A new log for the live entries of ``source_log_id`` (see ``CompactionLog``)."""
        with self._lock:
            self._check_open()
            log_id = self._allocator.reserve()
            try:
                return CompactionLog(self, log_id, source_log_id)
            except BaseException:
                self._allocator.release(log_id)
                raise

    def _release_reserved(self, log_id: int) -> None:
        with self._lock:
            self._allocator.release(log_id)

    def compaction_files(self) -> tuple[list[Path], list[tuple[int, int, Path]]]:
        """Leftovers of interrupted compactions: ``*.log.compacting`` files, and
        ``(new_id, old_id, path)`` for every ``<new>.log.<old>.compacted`` marker."""
        compacting: list[Path] = []
        compacted: list[tuple[int, int, Path]] = []
        with self._lock:
            busy = self._allocator.reserved_ids()
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

    # ------------------------------------------------------------------ reads (EntryLogReader)

    def log_path(self, log_id: int) -> Path:
        return self._reader.log_path(log_id)

    def log_ids(self) -> list[int]:
        """Ids of the ``.log`` files in ``current/``, ascending (compaction temporaries excluded)."""
        return self._reader.log_ids()

    def read_entry(self, ledger_id: int, entry_id: int, location: int) -> bytes:
        """The entry stored at ``location``; the size and ids there must match the request."""
        return self._reader.read_entry(ledger_id, entry_id, location)

    def read_records(
        self, ledger_id: int, location: int, *, first_entry_id: int, stride: int, max_entries: int,
        max_bytes: int, first_counts: bool,
    ) -> RecordRun:
        """Entries ``first_entry_id, + stride, ...`` stored one after the other from
        ``location``, as offsets into few read buffers (``EntryLogReader.read_records``)."""
        return self._reader.read_records(ledger_id, location, first_entry_id=first_entry_id, stride=stride,
                                         max_entries=max_entries, max_bytes=max_bytes, first_counts=first_counts)

    def record_size(self, location: int) -> int | None:
        """Bytes the record at ``location`` occupies (size field included), or None if unreadable."""
        return self._reader.record_size(location)

    def _make_readable(self, log_id: int, end: int) -> None:
        """Bytes of the active log below ``end`` may still be buffered (or, direct, in its
        aligned tail): hand them to the file."""
        current = [log for log in self._policy.logs() if log.log_id == log_id]
        if current and current[0].on_file < end:
            with self._lock:
                for log in self._policy.logs():
                    if log.log_id == log_id and log.on_file < end:
                        self._to_file(log)

    def _readable_end(self, log_id: int) -> int | None:
        with self._lock:
            for log in self._policy.logs():
                if log.log_id == log_id:
                    return log.on_file
        return None

    def _log_end(self, log_id: int) -> int:
        with self._lock:
            for log in self._policy.logs():
                if log.log_id == log_id:
                    self._to_file(log)
                    return log.file_pos
        return self._reader.file_size(log_id)

    def scan(self, log_id: int, *, verify: fmt.VerifyFn | None = None) -> Iterator[fmt.LogRecord]:
        """Scan one log's records in file order (see ``EntryLogScanner``); the header is checked."""
        scanner = self.scanner(log_id, verify=verify)
        yield from scanner

    def scanner(
        self, log_id: int, *, verify: fmt.VerifyFn | None = None, skip_corrupt: bool = False
    ) -> fmt.EntryLogScanner:
        """A scanner over one log; its ``report`` says where it stopped (and, with
        ``skip_corrupt``, which unreadable spans it skipped) once iterated."""
        return self._reader.scanner(log_id, self._log_end(log_id), verify=verify, skip_corrupt=skip_corrupt)

    def ledgers_map(self, log_id: int) -> dict[int, int]:
        """``{ledger_id: bytes}`` of a log: the map at its end, else a full scan (BookKeeper's rule).

        For the active log: the in-memory map of what has been appended so far.
        """
        with self._lock:
            for log in self._policy.logs():
                if log.log_id == log_id:
                    sizes = dict(log.sizes)
                    for lid, size in log.buf_sizes.items():
                        sizes[lid] = sizes.get(lid, 0) + size
                    return sizes
        return self.log_info(log_id).ledgers

    def log_info(self, log_id: int) -> LogInfo:
        """Size and ledgers of one log, saying whether the ledgers map or a scan provided them."""
        with self._lock:
            active = log_id in [log.log_id for log in self._policy.logs()]
        if active:
            return LogInfo(log_id, self._log_end(log_id), self.ledgers_map(log_id), False, True)
        end = self._log_end(log_id)
        sizes, from_map = self._reader.ledgers_in(log_id, end)
        return LogInfo(log_id, end, sizes, from_map, False)

    def delete_log(self, log_id: int) -> None:
        """Remove a sealed log (GC/compaction). The active log cannot be deleted."""
        with self._lock:
            path = self.log_path(log_id)
            if log_id in self._allocator.reserved_ids():
                raise StorageError(f"{path}: cannot delete a log being written")
            if log_id in [log.log_id for log in self._policy.logs()]:
                raise StorageError(f"{path}: cannot delete the active entry log")
            if log_id == self._allocator.preallocated_id:
                raise StorageError(f"{path}: cannot delete the preallocated entry log")
            self._reader.close_log(log_id)
            try:
                remove_file(path, ops=self._ops)
            except OSError as e:
                raise io_error(e, f"{path}: delete") from None

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
                for log in self._policy.logs():
                    self._write_out(log)
                    if log.synced_pos < log.file_pos:
                        self._sync(log)
                    if log.appender is not None:
                        # a direct log ends in zero padding: cut it off (the size change made
                        # durable too), so the file is what buffered mode leaves
                        try:
                            if self._cut_padding(log):
                                self._ops.fsync(log.fd)
                        except OSError as e:
                            raise io_error(e, f"{log.path}: truncating padding") from None
            finally:
                self._closed = True
                for log in self._policy.logs():
                    self._abandon(log)
        self._allocator.close()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self._reader.close()

    def abandon(self) -> None:
        """What a killed process leaves: the files as written so far (records still buffered in
        memory are lost, nothing is fsynced), every descriptor closed as the OS closes them.
        Unusable afterwards. (The simulator's crash of a real bookie.)"""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for log in self._policy.logs():
                self._abandon(log)
        self._allocator.close()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self._reader.close()

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
        self._fd = self._ops.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
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
        try:
            write_all(self._fd, bytes(self._buf), self._ops)
        except OSError as e:
            raise io_error(e, f"{self.path}") from None
        self._buf.clear()

    def finish(self) -> None:
        """Seal + fsync the file, then make it ``<id>.log`` durably (module docstring order)."""
        map_offset = self._pos
        if self.sizes:
            self._buf += fmt.encode_ledgers_map(self.sizes)
        self._write_out()
        ops = self._ops
        try:
            ops.pwrite(
                self._fd,
                fmt.encode_header_map_fields(map_offset if self.sizes else 0, len(self.sizes)),
                fmt.HEADER_MAP_FIELDS_OFFSET,
            )
            ops.fsync(self._fd)
            ops.close(self._fd)
            self._fd = -1
            # Two names, one directory fsync: the marker (this compaction is unfinished) and
            # the log the index will point to.
            ops.rename(self.path, self.marker)
            ops.link(self.marker, self._logger.log_path(self.log_id))
            ops.fsync_dir(self._logger.current_dir)
        except OSError as e:
            raise io_error(e, f"{self.path}: finishing compaction output") from None
        finally:
            self._logger._release_reserved(self.log_id)

    def done(self) -> None:
        """The compaction is complete (index updated, source deleted): drop the marker."""
        try:
            remove_file(self.marker, ops=self._ops)
        except OSError as e:
            raise io_error(e, f"{self.marker}: delete") from None

    def abort(self) -> None:
        """Nothing points into an unfinished file: close and remove it."""
        if self._fd >= 0:
            self._ops.close(self._fd)
            self._fd = -1
            try:
                self._ops.unlink(self.path)
            except OSError:
                pass
        self._logger._release_reserved(self.log_id)
