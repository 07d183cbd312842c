"""Re-replication speed and its cost to foreground writes (docs/autorecovery.md), side by side in slices.

Five bookies with AutoRecovery inside (autoRecoveryDaemonEnabled=true, lostBookieRecoveryDelay=0,
Pulsar's rereplicationEntryBatchSize=100). The cluster is filled with closed ledgers E3 W2 A2
(``--entry-kib`` entries, ``--fill-mb`` in all), re-replication is switched off, one bookie is
killed and its disks deleted, and the auditor marks its ledgers: a backlog to copy. Then slices
of ``--seconds`` alternate in ABBA order, switching re-replication on and off with the global
switch (as `vellum shell autorecovery enable|disable`; a ledger being copied finishes first):

- phase 1, cost (first, while the backlog is largest): see below;
- phase 2, speed: W = the foreground writer alone (64 in flight, same entries, E3 W2 A2; switch
  off) against C = copying alone (switch on, no writer); C's rate is the bytes written to
  replacement bookies (the bookies' replication_worker_NUM_BYTES_WRITTEN counters). Target:
  C / W >= 0.5.
- cost: W against F = the foreground writer while copying (switch on). Target: F / W >= 0.7.
Both report the median of per-pair ratios with p10..p90, and an A/A control (W against W).

    ./run bench rereplication_bench [--fill-mb 1000] [--entry-kib 16] [--pairs 6] [--seconds 1.0]
                                    [--rate-mb N] [--no-yield | --yield-delay-ms N] [--json]

``--no-yield`` sets replicationYieldToForeground=false (a fixed window of
rereplicationEntryBatchSize entries: "unthrottled" when --rate-mb is 0 too); the default run
measures Vellum's defaults (the worker yields to foreground traffic).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).parent))
from bench_common import emit, pct

from vellum.client import BookKeeper
from vellum.meta import MetadataStore
from vellum.testing.local_cluster import LocalCluster

CONF = {"autoRecoveryDaemonEnabled": "true", "lostBookieRecoveryDelay": "0", "rereplicationEntryBatchSize": "100",
        "openLedgerRereplicationGracePeriod": "1000", "journalMaxGroupWaitMSec": "2", "flushInterval": "10000"}
Slice = Callable[[float], Awaitable[float]]


def scrape(cluster: LocalCluster, skip: int, *metrics: str) -> list[list[float | None]]:
    """The values of ``metrics`` (full sample names, labels included) on every bookie but
    ``skip``: one row per bookie, None where a bookie does not export one."""
    rows = []
    for i in range(len(cluster.bookie_ids)):
        if i == skip:
            continue
        with urllib.request.urlopen(cluster.http_url(i) + "/metrics", timeout=10) as resp:
            text = resp.read().decode()
        found = (re.search(rf"^{re.escape(name)} (\S+)$", text, re.M) for name in metrics)
        rows.append([float(m.group(1)) if m else None for m in found])
    return rows


def bytes_written(cluster: LocalCluster, skip: int) -> float:
    return sum(v or 0.0 for (v,) in scrape(cluster, skip, "replication_worker_NUM_BYTES_WRITTEN_total"))


def worker_windows(cluster: LocalCluster, skip: int) -> list[tuple[float, float]]:
    """(entries in flight allowed, queuing delay in ms) of each bookie's replication worker."""
    rows = scrape(cluster, skip, 'replication_worker_ENTRIES_IN_FLIGHT_ALLOWED{role="worker"}',
                  'replication_worker_QUEUING_DELAY_SECONDS{role="worker"}')
    return [(-1.0 if w is None else w, -1.0 if q is None else round(q * 1000, 1)) for w, q in rows]


async def append_n(lh: Any, payload: bytes, count: int) -> None:
    sem = asyncio.Semaphore(64)

    def on_done(_f: Any) -> None:
        sem.release()

    for _ in range(count):
        await sem.acquire()
        lh.append_async(payload).add_done_callback(on_done)
    for _ in range(64):
        await sem.acquire()


async def write_for(lh: Any, payload: bytes, seconds: float) -> float:
    """Bytes per second acknowledged by one writer, 64 in flight, for ``seconds``."""
    sem = asyncio.Semaphore(64)
    done = 0

    def on_done(_f: Any) -> None:
        nonlocal done
        sem.release()
        done += 1

    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        await sem.acquire()
        lh.append_async(payload).add_done_callback(on_done)
    for _ in range(64):
        await sem.acquire()
    return done * len(payload) / (time.perf_counter() - t0)


