"""``SimLoop``: an asyncio event loop on virtual time, for the simulator.

Responsibility: run the real asyncio client and server code deterministically in one thread.
``time()`` is a virtual clock; when no callback is ready the clock jumps to the next timer
(nothing ever sleeps for real and no selector is polled). The two places where asyncio code
leaves the loop are seams here, so that production code needs no change:

- ``create_connection`` asks the simulated network (``network.SimNetwork``) for a connection;
- ``run_in_executor`` (what ``asyncio.to_thread`` uses, e.g. for every metadata-store call of
  the client) runs the callable on the loop after a latency chosen by ``executor_hook``.

Invariants: callbacks run in the order asyncio schedules them (FIFO for ready callbacks, timers
by deadline then by scheduling order: the loop keeps its own heap of timers, each a list that
starts ``[deadline, sequence, ...]`` and so compares in C), so a run is a function of its seed; a loop with nothing
ready and no timer raises ``SimQuiescent`` (nothing can ever happen again).

Speed (docs/verification.md, "Speed"): a simulated run schedules about as many callbacks as it
does anything else, so ``call_soon``, ``call_later`` and ``call_at`` are lean versions of
``BaseEventLoop``'s (and ``create_task``; no debug-mode checks: a ``SimLoop`` never runs in asyncio debug mode), their
handles are ``_Call`` lists built in C instead of ``asyncio.Handle`` objects built in Python
(what callers use of a handle, ``cancel`` above all, behaves the same), and ``_run_once`` runs a callback
inline and keeps iterating until the loop is stopped (what ``run_forever`` would do, one Python
call less per iteration). An item keeps the tuple its scheduling call collected, ``(callback,
*args)``, and its context's bound ``run``, so running it builds no argument tuple; a timer
taken off the heap runs alone, without the ready queue, when the heap's next is not due. The
simulator's own steps, which need no handle, are plain lists (``soon``, ``later``), and a step
that hands on as its last act may run the next callback at once where it would run next and
alone anyway (``call_last``). The order of callbacks is exactly asyncio's.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import heapq
import itertools
from collections.abc import Callable
from contextvars import copy_context
from typing import Any


class SimQuiescent(RuntimeError):
    """Nothing is ready and no timer is pending: the simulated world is stuck for good."""


#: loop iterations at one virtual instant after which a run is a livelock (``SimLivelock``)
LIVELOCK_ITERATIONS = 20_000


class SimLivelock(SimQuiescent):
    """Virtual time stood still for ``LIVELOCK_ITERATIONS`` loop iterations: something keeps
    rescheduling itself without ever waiting (a zero-time loop would spin forever)."""


class _Call(list):  # type: ignore[type-arg]
    """A scheduled callback: what ``call_soon`` returns and what ``call_at`` keeps in the heap.

    A list built in C (half the cost of an ``asyncio.Handle`` built in Python; a run schedules
    tens of thousands), laid out ``[deadline, sequence, callback, call, run, cancelled,
    scheduled, loop]``: a timer is its own heap item (lists compare by deadline, then by the
    unique sequence number, never further), a ready callback has deadline and sequence 0.
    ``call`` is ``(callback, *args)`` and ``run`` the context's bound ``run``, so the loop runs
    an item as ``run(*call)``: no argument tuple is built per callback (``call`` is the tuple
    the scheduling call collected its arguments into). It offers what callers use of a handle:
    ``cancel``, ``cancelled``, ``when``, ``get_context``.
    """

    __slots__ = ()

    def cancel(self) -> None:
        if not self[5]:
            self[5] = True
            if self[6]:  # a timer still in the heap: counted, the heap is cleaned when many are
                loop = self[7]
                loop._timer_cancelled_count += 1
                if loop._timer_cancelled_count > 100:
                    loop._clean_heap()
            self[2] = self[3] = None  # what asyncio's handles drop too

    def cancelled(self) -> bool:
        return bool(self[5])

    def when(self) -> float:
        return float(self[0])

    def get_context(self) -> contextvars.Context:
        return self[4].__self__  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        state = " cancelled" if self[5] else ""
        return f"<sim call {self[2]!r} at {self[0]}{state}>"


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
        self._heap: list[list[Any]] = []  # the timers, each its own heap item (a ``_Call`` or a plain list)
        #: the next timer's sequence number (1, 2, ...), and a timer's push onto the heap: both C
        #: calls, for the simulated network, which pushes its delivery timers itself (as ``later``)
        self.next_seq: Callable[[], int] = itertools.count(1).__next__
        self.push_timer: Callable[[list[Any]], None] = functools.partial(heapq.heappush, self._heap)
        self._ready_append = self._ready.append  # type: ignore[attr-defined]  # bound once: one per call_soon
        self.connect_hook: ConnectHook | None = None
        self.executor_hook: ExecutorHook | None = None

    # ------------------------------------------------------------------------------ clock
    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds

    def jump(self, seconds: float) -> None:
        """The clock jumps forward (every process was suspended: the ``clock`` fault): the timers
        that came due meanwhile run late, all at once, by deadline then scheduling order."""
        if seconds < 0:
            raise ValueError("a monotonic clock never goes back")
        self._now += seconds

    # ``call_at``, ``call_later``, ``call_soon``, ``soon`` and ``later`` take ``(callback,
    # *args)`` as one tuple (``call``), kept as the item's ``call``: the loop runs ``run(*call)``
    def call_at(self, when: float, *call: Any,  # type: ignore[override]
                context: contextvars.Context | None = None) -> asyncio.TimerHandle:
        """``call_at(when, callback, *args)``: a timer in the loop's own heap (the ``_Call`` is
        its own heap item): compared in C, and timers due at the same instant run in the order
        they were scheduled."""
        if self._closed:  # type: ignore[attr-defined]
            raise RuntimeError("Event loop is closed")
        timer = _Call((when, self.next_seq(), call[0], call, (context if context is not None else copy_context()).run,
                       False, True, self))
        self.push_timer(timer)
        return timer  # type: ignore[return-value]

    def call_later(self, delay: float, *call: Any,  # type: ignore[override]
                   context: contextvars.Context | None = None) -> asyncio.TimerHandle:
        """``call_later(delay, callback, *args)``."""
        if delay is None:
            raise TypeError("delay must not be None")
        if self._closed:  # type: ignore[attr-defined]
            raise RuntimeError("Event loop is closed")
        # call_at's body inline: one Python call less per timer
        timer = _Call((self._now + delay, self.next_seq(), call[0], call,
                       (context if context is not None else copy_context()).run, False, True, self))
        self.push_timer(timer)
        return timer  # type: ignore[return-value]

    def call_soon(self, *call: Any,  # type: ignore[override]
                  context: contextvars.Context | None = None) -> asyncio.Handle:
        """``call_soon(callback, *args)``."""
        if self._closed:  # type: ignore[attr-defined]
            raise RuntimeError("Event loop is closed")
        handle = _Call((0.0, 0, call[0], call, (context if context is not None else copy_context()).run, False, False,
                        self))
        self._ready_append(handle)
        return handle  # type: ignore[return-value]

    # The simulator's own scheduling (the network's deliveries, the model bookie's steps): no
    # handle is returned, so the item is a plain list (laid out as a ``_Call``; the loop only
    # indexes it), a third of the cost of building a ``_Call``.
    def soon(self, *call: Any) -> None:
        """``call_soon(callback, *args)`` without a handle (nothing can cancel it)."""
        if self._closed:  # type: ignore[attr-defined]
            raise RuntimeError("Event loop is closed")
        self._ready_append([0.0, 0, call[0], call, copy_context().run, False, False, self])

    def later(self, delay: float, *call: Any) -> None:
        """``call_later(delay, callback, *args)`` without a handle (nothing can cancel it)."""
        if self._closed:  # type: ignore[attr-defined]
            raise RuntimeError("Event loop is closed")
        self.push_timer([self._now + delay, self.next_seq(), call[0], call, copy_context().run, False, True, self])

    def call_last(self, callback: Callable[..., object], *args: Any) -> None:
        """``call_soon(callback, *args)`` as the LAST act of a callback the loop runs (a timer's
        or a ready callback's own body, never code it calls that goes on afterwards): when
        nothing else is ready, no timer is due and the loop is not stopping, the callback would
        run next and alone, before anything it schedules, so it runs now, in the caller's
        context (a private copy the loop made for it, as ``call_soon`` would make one); the
        order of every callback is the same. Otherwise it is scheduled."""
        heap = self._heap
        if self._ready or self._stopping or (heap and heap[0][0] < self._now + self._clock_resolution):  # type: ignore[attr-defined]
            self.soon(callback, *args)
            return
        try:
            callback(*args)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self.call_exception_handler({"message": f"Exception in callback {callback!r}", "exception": exc})

    def call_soon_threadsafe(self, *call: Any,  # type: ignore[override]
                             context: contextvars.Context | None = None) -> asyncio.Handle:
        """One thread: the same as ``call_soon`` (asyncio's would build an ``asyncio.Handle``)."""
        return self.call_soon(*call, context=context)

    def create_task(self, coro: Any, *, name: str | None = None,  # type: ignore[override]
                    context: contextvars.Context | None = None) -> asyncio.Task[Any]:
        if self._task_factory is not None:  # type: ignore[attr-defined]
            return super().create_task(coro, name=name, context=context)
        if self._closed:  # type: ignore[attr-defined]
            raise RuntimeError("Event loop is closed")
        return asyncio.Task(coro, loop=self, name=name, context=context)

    # --------------------------------------------------------------------- one iteration
    def _clean_heap(self) -> None:
        """Drop the cancelled timers from the heap once they are more than half of it (and more
        than 100): what ``BaseEventLoop._run_once`` does at its next iteration. The heap's order
        of live timers is a total order (deadline, then sequence), so when this runs changes
        nothing of the order they run in; ``cancel`` calls it, sparing each iteration the test."""
        sched = self._heap
        cancelled: int = self._timer_cancelled_count  # type: ignore[has-type]
        if cancelled * 2 > len(sched):
            live = []
            for item in sched:
                if item[5]:
                    item[6] = False
                else:
                    live.append(item)
            heapq.heapify(live)
            sched[:] = live
            self._timer_cancelled_count = 0

    def _run_once(self) -> None:
        """``BaseEventLoop._run_once`` without the selector, the debug timing and the slow
        paths a real loop needs, repeated until the loop is stopped: move the due timers to the
        ready queue (jumping the clock to the next one when nothing is ready), then run what was
        ready, in order (each callback as ``Handle._run`` would, inline)."""
        sched = self._heap
        ready = self._ready  # type: ignore[attr-defined]
        popleft = ready.popleft
        heappop = heapq.heappop
        resolution = self._clock_resolution
        seen, spins = self._now, 0
        while True:
            now = self._now
            if now != seen:
                seen, spins = now, 0
            else:
                spins += 1
                if spins > LIVELOCK_ITERATIONS:
                    raise SimLivelock(f"virtual time stood still at {now:.6f} for {spins} loop iterations: "
                                      "a livelock (something reschedules itself without waiting)")
            if not ready:
                # the earliest live timer (cancelled timers on top go; with callbacks ready, the
                # due ones are dropped below)
                while True:
                    if not sched:
                        if self._stopping:  # type: ignore[attr-defined]
                            return
                        raise SimQuiescent("no callback is ready and no timer is pending")
                    h = sched[0]
                    if not h[5]:
                        break
                    self._timer_cancelled_count -= 1
                    heappop(sched)[6] = False
                if not self._stopping:  # type: ignore[attr-defined]
                    heappop(sched)
                    h[6] = False
                    if h[0] > now:
                        self._now = now = h[0]
                    if not sched or sched[0][0] >= now + resolution:
                        # one timer due now (the usual case): run it as the batch of one it
                        # would be, without passing it through the ready queue
                        try:
                            h[4](*h[3])
                        except (SystemExit, KeyboardInterrupt):
                            raise
                        except BaseException as exc:
                            self.call_exception_handler({"message": f"Exception in callback {h[2]!r}",
                                                         "exception": exc, "handle": h})
                        h = None  # type: ignore[assignment]
                        if self._stopping:  # type: ignore[attr-defined]
                            return
                        continue
                    ready.append(h)  # due with others: the first of the batch the heap gives below
            end = now + resolution
            while sched and sched[0][0] < end:
                h = heappop(sched)
                h[6] = False
                if h[5]:
                    self._timer_cancelled_count -= 1
                else:
                    ready.append(h)
            for _ in range(len(ready)):
                h = popleft()
                if h[5]:
                    continue
                try:
                    h[4](*h[3])
                except (SystemExit, KeyboardInterrupt):
                    raise
                except BaseException as exc:
                    self.call_exception_handler({"message": f"Exception in callback {h[2]!r}",
                                                 "exception": exc, "handle": h})
            h = None  # type: ignore[assignment]  # break the cycle an exception would leave through the handle
            if self._stopping:  # type: ignore[attr-defined]
                return

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
