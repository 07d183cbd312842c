"""``vellum verify cluster``: the simulator's clients and checker against a real, running cluster.

Responsibility: run the same workload the simulator runs (``workload.Workload``: a writer, a
tailing reader, a recoverer racing the writer that also deletes, then a final phase that
recovers and reads back every ledger) against a user's own cluster, on real time, for a bounded
time, in rounds; optionally call the user's nemesis command to kill or pause their processes;
and judge the history with the simulator's checker (``checker.check``), so the promises checked
are the same ones (docs/verification.md, "What the checker promises").

The nemesis hook: ``CMD inject`` runs at random moments while a round's clients work (at most
one fault at a time), ``CMD heal`` a random while later and always before a round's final
phase; each run's exit status and first line of output go into the history. A nemesis that
fails or hangs (``NEMESIS_TIMEOUT_S``) is reported and the run goes on.

Invariants: the workload touches only the ledgers it created (password ``workload.PASSWORD``),
and deletes them at the end unless asked to keep them; every loop is bounded by the duration;
nothing here judges a promise (``checker`` does).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import shlex
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from vellum.client.bookkeeper import BookKeeper
from vellum.client.metadata_security import open_configured_store
from vellum.config import ClientConfig
from vellum.errors import NoSuchLedgerError, VellumError
from vellum.meta.api import MetadataStore
from vellum.sim.checker import Violation, check
from vellum.sim.history import History
from vellum.sim.workload import SHAPES, Workload, WorkloadShape

log = logging.getLogger(__name__)

#: seconds a nemesis command may run before it is killed (and reported)
NEMESIS_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ClusterCheckOptions:
    metadata_uri: str
    duration_s: float = 60.0
    #: seconds of client work per round (each round ends with a final phase)
    round_s: float = 15.0
    nemesis: str | None = None
    keep_ledgers: bool = False
    seed: int | None = None
    shape: WorkloadShape = field(default_factory=lambda: WorkloadShape(ledgers=4, entries=(50, 200)))


@dataclass
class ClusterCheckReport:
    rounds: int = 0
    elapsed_s: float = 0.0
    ledgers: int = 0
    deleted: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    nemesis: Counter[str] = field(default_factory=Counter)
    violations: list[Violation] = field(default_factory=list)
    #: what stopped a round early (an error of the tool or of the cluster it could not work around)
    errors: list[str] = field(default_factory=list)
    seed: int = 0

    @property
    def acks(self) -> int:
        return self.counts["ack"]


class ClusterWorld:
    """What ``Workload`` needs of its world, on a real cluster: clients, the metadata store,
    one history on real time and one random generator (its seed is reported, not a replay:
    real time decides the interleavings)."""

    def __init__(self, options: ClusterCheckOptions, config: ClientConfig, store: MetadataStore,
                 writable: int) -> None:
        self.options = options
        self.seed = options.seed if options.seed is not None else random.randrange(1 << 32)
        self.rng = random.Random(self.seed)
        self.history = History(clock=time.monotonic)
        self.store = store
        self.nodes: list[object] = []  # no bookie of a real cluster is inspected in-process
        self.clients: list[BookKeeper] = []
        self._config = config
        self.shapes = tuple(s for s in SHAPES if s[0] <= writable) or ((writable, writable, max(1, writable // 2 + 1)),)

    async def client(self, name: str, *, explicit_lac_ms: int = 0) -> BookKeeper:
        config = replace(self._config, explicit_lac_interval_ms=explicit_lac_ms) if explicit_lac_ms else self._config
        bk = BookKeeper(self.options.metadata_uri, config=config, store=self.store)
        await bk.start()
        self.clients.append(bk)
        return bk

    async def close(self) -> None:
        for bk in self.clients:
            with contextlib.suppress(Exception):
                await bk.close()
        self.clients = []


class Nemesis:
    """Runs the user's ``CMD inject`` / ``CMD heal`` (see the module docstring)."""

    def __init__(self, command: str, history: History, rng: random.Random, counts: Counter[str]) -> None:
        self._argv = shlex.split(command)
        self._history = history
        self._rng = rng
        self._counts = counts
        self.injected = False

    async def _run(self, action: str) -> None:
        started = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(*self._argv, action, stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.STDOUT)
        except OSError as e:
            self._counts[f"{action} failed"] += 1
            self._history.add("nemesis", f"{action}-failed", value=f"cannot run {self._argv[0]}: {e}")
            log.warning("nemesis %s: cannot run %s: %s", action, self._argv[0], e)
            return
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), NEMESIS_TIMEOUT_S)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            self._counts[f"{action} failed"] += 1
            self._history.add("nemesis", f"{action}-failed", value=f"killed after {NEMESIS_TIMEOUT_S:g} s")
            log.warning("nemesis %s: %s ran longer than %g s and was killed", action, self._argv[0],
                        NEMESIS_TIMEOUT_S)
            return
        first = (out or b"").decode(errors="replace").strip().splitlines()[:1]
        said = first[0] if first else ""
        if proc.returncode != 0:
            self._counts[f"{action} failed"] += 1
            self._history.add("nemesis", f"{action}-failed", value=f"exit {proc.returncode}: {said}")
            log.warning("nemesis %s exited %d: %s", action, proc.returncode, said)
            return
        self._counts[action] += 1
        self._history.add("nemesis", action, value=f"{said} ({time.monotonic() - started:.1f} s)")

    async def run(self) -> None:
        """Faults at random moments until cancelled (the caller heals after)."""
        while True:
            await asyncio.sleep(self._rng.uniform(0.5, 3.0))
            self.injected = True
            await self._run("inject")
            await asyncio.sleep(self._rng.uniform(0.5, 4.0))
            await self.heal()

    async def heal(self) -> None:
        """``CMD heal`` after an inject (again if a heal was cut short)."""
        if self.injected:
            await self._run("heal")
            self.injected = False


