"""Entry-log compaction of one ledger dir: per-log metadata, the crash-safe copy of live
entries into a new log, recovery of interrupted compactions, and the compaction throttle.

BookKeeper's ``EntryLogCompactor`` / ``TransactionalEntryLogCompactor`` (requirement R5 of docs/correctness.md), with the
order of rule 8 of docs/correctness.md. Compacting log ``L``:

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

Unreadable records (docs/gc.md, "Corrupt entry logs"). Logs are scanned with
``skip_corrupt``: a record that cannot be read is skipped and the scan goes on, so one bad record
no longer stops a log from ever being collected. A skipping scan is a hint, the location index is
the authority on what is live, and a scan that did not read the whole log cleanly
(``ScanReport.complete`` false: skipped spans, a torn or cut tail) is never trusted alone:

- working out a log's ledgers by scanning (``EntryLogMetadata.extract``), the ledgers the index
  still has in that log are added, so a log is never deleted while the index points into it;
- compacting it, every index entry of a live ledger still pointing into the log must have been
  copied: those the scan did not reach are read by their indexed location (full checks). If any
  live entry cannot be read (or fails its ledger's digest), nothing is changed: the copy is
  discarded and the log is kept (``held``); GC compacts it again once the ledgers of those
  entries are dead, and deletes it once all its ledgers are.
  Compaction never copies a record the index does not point at exactly, so it fabricates
  nothing, and never launders a corrupt live copy into a fresh log.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from vellum.errors import CorruptionError, StorageError
from vellum.format.entrylog import SkippedSpan
from vellum.ids import location_log_id, location_offset, make_location
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
    #: unreadable spans the scan of this log skipped (what ``corrupt`` describes)
    skipped: list[SkippedSpan] = field(default_factory=list)
    #: non-empty: live entries in this log cannot be read, so compaction leaves it alone until
    #: the ledgers of those entries (``held_ledgers``) are dead (module docstring)
    held: str = ""
    held_ledgers: set[int] = field(default_factory=set)

    @property
    def corrupt(self) -> str:
        """What the scans of this log could not read ("" if nothing)."""
        if not self.skipped:
            return ""
        first = self.skipped[0]
        return (f"{len(self.skipped)} unreadable span(s), {sum(sp.size for sp in self.skipped)} bytes; "
                f"first at offset {first.offset}: {first.reason}")

    @classmethod
    def extract(cls, storage: LedgerStorage, log_id: int) -> EntryLogMetadata:
        """The ledgers map at the end of the log, else a scan (BookKeeper's rule) that skips
        unreadable records; if that scan did not read the whole log cleanly, the ledgers the
        index still has in the log are added (module docstring)."""
        logger = storage.entry_logger
        info = logger.log_info(log_id) if _has_map(logger, log_id) else None
        if info is not None and info.from_map:
            return cls(log_id, dict(info.ledgers), sum(info.ledgers.values()), info.size, True)
        scanner = logger.scanner(log_id, skip_corrupt=True)
        sizes: dict[int, int] = {}
        seen: set[int] = set()
        for rec in scanner:
            sizes[rec.ledger_id] = sizes.get(rec.ledger_id, 0) + 4 + rec.size
            seen.add(rec.offset)
        report = scanner.report
        size = logger.log_path(log_id).stat().st_size
        if not report.complete:
            # Not every record was read (a skipped span, or a tail cut by a crash or by a bad
            # size field): the index knows every live entry's place, so ask it. A record's size
            # field may be the damaged part: an implausible one counts nothing.
            for lid, _eid, loc in storage.indexed_in_log(log_id):
                if location_offset(loc) not in seen:
                    nbytes = logger.record_size(loc) or 0
                    sizes[lid] = sizes.get(lid, 0) + (nbytes if 4 + 16 <= nbytes <= size else 0)
        return cls(log_id, sizes, sum(sizes.values()), size, False, list(report.skipped))

    def remaining_size(self, trimmed: int = 0) -> int:
        return max(0, sum(self.ledgers.values()) - trimmed)

    def usage(self, trimmed: int = 0) -> float:
        """remaining / total (BookKeeper's usage): 1.0 = nothing dead, 0.0 = nothing live."""
        if self.total_size <= 0:
            return 0.0
        return self.remaining_size(trimmed) / self.total_size

    def is_empty(self) -> bool:
        """No live ledger left: the log may be deleted (for a scanned log whose scan was not
        complete, ``ledgers`` includes what the index has in it)."""
        return not self.ledgers


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
    #: unreadable spans the scan of the log skipped
    skipped: list[SkippedSpan] = field(default_factory=list)
    #: live entries that could not be read: ``(ledger, entry, offset, why)``; the log is kept
    unreadable: list[tuple[int, int, int, str]] = field(default_factory=list)

    @property
    def held(self) -> bool:
        """The log was kept because live entries in it cannot be read."""
        return bool(self.unreadable)


class Throttle:
    """Compaction throttle by entries (``compactionRateByEntries``) or bytes
    (``isThrottleByBytes`` + ``compactionRateByBytes``). Both the read and the write of an entry
    pass through it (BookKeeper throttled only writes: BookKeeper PR #3976)."""

    def __init__(
        self,
        *,
        by_bytes: bool,
        rate_by_entries: int,
        rate_by_bytes: int,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.by_bytes = by_bytes
        self._limiter = RateLimiter(rate_by_bytes if by_bytes else rate_by_entries, clock=clock, sleep=sleep)

    def entry(self, size: int) -> None:
        self._limiter.acquire(size if self.by_bytes else 1)


def compact_entry_log(
    storage: LedgerStorage,
    meta: EntryLogMetadata,
    *,
    throttle: Throttle | None = None,
    hook: StepHook | None = None,
    should_stop: Callable[[], bool] = lambda: False,
) -> CompactionResult:
    """Compact one flushed log (module docstring). Returns what moved; ``aborted`` when
    ``should_stop`` said so (shutdown; nothing changed then: the partial copy is removed and the
    old log kept).

    There is no time limit in here on purpose: a pass's max run time is checked by the caller
    before it starts each log, and a log once started is finished. Checking it per entry would
    throw away the copy of any log that takes longer than the limit, on every pass, so such a
    log would never be compacted."""
    logger = storage.entry_logger
    old_id = meta.log_id
    result = CompactionResult(old_id)
    live = {lid for lid in meta.ledgers if storage.ledger_exists(lid)}
    out: CompactionLog | None = None
    moves: list[tuple[int, int, int, int]] = []
    finished = False

    def move(ledger_id: int, entry_id: int, old: int, entry: bytes) -> None:
        nonlocal out
        if throttle is not None:
            throttle.entry(len(entry))
        if out is None:
            out = logger.new_compaction_log(old_id)
        moves.append((ledger_id, entry_id, old, out.add_entry(ledger_id, entry)))

    try:
        scanner = logger.scanner(old_id, skip_corrupt=True)
        for rec in scanner:
            if should_stop():
                result.aborted = True
                return result
            if rec.ledger_id not in live:
                continue
            old = make_location(old_id, rec.offset)
            if storage.location_of(rec.ledger_id, rec.entry_id) != old:
                continue  # trimmed, deleted or rewritten elsewhere: dead at entry level
            if not storage.entry_intact(rec.ledger_id, rec.entry):
                result.unreadable.append((rec.ledger_id, rec.entry_id, rec.offset,
                                          "fails its ledger's digest"))
                continue
            move(rec.ledger_id, rec.entry_id, old, rec.entry)
        report = scanner.report
        result.skipped = list(report.skipped)
        if not report.complete:
            # The scan did not read every record: every live entry the index still has in this
            # log must be copied, read by its indexed location where the scan did not reach it.
            copied = {(lid, eid) for lid, eid, _old, _new in moves}
            copied.update((lid, eid) for lid, eid, _off, _why in result.unreadable)
            for lid, eid, loc in storage.indexed_in_log(old_id, live):
                if (lid, eid) in copied:
                    continue
                if should_stop():
                    result.aborted = True
                    return result
                try:
                    entry = logger.read_entry(lid, eid, loc)
                except (CorruptionError, StorageError) as e:
                    result.unreadable.append((lid, eid, location_offset(loc), str(e)))
                    continue
                if not storage.entry_intact(lid, entry):
                    result.unreadable.append((lid, eid, location_offset(loc), "fails its ledger's digest"))
                    continue
                move(lid, eid, loc, entry)
        if result.unreadable:
            return result  # keep the log (and everything pointing into it): the copy is dropped
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
