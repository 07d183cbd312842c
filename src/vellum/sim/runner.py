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
import shutil
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from vellum.autorecovery import auditor as ar_auditor
from vellum.autorecovery import copier as ar_copier
from vellum.autorecovery import worker as ar_worker
from vellum.bookie import integrity as bookie_integrity
from vellum.client import bookkeeper as client_bookkeeper
from vellum.client import ledger_writer as client_ledger_writer
from vellum.client import metadata_update as client_metadata_update
from vellum.client import recovery as client_recovery
from vellum.client.bookkeeper import BookKeeper
from vellum.client.placement import DefaultPlacementPolicy
from vellum.config import ClientConfig
from vellum.errors import MetadataStoreUnavailableError
from vellum.meta.model import LedgerMetadata
from vellum.server import processors as server_processors
from vellum.sim.autorecovery import SimAutoRecovery, replicas, virtual_clock
from vellum.sim.bookie import SimBookie
from vellum.sim.checker import Placement, Violation, check
from vellum.sim.history import History, describe_rows
from vellum.sim.loop import SimLoop, SimQuiescent
from vellum.sim.metadata import SimMetadataStore
from vellum.sim.named_workload import NamedWorkload, named_clock
from vellum.sim.network import NetFaults, SimNetwork, current_node
from vellum.sim.node import BookieNode
from vellum.sim.real_bookie import PageCache, RealSimBookie, remove_scratch, scratch_root
from vellum.sim.workload import Workload, WorkloadShape
from vellum.storage import cookies as storage_cookies
from vellum.storage import ledger_data as storage_ledger_data
from vellum.storage import storage_upkeep

log = logging.getLogger(__name__)

#: the fault kinds ``--faults`` takes (``all``: every one of them)
FAULT_KINDS = ("delay", "drop", "dup", "reorder", "partition", "crash", "slow", "meta", "corrupt", "expiry",
               "torn", "eio", "full", "clock", "rack")
#: modes ``--faults`` also takes but ``all`` never includes: ``lying-fsync`` (every disk
#: acknowledges fsync without persisting) breaks durability on purpose, so the checker must fail
#: ``wipe`` (real bookie only): a crashed bookie's journal and ledger dirs are emptied before
#: its restart (once a run, on a run with no bookie lost for good)
#: ``limbo`` (real bookie only): the bookies run with ``dataIntegrityChecking``, and the ``wipe``
#: fault is on: a wiped bookie starts with the ledgers it may have held limbo ("unknown", never
#: "no such entry") and copies them back from the other replicas
FAULT_MODES = ("lying-fsync", "wipe", "limbo")
#: what a run injects unless told otherwise (``meta``: metadata writes that fail, ``corrupt``: a
#: crash that leaves a bad stored entry behind, ``expiry``: metadata sessions that expire,
#: ``torn``, ``eio``, ``full`` and ``clock``: the disk and clock faults, ``rack``: a power loss of
#: 2 or 3 bookies at once, are opt-in)
DEFAULT_FAULTS = frozenset(FAULT_KINDS) - {"meta", "corrupt", "expiry", "torn", "eio", "full", "clock", "rack"}
#: the nemesis's kinds, in the order its generator picks among them (a kind not asked for is
#: left out, so the default mix draws as it did before the disk and clock faults existed)
_NEMESIS_KINDS = ("crash", "partition", "slow", "torn", "eio", "full", "clock", "rack")
#: what the wall clock reads at virtual time 0 (2026-01-01T00:00:00Z): a run never reads the host's
_WALL_EPOCH = 1_767_225_600.0
#: the network's counters (``SimNetwork.counts``) that say a seed hit a fault kind
_NET_FAULTS = {"dropped": "drop", "duplicated": "dup", "reordered": "reorder"}
#: the metadata-store writes whose reply (or request) the ``meta`` fault loses (ledgers, and
#: AutoRecovery's records)
_META_WRITES = frozenset({"create_ledger", "create_ledger_with_id", "write_ledger", "delete_ledger",
                          "mark_under_replicated", "mark_replicated", "release_ledger"})


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
    #: run AutoRecovery (``sim/autorecovery.py``: auditor and replication workers) during the run
    #: and after the final phase until it settles
    autorecovery: bool = True
    #: judge ``under-replicated`` (None: when AutoRecovery runs; True without it: the promise
    #: fails where it is needed)
    judge_replicas: bool | None = None
    #: chance that a run with crashes loses one bookie for good in its middle (AutoRecovery then
    #: re-replicates its ledgers); only where ``under-replicated`` is judged
    lose_bookie: float = 0.5
    #: what stands below the request path (``BOOKIE_KINDS``): the model (``sim/bookie.py``) or
    #: the real bookie and its storage on files (``sim/real_bookie.py``)
    bookie: str = "model"
    #: with the real bookie: the share of crashes that are power losses (the bytes its journals
    #: and entry logs wrote but did not fsync are lost too)
    power_loss: float = 0.0
    #: with the real bookie: check the master key of a ledger a bookie has not seen against its
    #: metadata (``ledgerMasterKeyCheck``); off, as a bookie port without authentication runs
    #: (``auto``), a deleted ledger's tombstone alone refuses a stale writer's adds
    master_key_check: bool = True
    #: run the named-ledger actor too (``sim/named_workload.py``: appends, rollovers and shrinks of
    #: a few names through ``client/named.py``, judged by ``named-lost`` and ``named-order``)
    named: bool = False


