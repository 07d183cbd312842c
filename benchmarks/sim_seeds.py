"""Benchmark of the deterministic simulator: seeds per minute for three workload sizes.

Prints, per workload, client operations per seed and seeds per minute by wall clock and by the
CPU time of this process (what one core does; on a shared machine the wall clock is slower).
No assertions: a number to watch, not a test (docs/verification.md, "Speed").
Run: ``.venv/bin/python benchmarks/sim_seeds.py [--seeds N] [--start S] [--only default,large,target]
[--bookie model|real] [--autorecovery on,off]`` (``target``: about 500 client operations per seed, the
size the speed goal is stated for; ``--bookie real``: the real bookie and its storage below the request
path; ``--autorecovery``: with AutoRecovery's two daemons, as a default run has them, and without
them, the three clients and five bookies alone: each workload is run once per value given). Under each
rate: the share of seeds that hit each fault kind at least once.
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
    parser.add_argument("--autorecovery", default="on,off",
                        help="comma-separated: on (AutoRecovery's daemons run, the default run), off (without them)")
    args = parser.parse_args()
    modes = [m.strip() for m in args.autorecovery.split(",") if m.strip()]
    if not modes or any(m not in ("on", "off") for m in modes):
        parser.error(f"--autorecovery: {args.autorecovery!r}; give on, off or on,off")
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        parser.error(f"--only: unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
    for name in names:
        for mode in modes:
            label, options = WORKLOADS[name]
            options = dataclasses.replace(options, bookie=args.bookie, autorecovery=mode == "on")
            label = f"{label} [{args.bookie}, AR {mode}]"
            r = run_campaign(range(args.start, args.start + args.seeds), options)
            print(f"{label:<56} {r.operations / r.seeds:>6.0f} ops/seed   "
                  f"{r.seeds_per_s * 60:>6.0f} seeds per min wall   {r.seeds_per_cpu_s * 60:>6.0f} seeds per min CPU   "
                  f"violations {len(r.violations)}")
            shares = ", ".join(f"{kind} {r.fault_share(kind):.0%}" for kind in sorted(r.fault_seeds))
            print(f"    seeds hitting each fault kind: {shares or 'none'}")


if __name__ == "__main__":
    main()
