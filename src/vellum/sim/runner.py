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
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from vellum.client import bookkeeper as client_bookkeeper
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
from vellum.sim.workload import Workload, WorkloadShape

log = logging.getLogger(__name__)

#: the fault kinds ``--faults`` takes (``all``: every one of them)
FAULT_KINDS = ("delay", "drop", "dup", "reorder", "partition", "crash", "slow", "meta", "corrupt",
               "torn", "eio", "full", "clock")
#: modes ``--faults`` also takes but ``all`` never includes: ``lying-fsync`` (every disk
#: acknowledges fsync without persisting) breaks durability on purpose, so the checker must fail
FAULT_MODES = ("lying-fsync",)
#: what a run injects unless told otherwise (``meta``: metadata writes that fail, ``corrupt``: a
#: crash that leaves a bad stored entry behind, ``torn``, ``eio``, ``full`` and ``clock``: the
#: disk and clock faults, are opt-in)
DEFAULT_FAULTS = frozenset(FAULT_KINDS) - {"meta", "corrupt", "torn", "eio", "full", "clock"}
#: the nemesis's kinds, in the order its generator picks among them (a kind not asked for is
#: left out, so the default mix draws as it did before the disk and clock faults existed)
_NEMESIS_KINDS = ("crash", "partition", "slow", "torn", "eio", "full", "clock")
#: what the wall clock reads at virtual time 0 (2026-01-01T00:00:00Z): a run never reads the host's
_WALL_EPOCH = 1_767_225_600.0
#: the network's counters (``SimNetwork.counts``) that say a seed hit a fault kind
_NET_FAULTS = {"dropped": "drop", "duplicated": "dup", "reordered": "reorder"}
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
    #: fault kind -> injections of it in this run (a kind absent: never hit; ``delay``: every
    #: write of a run with the kind is delayed, counted once)
    injected: dict[str, int] = field(default_factory=dict)


