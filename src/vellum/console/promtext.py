"""Bookie metrics for the console: Prometheus text -> the few numbers the pages chart, and a
bounded history of them per bookie.

Responsibility: ``parse_metrics`` sums each sample name over its labels (the pages show bookie
totals); ``MetricsHistory`` keeps at most ``max_samples`` samples of the ``TRACKED`` names per
bookie (a ring, so memory stays bounded however long the console runs) and turns counters into
per-second rates between consecutive samples (a counter that went down was reset by a restart:
that interval counts as 0, never negative).
No I/O here: ``bookies.py`` scrapes, this module only parses and remembers.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

#: counters (sample names as exported) the console turns into rates
RATE_COUNTERS = {
    "adds": "bookie_BOOKIE_ADD_ENTRY_count",
    "reads": "bookie_BOOKIE_READ_ENTRY_count",
    "rereplicatedBytes": "replication_worker_NUM_BYTES_WRITTEN_total",
    "rereplicatedEntries": "replication_worker_NUM_ENTRIES_WRITTEN_total",
    "rereplicatedLedgers": "replication_worker_REREPLICATED_LEDGERS_total",
    "reclaimedDeletion": "bookie_RECLAIMED_DELETION_SPACE_BYTES_total",
    "reclaimedCompaction": "bookie_RECLAIMED_COMPACTION_SPACE_BYTES_total",
}
#: gauges (and counters shown as totals) the console keeps as they are
GAUGES = {
    "entryLogBytes": "bookie_ACTIVE_ENTRY_LOG_SPACE_BYTES",
    "serverStatus": "bookie_SERVER_STATUS",
    "underReplicated": "auditor_NUM_UNDER_REPLICATED_LEDGERS",
    "lostBookies": "auditor_LOST_BOOKIES",
    "limboLedgers": "bookie_DATA_INTEGRITY_LIMBO_LEDGERS",
}
TRACKED = {**RATE_COUNTERS, **GAUGES}


class MetricsFormatError(ValueError):
    """The text is not Prometheus exposition format."""


def parse_metrics(text: str) -> dict[str, float]:
    """``{sample name: sum over labels}`` of every finite sample."""
    out: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                value = float(sample.value)
                if math.isfinite(value):
                    out[sample.name] = out.get(sample.name, 0.0) + value
    except (ValueError, TypeError, IndexError, KeyError) as e:
        raise MetricsFormatError(f"not Prometheus text: {e}") from None
    return out


def tracked_values(samples: dict[str, float]) -> dict[str, float]:
    """The ``TRACKED`` numbers of one scrape (missing ones are left out)."""
    return {key: samples[name] for key, name in TRACKED.items() if name in samples}


@dataclass(frozen=True)
class Sample:
    at: float  # seconds since the epoch
    values: dict[str, float]


class MetricsHistory:
    """The last ``max_samples`` scrapes of each bookie (see the module docstring)."""

    def __init__(self, max_samples: int = 120) -> None:
        self._max = max_samples
        self._by_bookie: dict[str, deque[Sample]] = {}

    def add(self, bookie: str, at: float, values: dict[str, float]) -> None:
        ring = self._by_bookie.get(bookie)
        if ring is None:
            ring = self._by_bookie[bookie] = deque(maxlen=self._max)
        ring.append(Sample(at, values))

    def forget(self, bookie: str) -> None:
        """Drop one bookie's samples (it left the cluster)."""
        self._by_bookie.pop(bookie, None)

    def forget_except(self, bookies: Iterable[str]) -> None:
        keep = set(bookies)
        for b in list(self._by_bookie):
            if b not in keep:
                del self._by_bookie[b]

    def samples(self, bookie: str) -> list[Sample]:
        return list(self._by_bookie.get(bookie, ()))

    def latest(self, bookie: str) -> Sample | None:
        ring = self._by_bookie.get(bookie)
        return ring[-1] if ring else None

    def rates(self, bookie: str, key: str) -> tuple[list[float], list[float]]:
        """``(times, per-second rates)`` of a ``RATE_COUNTERS`` key between consecutive samples."""
        times: list[float] = []
        rates: list[float] = []
        ring = self.samples(bookie)
        for prev, cur in itertools.pairwise(ring):
            if key not in prev.values or key not in cur.values:
                continue
            dt = cur.at - prev.at
            if dt <= 0:
                continue
            times.append(round(cur.at, 3))
            rates.append(round(max(0.0, cur.values[key] - prev.values[key]) / dt, 3))
        return times, rates

    def series(self, bookie: str, key: str) -> tuple[list[float], list[float]]:
        """``(times, values)`` of a key as scraped."""
        ring = self.samples(bookie)
        pts = [(round(s.at, 3), s.values[key]) for s in ring if key in s.values]
        return [t for t, _ in pts], [v for _, v in pts]

    def last_rate(self, bookie: str, key: str) -> float | None:
        _, rates = self.rates(bookie, key)
        return rates[-1] if rates else None

    def cluster_rates(self, key: str, bookies: Iterable[str]) -> tuple[list[float], list[float]]:
        """The sum over bookies of a rate, on the time grid of the bookie with most samples
        (each bookie's latest rate at or before each instant)."""
        per = {b: self.rates(b, key) for b in bookies}
        per = {b: tr for b, tr in per.items() if tr[0]}
        if not per:
            return [], []
        grid = max(per.values(), key=lambda tr: len(tr[0]))[0]
        total = []
        for t in grid:
            s = 0.0
            for times, rates in per.values():
                v = None
                for tt, rr in zip(times, rates):
                    if tt <= t + 0.5:
                        v = rr
                    else:
                        break
                s += v or 0.0
            total.append(round(s, 3))
        return list(grid), total
