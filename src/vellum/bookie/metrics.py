"""The bookie metrics of a process: what every live ``Bookie`` counts, exported under
BookKeeper's names (``bookie_BOOKIE_ADD_ENTRY``, ``bookie_SERVER_STATUS``, ...). Where BookKeeper
exports an operation summary (adds, reads, journal fsyncs), the sample is spelled as its
Prometheus provider spells the count, ``bookie_BOOKIE_ADD_ENTRY_count{success="true"}``, so
BookKeeper's dashboards find it (``stats.Kind``: counts only, no quantiles).

A ``Bookie`` counts with plain ints on its hot paths and is given a ``BookieMetrics`` by the
composition (``bookie/assembly.py``); it is tracked from construction to shutdown. The
collector is registered once per registry (``process_bookie_metrics()`` is the one on
``stats.REGISTRY``) and reads every tracked bookie at scrape time.

Choice: several bookies in one process (tests, an embedded cluster) are exported summed, with
the labels of a single bookie, so that a one-bookie process (the production case) exports
exactly its own values and the names scraped by dashboards never change. Each bookie keeps its
own counts (``Bookie.adds_total`` ...); ``bookie_SERVER_STATUS`` is the minimum: 1 only if
every bookie of the process is writable.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry

from vellum import stats


class JournalCounts(Protocol):
    """What a journal counts (``storage.journal.Journal`` has these)."""

    @property
    def index(self) -> int: ...
    @property
    def fsyncs_total(self) -> int: ...
    @property
    def records_synced_total(self) -> int: ...
    @property
    def failed(self) -> object | None: ...


class MeteredBookie(Protocol):
    """What the collector reads of a bookie (``bookie.bookie.Bookie``)."""

    @property
    def adds_total(self) -> int: ...
    @property
    def reads_total(self) -> int: ...
    @property
    def adds_rejected(self) -> dict[str, int]: ...
    @property
    def is_read_only(self) -> bool: ...
    @property
    def journals(self) -> Sequence[JournalCounts]: ...
    @property
    def limbo_ledger_count(self) -> int: ...


_METRICS: tuple[stats.SourceMetric[MeteredBookie], ...] = (
    stats.SourceMetric("bookie_SERVER_STATUS", "1 = writable, 0 = read-only",
                       lambda b: {(): 0.0 if b.is_read_only else 1.0}, kind="gauge", combine="min"),
    stats.SourceMetric("bookie_BOOKIE_ADD_ENTRY", "entries added to storage and journal (refused adds: "
                       "bookie_BOOKIE_ADD_ENTRY_REJECTED)",
                       lambda b: {("true",): float(b.adds_total)}, kind="bk_count", labels=("success",)),
    stats.SourceMetric("bookie_BOOKIE_READ_ENTRY", "entries read",
                       lambda b: {("true",): float(b.reads_total)}, kind="bk_count", labels=("success",)),
    stats.SourceMetric("bookie_journal_JOURNAL_SYNC", "journal fsyncs",
                       lambda b: {("true", str(j.index)): float(j.fsyncs_total) for j in b.journals},
                       kind="bk_count", labels=("success", "journal")),
    stats.SourceMetric("bookie_journal_JOURNAL_SYNCED_RECORDS", "journal records covered by an fsync",
                       lambda b: {(str(j.index),): float(j.records_synced_total) for j in b.journals},
                       labels=("journal",)),
    stats.SourceMetric("bookie_journal_JOURNAL_FAILED",
                       "1 = this journal failed a write or fsync (fail-stop): the bookie is read-only until "
                       "restarted (its state's readOnlyReason and the log say why)",
                       lambda b: {(str(j.index),): 0.0 if j.failed is None else 1.0 for j in b.journals},
                       kind="gauge", labels=("journal",)),
    stats.SourceMetric("bookie_BOOKIE_ADD_ENTRY_REJECTED", "adds refused",
                       lambda b: {(k,): float(v) for k, v in b.adds_rejected.items()}, labels=("reason",)),
    stats.SourceMetric("bookie_DATA_INTEGRITY_LIMBO_LEDGERS",
                       "ledgers in limbo: this bookie may have lost data of them and answers 'unknown' "
                       "(EUNKNOWNLEDGERSTATE) for what it does not hold until the integrity check copied it back",
                       lambda b: {(): float(b.limbo_ledger_count)}, kind="gauge"),
)


class BookieMetrics(stats.LiveSources[MeteredBookie]):
    """Exports every tracked bookie's counts, summed (see the module docstring)."""

    def __init__(self, registry: CollectorRegistry = stats.REGISTRY) -> None:
        super().__init__(_METRICS, registry=registry)


#: The bookie metrics on ``stats.REGISTRY`` (what the admin HTTP server exports), made on first use.
process_bookie_metrics = stats.once_per_process(BookieMetrics)
