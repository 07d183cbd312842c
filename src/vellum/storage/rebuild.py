"""Rebuild a ledger directory's location index (and ledger set) from its entry logs.

For when ``current/locations`` is lost or corrupt (BookKeeper's ``LocationsIndexRebuildOp``):
scan every entry log in ascending log id order and index each record; a later record of the same
(ledger, entry) overwrites an earlier one, so the newest copy (compaction, re-replication) wins.

Invariants:
- The new index is built in ``current/locations.rebuild`` and only replaces ``current/locations``
  once complete and synced; an interrupted rebuild leaves the old index untouched.
- The bookie must be stopped: the rebuild takes the directories' ``current/.lock`` (the lock a
  bookie holds for its life, ``storage/markers.py``) and opens the ``ledgers`` database first,
  whose RocksDB LOCK also fails with "in use" while any process has the index open.
- If the ``ledgers`` database is intact and lists ledgers, only those ledgers are indexed (as
  BookKeeper does: a ledger GC'd locally must not come back from old logs). If it is missing,
  empty or corrupt (a corrupt one is moved aside), every ledger found in the logs is indexed and
  recorded with an empty master key and ``fenced=True``: its previous state is unknown, and a
  fenced ledger refuses writers, which is the safe side (the writer does an ensemble change).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from vellum.errors import CorruptionError
from vellum.format.entrylog import ScanStop, VerifyFn
from vellum.format.ledger_index import LedgerData
from vellum.storage.durable import fsync_dir
from vellum.storage.entry_logger import EntryLogger
from vellum.storage.index import LEDGERS_DB, LOCATIONS_DB, EntryLocationIndex, LedgerMetadataIndex
from vellum.storage.markers import acquire_dir_locks

REBUILD_DIR = LOCATIONS_DB + ".rebuild"
BATCH = 10_000

#: progress(logs_done, logs_total, entries_indexed)
ProgressFn = Callable[[int, int, int], None]


@dataclass
class RebuildReport:
    logs: int = 0
    entries: int = 0
    ledgers: set[int] = field(default_factory=set)
    skipped_entries: int = 0  # records of ledgers unknown to an intact ledgers database
    only_known_ledgers: bool = False
    problems: list[str] = field(default_factory=list)


def rebuild_index(
    ledger_dir: Path,
    index_dir: Path | None = None,
    *,
    verify: VerifyFn | None = None,
    progress: ProgressFn | None = None,
) -> RebuildReport:
    """Rebuild ``<index_dir>/current/locations`` from ``<ledger_dir>/current/*.log``."""
    ledger_dir = Path(ledger_dir)
    index_dir = Path(index_dir) if index_dir is not None else ledger_dir
    current = ledger_dir / "current"
    if not current.is_dir():
        raise CorruptionError(f"{current}: not a ledger directory (no current/)")
    index_current = index_dir / "current"
    locks = acquire_dir_locks([ledger_dir, index_dir])
    try:
        return _rebuild_locked(ledger_dir, index_dir, index_current, verify, progress)
    finally:
        for lock in locks:
            lock.release()


def _rebuild_locked(
    ledger_dir: Path,
    index_dir: Path,
    index_current: Path,
    verify: VerifyFn | None,
    progress: ProgressFn | None,
) -> RebuildReport:
    report = RebuildReport()

    try:
        ledgers_index = LedgerMetadataIndex(index_dir)
    except CorruptionError as e:
        aside = _free_name(index_current / (LEDGERS_DB + ".corrupt"))
        (index_current / LEDGERS_DB).rename(aside)
        report.problems.append(f"{e}; moved aside to {aside}")
        ledgers_index = LedgerMetadataIndex(index_dir)
    logger: EntryLogger | None = None
    try:
        known: set[int] = set()
        deleted: set[int] = set()  # tombstones: their entries stay out of the new index
        for lid in ledgers_index.ledgers():
            data = ledgers_index.get(lid)
            (deleted if data is not None and not data.exists else known).add(lid)
        report.only_known_ledgers = bool(known)
        tmp = index_current / REBUILD_DIR
        if tmp.exists():
            shutil.rmtree(tmp)
        new_index = EntryLocationIndex(index_dir, name=REBUILD_DIR)
        try:
            logger = EntryLogger(ledger_dir, log_size_limit=(1 << 32) - 1, preallocate=False)
            log_ids = logger.log_ids()
            for done, log_id in enumerate(log_ids, 1):
                _index_log(logger, log_id, new_index, known, deleted, verify, report)
                if progress is not None:
                    progress(done, len(log_ids), report.entries)
            new_index.sync()
        finally:
            new_index.close()
        final = index_current / LOCATIONS_DB
        old = _free_name(index_current / (LOCATIONS_DB + ".old"))
        if final.exists():
            final.rename(old)
        tmp.rename(final)
        fsync_dir(index_current)
        if old.exists():
            shutil.rmtree(old)
        for lid in sorted(report.ledgers - known):
            ledgers_index.put(lid, LedgerData(exists=True, fenced=True, master_key=b""))
        ledgers_index.sync()
    finally:
        if logger is not None:
            logger.close()
        ledgers_index.close()
    return report


def _index_log(
    logger: EntryLogger,
    log_id: int,
    index: EntryLocationIndex,
    known: set[int],
    deleted: set[int],
    verify: VerifyFn | None,
    report: RebuildReport,
) -> None:
    try:
        scanner = logger.scanner(log_id, verify=verify)
    except CorruptionError as e:
        report.problems.append(f"skipped: {e}")
        return
    batch: list[tuple[int, int, int]] = []
    for rec in scanner:
        if (known and rec.ledger_id not in known) or rec.ledger_id in deleted:
            report.skipped_entries += 1
            continue
        batch.append((rec.ledger_id, rec.entry_id, (log_id << 32) | rec.offset))
        report.ledgers.add(rec.ledger_id)
        if len(batch) >= BATCH:
            index.put_locations(batch)
            report.entries += len(batch)
            batch.clear()
    if batch:
        index.put_locations(batch)
        report.entries += len(batch)
    report.logs += 1
    if scanner.report.stop is not ScanStop.END:
        report.problems.append(scanner.describe_stop())


def _free_name(base: Path) -> Path:
    candidate, n = base, 0
    while candidate.exists():
        n += 1
        candidate = base.with_name(f"{base.name}.{n}")
    return candidate
