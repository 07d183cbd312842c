"""Garbage collection of one ledger dir (BookKeeper's ``GarbageCollectorThread``, requirement R5 of docs/correctness.md).

One ``GarbageCollectorThread`` per ``LedgerStorage`` (i.e. per ledger dir) runs a pass every
``gcWaitTime`` (staggered by dir), or at once when forced (``PUT /api/v1/bookie/gc``):

1. ``recover_interrupted_compactions`` (compaction.py: crash leftovers);
2. doGcLedgers: ledgers held locally but gone from metadata are deleted from the local index.
   Metadata comes through a ``LedgerLister`` (the storage layer never imports ``meta/``): a
   complete listing, range by range (flat: pages; hierarchical: one leaf partition at a time,
   requirement R2 of docs/correctness.md), is compared with the local ledgers. A ledger is deleted only if (a) the listing
   completed, (b) the listing was not empty, (c) it is absent from it, and (d) two fresh
   ``ledger_exists`` reads, one after the other, both say it is gone (rule 9 of docs/correctness.md). A failed
   or partial listing deletes nothing. Deletes are synced before any entry log is touched;
3. doGcEntryLogs: per flushed log, drop dead ledgers from its metadata (ledgers map read from
   the log's end, or a scan); delete logs left with no live ledger;
4. compaction: major if forced (and major is enabled), or enabled and its interval passed;
   otherwise minor likewise; neither while suspended. Logs with usage < threshold are
   compacted emptiest first (10 usage buckets, as BookKeeper logs them), within the pass's max
   run time (checked before each log; a log once started is finished), throttled by entries or
   bytes. A major pass also resets the minor clock. Unreadable records are skipped, logged and
   counted; a log whose live entries cannot all be read is held (compaction.py).

Disk space (BookKeeper's listener semantics, evaluated at each pass): above
``diskUsageWarnThreshold`` major compaction is suspended, when the dir is full both are; with
``isForceGCAllowWhenNoSpace`` both states instead force a GC pass (major + minor allowed).
The trap: with the default (false) a full disk stops compaction, so only whole-log deletion
frees space; if deleted ledgers are interleaved with live ones, the bookie stays read-only
forever. docs/gc.md explains the ways out.

Waiting for a pass (a named ledger's forced shrink, through the wire op COLLECT):
``request_pass(on_done)`` forces a pass like ``trigger()`` and calls ``on_done(report)`` (on the
GC thread) once a pass that *started after the request* has finished, so everything trimmed or
deleted before the request has been considered; requests that arrive before that pass starts
share it. ``garbage_bytes()`` is what the passes left: dead bytes still on disk in this dir.

Invariants:
- never touches a log that is active, preallocated or being written (``flushed_log_ids``);
- never deletes a ledger on doubtful metadata (above) and never resurrects an index entry
  (compaction.py);
- never deletes a log the index still points into on the word of a scan that could not read
  all of it (compaction.py);
- one pass at a time per thread; ``status()`` is readable at any moment.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Protocol

from vellum import stats
from vellum.config import compaction_enabled, validate_compaction_order
from vellum.errors import ConfigError, VellumError
from vellum.format.entrylog import SkippedSpan
from vellum.storage.compaction import (
    CompactionResult,
    EntryLogMetadata,
    StepHook,
    Throttle,
    compact_entry_log,
    recover_interrupted_compactions,
)
from vellum.storage.ledger_storage import LedgerStorage

log = logging.getLogger(__name__)

_LABELS = ("ledgerDir",)
_RECLAIMED_DELETION = stats.counter(
    "bookie_RECLAIMED_DELETION_SPACE_BYTES", "bytes freed by deleting entry logs with no live ledger", _LABELS
)
_RECLAIMED_COMPACTION = stats.counter(
    "bookie_RECLAIMED_COMPACTION_SPACE_BYTES", "bytes freed by compaction (old logs minus copies)", _LABELS
)
_COMPACTED_BYTES = stats.counter(
    "bookie_COMPACTED_BYTES", "live bytes copied by compaction into new entry logs", _LABELS
)
_MAJOR_TOTAL = stats.counter("bookie_MAJOR_COMPACTION_TOTAL", "major compaction passes", _LABELS)
_MINOR_TOTAL = stats.counter("bookie_MINOR_COMPACTION_TOTAL", "minor compaction passes", _LABELS)
_DELETED_LEDGERS = stats.counter("bookie_DELETED_LEDGER_TOTAL", "ledgers deleted locally by GC", _LABELS)
_RECLAIM_FAILED = stats.counter(
    "bookie_RECLAIM_FAILED_TO_DELETE", "entry logs GC or compaction failed to reclaim", _LABELS
)
_GC_FAILED_LISTING = stats.counter(
    "bookie_GC_LEDGER_LISTING_FAILURES", "doGcLedgers skipped: metadata listing failed or empty", _LABELS
)
_COMPACTION_TIME_LIMITED = stats.counter(
    "bookie_COMPACTION_MAX_TIME_REACHED",
    "compaction passes that stopped at their max run time with eligible logs left", ("ledgerDir", "kind"),
)
_SKIPPED_SPANS = stats.counter(
    "bookie_GC_ENTRY_LOG_UNREADABLE_SPANS",
    "unreadable spans GC and compaction scans skipped in entry logs (counted at every scan that meets one)",
    _LABELS,
)
_HELD_LOGS = stats.gauge(
    "bookie_GC_ENTRY_LOGS_HELD",
    "entry logs kept uncompacted because live entries in them cannot be read", _LABELS,
)
_RUNTIME = stats.histogram("bookie_THREAD_RUNTIME", "duration of one GC pass (seconds)", _LABELS)
_ENTRY_LOGS = stats.gauge("bookie_ACTIVE_ENTRY_LOG_TOTAL", "entry logs in the ledger dir", _LABELS)
_ENTRY_LOG_BYTES = stats.gauge(
    "bookie_ACTIVE_ENTRY_LOG_SPACE_BYTES", "bytes of entry logs in the ledger dir", _LABELS
)
_LEDGERS = stats.gauge("bookie_ACTIVE_LEDGER_TOTAL", "ledgers held in the ledger dir", _LABELS)


class LedgerLister(Protocol):
    """Fresh views of the metadata store's ledgers (the bookie layer adapts ``meta``)."""

    def ledger_ranges(self) -> Iterable[Iterable[int]]:
        """Every existing ledger id, ascending, in batches (partitions). Raises on any failure:
        the iteration must either complete or raise."""
        ...

    def ledger_exists(self, ledger_id: int) -> bool:
        """A fresh read of one ledger's metadata; raises if the store cannot answer."""
        ...


