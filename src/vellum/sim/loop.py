"""``SimLoop``: an asyncio event loop on virtual time, for the simulator.

Responsibility: run the real asyncio client and server code deterministically in one thread.
``time()`` is a virtual clock; when no callback is ready the clock jumps to the next timer
(nothing ever sleeps for real and no selector is polled). The two places where asyncio code
leaves the loop are seams here, so that production code needs no change:

- ``create_connection`` asks the simulated network (``network.SimNetwork``) for a connection;
- ``run_in_executor`` (what ``asyncio.to_thread`` uses, e.g. for every metadata-store call of
  the client) runs the callable on the loop after a latency chosen by ``executor_hook``.

Invariants: callbacks run in the order asyncio schedules them (FIFO for ready callbacks, timers
by deadline then by scheduling order: the loop keeps its own heap of ``(deadline, sequence,
handle)``, which also compares in C), so a run is a function of its seed; a loop with nothing
ready and no timer raises ``SimQuiescent`` (nothing can ever happen again).
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
from collections.abc import Callable
from typing import Any


class SimQuiescent(RuntimeError):
    """Nothing is ready and no timer is pending: the simulated world is stuck for good."""


class _VirtualSelector:
    """What ``BaseEventLoop._run_once`` polls: advances the clock instead of waiting."""

    def __init__(self, loop: SimLoop) -> None:
        self._loop = loop

    def select(self, timeout: float | None) -> list[Any]:
        if timeout is None:
            raise SimQuiescent("no callback is ready and no timer is pending")
        if timeout > 0:
            self._loop.advance(timeout)
        return []

    def close(self) -> None:
        pass


#: a connect: ``(protocol_factory, host, port) -> awaitable (transport, protocol)``
ConnectHook = Callable[[Callable[[], asyncio.BaseProtocol], str, int], Any]
#: an executor call: ``(func, args) -> future``
ExecutorHook = Callable[[Callable[..., Any], tuple[Any, ...]], "asyncio.Future[Any]"]


class SimLoop(asyncio.BaseEventLoop):
    """An event loop whose clock is virtual (see the module docstring)."""

    def __init__(self, *, start_time: float = 1000.0) -> None:
        super().__init__()
        self._now = start_time
        self._selector = _VirtualSelector(self)
        self._clock_resolution = 1e-9
        self._heap: list[tuple[float, int, Any]] = []  # the handles: asyncio.TimerHandle
        self._seq = 0
        self.connect_hook: ConnectHook | None = None
        self.executor_hook: ExecutorHook | None = None

    # ------------------------------------------------------------------------------ clock
    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds

    def call_at(self, when: float, callback: Callable[..., object], *args: Any,  # type: ignore[override]
                context: contextvars.Context | None = None) -> asyncio.TimerHandle:
        """A timer in the loop's own heap of ``(deadline, sequence, handle)``: compared in C, and
        timers due at the same instant run in the order they were scheduled."""
        self._check_closed()  # type: ignore[attr-defined]
        timer = asyncio.TimerHandle(when, callback, args, self, context)
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, timer))
        timer._scheduled = True  # type: ignore[attr-defined]
        return timer

    # --------------------------------------------------------------------- one iteration
    def _run_once(self) -> None:
        """``BaseEventLoop._run_once`` without the selector, the debug timing and the slow
        paths a real loop needs: move the due timers to the ready queue (jumping the clock to
        the next one when nothing is ready), then run what was ready, in order."""
        sched = self._heap
        ready = self._ready  # type: ignore[attr-defined]
        heappop = heapq.heappop
        cancelled: int = self._timer_cancelled_count  # type: ignore[has-type]
        if cancelled > 100 and cancelled * 2 > len(sched):
            live = []
            for item in sched:
                if item[2]._cancelled:
                    item[2]._scheduled = False
                else:
                    live.append(item)
            heapq.heapify(live)
            sched[:] = live
            self._timer_cancelled_count = 0
        while sched and sched[0][2]._cancelled:
            self._timer_cancelled_count -= 1
            heappop(sched)[2]._scheduled = False
        if not ready:
            if not sched:
                if self._stopping:  # type: ignore[attr-defined]
                    return
                raise SimQuiescent("no callback is ready and no timer is pending")
            if not self._stopping:  # type: ignore[attr-defined]
                when = sched[0][0]
                if when > self._now:
                    self._now = when
        end = self._now + self._clock_resolution
        while sched and sched[0][0] < end:
            h = heappop(sched)[2]
            h._scheduled = False
            if h._cancelled:
                self._timer_cancelled_count -= 1
            else:
                ready.append(h)
        for _ in range(len(ready)):
            h = ready.popleft()
            if not h._cancelled:
                h._run()

    # ----------------------------------------------------- what BaseEventLoop leaves to us
    def _process_events(self, event_list: list[Any]) -> None:
        pass

    def _write_to_self(self) -> None:
        pass  # single-threaded: a call_soon_threadsafe is seen at the next iteration anyway

    # ------------------------------------------------------------------------------ seams
    async def create_connection(  # type: ignore[override]
        self, protocol_factory: Callable[[], asyncio.BaseProtocol], host: str | None = None,
        port: int | None = None, **_kw: Any,
    ) -> tuple[asyncio.BaseTransport, asyncio.BaseProtocol]:
        if self.connect_hook is None:
            raise ConnectionRefusedError("the simulated loop has no network")
        return await self.connect_hook(protocol_factory, str(host), int(port or 0))  # type: ignore[no-any-return]

    def run_in_executor(self, executor: Any, func: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:  # type: ignore[override]
        if self.executor_hook is not None:
            return self.executor_hook(func, args)
        fut: asyncio.Future[Any] = self.create_future()
        ctx = contextvars.copy_context()

        def run() -> None:
            try:
                fut.set_result(ctx.run(func, *args))
            except BaseException as e:
                fut.set_exception(e)

        self.call_soon(run)
        return fut
