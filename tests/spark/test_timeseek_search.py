"""The search behind offsets by time (vellum.spark.timeseek) against brute force.

Times within one ledger never decrease (the writers guarantee it); across the segments of a name
they go back and forth (parallel tasks, other hosts' clocks). The answer must be the first entry,
in entry-id order, whose append time is >= t, and a search must read O(log n) entries per ledger.
"""

from __future__ import annotations

import bisect
import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from vellum.spark.options import OptionError, parse_time_options
from vellum.spark.timeseek import PROBES, SCAN, TimedSpan, first_at_or_after, seek


def _brute(times: list[int], t: int) -> int | None:
    return next((i for i, ts in enumerate(times) if ts >= t), None)


def _segments(rng: random.Random, n_segments: int) -> tuple[list[TimedSpan], list[int]]:
    """Segments with non-decreasing times inside each, anything across them (global ids from 0)."""
    spans: list[TimedSpan] = []
    times: list[int] = []
    for lid in range(n_segments):
        n = rng.choice([1, 2, 5, 33, 100, rng.randint(1, 3000)])
        start = rng.randint(0, 10_000)
        seg = sorted(start + rng.randint(0, 5_000) for _ in range(n))
        if rng.random() < 0.3:
            seg = [start] * n  # all equal
        first = len(times)
        known = rng.random() < 0.5
        spans.append(TimedSpan(lid, first, first, first + n - 1, (seg[0], seg[-1]) if known else None))
        times.extend(seg)
    return spans, times


class _Reader:
    def __init__(self, times: list[int]) -> None:
        self.times = times
        self.read: dict[int, int] = {}

    def __call__(self, span: TimedSpan, ids: list[int]) -> list[int]:
        assert all(span.first <= i <= span.last for i in ids), (span, ids)
        self.read[span.ledger_id] = self.read.get(span.ledger_id, 0) + len(ids)
        return [self.times[i] for i in ids]


def _bound(n: int) -> int:
    """Entries one ledger's search may read: 2 for its range, PROBES per round, a final scan."""
    rounds = max(0, math.ceil(math.log(max(1, n / SCAN), PROBES + 1))) + 1
    return 2 + PROBES * rounds + SCAN


def test_search_matches_brute_force_over_random_segments() -> None:
    rng = random.Random(20261127)
    for _case in range(300):
        spans, times = _segments(rng, rng.randint(1, 8))
        probes = {0, max(times) + 1, *rng.sample(times, min(len(times), 10)), *(t + 1 for t in times[:3])}
        for t in probes:
            reader = _Reader(times)
            assert seek(reader, spans, t) == _brute(times, t), (t, spans)
            for span in spans:
                assert reader.read.get(span.ledger_id, 0) <= _bound(span.last - span.first + 1)


def test_search_on_a_readable_suffix_of_a_segment() -> None:
    """A shrunk name: the readable part starts inside the first segment; the segment's recorded
    range covers entries that are gone."""
    times = [10, 20, 30, 40, 50, 60]
    span = TimedSpan(1, 0, 3, 5, (10, 60))
    for t, want in ((0, 3), (35, 3), (40, 3), (41, 4), (60, 5), (61, None)):
        assert seek(_Reader(times), [span], t) == want


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=400), st.integers(-1, 52))
def test_binary_search_of_one_ledger(raw: list[int], t: int) -> None:
    times = sorted(raw)
    got = first_at_or_after(lambda ids: [times[i] for i in ids], 0, len(times) - 1, t)
    want = bisect.bisect_left(times, t)
    assert got == (want if want < len(times) else None)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=400), st.integers(0, 52))
def test_a_clock_stepping_back_inside_a_ledger_still_finds_a_time_at_or_after(raw: list[int], t: int) -> None:
    """Old data whose writer's clock stepped back: the entry found was appended at or after t
    (never one before t); it may not be the first such entry (docs/spark.md says so)."""
    got = first_at_or_after(lambda ids: [raw[i] for i in ids], 0, len(raw) - 1, t)
    if got is not None:
        assert raw[got] >= t
    if _brute(raw, t) is None:
        assert got is None


def test_time_options_parse_and_refuse_bad_input() -> None:
    start, end, strategy = parse_time_options({"startingTimestamp": "1000", "endingOffsetsByTimestamp":
                                               '{"a/b": 2000}'}, streaming=False)
    assert start is not None and start.every == 1000 and start.time_of("x") == 1000
    assert end is not None and end.time_of("a/b") == 2000 and end.time_of("c") is None
    assert strategy == "error"
    # precedence: startingTimestamp over startingOffsetsByTimestamp
    start, _, _ = parse_time_options({"startingTimestamp": "5", "startingOffsetsByTimestamp": '{"a": 7}'},
                                     streaming=True)
    assert start is not None and start.option == "startingTimestamp" and start.time_of("a") == 5
    bad = [
        ({"startingOffsetsByTimestampStrategy": "earliest"}, "startingOffsetsByTimestampStrategy"),
        ({"startingTimestamp": "12.5"}, "startingTimestamp"),
        ({"startingTimestamp": "-1"}, "startingTimestamp"),
        ({"endingTimestamp": "abc"}, "endingTimestamp"),
        ({"startingOffsetsByTimestamp": "{a: 1"}, "startingOffsetsByTimestamp"),
        ({"startingOffsetsByTimestamp": "[1]"}, "startingOffsetsByTimestamp"),
        ({"startingOffsetsByTimestamp": '{"a": -5}'}, "startingOffsetsByTimestamp"),
        ({"startingOffsetsByTimestamp": '{"a": "x"}'}, "startingOffsetsByTimestamp"),
    ]
    for options, option in bad:
        try:
            parse_time_options(options, streaming=False)
        except OptionError as exc:
            assert str(exc).startswith("[VELLUM_OPTION]") and option in str(exc), exc
        else:
            raise AssertionError(f"accepted {options}")
    try:
        parse_time_options({"endingTimestamp": "1"}, streaming=True)
    except OptionError as exc:
        assert "batch reads only" in str(exc)
    else:
        raise AssertionError("a stream accepted endingTimestamp")
