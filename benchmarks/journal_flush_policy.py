"""journalFlushWhenQueueEmpty=true (Vellum's default) against false (BookKeeper's default, and
requirement R4 of docs/correctness.md), side by side (docs/operations.md: a default that differs
from BookKeeper's needs a measurement).

Two single-bookie clusters, identical but for that key, both with Vellum's default group wait
(journalMaxGroupWaitMSec=2). Vellum's client writes 1 KiB entries, E=W=A=1, with 1 and with 64
entries in flight; ~1 s slices alternate in ABBA order; reported: the median per-pair ratio
(true over false) with p10..p90, the p99 add latencies and an A/A control (true against itself).

    ./run bench journal_flush_policy [--pairs 10] [--seconds 1.0] [--json]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).parent))
from bench_common import emit
from redis_compare import abba, bookie_pids, vellum_slice_factory

from vellum.client import BookKeeper
from vellum.testing.local_cluster import LocalCluster

CONF = {"journalMaxGroupWaitMSec": "2"}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    report: dict[str, Any] = {"pairs": args.pairs, "slice_seconds": args.seconds}
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        base = Path(tmp)
        with LocalCluster(base / "true", bookies=1, bookie_conf={**CONF, "journalFlushWhenQueueEmpty": "true"}) as on, \
                LocalCluster(base / "false", bookies=1, bookie_conf={**CONF, "journalFlushWhenQueueEmpty": "false"}) as off:
            async with BookKeeper(on.metadata_uri) as bk_on, BookKeeper(off.metadata_uri) as bk_off:
                for inflight in (1, 64):
                    a = await vellum_slice_factory(bk_on, 1, 1, 1, 1024, inflight)
                    a2 = await vellum_slice_factory(bk_on, 1, 1, 1, 1024, inflight)
                    b = await vellum_slice_factory(bk_off, 1, 1, 1, 1024, inflight)
                    if inflight == 64:
                        report["aa_control (true vs true, 64 in flight)"] = await abba(
                            a, a2, max(4, args.pairs // 2), args.seconds, bookie_pids(on), bookie_pids(on))
                    report[f"true vs false, {inflight} in flight"] = await abba(
                        a, b, args.pairs, args.seconds, bookie_pids(on), bookie_pids(off))
                    print(f"{inflight} in flight done", file=sys.stderr)
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--dir", default="data/bench")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    report = uvloop.run(main_async(args))
    emit(report, as_json=args.json)


if __name__ == "__main__":
    main()
