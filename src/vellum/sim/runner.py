"""One simulated run per seed: the cluster, the workload, the faults, the final check.

Responsibility: build the world of one seed on a ``SimLoop`` (5 bookie nodes serving the real
``BookieConnection`` over ``SimBookie``, the in-memory metadata store, clients of the real
asyncio ``BookKeeper``), run the actors (``workload``) and the fault injector (the nemesis) for
a bounded virtual time, heal every fault, recover and read back every ledger, run GC, and hand
the history to ``checker``. ``run_seed(seed, options)`` is a pure function of its arguments, in
any process (nothing depends on string hashing: the tests replay a seed under different
``PYTHONHASHSEED``s).

Every random choice comes from ``random.Random(seed)`` and generators derived from it; the
module ``random`` generator (used by the client's back-off jitter) is seeded from it for the
length of the run and restored afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import random
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from vellum.client import ledger_writer as client_ledger_writer
from vellum.client import metadata_update as client_metadata_update
from vellum.client import recovery as client_recovery
from vellum.client.bookkeeper import BookKeeper
from vellum.client.placement import DefaultPlacementPolicy
from vellum.config import ClientConfig
from vellum.errors import MetadataStoreUnavailableError
from vellum.ids import BookieId, LedgerId
from vellum.meta.model import LedgerMetadata
from vellum.server.bookie_server import BookieConnection, ServerLimits
from vellum.server.processors import Counters
from vellum.sim.bookie import SimBookie, SimDisk, key_check_for
from vellum.sim.checker import Violation, check
from vellum.sim.history import History
from vellum.sim.loop import SimLoop, SimQuiescent
from vellum.sim.metadata import SimMetadataStore
from vellum.sim.network import Link, NetFaults, SimNetwork, current_node
from vellum.sim.real_bookie import PageCache, RealSimBookie, remove_scratch, scratch_root
from vellum.sim.workload import Workload, WorkloadShape

log = logging.getLogger(__name__)

#: the fault kinds ``--faults`` takes
FAULT_KINDS = ("delay", "drop", "dup", "reorder", "partition", "crash", "slow", "meta", "corrupt")
#: what a run injects unless told otherwise (``meta``: metadata writes that fail, ``corrupt``: a
#: crash that leaves a bad stored entry behind, are opt-in)
DEFAULT_FAULTS = frozenset(FAULT_KINDS) - {"meta", "corrupt"}
#: the metadata-store writes whose reply (or request) the ``meta`` fault loses
_META_WRITES = frozenset({"create_ledger", "create_ledger_with_id", "write_ledger", "delete_ledger"})


@dataclass(frozen=True)
class SimOptions:
    """What a run simulates. ``faults``: a subset of ``FAULT_KINDS``; ``flags``: test flags
    that revert a fix (``REGRESSIONS``)."""

    faults: frozenset[str] = DEFAULT_FAULTS
    bookies: int = 5
    shape: WorkloadShape = field(default_factory=WorkloadShape)
    #: virtual seconds the workload may run before the heal phase
    run_s: float = 30.0
    flags: frozenset[str] = frozenset()
    #: fault intensities (with ``faults`` naming the kind): per write, and the slowest delivery
    drop: float = 0.02
    duplicate: float = 0.02
    reorder: float = 0.05
    delay_max_s: float = 0.02
    slow: float = 0.0
    #: record what each bookie did (adds, refusals, fences) in the history: for replaying one
    #: seed; it changes neither the run nor its fingerprint
    trace: bool = False
    #: what stands below the request path (``BOOKIE_KINDS``): the model (``sim/bookie.py``) or
    #: the real bookie and its storage on files (``sim/real_bookie.py``)
    bookie: str = "model"
    #: with the real bookie: the share of crashes that are power losses (the bytes its journals
    #: and entry logs wrote but did not fsync are lost too)
    power_loss: float = 0.0


#: the bookie kinds ``--bookie`` takes
BOOKIE_KINDS = ("model", "real")
#: fault kinds the real bookie does not take (a bad stored entry is planted in the model's disk)
_MODEL_ONLY_FAULTS = frozenset({"corrupt"})

#: named workloads (``--scenario``): the default mix, and a race of the old writer against
#: fencing (small ensembles, recovery in the middle of the writes, lossy network, no crashes)
SCENARIOS: dict[str, SimOptions] = {}

#: the bookie-side events of ``SimOptions.trace`` (left out of a run's fingerprint)
TRACE_KINDS = frozenset({"add", "recovery-add", "add-refused", "fence"})

#: known defects the simulator reproduces with their fix reverted: flag -> what it reverts
REGRESSIONS = {
    "no-fencing-recovery-reads": "recovery reads without the fence flag (TLA+ defect 1, rule 4 of docs/correctness.md)",
    "persist-recovery-segments": "a recovery writer's ensemble changes written when they happen, not with the close",
    "ignore-late-write-failures": "a write that fails after its entry reached the ack quorum is dropped: the bookie "
                                  "is never replaced (defect D3, rule 11 of docs/correctness.md)",
}


@dataclass
class RunResult:
    seed: int
    violations: list[Violation]
    operations: int
    virtual_s: float
    events: int
    fingerprint: str
    net_counts: dict[str, int]
    error: str | None = None
    #: adds the writer saw acknowledged (a run whose adds all fail checks nothing)
    acks: int = 0
    #: the whole history, kept only for a traced run (``SimOptions.trace``: a replay prints it)
    history: History | None = None


class BookieNode:
    """A bookie process on the simulated network: the real request path over a ``SimBookie``,
    or over the real bookie (``RealSimBookie``) when given a ``home`` directory for its files."""

    def __init__(self, name: str, loop: SimLoop, rng: random.Random, store: SimMetadataStore,
                 history: History | None, home: Path | None = None) -> None:
        self.name = name
        self.home = home
        self._real_errors: list[str] = []
        #: what a power loss takes back (the real bookie's files written since their last fsync)
        self.page_cache = PageCache() if home is not None else None
        self._history = history
        self._loop = loop
        self._rng = rng
        self._store = store
        self.disk = SimDisk()
        self._links: list[Link] = []
        self._counters = Counters(max_adds=10000, max_reads=10000, max_frame_size=ServerLimits().max_frame_size)
        self._limits = ServerLimits()
        self.bookie: SimBookie | RealSimBookie | None = None
        self._internal_before_crash = 0
        self.start()

    def _password(self, ledger_id: int) -> bytes | None:
        return self._store.password_of(ledger_id)

    def start(self) -> None:
        if self.home is not None:
            if self.bookie is not None:
                self._real_errors += self.bookie.errors  # type: ignore[union-attr]
            self.bookie = RealSimBookie(self.name, self._loop, self._rng, self.home, self._store.ledgers,
                                        key_check_for(self._password), group_wait_s=0.001, fsync_s=(0.0002, 0.003),
                                        read_s=(0.00005, 0.0005), page_cache=self.page_cache)
        else:
            self.bookie = SimBookie(self.name, self._loop, self._rng, self.disk, key_check_for(self._password),
                                    group_wait_s=0.001, fsync_s=(0.0002, 0.003), read_s=(0.00005, 0.0005))
        history = self._history
        if history is not None:
            name = self.name
            self.bookie.trace = lambda kind, ledger, entry, value: history.add(name, kind, ledger, entry, value)

    @property
    def up(self) -> bool:
        return self.bookie is not None and self.bookie.alive

    def accept(self) -> asyncio.BufferedProtocol:
        assert self.bookie is not None
        return BookieConnection(self.bookie, self._counters, self._limits, lambda _c: None)  # type: ignore[arg-type]

    def attach(self, link: Link) -> None:
        self._links = [lk for lk in self._links if not all(lk.lost)]
        self._links.append(link)

    def crash(self, *, power_loss: bool = False) -> None:
        """The bookie's process dies; ``power_loss`` (real bookie only): the machine too, so
        what its files held only in the page cache is gone."""
        if self.bookie is not None:
            self.bookie.crash()
        if power_loss:
            assert self.page_cache is not None, "a power loss needs the real bookie"
            self.page_cache.lose()
        for link in self._links:
            link.reset(1)
        self._links = []
        # The processors' in-flight work belongs to the dead process: new counters.
        self._internal_before_crash += self._internal(self._counters)
        self._counters = Counters(max_adds=10000, max_reads=10000, max_frame_size=self._limits.max_frame_size)

    @staticmethod
    def _internal(counters: Counters) -> int:
        return sum(n for (_op, status), n in counters.errors.items() if status == "EINTERNAL")

    @property
    def internal_errors(self) -> int:
        """Requests the real request path answered EINTERNAL (an unexpected exception: a bug of
        the code under test or of the model below it), over every life of this bookie."""
        return self._internal_before_crash + self._internal(self._counters)

    @property
    def storage_errors(self) -> list[str]:
        """Failures of the real storage's own steps (checkpoint, GC), over every life."""
        now = self.bookie.errors if isinstance(self.bookie, RealSimBookie) else []
        return self._real_errors + now

    def gc(self) -> list[int]:
        assert self.bookie is not None
        if isinstance(self.bookie, RealSimBookie):
            return self.bookie.gc_pass()
        ledgers = self._store.ledgers
        return self.bookie.collect_deleted(lambda lid: ledgers.ledger_exists(LedgerId(lid)))

    def held_entries(self, ledger_id: int) -> frozenset[int]:
        """The entries of the ledger this bookie holds: on the model's disk, or in the real
        bookie's storage."""
        if isinstance(self.bookie, RealSimBookie):
            return self.bookie.held_entries(ledger_id) if self.bookie.alive else frozenset()
        rec = self.disk.ledgers.get(ledger_id)
        return frozenset(rec.entries) if rec is not None else frozenset()

    def holds_any(self, ledger_id: int) -> bool:
        """Does this bookie (alive) still hold an entry of the ledger after a GC pass that could
        delete it? The real GC deletes nothing while the metadata store lists no ledger at all
        (docs/gc.md: an empty listing is taken as a broken store), so after such a pass a real
        bookie is not asked."""
        if isinstance(self.bookie, RealSimBookie):
            return not self.bookie.listing_empty and bool(self.held_entries(ledger_id))
        assert self.bookie is not None
        rec = self.bookie.mem.get(ledger_id)
        return rec is not None and bool(rec.entries)

    @property
    def restarted(self) -> str:
        """How a restart is written in the history: the bookie's name, and for a real bookie the
        journal records its start replayed."""
        if isinstance(self.bookie, RealSimBookie):
            return f"{self.name} (replayed {self.bookie.replayed} journal records)"
        return self.name

    def dispose(self) -> None:
        """The run is over: a real bookie releases its files (as a crash would)."""
        if isinstance(self.bookie, RealSimBookie):
            self.bookie.crash()


