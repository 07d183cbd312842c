"""Many seeds: what ``vellum verify sim`` and the tests run.

Responsibility: run ``runner.run_seed`` over a range of seeds (or one seed), count what
happened and keep every violation with its seed; report seeds per second of wall time.

Invariants: a seed's outcome does not depend on the seeds run before it (each run owns its
world and restores the module ``random`` state); the report lists violations in seed order.

Parallel: ``jobs`` > 1 runs the seeds in that many worker processes (started fresh, not forked:
the caller may hold threads), in chunks handed out in seed order and taken back in seed order,
so the report, the progress callbacks and the resume point (``last_seed``: every seed up to it
ran) are what one process would give. Only ``cpu_s`` differs: it adds up the workers' CPU.

Speed: for the length of a campaign, what the process held before it is frozen out of the
cyclic garbage collector (``gc.freeze``; unfrozen at the end), so the collector's full passes
walk only what the runs allocate (docs/verification.md, "Speed"). The collector decides no
outcome: a run's history never depends on when garbage is collected.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import time
from collections import Counter
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
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
                 stop_at_first: bool = False, jobs: int = 1) -> CampaignReport:
    """Run every seed; ``on_result`` after each (progress); ``stop_at_first``: stop at the
    first seed with a violation. An interrupt (Ctrl-C) ends the campaign with the report of the
    seeds that finished (``interrupted``), so a long campaign can be resumed after its last seed.
    ``jobs``: worker processes (0: one per core; 1: this process)."""
    if jobs < 0:
        raise ValueError(f"jobs must be 0 (one per core) or more, not {jobs}")
    workers = (os.cpu_count() or 1) if jobs == 0 else jobs
    report = CampaignReport()
    start = time.perf_counter()
    cpu = time.process_time()
    results = _in_process(seeds, options) if workers == 1 else _in_workers(seeds, options, workers)
    gc.freeze()
    try:
        for result, cpu_s in results:
            report.add(result)
            report.elapsed_s = time.perf_counter() - start
            report.cpu_s = cpu_s if workers > 1 else time.process_time() - cpu
            if on_result is not None:
                on_result(result)
            if stop_at_first and result.violations:
                break
    except KeyboardInterrupt:
        report.interrupted = True
    finally:
        gc.unfreeze()
        results.close()
    report.elapsed_s = time.perf_counter() - start
    if workers == 1:
        report.cpu_s = time.process_time() - cpu
    return report


def _in_process(seeds: Iterable[int], options: SimOptions | None) -> Generator[tuple[RunResult, float]]:
    for seed in seeds:
        yield run_seed(seed, options), 0.0


#: seeds a worker runs per hand-out: large enough that pickling and the hand-out cost little
#: next to the runs, small enough that progress moves and the last chunks balance the workers
CHUNK = 16


def _in_workers(seeds: Iterable[int], options: SimOptions | None,
                workers: int) -> Generator[tuple[RunResult, float]]:
    """Each result in seed order with the workers' CPU seconds so far. A few chunks per worker
    are in flight; the generator's close (the campaign stopping early or interrupted) cancels
    what has not started and stops the workers."""
    chunks = _chunks(seeds, CHUNK)
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))
    pending: list[Future[tuple[list[RunResult], float]]] = []
    cpu_s = 0.0
    try:
        for chunk in chunks:
            pending.append(pool.submit(_run_chunk, chunk, options))
            if len(pending) >= 2 * workers:
                break
        while pending:
            done, chunk_cpu = pending.pop(0).result()
            nxt = next(chunks, None)
            if nxt is not None:
                pending.append(pool.submit(_run_chunk, nxt, options))
            cpu_s += chunk_cpu
            for result in done:
                yield result, cpu_s
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _chunks(seeds: Iterable[int], size: int) -> Iterator[list[int]]:
    chunk: list[int] = []
    for seed in seeds:
        chunk.append(seed)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _run_chunk(seeds: Sequence[int], options: SimOptions | None) -> tuple[list[RunResult], float]:
    """In a worker: the seeds' results (as one process gives them) and the CPU they took."""
    cpu = time.process_time()
    gc.freeze()
    try:
        results = [run_seed(seed, options) for seed in seeds]
    finally:
        gc.unfreeze()
    return results, time.process_time() - cpu