#: the bookie kinds ``--bookie`` takes
BOOKIE_KINDS = ("model", "real")
#: fault kinds the real bookie does not take: they act on the model's disk (a torn group, a
#: failing disk); the real bookie's torn and lost writes come from ``power_loss`` and ``rack``
#: (``corrupt`` flips a byte of a stored entry in its entry logs, ``full`` makes its disk checker
#: see a full disk, ``lying-fsync`` makes its page cache forget nothing at an fsync)
MODEL_ONLY_FAULTS = frozenset({"torn", "eio"})

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
    "avoid-bad-fragment-bookies": "a replication worker avoids, as copy targets, registered bookies that miss "
                                  "entries of another segment of the ledger: two of them block each other",
    "stop-at-unhealable-fragment": "a replication worker gives up on a ledger at its first fragment no bookie may "
                                   "take, leaving the fragments it could replace unhealed",
    "start-wiped-bookie": "a bookie whose every disk was wiped starts empty although the metadata store holds its "
                          "cookie (defect D1, rule 6 of docs/correctness.md; with the fault wipe)",
    "no-delete-tombstone": "a ledger the bookie's GC deletes leaves no fenced tombstone in its storage's index, "
                           "and journal replay skips nothing (defect D2: a write after delete acknowledged)",
    "serve-unchecked-reads": "the real bookie serves an entry read from an entry log without its keyless CRC "
                             "check (defect D5; with the fault corrupt no seed fails: the client's digest "
                             "check rejects the bad copy)",
    "copy-only-from-other-replicas": "a replication worker reads an entry only from the other bookies of its write "
                                     "set, never from the bookie it replaces, which may hold its only copy",
    "take-back-at-once": "a writer with no never-failed spare takes back a bookie that failed a write of the ledger "
                         "however recently: among bookies that are down but still registered, it changes its "
                         "ensemble in a loop that never waits (a livelock; with the fault rack)",
    "limbo-answers-no-entry": "a limbo ledger's read of an entry the bookie lacks answers 'no such entry' instead "
                              "of 'unknown' (rule 12 of docs/correctness.md; with the mode limbo)",
    "future-audit-time": "a newly elected auditor waits out a stored audit time ahead of its wall clock (a clock "
                         "stepped back): its first ledger check comes the step later (with the fault clock)",
}


#: each flag of ``REGRESSIONS``: the module-level switch that holds its fix, and the value that
#: reverts it (the switch's shipped value keeps the fix)
_FLAG_SWITCHES: dict[str, tuple[Any, str, bool]] = {
    "no-fencing-recovery-reads": (client_recovery, "_fence_recovery_reads", False),
    "persist-recovery-segments": (client_metadata_update, "_defer_recovery_segments", False),
    "ignore-late-write-failures": (client_ledger_writer, "_replace_after_ack", False),
    "avoid-bad-fragment-bookies": (ar_worker, "_avoid_registered_bad_bookies", True),
    "stop-at-unhealable-fragment": (ar_worker, "_stop_at_unhealable_fragment", True),
    "copy-only-from-other-replicas": (ar_copier, "_read_from_replaced_bookie", False),
    "start-wiped-bookie": (storage_cookies, "_refuse_wiped_bookie", False),
    "no-delete-tombstone": (storage_upkeep, "_leave_tombstone", False),
    "serve-unchecked-reads": (storage_ledger_data, "_check_reads", False),
    "take-back-at-once": (client_ledger_writer, "_wait_before_take_back", False),
    "limbo-answers-no-entry": (bookie_integrity, "_answer_unknown", False),
    "future-audit-time": (ar_auditor, "_clamp_future_audit_time", False),
}
assert _FLAG_SWITCHES.keys() == REGRESSIONS.keys()


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