@contextlib.contextmanager
def _seeded_globals(seed: int, flags: frozenset[str]) -> Iterator[None]:
    state = random.getstate()
    random.seed(seed ^ 0x5EED)
    fence_reads = client_recovery._fence_recovery_reads
    # A regression flag turns its fix off; without it the code runs as shipped (so a fix removed
    # from the code is caught by the seeds too).
    if "no-fencing-recovery-reads" in flags:
        client_recovery._fence_recovery_reads = False
    defer_segments = client_metadata_update._defer_recovery_segments
    if "persist-recovery-segments" in flags:
        client_metadata_update._defer_recovery_segments = False
    replace_after_ack = client_ledger_writer._replace_after_ack
    if "ignore-late-write-failures" in flags:
        client_ledger_writer._replace_after_ack = False
    vellum_log = logging.getLogger("vellum")
    level = vellum_log.level
    vellum_log.setLevel(logging.CRITICAL + 1)
    asyncio_log = logging.getLogger("asyncio")
    asyncio_level = asyncio_log.level
    asyncio_log.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        random.setstate(state)
        client_recovery._fence_recovery_reads = fence_reads
        client_metadata_update._defer_recovery_segments = defer_segments
        client_ledger_writer._replace_after_ack = replace_after_ack
        vellum_log.setLevel(level)
        asyncio_log.setLevel(asyncio_level)


