"""``wait_first`` (client/replica_read.py) schedules exactly as ``asyncio.wait(...,
return_when=FIRST_COMPLETED)``: the same callbacks in the same order and the same sets in the
same iteration order, on a real asyncio loop (the simulator's histories depend on both)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from vellum.client.replica_read import wait_first

Waiter = Callable[[set["asyncio.Future[Any]"], "float | None"], Awaitable[tuple[set[Any], set[Any]]]]


async def _asyncio_wait(fs: set[asyncio.Future[Any]], timeout: float | None) -> tuple[set[Any], set[Any]]:
    return await asyncio.wait(fs, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)


async def _scenario(wait: Waiter, case: str) -> list[str]:
    """A trace of what ran, in order: other callbacks on the futures and on the loop around the
    wait, the waiting task's resumption and the sets it got (names in iteration order)."""
    loop = asyncio.get_running_loop()
    trace: list[str] = []
    futs = [loop.create_future() for _ in range(5)]
    names = {f: f"f{i}" for i, f in enumerate(futs)}
    for f in futs:
        f.add_done_callback(lambda f: trace.append(f"before-wait cb {names[f]}"))
    if case == "one done already":
        futs[3].set_result(3)

    async def waiting() -> None:
        trace.append("wait starts")
        timeout = 0.01 if case == "timeout" else None
        try:
            done, pending = await wait(set(futs), timeout)
        except asyncio.CancelledError:
            trace.append("cancelled")
            raise
        # (the sets' order follows the futures' addresses: compared on the same futures below)
        trace.append(f"done {sorted(names[f] for f in done)} pending {sorted(names[f] for f in pending)}")

    task = loop.create_task(waiting())
    loop.call_soon(trace.append, "soon 1")
    await asyncio.sleep(0)
    for f in futs:
        f.add_done_callback(lambda f: trace.append(f"after-wait cb {names[f]}"))
    loop.call_soon(trace.append, "soon 2")
    if case == "two complete together":
        futs[4].set_result(4)
        futs[1].set_exception(ValueError("x"))
    elif case == "cancelled":
        task.cancel()
    elif case == "one done later":
        loop.call_soon(futs[2].set_result, 2)
    for _ in range(8):
        await asyncio.sleep(0)
    if case == "timeout":
        await asyncio.sleep(0.05)
    await asyncio.wait({task}, timeout=1.0)  # bounded: a wait that never wakes is a failure, not a hang
    if not task.done():
        trace.append("still waiting")
        task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    for f in futs:
        if f.done() and not f.cancelled():
            f.exception()
        callbacks = getattr(f, "_callbacks", None)
        trace.append(f"{names[f]} keeps {len(callbacks) if callbacks is not None else '?'} callbacks")
    return trace


@pytest.mark.parametrize("case", ["one done already", "two complete together", "one done later", "timeout",
                                  "cancelled"])
def test_wait_first_schedules_as_asyncio_wait(case: str) -> None:
    expected = asyncio.run(_scenario(_asyncio_wait, case))
    got = asyncio.run(_scenario(wait_first, case))
    assert got == expected
    assert any(line.startswith(("done", "cancelled")) for line in got)


def test_wait_first_sets_iterate_as_asyncio_waits() -> None:
    async def both() -> None:
        loop = asyncio.get_running_loop()
        for n in (2, 3, 5, 9, 17):
            futs = [loop.create_future() for _ in range(n)]
            for f in futs[::3]:
                f.set_result(None)
            given = set(futs)
            for f in futs[1::4]:  # a set with removed members iterates in another order than a fresh one
                given.discard(f)
            expected = await asyncio.wait(given, return_when=asyncio.FIRST_COMPLETED)
            got = await wait_first(given)
            assert [list(s) for s in got] == [list(s) for s in expected]

    asyncio.run(both())