async def run_cluster_check(options: ClusterCheckOptions, config: ClientConfig, *,
                            progress: Callable[[ClusterCheckReport], None] | None = None) -> ClusterCheckReport:
    """Rounds of the workload until ``duration_s`` is spent; the history of every round is
    judged at the end (and each round's on the way, for the progress line)."""
    report = ClusterCheckReport()
    store = await asyncio.to_thread(open_configured_store, options.metadata_uri, config)
    try:
        writable = len(await asyncio.to_thread(store.registration.list_bookies))
        if writable == 0:
            raise VellumError(f"no writable bookie is registered in {options.metadata_uri}: start the cluster first")
        world = ClusterWorld(options, config, store, writable)
        report.seed = world.seed
        shape = replace(options.shape, shapes=world.shapes)
        nemesis = Nemesis(options.nemesis, world.history, world.rng, report.nemesis) if options.nemesis else None
        final_ends: dict[int, int] = {}
        created: list[int] = []
        started = time.monotonic()
        try:
            while time.monotonic() - started < options.duration_s:
                left = options.duration_s - (time.monotonic() - started)
                workload = Workload(world, shape)
                faults = asyncio.ensure_future(nemesis.run()) if nemesis is not None else None
                try:
                    await workload.run(max(1.0, min(options.round_s, left)))
                finally:
                    if faults is not None:
                        faults.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await faults
                if nemesis is not None:
                    await nemesis.heal()
                await workload.final_phase()
                created.extend(workload.ledgers)
                final_ends.update(workload.final_ends)
                report.rounds += 1
                report.ledgers = len(created)
                report.deleted += len(workload.deleted)
                report.counts = Counter(ev.kind for ev in world.history.events)
                report.elapsed_s = time.monotonic() - started
                if progress is not None:
                    progress(report)
        finally:
            await world.close()
        report.violations = check(world.history, final_ends=final_ends, leftover_deleted={})
        if not options.keep_ledgers:
            await _delete(options.metadata_uri, config, store, created)
    finally:
        await asyncio.to_thread(store.close)
    report.elapsed_s = time.monotonic() - started
    return report


async def _delete(uri: str, config: ClientConfig, store: MetadataStore, ledgers: list[int]) -> None:
    """The ledgers the run created and did not delete: gone, so a check leaves nothing behind."""
    async with BookKeeper(uri, config=config, store=store) as bk:
        for lid in ledgers:
            try:
                await bk.delete_ledger(lid)
            except NoSuchLedgerError:
                pass
            except VellumError as e:
                log.warning("verify cluster: could not delete its ledger %d: %s", lid, e)