def _client_config(rng: random.Random, explicit_lac_ms: int = 0) -> ClientConfig:
    return ClientConfig(
        add_entry_timeout_s=rng.choice((0.2, 0.5, 1.0)),
        read_entry_timeout_s=rng.choice((0.2, 0.5, 1.0)),
        speculative_read_timeout_ms=rng.choice((20, 50, 200)),
        explicit_lac_interval_ms=explicit_lac_ms,
    )


class World:
    """Everything one seed runs on."""

    def __init__(self, seed: int, options: SimOptions) -> None:
        if options.bookie not in BOOKIE_KINDS:
            raise ValueError(f"unknown bookie kind {options.bookie!r}: one of {', '.join(BOOKIE_KINDS)}")
        if options.power_loss and options.bookie != "real":
            raise ValueError("a power loss is simulated with the real bookie only (--bookie real): the model loses "
                             "everything not synced at every crash already")
        if options.bookie == "real" and options.faults & _MODEL_ONLY_FAULTS:
            raise ValueError(f"the real bookie does not take the fault(s) "
                             f"{', '.join(sorted(options.faults & _MODEL_ONLY_FAULTS))} (a bad stored entry is "
                             "planted in the model's disk only): leave them out of --faults")
        self.seed = seed
        self.options = options
        self.rng = random.Random(seed)
        self.loop = SimLoop()
        self.history = History(clock=self.loop.time)
        faults = options.faults
        self.calm = NetFaults()
        self.net = SimNetwork(self.loop, random.Random(self.rng.random()), NetFaults(
            delay_min_s=0.0002,
            delay_max_s=options.delay_max_s if "delay" in faults else 0.002,
            drop=options.drop if "drop" in faults else 0.0,
            duplicate=options.duplicate if "dup" in faults else 0.0,
            reorder=options.reorder if "reorder" in faults else 0.0,
            slow=options.slow if "delay" in faults else 0.0,
        ))
        self.loop.connect_hook = self.net.connect
        self.loop.executor_hook = self._metadata_call
        self._meta_rng = random.Random(self.rng.random())
        self.store = SimMetadataStore(self.loop, self._metadata_written)
        self.nodes: list[BookieNode] = []
        node_rng = random.Random(self.rng.random())
        self.scratch: Path | None = None
        if options.bookie == "real":
            self.scratch = scratch_root()
            remove_scratch(self.scratch)  # a run starts on empty disks
        for i in range(options.bookies):
            home = self.scratch / f"bookie-{i}" if self.scratch is not None else None
            node = BookieNode(f"bookie-{i}:3181", self.loop, node_rng, self.store,
                              self.history if options.trace else None, home)
            self.nodes.append(node)
            self.net.add_server(node)
            self.store.registration.register_bookie(BookieId(node.name))
        self.clients: list[BookKeeper] = []
        #: entries with a bad copy on some bookie (the ``corrupt`` fault)
        self._corrupted: set[tuple[int, int]] = set()

    def _metadata_written(self, ledger_id: int, md: LedgerMetadata) -> None:
        segments = " ".join(f"{first}:[{','.join(b.split(':')[0].removeprefix('bookie-') for b in ens)}]"
                            for first, ens in sorted(md.ensembles.items()))
        end = f" last={md.last_entry_id}" if md.is_closed else ""
        self.history.add("metadata", "md-write", ledger_id, value=f"{md.state.name}{end} {segments}")

    def _metadata_call(self, func, args):  # type: ignore[no-untyped-def]
        """The loop's executor: metadata calls (and the client's other ``to_thread`` calls)
        run on the loop after a metadata round trip."""
        loop = self.loop
        fut: asyncio.Future[object] = loop.create_future()
        lose = None
        if "meta" in self.options.faults:
            # asyncio.to_thread hands over functools.partial(Context.run, the call, *its args)
            target = getattr(func, "args", (None,))[0] if isinstance(func, functools.partial) else func
            if getattr(target, "__name__", "") in _META_WRITES:
                roll = self._meta_rng.random()
                lose = "request" if roll < 0.03 else "reply" if roll < 0.06 else None

        def run() -> None:
            if fut.done():
                return
            if lose == "request":
                self.history.add("nemesis", "meta-lost", value="request")
                fut.set_exception(MetadataStoreUnavailableError("simulated: the metadata request was lost"))
                return
            try:
                result = func(*args)
            except BaseException as e:
                fut.set_exception(e)
                return
            if lose == "reply":
                self.history.add("nemesis", "meta-lost", value="reply")
                fut.set_exception(MetadataStoreUnavailableError("simulated: the metadata reply was lost"))
                return
            fut.set_result(result)

        loop.call_later(self._meta_rng.uniform(0.0005, 0.004), run)
        return fut

    async def client(self, name: str, *, explicit_lac_ms: int = 0) -> BookKeeper:
        token = current_node.set(name)
        try:
            bk = BookKeeper(config=_client_config(self.rng, explicit_lac_ms), store=self.store,
                            placement=DefaultPlacementPolicy(random.Random(self.rng.random())))
            await bk.start()
        finally:
            current_node.reset(token)
        self.clients.append(bk)
        return bk

    # ------------------------------------------------------------------------- nemesis
    async def nemesis(self) -> None:
        """Crashes, partitions and slow links at random moments, one at a time."""
        faults = self.options.faults
        rng = random.Random(self.rng.random())
        kinds = [k for k in ("crash", "partition", "slow") if k in faults]
        if not kinds:
            return
        while True:
            await asyncio.sleep(rng.uniform(0.05, 1.5))
            kind = rng.choice(kinds)
            node = rng.choice(self.nodes)
            if kind == "slow":
                who = rng.choice(["writer", "reader", "recoverer"])
                factor = rng.uniform(10.0, 60.0)
                pair = (who, node.name) if rng.random() < 0.5 else (node.name, who)
                self.net.slow_links[pair] = factor
                self.history.add("nemesis", "slow", value=f"{pair[0]} -> {pair[1]} x{factor:.0f}")
                await asyncio.sleep(rng.uniform(0.1, 1.5))
                self.net.slow_links.pop(pair, None)
                self.history.add("nemesis", "heal", value="slow link")
            elif kind == "crash":
                if not node.up:
                    continue
                power = self.options.power_loss > 0 and rng.random() < self.options.power_loss
                node.crash(power_loss=power)
                self.history.add("nemesis", "crash", value=f"{node.name} (power loss)" if power else node.name)
                if "corrupt" in faults and rng.random() < 0.5:
                    self._corrupt_one(node, rng)
                await asyncio.sleep(rng.uniform(0.01, 1.0))
                node.start()
                self.history.add("nemesis", "restart", value=node.restarted)
            else:
                who = rng.choice(["writer", "reader", "recoverer"])
                one_way = rng.random() < 0.5
                if one_way and rng.random() < 0.5:
                    self.net.partition(node.name, who, one_way=True)
                    desc = f"{node.name} -> {who}"
                else:
                    self.net.partition(who, node.name, one_way=one_way)
                    desc = f"{who} {'->' if one_way else '<->'} {node.name}"
                self.history.add("nemesis", "partition", value=desc)
                await asyncio.sleep(rng.uniform(0.05, 1.5))
                self.net.heal()
                self.history.add("nemesis", "heal")

    def _corrupt_one(self, node: BookieNode, rng: random.Random) -> None:
        """A stored entry of ``node`` goes bad (torn or rotten): one copy per entry at most, so
        every acknowledged entry keeps a good copy (two bad copies would be a double fault)."""
        candidates = [(lid, eid) for lid, rec in sorted(node.disk.ledgers.items()) if not rec.deleted
                      for eid in sorted(rec.entries) if (lid, eid) not in self._corrupted]
        if not candidates:
            return
        lid, eid = rng.choice(candidates)
        self._corrupted.add((lid, eid))
        node.disk.corrupt.add((lid, eid))
        self.history.add("nemesis", "corrupt", lid, eid, node.name)

    def heal_everything(self) -> None:
        self.net.heal()
        self.net.faults = replace(self.calm)
        for node in self.nodes:
            if not node.up:
                node.start()
                self.history.add("nemesis", "restart", value=node.restarted)


