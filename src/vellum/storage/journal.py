"""The bookie journal: group commit of records into ``<dir>/current/<hex id>.txn`` files.

Responsibility: make journal records durable and call each record's callback once the fsync
that covers it has completed; replay journals from a ``LogMark``; roll and garbage-collect
journal files. The byte format lives in ``vellum.format.journal``; naming, reading and replaying
the files on disk in ``storage/journal_files.py``; the file being written (created, sealed,
preallocated, written to, buffered or direct) in ``storage/journal_file_writer.py``: this module
keeps the queue, the group commit, the fsync hand-over and the marks.

Threads (one ``Journal`` per journal directory; instances are independent):

- callers (``log_entry`` & co.) encode the record and append it to a bounded queue
  (``journalQueueSize`` records; a full queue blocks the caller: back-pressure); a batch of
  client entries (``log_batch``: the entries column of the bookie's admitted ``AddBatch``, as it
  is) is one queue item with one callback;
- the *writer* thread takes queued records, appends them to the current batch and flushes the
  batch when one of BookKeeper's four group-commit triggers fires: the oldest record waited
  ``journalMaxGroupWaitMSec``, ``journalBufferedWritesThreshold`` bytes or
  ``journalBufferedEntriesThreshold`` records (0 = off) are buffered, or the queue is empty and
  ``journalFlushWhenQueueEmpty`` is set. A flush appends the padding record carrying the batch
  checksum, ``os.pwrite``s the bytes and then, by default (``sync_in_writer``), itself
  ``fdatasync``s, advances ``current_mark()`` and runs the callbacks; records queued meanwhile
  form the next batch (one thread hand-off fewer per group commit). The batches that the byte or
  entry threshold cuts out of one take of the queue are written as they fill and fsynced together
  once that take is written (one ``fdatasync`` for all of them: a writer pipelining big entries
  would otherwise wait for one fsync per ``journalBufferedWritesThreshold`` bytes). With
  ``sync_in_writer=False`` (``journalForceWriteThread``, BookKeeper's structure) it hands a
  force-write request to
  - the *force-write* thread, which coalesces every request waiting for it into one
    ``fdatasync``, advances ``current_mark()`` and then runs the callbacks, while the writer
    writes the next batch. Either way, with ``journalRemoveFromPageCache`` the syncing thread then
    drops the synced pages from the OS page cache (``POSIX_FADV_DONTNEED``, whole MiBs, one MiB
    behind the mark so the page being appended to stays): only replay reads them, and freed
    pages are reused by the next writes instead of the cache growing over fresh memory;
- the *zero-fill* thread keeps the space ahead of the writer zeroed and synced. It and the
  page-cache drop live in ``storage/journal_pages.py`` (``ZeroFiller``, ``SyncProgress``).

Direct I/O (``direct_io``, ``journalDirectIO``): each new file is created and its header and
first preallocation written and fsynced as usual, then reopened with ``O_DIRECT`` and its first
block written again through that descriptor (the probe: the filesystem and the device take
``journalAlignmentSize``). From then on the writer copies its batches into a reused
page-aligned buffer (``direct_io.AlignedAppender``) and writes only whole aligned blocks:
a ``journalWriteBufferSizeKB`` hand-over (at least ``DIRECT_MIN_WRITE_BYTES``: a direct write
waits for the device, small ones are slow) writes the whole blocks and keeps the partial last
one in memory, and every flush ends on an aligned boundary anyway (the padding record), so a flush
writes everything. The zero filler writes its zeros through the same descriptor from an aligned
buffer. fdatasync stays: ``O_DIRECT`` skips the page cache, it does not make data durable. A
filesystem that refuses ``O_DIRECT`` (``EINVAL`` at open or at the probe) makes the journal log
a warning naming the directory and the reason and write buffered from then on; any other error
is an I/O error as in buffered mode. The bytes on disk are the same in both modes.

Invariants:

- A callback runs with ``None`` only after the fdatasync covering its record returned
  (``journalSyncData=false`` skips the fsync, as BookKeeper does: never in production).
- Fail-stop: after a failed write or fsync every pending and every later record's callback
  gets a ``StorageError`` naming the file; nothing is retried and acknowledged.
- ``current_mark()`` only moves forward and always sits at a batch boundary.
- A non-last journal ends cleanly: a roll waits until the old file is fsynced before the new
  file exists, new files appear atomically (written as ``.txn.tmp`` and fsynced, then renamed
  and the directory fsynced by ``durable.publish``), and ``start()`` truncates the torn tail of
  the previous last journal (never-acked bytes) before opening a new one. Replay therefore
  treats a bad record in a non-last journal as corruption and one in the last journal as the
  torn tail of a crash.
- ``gc_journals`` never deletes the current journal or any journal at or above the mark.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from vellum.errors import StorageError
from vellum.format.journal import (
    CURRENT_JOURNAL_VERSION,
    V5,
    V6,
    JournalRecord,
    ScanStop,
    batch_crc,
    encode_explicit_lac,
    encode_fence,
    encode_header,
    encode_master_key,
    encode_padding,
)
from vellum.format.lastmark import ZERO_MARK, LogMark
from vellum.proto.messages import AddBatch
from vellum.storage import direct_io as dio
from vellum.storage.durable import OS_FILE_OPS, TMP_SUFFIX, FileOps
from vellum.storage.journal_file_writer import JournalFileWriter
from vellum.storage.journal_files import (  # noqa: F401  (names callers import from here)
    JournalFile,
    JournalReplay,
    ReplayResult,
    journal_file_name,
    list_journal_ids,
    replay_journals,
)
from vellum.storage.journal_pages import SyncProgress

log = logging.getLogger(__name__)

Callback = Callable[[BaseException | None], None]

_MB = 1 << 20
#: smallest hand-over of a direct-I/O journal: each direct write waits for the device, and on the
#: benchmark disk 64 KiB writes ran at a quarter of 1 MiB writes (``docs/benchmarks.md``)
DIRECT_MIN_WRITE_BYTES = _MB


class _Queue:
    """A bounded multi-producer queue from which one consumer takes everything at once. The
    bound counts records: a batch of n records weighs n."""

    def __init__(self, capacity: int) -> None:
        self.items: deque[object] = deque()
        self.capacity = capacity
        self._weight = 0  # records queued (a batch item counts its records)
        self.closed = False
        self._consumer_waiting = False
        self._lock = threading.Lock()
        self._not_empty = threading.Condition(self._lock)
        self._not_full = threading.Condition(self._lock)

    def put(self, item: object) -> None:
        with self._lock:
            items = self.items
            while self._weight >= self.capacity and not self.closed:
                self._not_full.wait()
            items.append(item)
            self._weight += 1
            if self._consumer_waiting:
                self._consumer_waiting = False
                self._not_empty.notify()

    def put_batch(self, item: object, weight: int) -> None:
        """Append one item that stands for ``weight`` records (waits while the queue is full;
        a batch larger than the capacity goes in once the queue is empty)."""
        with self._lock:
            items = self.items
            while items and self._weight + weight > self.capacity and not self.closed:
                self._not_full.wait()
            items.append(item)
            self._weight += weight
            if self._consumer_waiting:
                self._consumer_waiting = False
                self._not_empty.notify()

    def can_take(self, weight: int) -> bool:
        return not self.items or self._weight + weight <= self.capacity

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
            self._weight = 0
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
    records: int = 0
    close_fd: bool = False
    done: threading.Event | None = None
    last: bool = False


_SHUTDOWN = object()
#: a queued item: (record, callback, enqueue time) for one encoded record (master key, fence,
#: explicit LAC), or (entries, callback, enqueue time) for a batch of client entries, each
#: written as ``[int32 len][entry]`` straight into the group-commit buffer (copied once) and
#: the batch's callback run once, after the fsync covering its last record
_Item = tuple[bytes | list[bytes | bytearray | memoryview], Callback | None, float]
_PACK_LEN = struct.Struct(">i").pack


def pack_record(buf: bytearray, record: bytes | list[bytes | bytearray | memoryview]) -> int:
    """Append a queued item's record to the group-commit buffer ``buf``; returns how many
    journal records that was. An encoded record (master key, fence, explicit LAC) goes in as
    it is; a batch of client entries as one ``[int32 len][entry]`` record per entry
    (``format/journal.py``). The writer thread and ``commit()`` both pack with this."""
    if isinstance(record, list):
        sizes = list(map(len, record))
        if sizes and sizes.count(sizes[0]) == len(sizes):
            # entries of one size (one-row entries of fixed-size rows): one length field for all
            field = _PACK_LEN(sizes[0])
            for entry in record:
                buf += field
                buf += entry
        else:
            for field, entry in zip(map(_PACK_LEN, sizes), record):
                buf += field
                buf += entry
        return len(record)
    buf += record
    return 1


class Journal:
    """One journal directory: writer + force-write threads, replay, roll and GC.

    ``fsync`` (default ``os.fdatasync``), ``clock``, ``wall_clock`` and ``file_ops`` (the
    buffered mode's open, write, truncate and header fsync) are injectable for tests and the
    simulator; ``start(threads=False)`` makes ``commit()`` the writer (no thread).
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
        prealloc_zero: bool | None = None,
        remove_from_page_cache: bool = True,
        sync_in_writer: bool = True,
        direct_io: bool = False,
        fsync: Callable[[int], None] = os.fdatasync,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        file_ops: FileOps = OS_FILE_OPS,
    ) -> None:
        encode_header(format_version)  # validates the version early (UnknownFormatVersionError)
        if alignment < 16:
            raise ValueError(f"journal alignment {alignment} must be at least 16 bytes")
        if direct_io and format_version < V5:
            raise ValueError(
                f"journal direct I/O needs format version 5 or later (padding records keep every "
                f"flush aligned); version {format_version} was asked: raise journalFormatVersionToWrite "
                "or turn journalDirectIO off"
            )
        if direct_io and (alignment < 512 or alignment & (alignment - 1)):
            raise ValueError(
                f"journal direct I/O needs journalAlignmentSize to be a power of two of at least 512 "
                f"(the disk's sector), not {alignment}"
            )
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
        self._alignment = alignment
        self.format_version = format_version
        self._sync_data = sync_data
        self._write_buffer = max(write_buffer_size_kb, 1) * 1024
        if direct_io:
            self._write_buffer = max(self._write_buffer, DIRECT_MIN_WRITE_BYTES)
        self._drop_cache = remove_from_page_cache
        self._sync_in_writer = sync_in_writer
        if direct_io and not dio.O_DIRECT:
            log.warning("journal %s: O_DIRECT is not available on this platform; writing buffered",
                        self.journal_dir)
        #: the file being written (created, sealed, preallocated, written to): its own role
        self._file = JournalFileWriter(
            self.current_dir, index, format_version=format_version, alignment=alignment,
            prealloc_step=max(prealloc_size_mb * _MB, alignment), write_buffer=self._write_buffer,
            prealloc_zero=prealloc_zero, direct_io=direct_io and bool(dio.O_DIRECT), sync_data=sync_data,
            file_ops=file_ops)
        self._progress: SyncProgress | None = None
        self._fsync = fsync
        self._clock = clock
        self._wall_clock = wall_clock  # names the first journal file of an empty dir
        self._stepped = False  # started without threads: ``commit()`` is the writer
        self._queue = _Queue(queue_size)
        self._force_queue = _Queue(1 << 62)
        self._error: StorageError | None = None
        self._failure_listeners: list[Callable[[StorageError], None]] = []
        self._mark = ZERO_MARK
        self._started = False
        self._stopped = False
        self._writer: threading.Thread | None = None
        self._forcer: threading.Thread | None = None
        # what replay learnt about the last journal: (id, stop) so start() can seal its tail
        self._replayed_tail: tuple[int, ScanStop] | None = None

    # ------------------------------------------------------------------ properties

    @property
    def current_journal_id(self) -> int:
        """Id of the journal file being written (-1 before ``start``)."""
        return self._file.journal_id

    @property
    def current_path(self) -> Path:
        return self._file.path

    @property
    def direct_io(self) -> bool:
        """Whether the journal writes with ``O_DIRECT`` (false once a filesystem refused it)."""
        return self._file.direct_io

    @property
    def failed(self) -> StorageError | None:
        """The error that stopped this journal (fail-stop), or None."""
        return self._error

    def add_failure_listener(self, fn: Callable[[StorageError], None]) -> None:
        """``fn(error)`` is called once, on the thread that hit it, when this journal fails
        (fail-stop: it never un-fails). The bookie turns read-only from it."""
        self._failure_listeners.append(fn)

    def journal_path(self, journal_id: int) -> Path:
        return self._file.journal_path(journal_id)

    def journal_ids(self) -> list[int]:
        return list_journal_ids(self.current_dir)

    def current_mark(self) -> LogMark:
        """Everything written before this position has been fsynced (moves forward only)."""
        return self._mark

    # ------------------------------------------------------------------ replay

    def replay(self, mark: LogMark, on_record: Callable[[JournalRecord], None]) -> ReplayResult:
        """Feed every valid record at or after ``mark`` to ``on_record``, in journal order
        (``journal_files.replay_journals``: a bad record in the last journal is a torn tail, in
        an earlier one corruption; a missing marked journal is corruption)."""
        result = replay_journals(self.journal_ids(), self.journal_path, mark, on_record)
        if result.journals:
            last = result.journals[-1]
            self._replayed_tail = (last.journal_id, last.stop)
        return result

    # ------------------------------------------------------------------ garbage collection

    def gc_journals(self, mark: LogMark) -> list[Path]:
        """Delete journals below ``mark.journal_id``, keeping the newest ``max_backups`` of them.

        Never deletes the current journal or any journal at or above the mark (rule 7 of docs/correctness.md: journals
        are deleted only below a persisted mark). Returns the deleted paths.
        """
        below = [i for i in self.journal_ids() if i < mark.journal_id and i != self._file.journal_id]
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

    def start(self, *, threads: bool = True) -> None:
        """Open a new journal file (max existing id + 1, or the time in ms) and start the threads.

        ``threads=False``: no writer, force-write or zero-fill thread; whoever drives the journal
        calls ``commit()`` when a group commit is due (the simulator, at a virtual time)."""
        if self._started:
            raise StorageError(f"journal {self.journal_dir} already started")
        if not threads and self._file.zero_fill:
            raise ValueError(f"journal {self.journal_dir}: a journal driven by commit() cannot zero-fill ahead "
                             "on a thread; set prealloc_zero=False")
        try:
            self.current_dir.mkdir(parents=True, exist_ok=True)
            for name in os.listdir(self.current_dir):
                if name.endswith(".txn" + TMP_SUFFIX):  # a file creation interrupted by a crash
                    (self.current_dir / name).unlink()
            ids = self.journal_ids()
            if ids:
                known = self._replayed_tail
                self._file.seal(ids[-1], known[1] if known is not None and known[0] == ids[-1] else None)
            new_id = ids[-1] + 1 if ids else int(self._wall_clock() * 1000)
            self._file.open_new(new_id)
        except OSError as e:
            raise StorageError(f"cannot start journal in {self.current_dir}: {e}") from e
        self._mark = LogMark(self._file.journal_id, self._file.pos)
        self._started = True
        self._writer = threading.Thread(
            target=self._writer_loop, name=f"journal-{self.index}-writer", daemon=True
        )
        # only clean pages drop; direct writes leave none behind
        self._progress = SyncProgress(self._drop_cache and self._sync_data and not self._file.direct_io)
        if not threads:
            self._stepped = True
            return
        if not self._sync_in_writer:
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
        if self._stepped:
            self.commit()
            self.force()
            self._stopped = True
            self._file.close_fd()
            return
        self._stopped = True
        self._queue.put(_SHUTDOWN)
        assert self._writer is not None
        self._writer.join()
        if self._forcer is not None:
            self._forcer.join()
        self._file.release()  # its descriptor went with the last force-write request

    # ------------------------------------------------------------------ adding records

    def log_entry(self, ledger_id: int, entry_id: int, entry: bytes, callback: Callback) -> None:
        """Journal a stored client entry (which starts with ``ledger_id``, ``entry_id``)."""
        del ledger_id, entry_id  # they are the entry's first 16 bytes; kept for BookKeeper's API
        self.log_entries((entry,), callback)

    def log_batch(self, batch: AddBatch, callback: Callback) -> None:
        """Journal the entries of a batch of admitted adds (``Bookie.add_batch`` validated them:
        each is a whole stored entry, at least ``MIN_RECORD_BODY`` bytes; nothing is judged
        again here). Its ``entries`` column becomes the queue item as it is, its records built
        straight into the group-commit buffer by the writer; the batch must not change
        afterwards. ``callback`` runs once, after the fsync that covers the last of them (and
        so all of them: records are written and fsynced in queue order, and a journal that
        fails fails every later record)."""
        if not self._started or self._stopped:
            raise StorageError(f"journal {self.journal_dir} is not running")
        if not batch.entries:
            raise ValueError("log_batch needs at least one entry")
        self._queue.put_batch((batch.entries, callback, self._clock()), len(batch.entries))

    def log_entries(self, entries: Sequence[bytes | bytearray | memoryview], callback: Callback) -> None:
        """``log_batch`` of bare entries (tools and tests): the same preconditions."""
        if not self._started or self._stopped:
            raise StorageError(f"journal {self.journal_dir} is not running")
        if not entries:
            raise ValueError("log_entries needs at least one entry")
        self._queue.put_batch((list(entries), callback, self._clock()), len(entries))

    def can_take(self, records: int) -> bool:
        """Would ``records`` more records enter the queue now without waiting? (Advisory: a
        caller that is the only producer can rely on it.)"""
        return self._queue.can_take(records)

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
        self._queue.put((record, callback, self._clock()))

    # ------------------------------------------------------------------ writer thread

    def _writer_loop(self) -> None:
        take = self._queue.take_all
        clock = self._clock
        buf = bytearray()
        callbacks: list[Callback | None] = []
        records = 0
        crc = 0
        batch_bytes = 0
        oldest = 0.0
        max_wait = self._max_wait
        bytes_threshold = self._bytes_threshold
        entries_threshold = self._entries_threshold
        write_buffer = self._write_buffer
        queue_items = self._queue.items
        file = self._file
        shutting_down = False
        # Fsyncing on this thread (sync_in_writer), the batches a group-commit threshold cuts out
        # of one take are forced together once the take is written: one fdatasync instead of one
        # per threshold (an fsync costs milliseconds, writing the rest of a take far less). The
        # force-write thread coalesces them the same way (_sync_requests).
        deferred: list[_ForceRequest] = []

        def force_deferred() -> None:
            if deferred:
                requests = deferred.copy()
                deferred.clear()
                self._sync_requests(requests)

        def flush(defer: bool = False) -> None:
            nonlocal buf, crc, batch_bytes, records
            request = self._write_batch(buf, crc, callbacks.copy(), records)
            buf = bytearray()
            callbacks.clear()
            records = 0
            crc = 0
            batch_bytes = 0
            roll = self._file.pos >= self._max_size and self._error is None
            if defer and self._forcer is None and not roll:
                deferred.append(request)
                return
            if deferred:
                deferred.append(request)
                force_deferred()
            else:
                self._force(request)
            if roll:
                self._roll()

        while True:
            timeout = None if not callbacks else max(0.0, oldest + max_wait - clock())
            items = take(timeout)
            for item in items:
                if item is _SHUTDOWN:
                    shutting_down = True
                    continue
                record, callback, enqueued = cast(_Item, item)
                if not callbacks:
                    oldest = enqueued
                start = len(buf)
                records += pack_record(buf, record)
                batch_bytes += len(buf) - start
                callbacks.append(callback)
                if len(buf) >= write_buffer and self._error is None:
                    # Like BookKeeper's BufferedChannel: hand full buffers to the OS early,
                    # without padding; the batch checksum runs over the pieces.
                    try:
                        crc = batch_crc(buf, crc)
                        file.extend(file.pos + len(buf))
                        file.write(buf)
                    except OSError as e:
                        self._fail(f"write of journal {file.path} failed at offset {file.pos}", e)
                    buf = bytearray()
                if (bytes_threshold and batch_bytes >= bytes_threshold) or (
                    entries_threshold and records >= entries_threshold
                ):
                    flush(defer=True)
            if callbacks and (
                shutting_down or clock() - oldest >= max_wait or (self._flush_when_empty and not queue_items)
            ):
                flush()
            force_deferred()  # what a threshold flushed is forced by the end of its take
            if shutting_down:
                self._force(self._request([], 0, close_fd=True, last=True))
                # records enqueued after the shutdown marker (a race with shutdown()) must not hang
                for item in take(0):
                    late = None if item is _SHUTDOWN else cast(_Item, item)[1]
                    if late is not None:
                        late(StorageError(f"journal {file.path} was shut down"))
                self._queue.close()
                return

    def _commit_batch(self, buf: bytearray, crc: int, callbacks: list[Callback | None], records: int) -> None:
        """End a group-commit batch (``commit()``): written, handed to the fsync, and a roll
        once the file is full."""
        self._force(self._write_batch(buf, crc, callbacks, records))
        if self._file.pos >= self._max_size and self._error is None:
            self._roll()

    def _write_batch(self, buf: bytearray, crc: int, callbacks: list[Callback | None],
                     records: int) -> _ForceRequest:
        """Write a group-commit batch: its padding record (carrying the batch checksum, ``crc``
        of the bytes written before ``buf``) and the write; returns the fsync request that will
        acknowledge it. The writer thread's flush and ``commit()`` both write a batch here."""
        file = self._file
        try:
            if self._error is None:
                if self.format_version >= V5:
                    crc = batch_crc(buf, crc)
                    buf += encode_padding(file.pos + len(buf), self._alignment, crc)
                file.extend(file.pos + len(buf))
                file.write(buf)
        except OSError as e:
            self._fail(f"write of journal {file.path} failed at offset {file.pos}", e)
        return self._request(callbacks, records)

    # ------------------------------------------------------------------ stepped driving

    def commit(self) -> int:
        """One group commit now, for a journal started with ``threads=False``: everything queued
        becomes one batch (the writer thread's batch, whatever its size or age), written, and
        (``sync_in_writer``) fsynced, the mark advanced and the callbacks run, all on the
        caller's thread; without ``sync_in_writer`` the fsync waits for ``force()``. Returns
        the number of records written (0: nothing was queued)."""
        if not self._stepped:
            raise StorageError(f"journal {self.journal_dir}: commit() drives a journal started with threads=False")
        items = self._queue.take_all(0)
        if not items or self._stopped:
            return 0
        buf = bytearray()
        callbacks: list[Callback | None] = []
        records = 0
        for item in items:
            record, callback, _enqueued = cast(_Item, item)
            records += pack_record(buf, record)
            callbacks.append(callback)
        self._commit_batch(buf, 0, callbacks, records)
        return records

    def force(self) -> int:
        """The force-write thread's step, for a journal started with ``threads=False`` and
        ``sync_in_writer=False``: fsync what ``commit()`` wrote, advance the mark, run the
        callbacks. Returns the number of records made durable."""
        requests: list[_ForceRequest] = self._force_queue.take_all(0)  # type: ignore[assignment]
        if requests:
            self._sync_requests(requests)
        return sum(r.records for r in requests)

    @property
    def queued(self) -> bool:
        """Are records waiting for the next group commit? (Read without the lock: advisory.)"""
        return bool(self._queue.items)

    def abandon(self) -> None:
        """What a killed process leaves of a journal started with ``threads=False``: the file as
        written so far; the queued records are dropped, no callback runs, the descriptor is
        closed (as the OS closes it). Unusable afterwards."""
        if not self._stepped:
            raise StorageError(f"journal {self.journal_dir}: only a journal started with threads=False is abandoned")
        self._stopped = True
        self._queue.items.clear()
        self._force_queue.items.clear()  # written, never fsynced: no callback runs
        self._file.close_fd()

    def _roll(self) -> None:
        """Start file id+1 once the old file is fsynced and closed (so it ends cleanly)."""
        done = threading.Event()
        self._force(self._request([], 0, close_fd=True, done=done))
        done.wait()
        file = self._file
        if self._error is not None:
            file.fd = -1
            return
        try:
            file.open_new(file.journal_id + 1)
        except OSError as e:
            self._fail(f"cannot roll journal {file.path} to id {file.journal_id + 1:x}", e)

    def _request(self, callbacks: list[Callback | None], records: int, *, close_fd: bool = False,
                 done: threading.Event | None = None, last: bool = False) -> _ForceRequest:
        """A force-write request for everything written to the current file so far."""
        file = self._file
        request = _ForceRequest(file.fd, file.path, file.journal_id, file.pos, callbacks, records)
        request.close_fd, request.done, request.last = close_fd, done, last
        return request

    def _fail(self, what: str, exc: OSError) -> StorageError:
        if self._error is None:
            self._error = StorageError(f"{what}: {exc}")
            log.error("journal %d failed (fail-stop): %s", self.index, self._error)
            for fn in list(self._failure_listeners):
                try:
                    fn(self._error)
                except Exception:  # a listener must not break the journal's own failure path
                    log.exception("journal %d: failure listener failed", self.index)
        return self._error

    # ------------------------------------------------------------------ force-write thread

    def _force(self, request: _ForceRequest) -> None:
        """Hand a force-write request over: to the force-write thread, or (``sync_in_writer``)
        carry it out at once on the writer thread."""
        if self._forcer is None:
            if self._stepped and not self._sync_in_writer:
                # driven by steps, with a force-write step: the fsync waits for ``force()``,
                # unless a roll waits for it now
                self._force_queue.put(request)
                if request.done is None:
                    return
                self.force()
                return
            self._sync_requests([request])
        else:
            self._force_queue.put(request)

    def _force_loop(self) -> None:
        take = self._force_queue.take_all
        while True:
            requests: list[_ForceRequest] = take(None)  # type: ignore[assignment]
            if self._sync_requests(requests):
                return

    def _sync_requests(self, requests: list[_ForceRequest]) -> bool:
        """fsync, advance the mark, run the callbacks of ``requests``; True after the last."""
        progress = self._progress
        assert progress is not None
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
                self.records_synced_total += sum(r.records for r in group)
                if last.fd >= 0:
                    progress.synced(last.fd, last.journal_id, last.end)
                    filler = self._file.filler
                    if filler is not None:
                        filler.bytes_per_sync = progress.bytes_per_sync
            for request in group:
                for callback in request.callbacks:
                    if callback is None:
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
                    return True
        return False
