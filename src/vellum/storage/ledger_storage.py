"""Ledger storage of one ledger directory with DbLedgerStorage semantics (requirement R4 of docs/correctness.md).

``LedgerStorage`` is a composition: it builds the parts of one ledger dir's storage, hands them
one lock protocol (``storage/storage_lock.py``), and gives callers (the bookie, routing, GC,
tools) one interface over them. Each part lives in a module of its own:

- ``storage/storage_writes.py``: the add path into the active write cache;
- ``storage/storage_flush.py``: the write-cache swap and back-pressure, the flush thread,
  ``flush()`` (sorted -> entry log -> fsync -> index -> sync), entry-log sealing after flushes;
- ``storage/storage_reads.py``: the read path (write caches -> read-ahead cache -> index ->
  entry log), CRC verification of entries read from entry logs, read-ahead, BATCH_READ and
  READ_STRIDED runs;
- ``storage/ledger_data.py``: per-ledger data (master key, fence, explicit LAC, limbo,
  tombstones) and the keyless digest learnt from a ledger's first adds;
- ``storage/storage_upkeep.py``: deletes, trims, forced sealing, and GC / compaction's index
  updates.

They share the write caches (``storage/write_cache.py``), the read-ahead cache
(``storage/read_ahead_cache.py``), the trimmed-bytes counts (``storage/trimmed_bytes.py``), the
entry logs (``storage/entry_logger.py``) and the indexes (``storage/index.py``).

Invariants (kept by the parts together, under the one lock protocol):
- After ``flush()`` returns, every entry added and every ledger-data change (master key, fence,
  explicit LAC, delete) made before the call is durable in the entry log and the indexes.
- An entry is in a write cache or in the location index at every instant (the index is written
  before the cache is dropped, and readers look at both caches under one lock), so a reader never
  misses an added entry.
- ``NoSuchEntryError`` is raised only for a known ledger whose entry is neither cached nor
  indexed; an unknown ledger raises ``NoSuchLedgerError``; anything doubtful is a storage error.
- A deleted ledger leaves a tombstone in the ``ledgers`` index (``exists=false, fenced=true``,
  durable at the next flush): a writer that still holds the ledger can never recreate it with
  its next add, however long after GC (defect D2 of docs/correctness.md; BookKeeper's BK#4462 covers only the
  time before GC).
- Flushes, deletes, trims and compaction's index updates are serialised by ``flush_lock``, so
  a flush never re-adds the locations of a ledger deleted while it ran, and compaction moves an
  index entry only if it still points where compaction read it. Lock order: ``flush_lock`` then
  ``cond``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

from vellum.format.entry import BytesLike
from vellum.format.ledger_index import LedgerData
from vellum.proto.messages import AddBatch, PackedEntries
from vellum.storage.entry_logger import DIRECT_WRITE_BUFFER_SIZE, EntryLogger, FileOps
from vellum.storage.index import EntryLocationIndex, IndexOps, LedgerMetadataIndex
from vellum.storage.ledger_data import LedgerDataTable
from vellum.storage.read_ahead_cache import ReadAheadCache
from vellum.storage.storage_flush import FLUSH_RETRY_DELAY_S, StorageFlusher
from vellum.storage.storage_lock import StorageLock
from vellum.storage.storage_reads import StorageReader
from vellum.storage.storage_upkeep import StorageUpkeep
from vellum.storage.storage_writes import StorageWriter
from vellum.storage.trimmed_bytes import TRIMMED_FILE, TrimmedBytes
from vellum.storage.write_cache import Stored, WriteCaches

__all__ = ["FLUSH_RETRY_DELAY_S", "TRIMMED_FILE", "LedgerStorage", "Stored"]


class LedgerPresence(NamedTuple):
    """What one ledger dir knows of a ledger, in one answer (``LedgerStorage.presence``)."""

    live: bool  #: its ledgers index holds the ledger (not deleted)
    deleted: bool  #: its ledgers index holds the ledger's tombstone
    last_entry_id: int  #: the greatest entry id held here (-1: none, or not live)
    active_logs: int  #: entry logs active in this dir (``active_log_count``), for a new home


class LedgerStorage:
    """DbLedgerStorage semantics for one ledger directory: the parts of the module docstring,
    composed. Every method is the owning part's."""

    def __init__(
        self,
        ledger_dir: Path,
        index_dir: Path | None = None,
        *,
        log_size_limit: int,
        write_cache_max_bytes: int,
        read_cache_max_bytes: int,
        read_ahead_batch_size: int,
        max_throttle_time_ms: int,
        read_ahead_max_bytes: int = -1,
        flush_entrylog_bytes: int = 0,
        preallocate: bool = True,
        file_ops: FileOps | None = None,
        index_ops: IndexOps | None = None,
        flush_hook: Callable[[], None] | None = None,
        entry_log_per_ledger: bool = False,
        max_active_entry_logs: int = 500,
        entry_log_map_expiry_s: float = 300.0,
        entry_log_clock: Callable[[], float] = time.monotonic,
        direct_io: bool = False,
        direct_write_buffer_size: int = DIRECT_WRITE_BUFFER_SIZE,
        flush_thread: bool = True,
    ) -> None:
        if write_cache_max_bytes < 2:
            raise ValueError(f"write_cache_max_bytes {write_cache_max_bytes} is too small")
        self.ledger_dir = Path(ledger_dir)
        self.index_dir = Path(index_dir) if index_dir is not None else self.ledger_dir
        self.entry_logger = EntryLogger(
            self.ledger_dir,
            log_size_limit=log_size_limit,
            preallocate=preallocate,
            flush_entrylog_bytes=flush_entrylog_bytes,
            file_ops=file_ops,
            entry_log_per_ledger=entry_log_per_ledger,
            max_active_logs=max_active_entry_logs,
            access_expiry_s=entry_log_map_expiry_s,
            clock=entry_log_clock,  # the access expiry's clock (tests drive it)
            direct_io=direct_io,
            direct_write_buffer_size=direct_write_buffer_size,
        )
        try:
            self.locations = EntryLocationIndex(self.index_dir, ops=index_ops)
            try:
                self.ledgers_index = LedgerMetadataIndex(self.index_dir, ops=index_ops)
            except BaseException:
                self.locations.close()
                raise
        except BaseException:
            self.entry_logger.close()
            raise
        self._lock = StorageLock(self.ledger_dir)
        self._data = LedgerDataTable(self._lock, self.ledgers_index)
        caches = WriteCaches(write_cache_max_bytes // 2)
        read_cache = ReadAheadCache(
            max_bytes=read_cache_max_bytes, batch_size=read_ahead_batch_size,
            batch_max_bytes=read_ahead_max_bytes,
        )
        # Bytes of records dropped from the index by trim(), per entry log: dead for GC.
        trimmed = TrimmedBytes(self.index_dir / "current" / TRIMMED_FILE, self.entry_logger.log_ids())
        self._flusher = StorageFlusher(
            self._lock, caches, self.entry_logger, self.locations, self.ledgers_index, trimmed,
            max_throttle_time_ms=max_throttle_time_ms, flush_hook=flush_hook,
        )
        self._writer = StorageWriter(self._lock, caches, self._data, self._flusher)
        self._reader = StorageReader(self._lock, caches, read_cache, self.entry_logger, self.locations, self._data)
        self._upkeep = StorageUpkeep(self._lock, caches, read_cache, self.entry_logger, self.locations,
                                     self.ledgers_index, self._data, trimmed, self._flusher)
        # flush_thread=False (the simulator): a swapped cache is written out by the next flush()
        if flush_thread:
            self._flusher.start()

    # ------------------------------------------------------------------ writes (storage_writes.py)

    def add_entry(self, entry: BytesLike) -> None:
        """A stored entry from outside the ADD path (replay, tools); see ``StorageWriter``."""
        self._writer.add_entry(entry)

    def add_entries(self, entries: Sequence[BytesLike]) -> list[BaseException | None]:
        return self._writer.add_entries(entries)

    def write_batch(self, batch: AddBatch) -> list[tuple[int, BaseException]]:
        """The bookie's admitted adds, into the write cache; the refused as (position, error)."""
        return self._writer.write_batch(batch)

    # ------------------------------------------------------------------ flush (storage_flush.py)

    def can_take(self, nbytes: int) -> bool:
        return self._flusher.can_take(nbytes)

    def flush(self) -> None:
        """Make everything added (and every ledger-data change) before this call durable."""
        self._flusher.flush()

    def note_ledger_closed(self, ledger_id: int) -> None:
        self._flusher.note_ledger_closed(ledger_id)

    def active_log_count(self) -> int:
        return self._flusher.active_log_count()

    def rotate_entry_logs(self) -> None:
        self._flusher.rotate_entry_logs()

    # ------------------------------------------------------------------ reads (storage_reads.py)

    def get_entry(self, ledger_id: int, entry_id: int, *, read_ahead: bool = True,
                  report_corrupt: bool = True) -> Stored:
        """The stored entry (``entry_id == -1``: the last one held); see ``StorageReader``."""
        return self._reader.get_entry(ledger_id, entry_id, read_ahead=read_ahead, report_corrupt=report_corrupt)

    def get_entries(self, ledger_id: int, first: int, max_count: int, max_bytes: int) -> PackedEntries:
        """BATCH_READ's entries, laid out as its reply carries them; see ``StorageReader``."""
        return self._reader.get_entries(ledger_id, first, max_count, max_bytes)

    def get_strided(self, ledger_id: int, first: int, stride: int, max_count: int,
                    max_bytes: int) -> PackedEntries:
        """READ_STRIDED's entries, laid out as its reply carries them; see ``StorageReader``."""
        return self._reader.get_strided(ledger_id, first, stride, max_count, max_bytes)

    def get_cached_entry(self, ledger_id: int, entry_id: int) -> Stored | None:
        return self._reader.get_cached_entry(ledger_id, entry_id)

    def read_cache_contains(self, ledger_id: int, entry_id: int) -> bool:
        return self._reader.read_cache_contains(ledger_id, entry_id)

    def get_last_entry_id(self, ledger_id: int) -> int:
        return self._reader.get_last_entry_id(ledger_id)

    def has_entry(self, ledger_id: int, entry_id: int) -> bool:
        return self._reader.has_entry(ledger_id, entry_id)

    def entry_ids(self, ledger_id: int) -> list[int]:
        return self._reader.entry_ids(ledger_id)

    def entry_intact(self, ledger_id: int, entry: BytesLike) -> bool:
        return self._reader.entry_intact(ledger_id, entry)

    # ------------------------------------------------------------------ ledger data (ledger_data.py)

    def ledger_exists(self, ledger_id: int) -> bool:
        return self._data.ledger_exists(ledger_id)

    def is_deleted(self, ledger_id: int) -> bool:
        return self._data.is_deleted(ledger_id)

    def ledgers(self) -> Iterator[int]:
        return self._data.ledgers()

    def presence(self, ledger_id: int) -> LedgerPresence:
        """Everything routing asks of this dir to find a ledger's homes, in one call."""
        data = self._data.record(ledger_id)
        live = data is not None and data.exists
        return LedgerPresence(live, data is not None and not data.exists,
                              self.get_last_entry_id(ledger_id) if live else -1, self.active_log_count())

    def ledger_record(self, ledger_id: int) -> LedgerData | None:
        """The ledger's data as this dir holds it (live, or its tombstone), or None."""
        return self._data.record(ledger_id)

    def continue_ledger(self, ledger_id: int, homes: Sequence[LedgerStorage]) -> None:
        """This dir becomes the write home of a ledger held so far by ``homes`` (write home
        last): it first takes the ledger's master key, its fence (if any home has it) and its
        explicit LAC, then the entries (requirement R1 of docs/correctness.md)."""
        records = [home.ledger_record(ledger_id) for home in homes]
        old = records[-1]
        if old is not None and old.exists and old.master_key:
            # (a ledger known by entries alone is made known by its next one)
            self.set_master_key(ledger_id, old.master_key)
        mine = self._data.record(ledger_id)
        if mine is None or not mine.exists:
            return
        if any(r is not None and r.exists and r.fenced for r in records):
            self.set_fenced(ledger_id)
        if old is not None and old.exists and old.explicit_lac is not None:
            self.set_explicit_lac(ledger_id, old.explicit_lac)

    def set_master_key(self, ledger_id: int, master_key: bytes) -> None:
        self._data.set_master_key(ledger_id, master_key)

    def get_master_key(self, ledger_id: int) -> bytes | None:
        return self._data.get_master_key(ledger_id)

    def set_fenced(self, ledger_id: int) -> bool:
        return self._data.set_fenced(ledger_id)

    def is_fenced(self, ledger_id: int) -> bool:
        return self._data.is_fenced(ledger_id)

    def set_explicit_lac(self, ledger_id: int, body: bytes) -> None:
        self._data.set_explicit_lac(ledger_id, body)

    def get_explicit_lac(self, ledger_id: int) -> bytes | None:
        return self._data.get_explicit_lac(ledger_id)

    def set_limbo(self, ledger_id: int, limbo: bool) -> None:
        self._data.set_limbo(ledger_id, limbo)

    def limbo_ledgers(self) -> list[int]:
        return self._data.limbo_ledgers()

    # ------------------------------------------------------------------ upkeep (storage_upkeep.py)

    def delete_ledger(self, ledger_id: int) -> None:
        self._upkeep.delete_ledger(ledger_id)

    def trim(self, ledger_id: int, end_entry_id: int) -> None:
        self._upkeep.trim(ledger_id, end_entry_id)

    def seal_logs_holding(self, ledger_id: int) -> int:
        return self._upkeep.seal_logs_holding(ledger_id)

    def location_of(self, ledger_id: int, entry_id: int) -> int | None:
        return self._upkeep.location_of(ledger_id, entry_id)

    def update_locations_if_unchanged(self, moves: list[tuple[int, int, int, int]]) -> int:
        return self._upkeep.update_locations_if_unchanged(moves)

    def indexed_in_log(self, log_id: int, ledgers: Iterable[int] | None = None) -> list[tuple[int, int, int]]:
        return self._upkeep.indexed_in_log(log_id, ledgers)

    def sync_index(self) -> None:
        self._upkeep.sync_index()

    def trimmed_bytes(self) -> dict[int, int]:
        return self._upkeep.trimmed_bytes()

    def forget_log(self, log_id: int) -> None:
        self._upkeep.forget_log(log_id)

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Flush, stop the flush thread, close the entry logger and the indexes."""
        cond = self._lock.cond
        with cond:
            if self._lock.closed:
                return
        error: BaseException | None = None
        try:
            self.flush()
        except BaseException as e:
            error = e
        with cond:
            self._lock.closed = True
            cond.notify_all()
        self._flusher.join()
        for closer in (self.entry_logger.close, self.locations.close, self.ledgers_index.close):
            try:
                closer()
            except BaseException as e:
                error = error or e
        if error is not None:
            raise error

    def abandon(self) -> None:
        """What a killed process leaves (``flush_thread=False`` only): the files as written; the
        write caches are lost, descriptors and index handles released. Unusable afterwards."""
        assert not self._flusher.threaded, "abandon() is for a storage without a flush thread"
        with self._lock.cond:
            self._lock.closed = True
        for part in (self.entry_logger, self.locations, self.ledgers_index):
            part.abandon()

    def __enter__(self) -> LedgerStorage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
