"""Metrics: one Prometheus registry per process and the two ways of feeding it, with names
the way BookKeeper's Prometheus provider spells them (``bookie_*``, ``bookkeeper_server_*``).

- ``counter`` / ``gauge`` / ``histogram``: a metric owned by a module, shared by everything in
  the process that uses the module (idempotent, so a module may be imported more than once).
- ``LiveSources``: metrics of objects a process may hold several of (bookies, servers). Each
  object keeps plain ints on its hot path; one collector per kind, registered once per
  registry, reads every tracked object at scrape time and combines their values per label
  set (summed; a state gauge takes the minimum). Two bookies in one process therefore keep
  their own counts, and the exported names and labels are those of a single bookie.

The admin HTTP server exports ``REGISTRY``. No I/O here: exporting is the HTTP layer's job.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Literal, TypeAlias, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

REGISTRY = CollectorRegistry(auto_describe=True)

# Latency buckets in seconds, from 50 us to 10 s.
LATENCY_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
)

_cache: dict[str, object] = {}


M = TypeVar("M", Counter, Gauge, Histogram)


def _metric(kind: type[M], name: str, make: Callable[[], M]) -> M:
    """The metric ``name`` of the process, made by ``make`` the first time (idempotent, so a
    module may be imported more than once)."""
    if name not in _cache:
        _cache[name] = make()
    metric = _cache[name]
    assert isinstance(metric, kind)
    return metric


def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
    """Get or create a counter (idempotent, so a module may be imported more than once)."""
    return _metric(Counter, name, lambda: Counter(name, doc, labels, registry=REGISTRY))


def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
    return _metric(Gauge, name, lambda: Gauge(name, doc, labels, registry=REGISTRY))


def histogram(name: str, doc: str, labels: tuple[str, ...] = ()) -> Histogram:
    return _metric(Histogram, name, lambda: Histogram(name, doc, labels, registry=REGISTRY, buckets=LATENCY_BUCKETS))


#: How a metric is exported: ``counter`` and ``gauge`` as prometheus_client spells them (a
#: counter's sample is ``<name>_total``); the two spellings of BookKeeper's Prometheus provider,
#: for the names its dashboards query: ``bk_counter``, a counter whose sample is ``<name>``
#: itself (typed untyped, since the text format would otherwise want ``_total``), and ``bk_count``,
#: the ``<name>_count`` sample of an operation summary (``success`` label; no quantiles nor
#: ``_sum``: Vellum counts these operations without timing them).
Kind: TypeAlias = Literal["counter", "gauge", "bk_counter", "bk_count"]

#: One source's values of one metric: {label values: value}.
Samples: TypeAlias = Mapping[tuple[str, ...], float]
S = TypeVar("S")
T = TypeVar("T")


@dataclass(frozen=True)
class SourceMetric(Generic[S]):
    """One exported metric family of a kind of source: ``read(source)`` is that source's
    samples; ``combine`` says how the samples of several sources with the same labels merge."""

    name: str
    doc: str
    read: Callable[[S], Samples]
    kind: Kind = "counter"
    labels: tuple[str, ...] = ()
    combine: Literal["sum", "min"] = "sum"


class LiveSources(Generic[S]):
    """The live sources of one kind (e.g. every bookie of the process) and the collector that
    exports their metrics.

    Invariants: the collector is registered with ``registry`` once, when this object is built
    (a second one with the same names on the same registry is refused by the registry); a
    source counts from ``track`` until ``untrack``; nothing here runs on a hot path (sources
    count with plain ints, read only at scrape time). A metric with no tracked source exports
    no sample.
    """

    def __init__(self, metrics: Sequence[SourceMetric[S]], *, registry: CollectorRegistry = REGISTRY) -> None:
        self._metrics = tuple(metrics)
        # Copied on write: a scrape iterates a snapshot while bookies come and go.
        self._sources: tuple[S, ...] = ()
        self._lock = threading.Lock()
        registry.register(self)

    @property
    def sources(self) -> tuple[S, ...]:
        return self._sources

    def track(self, source: S) -> None:
        with self._lock:
            if not any(s is source for s in self._sources):
                self._sources = (*self._sources, source)

    def untrack(self, source: S) -> None:
        with self._lock:
            self._sources = tuple(s for s in self._sources if s is not source)

    def samples(self, name: str) -> dict[tuple[str, ...], float]:
        """The exported samples of metric ``name``: every source's, combined per label set."""
        for metric in self._metrics:
            if metric.name == name:
                return combine_samples([metric.read(s) for s in self._sources], metric.combine)
        raise KeyError(name)

    def describe(self) -> Iterator[Metric]:
        # Names only (the registry checks duplicates with them), without reading any source.
        for metric in self._metrics:
            yield _family(metric)

    def collect(self) -> Iterator[Metric]:
        sources = self._sources
        for metric in self._metrics:
            family = _family(metric)
            for label_values, value in combine_samples([metric.read(s) for s in sources], metric.combine).items():
                family.add_metric(list(label_values), value)
            yield family


def combine_samples(per_source: Sequence[Samples], how: Literal["sum", "min"]) -> dict[tuple[str, ...], float]:
    """Merge the samples of several sources: per label set, the sum (counts) or the minimum
    (a state such as "writable": the process is writable only if every source is)."""
    merged: dict[tuple[str, ...], float] = {}
    for samples in per_source:
        for labels, value in samples.items():
            if labels not in merged:
                merged[labels] = float(value)
            elif how == "sum":
                merged[labels] += value
            else:
                merged[labels] = min(merged[labels], value)
    return merged


def _family(metric: SourceMetric[S]) -> CounterMetricFamily | GaugeMetricFamily | _BookKeeperFamily:
    if metric.kind == "counter":
        return CounterMetricFamily(metric.name, metric.doc, labels=metric.labels)
    if metric.kind == "gauge":
        return GaugeMetricFamily(metric.name, metric.doc, labels=metric.labels)
    return _BookKeeperFamily(metric.name, metric.doc, metric.kind, metric.labels)


class _BookKeeperFamily(Metric):
    """A family spelled as BookKeeper's Prometheus provider spells it (``Kind``)."""

    def __init__(self, name: str, doc: str, kind: Kind, labels: tuple[str, ...]) -> None:
        super().__init__(name, doc, "summary" if kind == "bk_count" else "unknown")
        self._sample_name = f"{name}_count" if kind == "bk_count" else name
        self._labels = labels

    def add_metric(self, label_values: Sequence[str], value: float) -> None:
        self.add_sample(self._sample_name, dict(zip(self._labels, label_values, strict=True)), value)


def once_per_process(make: Callable[[], T]) -> Callable[[], T]:
    """``make`` wrapped to run once per process (thread-safe); later calls return its result.
    For the collectors registered with ``REGISTRY``, which the registry accepts only once."""
    made: list[T] = []
    lock = threading.Lock()

    def get() -> T:
        with lock:
            if not made:
                made.append(make())
            return made[0]

    return get
