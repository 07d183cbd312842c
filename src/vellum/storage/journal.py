"""The bookie journal: group commit of records into ``<dir>/current/<hex id>.txn`` files.

Responsibility: make journal records durable and call each record's callback once the fsync
that covers it has completed; replay journals from a ``LogMark``; roll and garbage-collect
journal files. The byte format lives in ``vellum.format.journal``.

Threads (one ``Journal`` per journal directory; instances are independent):

- callers (``log_entry`` & co.) encode the record and append it to a bounded queue
  (``journalQueueSize``; a full queue blocks the caller: back-pressure);
- the *writer* thread takes queued records, appends them to the current batch and flushes the
  batch when one of BookKeeper's four group-commit triggers fires: the oldest record waited
  ``journalMaxGroupWaitMSec``, ``journalBufferedWritesThreshold`` bytes or
  ``journalBufferedEntriesThreshold`` records (0 = off) are buffered, or the queue is empty and
  ``journalFlushWhenQueueEmpty`` is set. A flush appends the padding record carrying the batch
  checksum, ``os.pwrite``s the bytes and hands a force-write request to
  - the *force-write* thread, which coalesces every request waiting for it into one
    ``fdatasync``, advances ``current_mark()`` and then runs the callbacks. The writer keeps
    writing the next batch while an fsync runs. With ``journalRemoveFromPageCache`` it then
    drops the synced pages from the OS page cache (``POSIX_FADV_DONTNEED``, whole MiBs, one MiB
    behind the mark so the page being appended to stays): only replay reads them, and freed
    pages are reused by the next writes instead of the cache growing over fresh memory.

Invariants:

- A callback runs with ``None`` only after the fdatasync covering its record returned
  (``journalSyncData=false`` skips the fsync, as BookKeeper does: never in production).
- Fail-stop: after a failed write or fsync every pending and every later record's callback
  gets a ``StorageError`` naming the file; nothing is retried and acknowledged.
- ``current_mark()`` only moves forward and always sits at a batch boundary.
- A non-last journal ends cleanly: a roll waits until the old file is fsynced before the new
  file exists, new files appear atomically (written as ``.txn.tmp``, fsynced, renamed, directory
  fsynced), and ``start()`` truncates the torn tail of the previous last journal (never-acked
  bytes) before opening a new one. Replay therefore treats a bad record in a non-last journal
  as corruption and one in the last journal as the torn tail of a crash.
- ``gc_journals`` never deletes the current journal or any journal at or above the mark.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from vellum.errors import CorruptionError, StorageError
from vellum.format.journal import (
    CURRENT_JOURNAL_VERSION,
    V5,
    V6,
    JournalRecord,
    JournalScanner,
    RecordKind,
    ScanStop,
    batch_crc,
    encode_explicit_lac,
    encode_fence,
    encode_header,
    encode_master_key,
    encode_padding,
    entry_prefix,
)
from vellum.format.lastmark import ZERO_MARK, LogMark

log = logging.getLogger(__name__)

Callback = Callable[[BaseException | None], None]

_JOURNAL_NAME = re.compile(r"^([0-9a-f]+)\.txn$")
_ZERO_VIEW = memoryview(bytes(1 << 20))  # slices of it are not copies
_MB = 1 << 20


def _write_zeros(fd: int, start: int, end: int) -> None:
    """Overwrite ``[start, end)`` of ``fd`` with zeros (raises OSError)."""
    pos = start
    while pos < end:
        pos += os.pwrite(fd, _ZERO_VIEW[: min(len(_ZERO_VIEW), end - pos)], pos)


def _no_fsync(fd: int) -> None:
    del fd


def journal_file_name(journal_id: int) -> str:
    """BookKeeper's name: ``Long.toHexString(id) + ".txn"``."""
    return f"{journal_id:x}.txn"


def list_journal_ids(current_dir: Path) -> list[int]:
    """Ids of the ``<hex id>.txn`` files in a journal's ``current`` directory, ascending."""
    try:
        names = os.listdir(current_dir)
    except FileNotFoundError:
        return []
    ids = []
    for name in names:
        m = _JOURNAL_NAME.match(name)
        if m:
            ids.append(int(m.group(1), 16))
    return sorted(ids)


