"""How fast a replication worker copies: a fixed bound, and yielding to foreground traffic.

Two independent brakes, both applied to every entry a worker copies or verifies:

- ``RateLimiter``: at most ``replicationRateByBytes`` bytes per second (BookKeeper's throttle;
  -1 = no bound). A fixed figure: right for one machine and one load, wrong for the others.
- ``YieldingWindow``: how many entries may be in flight, adapted to the delay the worker's own
  requests see (``replicationYieldToForeground``, ``replicationYieldDelayMs``). Background
  transfer after LEDBAT (RFC 6817): the worker learns its *base* delay (the lowest per-entry
  delay it has seen lately, i.e. the bookies idle) and keeps its *queuing* delay (current minus
  base) under a target. Alone on the cluster it grows its window until its own queue reaches the
  target, which already keeps the bookies busy: full speed. When foreground writers load the same
  bookies, every request waits behind theirs, the queuing delay passes the target, and the window
  halves, down to one entry in flight. One entry at a time still makes progress (a busy cluster
  is never left under-replicated for good), and it slows by itself as the bookies get slower.

The window is decided once per *round*: at least ``min_round_s`` and at least the current delay,
so a decision sees the effect of the last one. The current delay of a round is the median of its
samples. (Not the smallest, as LEDBAT's filter: on a CPU-bound cluster some requests always
find an idle bookie, so the smallest sample stays near the base under any load and the worker
never yields; measured with benchmarks/rereplication_bench.py.) The median counts the worker's
own queue too, so alone it settles where its own queuing delay is near the target: a window of
about (base + target) x its throughput, enough to keep the bookies busy. The base is the smallest of the per-bucket
minima over the last ``base_buckets`` buckets of ``bucket_s`` each, so it follows a cluster
that got slower for good (a bookie replaced by a slower disk) instead of holding on to one
lucky sample forever.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections import deque
from collections.abc import Callable


def _monotonic() -> float:
    # ``time.monotonic`` looked up at each call, not bound once as a default argument, so that a
    # simulated run's virtual clock (``sim/autorecovery.virtual_clock``) reaches it
    return time.monotonic()


class RateLimiter:
    """At most ``rate`` units per second on average (``rate <= 0``: unlimited)."""

    def __init__(self, rate: float, clock: Callable[[], float] = _monotonic) -> None:
        self.rate = rate
        self._clock = clock
        self._next = clock()

    async def acquire(self, units: int) -> None:
        if self.rate <= 0:
            return
        now = self._clock()
        start = max(now, self._next)
        self._next = start + units / self.rate
        if start > now:
            await asyncio.sleep(start - now)


class YieldingWindow:
    """Entries in flight, between 1 and ``limit`` (see the module docstring).

    ``async with window.slot():`` around one entry's work; ``done(delay_s)`` when the entry's
    requests have been answered, with the time they took (waiting for the slot excluded).
    ``target_s=None`` turns the adaptation off: a fixed window of ``limit``.
    """

    def __init__(self, limit: int, target_s: float | None, *, min_round_s: float = 0.05,
                 bucket_s: float = 10.0, base_buckets: int = 6,
                 on_round: Callable[[float, float], None] | None = None,
                 clock: Callable[[], float] = _monotonic) -> None:
        self.limit = max(1, limit)
        self.target_s = target_s
        self._clock = clock
        self._min_round_s = min_round_s
        #: told (window, queuing delay) after each round: metrics
        self._on_round = on_round or (lambda _w, _q: None)
        self._bucket_s = bucket_s
        self.window = float(self.limit) if target_s is None else 1.0
        self._in_flight = 0
        #: tasks waiting for a slot, first come first served; a woken one already holds its slot
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._round_start = clock()
        self._round: list[float] = []
        #: (bucket start, smallest delay seen in it), oldest first
        self._base: deque[tuple[float, float]] = deque(maxlen=max(1, base_buckets))

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def base_s(self) -> float:
        return min((m for _, m in self._base), default=math.inf)

    def slot(self) -> _Slot:
        return _Slot(self)

    async def _acquire(self) -> None:
        if not self._waiters and self._in_flight < int(self.window):
            self._in_flight += 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self._release()  # woken and cancelled at once: give the slot back
            elif fut in self._waiters:
                self._waiters.remove(fut)
            raise

    def _release(self) -> None:
        self._in_flight -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self._in_flight < int(self.window):
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                self._in_flight += 1

    def done(self, delay_s: float) -> None:
        """One entry's requests took ``delay_s``: learn from it; maybe decide a round."""
        if self.target_s is None:
            return
        now = self._clock()
        if not self._base or now - self._base[-1][0] >= self._bucket_s:
            self._base.append((now, delay_s))
        elif delay_s < self._base[-1][1]:
            self._base[-1] = (self._base[-1][0], delay_s)
        self._round.append(delay_s)
        elapsed = now - self._round_start
        if elapsed < self._min_round_s:
            return
        current = statistics.median(self._round)
        if elapsed < current:
            return
        queuing = current - self.base_s
        if queuing > self.target_s:
            self.window = max(1.0, self.window / 2)
        else:
            self.window = min(float(self.limit), self.window + max(1.0, self.window / 4))
            self._wake()
        self._on_round(self.window, queuing)
        self._round_start = now
        self._round = []


class _Slot:
    def __init__(self, window: YieldingWindow) -> None:
        self._w = window

    async def __aenter__(self) -> None:
        await self._w._acquire()

    async def __aexit__(self, *exc: object) -> None:
        self._w._release()