class DiskState(enum.Enum):
    OK = "ok"
    WARN = "warn"  # above diskUsageWarnThreshold
    FULL = "full"  # above diskUsageThreshold (the dir takes no new logs)


@dataclass(frozen=True)
class GcSettings:
    """The GC keys of ``bk_server.conf`` as plain values (BookKeeper's defaults)."""

    gc_wait_time_ms: int = 600000
    minor_compaction_interval_s: int = 3600
    minor_compaction_threshold: float = 0.2
    major_compaction_interval_s: int = 86400
    major_compaction_threshold: float = 0.8
    minor_compaction_max_time_ms: int = -1
    major_compaction_max_time_ms: int = -1
    compaction_rate_by_entries: int = 1000
    compaction_rate_by_bytes: int = 1000000
    is_throttle_by_bytes: bool = False
    is_force_gc_allow_when_no_space: bool = False
    force_allow_compaction: bool = False

    def __post_init__(self) -> None:
        # BookKeeper's GarbageCollectorThread constructor checks.
        if self.gc_wait_time_ms <= 0:
            raise ConfigError(f"gcWaitTime ({self.gc_wait_time_ms}) must be positive")
        for name, value in (("minorCompactionThreshold", self.minor_compaction_threshold),
                            ("majorCompactionThreshold", self.major_compaction_threshold)):
            if value > 1.0:
                raise ConfigError(f"{name} ({value}) must not exceed 1.0")
        validate_compaction_order(self.minor_compaction_interval_s, self.minor_compaction_threshold,
                                  self.major_compaction_interval_s, self.major_compaction_threshold)
        for name, interval in (("minorCompactionInterval", self.minor_compaction_interval_s),
                               ("majorCompactionInterval", self.major_compaction_interval_s)):
            if 0 < interval * 1000 < self.gc_wait_time_ms:
                raise ConfigError(f"{name} ({interval}s) must not be shorter than gcWaitTime "
                                  f"({self.gc_wait_time_ms}ms)")

    @property
    def minor_enabled(self) -> bool:
        return compaction_enabled(self.minor_compaction_interval_s, self.minor_compaction_threshold)

    @property
    def major_enabled(self) -> bool:
        return compaction_enabled(self.major_compaction_interval_s, self.major_compaction_threshold)

    @property
    def force_minor_allowed(self) -> bool:
        """forceAllowCompaction: a forced run compacts even if the interval disables minor."""
        return self.force_allow_compaction and 0 < self.minor_compaction_threshold < 1

    @property
    def force_major_allowed(self) -> bool:
        return self.force_allow_compaction and 0 < self.major_compaction_threshold < 1