class BookieNode:
    """A bookie process on the simulated network: the real request path over a ``SimBookie``."""

    def __init__(self, name: str, loop: SimLoop, rng: random.Random, store: SimMetadataStore,
                 history: History | None) -> None:
        self.name = name
        self._history = history
        self._loop = loop
        self._rng = rng
        self._store = store
        self.disk = SimDisk()
        self._links: list[Link] = []
        self._counters = Counters(max_adds=10000, max_reads=10000, max_frame_size=ServerLimits().max_frame_size)
        self._limits = ServerLimits()
        self.bookie: SimBookie | None = None
        self._internal_before_crash = 0
        self.start()

    def _password(self, ledger_id: int) -> bytes | None:
        return self._store.password_of(ledger_id)

    def start(self) -> None:
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

    def crash(self, keep: int = 0) -> tuple[int, int]:
        """The process dies; ``keep``: unsynced journal records that survive (a torn crash).
        Returns (records kept, records that were unsynced)."""
        torn = (0, 0)
        if self.bookie is not None:
            torn = self.bookie.crash(keep)
        for link in self._links:
            link.reset(1)
        self._links = []
        # The processors' in-flight work belongs to the dead process: new counters.
        self._internal_before_crash += self._internal(self._counters)
        self._counters = Counters(max_adds=10000, max_reads=10000, max_frame_size=self._limits.max_frame_size)
        return torn

    @staticmethod
    def _internal(counters: Counters) -> int:
        return sum(n for (_op, status), n in counters.errors.items() if status == "EINTERNAL")

    @property
    def internal_errors(self) -> int:
        """Requests the real request path answered EINTERNAL (an unexpected exception: a bug of
        the code under test or of the model below it), over every life of this bookie."""
        return self._internal_before_crash + self._internal(self._counters)

    def gc(self) -> list[int]:
        assert self.bookie is not None
        ledgers = self._store.ledgers
        return self.bookie.collect_deleted(lambda lid: ledgers.ledger_exists(LedgerId(lid)))


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
        for i in range(options.bookies):
            node = BookieNode(f"bookie-{i}:3181", self.loop, node_rng, self.store,
                              self.history if options.trace else None)
            self.nodes.append(node)
            self.net.add_server(node)
            self.store.registration.register_bookie(BookieId(node.name))
        self.clients: list[BookKeeper] = []
        #: entries with a bad copy on some bookie (the ``corrupt`` fault)
        self._corrupted: set[tuple[int, int]] = set()
        #: fault kind -> injections (``RunResult.injected``)
        self.injected: Counter[str] = Counter()
        if "lying-fsync" in faults:
            for node in self.nodes:
                node.disk.lies = True
        #: what the wall clock (``time.time`` as the client sees it) is ahead of virtual time: the
        #: ``clock`` fault jumps it forward and back
        self.wall_offset = 0.0

    def wall_time(self) -> float:
        """The wall clock of the code under test: a fixed epoch plus virtual time, plus the jumps."""
        return _WALL_EPOCH + self.loop.time() + self.wall_offset

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
                if lose is not None:
                    self.injected["meta"] += 1

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
        """Crashes, partitions, slow links, and the disk and clock faults at random moments,
        one at a time."""
        faults = self.options.faults
        rng = random.Random(self.rng.random())
        kinds = [k for k in _NEMESIS_KINDS if k in faults]
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
                self.injected["slow"] += 1
                self.history.add("nemesis", "slow", value=f"{pair[0]} -> {pair[1]} x{factor:.0f}")
                await asyncio.sleep(rng.uniform(0.1, 1.5))
                self.net.slow_links.pop(pair, None)
                self.history.add("nemesis", "heal", value="slow link")
            elif kind in ("crash", "torn"):
                if kind == "torn":
                    node = await self._mid_group(rng) or node
                if not node.up:
                    continue
                self._crash(node, rng if kind == "torn" else None)
                if "corrupt" in faults and rng.random() < 0.5:
                    self._corrupt_one(node, rng)
                await asyncio.sleep(rng.uniform(0.01, 1.0))
                node.start()
                self.history.add("nemesis", "restart", value=node.name)
            elif kind == "eio":
                await self._eio(node, rng)
            elif kind == "full":
                await self._full(node, rng)
            elif kind == "clock":
                self._clock_jump(rng)
            else:
                who = rng.choice(["writer", "reader", "recoverer"])
                one_way = rng.random() < 0.5
                if one_way and rng.random() < 0.5:
                    self.net.partition(node.name, who, one_way=True)
                    desc = f"{node.name} -> {who}"
                else:
                    self.net.partition(who, node.name, one_way=one_way)
                    desc = f"{who} {'->' if one_way else '<->'} {node.name}"
                self.injected["partition"] += 1
                self.history.add("nemesis", "partition", value=desc)
                await asyncio.sleep(rng.uniform(0.05, 1.5))
                self.net.heal()
                self.history.add("nemesis", "heal")

    async def _mid_group(self, rng: random.Random) -> BookieNode | None:
        """A bookie with journal records written but not yet synced, waited for in small steps
        (at most 0.3 virtual seconds): where a power cut tears a group."""
        for _ in range(100):
            pending = [n for n in self.nodes if n.up and n.bookie is not None and n.bookie.pending_records]
            if pending:
                return rng.choice(pending)
            await asyncio.sleep(rng.uniform(0.0005, 0.003))
        return None

    def _crash(self, node: BookieNode, torn: random.Random | None = None) -> None:
        """Kill ``node``'s process (a power cut: what was not synced is lost). ``torn``: a seeded
        prefix (drawn from its generator) of the unsynced journal records survives (the group was partly on the disk; replay
        stops at the first bad record, so the next one is torn and discarded)."""
        assert node.bookie is not None
        unwritten = node.bookie.unwritten_records
        keep = torn.randint(0, node.bookie.pending_records) if torn is not None else 0
        kept, pending = node.crash(keep)
        self.injected["crash"] += 1
        self.history.add("nemesis", "crash", value=node.name)
        if torn and pending:
            self.injected["torn"] += 1
            tail = " (the next one torn, discarded by replay)" if kept < pending else ""
            self.history.add("nemesis", "torn", value=f"{node.name}: kept {kept} of {pending} unsynced records{tail}")
        if unwritten:
            self.injected["lying-fsync"] += 1
            self.history.add("nemesis", "fsync-lied",
                             value=f"{node.name}: {unwritten} acknowledged records were never written")

    async def _eio(self, node: BookieNode, rng: random.Random) -> None:
        """An I/O error on ``node``'s disk for a while. Half the time its journal: fail-stop, as
        ``storage/journal.py`` (every pending and later add and fence answered EIO, reads still
        served) until the process is restarted, as an operator would; else its ledger storage's
        flushes: adds refused with back-pressure while they fail, nothing lost."""
        bookie = node.bookie
        if bookie is None or not node.up:
            return
        self.injected["eio"] += 1
        if rng.random() < 0.5:
            failed = bookie.fail_journal("write failed")
            self.history.add("nemesis", "eio", value=f"journal of {node.name} ({failed} pending records failed)")
            await asyncio.sleep(rng.uniform(0.05, 1.0))
            if node.bookie is bookie and node.up:
                self._crash(node)
                node.start()
                self.history.add("nemesis", "restart", value=node.name)
        else:
            bookie.storage_failing = True
            self.history.add("nemesis", "eio", value=f"ledger storage of {node.name}")
            await asyncio.sleep(rng.uniform(0.05, 1.0))
            bookie.storage_failing = False
            self.history.add("nemesis", "heal", value=f"ledger storage of {node.name}")

    async def _full(self, node: BookieNode, rng: random.Random) -> None:
        """``node``'s disk fills up: read-only (re-registered as such, as ``bookie/bookie.py``
        with ``readOnlyModeEnabled``) for a while, then space is freed and it is writable."""
        if node.disk.full:
            return
        self.injected["full"] += 1
        self._set_full(node, True)
        await asyncio.sleep(rng.uniform(0.1, 1.5))
        self._set_full(node, False)

    def _set_full(self, node: BookieNode, full: bool) -> None:
        node.disk.full = full
        self.store.registration.register_bookie(BookieId(node.name), read_only=full)
        self.history.add("nemesis", "full" if full else "writable", value=node.name)

    def _clock_jump(self, rng: random.Random) -> None:
        """A clock jump. Half the time the wall clock (``time.time`` as the client reads it; NTP
        stepping it) jumps forward or back by up to an hour; else every process is suspended for
        a while (a paused host): the monotonic clock (the loop's) jumps forward and every timer
        that came due meanwhile fires late, at once, in deadline order."""
        self.injected["clock"] += 1
        if rng.random() < 0.5:
            step = rng.choice((-1.0, 1.0)) * rng.uniform(1.0, 3600.0)
            self.wall_offset += step
            self.history.add("nemesis", "clock", value=f"wall clock {step:+.1f} s")
        else:
            pause = rng.uniform(0.1, 2.0)
            self.history.add("nemesis", "clock", value=f"suspended {pause:.2f} s")
            self.loop.jump(pause)

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
        self.injected["corrupt"] += 1
        self.history.add("nemesis", "corrupt", lid, eid, node.name)

    def heal_everything(self) -> None:
        self.net.heal()
        self.net.faults = replace(self.calm)
        for node in self.nodes:
            if node.disk.full:
                self._set_full(node, False)
            if node.bookie is not None and node.up and node.bookie.storage_failing:
                node.bookie.storage_failing = False
                self.history.add("nemesis", "heal", value=f"ledger storage of {node.name}")
            if node.bookie is not None and node.up and node.bookie.journal_error is not None:
                self._crash(node)  # the operator restarts the failed bookie (below)
            if not node.up:
                node.start()
                self.history.add("nemesis", "restart", value=node.name)


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


