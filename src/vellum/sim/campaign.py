"""Many seeds: what ``vellum verify sim`` and the tests run.

Responsibility: run ``runner.run_seed`` over a range of seeds (or one seed), count what
happened and keep every violation with its seed; report seeds per second of wall time.

Invariants: a seed's outcome does not depend on the seeds run before it (each run owns its
world and restores the module ``random`` state); the report lists violations in seed order.

Speed: for the length of a campaign, what the process held before it is frozen out of the
cyclic garbage collector (``gc.freeze``; unfrozen at the end), so the collector's full passes
walk only what the runs allocate (docs/verification.md, "Speed"). The collector decides no
outcome: a run's history never depends on when garbage is collected.
"""

from __future__ import annotations

import gc
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from vellum.sim.checker import Violation
from vellum.sim.runner import RunResult, SimOptions, run_seed


@dataclass
class CampaignReport:
    seeds: int = 0
    elapsed_s: float = 0.0
    #: CPU time of this process (what one core did; wall time on a shared machine is more)
    cpu_s: float = 0.0
    operations: int = 0
    #: acknowledged adds over every seed
    acks: int = 0
    virtual_s: float = 0.0
    violations: list[tuple[int, Violation]] = field(default_factory=list)
    #: seeds whose run stopped with an error (a stuck world or a bug of the simulator)
    errors: list[tuple[int, str]] = field(default_factory=list)
    kinds: Counter[str] = field(default_factory=Counter)
    network: Counter[str] = field(default_factory=Counter)
    #: fault kind -> seeds with at least one injection of it (``RunResult.injected``)
    fault_seeds: Counter[str] = field(default_factory=Counter)
    #: fault kind -> injections over every seed
    injections: Counter[str] = field(default_factory=Counter)
    #: the last seed run (a nightly campaign resumes after it)
    last_seed: int | None = None
    #: the campaign was interrupted (Ctrl-C) before its last seed: the report covers what ran
    interrupted: bool = False

    def fault_share(self, kind: str) -> float:
        """The share of seeds that hit ``kind`` at least once."""
        return self.fault_seeds[kind] / self.seeds if self.seeds else 0.0

    @property
    def seeds_per_s(self) -> float:
        return self.seeds / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def seeds_per_cpu_s(self) -> float:
        return self.seeds / self.cpu_s if self.cpu_s > 0 else 0.0

    @property
    def failed_seeds(self) -> list[int]:
        return sorted({seed for seed, _v in self.violations} | {seed for seed, _e in self.errors})

    def add(self, result: RunResult) -> None:
        self.seeds += 1
        self.operations += result.operations
        self.acks += result.acks
        self.virtual_s += result.virtual_s
        self.network.update(result.net_counts)
        self.last_seed = result.seed
        for kind, n in result.injected.items():
            if n:
                self.fault_seeds[kind] += 1
                self.injections[kind] += n
        for v in result.violations:
            self.violations.append((result.seed, v))
            self.kinds[v.kind] += 1
        if result.error is not None:
            self.errors.append((result.seed, result.error))


def run_campaign(seeds: Iterable[int], options: SimOptions | None = None, *,
                 on_result: Callable[[RunResult], None] | None = None,
                 stop_at_first: bool = False) -> CampaignReport:
    """Run every seed; ``on_result`` after each (progress); ``stop_at_first``: stop at the
    first seed with a violation. An interrupt (Ctrl-C) ends the campaign with the report of the
    seeds that finished (``interrupted``), so a long campaign can be resumed after its last seed."""
    report = CampaignReport()
    start = time.perf_counter()
    cpu = time.process_time()
    gc.freeze()
    try:
        for seed in seeds:
            result = run_seed(seed, options)
            report.add(result)
            report.elapsed_s = time.perf_counter() - start
            report.cpu_s = time.process_time() - cpu
            if on_result is not None:
                on_result(result)
            if stop_at_first and result.violations:
                break
    except KeyboardInterrupt:
        report.interrupted = True
    finally:
        gc.unfreeze()
    report.elapsed_s = time.perf_counter() - start
    report.cpu_s = time.process_time() - cpu
    return report
