"""The checkpoint sequence (BookKeeper's SyncThread): make everything journaled before a mark
durable in ledger storage, persist the mark, then delete journals below it.

Sequence, for N journals and M ledger storages:

1. ``marks = [j.current_mark() for j in journals]``, taken *before* flushing: every record
   journaled before a journal's mark was already put in a ledger storage's write cache (the
   write path adds to storage first, then journals), so the flush below covers it;
2. ``storage.flush()`` for every storage (sorted write cache -> entry log -> index, fsynced);
3. write ``lastMark`` (``lastMark.<i>`` when N > 1) in every writable ledger dir's ``current/``
   (temp file, fsync, rename, fsync dir); if no dir is writable, in every dir (16 bytes fit in a
   dir that is "full" at 95%, and a stuck mark would pile up journals);
4. only then ``j.gc_journals(mark)`` for every journal.

Invariants (rule 7 of docs/correctness.md):
- a mark only moves forward: the checkpointer remembers the last persisted mark per journal
  (seeded from ``read_last_marks`` at start) and refuses a journal that reports a smaller one;
- if a flush or a mark write fails, nothing after it happens (no mark, no journal deletion) and
  StorageError is raised: fail-stop, every later checkpoint raises too, the bookie must not
  continue as if the data were durable;
- a failure deleting journals (step 4) raises StorageError but does not latch: the mark is
  already durable and the next checkpoint retries;
- one checkpoint at a time (``checkpoint_now`` and the sync thread share a lock).

``read_last_marks`` gives, per journal, the maximum mark over all ledger dirs: a corrupt file in
one dir is logged and skipped; if every existing file for a journal is corrupt, CorruptionError
names them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from vellum import stats
from vellum.errors import CorruptionError, StorageError
from vellum.format.lastmark import ZERO_MARK, LogMark, last_mark_file_name
from vellum.storage.dirs import current_dir
from vellum.storage.durable import write_file_durably

log = logging.getLogger(__name__)

_CHECKPOINTS = stats.counter("bookie_checkpoints", "completed checkpoints (mark persisted)")
_CHECKPOINT_FAILURES = stats.counter("bookie_checkpoint_failures", "checkpoints that failed (fail-stop)")
_CHECKPOINT_LAST_DURATION = stats.gauge(
    "bookie_checkpoint_last_duration_seconds", "duration of the last completed checkpoint"
)


class JournalLike(Protocol):
    """What the checkpointer needs from a journal."""

    def current_mark(self) -> LogMark:
        """The position after the last record handed to ledger storage and journaled."""
        ...

    def gc_journals(self, mark: LogMark) -> list[Path]:
        """Delete journal files wholly below ``mark`` (keeping ``journalMaxBackups``)."""
        ...


class FlushableStorage(Protocol):
    """What the checkpointer needs from a ledger storage."""

    def flush(self) -> None:
        """Persist everything added so far (entry logs and index fsynced)."""
        ...


class WritableDirs(Protocol):
    """What the checkpointer needs from the ledger dirs manager."""

    @property
    def dirs(self) -> tuple[Path, ...]: ...

    def writable_dirs(self) -> list[Path]: ...


def last_mark_path(ledger_dir: Path | str, journal_index: int, journal_count: int) -> Path:
    """``<ledgerDir>/current/lastMark[.<i>]``."""
    return current_dir(ledger_dir) / last_mark_file_name(journal_index, journal_count)


def read_last_mark_file(path: Path) -> LogMark | None:
    """The mark in one file; None if it does not exist; CorruptionError naming the file."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise CorruptionError(f"{path}: unreadable ({e.strerror or e})") from e
    return LogMark.decode(data, where=str(path))


def read_last_marks(ledger_dirs: Sequence[Path | str], journal_count: int) -> list[LogMark]:
    """Per journal, the greatest mark found in any ledger dir (ZERO_MARK when none exists)."""
    if journal_count < 1:
        raise ValueError(f"journal_count {journal_count} must be at least 1")
    marks: list[LogMark] = []
    for i in range(journal_count):
        best: LogMark | None = None
        corrupt: list[str] = []
        for d in ledger_dirs:
            path = last_mark_path(d, i, journal_count)
            try:
                mark = read_last_mark_file(path)
            except CorruptionError as e:
                log.warning("ignoring corrupt lastMark file: %s", e)
                corrupt.append(str(e))
                continue
            if mark is not None and (best is None or mark > best):
                best = mark
        if best is None:
            if corrupt:
                raise CorruptionError(
                    f"every lastMark file of journal {i} is corrupt: " + "; ".join(corrupt)
                )
            best = ZERO_MARK
        marks.append(best)
    return marks