async def abba(a: Slice, b: Slice, pairs: int, seconds: float) -> dict[str, Any]:
    ratios, ra, rb = [], [], []
    for i in range(pairs):
        order = [("a", a), ("b", b)] if i % 2 == 0 else [("b", b), ("a", a)]
        rates = {}
        for name, fn in order:
            rates[name] = await fn(seconds)
        ra.append(rates["a"])
        rb.append(rates["b"])
        ratios.append(rates["a"] / rates["b"] if rates["b"] else 0.0)
    return {"a_median_mb_per_s": statistics.median(ra) / 1e6, "b_median_mb_per_s": statistics.median(rb) / 1e6,
            "ratio_median": statistics.median(ratios), "ratio_p10": pct(ratios, 0.1),
            "ratio_p90": pct(ratios, 0.9)}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    size = args.entry_kib * 1024
    payload = os.urandom(size)
    report: dict[str, Any] = {"fill_mb": args.fill_mb, "entry_kib": args.entry_kib, "pairs": args.pairs,
                              "slice_seconds": args.seconds}
    conf = dict(CONF)
    if args.rate_mb > 0:  # replicationRateByBytes, per worker (one worker per bookie)
        conf["replicationRateByBytes"] = str(int(args.rate_mb * 1e6))
        report["replicationRateByBytes_per_worker"] = conf["replicationRateByBytes"]
    if args.no_yield:
        conf["replicationYieldToForeground"] = "false"
    elif args.yield_delay_ms:
        conf["replicationYieldDelayMs"] = str(args.yield_delay_ms)
    report["replicationYieldToForeground"] = not args.no_yield
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as tmp, \
            LocalCluster(Path(tmp) / "c", bookies=5, bookie_conf=conf) as cluster:
        uri = cluster.metadata_uri
        victim = 4
        victim_id = cluster.bookie_ids[victim]
        async with BookKeeper(uri) as bk:
            store: MetadataStore = bk.store
            urm = store.underreplication
            per_ledger = max(1, (8 << 20) // size)
            for _ in range(max(1, (args.fill_mb << 20) // (per_ledger * size))):
                lh = await bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
                await append_n(lh, payload, per_ledger)
                await lh.close()
            print("filled", file=sys.stderr)
            fg = await bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
            while victim_id in map(str, fg.metadata.ensembles[0]):  # the foreground writer avoids the victim
                await fg.close()
                fg = await bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
            await asyncio.to_thread(urm.disable_replication)
            cluster.kill(victim)
            shutil.rmtree(cluster.ledger_dir(victim))
            shutil.rmtree(cluster.journal_dir(victim))
            t0 = time.monotonic()
            while not await asyncio.to_thread(lambda: next(iter(urm.list_under_replicated()), None)):
                await asyncio.sleep(0.2)
            await asyncio.sleep(2.0)  # the auditor's marking pass completes
            report["detection_seconds"] = time.monotonic() - t0
            report["marked_ledgers"] = await asyncio.to_thread(lambda: sum(1 for _ in urm.list_under_replicated()))

            async def switch(on: bool) -> None:
                await asyncio.to_thread(urm.enable_replication if on else urm.disable_replication)

            async def w_slice(seconds: float) -> float:
                await switch(False)
                return await write_for(fg, payload, seconds)

            async def c_slice(seconds: float) -> float:
                await switch(True)
                b0 = await asyncio.to_thread(bytes_written, cluster, victim)
                t = time.perf_counter()
                await asyncio.sleep(seconds)
                b1 = await asyncio.to_thread(bytes_written, cluster, victim)
                return (b1 - b0) / (time.perf_counter() - t)

            copied_during_f: list[float] = []
            windows_during_f: list[list[tuple[float, float]]] = []

            async def f_slice(seconds: float) -> float:
                await switch(True)
                b0 = await asyncio.to_thread(bytes_written, cluster, victim)
                t = time.perf_counter()
                rate = await write_for(fg, payload, seconds)
                b1 = await asyncio.to_thread(bytes_written, cluster, victim)
                copied_during_f.append((b1 - b0) / (time.perf_counter() - t))
                windows_during_f.append(await asyncio.to_thread(worker_windows, cluster, victim))
                return rate

            report["aa_control (W vs W)"] = await abba(w_slice, w_slice, max(2, args.pairs // 2), args.seconds)
            report["cost: writing while copying (F) vs writing alone (W)"] = await abba(f_slice, w_slice, args.pairs,
                                                                                       args.seconds)
            report["speed: copying alone (C) vs writing alone (W)"] = await abba(c_slice, w_slice, args.pairs,
                                                                                 args.seconds)
            # F slices count only while there was something to copy: shown, so a backlog that ran
            # out (a too small --fill-mb) is seen.
            report["copy_mb_per_s_during_F_slices"] = [round(c / 1e6, 1) for c in copied_during_f]
            # each worker's (window, queuing delay ms) at the end of each F slice, then while idle
            report["worker_window_and_queuing_ms_after_F_slices"] = windows_during_f
            await switch(True)
            report["backlog_left_ledgers"] = await asyncio.to_thread(
                lambda: sum(1 for _ in urm.list_under_replicated()))
            await fg.close()
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fill-mb", type=int, default=600)
    ap.add_argument("--entry-kib", type=int, default=16)
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--rate-mb", type=float, default=0.0,
                    help="throttle each worker (replicationRateByBytes) to this many MB/s; 0 = no bound")
    ap.add_argument("--no-yield", action="store_true",
                    help="replicationYieldToForeground=false: workers never yield to foreground traffic")
    ap.add_argument("--yield-delay-ms", type=int, default=0, help="replicationYieldDelayMs (0: the default)")
    ap.add_argument("--dir", default="data/bench")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    report = uvloop.run(main_async(args))
    emit(report, as_json=args.json)


if __name__ == "__main__":
    main()