class _ZeroFiller:
    """Zero-fills the current journal file ahead of the writer, on a thread of its own.

    The writer only writes below ``end`` (bytes already zeroed *and* fdatasynced), the filler
    only at or above it, so they never touch the same bytes. Filling and syncing ahead keeps
    both off the add path: without it every ``journalPreAllocSizeMB`` of journal the writer
    stopped to write the zeros, and the next group commit's fdatasync flushed them (tens of
    ms for 16 MB), a latency spike for every add waiting on that fsync.

    The filler works on its own ``dup`` of the file descriptor, so a roll that closes the
    writer's descriptor can never make it write into another file that reused the number.

    Zeros or ``fallocate``: overwriting written blocks makes each fdatasync cheaper (1 KiB adds,
    64 in flight: p50 1.50 vs 1.62 ms, p99 3.6 vs 3.7 ms, 5% more adds/s), but writing the zeros
    costs as much as the data. Past ``FALLOCATE_ABOVE_BYTES_PER_S`` of journal (big entries:
    128 KiB adds ran 20% faster on 25% less bookie CPU), or when group commits average
    ``FALLOCATE_ABOVE_BYTES_PER_SYNC`` (the extent conversion is then a small part of each
    fsync; a Spark sink's 128 KiB entries at ~90 MB/s made the zeros a fifth of the bookie's
    write cost), the filler allocates instead.
    """

    #: journal write rate above which space is allocated rather than zero-filled
    FALLOCATE_ABOVE_BYTES_PER_S = 96 * _MB
    #: average bytes per group commit above which space is allocated rather than zero-filled
    FALLOCATE_ABOVE_BYTES_PER_SYNC = 512 * 1024

    def __init__(self, name: str, step: int, fsync: Callable[[int], None]) -> None:
        self._step = step
        self._fsync = fsync
        self._cond = threading.Condition()
        self._fd = -1
        self._end = 0  # zeroed and synced up to here (filler publishes, writer reads)
        self._want = 0
        self._error: OSError | None = None
        self._stop = False
        self._retired: list[int] = []
        self._rate_mark = (time.monotonic(), 0)  # (when, wanted end) of the last rate sample
        self.rate_bytes_per_s = 0.0
        self.bytes_per_sync = 0.0  # smoothed group-commit size, kept by the force-write thread
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def reset(self, fd: int, end: int) -> None:
        """Follow a new file whose bytes below ``end`` are already zeroed and synced."""
        new_fd = os.dup(fd)
        with self._cond:
            old, self._fd = self._fd, new_fd
            self._end = self._want = end
            self._error = None
            self._cond.notify_all()
        if old >= 0:
            self._close_later(old)

    def _close_later(self, fd: int) -> None:
        # The filler may be writing through ``fd`` right now (outside the lock): it closes
        # descriptors it no longer follows itself, after its current chunk.
        with self._cond:
            self._retired.append(fd)
            self._cond.notify_all()

    def extend(self, upto: int) -> int:
        """Ask for zeros two steps past ``upto``; wait only until ``upto`` itself is covered.

        Returns the covered end. Raises the filler's ``OSError`` (ENOSPC...) if it failed.
        """
        step = self._step
        with self._cond:
            want = (upto + step - 1) // step * step + step
            if want > self._want:
                self._want = want
                self._cond.notify_all()
            while self._end < upto and self._error is None and not self._stop:
                self._cond.wait()
            if self._error is not None:
                raise self._error
            if self._end < upto:
                raise OSError(f"journal zero-filler stopped before offset {upto}")
            return self._end

    def _sample_rate(self, want: int) -> None:
        """How fast the writer asks for space (bytes/s, smoothed). Caller holds the lock."""
        now = time.monotonic()
        when, wanted = self._rate_mark
        if want < wanted:  # a new file: start over
            self._rate_mark = (now, want)
            return
        if now - when >= 0.05 and want > wanted:
            rate = (want - wanted) / (now - when)
            self.rate_bytes_per_s = rate if self.rate_bytes_per_s == 0 else 0.5 * (self.rate_bytes_per_s + rate)
            self._rate_mark = (now, want)

    def allocates(self) -> bool:
        """Whether the space ahead is allocated (``fallocate``) rather than zero-filled."""
        return (self.rate_bytes_per_s > self.FALLOCATE_ABOVE_BYTES_PER_S
                or self.bytes_per_sync > self.FALLOCATE_ABOVE_BYTES_PER_SYNC)

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join()

    def _run(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while not self._stop and not self._retired and (self._want <= self._end or self._error):
                    cond.wait()
                retired, self._retired = self._retired, []
                if self._stop:
                    retired.append(self._fd)
                    self._fd = -1
                fd, start, want, failed = self._fd, self._end, self._want, self._error is not None
                self._sample_rate(want)
            for old in retired:
                if old >= 0:
                    os.close(old)
            if fd < 0 and self._stop:
                return
            if fd < 0 or failed:
                continue  # nothing to follow, or failed until the next reset
            # 1 MB at a time, each synced before the next: a 16 MB burst of dirty zeros in the
            # device queue delayed the journal's own fdatasync by tens of ms.
            pos = start
            while pos < want:
                end = min(want, pos + len(_ZERO_VIEW))
                try:
                    if self.allocates():
                        os.posix_fallocate(fd, pos, end - pos)
                    else:
                        _write_zeros(fd, pos, end)
                    self._fsync(fd)
                except OSError as e:
                    with cond:
                        if fd == self._fd:
                            self._error = e
                        cond.notify_all()
                    break
                pos = end
                with cond:
                    if fd != self._fd or self._stop:
                        break
                    self._end = pos
                    cond.notify_all()


class _SyncProgress:
    """Where each fdatasync left the current journal file (force-write thread only).

    It measures the group commits (bytes covered per fsync, smoothed, for the zero filler's
    choice) and, with ``journalRemoveFromPageCache``, drops the fsynced pages from the OS page
    cache a MiB at a time. Dropped clean pages are freed at once, so the next journal (and entry
    log) writes reuse them rather than taking never-touched memory, which on a VM can cost ten
    times the copy (the host backs it on first touch). The MiB below the mark stays: the writer
    appends into its last page.
    """

    _STEP = 1 << 20

    def __init__(self, drop_pages: bool) -> None:
        self._drop = drop_pages
        self._file = (-1, -1)  # (fd, journal id): a new file may reuse the old one's fd
        self._end = 0
        self._dropped = 0
        self.bytes_per_sync = 0.0

    def synced(self, fd: int, journal_id: int, end: int) -> None:
        if (fd, journal_id) != self._file:
            self._file, self._dropped = (fd, journal_id), 0
        else:
            size = end - self._end
            bps = self.bytes_per_sync
            self.bytes_per_sync = float(size) if bps == 0 else 0.8 * bps + 0.2 * size
        self._end = end
        upto = (end // self._STEP - 1) * self._STEP
        if self._drop and upto > self._dropped:
            try:
                os.posix_fadvise(fd, self._dropped, upto - self._dropped, os.POSIX_FADV_DONTNEED)
            except OSError as e:  # advisory: the journal is intact whatever the cache holds
                log.debug("journal page-cache drop failed on fd %d: %s", fd, e)
            self._dropped = upto


class JournalFile:
    """A read-only journal file for scanning: ``with JournalFile(path) as jf: for r in jf.scan(): ...``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._fd = os.open(path, os.O_RDONLY)
        except OSError as e:
            raise StorageError(f"cannot open journal {path}: {e.strerror}") from None

    def read(self, offset: int, n: int) -> bytes:
        try:
            return os.pread(self._fd, n, offset)
        except OSError as e:
            raise StorageError(f"cannot read journal {self.path} at offset {offset}: {e.strerror}") from None

    def scanner(self, start: int | None = None) -> JournalScanner:
        return JournalScanner(self.read, start=start, where=str(self.path))

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> JournalFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True, slots=True)
class JournalReplay:
    """What replay found in one journal file."""

    journal_id: int
    path: Path
    start: int
    records: int
    stop: ScanStop


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """Outcome of ``Journal.replay``: per-file results, totals, and where valid data ends."""

    journals: list[JournalReplay] = field(default_factory=list)
    records: int = 0
    #: records with an unknown negative entry id (skipped, as BookKeeper does)
    skipped: int = 0

    @property
    def end_mark(self) -> LogMark | None:
        """The position after the last valid record of the last journal (None: no journal)."""
        if not self.journals:
            return None
        last = self.journals[-1]
        return LogMark(last.journal_id, last.stop.valid_end)

    @property
    def torn_tail(self) -> bool:
        return bool(self.journals) and not self.journals[-1].stop.clean


class _Queue:
    """A bounded multi-producer queue from which one consumer takes everything at once."""

    def __init__(self, capacity: int) -> None:
        self.items: deque[object] = deque()
        self.capacity = capacity
        self.closed = False
        self._consumer_waiting = False
        self._lock = threading.Lock()
        self._not_empty = threading.Condition(self._lock)
        self._not_full = threading.Condition(self._lock)

    def put(self, item: object) -> None:
        with self._lock:
            items = self.items
            while len(items) >= self.capacity and not self.closed:
                self._not_full.wait()
            items.append(item)
            if self._consumer_waiting:
                self._consumer_waiting = False
                self._not_empty.notify()

    def put_many(self, batch: list[object]) -> None:
        """Append a batch under one lock acquisition (waits while the queue is full; a batch
        larger than the capacity goes in once the queue is empty)."""
        with self._lock:
            items = self.items
            while items and len(items) + len(batch) > self.capacity and not self.closed:
                self._not_full.wait()
            items.extend(batch)
            if self._consumer_waiting:
                self._consumer_waiting = False
                self._not_empty.notify()

    def take_all(self, timeout: float | None) -> list[object]:
        """Everything queued; waits up to ``timeout`` (None: until something or close)."""
        with self._lock:
            if not self.items and not self.closed:
                if timeout is None:
                    while not self.items and not self.closed:
                        self._consumer_waiting = True
                        self._not_empty.wait()
                elif timeout > 0:
                    self._consumer_waiting = True
                    self._not_empty.wait(timeout)
                self._consumer_waiting = False
            out = list(self.items)
            self.items.clear()
            if out:
                self._not_full.notify_all()
            return out

    def close(self) -> None:
        with self._lock:
            self.closed = True
            self._not_empty.notify_all()
            self._not_full.notify_all()


@dataclass(slots=True)
class _ForceRequest:
    fd: int
    path: Path
    journal_id: int
    end: int
    callbacks: list[Callback | None]
    close_fd: bool = False
    done: threading.Event | None = None
    last: bool = False


_SHUTDOWN = object()
#: a queued record: (encoded record, callback, enqueue time)
#: (record body, callback, enqueue time, prefix written before the body: a client entry's
#: 4-byte length, so the entry is copied once, into the batch, instead of first into a record)
_Item = tuple[bytes, Callback | None, float, bytes]


class Journal:
    """One journal directory: writer + force-write threads, replay, roll and GC.

    ``fsync`` (default ``os.fdatasync``) and ``clock`` are injectable for tests.
    """

    def __init__(
        self,
        journal_dir: Path,
        index: int = 0,
        *,
        max_group_wait_ms: float = 2,
        buffered_writes_threshold: int = 524288,
        buffered_entries_threshold: int = 0,
        flush_when_queue_empty: bool = False,
        max_size_mb: int = 2048,
        max_backups: int = 5,
        prealloc_size_mb: int = 16,
        alignment: int = 512,
        format_version: int = CURRENT_JOURNAL_VERSION,
        sync_data: bool = True,
        queue_size: int = 10000,
        write_buffer_size_kb: int = 64,
        prealloc_zero: bool = True,
        remove_from_page_cache: bool = True,
        fsync: Callable[[int], None] = os.fdatasync,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        encode_header(format_version)  # validates the version early (UnknownFormatVersionError)
        if alignment < 16:
            raise ValueError(f"journal alignment {alignment} must be at least 16 bytes")
        self.journal_dir = Path(journal_dir)
        # Group-commit efficiency (records per fsync), read by the bookie's metrics at scrape
        # time; only the force-write thread writes them.
        self.fsyncs_total = 0
        self.records_synced_total = 0
        self.current_dir = self.journal_dir / "current"
        self.index = index
        self._max_wait = max(0.0, max_group_wait_ms) / 1000.0
        self._bytes_threshold = buffered_writes_threshold
        self._entries_threshold = buffered_entries_threshold
        self._flush_when_empty = flush_when_queue_empty
        self._max_size = max_size_mb * _MB
        self.max_backups = max_backups
        self._prealloc_step = max(prealloc_size_mb * _MB, alignment)
        self._alignment = alignment
        self.format_version = format_version
        self._sync_data = sync_data
        self._write_buffer = max(write_buffer_size_kb, 1) * 1024
        self._prealloc_zero = prealloc_zero
        self._drop_cache = remove_from_page_cache
        self._fsync = fsync
        self._clock = clock
        self._queue = _Queue(queue_size)
        self._force_queue = _Queue(1 << 62)
        self._error: StorageError | None = None
        self._mark = ZERO_MARK
        self._started = False
        self._stopped = False
        self._writer: threading.Thread | None = None
        self._forcer: threading.Thread | None = None
        # state owned by the writer thread once started
        self._fd = -1
        self._journal_id = -1
        self._path = Path()
        self._pos = 0
        self._prealloc_end = 0
        self._filler: _ZeroFiller | None = None
        self._header_size = 0
        # what replay learnt about the last journal: (id, stop) so start() can seal its tail
        self._replayed_tail: tuple[int, ScanStop] | None = None

    # ------------------------------------------------------------------ properties

    @property
    def current_journal_id(self) -> int:
        """Id of the journal file being written (-1 before ``start``)."""
        return self._journal_id

    @property
    def current_path(self) -> Path:
        return self._path

    @property
    def failed(self) -> StorageError | None:
        """The error that stopped this journal (fail-stop), or None."""
        return self._error

    def journal_path(self, journal_id: int) -> Path:
        return self.current_dir / journal_file_name(journal_id)

    def journal_ids(self) -> list[int]:
        return list_journal_ids(self.current_dir)

    def current_mark(self) -> LogMark:
        """Everything written before this position has been fsynced (moves forward only)."""
        return self._mark

    # ------------------------------------------------------------------ replay

    def replay(self, mark: LogMark, on_record: Callable[[JournalRecord], None]) -> ReplayResult:
        """Feed every valid record at or after ``mark`` to ``on_record``, in journal order.

        Records with unknown negative entry ids are skipped. A bad record ends the replay: in
        the last journal it is the torn tail of a crash (reported in the result); in an earlier
        journal it is ``CorruptionError`` naming the file and offset. A missing marked journal
        is ``CorruptionError`` (fail-stop), except for the zero mark of a fresh bookie.
        """
        all_ids = self.journal_ids()
        ids = [i for i in all_ids if i >= mark.journal_id]
        if mark != ZERO_MARK and mark.journal_id not in ids:
            raise CorruptionError(
                f"journal {self.journal_path(mark.journal_id)} named by lastMark {mark} is missing "
                f"(journals present: {', '.join(journal_file_name(i) for i in all_ids) or 'none'})"
            )
        journals: list[JournalReplay] = []
        total = skipped = 0
        for n, journal_id in enumerate(ids):
            path = self.journal_path(journal_id)
            start = mark.offset if journal_id == mark.journal_id else None
            count = 0
            with JournalFile(path) as jf:
                scanner = jf.scanner(start)
                for record in scanner:
                    if record.kind is RecordKind.OTHER:
                        skipped += 1
                        continue
                    on_record(record)
                    count += 1
            stop = scanner.stop
            assert stop is not None
            total += count
            journals.append(JournalReplay(journal_id, path, scanner.start, count, stop))
            if not stop.clean:
                if n != len(ids) - 1:
                    raise CorruptionError(
                        f"{stop.describe(str(path))}; it is not the last journal, so this is "
                        "corruption, not a torn tail"
                    )
                log.warning("journal %s: torn tail ignored: %s", path, stop.describe(str(path)))
        if ids:
            self._replayed_tail = (ids[-1], journals[-1].stop)
        return ReplayResult(journals, total, skipped)

    # ------------------------------------------------------------------ garbage collection

    def gc_journals(self, mark: LogMark) -> list[Path]:
        """Delete journals below ``mark.journal_id``, keeping the newest ``max_backups`` of them.

        Never deletes the current journal or any journal at or above the mark (rule 7: journals
        are deleted only below a persisted mark). Returns the deleted paths.
        """
        below = [i for i in self.journal_ids() if i < mark.journal_id and i != self._journal_id]
        victims = below[: len(below) - self.max_backups] if self.max_backups > 0 else below
        deleted = []
        for journal_id in victims:
            path = self.journal_path(journal_id)
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            except OSError as e:
                raise StorageError(f"cannot delete journal {path}: {e.strerror}") from None
            deleted.append(path)
        if deleted:
            log.info("journal %d: deleted %d journal(s) below %s", self.index, len(deleted), mark)
        return deleted

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Open a new journal file (max existing id + 1, or the time in ms) and start the threads."""
        if self._started:
            raise StorageError(f"journal {self.journal_dir} already started")
        try:
            self.current_dir.mkdir(parents=True, exist_ok=True)
            for name in os.listdir(self.current_dir):
                if name.endswith(".txn.tmp"):  # a file creation interrupted by a crash
                    (self.current_dir / name).unlink()
            ids = self.journal_ids()
            if ids:
                self._seal(ids[-1])
            new_id = ids[-1] + 1 if ids else int(time.time() * 1000)
            self._open_new(new_id)
        except OSError as e:
            raise StorageError(f"cannot start journal in {self.current_dir}: {e}") from e
        self._mark = LogMark(self._journal_id, self._pos)
        self._started = True
        self._writer = threading.Thread(
            target=self._writer_loop, name=f"journal-{self.index}-writer", daemon=True
        )
        self._forcer = threading.Thread(
            target=self._force_loop, name=f"journal-{self.index}-force-write", daemon=True
        )
        self._forcer.start()
        self._writer.start()

    def shutdown(self) -> None:
        """Flush and fsync what is queued, run its callbacks, stop the threads, close the file."""
        if not self._started or self._stopped:
            self._stopped = True
            return
        self._stopped = True
        self._queue.put(_SHUTDOWN)
        assert self._writer is not None and self._forcer is not None
        self._writer.join()
        self._forcer.join()
        if self._filler is not None:
            self._filler.stop()

    def _seal(self, journal_id: int) -> None:
        """Cut the torn tail of the previous last journal so it ends cleanly as a non-last one.

        The bytes after the last valid batch were never acknowledged (a batch is acked only
        after the fsync that covers its checksum).
        """
        known = self._replayed_tail
        path = self.journal_path(journal_id)
        if known is not None and known[0] == journal_id:
            stop = known[1]
        else:
            with JournalFile(path) as jf:
                scanner = jf.scanner()
                for _ in scanner:
                    pass
                assert scanner.stop is not None
                stop = scanner.stop
        if stop.clean:
            return
        log.warning("journal %s: truncating torn tail: %s", path, stop.describe(str(path)))
        fd = os.open(path, os.O_RDWR)
        try:
            os.ftruncate(fd, stop.valid_end)
            os.fsync(fd)
        finally:
            os.close(fd)

    def _open_new(self, journal_id: int) -> None:
        """Create ``<hex id>.txn`` atomically: header + first preallocation, fsynced, renamed."""
        path = self.journal_path(journal_id)
        tmp = path.with_name(path.name + ".tmp")
        header = encode_header(self.format_version)
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            self._fd = fd
            self._pos = 0
            self._prealloc_end = 0
            self._write(header)
            self._fill_sync(len(header))
            os.fsync(fd)
            if self._prealloc_zero:
                if self._filler is None:
                    self._filler = _ZeroFiller(f"journal-{self.index}-zero-fill", self._prealloc_step,
                                               os.fdatasync if self._sync_data else _no_fsync)
                self._filler.reset(fd, self._prealloc_end)
            os.rename(tmp, path)
            dfd = os.open(self.current_dir, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except BaseException:
            os.close(fd)
            self._fd = -1
            raise
        self._journal_id = journal_id
        self._path = path
        self._header_size = len(header)
        log.info("journal %d: writing %s", self.index, path)

    # ------------------------------------------------------------------ adding records

    def log_entry(self, ledger_id: int, entry_id: int, entry: bytes, callback: Callback) -> None:
        """Journal a stored client entry (which starts with ``ledger_id``, ``entry_id``)."""
        del ledger_id, entry_id  # they are the entry's first 16 bytes; kept for BookKeeper's API
        self.log_entries((entry,), callback)

    def log_entries(self, entries: Sequence[bytes | bytearray | memoryview], callback: Callback) -> None:
        """Journal several stored entries at once (one queue operation); ``callback`` runs once,
        after the fsync that covers the last of them (and so all of them: records are written
        and fsynced in queue order, and a journal that fails fails every later record)."""
        if not self._started or self._stopped:
            raise StorageError(f"journal {self.journal_dir} is not running")
        if not entries:
            raise ValueError("log_entries needs at least one entry")
        now = self._clock()
        items: list[object] = [(entry, None, now, entry_prefix(entry)) for entry in entries]
        items[-1] = (entries[-1], callback, now, entry_prefix(entries[-1]))
        self._queue.put_many(items)

    def log_master_key(self, ledger_id: int, key: bytes, callback: Callback) -> None:
        self._enqueue(encode_master_key(ledger_id, key), callback)

    def log_fence(self, ledger_id: int, callback: Callback) -> None:
        self._enqueue(encode_fence(ledger_id), callback)

    def log_explicit_lac(self, ledger_id: int, lac_body: bytes, callback: Callback) -> None:
        # Versions below 6 have no explicit-LAC record: BookKeeper drops it but still acks
        # after the next flush; an empty record does the same here.
        record = encode_explicit_lac(ledger_id, lac_body) if self.format_version >= V6 else b""
        self._enqueue(record, callback)

    def _enqueue(self, record: bytes, callback: Callback) -> None:
        if not self._started or self._stopped:
            raise StorageError(f"journal {self.journal_dir} is not running")
        self._queue.put((record, callback, self._clock(), b""))

    # ------------------------------------------------------------------ writer thread

    def _write(self, data: bytes | bytearray | memoryview) -> None:
        """Write ``data`` at the current position (raises OSError)."""
        view = memoryview(data)
        pos = self._pos
        while view:
            n = os.pwrite(self._fd, view, pos)
            pos += n
            view = view[n:]
        self._pos = pos

    def _extend(self, upto: int) -> None:
        """Make sure the file is preallocated past ``upto`` before the writer writes there.

        Zero-filled by default: overwriting written blocks makes fdatasync cheaper than writing
        into holes or fallocated extents (benchmarking.md). The zero-filler thread keeps about
        two ``journalPreAllocSizeMB`` steps zeroed and synced ahead, so the writer waits only
        if it catches up. ``prealloc_zero=False`` extends the size only, as BookKeeper does.
        """
        if upto + self._prealloc_step <= self._prealloc_end:
            return
        if self._filler is not None:
            self._prealloc_end = self._filler.extend(upto)
            return
        self._fill_sync(upto)

    def _fill_sync(self, upto: int) -> None:
        """Preallocate past ``upto`` on the calling thread (journalPreAllocSizeMB steps)."""
        if upto <= self._prealloc_end:
            return
        new_end = self._prealloc_end + self._prealloc_step
        while new_end < upto:
            new_end += self._prealloc_step
        if self._prealloc_zero:
            _write_zeros(self._fd, max(self._prealloc_end, self._pos), new_end)
        else:
            os.ftruncate(self._fd, new_end)
        self._prealloc_end = new_end

    def _writer_loop(self) -> None:
        take = self._queue.take_all
        clock = self._clock
        buf = bytearray()
        callbacks: list[Callback | None] = []
        crc = 0
        batch_bytes = 0
        oldest = 0.0
        max_wait = self._max_wait
        bytes_threshold = self._bytes_threshold
        entries_threshold = self._entries_threshold
        write_buffer = self._write_buffer
        queue_items = self._queue.items
        shutting_down = False

        def flush() -> None:
            nonlocal buf, crc, batch_bytes
            try:
                if self._error is None:
                    if self.format_version >= V5:
                        crc = batch_crc(buf, crc)
                        buf += encode_padding(self._pos + len(buf), self._alignment, crc)
                    self._extend(self._pos + len(buf))
                    self._write(buf)
            except OSError as e:
                self._fail(f"write of journal {self._path} failed at offset {self._pos}", e)
            self._force_queue.put(
                _ForceRequest(self._fd, self._path, self._journal_id, self._pos, callbacks.copy())
            )
            buf = bytearray()
            callbacks.clear()
            crc = 0
            batch_bytes = 0
            if self._pos >= self._max_size and self._error is None:
                self._roll()

        while True:
            timeout = None if not callbacks else max(0.0, oldest + max_wait - clock())
            items = take(timeout)
            for item in items:
                if item is _SHUTDOWN:
                    shutting_down = True
                    continue
                record, callback, enqueued, prefix = cast(_Item, item)
                if not callbacks:
                    oldest = enqueued
                if prefix:
                    buf += prefix
                    batch_bytes += len(prefix)
                buf += record
                batch_bytes += len(record)
                callbacks.append(callback)
                if len(buf) >= write_buffer and self._error is None:
                    # Like BookKeeper's BufferedChannel: hand full buffers to the OS early,
                    # without padding; the batch checksum runs over the pieces.
                    try:
                        crc = batch_crc(buf, crc)
                        self._extend(self._pos + len(buf))
                        self._write(buf)
                    except OSError as e:
                        self._fail(f"write of journal {self._path} failed at offset {self._pos}", e)
                    buf = bytearray()
                if (bytes_threshold and batch_bytes >= bytes_threshold) or (
                    entries_threshold and len(callbacks) >= entries_threshold
                ):
                    flush()
            if callbacks and (
                shutting_down or clock() - oldest >= max_wait or (self._flush_when_empty and not queue_items)
            ):
                flush()
            if shutting_down:
                self._force_queue.put(
                    _ForceRequest(
                        self._fd, self._path, self._journal_id, self._pos, [], close_fd=True, last=True
                    )
                )
                # records enqueued after the shutdown marker (a race with shutdown()) must not hang
                for item in take(0):
                    late = None if item is _SHUTDOWN else cast(_Item, item)[1]
                    if late is not None:
                        late(StorageError(f"journal {self._path} was shut down"))
                self._queue.close()
                return

    def _roll(self) -> None:
        """Start file id+1 once the old file is fsynced and closed (so it ends cleanly)."""
        done = threading.Event()
        self._force_queue.put(
            _ForceRequest(self._fd, self._path, self._journal_id, self._pos, [], close_fd=True, done=done)
        )
        done.wait()
        if self._error is not None:
            self._fd = -1
            return
        try:
            self._open_new(self._journal_id + 1)
        except OSError as e:
            self._fail(f"cannot roll journal {self._path} to id {self._journal_id + 1:x}", e)

    def _fail(self, what: str, exc: OSError) -> StorageError:
        if self._error is None:
            self._error = StorageError(f"{what}: {exc}")
            log.error("journal %d failed (fail-stop): %s", self.index, self._error)
        return self._error

    # ------------------------------------------------------------------ force-write thread

    def _force_loop(self) -> None:
        take = self._force_queue.take_all
        progress = _SyncProgress(self._drop_cache and self._sync_data)  # only clean pages drop
        while True:
            requests: list[_ForceRequest] = take(None)  # type: ignore[assignment]
            i = 0
            while i < len(requests):
                # coalesce consecutive requests on the same file into one fdatasync
                j = i + 1
                while j < len(requests) and requests[j].fd == requests[i].fd:
                    j += 1
                group = requests[i:j]
                i = j
                last = group[-1]
                if self._error is None and self._sync_data and last.fd >= 0:
                    try:
                        self._fsync(last.fd)
                        self.fsyncs_total += 1
                    except OSError as e:
                        self._fail(f"fsync of journal {last.path} failed up to offset {last.end}", e)
                error = self._error
                if error is None:
                    self._mark = LogMark(last.journal_id, last.end)
                    self.records_synced_total += sum(len(r.callbacks) for r in group)
                    if last.fd >= 0:
                        progress.synced(last.fd, last.journal_id, last.end)
                        if self._filler is not None:
                            self._filler.bytes_per_sync = progress.bytes_per_sync
                for request in group:
                    for callback in request.callbacks:
                        if callback is None:  # a record of a batch whose callback rides on its last
                            continue
                        try:
                            callback(error)
                        except Exception:
                            log.exception("journal %d: callback failed", self.index)
                for request in group:
                    if request.close_fd and request.fd >= 0:
                        os.close(request.fd)
                    if request.done is not None:
                        request.done.set()
                    if request.last:
                        return
