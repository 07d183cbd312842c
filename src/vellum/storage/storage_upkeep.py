"""Upkeep of one ledger storage: deletes, trims, forced sealing of active logs, and what GC and
compaction ask of the indexes.

All of it holds ``flush_lock`` (``storage/storage_lock.py``): a flush never re-adds the locations
of a ledger deleted while it ran, and compaction moves an index entry only if it still points
where compaction read it (``update_locations_if_unchanged``: a trimmed, deleted or rewritten
entry is never resurrected). A delete leaves a fenced tombstone in the ``ledgers`` index, so no
later add recreates the ledger however long after GC (defect D2 of docs/correctness.md). Trimmed
records count as dead bytes for GC (``storage/trimmed_bytes.py``).
"""

from __future__ import annotations

from collections.abc import Iterable

from vellum.ids import location_log_id
from vellum.storage.entry_logger import EntryLogger
from vellum.storage.index import EntryLocationIndex, LedgerMetadataIndex
from vellum.storage.ledger_data import LedgerDataTable
from vellum.storage.read_ahead_cache import ReadAheadCache
from vellum.storage.storage_flush import StorageFlusher
from vellum.storage.storage_lock import StorageLock
from vellum.storage.trimmed_bytes import TrimmedBytes
from vellum.storage.write_cache import WriteCaches

#: test flag (the simulator's ``no-delete-tombstone`` regression, docs/verification.md): False
#: deletes a ledger's data from the index instead of leaving a fenced tombstone
_leave_tombstone = True


class StorageUpkeep:
    """Deletes, trims and GC / compaction support of one ledger storage (see the module
    docstring)."""

    def __init__(self, lock: StorageLock, caches: WriteCaches, read_cache: ReadAheadCache,
                 entry_logger: EntryLogger, locations: EntryLocationIndex, ledgers_index: LedgerMetadataIndex,
                 data: LedgerDataTable, trimmed: TrimmedBytes, flusher: StorageFlusher) -> None:
        self._lock = lock
        self._cond = lock.cond
        self._flush_lock = lock.flush_lock
        self._caches = caches
        self._read_cache = read_cache
        self.entry_logger = entry_logger
        self.locations = locations
        self.ledgers_index = ledgers_index
        self._data = data
        self._trimmed = trimmed
        self._flusher = flusher

    def delete_ledger(self, ledger_id: int) -> None:
        """Forget the ledger: cached entries and index entries; its ledger data becomes a fenced
        tombstone, so no later add recreates it (all durable at flush)."""
        with self._flush_lock:
            with self._cond:
                self._lock.check_open()
                self._caches.drop_ledger(ledger_id)
                self._read_cache.evict(ledger_id, None)
                old = self._data.forget(ledger_id)
            self.locations.delete_ledger(ledger_id)
            if _leave_tombstone:
                self._data.put_tombstone(ledger_id, old)
            else:
                self.ledgers_index.delete(ledger_id)

    def trim(self, ledger_id: int, end_entry_id: int) -> None:
        """Drop the ledger's entries with id < ``end_entry_id`` (shrink with force)."""
        with self._flush_lock:
            with self._cond:
                self._lock.check_open()
                self._data.known_ledger(ledger_id)
                self._caches.drop_ledger(ledger_id, below=end_entry_id)
                self._read_cache.evict(ledger_id, end_entry_id)
            dead: dict[int, int] = {}
            for eid, location in self.locations.iter_ledger(ledger_id):
                if eid >= end_entry_id:
                    break
                size = self.entry_logger.record_size(location)
                if size is not None:
                    log_id = location >> 32
                    dead[log_id] = dead.get(log_id, 0) + size
            self.locations.delete_range(ledger_id, 0, end_entry_id)
            self._trimmed.add(dead)

    def seal_logs_holding(self, ledger_id: int) -> int:
        """Make the ledger's records in the active entry log(s) collectable now (a forced
        shrink: GC never touches an active log): flush (the trims become durable with the
        index), then seal the active log(s) holding records of the ledger: its own log with
        entry log per ledger, else the shared active log. Returns how many logs were sealed."""
        with self._flush_lock:
            self._flusher.flush()
            holding = [log_id for log_id, _size, ledgers in self.entry_logger.active_log_usage()
                       if ledger_id in ledgers]
            if not holding:
                return 0
            if self.entry_logger.entry_log_per_ledger:
                return int(self.entry_logger.rotate_ledger(ledger_id))
            self.entry_logger.rotate()
            return len(holding)

    # ------------------------------------------------------------------ GC / compaction support

    def location_of(self, ledger_id: int, entry_id: int) -> int | None:
        """The indexed location of an entry (None if not indexed)."""
        return self.locations.get_location(ledger_id, entry_id)

    def update_locations_if_unchanged(self, moves: list[tuple[int, int, int, int]]) -> int:
        """Compaction's index update: ``(ledger, entry, old, new)`` moves whose index entry still
        equals ``old`` are written in one batch and synced; others (trimmed, deleted, rewritten
        since compaction read them) are skipped. Returns how many moved."""
        with self._flush_lock:
            self._lock.check_open()
            batch = [
                (lid, eid, new)
                for lid, eid, old, new in moves
                if self.locations.get_location(lid, eid) == old
            ]
            if batch:
                self.locations.put_locations(batch)
            self.locations.sync()
            return len(batch)

    def indexed_in_log(self, log_id: int, ledgers: Iterable[int] | None = None) -> list[tuple[int, int, int]]:
        """``(ledger, entry, location)`` of every index entry pointing into entry log ``log_id``,
        among ``ledgers`` (None: every ledger; a walk of the whole index). What GC trusts, not a
        scan, when a scan of that log could not read all of it."""
        self._lock.check_open()
        if ledgers is None:
            return [(lid, eid, loc) for lid, eid, loc in self.locations.items()
                    if location_log_id(loc) == log_id]
        return [(lid, eid, loc) for lid in sorted(ledgers) for eid, loc in self.locations.iter_ledger(lid)
                if location_log_id(loc) == log_id]

    def sync_index(self) -> None:
        """Make index changes (ledger deletes) durable before GC deletes entry logs."""
        with self._flush_lock:
            self._lock.check_open()
            self.locations.sync()
            self.ledgers_index.sync()

    def trimmed_bytes(self) -> dict[int, int]:
        """Per entry log, bytes of records trimmed away (dead for GC); see ``trim``."""
        return self._trimmed.snapshot()

    def forget_log(self, log_id: int) -> None:
        """GC deleted (or compacted away) a log: drop its trim bookkeeping."""
        self._trimmed.forget(log_id)