@contextlib.contextmanager
def wall_clock_of(world: World) -> Iterator[None]:
    """The client reads ``world``'s wall clock (``World.wall_time``, which the ``clock`` fault
    jumps) instead of the host's, for the length of the block: a seed never reads the host's
    clock."""
    host = client_bookkeeper._wall_clock
    client_bookkeeper._wall_clock = world.wall_time
    try:
        yield
    finally:
        client_bookkeeper._wall_clock = host


def run_seed(seed: int, options: SimOptions | None = None) -> RunResult:
    """Simulate one seed (see the module docstring)."""
    options = options or SimOptions()
    with _seeded_globals(seed, options.flags):
        world = World(seed, options)
        loop = world.loop
        loop.set_exception_handler(lambda _loop, _ctx: None)  # unretrieved failures of abandoned work
        workload = Workload(world, options.shape)
        error = None
        with wall_clock_of(world):
            try:
                loop.run_until_complete(_main(world, workload))
            except SimQuiescent as e:
                error = f"the simulation stopped: {e}"
            except Exception as e:  # a bug of the simulator or of the code under test
                error = f"{type(e).__name__}: {e}"
            except KeyboardInterrupt:  # a campaign stopped by hand: leave no half-run world behind
                _drain(loop)
                raise
            virtual = loop.time() - 1000.0
            _drain(loop)
        internal = sum(node.internal_errors for node in world.nodes)
        if internal and error is None:
            error = (f"the request path answered EINTERNAL {internal} time(s): an unexpected exception in the "
                     "code under test or the simulated bookie (replay the seed with the vellum logger on)")
        final_ends, leftovers = workload.final_ends, workload.leftover_deleted
        violations = check(world.history, final_ends=final_ends, leftover_deleted=leftovers,
                           placements=workload.placements)
        fp = hashlib.blake2b(digest_size=8)
        for ev in world.history.events:
            if ev.kind not in TRACE_KINDS:
                fp.update(ev.describe().encode())
        injected = dict(world.injected)
        for counter, kind in _NET_FAULTS.items():
            if world.net.counts.get(counter):
                injected[kind] = world.net.counts[counter]
        if "delay" in options.faults:
            injected["delay"] = 1
        return RunResult(seed, violations, workload.operations, virtual, len(world.history.events), fp.hexdigest(),
                         dict(world.net.counts), error,
                         sum(1 for ev in world.history.events if ev.kind == "ack"),
                         world.history if options.trace else None, injected)


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


__all__ = ["DEFAULT_FAULTS", "FAULT_KINDS", "FAULT_MODES", "REGRESSIONS", "SCENARIOS", "RunResult", "SimOptions", "World", "run_seed",
           "wall_clock_of"]
