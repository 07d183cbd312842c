"""The write caches of one ledger storage (DbLedgerStorage, requirement R4 of docs/correctness.md) and how a full one is
written out.

Two caches: adds go to the *active* one; when it is full it becomes the *flushing* one (if that
slot is free) and a fresh active cache takes the adds while the flush thread writes the
flushing cache out: sorted by (ledger, entry) -> appended to the entry log -> entry log fsynced
-> locations written to the index -> index synced. Only then is the flushing slot emptied.

Invariants:
- An added entry is in one of the two caches until its location is in the index (synced), so
  a reader that looks at both caches, then the index, never misses it.
- ``swap`` never replaces a flushing cache that was not written out: it only fills a free slot.
- ``write_out`` indexes nothing of a round in which an entry-log write failed (the logger's
  ``failure_count`` moved): the cache stays and the flush is retried whole.

``WriteCaches`` is not thread-safe: ledger storage calls it under its lock (``_cond``);
``write_out`` reads a flushing cache, which nobody writes any more, without it.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from typing import TypeAlias

from vellum.errors import StorageError
from vellum.ids import INVALID_ENTRY_ID
from vellum.storage.entry_logger import EntryLogger
from vellum.storage.index import EntryLocationIndex

#: An entry as storage holds it: ``bytes``, or a read-only view handed over by the server.
Stored: TypeAlias = bytes | memoryview

#: entries per entry-log append / index batch during a flush, and the pause between them
_FLUSH_CHUNK = 1024
_FLUSH_PAUSE_S = 0.0001


class WriteCache:
    """Entries by (ledger, entry) with their total size and each ledger's greatest entry id."""

    __slots__ = ("entries", "last", "max_bytes", "size")

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.entries: dict[tuple[int, int], Stored] = {}
        self.last: dict[int, int] = {}
        self.size = 0

    def put(self, ledger_id: int, entry_id: int, entry: Stored) -> None:
        old = self.entries.get((ledger_id, entry_id))
        if old is not None:
            self.size -= len(old)
        self.entries[(ledger_id, entry_id)] = entry
        self.size += len(entry)
        if entry_id > self.last.get(ledger_id, INVALID_ENTRY_ID):
            self.last[ledger_id] = entry_id

    def put_new(self, ledger_id: int, entry_ids: list[int], entries: Sequence[Stored], nbytes: int) -> bool:
        """``put`` of entries of one ledger at once, ``nbytes`` their total size, when none of
        them is held already (the common case: a writer's new entries); False, and nothing
        put, if one is (``put`` each then: it replaces and re-counts)."""
        keys = list(zip(itertools.repeat(ledger_id, len(entry_ids)), entry_ids))
        held = self.entries
        if not held.keys().isdisjoint(keys):
            return False
        held.update(zip(keys, entries))
        self.size += nbytes
        top = max(entry_ids)
        if top > self.last.get(ledger_id, INVALID_ENTRY_ID):
            self.last[ledger_id] = top
        return True

    def has_room(self, n: int) -> bool:
        return not self.entries or self.size + n <= self.max_bytes

    def drop_ledger(self, ledger_id: int, below: int | None = None) -> None:
        """Drop a ledger's entries (all, or those with id < ``below``)."""
        if ledger_id not in self.last:
            return
        for key in [k for k in self.entries if k[0] == ledger_id and (below is None or k[1] < below)]:
            self.size -= len(self.entries.pop(key))
        remaining = [k[1] for k in self.entries if k[0] == ledger_id]
        if remaining:
            self.last[ledger_id] = max(remaining)
        else:
            del self.last[ledger_id]


