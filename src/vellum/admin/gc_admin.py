"""GC use-cases of one bookie, shared by the HTTP API and the shell (issue 7).

Shapes follow BookKeeper's REST services (``TriggerGCService``, ``GCDetailsService``,
``SuspendCompactionService``, ``ResumeCompactionService``): force GC, "is a forced GC in
progress", per-GC-thread details, suspend / resume compaction; plus Vellum's per-entry-log
usage view. Blocking but quick: each call only reads or flips GC-thread state.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from vellum.bookie.bookie import Bookie


class GcAdmin:
    def __init__(self, *, bookie: Bookie, bookie_id: str) -> None:
        self._bookie = bookie
        self.bookie_id = bookie_id

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
