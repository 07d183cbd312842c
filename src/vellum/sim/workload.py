"""The simulated clients: a writer, a tailing reader, a recoverer that also deletes, and the
final phase that recovers and reads back everything once the faults are healed.

Responsibility: drive the real asyncio client (``vellum.client``) like applications do and
write what each actor saw into the run's history (``history``): created ledgers, acknowledged
entries (with a digest of their bytes), reads, LACs, recoveries and their ends, closes,
deletes. Ledgers are made with a quorum shape drawn per ledger (``SHAPES``), payloads are
random bytes from the run's generator.

Invariants: each actor acts as its own simulated node (``network.current_node``); an actor's
failure is an event of the history, never an exception out of the run; every loop is bounded.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from vellum.errors import NoSuchEntryError, NoSuchLedgerError, VellumError
from vellum.ids import LedgerId
from vellum.sim.checker import Placement
from vellum.sim.history import Digests
from vellum.sim.network import current_node

if TYPE_CHECKING:
    from vellum.client.bookkeeper import BookKeeper
    from vellum.client.ledger import LedgerHandle
    from vellum.meta.api import MetadataStore
    from vellum.sim.history import History


class WorkloadWorld(Protocol):
    """What the clients run in: the simulator's ``runner.World``, or a real cluster
    (``cluster.ClusterWorld``, ``vellum verify cluster``), whose ``nodes`` is empty (no bookie
    inspected in-process: no GC driven, no leftover check)."""

    @property
    def history(self) -> History: ...

    @property
    def rng(self) -> random.Random: ...

    @property
    def store(self) -> MetadataStore: ...

    @property
    def nodes(self) -> Sequence[Any]: ...

    async def client(self, name: str, *, explicit_lac_ms: int = 0) -> BookKeeper: ...

#: (ensemble, write quorum, ack quorum) shapes a ledger is made with
SHAPES = ((3, 3, 2), (3, 2, 2), (4, 3, 2), (3, 3, 3), (5, 3, 2), (4, 2, 2))
PASSWORD = b"sim"


@dataclass(frozen=True)
class WorkloadShape:
    """How much the clients do per seed."""

    ledgers: int = 3
    entries: tuple[int, int] = (20, 60)
    window: int = 6
    close_probability: float = 0.5
    delete_probability: float = 0.4
    reader_polls: int = 30
    #: the (ensemble, write quorum, ack quorum) shapes ledgers are made with
    shapes: tuple[tuple[int, int, int], ...] = SHAPES
    #: how long after a ledger's creation the recoverer opens it (races the writer)
    recover_delay_s: tuple[float, float] = (0.0, 0.8)
    #: the reader long-polls the LAC (LONG_POLL_READ_LAC) instead of reading it, on some polls
    long_poll: bool = False
    #: the writer sends explicit LACs when idle (``explicitLacInterval``, ms; 0 = off)
    explicit_lac_ms: int = 0
    #: the writer waits this long after its last acknowledgement before it closes a ledger (longer
    #: than any add timeout: every failed write was noticed); the ledgers it then closes are
    #: judged by ``not-replaced`` (0 = no wait, not judged)
    quiet_before_close_s: float = 0.0
    #: the writer stalls this long once per ledger, halfway through its adds (a process paused by
    #: a long GC or swapping), then adds on with the handle it holds (0 = never)
    writer_pause_s: float = 0.0


class Workload:
    def __init__(self, world: WorkloadWorld, shape: WorkloadShape) -> None:
        self.world = world
        self.shape = shape
        self.history = world.history
        self.rng = random.Random(world.rng.random())
        self.ledgers: list[int] = []
        self._created = asyncio.Event()
        self.operations = 0
        self.deleted: set[int] = set()
        self.final_ends: dict[int, int] = {}
        self.leftover_deleted: dict[str, list[int]] = {}
        #: ledgers the writer closed after ``quiet_before_close_s``: where their entries are at the end
        self.placements: dict[int, Placement] = {}
        self._closed_quiet: list[int] = []
        self._writer_done = False
        #: every payload's digest, computed once (written once, read back by several actors)
        self.digests = Digests()

    async def run(self, run_s: float) -> None:
        actors = [asyncio.ensure_future(a) for a in (self._writer(), self._reader(), self._recoverer(), self._gc())]
        try:
            await asyncio.wait(actors[:3], timeout=run_s)
        finally:
            for a in actors:
                a.cancel()
            await asyncio.wait(actors, timeout=5.0)

    async def _ledger(self, index: int) -> int | None:
        """The index-th ledger the writer created (None once the writer is done without it)."""
        while len(self.ledgers) <= index:
            if self._writer_done:
                return None
            self._created.clear()
            await self._created.wait()
        return self.ledgers[index]

    # -------------------------------------------------------------------------- writer
    async def _writer(self) -> None:
        current_node.set("writer")
        rng = random.Random(self.rng.random())
        history = self.history
        try:
            bk = await self.world.client("writer", explicit_lac_ms=self.shape.explicit_lac_ms)
            for _ in range(self.shape.ledgers):
                e, wq, aq = rng.choice(self.shape.shapes)
                self.operations += 1
                try:
                    h = await bk.create_ledger(ensemble_size=e, write_quorum_size=wq, ack_quorum_size=aq,
                                               password=PASSWORD)
                except VellumError as ex:
                    history.add("writer", "create-failed", value=type(ex).__name__)
                    await asyncio.sleep(0.2)
                    continue
                history.add("writer", "created", h.ledger_id, value=f"{e}/{wq}/{aq} {list(h.ensemble)}")
                self.ledgers.append(h.ledger_id)
                self._created.set()
                await self._write(h, rng)
        finally:
            self._writer_done = True
            self._created.set()

    async def _write(self, h: LedgerHandle, rng: random.Random) -> None:
        history = self.history
        digests = self.digests
        lid = h.ledger_id
        inflight: deque[asyncio.Future[int]] = deque()
        failed = False
        count = rng.randint(*self.shape.entries)
        for i in range(count):
            if self.shape.writer_pause_s and i == count // 2:
                history.add("writer", "paused", lid, value=f"{self.shape.writer_pause_s} s")
                await asyncio.sleep(self.shape.writer_pause_s)
            payload = rng.getrandbits(8 * rng.randint(8, 48)).to_bytes(48, "big")
            self.operations += 1
            fut = h.append_async(payload)

            def acked(f: asyncio.Future[int], value: str = digests[payload]) -> None:
                if f.cancelled():
                    return
                exc = f.exception()
                if exc is None:
                    history.add("writer", "ack", lid, f.result(), value)
                else:
                    history.add("writer", "add-failed", lid, value=type(exc).__name__)

            fut.add_done_callback(acked)
            inflight.append(fut)
            while len(inflight) >= self.shape.window or (inflight and inflight[0].done()):
                try:
                    await inflight.popleft()
                except VellumError:
                    failed = True
                    break
            if failed:
                break
            if rng.random() < 0.3:
                await asyncio.sleep(rng.uniform(0.0, 0.05))
        if not failed:
            for f in inflight:
                try:
                    await f
                except VellumError:
                    failed = True
        if not failed and rng.random() < self.shape.close_probability:
            self.operations += 1
            quiet = self.shape.quiet_before_close_s
            if quiet:
                await asyncio.sleep(quiet)
            try:
                await h.close()
                history.add("writer", "closed", lid, value=h.metadata.last_entry_id)
                if quiet:
                    self._closed_quiet.append(lid)
            except VellumError as ex:
                history.add("writer", "close-failed", lid, value=type(ex).__name__)
        else:
            history.add("writer", "abandoned", lid)
            h.abandon()

    # -------------------------------------------------------------------------- reader
    async def _reader(self) -> None:
        current_node.set("reader")
        rng = random.Random(self.rng.random())
        history = self.history
        digests = self.digests
        bk = await self.world.client("reader")
        for index in range(self.shape.ledgers):
            lid = await self._ledger(index)
            if lid is None:
                return
            await asyncio.sleep(rng.uniform(0.0, 0.2))
            try:
                h = await bk.open_ledger(lid, password=PASSWORD, recovery=False)
            except VellumError as ex:
                history.add("reader", "open-failed", lid, value=type(ex).__name__)
                continue
            handle = f"reader/{lid}"
            next_entry = 0
            for _ in range(self.shape.reader_polls):
                self.operations += 1
                try:
                    if self.shape.long_poll and rng.random() < 0.5:
                        lac = await h.wait_for_lac(next_entry - 1, rng.uniform(0.05, 0.3))
                    else:
                        lac = await h.read_last_add_confirmed()
                    history.add("reader", "lac", lid, value=(handle, lac))
                    if lac >= next_entry:
                        last = min(lac, next_entry + 15)
                        self.operations += 1
                        for entry in await h.read(next_entry, last):
                            history.add("reader", "read", lid, entry.entry_id, digests[entry.payload])
                        next_entry = last + 1
                    elif h.is_closed:
                        break
                    if rng.random() < 0.2:
                        await h.refresh_metadata()
                except NoSuchLedgerError:
                    break
                except VellumError as ex:
                    history.add("reader", "read-failed", lid, value=type(ex).__name__)
                    # an entry at or below the LAC is gone: the application asks whether the
                    # ledger still exists, and stops tailing it once it was deleted
                    if isinstance(ex, NoSuchEntryError) and await self._deleted(h, lid):
                        break
                await asyncio.sleep(rng.uniform(0.005, 0.15))

    async def _deleted(self, h: LedgerHandle, lid: int) -> bool:
        """Whether the ledger's metadata is gone (refreshed through the handle, as a tailing
        application would); a refresh that fails otherwise tells nothing (the reader polls on)."""
        self.operations += 1
        try:
            await h.refresh_metadata()
        except NoSuchLedgerError:
            self.history.add("reader", "gone", lid)
            return True
        except VellumError as ex:
            self.history.add("reader", "refresh-failed", lid, value=type(ex).__name__)
        return False

    # ----------------------------------------------------------------------- recoverer
    async def _recoverer(self) -> None:
        current_node.set("recoverer")
        rng = random.Random(self.rng.random())
        bk = await self.world.client("recoverer")
        for index in range(self.shape.ledgers):
            lid = await self._ledger(index)
            if lid is None:
                return
            await asyncio.sleep(rng.uniform(*self.shape.recover_delay_s))  # races the writer
            h = await self._recover(bk, lid, "recoverer", rng)
            if h is None:
                continue
            await self._read_all(h, "recoverer", "read")
            if rng.random() < self.shape.delete_probability:
                self.operations += 1
                self.history.add("recoverer", "delete-start", lid)
                try:
                    await bk.delete_ledger(lid)
                    self.deleted.add(lid)
                    self.history.add("recoverer", "deleted", lid)
                except VellumError as ex:
                    self.history.add("recoverer", "delete-failed", lid, value=type(ex).__name__)

    async def _recover(self, bk, lid: int, actor: str, rng: random.Random,  # type: ignore[no-untyped-def]
                       attempts: int = 6) -> LedgerHandle | None:
        history = self.history
        history.add(actor, "recover-start", lid)
        for _ in range(attempts):
            self.operations += 1
            try:
                h = await bk.open_ledger(lid, password=PASSWORD, recovery=True)
            except NoSuchLedgerError:
                return None
            except VellumError as ex:
                history.add(actor, "recover-failed", lid, value=type(ex).__name__)
                await asyncio.sleep(rng.uniform(0.1, 0.5))
                continue
            history.add(actor, "recovered", lid, value=h.metadata.last_entry_id)
            return h
        return None

    async def _read_all(self, h: LedgerHandle, actor: str, kind: str) -> bool:
        last = h.metadata.last_entry_id
        entry = 0
        while entry <= last:
            upto = min(last, entry + 31)
            self.operations += 1
            try:
                got = await h.read(entry, upto)
            except VellumError as ex:
                self.history.add(actor, "read-failed", h.ledger_id, entry, type(ex).__name__)
                return False
            digests = self.digests
            for e in got:
                self.history.add(actor, kind, h.ledger_id, e.entry_id, digests[e.payload])
            entry = upto + 1
        return True

    # ------------------------------------------------------------------------------ GC
    async def _gc(self) -> None:
        rng = random.Random(self.rng.random())
        while True:
            await asyncio.sleep(rng.uniform(0.2, 1.0))
            for node in self.world.nodes:
                if node.up:
                    for lid in node.gc():
                        self.history.add(node.name, "gc", lid)

    # ---------------------------------------------------------------------- final phase
    async def final_phase(self) -> None:
        """Faults healed: recover every ledger left, read every ledger back, run GC."""
        current_node.set("final")
        rng = random.Random(self.rng.random())
        bk = await self.world.client("final")
        store = self.world.store
        for lid in self.ledgers:
            if not store.ledgers.ledger_exists(LedgerId(lid)):
                continue
            h = await self._recover(bk, lid, "final", rng, attempts=10)
            if h is None:
                continue
            self.final_ends[lid] = h.metadata.last_entry_id
            await self._read_all(h, "final", "final-read")
        for lid in self._closed_quiet:
            if lid in self.deleted or not store.ledgers.ledger_exists(LedgerId(lid)):
                continue
            md = store.ledgers.read_ledger(LedgerId(lid)).value
            self.placements[lid] = Placement(
                {first: tuple(str(b) for b in ens) for first, ens in md.ensembles.items()}, md.write_quorum_size,
                {node.name: node.held_entries(lid) for node in self.world.nodes})
        for node in self.world.nodes:
            node.gc()
            held = [lid for lid in sorted(self.deleted) if node.holds_any(lid)]
            if held:
                self.leftover_deleted[node.name] = held