@dataclass
class GcProgress:
    """What the running pass is doing (for ``gc --wait`` progress bars)."""

    phase: str = "idle"  # idle | recover | gc_ledgers | gc_entry_logs | major | minor
    logs_total: int = 0
    logs_done: int = 0
    bytes_total: int = 0
    bytes_done: int = 0


@dataclass
class GcStatus:
    """BookKeeper's ``GarbageCollectionStatus`` (JSON names) plus Vellum's extras."""

    forceCompacting: bool = False
    majorCompacting: bool = False
    minorCompacting: bool = False
    lastMajorCompactionTime: int = 0  # epoch ms
    lastMinorCompactionTime: int = 0
    majorCompactionCounter: int = 0
    minorCompactionCounter: int = 0
    # Vellum's own fields
    ledgerDir: str = ""
    isMajorGcSuspended: bool = False
    isMinorGcSuspended: bool = False
    gcRunning: bool = False
    gcCounter: int = 0
    lastGcRunTimeMillis: int = 0
    lastError: str = ""
    reclaimedBytes: int = 0
    compactedBytes: int = 0
    deletedLedgers: int = 0
    entryLogs: int = 0
    progress: dict[str, object] = field(default_factory=dict)


@dataclass
class GcReport:
    """What one pass did (returned by ``run_once``, for tests and the log)."""

    deleted_ledgers: list[int] = field(default_factory=list)
    deleted_logs: list[int] = field(default_factory=list)
    compactions: list[CompactionResult] = field(default_factory=list)
    kind: str = ""  # "major", "minor" or ""
    listing_error: str = ""
    reclaimed_bytes: int = 0
    error: str = ""  # the pass failed (or the thread stopped before running it)


