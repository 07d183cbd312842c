"""stats.LiveSources: metrics of several live objects of one kind, read at scrape time and
combined per label set; pure (no bookie, no I/O)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from vellum.stats import LiveSources, SourceMetric, combine_samples, once_per_process


@dataclass
class _Thing:
    count: int = 0
    up: bool = True
    by_kind: dict[str, int] = field(default_factory=dict)


METRICS = (
    SourceMetric[_Thing]("thing_COUNT", "things counted", lambda t: {(): float(t.count)}),
    SourceMetric[_Thing]("thing_UP", "1 = up", lambda t: {(): 1.0 if t.up else 0.0}, kind="gauge", combine="min"),
    SourceMetric[_Thing]("thing_BY_KIND", "by kind", lambda t: {(k,): float(v) for k, v in t.by_kind.items()},
                         labels=("kind",)),
)


def test_sources_are_read_at_scrape_time_and_summed() -> None:
    registry = CollectorRegistry(auto_describe=True)
    live = LiveSources(METRICS, registry=registry)
    a, b = _Thing(3, by_kind={"x": 1}), _Thing(4, by_kind={"x": 2, "y": 5})
    live.track(a)
    live.track(b)
    live.track(a)  # tracking twice counts once
    assert live.sources == (a, b)
    a.count += 10  # plain ints on the hot path, seen at the next scrape
    text = generate_latest(registry).decode()
    assert "thing_COUNT_total 17.0" in text
    assert 'thing_BY_KIND_total{kind="x"} 3.0' in text
    assert 'thing_BY_KIND_total{kind="y"} 5.0' in text
    assert "thing_UP 1.0" in text
    b.up = False
    assert live.samples("thing_UP") == {(): 0.0}  # a state gauge: the minimum
    live.untrack(b)
    assert live.samples("thing_COUNT") == {(): 13.0}
    assert live.samples("thing_UP") == {(): 1.0}
    live.untrack(a)
    assert live.samples("thing_COUNT") == {}  # no source, no sample
    assert "thing_COUNT" in generate_latest(registry).decode()  # the family is still described
    with pytest.raises(KeyError):
        live.samples("nothing")


def test_a_registry_takes_one_collector_per_name() -> None:
    registry = CollectorRegistry(auto_describe=True)
    LiveSources(METRICS, registry=registry)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        LiveSources(METRICS, registry=registry)


def test_combine_samples() -> None:
    assert combine_samples([{(): 1}, {(): 2.5}, {("a",): 1}], "sum") == {(): 3.5, ("a",): 1.0}
    assert combine_samples([{(): 1}, {(): 0}], "min") == {(): 0.0}
    assert combine_samples([], "sum") == {}


def test_once_per_process_makes_once_even_from_many_threads() -> None:
    made: list[object] = []
    barrier = threading.Barrier(8)

    def make() -> object:
        made.append(object())
        return made[-1]

    get = once_per_process(make)
    got: list[object] = []

    def worker() -> None:
        barrier.wait()
        got.append(get())

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and all(g is made[0] for g in got)
