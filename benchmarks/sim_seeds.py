"""Benchmark of the deterministic simulator: seeds per minute for three workload sizes.

Prints, per workload, client operations per seed and seeds per minute by wall clock and by the
CPU time of this process (what one core does; on a shared machine the wall clock is slower).
No assertions: a number to watch, not a test (docs/verification.md, "Speed").
Run: ``.venv/bin/python benchmarks/sim_seeds.py [--seeds N] [--start S] [--only default,large,target]
[--bookie model|real]`` (``target``: about 500 client operations per seed, the size the speed goal is
stated for; ``--bookie real``: the real bookie and its storage below the request path).
"""

from __future__ import annotations

import argparse
import dataclasses

from vellum.sim.campaign import run_campaign
from vellum.sim.runner import BOOKIE_KINDS, SimOptions
from vellum.sim.workload import WorkloadShape

WORKLOADS = {
    "default": ("default (3 ledgers of 20-60 entries)", SimOptions()),
    "large": ("large (6 ledgers of 50-110 entries)", SimOptions(shape=WorkloadShape(ledgers=6, entries=(50, 110),
                                                                                      reader_polls=60))),
    "target": ("target (8 ledgers of 50-110 entries)", SimOptions(shape=WorkloadShape(ledgers=8, entries=(50, 110),
                                                                                        reader_polls=80))),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--start", type=int, default=100_000)
    parser.add_argument("--only", default=",".join(WORKLOADS), help="comma-separated: " + ", ".join(WORKLOADS))
    parser.add_argument("--bookie", default="model", choices=BOOKIE_KINDS, help="the bookie below the request path")
    args = parser.parse_args()
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        parser.error(f"--only: unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
    for name in names:
        label, options = WORKLOADS[name]
        options = dataclasses.replace(options, bookie=args.bookie)
        label = f"{label} [{args.bookie}]"
        r = run_campaign(range(args.start, args.start + args.seeds), options)
        print(f"{label:<48} {r.operations / r.seeds:>6.0f} ops/seed   "
              f"{r.seeds_per_s * 60:>6.0f} seeds per min wall   {r.seeds_per_cpu_s * 60:>6.0f} seeds per min CPU   "
              f"violations {len(r.violations)}")


if __name__ == "__main__":
    main()