class GarbageCollectorThread:
    """GC of one ledger storage (module docstring)."""

    def __init__(
        self,
        storage: LedgerStorage,
        settings: GcSettings,
        *,
        lister: LedgerLister | None = None,
        disk_state: Callable[[], DiskState] = lambda: DiskState.OK,
        index: int = 0,
        dir_count: int = 1,
        clock: Callable[[], float] = time.time,
        step_hook: StepHook | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.storage = storage
        self.settings = settings
        self._lister = lister
        self._disk_state = disk_state
        self._index = index
        self._dir_count = max(1, dir_count)
        self._clock = clock
        self._step_hook = step_hook
        # the max-run-time deadline and the compaction throttle (tests inject both)
        self._monotonic = monotonic
        self._sleep = sleep
        self._label = str(storage.ledger_dir)
        #: called with each ledger id GC removed, so layers above can drop their caches
        self.on_ledger_deleted: Callable[[int], None] | None = None
        self._meta: dict[int, EntryLogMetadata] = {}
        self._cond = threading.Condition()
        self._run_lock = threading.Lock()
        self._force = False
        self._force_major = False
        self._force_minor = False
        self._in_force_gc = False
        self._stopping = False
        #: passes started so far, and the callers of ``request_pass`` waiting for pass n
        self._passes_started = 0
        self._pass_waiters: list[tuple[int, Callable[[GcReport], None]]] = []
        self._thread: threading.Thread | None = None
        now_ms = int(clock() * 1000)
        # BookKeeper starts both clocks at construction: the first periodic compaction comes a
        # full interval after start.
        self._status = GcStatus(
            lastMajorCompactionTime=now_ms, lastMinorCompactionTime=now_ms, ledgerDir=self._label
        )
        self._progress = GcProgress()

    # ------------------------------------------------------------------ control

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the GC thread is already running")
        self._thread = threading.Thread(
            target=self._run, name=f"gc-{self.storage.ledger_dir}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop after the current step (compaction checks between entries); joins the thread.
        Callers still waiting in ``request_pass`` are answered with an error report."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        with self._cond:
            waiters, self._pass_waiters = self._pass_waiters, []
        for _n, on_done in waiters:
            on_done(GcReport(error="the bookie's GC stopped before the pass ran"))

    def request_pass(self, on_done: Callable[[GcReport], None]) -> None:
        """Force a pass (as ``trigger()``) and call ``on_done(report)`` on the GC thread when a
        pass that starts after this call has finished (see the module docstring). Raises
        ``VellumError`` if the GC thread is not running (nothing would ever answer)."""
        with self._cond:  # one hold: the next pass to start is forced and answers this caller
            if self._thread is None or self._stopping:
                raise VellumError(f"GC of {self._label} is not running: cannot collect now")
            self._pass_waiters.append((self._passes_started + 1, on_done))
            self.trigger()  # the condition's lock is reentrant

    def garbage_bytes(self) -> int:
        """Dead bytes still on disk in this dir as of the last pass: in flushed logs, record
        bytes of ledgers gone or trimmed (logs above the compaction threshold, or not compacted
        yet); in the active logs, the trimmed bytes (GC never touches an active log)."""
        trimmed = self.storage.trimmed_bytes()
        with self._cond:
            metas = list(self._meta.values())
        known = {m.log_id for m in metas}
        dead = sum(m.total_size - m.remaining_size(trimmed.get(m.log_id, 0)) for m in metas)
        return dead + sum(n for log_id, n in trimmed.items() if log_id not in known)

    def trigger(self, *, force_major: bool | None = None, force_minor: bool | None = None) -> None:
        """Force a pass now (``forceGC``); each flag defaults to "not suspended"."""
        with self._cond:
            self._force = True
            self._force_major = (not self._status.isMajorGcSuspended) if force_major is None else force_major
            self._force_minor = (not self._status.isMinorGcSuspended) if force_minor is None else force_minor
            self._in_force_gc = True
            self._cond.notify_all()

    @property
    def in_force_gc(self) -> bool:
        with self._cond:
            return self._in_force_gc

    def disk_state(self) -> DiskState:
        """The state of this thread's ledger dir as GC sees it (ok, above warn, full)."""
        return self._disk_state()

    def suspend(self, *, major: bool = False, minor: bool = False) -> None:
        self._set_suspended(major, minor, True)

    def resume(self, *, major: bool = False, minor: bool = False) -> None:
        self._set_suspended(major, minor, False)

    def _set_suspended(self, major: bool, minor: bool, suspended: bool) -> None:
        """Set the suspension of the compactions named (``major`` / ``minor``) to ``suspended``."""
        with self._cond:
            if major:
                self._status.isMajorGcSuspended = suspended
            if minor:
                self._status.isMinorGcSuspended = suspended

    def status(self) -> GcStatus:
        with self._cond:
            p = self._progress
            return replace(
                self._status,
                forceCompacting=self._status.forceCompacting,
                progress={"phase": p.phase, "logsTotal": p.logs_total, "logsDone": p.logs_done,
                          "bytesTotal": p.bytes_total, "bytesDone": p.bytes_done},
            )

    def log_usage(self) -> list[dict[str, object]]:
        """Per flushed log: size, live bytes, usage, ledgers (as of the last pass); then the
        active logs, from the entry logger's running counts (``active: true``, live bytes and
        usage ``None``: GC never examines an active log)."""
        trimmed = self.storage.trimmed_bytes()
        with self._cond:
            metas = list(self._meta.values())
        out: list[dict[str, object]] = []
        for m in sorted(metas, key=lambda m: m.log_id):
            t = trimmed.get(m.log_id, 0)
            out.append({
                "logId": f"{m.log_id:x}", "size": m.file_size, "totalBytes": m.total_size,
                "liveBytes": m.remaining_size(t), "usage": round(m.usage(t), 4),
                "ledgers": sorted(m.ledgers), "ledgerBytes": {str(lid): n for lid, n in sorted(m.ledgers.items())},
                "mtime": self._log_mtime(m.log_id), "source": "map" if m.from_map else "scan",
                "corrupt": m.corrupt, "held": m.held,
                "active": False,
            })
        logger = self.storage.entry_logger
        known = {m.log_id for m in metas}
        for log_id, size, ledgers in logger.active_log_usage():
            if log_id in known:
                continue
            out.append({
                "logId": f"{log_id:x}", "size": size, "totalBytes": sum(ledgers.values()), "liveBytes": None,
                "usage": None, "ledgers": sorted(ledgers),
                "ledgerBytes": {str(lid): n for lid, n in sorted(ledgers.items())},
                "mtime": self._log_mtime(log_id), "source": "active", "corrupt": "", "held": "", "active": True,
            })
        return out

    def _log_mtime(self, log_id: int) -> float | None:
        try:
            return self.storage.entry_logger.log_path(log_id).stat().st_mtime
        except OSError:
            return None  # deleted since the pass

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        wait_s = self.settings.gc_wait_time_ms / 1000.0
        # Staggered like BookKeeper: gcWaitTime + n * gcWaitTime / #dirs before the first pass.
        next_at = time.monotonic() + wait_s + self._index * wait_s / self._dir_count
        while True:
            with self._cond:
                while not self._stopping and not self._force and time.monotonic() < next_at:
                    self._cond.wait(max(0.0, next_at - time.monotonic()))
                if self._stopping:
                    return
                force, force_major, force_minor = self._force, self._force_major, self._force_minor
                self._force = False
                # Numbered with the flags it runs with: a request_pass after this point waits
                # for the next (forced) pass, never for this one.
                self._passes_started += 1
                number = self._passes_started
            try:
                self._run_pass(number, force=force, force_major=force_major, force_minor=force_minor)
            except Exception as e:  # a failed pass is reported and retried at the next period
                log.exception("GC pass on %s failed", self._label)
                with self._cond:
                    self._status.lastError = str(e)
            finally:
                with self._cond:
                    if force and not self._force:
                        self._in_force_gc = False
            next_at = time.monotonic() + wait_s

    def _stop_requested(self) -> bool:
        return self._stopping

    def _set_phase(self, phase: str, total: int = 0, bytes_total: int = 0) -> None:
        with self._cond:
            self._progress = GcProgress(phase, total, 0, bytes_total, 0)

    def run_once(
        self, *, force: bool = False, force_major: bool = True, force_minor: bool = True
    ) -> GcReport:
        """One GC pass, synchronously (tests; the thread runs numbered passes the same way)."""
        with self._cond:
            self._passes_started += 1
            number = self._passes_started
        return self._run_pass(number, force=force, force_major=force_major, force_minor=force_minor)

    def _run_pass(self, number: int, *, force: bool, force_major: bool, force_minor: bool) -> GcReport:
        with self._run_lock:
            start = self._monotonic()
            report = GcReport()
            with self._cond:
                self._status.gcRunning = True
                self._status.forceCompacting = force
            try:
                self._pass(report, force, force_major, force_minor)
            except BaseException as e:
                report.error = f"{type(e).__name__}: {e}"
                raise
            finally:
                elapsed = self._monotonic() - start
                _RUNTIME.labels(self._label).observe(elapsed)
                with self._cond:
                    self._status.gcRunning = False
                    self._status.forceCompacting = False
                    self._status.majorCompacting = False
                    self._status.minorCompacting = False
                    self._status.gcCounter += 1
                    self._status.lastGcRunTimeMillis = int(elapsed * 1000)
                    self._progress = GcProgress()
                self._answer_waiters(number, report)
            log.info(
                "GC pass on %s: %d ledgers deleted, %d logs deleted, %s compaction of %d logs, "
                "%d bytes reclaimed in %.2fs",
                self._label, len(report.deleted_ledgers), len(report.deleted_logs),
                report.kind or "no", len(report.compactions), report.reclaimed_bytes, elapsed,
            )
            return report

    def _answer_waiters(self, number: int, report: GcReport) -> None:
        """Answer the ``request_pass`` callers waiting for pass ``number`` or an earlier one."""
        with self._cond:
            done = [w for w in self._pass_waiters if w[0] <= number]
            self._pass_waiters = [w for w in self._pass_waiters if w[0] > number]
        for _n, on_done in done:
            try:
                on_done(report)
            except Exception:  # a waiter's failure must not fail the GC thread
                log.exception("GC of %s: a caller waiting for the pass failed", self._label)

    def _pass(self, report: GcReport, force: bool, force_major: bool, force_minor: bool) -> None:
        s = self.settings
        self._set_phase("recover")
        recover_interrupted_compactions(self.storage)
        self._set_phase("gc_ledgers")
        self._gc_ledgers(report)
        self._set_phase("gc_entry_logs")
        self._gc_entry_logs(report)

        disk = self._disk_state()
        with self._cond:
            suspend_major = self._status.isMajorGcSuspended
            suspend_minor = self._status.isMinorGcSuspended
        if disk is not DiskState.OK:
            if s.is_force_gc_allow_when_no_space:
                # BookKeeper's isForceGCAllowWhenNoSpace: low space *forces* compaction.
                force, force_major, force_minor = True, True, True
            else:
                suspend_major = True
                if disk is DiskState.FULL:
                    suspend_minor = True
                log.warning("ledger dir %s is %s: compaction suspended (major%s)", self._label,
                            disk.value, " and minor" if disk is DiskState.FULL else "")
        now = self._clock()
        with self._cond:
            last_major = self._status.lastMajorCompactionTime / 1000.0
            last_minor = self._status.lastMinorCompactionTime / 1000.0
        do_major = not suspend_major and (
            (force and force_major and s.force_major_allowed)
            or (s.major_enabled and ((force and force_major) or now - last_major > s.major_compaction_interval_s))
        )
        do_minor = not do_major and not suspend_minor and (
            (force and force_minor and s.force_minor_allowed)
            or (s.minor_enabled and ((force and force_minor) or now - last_minor > s.minor_compaction_interval_s))
        )
        if do_major:
            report.kind = "major"
            with self._cond:
                self._status.majorCompacting = True
            self._compact(report, s.major_compaction_threshold, s.major_compaction_max_time_ms, "major")
            now_ms = int(self._clock() * 1000)
            with self._cond:
                self._status.majorCompacting = False
                self._status.lastMajorCompactionTime = now_ms
                self._status.lastMinorCompactionTime = now_ms  # a major pass covers minor's work
                self._status.majorCompactionCounter += 1
            _MAJOR_TOTAL.labels(self._label).inc()
        elif do_minor:
            report.kind = "minor"
            with self._cond:
                self._status.minorCompacting = True
            self._compact(report, s.minor_compaction_threshold, s.minor_compaction_max_time_ms, "minor")
            with self._cond:
                self._status.minorCompacting = False
                self._status.lastMinorCompactionTime = int(self._clock() * 1000)
                self._status.minorCompactionCounter += 1
            _MINOR_TOTAL.labels(self._label).inc()
        self._update_gauges()

    # ------------------------------------------------------------------ doGcLedgers

    def _gc_ledgers(self, report: GcReport) -> None:
        lister = self._lister
        if lister is None:
            return
        local = list(self.storage.ledgers())
        if not local:
            return
        try:
            candidates, listed = self._scan_and_compare(lister, local)
        except Exception as e:  # any failure: the listing is partial, delete nothing
            report.listing_error = f"metadata listing failed: {e}"
            log.warning("doGcLedgers on %s skipped: %s", self._label, report.listing_error)
            _GC_FAILED_LISTING.labels(self._label).inc()
            return
        if listed == 0:
            report.listing_error = "metadata listing is empty while this dir holds ledgers"
            log.warning("doGcLedgers on %s skipped: %s", self._label, report.listing_error)
            _GC_FAILED_LISTING.labels(self._label).inc()
            return
        for lid in candidates:
            if self._stopping:
                return
            try:
                # Rule 9 of docs/correctness.md: fresh metadata must say twice that the ledger is gone.
                if lister.ledger_exists(lid) or lister.ledger_exists(lid):
                    continue
            except Exception as e:
                log.warning("doGcLedgers on %s: cannot verify ledger %d (%s); kept", self._label, lid, e,
                            extra={"ledger_id": lid})
                continue
            self.storage.delete_ledger(lid)
            if self.on_ledger_deleted is not None:
                self.on_ledger_deleted(lid)
            report.deleted_ledgers.append(lid)
            _DELETED_LEDGERS.labels(self._label).inc()
        if report.deleted_ledgers:
            # Deletes must be durable before logs holding those ledgers are deleted.
            self.storage.sync_index()
            log.info("doGcLedgers on %s: deleted ledgers %s", self._label, report.deleted_ledgers)
            with self._cond:
                self._status.deletedLedgers += len(report.deleted_ledgers)

    @staticmethod
    def _scan_and_compare(lister: LedgerLister, local: list[int]) -> tuple[list[int], int]:
        """Local ledgers absent from metadata, partition by partition (ScanAndCompare)."""
        local_sorted = sorted(local)
        candidates: list[int] = []
        i = 0
        listed = 0
        for batch in lister.ledger_ranges():
            ids = sorted(batch)
            if not ids:
                continue
            listed += len(ids)
            present = set(ids)
            # Local ledgers up to this partition's end that it does not contain are candidates.
            while i < len(local_sorted) and local_sorted[i] <= ids[-1]:
                if local_sorted[i] not in present:
                    candidates.append(local_sorted[i])
                i += 1
        # Local ledgers beyond the last listed id: absent too (checked freshly before deletion,
        # which protects ledgers created after the listing passed their range).
        candidates.extend(local_sorted[i:])
        return candidates, listed

    # ------------------------------------------------------------------ doGcEntryLogs

    def _refresh_meta(self) -> None:
        logger = self.storage.entry_logger
        flushed = set(logger.flushed_log_ids())
        with self._cond:
            for gone in [lid for lid in self._meta if lid not in flushed]:
                del self._meta[gone]
            missing = [lid for lid in sorted(flushed) if lid not in self._meta]
        for log_id in missing:
            try:
                meta = EntryLogMetadata.extract(self.storage, log_id)
            except (VellumError, OSError) as e:
                log.warning("cannot read the ledgers of entry log %x in %s: %s", log_id, self._label, e)
                _RECLAIM_FAILED.labels(self._label).inc()
                continue
            self._report_skipped(log_id, meta.skipped, "working out its ledgers")
            with self._cond:
                self._meta[log_id] = meta

    def _report_skipped(self, log_id: int, spans: list[SkippedSpan], doing: str) -> None:
        """One log line per unreadable span a scan skipped (file, offset, length, why), counted."""
        if not spans:
            return
        path = self.storage.entry_logger.log_path(log_id)
        for span in spans:
            log.error("entry log %s: skipped %d unreadable bytes at offset %d (%s) while %s; the "
                      "location index decides what in this log is live", path, span.size, span.offset,
                      span.reason, doing)
        _SKIPPED_SPANS.labels(self._label).inc(len(spans))

    def _gc_entry_logs(self, report: GcReport) -> None:
        self._refresh_meta()
        with self._cond:
            metas = list(self._meta.values())
        for meta in metas:
            for lid in [lid for lid in meta.ledgers if not self.storage.ledger_exists(lid)]:
                del meta.ledgers[lid]
            if meta.held and not meta.held_ledgers & meta.ledgers.keys():
                log.info("entry log %x in %s: the ledgers of its unreadable entries are deleted; "
                         "it may be compacted again", meta.log_id, self._label)
                meta.held, meta.held_ledgers = "", set()
            if meta.is_empty():
                try:
                    self.storage.entry_logger.delete_log(meta.log_id)
                except VellumError as e:
                    log.warning("cannot delete entry log %x in %s: %s", meta.log_id, self._label, e)
                    _RECLAIM_FAILED.labels(self._label).inc()
                    continue  # metadata kept (BookKeeper PR #3965): no rescan next time
                self.storage.forget_log(meta.log_id)
                with self._cond:
                    self._meta.pop(meta.log_id, None)
                    self._status.reclaimedBytes += meta.file_size
                report.deleted_logs.append(meta.log_id)
                report.reclaimed_bytes += meta.file_size
                _RECLAIMED_DELETION.labels(self._label).inc(meta.file_size)
        if report.deleted_logs:
            log.info("doGcEntryLogs on %s: deleted entry logs %s",
                     self._label, [f"{i:x}" for i in report.deleted_logs])

    # ------------------------------------------------------------------ compaction

    def _compact(self, report: GcReport, threshold: float, max_time_ms: int, kind: str) -> None:
        s = self.settings
        trimmed = self.storage.trimmed_bytes()
        with self._cond:
            metas = list(self._meta.values())
        buckets = [0] * 11
        eligible: list[tuple[float, EntryLogMetadata]] = []
        for m in metas:
            usage = m.usage(trimmed.get(m.log_id, 0))
            buckets[min(10, int(usage * 10))] += 1
            if usage < threshold and not m.held:
                eligible.append((usage, m))
        eligible.sort(key=lambda x: (x[0], x[1].log_id))  # emptiest first
        log.info("%s compaction on %s: %d of %d logs below usage %.2f; usage buckets %s",
                 kind, self._label, len(eligible), len(metas), threshold,
                 {f"{b * 10}%": n for b, n in enumerate(buckets) if n})
        if not eligible:
            return
        throttle = Throttle(by_bytes=s.is_throttle_by_bytes, rate_by_entries=s.compaction_rate_by_entries,
                            rate_by_bytes=s.compaction_rate_by_bytes, clock=self._monotonic, sleep=self._sleep)
        # The max run time limits the pass, not a log: it is checked before each log is started
        # and a log in hand is finished (else a log that takes longer than the limit would be
        # copied and thrown away on every pass, and never compacted).
        deadline = self._monotonic() + max_time_ms / 1000.0 if max_time_ms > 0 else None
        self._set_phase(kind, len(eligible), sum(m.remaining_size(trimmed.get(m.log_id, 0)) for _, m in eligible))
        for n, (usage, meta) in enumerate(eligible):
            if self._stopping:
                log.info("%s compaction on %s stopped: shutdown", kind, self._label)
                break
            if deadline is not None and self._monotonic() > deadline:
                log.info("%s compaction on %s reached its max run time (%d ms): %d of %d eligible logs "
                         "compacted, the rest wait for the next pass", kind, self._label, max_time_ms,
                         n, len(eligible))
                _COMPACTION_TIME_LIMITED.labels(self._label, kind).inc()
                break
            try:
                result = compact_entry_log(
                    self.storage, meta, throttle=throttle,
                    hook=self._step_hook, should_stop=self._stop_requested,
                )
            except VellumError as e:
                log.error("compaction of entry log %x in %s failed: %s", meta.log_id, self._label, e)
                _RECLAIM_FAILED.labels(self._label).inc()
                continue
            report.compactions.append(result)
            self._report_skipped(meta.log_id, result.skipped, "compacting it")
            if result.held:
                self._hold(meta, result)
                continue
            if result.aborted:
                continue
            freed = max(0, result.bytes_reclaimed - result.bytes_moved)
            report.reclaimed_bytes += freed
            _RECLAIMED_COMPACTION.labels(self._label).inc(freed)
            _COMPACTED_BYTES.labels(self._label).inc(result.bytes_moved)
            with self._cond:
                self._meta.pop(meta.log_id, None)
                self._status.reclaimedBytes += freed
                self._status.compactedBytes += result.bytes_moved
                self._progress.logs_done += 1
                self._progress.bytes_done += meta.remaining_size(trimmed.get(meta.log_id, 0))
            log.info("compacted entry log %x (usage %.2f) into %s: %d entries, %d bytes moved, %d freed",
                     meta.log_id, usage,
                     "nothing" if result.new_log_id is None else f"{result.new_log_id:x}",
                     result.entries_moved, result.bytes_moved, freed)

    def _hold(self, meta: EntryLogMetadata, result: CompactionResult) -> None:
        """Live entries of the log cannot be read: keep it, uncompacted, until its ledgers die."""
        path = self.storage.entry_logger.log_path(meta.log_id)
        for lid, eid, offset, why in result.unreadable[:10]:
            log.error("entry log %s: live entry (ledger %d, entry %d) at offset %d cannot be read: %s",
                      path, lid, eid, offset, why, extra={"ledger_id": lid, "entry_id": eid})
        ledgers = sorted({lid for lid, _e, _o, _w in result.unreadable})
        meta.held_ledgers = set(ledgers)
        meta.held = (f"{len(result.unreadable)} live entries cannot be read (ledgers "
                     f"{', '.join(map(str, ledgers[:10]))}{' ...' if len(ledgers) > 10 else ''})")
        log.error("entry log %s kept, not compacted: %s; compacted again once those ledgers are "
                  "deleted; reads of those entries answer EIO (another replica serves them)", path, meta.held)

    def _update_gauges(self) -> None:
        logger = self.storage.entry_logger
        try:
            ids = logger.log_ids()
            size = sum(p.stat().st_size for p in (logger.log_path(i) for i in ids) if p.exists())
        except (VellumError, OSError):
            return
        _ENTRY_LOGS.labels(self._label).set(len(ids))
        _ENTRY_LOG_BYTES.labels(self._label).set(size)
        _LEDGERS.labels(self._label).set(len(list(self.storage.ledgers())))
        with self._cond:
            self._status.entryLogs = len(ids)
            held = sum(1 for m in self._meta.values() if m.held)
        _HELD_LOGS.labels(self._label).set(held)
