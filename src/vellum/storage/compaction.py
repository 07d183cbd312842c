"""Entry-log compaction of one ledger dir: per-log metadata, the crash-safe copy of live
entries into a new log, recovery of interrupted compactions, and the compaction throttle.

BookKeeper's ``EntryLogCompactor`` / ``TransactionalEntryLogCompactor`` (seed 004), with the
order of design.md rule 8. Compacting log ``L``:

1. scan ``L``; an entry is *live* iff its ledger still exists locally **and** the location
   index points at exactly this record (``L``, offset). The entry-level check makes entries
   trimmed by a forced shrink (``LedgerStorage.trim``), deleted ledgers and entries rewritten
   elsewhere (recovery re-adds) dead, so compaction never resurrects them;
2. copy live entries (throttled) into a new log ``X`` written as ``X.log.compacting``;
3. seal + fsync ``X``, rename it to ``X.log.L.compacted`` (the durable marker of this
   compaction), hard-link it as ``X.log``, fsync the directory;
4. update the index, entry by entry *only where it still points into L* (compare under the
   storage's flush lock), in one batch, and sync it;
5. only then delete ``L`` (dir fsynced); finally drop the marker.

Crash at any step (``recover_interrupted_compactions`` runs at the start of every GC pass):
before 3, a ``*.log.compacting`` file exists and nothing points into it: it is deleted;
from 3 on, the marker names both logs: ``X.log`` is (re)linked, step 4 is redone for the
entries of ``X`` whose index still points into ``L`` (idempotent, never resurrects anything the
index dropped), ``L`` is deleted and the marker removed. Nothing live is lost, at most one file
leaks until the next pass.

A log whose scan stops on a corrupt record is never compacted or deleted (it is reported
instead): entries beyond the corruption may still be indexed.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from vellum.errors import StorageError
from vellum.format.entrylog import ScanStop
from vellum.ids import location_log_id, make_location
from vellum.storage.durable import fsync_dir, remove_file
from vellum.storage.entry_logger import CompactionLog, EntryLogger
from vellum.storage.ledger_storage import LedgerStorage

log = logging.getLogger(__name__)

#: crash-point names, in the order the steps happen (tests inject a crash at each)
STEP_COPIED = "copied"
STEP_LOG_SYNCED = "log_synced"
STEP_INDEX_UPDATED = "index_updated"
STEP_OLD_DELETED = "old_deleted"
STEPS = (STEP_COPIED, STEP_LOG_SYNCED, STEP_INDEX_UPDATED, STEP_OLD_DELETED)

StepHook = Callable[[str], None]


class RateLimiter:
    """A token bucket: ``acquire(n)`` blocks until ``n`` permits are available at ``rate``/s
    (burst: one second's worth). Guava's RateLimiter in BookKeeper."""

    def __init__(
        self,
        rate: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if rate <= 0:
            raise ValueError(f"rate {rate} must be positive")
        self.rate = float(rate)
        self._clock = clock
        self._sleep = sleep
        self._tokens = self.rate
        self._stamp = clock()
        self._lock = threading.Lock()

    def acquire(self, n: int = 1) -> None:
        with self._lock:
            now = self._clock()
            self._tokens = min(self.rate, self._tokens + (now - self._stamp) * self.rate)
            self._stamp = now
            self._tokens -= n
            deficit = -self._tokens
        if deficit > 0:
            # Debt model: a large request is let through at once and paid for by waiting, so an
            # entry larger than one second's budget cannot block forever.
            self._sleep(deficit / self.rate)


@dataclass
class EntryLogMetadata:
    """What GC knows about one flushed log: bytes per ledger (ledgers map or scan)."""

    log_id: int
    ledgers: dict[int, int]
    total_size: int
    file_size: int
    from_map: bool
    corrupt: str = ""  # why the scan stopped early; a corrupt log is never deleted or compacted

    @classmethod
    def extract(cls, logger: EntryLogger, log_id: int) -> EntryLogMetadata:
        """The ledgers map at the end of the log, else a full scan (BookKeeper's rule)."""
        info = logger.log_info(log_id) if _has_map(logger, log_id) else None
        if info is not None and info.from_map:
            return cls(log_id, dict(info.ledgers), sum(info.ledgers.values()), info.size, True)
        scanner = logger.scanner(log_id)
        sizes: dict[int, int] = {}
        for rec in scanner:
            sizes[rec.ledger_id] = sizes.get(rec.ledger_id, 0) + 4 + rec.size
        report = scanner.report
        # TRUNCATED is the normal tail of a log cut by a crash: nothing past it was ever synced,
        # so nothing past it is indexed. CORRUPT in the middle is different: keep the log.
        corrupt = report.reason if report.stop is ScanStop.CORRUPT else ""
        size = logger.log_path(log_id).stat().st_size
        return cls(log_id, sizes, sum(sizes.values()), size, False, corrupt)

    def remaining_size(self, trimmed: int = 0) -> int:
        return max(0, sum(self.ledgers.values()) - trimmed)

    def usage(self, trimmed: int = 0) -> float:
        """remaining / total (BookKeeper's usage): 1.0 = nothing dead, 0.0 = nothing live."""
        if self.total_size <= 0:
            return 0.0
        return self.remaining_size(trimmed) / self.total_size

    def is_empty(self) -> bool:
        return not self.ledgers and not self.corrupt


def _has_map(logger: EntryLogger, log_id: int) -> bool:
    # log_info falls back to an unreported scan; decide here whether it may be used.
    from vellum.format import entrylog as fmt

    path = logger.log_path(log_id)
    with open(path, "rb") as f:
        header = fmt.decode_header(f.read(fmt.HEADER_SIZE), where=str(path))
    return header.has_ledgers_map


@dataclass
class CompactionResult:
    log_id: int
    new_log_id: int | None = None
    entries_moved: int = 0
    bytes_moved: int = 0
    bytes_reclaimed: int = 0
    aborted: bool = False
    skipped: list[str] = field(default_factory=list)


class Throttle:
    """Compaction throttle by entries (``compactionRateByEntries``) or bytes
    (``isThrottleByBytes`` + ``compactionRateByBytes``). Both the read and the write of an entry
    pass through it (BookKeeper throttled only writes: PR #3976)."""

    def __init__(self, *, by_bytes: bool, rate_by_entries: int, rate_by_bytes: int) -> None:
        self.by_bytes = by_bytes
        self._limiter = RateLimiter(rate_by_bytes if by_bytes else rate_by_entries)

    def entry(self, size: int) -> None:
        self._limiter.acquire(size if self.by_bytes else 1)


def compact_entry_log(
    storage: LedgerStorage,
    meta: EntryLogMetadata,
    *,
    throttle: Throttle | None = None,
    deadline: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    hook: StepHook | None = None,
    should_stop: Callable[[], bool] = lambda: False,
) -> CompactionResult:
    """Compact one flushed log (module docstring). Returns what moved; ``aborted`` when the
    deadline passed or ``should_stop`` said so (nothing changed then: the partial copy is
    removed and the old log kept)."""
    logger = storage.entry_logger
    old_id = meta.log_id
    result = CompactionResult(old_id)
    if meta.corrupt:
        result.skipped.append(meta.corrupt)
        return result
    live = {lid for lid in meta.ledgers if storage.ledger_exists(lid)}
    out: CompactionLog | None = None
    moves: list[tuple[int, int, int, int]] = []
    finished = False
    try:
        scanner = logger.scanner(old_id)
        for rec in scanner:
            if should_stop() or (deadline is not None and clock() > deadline):
                result.aborted = True
                break
            if rec.ledger_id not in live:
                continue
            old = make_location(old_id, rec.offset)
            if storage.location_of(rec.ledger_id, rec.entry_id) != old:
                continue  # trimmed, deleted or rewritten elsewhere: dead at entry level
            if throttle is not None:
                throttle.entry(rec.size)
            if out is None:
                out = logger.new_compaction_log(old_id)
            new = out.add_entry(rec.ledger_id, rec.entry)
            moves.append((rec.ledger_id, rec.entry_id, old, new))
        if result.aborted:
            return result
        if scanner.report.stop is ScanStop.CORRUPT:
            result.skipped.append(scanner.report.reason)
            return result
        if hook is not None:
            hook(STEP_COPIED)
        if out is not None:
            out.finish()
            finished = True
            result.new_log_id = out.log_id
            result.bytes_moved = out.bytes_written
        if hook is not None:
            hook(STEP_LOG_SYNCED)
        result.entries_moved = storage.update_locations_if_unchanged(moves)
        if hook is not None:
            hook(STEP_INDEX_UPDATED)
        logger.delete_log(old_id)
        storage.forget_log(old_id)
        result.bytes_reclaimed = meta.file_size
        if hook is not None:
            hook(STEP_OLD_DELETED)
        if out is not None:
            out.done()
        return result
    finally:
        if out is not None and not finished:
            out.abort()


def recover_interrupted_compactions(storage: LedgerStorage) -> int:
    """Finish or roll back compactions a crash interrupted (module docstring); returns how
    many leftovers were handled. Idempotent."""
    logger = storage.entry_logger
    compacting, compacted = logger.compaction_files()
    for path in compacting:
        log.warning("removing unfinished compaction output %s (nothing points into it)", path)
        try:
            path.unlink()
        except FileNotFoundError:
            pass
    if compacting:
        fsync_dir(logger.current_dir)
    for new_id, old_id, marker in compacted:
        new_path = logger.log_path(new_id)
        try:
            if not new_path.exists():
                os.link(marker, new_path)
                fsync_dir(logger.current_dir)
        except OSError as e:
            raise StorageError(f"{marker}: cannot restore {new_path.name}: {e.strerror}") from None
        moves: list[tuple[int, int, int, int]] = []
        for rec in logger.scan(new_id):
            current = storage.location_of(rec.ledger_id, rec.entry_id)
            if current is not None and location_log_id(current) == old_id:
                moves.append((rec.ledger_id, rec.entry_id, current, make_location(new_id, rec.offset)))
        moved = storage.update_locations_if_unchanged(moves)
        if logger.log_path(old_id).exists():
            logger.delete_log(old_id)
        storage.forget_log(old_id)
        remove_file(marker)
        log.warning(
            "finished interrupted compaction of entry log %x into %x (%d index entries moved)",
            old_id, new_id, moved,
        )
    return len(compacting) + len(compacted)
