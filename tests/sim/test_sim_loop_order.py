"""The simulator's lean event loop keeps asyncio's callback order, and a seed's outcome does not
depend on the garbage collector (docs/verification.md, "Determinism" and "Speed")."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable
from typing import Any

import pytest

from vellum.sim.campaign import run_campaign
from vellum.sim.loop import SimLoop
from vellum.sim.runner import RunResult, SimOptions, run_seed
from vellum.sim.workload import WorkloadShape


def _scenario(loop: asyncio.AbstractEventLoop, log: list[str]) -> Callable[[], asyncio.Future[None]]:
    """Ready callbacks, callbacks that schedule more, futures, tasks, a cancelled handle and a
    timer already due when it is scheduled: a real asyncio loop runs them in one fixed order too
    (a due timer joins the ready queue at the next iteration, behind what is ready then)."""

    def cb(name: str, then: tuple[str, ...] = ()) -> None:
        log.append(name)
        for nxt in then:
            loop.call_soon(cb, nxt)

    async def task(name: str, fut: asyncio.Future[str]) -> None:
        log.append(f"{name}-start")
        log.append(f"{name}-got-{await fut}")
        await asyncio.sleep(0)
        log.append(f"{name}-end")

    def due_timer() -> None:
        log.append("s")
        loop.call_at(loop.time(), cb, "due")
        loop.call_soon(cb, "c1", ("c2",))

    def start() -> asyncio.Future[None]:
        fut: asyncio.Future[str] = loop.create_future()
        loop.call_soon(due_timer)
        loop.call_soon(cb, "a", ("a1", "a2"))
        dead = loop.call_soon(cb, "cancelled")
        t1 = loop.create_task(task("t1", fut))
        loop.call_soon(cb, "b", ("b1",))
        t2 = loop.create_task(task("t2", fut))
        loop.call_soon(fut.set_result, "x")
        loop.call_soon(cb, "c")
        dead.cancel()
        return asyncio.gather(t1, t2)

    return start


def _order(loop: asyncio.AbstractEventLoop) -> list[str]:
    log: list[str] = []
    start = _scenario(loop, log)
    try:
        loop.run_until_complete(start())
    finally:
        loop.close()
    return log


def test_ready_callbacks_tasks_and_futures_run_in_the_order_a_real_asyncio_loop_runs_them() -> None:
    assert _order(SimLoop()) == _order(asyncio.new_event_loop())


def test_timers_run_by_deadline_then_in_scheduling_order_after_what_was_ready() -> None:
    loop = SimLoop()
    log: list[str] = []
    now = loop.time()
    for name, when in (("late", now + 2.0), ("tie-1", now + 1.0), ("early", now + 0.5), ("tie-2", now + 1.0),
                       ("tie-3", now + 1.0)):
        loop.call_at(when, log.append, name)
    gone = loop.call_later(1.0, log.append, "cancelled")
    loop.call_soon(log.append, "ready")
    gone.cancel()
    loop.call_later(3.0, loop.stop)
    loop.run_forever()
    assert log == ["ready", "early", "tie-1", "tie-2", "tie-3", "late"]
    assert loop.time() == pytest.approx(now + 3.0)
    loop.close()
    with pytest.raises(RuntimeError, match="closed"):
        loop.call_soon(log.append, "after close")


def test_a_failing_callback_goes_to_the_exception_handler_and_the_loop_goes_on() -> None:
    loop = SimLoop()
    seen: list[object] = []
    loop.set_exception_handler(lambda _loop, ctx: seen.append(ctx["exception"]))
    log: list[str] = []

    def boom() -> None:
        raise ValueError("boom")

    loop.call_soon(boom)
    loop.call_soon(log.append, "next")
    loop.call_later(0.1, loop.stop)
    loop.run_forever()
    loop.close()
    assert log == ["next"] and len(seen) == 1 and isinstance(seen[0], ValueError)


def test_a_seed_gives_the_same_history_alone_in_a_campaign_and_with_the_collector_off() -> None:
    options = SimOptions(shape=WorkloadShape(ledgers=2, entries=(10, 20), reader_polls=6))
    seeds = (31, 32, 33)
    alone = {s: run_seed(s, options).fingerprint for s in seeds}
    in_campaign: dict[int, str] = {}

    def keep(result: RunResult) -> None:
        in_campaign[result.seed] = result.fingerprint

    run_campaign(seeds, options, on_result=keep)  # the collector's old objects frozen meanwhile
    gc.disable()
    try:
        collector_off = {s: run_seed(s, options).fingerprint for s in seeds}
    finally:
        gc.enable()
    assert alone == in_campaign == collector_off
    assert len(set(alone.values())) == len(seeds)


def test_handles_cancel_once_and_many_cancelled_timers_leave_the_rest_in_order() -> None:
    """What callers use of a handle (``cancel``, ``cancelled``, ``when``): a timer cancelled twice
    counts once, and when most of the heap is cancelled it is cleaned (at the cancel that tips
    it) without losing a live timer or its place in the order."""
    loop = SimLoop()
    log: list[int] = []
    now = loop.time()
    timers = [loop.call_at(now + 1.0 + (i % 7) * 0.1, log.append, i) for i in range(300)]
    assert timers[3].when() == pytest.approx(now + 1.3) and not timers[3].cancelled()
    for i, t in enumerate(timers):
        if i % 10:
            t.cancel()
            t.cancel()
    # cleaned as the cancelled passed half of the heap; each counted once until it is dropped
    assert timers[1].cancelled() and len(loop._heap) < 300
    assert loop._timer_cancelled_count == sum(1 for t in loop._heap if t.cancelled()) == len(loop._heap) - 30
    soon = loop.call_soon(log.append, -1)
    soon.cancel()
    assert soon.cancelled()
    loop.call_later(2.0, loop.stop)
    loop.run_forever()
    loop.close()
    kept = [i for i in range(300) if i % 10 == 0]
    assert log == sorted(kept, key=lambda i: ((i % 7), i))
    assert loop._timer_cancelled_count == 0


def _relay_order(loop: SimLoop, inline: bool) -> tuple[list[str], int]:
    """Timers and ready callbacks whose last act hands on to another callback, through
    ``call_last`` (``inline``) or ``call_soon``: a lone due timer, two timers due at one instant,
    a timer due with callbacks ready, a ready callback last of its turn and one with more
    behind it, a handed-on callback that schedules a timer already due, a hand-on while a timer
    is due, and a hand-on after ``stop``. Returns the log and how many callbacks went through ``call_soon``."""
    log: list[str] = []
    soon = loop.call_soon
    scheduled = [0]

    def counted_soon(callback: Callable[..., object], *args: object, context: object = None) -> asyncio.Handle:
        scheduled[0] += 1
        return soon(callback, *args, context=context)  # type: ignore[arg-type]

    loop.call_soon = counted_soon  # type: ignore[method-assign]
    last = loop.call_last if inline else loop.call_soon

    def cb(name: str, then: tuple[str, ...] = ()) -> None:
        log.append(name)
        for nxt in then:
            loop.call_soon(cb, nxt)

    def relay(name: str, *then: str) -> None:
        log.append(f"relay-{name}")
        last(cb, name, then)

    def due(name: str) -> None:
        log.append(name)
        loop.call_at(loop.time(), cb, f"{name}-due")
        loop.call_soon(cb, f"{name}-soon")

    def relay_due(name: str) -> None:
        log.append(f"relay-{name}")
        last(due, name)

    def stopper() -> None:
        loop.stop()
        last(cb, "after-stop")

    def pend() -> None:  # a timer due at once, still in the heap when the next callback hands on
        log.append("pend")
        loop.call_at(loop.time(), cb, "pending-due")

    def turn(*calls: tuple[Any, ...]) -> None:  # callbacks ready in one turn
        for fn, *args in calls:
            loop.call_soon(fn, *args)

    now = loop.time()
    loop.call_at(now + 1.0, relay, "alone", "alone-1", "alone-2")
    loop.call_at(now + 2.0, relay, "tie-a")
    loop.call_at(now + 2.0, relay, "tie-b", "tie-b-1")
    loop.call_at(now + 3.0, relay, "timer-with-ready")
    loop.call_at(now + 3.0, cb, "ready-after", ("ready-after-1",))
    loop.call_at(now + 4.0, turn, (relay, "first-of-two", "first-1"), (cb, "second-of-two"))
    loop.call_at(now + 4.5, turn, (cb, "first"), (relay, "last-of-turn", "last-1"))
    loop.call_at(now + 5.0, relay_due, "z")
    loop.call_at(now + 5.5, turn, (pend,), (relay, "behind-pending", "behind-pending-1"))
    loop.call_at(now + 6.0, stopper)
    loop.run_forever()
    log.append("stopped")
    loop.call_later(1.0, loop.stop)
    loop.run_forever()
    loop.close()
    return log, scheduled[0]


def test_a_callback_handed_on_as_its_callers_last_act_runs_in_the_order_call_soon_gives() -> None:
    """``SimLoop.call_last`` runs the callback at once only where ``call_soon`` would have run it
    next and alone (docs/verification.md, "Speed"): the same order in every case, and some of
    them ran at once."""
    inline, scheduled_inline = _relay_order(SimLoop(), inline=True)
    queued, scheduled_queued = _relay_order(SimLoop(), inline=False)
    assert inline == queued
    assert queued.index("after-stop") > queued.index("stopped")
    assert 0 < scheduled_inline < scheduled_queued
