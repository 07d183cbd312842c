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
#: the entries of a ledger the active cache does not hold (``get_run``)
_NONE_HELD: dict[int, Stored] = {}


class WriteCache:
    """Entries by ledger, then by entry id, with their total size and each ledger's greatest
    entry id. Keyed by plain ints per ledger (no ``(ledger, entry)`` tuple per entry): a batch
    of one ledger goes in with one dict update, and a flush sorts each ledger's entry ids as
    ints (already in order when the writer's adds came in order)."""

    __slots__ = ("last", "ledgers", "max_bytes", "size")

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.ledgers: dict[int, dict[int, Stored]] = {}
        self.last: dict[int, int] = {}
        self.size = 0

    def __bool__(self) -> bool:
        """Whether it holds any entry."""
        return bool(self.ledgers)

    def get(self, ledger_id: int, entry_id: int) -> Stored | None:
        held = self.ledgers.get(ledger_id)
        return held.get(entry_id) if held is not None else None

    def put(self, ledger_id: int, entry_id: int, entry: Stored) -> None:
        held = self.ledgers.get(ledger_id)
        if held is None:
            held = self.ledgers[ledger_id] = {}
        old = held.get(entry_id)
        if old is not None:
            self.size -= len(old)
        held[entry_id] = entry
        self.size += len(entry)
        if entry_id > self.last.get(ledger_id, INVALID_ENTRY_ID):
            self.last[ledger_id] = entry_id

    def put_new(self, ledger_id: int, entry_ids: list[int], entries: Sequence[Stored], nbytes: int) -> bool:
        """``put`` of entries of one ledger at once, ``nbytes`` their total size, when none of
        them is held already (the common case: a writer's new entries); False, and nothing
        put, if one is (``put`` each then: it replaces and re-counts)."""
        held = self.ledgers.get(ledger_id)
        if held is None:
            held = self.ledgers[ledger_id] = {}
        elif not held.keys().isdisjoint(entry_ids):
            return False
        before = len(held)
        held.update(zip(entry_ids, entries))
        if len(held) - before == len(entry_ids):
            self.size += nbytes
        else:  # an id twice in the batch: the later entry is the one held
            self.size += sum(len(held[e]) for e in set(entry_ids))
        top = max(entry_ids)
        if top > self.last.get(ledger_id, INVALID_ENTRY_ID):
            self.last[ledger_id] = top
        return True

    def has_room(self, n: int) -> bool:
        return not self.ledgers or self.size + n <= self.max_bytes

    def drop_ledger(self, ledger_id: int, below: int | None = None) -> None:
        """Drop a ledger's entries (all, or those with id < ``below``)."""
        held = self.ledgers.get(ledger_id)
        if held is None:
            return
        if below is not None:
            for entry_id in [e for e in held if e < below]:
                self.size -= len(held.pop(entry_id))
            if held:
                self.last[ledger_id] = max(held)
                return
        else:
            self.size -= sum(map(len, held.values()))
        del self.ledgers[ledger_id]
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
        found = self.active.get(*key)
        if found is None and self.flushing is not None:
            found = self.flushing.get(*key)
        return found

    def get_run(self, ledger_id: int, first: int, stride: int, most: int) -> list[Stored]:
        """Entries ``first, first + stride, ...`` while cached, at most ``most``: a multi-entry
        read's run, looked up in one call (one lock hold for the caller)."""
        active = self.active.ledgers.get(ledger_id, _NONE_HELD)
        flushing = self.flushing.ledgers.get(ledger_id) if self.flushing is not None else None
        out: list[Stored] = []
        entry_id = first
        while len(out) < most:
            found = active.get(entry_id)
            if found is None:
                if flushing is None:
                    break
                found = flushing.get(entry_id)
                if found is None:
                    break
            out.append(found)
            entry_id += stride
        return out

    def contains(self, key: tuple[int, int]) -> bool:
        return self.get(key) is not None

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
        ids = set(self.active.ledgers.get(ledger_id, ()))
        if self.flushing is not None:
            ids.update(self.flushing.ledgers.get(ledger_id, ()))
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
    failures = entry_logger.failure_count
    chunks: list[tuple[int, list[int], list[int]]] = []  # (ledger, entry ids, locations)
    # One entry-log call per chunk of a ledger's entries, taken in entry order with map (no
    # Python step per entry; the entry log and the index take the chunk whole as well).
    # The flush thread pauses between chunks: a flush is ~100 ms of Python for a 32 MB
    # cache, and without pauses the journal threads and the loop waited up to the GIL
    # switch interval (5 ms) at each hand-off while it ran (add p99 +5..10 ms).
    for lid in sorted(cache.ledgers):
        held = cache.ledgers[lid]
        ids = sorted(held)  # ints, and in order already when the adds came in order
        for start in range(0, len(ids), _FLUSH_CHUNK):
            run = ids[start:start + _FLUSH_CHUNK]
            written = entry_logger.add_entries(lid, list(map(held.__getitem__, run)))
            chunks.append((lid, run, written))
            time.sleep(_FLUSH_PAUSE_S)
    entry_logger.flush()
    if entry_logger.failure_count != failures:
        # Some of this round's records were dropped by a failed write: index none of them.
        raise StorageError(f"{entry_logger.ledger_dir}: entry log write failed during flush; will retry")
    # Locations only after the entry log is durable; one batch per chunk, synced once.
    for lid, eids, locs in chunks:
        locations.put_run(lid, eids, locs)
        time.sleep(_FLUSH_PAUSE_S)
    locations.sync()
