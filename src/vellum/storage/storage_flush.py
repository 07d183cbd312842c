"""The flush side of one ledger storage: the write-cache swap with its back-pressure, the flush
thread, ``flush()`` (the checkpoint's), and entry-log sealing after flushes (requirement R1 of
docs/correctness.md).

Swap: an add that finds the active write cache full swaps it into the *flushing* slot
(``make_room``, under the storage's ``cond``) and wakes the flush thread; if the flushing cache
is still being written the adder waits up to ``max_throttle_time_ms`` and is then rejected
(``OperationRejectedError``, BookKeeper's back-pressure).

Flush (``write_out`` of ``storage/write_cache.py``): sort the swapped cache by (ledger, entry) ->
append to the entry log -> fsync the entry log -> write the locations in RocksDB batches -> sync
the indexes -> drop the cache. Until the last step the entries stay readable from the cache, so
a failed flush loses nothing and is retried with the cache intact. ``flush()`` swaps the active
cache only into a free slot: a cache an add swapped in meanwhile is written out first, never
replaced. After ``flush()`` returns, every entry added and every ledger-data change made before
the call is durable in the entry log and the indexes.

Entry log per ledger: ``note_ledger_closed`` remembers the advisory "ledger closed"; the first
``flush()`` that finds none of that ledger's entries left in the write caches seals its log.
Every ``flush()`` also seals logs idle past the access expiry.

Flushes hold ``flush_lock`` (then ``cond`` for the cache slots): see ``storage/storage_lock.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from vellum.errors import OperationRejectedError
from vellum.storage.entry_logger import EntryLogger
from vellum.storage.index import EntryLocationIndex, LedgerMetadataIndex
from vellum.storage.storage_lock import StorageLock
from vellum.storage.trimmed_bytes import TrimmedBytes
from vellum.storage.write_cache import WriteCaches, write_out

#: pause of the flush thread after a failed background flush before it tries again
FLUSH_RETRY_DELAY_S = 1.0


class StorageFlusher:
    """Write-cache swap, back-pressure, flush thread and ``flush()`` of one ledger storage (see
    the module docstring)."""

    def __init__(self, lock: StorageLock, caches: WriteCaches, entry_logger: EntryLogger,
                 locations: EntryLocationIndex, ledgers_index: LedgerMetadataIndex, trimmed: TrimmedBytes,
                 *, max_throttle_time_ms: int, flush_hook: Callable[[], None] | None) -> None:
        self._lock = lock
        self._cond = lock.cond
        self._flush_lock = lock.flush_lock
        self.ledger_dir = lock.ledger_dir
        self._caches = caches
        self.entry_logger = entry_logger
        self.locations = locations
        self.ledgers_index = ledgers_index
        self._trimmed = trimmed
        self._max_throttle_s = max_throttle_time_ms / 1000.0
        self._flush_hook = flush_hook  # tests: runs before each write-out
        self._closed_ledgers: set[int] = set()  # advisory "ledger closed", not yet rotated
        self._last_flush_error: BaseException | None = None
        self._retry_at = 0.0
        self._flush_thread = threading.Thread(
            target=self._flush_loop, name=f"ledger-storage-flush-{self.ledger_dir}", daemon=True
        )
        #: whether the flush thread runs (``start``)
        self.threaded = False

    def start(self) -> None:
        """Start the flush thread (not started: the simulator, where ``flush()`` writes a swapped
        cache out)."""
        self._flush_thread.start()
        self.threaded = True

    def join(self) -> None:
        """Wait for the flush thread, which ends once the storage is marked closed."""
        if self.threaded:
            self._flush_thread.join()

    def can_take(self, nbytes: int) -> bool:
        """Would ``nbytes`` more of entries go into the write cache now without waiting for a
        flush? (Advisory, read without the lock: a caller that is the only adder can rely on it.)"""
        caches = self._caches
        active = caches.active
        return not self._lock.closed and (active.size + nbytes <= active.max_bytes
                                          or (caches.flushing is None and nbytes <= active.max_bytes))

    def make_room(self, size: int, ledger_id: int, entry_id: int, deadline: float | None) -> float | None:
        """Caller holds ``_cond`` and the active cache has no room for ``size`` bytes: swap it
        for a flush, or wait (up to ``deadline``, set now if None) for the flushing slot to
        empty. Returns the deadline; raises ``OperationRejectedError`` past it."""
        caches = self._caches
        while not caches.active.has_room(size):
            if caches.swap():
                self._cond.notify_all()  # wake the flush thread
                break
            now = time.monotonic()
            if deadline is None:
                deadline = now + self._max_throttle_s
            if now >= deadline:
                why = f" (last flush failed: {self._last_flush_error})" if self._last_flush_error else ""
                raise OperationRejectedError(
                    f"{self.ledger_dir}: write cache full and the previous cache is still being "
                    f"flushed after {self._max_throttle_s * 1000:.0f} ms; rejecting ledger "
                    f"{ledger_id} entry {entry_id}{why}"
                )
            self._cond.wait(deadline - now)
            self._lock.check_open()
        return deadline

    def _flush_loop(self) -> None:
        """The storage's flush thread: writes out a swapped (full) cache."""
        while True:
            with self._cond:
                while not self._lock.closed:
                    if self._caches.flushing is not None:
                        delay = self._retry_at - time.monotonic()
                        if delay <= 0:
                            break
                        self._cond.wait(delay)  # back off after a failure; flush() retries sooner
                    else:
                        self._cond.wait()
                if self._lock.closed:
                    return
            try:
                with self._flush_lock:
                    self._flush_swapped()
            except Exception as e:  # kept: writers' rejections report it, flush() raises its own
                with self._cond:
                    self._last_flush_error = e
                    self._retry_at = time.monotonic() + FLUSH_RETRY_DELAY_S
                    self._cond.notify_all()

    def _flush_swapped(self) -> None:
        """Write out the flushing cache, if any. Caller holds ``_flush_lock``."""
        with self._cond:
            cache = self._caches.flushing
        if cache is None:
            return
        if self._flush_hook is not None:
            self._flush_hook()
        write_out(cache, self.entry_logger, self.locations)
        self.ledgers_index.sync()
        with self._cond:
            self._caches.flushing = None
            self._last_flush_error = None
            self._retry_at = 0.0
            self._cond.notify_all()

    def flush(self) -> None:
        """Make everything added (and every ledger-data change) before this call durable."""
        with self._flush_lock:
            self._lock.check_open()
            self._flush_swapped()
            with self._cond:
                # Not if an add swapped a full cache in since: that one is written out next,
                # and the entries added before this call are in it.
                if self._caches.active:
                    self._caches.swap()
            self._flush_swapped()
            # Ledger data and deletes reach RocksDB without sync; an empty flush still syncs them.
            self.entry_logger.flush()
            self.locations.sync()
            self.ledgers_index.sync()
            self._trimmed.save()  # after the index sync that made the trims durable
            if self.entry_logger.entry_log_per_ledger:
                self._rotate_after_flush()

    def _rotate_after_flush(self) -> None:
        """Entry log per ledger: seal the logs of closed ledgers whose entries are all flushed,
        and of idle mappings. Caller holds ``_flush_lock`` (so no flush runs concurrently)."""
        with self._cond:
            done = [lid for lid in self._closed_ledgers if not self._caches.holds_ledger(lid)]
            self._closed_ledgers.difference_update(done)
        for lid in done:
            self.entry_logger.rotate_ledger(lid)
        self.entry_logger.rotate_idle()

    def note_ledger_closed(self, ledger_id: int) -> None:
        """Advisory "ledger closed" (requirement R1 of docs/correctness.md): its log is sealed at the next checkpoint after
        its entries are flushed. Only meaningful with entry log per ledger."""
        if self.entry_logger.entry_log_per_ledger:
            with self._cond:
                self._closed_ledgers.add(ledger_id)

    def active_log_count(self) -> int:
        """Entry logs active in this dir, counting those the next flush opens for cached
        entries (requirement R1 of docs/correctness.md: a new ledger goes to the writable dir with the fewest)."""
        with self._cond:
            cached = self._caches.ledgers()
        if self.entry_logger.entry_log_per_ledger:
            return len(cached | set(self.entry_logger.active_ledgers()))
        return 1 if cached or self.entry_logger.active_log_ids() else 0

    def rotate_entry_logs(self) -> None:
        """Seal every active entry log (the ledger dir became full: requirement R1 of docs/correctness.md)."""
        with self._flush_lock:
            self.entry_logger.rotate()
