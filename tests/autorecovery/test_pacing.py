"""How a replication worker paces itself: the window that yields to foreground traffic.

A fake clock drives the window: "the cluster is idle" is a stream of delays near the base,
"foreground writers arrived" a stream of delays far above base + target.
"""

from __future__ import annotations

import asyncio

import pytest

from vellum.autorecovery.pacing import YieldingWindow

TARGET = 0.010
BASE = 0.002


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def feed(w: YieldingWindow, clock: Clock, delay: float, seconds: float, per_round: int = 4) -> None:
    """``seconds`` of completions, ``per_round`` of them in each 50 ms round."""
    step = 0.05 / per_round
    end = clock.now + seconds
    while clock.now < end:
        clock.now += step
        w.done(delay)


def test_alone_on_the_cluster_the_window_opens_to_the_batch_size() -> None:
    clock = Clock()
    w = YieldingWindow(100, TARGET, clock=clock)
    assert w.window == 1.0  # starts cautious
    feed(w, clock, BASE, 0.1)
    # its own queue stays under the target: it opens (slow at first, then by a quarter a round)
    feed(w, clock, BASE + TARGET / 2, 3.0)
    assert w.window == 100


def test_behind_foreground_traffic_the_window_closes_to_one_entry() -> None:
    clock = Clock()
    w = YieldingWindow(100, TARGET, clock=clock)
    feed(w, clock, BASE, 3.0)
    assert w.window == 100
    feed(w, clock, BASE + 5 * TARGET, 0.2)  # 0.2 s: a few rounds of long delays
    assert 1 < w.window < 100
    feed(w, clock, BASE + 5 * TARGET, 2.0)
    assert w.window == 1.0  # never below one: healing goes on, slowly
    feed(w, clock, BASE + TARGET / 2, 3.0)  # the writers left
    assert w.window == 100


def test_a_round_lasts_at_least_the_current_delay() -> None:
    clock = Clock()
    w = YieldingWindow(100, TARGET, clock=clock)
    feed(w, clock, BASE, 3.0)
    # delays of 0.5 s: one decision per 0.5 s, not per 50 ms (each sees the last one's effect)
    feed(w, clock, 0.5, 1.01, per_round=40)
    assert w.window in (25.0, 50.0)


def test_the_median_delay_of_a_round_decides() -> None:
    clock = Clock()
    w = YieldingWindow(100, TARGET, clock=clock)
    feed(w, clock, BASE, 3.0)
    for _ in range(40):  # a slow request now and then (an fsync stall): the window stays open
        for d in (BASE, BASE + 20 * TARGET, BASE, BASE):
            clock.now += 0.0125
            w.done(d)
    assert w.window == 100
    # most requests wait although one in four finds an idle bookie (CPU-bound cluster): it yields
    for _ in range(40):
        for d in (BASE, BASE + 2 * TARGET, BASE + 2 * TARGET, BASE + 2 * TARGET):
            clock.now += 0.0125
            w.done(d)
    assert w.window == 1.0


def test_the_base_follows_a_cluster_that_got_slower_for_good() -> None:
    clock = Clock()
    w = YieldingWindow(100, TARGET, bucket_s=1.0, base_buckets=3, clock=clock)
    feed(w, clock, BASE, 3.0)
    slower = BASE + 3 * TARGET  # e.g. a bookie replaced by a slower disk, nobody else writing
    feed(w, clock, slower, 1.0)
    assert w.window == 1.0
    feed(w, clock, slower, 4.0)  # after base_buckets buckets the old minimum is forgotten
    assert w.base_s == pytest.approx(slower)
    assert w.window == 100


def test_without_a_target_the_window_is_the_batch_size() -> None:
    clock = Clock()
    w = YieldingWindow(10, None, clock=clock)
    feed(w, clock, 10.0, 1.0)
    assert w.window == 10


def test_slots_never_exceed_the_window_and_are_handed_out_in_order() -> None:
    async def scenario() -> None:
        w = YieldingWindow(3, None)
        started: list[int] = []
        peak = 0
        gate = asyncio.Event()

        async def entry(i: int) -> None:
            nonlocal peak
            async with w.slot():
                started.append(i)
                peak = max(peak, w.in_flight)
                await gate.wait()

        tasks = [asyncio.ensure_future(entry(i)) for i in range(10)]
        await asyncio.sleep(0.01)
        assert started == [0, 1, 2]
        # a waiter cancelled before its turn leaves no slot behind
        tasks[4].cancel()
        gate.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert started == [0, 1, 2, 3, 5, 6, 7, 8, 9]
        assert peak == 3
        assert w.in_flight == 0

    asyncio.run(scenario())


def test_a_window_that_opens_wakes_the_waiters() -> None:
    async def scenario() -> None:
        clock = Clock()
        w = YieldingWindow(4, TARGET, clock=clock)
        holding = asyncio.Event()
        running = 0

        async def entry() -> None:
            nonlocal running
            async with w.slot():
                running += 1
                await holding.wait()

        tasks = [asyncio.ensure_future(entry()) for _ in range(4)]
        await asyncio.sleep(0.01)
        assert running == 1
        feed(w, clock, BASE, 0.2)  # completions elsewhere (e.g. the verify path) open the window
        await asyncio.sleep(0.01)
        assert running == 4
        holding.set()
        await asyncio.gather(*tasks)

    asyncio.run(scenario())


def test_a_waiter_cancelled_just_as_its_slot_came_gives_the_slot_back() -> None:
    async def scenario() -> None:
        w = YieldingWindow(1, None)
        async with w.slot():
            waiter = asyncio.ensure_future(w.slot().__aenter__())
            await asyncio.sleep(0)
        # leaving the slot handed it to the waiter, which is cancelled before it runs
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        assert w.in_flight == 0
        await asyncio.wait_for(w.slot().__aenter__(), 1.0)

    asyncio.run(scenario())