class Checkpointer:
    """Runs the checkpoint sequence (module docstring) on demand or periodically."""

    def __init__(
        self,
        journals: Sequence[JournalLike],
        storages: Sequence[FlushableStorage],
        ledger_dirs: WritableDirs,
        *,
        initial_marks: Sequence[LogMark] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not journals:
            raise ValueError("a checkpointer needs at least one journal")
        self._journals = tuple(journals)
        self._storages = tuple(storages)
        self._dirs = ledger_dirs
        if initial_marks is None:
            initial_marks = [ZERO_MARK] * len(self._journals)
        if len(initial_marks) != len(self._journals):
            raise ValueError(f"{len(initial_marks)} initial marks for {len(self._journals)} journals")
        self._persisted = list(initial_marks)
        self._clock = clock
        self._lock = threading.Lock()  # one checkpoint at a time
        self._failed: StorageError | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.checkpoint_count = 0
        self.last_duration_s = 0.0

    @property
    def persisted_marks(self) -> list[LogMark]:
        """The marks most recently written to disk (or the initial ones)."""
        with self._lock:
            return list(self._persisted)

    @property
    def failure(self) -> StorageError | None:
        """The error that stopped checkpointing, if any (fail-stop: no further checkpoints)."""
        return self._failed

    def checkpoint_now(self) -> list[LogMark]:
        """Run one checkpoint and return the persisted marks. Raises StorageError on failure,
        after which every later call raises too (the bookie must shut down)."""
        with self._lock:
            if self._failed is not None:
                raise StorageError(f"checkpointing stopped after an earlier failure: {self._failed}")
            start = self._clock()
            try:
                marks, gc_errors = self._checkpoint_locked()
            except StorageError as e:
                self._failed = e
                _CHECKPOINT_FAILURES.inc()
                raise
            duration = self._clock() - start
            self.checkpoint_count += 1
            self.last_duration_s = duration
            _CHECKPOINTS.inc()
            _CHECKPOINT_LAST_DURATION.set(duration)
            if gc_errors:
                # The mark is durable, so nothing is lost; the next checkpoint retries deletion.
                # Raised (not latched) so the caller sees the journal disk is in trouble.
                raise StorageError("journal GC after checkpoint failed: " + "; ".join(gc_errors))
            return marks

    def _checkpoint_locked(self) -> tuple[list[LogMark], list[str]]:
        # 1. Marks first: everything journaled before them is already in a write cache.
        marks = [j.current_mark() for j in self._journals]
        for i, (mark, prev) in enumerate(zip(marks, self._persisted)):
            if mark < prev:
                raise StorageError(
                    f"journal {i} reports mark {mark} below the persisted mark {prev}: "
                    "a mark never moves backwards"
                )
        # 2. Flush every storage; any failure stops the sequence before the mark is written.
        for s in self._storages:
            try:
                s.flush()
            except Exception as e:
                log.error("ledger storage flush failed during checkpoint: %s", e)
                raise StorageError(f"checkpoint aborted, ledger storage flush failed: {e}") from e
        # 3. Persist the marks.
        dirs = self._dirs.writable_dirs() or list(self._dirs.dirs)
        count = len(self._journals)
        for d in dirs:
            for i, mark in enumerate(marks):
                write_file_durably(last_mark_path(d, i, count), mark.encode())
        self._persisted = marks
        # 4. Only below a persisted mark may journals go.
        errors: list[str] = []
        for i, (j, mark) in enumerate(zip(self._journals, marks)):
            try:
                removed = j.gc_journals(mark)
                if removed:
                    log.info("journal %d: removed %s below %s", i, [p.name for p in removed], mark)
            except Exception as e:
                errors.append(f"journal {i}: {e}")
        return list(marks), errors

    # -- sync thread ----------------------------------------------------------------------

    def start(self, interval_ms: int) -> None:
        """Checkpoint every ``interval_ms`` (``flushInterval``) on a daemon thread. A failure
        stops the thread; ``failure`` tells why."""
        if interval_ms <= 0:
            raise ValueError(f"checkpoint interval {interval_ms} ms must be positive")
        if self._thread is not None:
            raise RuntimeError("the checkpointer is already running")
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, args=(interval_ms / 1000.0,), name="sync-thread", daemon=True
        )
        self._thread.start()

    def _run(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                self.checkpoint_now()
            except StorageError:
                if self._failed is not None:
                    log.exception("checkpoint failed; the sync thread stops (fail-stop)")
                    return
                log.exception("journal GC failed after a checkpoint; will retry")

    def stop(self, *, final_checkpoint: bool = False) -> None:
        """Stop the sync thread; with ``final_checkpoint`` run one last checkpoint (clean
        shutdown) unless checkpointing already failed."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join()
        if final_checkpoint and self._failed is None:
            self.checkpoint_now()