class WriteCaches:
    """The active and the flushing write cache (see the module docstring). Caller holds the
    storage's lock."""

    __slots__ = ("_max_bytes", "active", "flushing")

    def __init__(self, max_bytes_each: int) -> None:
        self._max_bytes = max_bytes_each
        self.active = WriteCache(max_bytes_each)
        self.flushing: WriteCache | None = None

    def swap(self) -> bool:
        """Make the active cache the flushing one, if that slot is free; whether it was."""
        if self.flushing is not None:
            return False
        self.flushing, self.active = self.active, WriteCache(self._max_bytes)
        return True

    def get(self, key: tuple[int, int]) -> Stored | None:
        found = self.active.entries.get(key)
        if found is None and self.flushing is not None:
            found = self.flushing.entries.get(key)
        return found

    def get_run(self, ledger_id: int, first: int, stride: int, most: int) -> list[Stored]:
        """Entries ``first, first + stride, ...`` while cached, at most ``most``: a multi-entry
        read's run, looked up in one call (one lock hold for the caller)."""
        active = self.active.entries
        flushing = self.flushing.entries if self.flushing is not None else None
        out: list[Stored] = []
        entry_id = first
        while len(out) < most:
            found = active.get((ledger_id, entry_id))
            if found is None:
                if flushing is None:
                    break
                found = flushing.get((ledger_id, entry_id))
                if found is None:
                    break
            out.append(found)
            entry_id += stride
        return out

    def contains(self, key: tuple[int, int]) -> bool:
        return key in self.active.entries or (self.flushing is not None and key in self.flushing.entries)

    def holds_ledger(self, ledger_id: int) -> bool:
        return ledger_id in self.active.last or (self.flushing is not None and ledger_id in self.flushing.last)

    def ledgers(self) -> set[int]:
        """The ledgers with cached entries."""
        held = set(self.active.last)
        if self.flushing is not None:
            held.update(self.flushing.last)
        return held

    def last_entry_id(self, ledger_id: int) -> int:
        """The ledger's greatest cached entry id, -1 if none."""
        last = self.active.last.get(ledger_id, INVALID_ENTRY_ID)
        if self.flushing is not None:
            last = max(last, self.flushing.last.get(ledger_id, INVALID_ENTRY_ID))
        return last

    def entry_ids(self, ledger_id: int) -> set[int]:
        ids = {e for (lid, e) in self.active.entries if lid == ledger_id}
        if self.flushing is not None:
            ids.update(e for (lid, e) in self.flushing.entries if lid == ledger_id)
        return ids

    def drop_ledger(self, ledger_id: int, below: int | None = None) -> None:
        """Drop a ledger's entries (all, or those with id < ``below``) from both caches."""
        self.active.drop_ledger(ledger_id, below)
        if self.flushing is not None:
            self.flushing.drop_ledger(ledger_id, below)


def write_out(cache: WriteCache, entry_logger: EntryLogger, locations: EntryLocationIndex) -> None:
    """Write a flushing cache to the entry log (fsynced), then its locations to the index
    (synced). Raises ``StorageError`` and indexes nothing if an entry-log write failed."""
    # The flushing cache is no longer written to, so it is read and sorted without the lock
    # (sorting tens of thousands of entries under it stalled every add for milliseconds).
    # Keys only: sorting (and building) 30k (key, entry) pairs held the GIL for ~4 ms.
    keys = sorted(cache.entries)
    entries_of = cache.entries
    failures = entry_logger.failure_count
    chunks: list[tuple[int, list[int], list[int]]] = []  # (ledger, entry ids, locations)
    # A ledger's entries are adjacent once sorted: one entry-log call per chunk of its run.
    # The flush thread pauses between chunks: a flush is ~100 ms of Python for a 32 MB
    # cache, and without pauses the journal threads and the loop waited up to the GIL
    # switch interval (5 ms) at each hand-off while it ran (add p99 +5..10 ms).
    i = 0
    while i < len(keys):
        lid = keys[i][0]
        j = i + 1
        limit = min(len(keys), i + _FLUSH_CHUNK)
        while j < limit and keys[j][0] == lid:
            j += 1
        run = keys[i:j]
        written = entry_logger.add_entries(lid, [entries_of[key] for key in run])
        chunks.append((lid, [key[1] for key in run], written))
        i = j
        time.sleep(_FLUSH_PAUSE_S)
    entry_logger.flush()
    if entry_logger.failure_count != failures:
        # Some of this round's records were dropped by a failed write: index none of them.
        raise StorageError(f"{entry_logger.ledger_dir}: entry log write failed during flush; will retry")
    # Locations only after the entry log is durable; one batch per chunk, synced once.
    for lid, eids, locs in chunks:
        locations.put_locations(zip(itertools.repeat(lid), eids, locs))
        time.sleep(_FLUSH_PAUSE_S)
    locations.sync()
