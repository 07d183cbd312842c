"""Re-replication speed and its cost to foreground writes (issue 13).

Five bookies with AutoRecovery in them (autoRecoveryDaemonEnabled=true, lostBookieRecoveryDelay=0,
Pulsar's rereplicationEntryBatchSize=100). Steps:
1. fill: closed ledgers E3 W2 A2 of ``--entry-kib`` entries, ``--fill-mb`` in all;
2. foreground baseline: a writer (64 in flight, same entries, E3 W2 A2) in ``--seconds`` slices;
3. a bookie is killed and its disks deleted; the auditor marks its ledgers, the workers copy;
   the foreground writer keeps running in slices until no ledger names the bookie;
4. foreground again after healing.
Reported: the re-replication rate (bytes written to replacement bookies per second, from the
bookies' replication_worker_NUM_BYTES_WRITTEN counters, from the first copied byte until no
ledger names the lost bookie; detection, i.e. the lost bookie's session expiry, is reported
apart as heal_seconds) against the
foreground write rate before (target >= 0.5), and the foreground rate during re-replication
against the mean of the rates before and after (target >= 0.7), each with p10..p90 of the slices.

    ./run bench rereplication_bench [--fill-mb 200] [--entry-kib 16] [--seconds 1.0] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import uvloop

from vellum.client import BookKeeper
from vellum.meta import open_metadata_store
from vellum.testing.local_cluster import LocalCluster

CONF = {"autoRecoveryDaemonEnabled": "true", "lostBookieRecoveryDelay": "0", "rereplicationEntryBatchSize": "100",
        "openLedgerRereplicationGracePeriod": "1000", "journalMaxGroupWaitMSec": "2", "flushInterval": "10000"}


def _pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p * (len(s) - 1))))] if s else 0.0


def bytes_written(cluster: LocalCluster, skip: int) -> float:
    total = 0.0
    for i in range(len(cluster.bookie_ids)):
        if i == skip:
            continue
        with urllib.request.urlopen(cluster.http_url(i) + "/metrics", timeout=10) as resp:
            text = resp.read().decode()
        m = re.search(r"^replication_worker_NUM_BYTES_WRITTEN_total (\S+)$", text, re.M)
        total += float(m.group(1)) if m else 0.0
    return total


def ledgers_on(uri: str, bookie: str) -> int:
    with open_metadata_store(uri) as store:
        n = 0
        for lid in store.ledgers.iter_ledger_ids():
            md = store.ledgers.read_ledger(lid).value
            n += any(bookie in map(str, e) for e in md.ensembles.values())
        return n


async def fill(bk: BookKeeper, total_bytes: int, size: int) -> None:
    payload = os.urandom(size)
    per_ledger = max(1, (8 << 20) // size)
    written = 0
    while written < total_bytes:
        lh = await bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
        await slice_count(lh, payload, per_ledger)
        await lh.close()
        written += per_ledger * size


async def slice_count(lh: Any, payload: bytes, count: int) -> None:
    """Append ``count`` entries, 64 in flight."""
    sem = asyncio.Semaphore(64)

    def on_done(_f: Any) -> None:
        sem.release()

    for _ in range(count):
        await sem.acquire()
        lh.append_async(payload).add_done_callback(on_done)
    for _ in range(64):
        await sem.acquire()


async def slice_rate(lh: Any, payload: bytes, seconds: float) -> float:
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


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    size = args.entry_kib * 1024
    report: dict[str, Any] = {"fill_mb": args.fill_mb, "entry_kib": args.entry_kib, "slice_seconds": args.seconds}
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as tmp, \
            LocalCluster(Path(tmp) / "c", bookies=5, bookie_conf=CONF) as cluster:
        uri = cluster.metadata_uri
        async with BookKeeper(uri) as bk:
            await fill(bk, args.fill_mb << 20, size)
            print("filled", file=sys.stderr)
            victim = 4
            victim_id = cluster.bookie_ids[victim]
            fg = await bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
            while victim_id in map(str, fg.metadata.ensembles[0]):  # the foreground writer avoids the victim
                await fg.close()
                fg = await bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
            payload = os.urandom(size)
            before = [await slice_rate(fg, payload, args.seconds) for _ in range(args.slices)]
            on_victim = ledgers_on(uri, victim_id)
            b0 = bytes_written(cluster, victim)
            cluster.kill(victim)
            shutil.rmtree(cluster.ledger_dir(victim))
            shutil.rmtree(cluster.journal_dir(victim))
            t0 = time.monotonic()
            copy_start: float | None = None
            during: list[float] = []
            while ledgers_on(uri, victim_id) > 0:
                if copy_start is None:
                    # The lost bookie's registration lasts until its session expires: copying
                    # (and the foreground slices that count as "during") starts after that.
                    if bytes_written(cluster, victim) > b0:
                        copy_start = time.monotonic()
                    else:
                        await asyncio.sleep(0.1)
                        continue
                during.append(await slice_rate(fg, payload, args.seconds))
                if time.monotonic() - t0 > args.timeout:
                    raise SystemExit(f"not healed within {args.timeout}s")
            heal_s = time.monotonic() - t0
            copy_s = time.monotonic() - (copy_start if copy_start is not None else t0)
            copied = bytes_written(cluster, victim) - b0
            after = [await slice_rate(fg, payload, args.seconds) for _ in range(args.slices)]
            await fg.close()
    base = statistics.mean(before + after)
    report.update({
        "ledgers_on_lost_bookie": on_victim,
        "heal_seconds": heal_s,
        "copy_seconds": copy_s,
        "bytes_rereplicated_mb": copied / 1e6,
        "rereplication_mb_per_s": copied / copy_s / 1e6,
        "foreground_before_mb_per_s": statistics.median(before) / 1e6,
        "foreground_during_mb_per_s": statistics.median(during) / 1e6 if during else 0.0,
        "foreground_after_mb_per_s": statistics.median(after) / 1e6,
        "rereplication_over_write_rate": copied / copy_s / statistics.median(before),
        "foreground_during_over_baseline": statistics.median(during) / base if during else 0.0,
        "during_p10_p90": [_pct(during, 0.1) / base, _pct(during, 0.9) / base] if during else [],
        "baseline_aa_before_over_after": statistics.median(before) / statistics.median(after),
        "slices_during": len(during),
    })
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fill-mb", type=int, default=200)
    ap.add_argument("--entry-kib", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--slices", type=int, default=6)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--dir", default="data/bench")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    report = uvloop.run(main_async(args))
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for key, value in report.items():
        print(f"{key:34s} {value:,.3f}" if isinstance(value, float) else f"{key:34s} {value}")


if __name__ == "__main__":
    main()