SCENARIOS["default"] = SimOptions()
SCENARIOS["fence-race"] = SimOptions(
    faults=frozenset({"delay", "drop", "reorder"}), drop=0.15, reorder=0.05, delay_max_s=0.005, slow=0.1,
    shape=WorkloadShape(ledgers=8, entries=(15, 30), window=4, shapes=((3, 3, 3),), recover_delay_s=(0.01, 0.2),
                        close_probability=0.0, delete_probability=0.0, reader_polls=2))
# A bookie that goes silent while the others keep the ack quorum: E=WQ=3, AQ=2 on five bookies
# (spares for every replacement), partitions and slow links, no crashes or lost writes (a bookie
# misses entries only while cut off); the writer waits 2 s (longer than any add timeout) before it
# closes, the recoverer opens a ledger only after that. ``not-replaced`` judges every ledger.
SCENARIOS["silent-bookie"] = SimOptions(
    faults=frozenset({"delay", "partition", "slow"}),
    shape=WorkloadShape(ledgers=2, entries=(40, 80), shapes=((3, 3, 2),), recover_delay_s=(4.0, 5.0),
                        close_probability=1.0, delete_probability=0.0, reader_polls=10,
                        quiet_before_close_s=2.0))
SCENARIOS["tailing"] = SimOptions(
    shape=WorkloadShape(ledgers=2, entries=(20, 50), long_poll=True, explicit_lac_ms=50, reader_polls=40))


