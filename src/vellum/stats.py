"""Metrics: one Prometheus registry per process and constructors that name metrics the way
BookKeeper's Prometheus provider does (``bookie_*``, ``bookkeeper_server_*``).

Layers create their metrics through these helpers so the admin HTTP server can export one
registry. No I/O: exporting is the HTTP layer's job.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

REGISTRY = CollectorRegistry(auto_describe=True)

# Latency buckets in seconds, from 50 us to 10 s.
LATENCY_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
)

_cache: dict[str, object] = {}


def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
    """Get or create a counter (idempotent, so a module may be imported more than once)."""
    if name not in _cache:
        _cache[name] = Counter(name, doc, labels, registry=REGISTRY)
    metric = _cache[name]
    assert isinstance(metric, Counter)
    return metric


def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
    if name not in _cache:
        _cache[name] = Gauge(name, doc, labels, registry=REGISTRY)
    metric = _cache[name]
    assert isinstance(metric, Gauge)
    return metric


def histogram(name: str, doc: str, labels: tuple[str, ...] = ()) -> Histogram:
    if name not in _cache:
        _cache[name] = Histogram(name, doc, labels, registry=REGISTRY, buckets=LATENCY_BUCKETS)
    metric = _cache[name]
    assert isinstance(metric, Histogram)
    return metric


class _CallbackCollector:
    """Reads values at scrape time, so hot paths count with plain ints instead of metric calls
    (a labelled Prometheus ``inc()`` costs microseconds; an int increment costs nanoseconds)."""

    def __init__(self, name: str, doc: str, kind: str, fn: Callable[[], dict[tuple[str, ...], float]],
                 labels: tuple[str, ...]) -> None:
        self._name, self._doc, self._kind, self._fn, self._labels = name, doc, kind, fn, labels

    def collect(self) -> Iterator[Metric]:
        family: Metric
        if self._kind == "counter":
            family = CounterMetricFamily(self._name, self._doc, labels=self._labels)
        else:
            family = GaugeMetricFamily(self._name, self._doc, labels=self._labels)
        for label_values, value in self._fn().items():
            family.add_metric(list(label_values), value)
        yield family


def callback_metric(
    name: str,
    doc: str,
    fn: Callable[[], dict[tuple[str, ...], float]],
    *,
    kind: str = "counter",
    labels: tuple[str, ...] = (),
) -> None:
    """Export ``fn()`` ({label values: value}) as a counter or gauge; replaces an earlier one
    of the same name (a process may build several bookies, e.g. in tests)."""
    old = _cache.pop(name, None)
    if old is not None:
        REGISTRY.unregister(old)  # type: ignore[arg-type]
    collector = _CallbackCollector(name, doc, kind, fn, labels)
    REGISTRY.register(collector)  # type: ignore[arg-type]
    _cache[name] = collector
