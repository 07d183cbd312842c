"""The read-ahead cache of one ledger storage: entries read ahead of sequential readers.

A read that misses the write caches and this cache reads its entry from an entry log; if the
reader moves forward (the miss lies within one read-ahead window after the ledger's previous
miss), it also reads up to ``batch_size`` following entries (``dbStorage_readAheadCacheBatchSize``,
at most ``batch_max_bytes``, ``dbStorage_readAheadCacheBatchBytesSize``) of the same ledger,
adjacent thanks to the sorted flush, into this cache. This class decides *whether* to read
ahead and how far (``claim`` grants the window) and keeps what was read (``fill``); ledger
storage reads the window and verifies it in between.

Invariants:
- A window is read ahead once: a miss inside a window already claimed (still being read, or
  read and evicted since) claims nothing. Pipelined readers miss on entries whose read-ahead is
  still running; they must not each read the same range again. A miss that jumps away from
  the ledger's previous one (a random reader) claims nothing.
- Nothing of a deleted or trimmed range is cached after ``evict``: it bumps ``epoch``, and a
  ``fill`` whose reader took ``epoch`` before the evict (ledger storage takes it together with
  its write-cache lookup) is dropped.
- Bounded by ``max_bytes``, least recently used evicted first; entries are copies (a cached view
  would pin its whole read buffer).

Thread-safe (one lock); ``epoch`` is read without it (an int that only grows).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

from vellum.format.entry import BytesLike

#: ledgers whose read pattern is remembered before the memory starts over
_MAX_TRACKED_LEDGERS = 10_000


class ReadAheadCache:
    """Entries read ahead for sequential readers (see the module docstring)."""

    def __init__(self, *, max_bytes: int, batch_size: int, batch_max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.batch_size = batch_size
        self.batch_max_bytes = batch_max_bytes
        self.epoch = 0  # bumped by evict: read-ahead results older than it are dropped
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[int, int], bytes] = OrderedDict()
        self._size = 0
        self._last_miss: dict[int, int] = {}  # ledger -> entry id of its last read-cache miss
        self._ahead_upto: dict[int, int] = {}  # ledger -> last entry id a read-ahead covers

    @property
    def enabled(self) -> bool:
        return self.batch_size > 0 and self.max_bytes > 0

    def get(self, key: tuple[int, int]) -> bytes | None:
        """The cached entry (now the most recently used), or None."""
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
            return found

    def get_run(self, ledger_id: int, first: int, stride: int, most: int) -> list[bytes]:
        """Entries ``first, first + stride, ...`` while cached (now the most recently used), at
        most ``most``: a multi-entry read's run, under one lock hold."""
        out: list[bytes] = []
        with self._lock:
            entries = self._entries
            entry_id = first
            while len(out) < most:
                key = (ledger_id, entry_id)
                found = entries.get(key)
                if found is None:
                    break
                entries.move_to_end(key)
                out.append(found)
                entry_id += stride
        return out

    def contains(self, key: tuple[int, int]) -> bool:
        with self._lock:
            return key in self._entries

    def claim(self, ledger_id: int, entry_id: int) -> tuple[int, int] | None:
        """A miss on ``entry_id`` read it from disk: the window to read ahead after it, ``(most
        entries, most bytes)`` (``batch_size``, ``batch_max_bytes``), now claimed; None if the
        reader does not move forward, a read-ahead already covered the entry, or read-ahead is
        off. The reader reads the window, verifies it and hands it to ``fill``."""
        if not self.enabled:
            return None
        # Read ahead only for a reader that moves forward (this miss lies within one read-ahead
        # window after the previous one; a striped reader skips the entries other bookies
        # hold): for random reads it multiplied the bytes read by the batch size.
        with self._lock:
            previous = self._last_miss.get(ledger_id)
            self._last_miss[ledger_id] = entry_id
            sequential = previous is None or 0 < entry_id - previous <= self.batch_size + 1
            # Inside a window already read ahead (running, or evicted since): no repeat.
            covered = entry_id <= self._ahead_upto.get(ledger_id, -1)
            if sequential and not covered:
                self._ahead_upto[ledger_id] = entry_id + self.batch_size
            if len(self._last_miss) > _MAX_TRACKED_LEDGERS:
                self._last_miss.clear()
                self._ahead_upto.clear()
            return (self.batch_size, self.batch_max_bytes) if sequential and not covered else None

    def fill(self, ledger_id: int, entry_id: int, following: Sequence[BytesLike], epoch: int) -> None:
        """Cache what the read-ahead claimed after ``entry_id`` found (entries ``entry_id + 1,
        entry_id + 2, ...``, verified by the caller), unless an ``evict`` happened since ``epoch``."""
        with self._lock:
            # What the window really covered (the byte bound or the end of the run may cut it).
            last = entry_id + len(following)
            if self._ahead_upto.get(ledger_id, -1) == entry_id + self.batch_size:
                self._ahead_upto[ledger_id] = last
            if epoch != self.epoch:
                return
            for eid, view in enumerate(following, entry_id + 1):
                key = (ledger_id, eid)
                if key in self._entries:
                    continue
                data = bytes(view)  # a copy: a cached view would pin its whole read buffer
                self._entries[key] = data
                self._size += len(data)
            while self._size > self.max_bytes and self._entries:
                _, old = self._entries.popitem(last=False)
                self._size -= len(old)

    def evict(self, ledger_id: int, below: int | None) -> None:
        """Drop the ledger's entries (all, or those with id < ``below``) and every read-ahead
        still running (deleted or trimmed: nothing of it may be cached again)."""
        with self._lock:
            self.epoch += 1
            for key in [k for k in self._entries if k[0] == ledger_id and (below is None or k[1] < below)]:
                self._size -= len(self._entries.pop(key))
