"""GC use-cases of one bookie, shared by the HTTP API and the shell (docs/gc.md).

Shapes follow BookKeeper's REST services (``TriggerGCService``, ``GCDetailsService``,
``SuspendCompactionService``, ``ResumeCompactionService``): force GC, "is a forced GC in
progress", per-GC-thread details, suspend / resume compaction; plus Vellum's per-entry-log
usage view and the disk usage of each ledger and journal dir (``disk_usage``: what the
operator console draws against the warn and full thresholds). Blocking but quick: each call only
reads or flips GC-thread state, or measures a dir.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from importlib import metadata as package_metadata
from pathlib import Path
from typing import Any

from vellum.bookie.bookie import Bookie
from vellum.storage.dirs import disk_space


@dataclass(frozen=True)
class DiskThresholds:
    """``diskUsageWarnThreshold``, ``diskUsageThreshold`` (full) and ``diskUsageLwmThreshold``."""

    warn: float
    full: float
    lwm: float


def _files_of(directory: Path, suffix: str) -> tuple[int, int]:
    """(count, bytes) of the ``*suffix`` files in ``directory/current``; files that vanish
    while they are listed (GC, journal rolling) are skipped."""
    count = size = 0
    current = directory / "current"
    try:
        entries = list(current.iterdir())
    except OSError:
        return 0, 0
    for p in entries:
        if p.name.endswith(suffix):
            try:
                size += p.stat().st_size
            except OSError:
                continue
            count += 1
    return count, size


def _vellum_version() -> str:
    try:
        return package_metadata.version("vellum")
    except package_metadata.PackageNotFoundError:
        return "unknown"


class GcAdmin:
    def __init__(self, *, bookie: Bookie, bookie_id: str, disk_thresholds: DiskThresholds | None = None) -> None:
        self._bookie = bookie
        self.bookie_id = bookie_id
        self._thresholds = disk_thresholds

    def trigger_gc(self, force_major: bool | None = None, force_minor: bool | None = None) -> str:
        """``forceGC(major, minor)`` on every GC thread; a flag left None means "not suspended"."""
        for gc in self._bookie.gc_threads:
            gc.trigger(force_major=force_major, force_minor=force_minor)
        return f"Triggered GC on BookieServer: {self.bookie_id}"

    def is_in_force_gc(self) -> dict[str, str]:
        busy = any(gc.in_force_gc for gc in self._bookie.gc_threads)
        return {"is_in_force_gc": "true" if busy else "false"}

    def gc_details(self) -> list[dict[str, Any]]:
        return [dataclasses.asdict(gc.status()) for gc in self._bookie.gc_threads]

    def suspension(self) -> dict[str, bool]:
        statuses = [gc.status() for gc in self._bookie.gc_threads]
        return {
            "isMajorGcSuspended": any(s.isMajorGcSuspended for s in statuses),
            "isMinorGcSuspended": any(s.isMinorGcSuspended for s in statuses),
        }

    def suspend_compaction(self, major: bool, minor: bool) -> dict[str, bool]:
        for gc in self._bookie.gc_threads:
            gc.suspend(major=major, minor=minor)
        return self.suspension()

    def resume_compaction(self, major: bool, minor: bool) -> dict[str, bool]:
        for gc in self._bookie.gc_threads:
            gc.resume(major=major, minor=minor)
        return self.suspension()

    def entry_log_usage(self) -> list[dict[str, Any]]:
        """Per flushed entry log (as of each dir's last GC pass): size, live bytes, usage, ledgers."""
        out: list[dict[str, Any]] = []
        for gc in self._bookie.gc_threads:
            for row in gc.log_usage():
                out.append({"ledgerDir": str(gc.storage.ledger_dir), **row})
        return out

    def disk_usage(self) -> dict[str, Any]:
        """Per ledger dir: filesystem size, used bytes, bytes the bookie can still write (free:
        without the blocks reserved for root), usage as the disk checker measures it
        (``1 - free / total``), GC's view of its state (ok / warn / full), entry logs and their
        bytes; per journal dir: journal files and bytes; the thresholds when known (else null);
        the Vellum version of this bookie."""
        dirs: list[dict[str, Any]] = []
        for gc in self._bookie.gc_threads:
            d = Path(gc.storage.ledger_dir)
            try:
                space = disk_space(d)
                total, used, free, usage = space.total, space.used, space.usable, round(space.usage, 4)
            except OSError:
                total, used, free, usage = 0, 0, 0, None
            logs, log_bytes = _files_of(d, ".log")
            dirs.append({"ledgerDir": str(d), "totalBytes": total, "usedBytes": used, "freeBytes": free,
                         "usage": usage if total else None, "diskState": gc.disk_state().value,
                         "entryLogs": logs, "entryLogBytes": log_bytes})
        journals: list[dict[str, Any]] = []
        for j in self._bookie.journals:
            files, size = _files_of(Path(j.journal_dir), ".txn")
            journals.append({"journalDir": str(j.journal_dir), "journalFiles": files, "journalBytes": size})
        t = self._thresholds
        return {"ledgerDirs": dirs, "journalDirs": journals,
                "warnThreshold": t.warn if t else None, "fullThreshold": t.full if t else None,
                "lwmThreshold": t.lwm if t else None, "version": _vellum_version()}
