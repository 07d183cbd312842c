"""Where one entry's time goes on the write path: CPU microseconds per appended entry in the
client process and in the bookies (docs/benchmarks.md, "Spark write path: per-entry cost").

Starts a LocalCluster (3 bookies, loopback, the journal fsynced as in production) and one
client in this process, creates a ledger (``--ensemble``, the client's default 3,2,2) per round
and appends ``--entries`` entries of ``--size`` random bytes with at most ``--window`` in
flight, the way the Spark sink's tasks append (one ``append_async`` per entry, the oldest
awaited when the window is full), or with ``--batch N`` in ``append_batch_async`` slices of N
entries (one future per slice, the oldest slice awaited when the window is full: how the sink
appends since it has that call); ``--as-sink`` sets the garbage collector as the sink's tasks
set it while they write (the heap frozen, young collections spaced out). Reported per round: entries/s, the client's CPU (this
process, every thread) and the bookies' CPU (from /proc, user + system, all three together)
per entry, the wall time the garbage collector ran in this process per entry, and the
bookies' journal fsyncs per MiB of entries they journaled (group commit). The first
round (connections, caches) is not reported. CPU per entry moves less than throughput with the
load of a shared machine; compare two checkouts by alternating ``PYTHONPATH=<checkout>/src``
runs (before / after / after / before).

    ./run bench append_cpu [--entries 20000] [--size 1024] [--window 1000] [--batch 0] [--as-sink] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from bench_common import append_in_slices, cpu_seconds, emit


def _journal_fsyncs(metrics_urls: list[str]) -> float:
    """Journal fsyncs of the bookies so far (``bookie_journal_JOURNAL_SYNC``, summed)."""
    import urllib.request

    total = 0.0
    for url in metrics_urls:
        with urllib.request.urlopen(url, timeout=10) as reply:
            for line in reply.read().decode().splitlines():
                if line.startswith("bookie_journal_JOURNAL_SYNC_count{"):
                    total += float(line.rsplit(" ", 1)[1])
    return total


class _GcClock:
    """Wall time spent in the garbage collector of this process (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--entries", type=int, default=20_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--window", type=int, default=1000, help="appends in flight at most (the sink's maxInFlight)")
    ap.add_argument("--batch", type=int, default=0,
                    help="append in append_batch_async slices of this many entries (0: one append_async each)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ensemble", default="3,2,2", help="ensembleSize,writeQuorumSize,ackQuorumSize")
    ap.add_argument("--spark-heap", action="store_true",
                    help="import what a Spark Python worker running the sink holds (pyspark, pyarrow, the "
                         "sink) first: the garbage collector's full passes then walk a worker-sized heap")
    ap.add_argument("--as-sink", action="store_true",
                    help="append with the garbage collector set as the Spark sink's tasks set it while they write "
                         "(vellum.spark.writer: heap_frozen, and young_collections_spaced where the checkout has it)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    e, w, a = (int(x) for x in args.ensemble.split(","))

    from vellum.client.blocking import BookKeeper
    from vellum.config import ClientConfig, build_config
    from vellum.testing.local_cluster import LocalCluster

    if args.spark_heap:
        import pyspark.worker  # noqa: F401

        import vellum.spark.writer  # noqa: F401
    payloads = [os.urandom(args.size) for _ in range(args.entries)]
    sink_gc = contextlib.ExitStack()  # entered once the client exists, as a task finds it
    clock = _GcClock()
    gc.callbacks.append(clock)

    async def append_all(handle: Any) -> None:
        if args.batch > 0:
            await append_batches(handle)
            return
        window: collections.deque[asyncio.Future[int]] = collections.deque()
        for payload in payloads:
            window.append(handle.append_async(payload))
            if len(window) >= args.window:
                await window.popleft()
        while window:
            await window.popleft()

    async def append_batches(handle: Any) -> None:
        await append_in_slices(handle, payloads, args.batch, args.window)

    rounds: list[dict[str, float]] = []
    base = Path(tempfile.mkdtemp(prefix="vellum-append-cpu-"))
    try:
        with LocalCluster(base / "cluster", bookies=3) as cluster:
            bk = BookKeeper(config=build_config(ClientConfig, {"metadataServiceUri": cluster.metadata_uri},
                                                source="append_cpu"))
            pids = [cluster.pid(i) for i in range(3)]
            urls = [cluster.metrics_url(i) for i in range(3)]
            if args.as_sink:
                from vellum.spark import writer as sink

                sink_gc.enter_context(sink.heap_frozen())
                spaced = getattr(sink, "young_collections_spaced", None)
                if spaced is not None:
                    sink_gc.enter_context(spaced())
            try:
                for r in range(args.rounds + 1):
                    handle = bk.create_ledger(ensemble_size=e, write_quorum_size=w, ack_quorum_size=a)
                    bookies0 = sum(cpu_seconds(p) for p in pids)
                    fsyncs0 = _journal_fsyncs(urls)
                    clock.seconds = 0.0
                    wall0, cpu0 = time.perf_counter(), time.process_time()
                    bk.run(append_all(handle.aio))
                    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
                    bookies = sum(cpu_seconds(p) for p in pids) - bookies0
                    fsyncs = _journal_fsyncs(urls) - fsyncs0
                    handle.close()
                    if r == 0:
                        continue  # warm-up
                    n = args.entries
                    rounds.append({"entries_per_s": n / wall, "client_us_per_entry": cpu / n * 1e6,
                                   "bookies_us_per_entry": bookies / n * 1e6,
                                   "bookie_us_per_copy": bookies / (n * w) * 1e6,
                                   "client_gc_us_per_entry": clock.seconds / n * 1e6,
                                   "journal_fsyncs_per_mib": fsyncs / (n * w * args.size / 2**20)})
            finally:
                sink_gc.close()
                bk.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    report: dict[str, Any] = {"entries": args.entries, "size": args.size, "window": args.window, "batch": args.batch,
                              "ensemble": args.ensemble, "as_sink": args.as_sink,
                              "objects_tracked": len(gc.get_objects()),
                              "load": round(os.getloadavg()[0], 1)}
    for i, r in enumerate(rounds, 1):
        report[f"round {i}"] = {k: round(v, 1) for k, v in r.items()}
    report["median"] = {k: round(statistics.median(r[k] for r in rounds), 1) for k in rounds[0]}
    emit(report, as_json=args.json)


if __name__ == "__main__":
    main()