@contextlib.contextmanager
def _seeded_globals(seed: int, flags: frozenset[str]) -> Iterator[None]:
    state = random.getstate()
    random.seed(seed ^ 0x5EED)
    # A regression flag turns its fix off; without it the code runs as shipped (so a fix removed
    # from the code is caught by the seeds too).
    saved = [(module, name, getattr(module, name)) for module, name, _reverted in _FLAG_SWITCHES.values()]
    for flag in flags:
        module, name, reverted = _FLAG_SWITCHES[flag]
        setattr(module, name, reverted)
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
        for module, name, value in saved:
            setattr(module, name, value)
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
        for mode in sorted(options.faults & {"wipe", "limbo"}):
            if options.bookie != "real":
                raise ValueError(f"the fault {mode} needs the real bookie (--bookie real): the model has no cookies "
                                 "and no limbo")
        if options.bookie == "real" and "lying-fsync" in options.faults and not (
                "rack" in options.faults or (options.power_loss and "crash" in options.faults)):
            raise ValueError("a lying fsync loses what it acknowledged only at a power loss, and the real bookie "
                             "loses power only with the fault rack or --power-loss with crash: add one")
        if options.bookie == "real" and options.faults & MODEL_ONLY_FAULTS:
            raise ValueError(f"the real bookie does not take the fault(s) "
                             f"{', '.join(sorted(options.faults & MODEL_ONLY_FAULTS))} (they act on the model's "
                             "disk only; the real bookie's torn and lost writes come from power_loss): leave them "
                             "out of --faults")
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
                              self.history if options.trace else None, home, check_keys=options.master_key_check,
                              integrity="limbo" in faults)
            node.report = functools.partial(self._bookie_event, node.name)
            self.nodes.append(node)
            self.net.add_server(node)
        self.clients: list[BookKeeper] = []
        #: the metadata sessions of the clients and the AutoRecovery daemons, by actor
        self.sessions: dict[str, SimMetadataStore] = {}
        # The additions' own generators (seeded by name: drawing from ``rng`` would move every
        # choice made after them)
        self._expiry_rng = random.Random(f"expiry/{seed}")
        self._wipe_rng = random.Random(f"wipe/{seed}")
        #: the bookie the ``wipe`` fault emptied (one a run)
        self.wiped: BookieNode | None = None
        self.autorecovery: SimAutoRecovery | None = None
        #: what ``under-replicated`` judges: where each ledger's entries are at the end (None: not
        #: judged), and whether AutoRecovery settled (None: it did not run)
        self.replicas: dict[int, Placement] | None = None
        self.settled: bool | None = None
        if options.autorecovery:
            self.autorecovery = SimAutoRecovery(self.store, self.history, random.Random(f"autorecovery/{seed}"),
                                                replicas_check="corrupt" in faults)
        self.store.cluster.on_record = lambda kind, lid, value: self.history.add("metadata", kind, lid, value=value)
        if "expiry" in faults:
            rng = self._expiry_rng
            self.store.cluster.watch_delay = lambda: rng.uniform(0.0, 0.1)
        #: entries with a bad copy on some bookie (the ``corrupt`` fault)
        self._corrupted: set[tuple[int, int]] = set()
        #: fault kind -> injections (``RunResult.injected``)
        self.injected: Counter[str] = Counter()
        if "lying-fsync" in faults:
            for node in self.nodes:
                node.disk.lies = True
                if node.page_cache is not None:  # the real bookie: a power loss takes back synced bytes too
                    node.page_cache.lies = True
        #: what the wall clock (``time.time`` as the client sees it) is ahead of virtual time: the
        #: ``clock`` fault jumps it forward and back
        self.wall_offset = 0.0

    def _restart(self, node: BookieNode) -> None:
        """Start ``node``'s process again (a restart event in the history; with ``limbo``, a
        start that marked ledgers limbo counts as an injection of it)."""
        node.start()
        self.history.add("nemesis", "restart", value=node.restarted)
        if isinstance(node.bookie, RealSimBookie) and node.bookie.alive and node.bookie.limbo_marked:
            self.injected["limbo"] += 1

    def _bookie_event(self, name: str, kind: str, value: str) -> None:
        self.history.add(name, kind, value=value)

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
            blocked = self.store.take_block()
            if blocked is not None:  # a call that blocks (wait_for_work): answered on a change
                self.store.wake_after(blocked, lambda: finish(result))
            else:
                finish(result)

        def finish(result: object) -> None:
            if fut.done():
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
        session = self.sessions[name] = self.store.session(name)
        try:
            bk = BookKeeper(config=_client_config(self.rng, explicit_lac_ms), store=session,
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
                self._crash(node, rng if kind == "torn" else None, rng)
                if "corrupt" in faults and rng.random() < 0.5:
                    self._corrupt_one(node, rng)
                if "wipe" in faults or "limbo" in faults:
                    self._wipe(node)
                await asyncio.sleep(rng.uniform(0.01, 1.0))
                self._restart(node)
            elif kind == "eio":
                await self._eio(node, rng)
            elif kind == "full":
                await self._full(node, rng)
            elif kind == "clock":
                self._clock_jump(rng)
            elif kind == "rack":
                await self._rack(rng)
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
            pending = [n for n in self.nodes if n.up and isinstance(n.bookie, SimBookie) and n.bookie.pending_records]
            if pending:
                return rng.choice(pending)
            await asyncio.sleep(rng.uniform(0.0005, 0.003))
        return None

    async def _rack(self, rng: random.Random) -> None:
        """The ``rack`` fault: the power of 2 or 3 bookies (of those up) goes at once; each loses
        what it had not synced (the real bookie: a power loss, whatever ``power_loss`` says), and
        they come back together after a while (a bookie lost for good meanwhile stays down)."""
        up = [n for n in self.nodes if n.up]
        if len(up) < 2:
            return
        rack = rng.sample(up, rng.randint(2, min(3, len(up))))
        self.injected["rack"] += 1
        self.history.add("nemesis", "rack", value=" ".join(n.name for n in rack))
        for node in rack:
            self._crash(node, power=True)
        await asyncio.sleep(rng.uniform(0.01, 1.0))
        for node in rack:
            if not node.up and not node.lost:
                self._restart(node)

    def _crash(self, node: BookieNode, torn: random.Random | None = None, rng: random.Random | None = None,
               *, power: bool = False) -> None:
        """Kill ``node``'s process. Model (a power cut: what was not synced is lost): ``torn``, a
        seeded prefix (drawn from its generator) of the unsynced journal records survives (the
        group was partly on the disk; replay stops at the first bad record, so the next one is
        torn and discarded). Real bookie: kill -9, and with ``power_loss``'s share (drawn from
        ``rng``) a power loss too."""
        assert node.bookie is not None
        if isinstance(node.bookie, RealSimBookie):
            if not power:
                power = self.options.power_loss > 0 and rng is not None and rng.random() < self.options.power_loss
            assert node.page_cache is not None
            lied = node.page_cache.lied_files if power else 0
            indexed = node.page_cache.index.lost_writes
            node.crash(power_loss=power)
            self.injected["crash"] += 1
            lost = node.page_cache.index.lost_writes - indexed  # RocksDB writes no WAL sync covered
            self.history.add("nemesis", "crash", value=f"{node.name} (power loss): {lost} index writes lost"
                             if power else node.name)
            if lied:
                self.injected["lying-fsync"] += 1
                self.history.add("nemesis", "fsync-lied",
                                 value=f"{node.name}: {lied} files lost bytes their fsync had acknowledged")
            return
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

    def _wipe(self, node: BookieNode) -> None:
        """The ``wipe`` fault: half the time, a crashed real bookie's disks are replaced by empty
        ones (its journal and ledger dirs emptied, cookies too) before its restart; once a run, and
        not on a run that lost a bookie for good (two bookies without their data are a double
        fault). With its cookie check the restart is refused and the bookie stays down."""
        if self.wiped is not None or any(n.lost for n in self.nodes) or node.home is None:
            return
        if self._wipe_rng.random() >= 0.5:
            return
        self.wiped = node
        for sub in ("journal", "ledgers"):
            shutil.rmtree(node.home / sub, ignore_errors=True)
        # what the old disks held in the page cache went with them
        node.page_cache = PageCache(lies=node.page_cache is not None and node.page_cache.lies)
        self.injected["wipe"] += 1
        self.history.add("nemesis", "wipe", value=node.name)

    async def _eio(self, node: BookieNode, rng: random.Random) -> None:
        """An I/O error on ``node``'s disk for a while. Half the time its journal: fail-stop, as
        ``storage/journal.py`` (every pending and later add and fence answered EIO, reads still
        served, registered read-only) until the process is restarted, as an operator would; else its ledger storage's
        flushes: adds refused with back-pressure while they fail, nothing lost."""
        bookie = node.bookie
        if not isinstance(bookie, SimBookie) or not node.up:  # a model-only fault (MODEL_ONLY_FAULTS)
            return
        self.injected["eio"] += 1
        if rng.random() < 0.5:
            failed = bookie.fail_journal("write failed")
            self.history.add("nemesis", "eio", value=f"journal of {node.name} ({failed} pending records failed)")
            # as ``bookie/bookie.py``: a failed journal turns the bookie read-only until restarted
            node.register_as(read_only=True)
            await asyncio.sleep(rng.uniform(0.05, 1.0))
            if node.bookie is bookie and node.up:
                self._crash(node)
                self._restart(node)
        else:
            bookie.storage_failing = True
            self.history.add("nemesis", "eio", value=f"ledger storage of {node.name}")
            await asyncio.sleep(rng.uniform(0.05, 1.0))
            bookie.storage_failing = False
            self.history.add("nemesis", "heal", value=f"ledger storage of {node.name}")

    async def _full(self, node: BookieNode, rng: random.Random) -> None:
        """``node``'s disk fills up: read-only (re-registered as such, as ``bookie/bookie.py``
        with ``readOnlyModeEnabled``) for a while, then space is freed and it is writable."""
        if node.disk.full or not node.up:  # a dead process neither fills its disk nor registers
            return
        self.injected["full"] += 1
        self._set_full(node, True)
        await asyncio.sleep(rng.uniform(0.1, 1.5))
        self._set_full(node, False)

    def _set_full(self, node: BookieNode, full: bool) -> None:
        node.disk.full = full
        if node.home is not None:
            # the real bookie: its disk checker sees it, and its state listener registers it
            node.check_disks()
        else:
            node.register_as(read_only=full)
        self.history.add("nemesis", "full" if full else "writable", value=node.name)

    def _clock_jump(self, rng: random.Random) -> None:
        """A clock jump. Half the time the wall clock (``time.time`` as the client and AutoRecovery
        read it; NTP stepping it) jumps forward or back by up to an hour; else every process is suspended for
        a while (a paused host): the monotonic clock (the loop's) jumps forward and every timer
        that came due meanwhile fires late, at once, in deadline order."""
        self.injected["clock"] += 1
        if rng.random() < 0.5:
            step = rng.choice((-1.0, 1.0)) * rng.uniform(1.0, 3600.0)
            self.wall_offset += step
            self.store.cluster.wall_offset += step  # AutoRecovery's wall clock, and the store's stamps
            self.history.add("nemesis", "clock", value=f"wall clock {step:+.1f} s")
        else:
            pause = rng.uniform(0.1, 2.0)
            self.history.add("nemesis", "clock", value=f"suspended {pause:.2f} s")
            self.loop.jump(pause)

    def _corrupt_one(self, node: BookieNode, rng: random.Random) -> None:
        """A stored entry of ``node`` goes bad (torn or rotten): one copy per entry at most, so
        every acknowledged entry keeps a good copy (two bad copies would be a double fault). The
        real bookie: a byte of it flipped in its entry logs (``BookieNode.rot_entry``)."""
        gone = self._held_by_lost()  # a copy on a bookie lost for good is a bad copy too
        if node.home is not None:  # the real bookie: a byte of its entry logs
            picked = node.rot_entry(rng, lambda lid, eid: (lid, eid) not in self._corrupted and (lid, eid) not in gone)
            if picked is not None:
                self._corrupted.add(picked)
                self.injected["corrupt"] += 1
                self.history.add("nemesis", "corrupt", picked[0], picked[1], node.name)
            return
        candidates = [(lid, eid) for lid, rec in sorted(node.disk.ledgers.items()) if not rec.deleted
                      for eid in sorted(rec.entries) if (lid, eid) not in self._corrupted and (lid, eid) not in gone]
        if not candidates:
            return
        lid, eid = rng.choice(candidates)
        self._corrupted.add((lid, eid))
        node.disk.corrupt.add((lid, eid))
        self.injected["corrupt"] += 1
        self.history.add("nemesis", "corrupt", lid, eid, node.name)

    async def expiries(self) -> None:
        """The ``expiry`` fault: now and then the metadata session of one client, AutoRecovery
        daemon or bookie expires; it is back, a new session, after an outage of up to a second."""
        rng = self._expiry_rng
        while True:
            await asyncio.sleep(rng.uniform(0.5, 3.0))
            sessions = sorted(self.sessions.items()) + [(n.name, n.session) for n in self.nodes
                                                        if n.session is not None]
            name, session = rng.choice(sessions)
            outage = rng.uniform(0.05, 1.0)
            if session.expire(outage):
                self.history.add("nemesis", "expire", value=f"{name} for {outage * 1000:.0f} ms")

    async def lose_bookie(self) -> None:
        """With ``lose_bookie``'s chance (and crashes among the faults): one bookie crashes in the
        middle of the run and never comes back, so AutoRecovery has its ledgers to re-replicate."""
        rng = random.Random(f"lose-bookie/{self.seed}")
        if "crash" not in self.options.faults or rng.random() >= self.options.lose_bookie:
            return
        await asyncio.sleep(rng.uniform(0.1, 2.5))  # while the writer writes (a run's writes take seconds)
        if self.wiped is not None:  # a wiped bookie is down for good already: not a second one
            return
        # one bad copy per entry at most: not a bookie holding an entry that went bad elsewhere
        candidates = [n for n in self.nodes if n.up and not any(
            (lid, e) in self._corrupted for lid, rec in n.disk.ledgers.items() for e in rec.entries)
            and not any(e in n.held_entries(lid) for lid, e in self._corrupted)]
        if not candidates:
            return
        node = rng.choice(candidates)
        node.lost = True
        if node.home is not None:
            node.lost_copies = frozenset((int(lid), e) for r in self.store.ledgers.ledger_ranges()
                                         for lid in r.ledger_ids for e in node.held_entries(int(lid)))
        node.crash()
        self.history.add("nemesis", "lost-for-good", value=node.name)

    def _held_by_lost(self) -> set[tuple[int, int]]:
        return {(lid, e) for n in self.nodes if n.lost for lid, rec in n.disk.ledgers.items() for e in rec.entries} \
            | {c for n in self.nodes if n.lost for c in n.lost_copies}

    def heal_everything(self) -> None:
        self.net.heal()
        self.net.faults = replace(self.calm)
        if self.autorecovery is not None:
            # AutoRecovery's settling is a liveness promise: the network behaves as TCP from here
            reset = self.net.reset_lossy()
            if reset:
                self.history.add("nemesis", "reset-lossy", value=reset)
        for node in self.nodes:
            if node.disk.full:
                self._set_full(node, False)
            if isinstance(node.bookie, SimBookie) and node.up and node.bookie.storage_failing:
                node.bookie.storage_failing = False
                self.history.add("nemesis", "heal", value=f"ledger storage of {node.name}")
            if isinstance(node.bookie, SimBookie) and node.up and node.bookie.journal_error is not None:
                self._crash(node)  # the operator restarts the failed bookie (below)
            if not node.up and not node.lost:
                self._restart(node)


SCENARIOS["default"] = SimOptions()
SCENARIOS["fence-race"] = SimOptions(
    faults=frozenset({"delay", "drop", "reorder"}), drop=0.15, reorder=0.05, delay_max_s=0.005, slow=0.1,
    autorecovery=False,
    shape=WorkloadShape(ledgers=8, entries=(15, 30), window=4, shapes=((3, 3, 3),), recover_delay_s=(0.01, 0.2),
                        close_probability=0.0, delete_probability=0.0, reader_polls=2))
# A bookie that goes silent while the others keep the ack quorum: E=WQ=3, AQ=2 on five bookies
# (spares for every replacement), partitions and slow links, no crashes or lost writes (a bookie
# misses entries only while cut off); the writer waits 2 s (longer than any add timeout) before it
# closes, the recoverer opens a ledger only after that. ``not-replaced`` judges every ledger.
SCENARIOS["silent-bookie"] = SimOptions(
    faults=frozenset({"delay", "partition", "slow"}), autorecovery=False,
    shape=WorkloadShape(ledgers=2, entries=(40, 80), shapes=((3, 3, 2),), recover_delay_s=(4.0, 5.0),
                        close_probability=1.0, delete_probability=0.0, reader_polls=10,
                        quiet_before_close_s=2.0))
# A writer that stalls (a long GC pause) halfway through each ledger while the recoverer recovers
# and deletes it and the bookies' GC removes it, then adds on with its old handle. Meant for the
# real bookie (``--bookie real``) without ``ledgerMasterKeyCheck`` (a bookie port without
# authentication): the deleted ledger's tombstone alone must refuse the stale adds
# (``written-after-delete``). Some ledgers stay (a GC pass deletes nothing while none is listed).
SCENARIOS["stale-writer"] = SimOptions(
    autorecovery=False, master_key_check=False,
    shape=WorkloadShape(ledgers=3, entries=(20, 40), recover_delay_s=(0.1, 0.6), close_probability=0.0,
                        delete_probability=0.6, reader_polls=5, writer_pause_s=6.0))
# Crashed bookies whose disks are wiped (``wipe``, real bookie only): more ledgers with an ack
# quorum below their write quorum, recovered later and rarely deleted, so a wiped bookie's empty
# answers meet recoveries (the cookie check keeps it down; without it, ``ack-lost``).
SCENARIOS["wiped-bookie"] = SimOptions(
    faults=DEFAULT_FAULTS | {"wipe"}, autorecovery=False,
    shape=WorkloadShape(ledgers=4, entries=(20, 40), shapes=((3, 3, 2), (3, 2, 2), (4, 3, 2)),
                        recover_delay_s=(0.3, 1.5), close_probability=0.3, delete_probability=0.0))
# Named ledgers under the default faults: the named-ledger actor (``sim/named_workload.py``) beside
# a smaller plain workload (``--named`` adds the actor to any scenario).
SCENARIOS["named"] = SimOptions(named=True, shape=WorkloadShape(ledgers=2, entries=(10, 30), reader_polls=15))
SCENARIOS["tailing"] = SimOptions(
    shape=WorkloadShape(ledgers=2, entries=(20, 50), long_poll=True, explicit_lac_ms=50, reader_polls=40))


@contextlib.contextmanager
def wall_clock_of(world: World) -> Iterator[None]:
    """The code under test reads ``world``'s clocks instead of the host's, for the length of the
    block: the client's wall clock (``World.wall_time``, which the ``clock`` fault jumps) and the
    request path's rate-limited log lines (the loop's monotonic clock), so a seed never reads the
    host's clock (AutoRecovery's are ``sim/autorecovery.py``'s ``virtual_clock``; the real
    bookie's come through its ``BookieRuntime``)."""
    host = client_bookkeeper._wall_clock, server_processors._monotonic
    client_bookkeeper._wall_clock = world.wall_time
    server_processors._monotonic = world.loop.time
    try:
        yield
    finally:
        client_bookkeeper._wall_clock, server_processors._monotonic = host


def run_seed(seed: int, options: SimOptions | None = None) -> RunResult:
    """Simulate one seed (see the module docstring)."""
    options = options or SimOptions()
    with _seeded_globals(seed, options.flags), contextlib.ExitStack() as clocks:
        world = World(seed, options)
        clocks.enter_context(virtual_clock(world.loop, world.store.cluster.wall_s))
        clocks.enter_context(named_clock(world.wall_time))
        loop = world.loop
        loop.set_exception_handler(lambda _loop, _ctx: None)  # unretrieved failures of abandoned work
        workload = Workload(world, options.shape)
        named = NamedWorkload(world.client, world.history, random.Random(f"named/{seed}")) if options.named else None
        error = None
        with wall_clock_of(world):
            try:
                loop.run_until_complete(_main(world, workload, named))
            except SimQuiescent as e:
                error = f"the simulation stopped: {e}"
            except Exception as e:  # a bug of the simulator or of the code under test
                error = f"{type(e).__name__}: {e}"
            except KeyboardInterrupt:  # a campaign stopped by hand: leave no half-run world behind
                _drain(loop)
                raise
            virtual = loop.time() - 1000.0
            _drain(loop)
        for node in world.nodes:
            node.dispose()
        if world.scratch is not None:
            remove_scratch(world.scratch)
        internal = sum(node.internal_errors for node in world.nodes)
        if internal and error is None:
            error = (f"the request path answered EINTERNAL {internal} time(s): an unexpected exception in the "
                     "code under test or the simulated bookie (replay the seed with the vellum logger on)")
        storage_errors = [e for node in world.nodes for e in node.storage_errors]
        if storage_errors and error is None:
            error = f"the real bookie's storage failed: {storage_errors[0]} ({len(storage_errors)} failure(s))"
        final_ends, leftovers = workload.final_ends, workload.leftover_deleted
        violations = check(world.history, final_ends=final_ends, leftover_deleted=leftovers,
                           placements=workload.placements, replicas=world.replicas,
                           up_at_end=frozenset(n.name for n in world.nodes if not n.lost),
                           settled=world.settled)
        if named is not None:
            violations += named.check()
        # one update of the rows joined: the same digest as one update a row, fewer calls
        fp = hashlib.blake2b(describe_rows(world.history.events, TRACE_KINDS).encode(), digest_size=8)
        injected = dict(world.injected)
        for counter, kind in _NET_FAULTS.items():
            if world.net.counts.get(counter):
                injected[kind] = world.net.counts[counter]
        if "delay" in options.faults:
            injected["delay"] = 1
        operations = workload.operations + (named.operations if named is not None else 0)
        return RunResult(seed, violations, operations, virtual, len(world.history.events), fp.hexdigest(),
                         dict(world.net.counts), error,
                         sum(1 for ev in world.history.events if ev.kind == "ack"),
                         world.history if options.trace else None, injected)


async def _main(world: World, workload: Workload, named: NamedWorkload | None = None) -> None:
    autorecovery = world.autorecovery
    if autorecovery is not None:
        autorecovery.start()
        world.sessions.update(autorecovery.sessions)
    faults = [asyncio.ensure_future(world.nemesis())]
    started = world.loop.time()
    named_run = asyncio.ensure_future(named.run()) if named is not None else None
    judge = world.options.judge_replicas
    if autorecovery is not None or judge:
        faults.append(asyncio.ensure_future(world.lose_bookie()))
    if "expiry" in world.options.faults:
        faults.append(asyncio.ensure_future(world.expiries()))
    try:
        await workload.run(world.options.run_s)
        if named_run is not None:  # the named actor's sessions, within the run's time
            await asyncio.wait([named_run], timeout=max(0.0, started + world.options.run_s - world.loop.time()))
    finally:
        if named_run is not None:
            named_run.cancel()
        for f in faults:
            f.cancel()
    world.heal_everything()
    if named is not None:
        await named.final_phase()
        named.hand_over(workload, world.store)  # its segments: judged as the plain ledgers too
    await workload.final_phase()
    if autorecovery is not None:
        world.settled = await autorecovery.settle(world.loop.time(), set(workload.final_ends))
        await autorecovery.stop()
    if judge or (judge is None and autorecovery is not None):
        world.replicas = replicas(world.store, world.nodes, workload.ledgers)


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


__all__ = ["BOOKIE_KINDS", "DEFAULT_FAULTS", "FAULT_KINDS", "FAULT_MODES", "MODEL_ONLY_FAULTS", "REGRESSIONS", "SCENARIOS", "RunResult",
           "SimOptions", "World", "run_seed", "wall_clock_of"]
