"""``vellum bench``: BookKeeper's BenchThroughputLatency analogue.

Writes ``entry_size``-byte entries to ``ledgers`` ledgers (round robin) with at most
``inflight`` adds outstanding, either as fast as possible (closed loop) or at a target rate
(open loop: latency counts from the *scheduled* send time, so a stall is not hidden by the
sender waiting — no coordinated omission). Prints progress every second and, at the end,
throughput (entries/s, MB/s) and latency percentiles (p50/p95/p99/p99.9/max).
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from vellum.client import BookKeeper
from vellum.config import ClientConfig


@dataclass(frozen=True)
class BenchOptions:
    metadata_uri: str | None = None
    ensemble_size: int = 1
    write_quorum_size: int = 1
    ack_quorum_size: int = 1
    entry_size: int = 1024
    ledgers: int = 1
    inflight: int = 64
    rate: float = 0.0  # entries/s; 0 = as fast as possible
    duration_s: float = 10.0
    max_entries: int = 0  # 0 = no limit
    password: bytes = field(default=b"", repr=False)


@dataclass
class BenchResult:
    entries: int
    bytes: int
    elapsed_s: float
    errors: int
    latency_ms: dict[str, float] = field(default_factory=dict)
    #: the first failed add, as "ErrorType: message" ("" when every add succeeded)
    first_error: str = ""

    @property
    def entries_per_s(self) -> float:
        return self.entries / self.elapsed_s if self.elapsed_s else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.bytes / self.elapsed_s / 1e6 if self.elapsed_s else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["entries_per_s"] = self.entries_per_s
        d["mb_per_s"] = self.mb_per_s
        return d


def percentiles(samples: list[float]) -> dict[str, float]:
    if not samples:
        return {k: 0.0 for k in ("p50", "p95", "p99", "p99.9", "max", "mean")}
    s = sorted(samples)
    n = len(s)

    def at(p: float) -> float:
        return s[min(n - 1, int(p * n))]

    return {
        "p50": at(0.50) * 1e3,
        "p95": at(0.95) * 1e3,
        "p99": at(0.99) * 1e3,
        "p99.9": at(0.999) * 1e3,
        "max": s[-1] * 1e3,
        "mean": sum(s) / n * 1e3,
    }


async def run_bench(
    opts: BenchOptions,
    *,
    progress: Callable[[float, int, float], None] | None = None,
    bk: BookKeeper | None = None,
    config: ClientConfig | None = None,
) -> BenchResult:
    """Run the benchmark; ``progress(elapsed_s, entries, entries_per_s_last_second)``. Without
    ``bk`` it opens its own client with ``config`` (TLS, authentication, timeouts)."""
    own = bk is None
    client = bk or BookKeeper(opts.metadata_uri, config=config)
    if own:
        await client.start()
    try:
        handles = [
            await client.create_ledger(
                ensemble_size=opts.ensemble_size,
                write_quorum_size=opts.write_quorum_size,
                ack_quorum_size=opts.ack_quorum_size,
                password=opts.password,
            )
            for _ in range(opts.ledgers)
        ]
        payload = os.urandom(opts.entry_size)
        latencies: list[float] = []
        done_count = 0
        errors = 0
        first_error = ""
        sem = asyncio.Semaphore(opts.inflight)
        t0 = time.perf_counter()
        deadline = t0 + opts.duration_s
        last_report = t0
        last_count = 0
        sent = 0

        def on_done(fut: asyncio.Future[int], started: float) -> None:
            nonlocal done_count, errors, first_error
            sem.release()
            if fut.cancelled() or fut.exception() is not None:
                errors += 1
                if not first_error:
                    exc = fut.exception() if not fut.cancelled() else None
                    first_error = f"{type(exc).__name__}: {exc}" if exc is not None else "cancelled"
                return
            latencies.append(time.perf_counter() - started)
            done_count += 1

        interval = 1.0 / opts.rate if opts.rate > 0 else 0.0
        while True:
            now = time.perf_counter()
            if now >= deadline or (opts.max_entries and sent >= opts.max_entries):
                break
            if interval:
                scheduled = t0 + sent * interval
                if scheduled > now:
                    await asyncio.sleep(scheduled - now)
            else:
                scheduled = now
            await sem.acquire()
            lh = handles[sent % len(handles)]
            fut = lh.append_async(payload)
            fut.add_done_callback(functools.partial(on_done, started=scheduled))
            sent += 1
            if progress is not None and now - last_report >= 1.0:
                progress(now - t0, done_count, (done_count - last_count) / (now - last_report))
                last_report, last_count = now, done_count
            if sent % 256 == 0:
                await asyncio.sleep(0)  # let completions run
        for _ in range(opts.inflight):
            await sem.acquire()
        elapsed = time.perf_counter() - t0
        for lh in handles:
            await lh.close()
        return BenchResult(done_count, done_count * opts.entry_size, elapsed, errors, percentiles(latencies),
                           first_error)
    finally:
        if own:
            await client.close()
