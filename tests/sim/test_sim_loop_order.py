"""The simulator's lean event loop keeps asyncio's callback order, and a seed's outcome does not
depend on the garbage collector (docs/verification.md, "Determinism" and "Speed")."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable

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
    counts once, and when most of the heap is cancelled it is cleaned without losing a live timer
    or its place in the order."""
    loop = SimLoop()
    log: list[int] = []
    now = loop.time()
    timers = [loop.call_at(now + 1.0 + (i % 7) * 0.1, log.append, i) for i in range(300)]
    assert timers[3].when() == pytest.approx(now + 1.3) and not timers[3].cancelled()
    for i, t in enumerate(timers):
        if i % 10:
            t.cancel()
            t.cancel()
    assert timers[1].cancelled() and loop._timer_cancelled_count == 270
    soon = loop.call_soon(log.append, -1)
    soon.cancel()
    assert soon.cancelled()
    loop.call_later(2.0, loop.stop)
    loop.run_forever()
    loop.close()
    kept = [i for i in range(300) if i % 10 == 0]
    assert log == sorted(kept, key=lambda i: ((i % 7), i))
    assert loop._timer_cancelled_count == 0
