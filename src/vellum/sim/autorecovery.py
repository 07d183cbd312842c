"""AutoRecovery in the simulator: the real auditor and replication workers (``vellum.autorecovery``)
as nodes of the simulated network, on virtual time, and what the ``under-replicated`` promise
judges once they settle.

Responsibility: start ``AutoRecovery`` daemons (each its own metadata session and ``BookKeeper``,
so its own ``BookieClient`` connections, the network node ``autorecovery-N``) with settings sized
for a run of tens of virtual seconds; restart one whose run ended with an error (a process
supervisor's part: e.g. its session was expired while it started); lose one bookie for good in
the middle of a run (``lose_bookie``) so that its ledgers need re-replication; wait, after the
final phase, until AutoRecovery settled (``settle``); and say where every entry of every ledger
is at the end (``replicas``).

The clock: the auditor, the worker, the copier, the cannot-heal records and the copier's pacing
read ``time.monotonic()`` and ``time.time()`` (the lost-bookie delay, the check intervals against
the stored audit times, retries and back-offs, the open-ledger grace period against a record's
ctime). ``virtual_clock`` gives those modules the loop's virtual clock for the length of a run
and restores them after: the loop's time for the monotonic clock (a suspended host jumps it), and
for the wall clock the store's (``SimCluster.wall_s``: ``EPOCH_S`` + loop time + the steps of the
``clock`` fault; the store stamps records with the same clock, as the marking process would).

Invariants: every random choice comes from the generator handed in; a daemon's failure is an
event of the history, never an exception out of the run; every wait is bounded in virtual time.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import TYPE_CHECKING, Protocol

from vellum.autorecovery import auditor as ar_auditor
from vellum.autorecovery import cannot_heal as ar_cannot_heal
from vellum.autorecovery import copier as ar_copier
from vellum.autorecovery import pacing as ar_pacing
from vellum.autorecovery import worker as ar_worker
from vellum.autorecovery.cannot_heal import KEY_PREFIX as CANNOT_HEAL_PREFIX
from vellum.autorecovery.daemon import AutoRecovery
from vellum.autorecovery.settings import AutoRecoverySettings
from vellum.client.placement import DefaultPlacementPolicy
from vellum.config import ClientConfig
from vellum.ids import LedgerId
from vellum.sim.checker import Placement
from vellum.sim.metadata import EPOCH_S, SimMetadataStore
from vellum.sim.network import current_node

if TYPE_CHECKING:
    from vellum.sim.history import History

#: AutoRecovery sized for a simulated run: lost bookies marked at once, the bookie and ledger
#: checks every 5 s, a 2 s grace for the open fragment of a ledger, requests bounded by 1 s and
#: a fixed copy window (the yielding window reads wall-clock delays)
SETTINGS = AutoRecoverySettings(
    lost_bookie_recovery_delay_s=0,
    bookie_check_interval_s=5,
    ledger_check_interval_s=5,
    open_ledger_grace_period_ms=2000,
    entry_batch_size=10,
    yield_target_s=None,
    backoff_ms=500,
    request_timeout_s=1.0,
    tick_s=1.0,
)
#: the daemons (each a candidate for auditor and a replication worker), as network nodes
NODES = ("autorecovery-0", "autorecovery-1")
#: virtual seconds AutoRecovery gets after the final phase to settle
SETTLE_S = 60.0

#: every module of ``vellum.autorecovery`` that reads the ``time`` module in a run
_CLOCKED = (ar_auditor, ar_worker, ar_copier, ar_cannot_heal, ar_pacing)


class _VirtualTime:
    """The parts of the ``time`` module AutoRecovery reads: the loop's clock, and ``wall``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, wall: Callable[[], float]) -> None:
        self.time = wall
        # the loop's own bound method: no frame of this class per call (the copier reads the
        # monotonic clock twice per entry it verifies or copies)
        self.monotonic: Callable[[], float] = loop.time


@contextlib.contextmanager
def virtual_clock(loop: asyncio.AbstractEventLoop, wall: Callable[[], float] | None = None) -> Iterator[None]:
    """AutoRecovery reads ``loop``'s clock as its monotonic clock and ``wall`` (None:
    ``EPOCH_S`` + loop time, never stepped) as its wall clock, for the length of the block."""
    saved = [m.time for m in _CLOCKED]
    clock = _VirtualTime(loop, wall if wall is not None else lambda: EPOCH_S + loop.time())
    for m in _CLOCKED:
        setattr(m, "time", clock)  # noqa: B010 (a module attribute, restored below)
    try:
        yield
    finally:
        for m, t in zip(_CLOCKED, saved):
            setattr(m, "time", t)  # noqa: B010


