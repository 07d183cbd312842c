"""Benchmark of the deterministic simulator: seeds per minute for two workload sizes.

Prints, per workload, client operations per seed and seeds per minute by wall clock and by the
CPU time of this process (what one core does; on a shared machine the wall clock is slower).
No assertions: a number to watch, not a test (docs/verification.md, "Speed").
Run: ``.venv/bin/python benchmarks/sim_seeds.py [--seeds N] [--start S]``.
"""

from __future__ import annotations

import argparse

from vellum.sim.campaign import run_campaign
from vellum.sim.runner import SimOptions
from vellum.sim.workload import WorkloadShape

WORKLOADS = {
    "default (3 ledgers of 20-60 entries)": SimOptions(),
    "large (6 ledgers of 50-110 entries)": SimOptions(shape=WorkloadShape(ledgers=6, entries=(50, 110),
                                                                           reader_polls=60)),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--start", type=int, default=100_000)
    args = parser.parse_args()
    for label, options in WORKLOADS.items():
        r = run_campaign(range(args.start, args.start + args.seeds), options)
        print(f"{label:<40} {r.operations / r.seeds:>6.0f} ops/seed   "
              f"{r.seeds_per_s * 60:>6.0f} seeds per min wall   {r.seeds_per_cpu_s * 60:>6.0f} seeds per min CPU   "
              f"violations {len(r.violations)}")


if __name__ == "__main__":
    main()