def run_seed(seed: int, options: SimOptions | None = None) -> RunResult:
    """Simulate one seed (see the module docstring)."""
    options = options or SimOptions()
    with _seeded_globals(seed, options.flags):
        world = World(seed, options)
        loop = world.loop
        loop.set_exception_handler(lambda _loop, _ctx: None)  # unretrieved failures of abandoned work
        workload = Workload(world, options.shape)
        error = None
        try:
            loop.run_until_complete(_main(world, workload))
        except SimQuiescent as e:
            error = f"the simulation stopped: {e}"
        except Exception as e:  # a bug of the simulator or of the code under test
            error = f"{type(e).__name__}: {e}"
        internal = sum(node.internal_errors for node in world.nodes)
        if internal and error is None:
            error = (f"the request path answered EINTERNAL {internal} time(s): an unexpected exception in the "
                     "code under test or the simulated bookie (replay the seed with the vellum logger on)")
        storage_errors = [e for node in world.nodes for e in node.storage_errors]
        if storage_errors and error is None:
            error = f"the real bookie's storage failed: {storage_errors[0]} ({len(storage_errors)} failure(s))"
        final_ends, leftovers = workload.final_ends, workload.leftover_deleted
        virtual = loop.time() - 1000.0
        _drain(loop)
        for node in world.nodes:
            node.dispose()
        if world.scratch is not None:
            remove_scratch(world.scratch)
        violations = check(world.history, final_ends=final_ends, leftover_deleted=leftovers,
                           placements=workload.placements)
        fp = hashlib.blake2b(digest_size=8)
        for ev in world.history.events:
            if ev.kind not in TRACE_KINDS:
                fp.update(ev.describe().encode())
        return RunResult(seed, violations, workload.operations, virtual, len(world.history.events), fp.hexdigest(),
                         dict(world.net.counts), error,
                         sum(1 for ev in world.history.events if ev.kind == "ack"),
                         world.history if options.trace else None)


async def _main(world: World, workload: Workload) -> None:
    nemesis = asyncio.ensure_future(world.nemesis())
    try:
        await workload.run(world.options.run_s)
    finally:
        nemesis.cancel()
    world.heal_everything()
    await workload.final_phase()


def _drain(loop: SimLoop) -> None:
    """Cancel what is left (abandoned requests, timers' tasks) and close the loop."""
    for _ in range(3):
        tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
        if not tasks:
            break
        for t in tasks:
            t.cancel()
        with contextlib.suppress(BaseException):
            loop.run_until_complete(asyncio.wait(tasks, timeout=5.0))
    with contextlib.suppress(BaseException):
        loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()


__all__ = ["BOOKIE_KINDS", "DEFAULT_FAULTS", "FAULT_KINDS", "REGRESSIONS", "SCENARIOS", "RunResult", "SimOptions", "World", "run_seed"]