class SimAutoRecovery:
    """The daemons of one run. ``start`` them, ``settle`` after the final phase, ``stop``."""

    def __init__(self, store: SimMetadataStore, history: History, rng: random.Random, *,
                 replicas_check: bool = False) -> None:
        """``replicas_check``: run the auditor's replicas check too (every entry read and
        verified, every 5 s: what finds a bad stored copy, the ``corrupt`` fault)."""
        self._store = store
        self._settings = dataclasses.replace(SETTINGS, replicas_check_interval_s=5 if replicas_check else 0)
        self._history = history
        self._rng = rng
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        #: the daemons' metadata sessions (the ``expiry`` fault picks among them)
        self.sessions: dict[str, SimMetadataStore] = {}

    def start(self) -> None:
        for name in NODES:
            session = self._store.session(name)
            self.sessions[name] = session
            daemon = AutoRecovery(
                SimMetadataStore.uri, bookie_id=name, settings=self._settings, store=session,
                client_config=ClientConfig(add_entry_timeout_s=1.0, read_entry_timeout_s=1.0),
                placement=DefaultPlacementPolicy(random.Random(self._rng.random())))
            self._tasks.append(asyncio.ensure_future(self._run(name, daemon)))

    async def _run(self, name: str, daemon: AutoRecovery) -> None:
        current_node.set(name)
        while not self._stop.is_set():
            try:
                await daemon.run(self._stop)
            except Exception as e:  # a daemon that dies is restarted, as by its supervisor
                self._history.add(name, "autorecovery-failed", value=f"{type(e).__name__}: {e}")
                await asyncio.sleep(1.0)

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.wait(self._tasks, timeout=5.0)

    async def settle(self, since: float, closed: Collection[int]) -> bool:
        """Wait until AutoRecovery is done with what the final phase left: two ledger checks
        (and replicas checks, when they run) completed after ``since`` (the second began after
        it) and a bookie check's interval passed, and no under-replicated record of a ``closed``
        ledger (those the final phase closed: what the promise judges) is left but those a worker
        said cannot heal. False if that did not happen within ``SETTLE_S`` virtual seconds."""
        loop = asyncio.get_running_loop()
        cluster = self._store.cluster
        deadline = since + SETTLE_S
        earliest = since + self._settings.bookie_check_interval_s + 2 * self._settings.tick_s
        checks = ["checkallledgersctime"] + (["replicascheckctime"] if self._settings.replicas_check_interval_s else [])
        passes: dict[str, set[int]] = {name: set() for name in checks}
        since_ms = cluster.now_ms()  # the wall clock the audit times are stamped with, at ``since``
        while loop.time() < deadline:
            await asyncio.sleep(0.5)
            for name in checks:
                ctime = cluster.ctimes.get(name)
                if ctime is not None and ctime >= since_ms:
                    passes[name].add(ctime)
            if any(len(p) < 2 for p in passes.values()) or loop.time() < earliest:
                continue
            blocked = {int(k[len(CANNOT_HEAL_PREFIX):]) for k in cluster.kv if k.startswith(CANNOT_HEAL_PREFIX)}
            left = sorted(lid for lid in cluster.records if lid in closed and lid not in blocked)
            if not left:
                self._history.add("autorecovery", "settled", value=f"{loop.time() - since:.1f} s")
                return True
        self._history.add("autorecovery", "not-settled",
                          value=f"records left: {sorted(cluster.records)}")
        return False


class Holder(Protocol):
    """A simulated bookie as ``replicas`` asks it (``node.BookieNode``)."""

    name: str

    def held(self, ledger_id: int) -> frozenset[int]: ...


def replicas(store: SimMetadataStore, nodes: Sequence[Holder], ledgers: list[int]) -> dict[int, Placement]:
    """Where each existing ledger's entries are at the end: its segments and write quorum from
    the store, and each bookie's intact durable entries of it (``SimBookie.held``)."""
    out: dict[int, Placement] = {}
    for lid in ledgers:
        if not store.ledgers.ledger_exists(LedgerId(lid)):
            continue
        md = store.ledgers.read_ledger(LedgerId(lid)).value
        out[lid] = Placement({first: tuple(str(b) for b in ens) for first, ens in md.ensembles.items()},
                             md.write_quorum_size, {node.name: node.held(lid) for node in nodes})
    return out
