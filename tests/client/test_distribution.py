"""Properties of the pure distribution logic (client/distribution.py) and back-pressure policy
(client/backpressure.py): write sets, quorum coverage, "can the ack quorum still be reached",
and the plans of batched and strided range reads, each checked against a brute-force model."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from vellum.client.backpressure import BACKOFF_INITIAL_S, BACKOFF_MAX_S, MIN_WINDOW, backoff_delay, cut_window
from vellum.client.distribution import (
    RoundRobinSchedule,
    chunk_entries,
    ensemble_coverage,
    has_quorum_coverage,
    plan_batched_chunks,
    plan_strided_chunks,
    segment_last,
    size_cut,
    strided_ids,
    write_set,
)

#: a schedule and a set of its ensemble indexes (bookies that answered, or failed)
Case = tuple[RoundRobinSchedule, frozenset[int]]


@st.composite
def quorums(draw: st.DrawFn, max_e: int = 9) -> tuple[int, int, int]:
    """(E, WQ, AQ) with E >= WQ >= AQ >= 1."""
    e = draw(st.integers(1, max_e))
    wq = draw(st.integers(1, e))
    aq = draw(st.integers(1, wq))
    return e, wq, aq


@st.composite
def schedule_and_subset(draw: st.DrawFn) -> Case:
    e, wq, aq = draw(quorums())
    subset = draw(st.frozensets(st.integers(0, e - 1)))
    return RoundRobinSchedule(e, wq, aq), subset


#: first entry ids of a ledger's segments: always 0, then some later ones
SEGMENT_FIRSTS = st.frozensets(st.integers(1, 400), max_size=6).map(lambda s: sorted(s | {0}))


def _segment_of(entry_id: int, firsts: list[int]) -> int:
    return max(f for f in firsts if f <= entry_id)


def _members_outside(schedule: RoundRobinSchedule, indexes: frozenset[int]) -> list[int]:
    """For each write set, how many of its members are not in ``indexes``."""
    return [sum(1 for idx in ws if idx not in indexes) for ws in schedule.write_sets]


# ----------------------------------------------------------------------------- write sets


@given(quorums(), st.integers(0, 10**12))
def test_write_set_is_round_robin_from_the_entry(q: tuple[int, int, int], entry_id: int) -> None:
    e, wq, aq = q
    ws = write_set(entry_id, e, wq)
    assert len(ws) == wq and len(set(ws)) == wq, "WQ distinct bookies"
    assert ws[0] == entry_id % e, "the head is e % E"
    assert all(ws[i + 1] == (ws[i] + 1) % e for i in range(wq - 1)), "consecutive, wrapping"
    schedule = RoundRobinSchedule(e, wq, aq)
    assert schedule.write_set(entry_id) == tuple(ws)


@given(quorums())
def test_every_bookie_is_in_exactly_wq_write_sets(q: tuple[int, int, int]) -> None:
    e, wq, aq = q
    schedule = RoundRobinSchedule(e, wq, aq)
    assert len(schedule.write_sets) == e
    counts = [sum(1 for ws in schedule.write_sets if idx in ws) for idx in range(e)]
    assert counts == [wq] * e, "striping spreads the entries evenly"


@given(quorums(), st.integers(0, 10**6), st.integers(0, 20))
def test_replicas_are_the_write_set_rotated(q: tuple[int, int, int], entry_id: int, rotation: int) -> None:
    e, wq, aq = q
    ensemble = [f"bookie-{i}" for i in range(e)]
    schedule = RoundRobinSchedule(e, wq, aq)
    plain = [ensemble[i] for i in write_set(entry_id, e, wq)]
    assert schedule.replicas(ensemble, entry_id) == plain
    rotated = schedule.replicas(ensemble, entry_id, rotation)
    k = rotation % wq
    assert rotated == plain[k:] + plain[:k]


# ------------------------------------------------------------------------- quorum coverage


@given(schedule_and_subset())
def test_quorum_coverage_means_no_write_set_has_aq_silent_bookies(case: Case) -> None:
    schedule, responded = case
    e, wq, aq = schedule.ensemble_size, schedule.write_quorum_size, schedule.ack_quorum_size
    model = all(silent < aq for silent in _members_outside(schedule, responded))
    assert has_quorum_coverage(responded, e, wq, aq) is model
    assert schedule.has_quorum_coverage(responded) is model


@given(schedule_and_subset(), st.frozensets(st.integers(0, 8)))
def test_quorum_coverage_is_monotonic(case: Case, more: frozenset[int]) -> None:
    schedule, responded = case
    more = frozenset(i for i in more if i < schedule.ensemble_size)
    if schedule.has_quorum_coverage(responded):
        assert schedule.has_quorum_coverage(responded | more), "more answers never lose coverage"
    assert schedule.has_quorum_coverage(frozenset(range(schedule.ensemble_size)))
    assert not schedule.has_quorum_coverage(frozenset()), "nothing answered proves nothing"


@given(quorums(max_e=7), st.data())
def test_any_ensemble_coverage_answers_reach_quorum_coverage(q: tuple[int, int, int], data: st.DataObject) -> None:
    e, wq, aq = q
    need = ensemble_coverage(e, aq)
    schedule = RoundRobinSchedule(e, wq, aq)
    assert schedule.ensemble_coverage == need == e - aq + 1
    answered = data.draw(st.sets(st.integers(0, e - 1), min_size=need, max_size=need))
    assert e - len(answered) < aq, "fewer than AQ bookies are left unfenced"
    assert schedule.has_quorum_coverage(answered)


@given(quorums(max_e=6))
def test_write_set_coverage_negatives_leave_fewer_than_aq_holders(q: tuple[int, int, int]) -> None:
    e, wq, aq = q
    schedule = RoundRobinSchedule(e, wq, aq)
    need = schedule.write_set_coverage
    assert need == wq - aq + 1
    ws = schedule.write_set(0)
    for negatives in itertools.combinations(ws, need):
        assert wq - len(negatives) < aq, "the entry cannot have been acknowledged"
    if need > 1:
        assert wq - (need - 1) >= aq, "one negative fewer proves nothing"


@given(schedule_and_subset())
def test_ack_quorum_possible_means_every_write_set_keeps_aq_live(case: Case) -> None:
    schedule, failed = case
    model = all(live >= schedule.ack_quorum_size for live in _members_outside(schedule, failed))
    assert schedule.ack_quorum_possible(failed) is model
    assert schedule.ack_quorum_possible(set())
    if schedule.write_quorum_size == schedule.ack_quorum_size and failed:
        assert not schedule.ack_quorum_possible(failed), "WQ == AQ tolerates no failed bookie"


# ------------------------------------------------------------------------------ read plans


@given(SEGMENT_FIRSTS, st.integers(0, 500), st.integers(0, 500))
def test_segment_last_stops_before_the_next_segment(firsts: list[int], start: int, length: int) -> None:
    last = start + length
    end = segment_last(start, last, firsts)
    assert start <= end <= last
    assert _segment_of(end, firsts) == _segment_of(start, firsts), "never crosses a segment boundary"
    assert end == last or end + 1 in firsts, "stops only at the end or at a boundary"
    assert segment_last(start, last, reversed(firsts)) == end, "the order of the firsts does not matter"


@given(SEGMENT_FIRSTS, st.integers(0, 500), st.integers(0, 600), st.integers(1, 300))
def test_batched_plan_covers_the_range_once_in_order(
    firsts: list[int], first: int, length: int, per_chunk: int
) -> None:
    last = first + length
    chunks = plan_batched_chunks(first, last, firsts, per_chunk)
    ids = [e for lo, hi in chunks for e in range(lo, hi + 1)]
    assert ids == list(range(first, last + 1)), "every entry once, in entry-id order"
    for lo, hi in chunks:
        assert lo <= hi and hi - lo + 1 <= per_chunk
        assert _segment_of(lo, firsts) == _segment_of(hi, firsts), "one chunk, one write set"
        assert hi == last or hi - lo + 1 == per_chunk or hi + 1 in firsts, "chunks are as long as allowed"


@given(SEGMENT_FIRSTS, st.integers(1, 7), st.integers(0, 500), st.integers(0, 600), st.integers(1, 100))
def test_strided_plan_covers_the_range_once_one_bookie_per_chunk(
    firsts: list[int], e: int, first: int, length: int, per_chunk: int
) -> None:
    last = first + length
    chunks = plan_strided_chunks(first, last, firsts, e, per_chunk)
    assert chunks == sorted(chunks), "chunks of every bookie interleave in entry order"
    ids = [eid for start, count in chunks for eid in strided_ids(start, count, e)]
    assert sorted(ids) == list(range(first, last + 1)), "every entry exactly once"
    for start, count in chunks:
        members = strided_ids(start, count, e)
        assert 1 <= count <= per_chunk
        assert len({eid % e for eid in members}) == 1, "one head bookie serves the whole chunk"
        assert len({_segment_of(eid, firsts) for eid in members}) == 1, "one segment per chunk"


@given(st.integers(-1, 10**6), st.integers(0, 10**9), st.integers(1, 64), st.integers(1, 512),
       st.integers(1, 4 * 1024 * 1024))
def test_chunk_entries_stays_near_the_byte_budget(lac: int, length: int, overhead: int, max_entries: int,
                                                  max_bytes: int) -> None:
    n = chunk_entries(lac, length, overhead, max_entries, max_bytes)
    assert 1 <= n <= max_entries
    if lac < 0 or length == 0:
        assert n == max_entries, "no average known yet"
    else:
        avg = length // (lac + 1) + overhead
        assert n == 1 or n * avg <= max_bytes


@given(st.lists(st.integers(0, 1000), max_size=40), st.integers(-5, 5000))
def test_size_cut_keeps_the_longest_prefix_within_the_budget(sizes: list[int], max_size: int) -> None:
    n = size_cut(sizes, max_size)
    if max_size <= 0 or not sizes:
        assert n == len(sizes)
        return
    assert 1 <= n <= len(sizes), "a batch always returns its first entry"
    assert n == 1 or sum(sizes[:n]) <= max_size
    assert n == len(sizes) or sum(sizes[: n + 1]) > max_size


# ---------------------------------------------------------------------------- back-pressure


@given(st.integers(0, 100))
def test_backoff_grows_exponentially_to_a_cap_with_jitter(attempt: int) -> None:
    base = min(BACKOFF_MAX_S, BACKOFF_INITIAL_S * 2 ** min(attempt, 16))
    delay = backoff_delay(attempt)
    assert base / 2 <= delay <= base <= BACKOFF_MAX_S


@given(st.floats(1, 10**6), st.integers(0, 10**6))
def test_window_cut_halves_what_is_in_flight_down_to_the_floor(window: float, in_flight: int) -> None:
    cut = cut_window(window, in_flight)
    assert cut >= MIN_WINDOW
    assert cut == MIN_WINDOW or cut <= min(window, in_flight) / 2
