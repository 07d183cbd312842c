"""Storage engine benchmark (docs/benchmarks.md), side by side in one process and one run.

(a) baseline: a plain Python loop writing the same bytes with one fdatasync per batch of
    ``--inflight`` entries: the disk's group-commit limit as Python sees it;
(b) the bookie add path: journal (group commit, fsync) + DbLedgerStorage write cache, each add
    acknowledged after the fsync that covers it, ``--inflight`` adds in flight.
Slices of (a) and (b) alternate in ABBA order (see docs/benchmarks.md, "How we measure") and the
median of the per-pair ratios is reported with p10..p90, after an A/A control of (a) against
itself. Also: flush throughput (write cache -> entry log + RocksDB index), sequential and
random read throughput.

    ./run bench storage_bench [--seconds 1.0] [--pairs 10] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_bookie import AddPath, plain_slice
from bench_common import pct

from vellum.format.entry import DigestManager, DigestType, master_key
from vellum.storage.ledger_storage import LedgerStorage


def abba(a: Callable[[], tuple[int, float]], b: Callable[[], tuple[int, float]], pairs: int) -> dict:
    """Alternate A and B slices (ABBA ...) and summarise B/A ratios of entries per second."""
    ratios, a_rates, b_rates = [], [], []
    for i in range(pairs):
        order = (a, b) if i % 2 == 0 else (b, a)
        results = {}
        for fn in order:
            n, el = fn()
            results[fn] = n / el
        ra, rb = results[a], results[b]
        a_rates.append(ra)
        b_rates.append(rb)
        ratios.append(rb / ra)
    return {
        "a_median_per_s": statistics.median(a_rates),
        "b_median_per_s": statistics.median(b_rates),
        "ratio_median": statistics.median(ratios),
        "ratio_p10": pct(ratios, 0.1),
        "ratio_p90": pct(ratios, 0.9),
    }


def flush_and_read(base: Path, entry_size: int, entries: int) -> dict:
    """Flush throughput into entry logs + index, then sequential and random reads."""
    storage = LedgerStorage(
        base / "flushdir",
        None,
        log_size_limit=1 << 30,
        write_cache_max_bytes=2 * (entries * (entry_size + 64) + (1 << 20)),
        read_cache_max_bytes=16 << 20,
        read_ahead_batch_size=100,
        max_throttle_time_ms=10000,
    )
    try:
        storage.set_master_key(7, master_key(b""))
        dm = DigestManager(7, DigestType.CRC32C, b"")
        payload = os.urandom(entry_size)
        for eid in range(entries):
            storage.add_entry(dm.compute(eid, eid - 1, 0, payload))
        t0 = time.perf_counter()
        storage.flush()
        flush_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        for eid in range(entries):
            storage.get_entry(7, eid)
        seq_s = time.perf_counter() - t0
        order = list(range(entries))
        random.Random(1).shuffle(order)
        t0 = time.perf_counter()
        for eid in order:
            storage.get_entry(7, eid)
        rnd_s = time.perf_counter() - t0
    finally:
        storage.close()
    mb = entries * entry_size / 1e6
    return {
        "flush_mb_per_s": mb / flush_s,
        "seq_read_entries_per_s": entries / seq_s,
        "seq_read_mb_per_s": mb / seq_s,
        "random_read_entries_per_s": entries / rnd_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=1.0, help="length of one slice")
    ap.add_argument("--pairs", type=int, default=10, help="ABBA pairs per comparison")
    ap.add_argument("--inflight", type=int, default=64)
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir under ./data)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    root = Path(args.dir or "data")
    root.mkdir(parents=True, exist_ok=True)
    report: dict = {"inflight": args.inflight, "slice_seconds": args.seconds, "pairs": args.pairs}
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        base = Path(tmp)
        for size in (1024, 65536):
            label = f"{size // 1024}KiB"
            a = lambda s=size: plain_slice(base / "plain.bin", s, args.inflight, args.seconds)  # noqa: E731
            a2 = lambda s=size: plain_slice(base / "plain2.bin", s, args.inflight, args.seconds)  # noqa: E731
            report[f"aa_control_{label}"] = abba(a, a2, max(4, args.pairs // 2))
            path = AddPath(base / f"bookie-{label}", size, args.inflight, {"journal_flush_when_queue_empty": True})
            try:
                r = abba(a, lambda p=path: p.slice(args.seconds), args.pairs)
            finally:
                path.close()
            r["b_median_mb_per_s"] = r["b_median_per_s"] * size / 1e6
            r["a_median_mb_per_s"] = r["a_median_per_s"] * size / 1e6
            report[f"add_path_vs_plain_{label}"] = r
            print(f"[{label}] done", file=sys.stderr)
        report["flush_and_read_1KiB"] = flush_and_read(base, 1024, 100_000)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for key, value in report.items():
        if isinstance(value, dict):
            print(key)
            for k, v in value.items():
                print(f"  {k:28s} {v:,.3f}" if isinstance(v, float) else f"  {k:28s} {v}")
        else:
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
