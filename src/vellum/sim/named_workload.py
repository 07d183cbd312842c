"""Named ledgers in a simulated run (docs/verification.md, "Named ledgers"): the real
``NamedLedgers`` client (``client/named.py``) appending to a few names under the run's faults,
and the promise over each name's records.

Responsibility: the ``named`` actor (its own ``BookKeeper``, the network node ``named``): for
each name, writer sessions one after the other, each an APPEND acquisition (creating the name
the first time; otherwise fencing and recovering the previous session's open segment and
rolling over to a new segment: the record's compare-and-set), a few appends, then a close or
an abandon (a writer that dies; the next acquisition fences it), and now and then a shrink of
the name's front (retention: segments below the new start deleted). Between sessions a
read-only handle reads the name from its start to its LAC. After the run's faults are healed,
``final_phase`` reads every name back, and ``check`` judges:

- ``named-lost``: every acknowledged append at or after the name's start (what no shrink asked
  to drop) reads back, with its bytes;
- ``named-order``: a read of a name returns consecutive global entry ids in order, each with the
  bytes its append was acknowledged with (and one value per id, for every observer).

The segments are ordinary ledgers, and the plain ledgers' promises judge them too: every
acknowledged append and every entry a read returned is recorded in the history under its
segment's ledger id and local entry id (``ack`` and ``read`` events, as the plain workload
records them), and ``hand_over`` gives the segments to the plain workload's final phase, which
recovers and reads back each one that exists (``ack-lost``, ``unreadable``, ``divergent``;
``under-replicated`` once AutoRecovery settles) and checks that the bookies' GC removed the
segments a shrink deleted (``written-after-delete``). The segments use the plain workload's
password, so its final client opens them.

Invariants: every choice comes from the generator handed in; every wait is bounded in virtual
time; the client's wall clock and writer identity are the run's (``named_clock``), never the
host's.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING

from vellum.client import named as client_named
from vellum.client.named import NamedLedgers, OpenMode
from vellum.errors import VellumError
from vellum.ids import LedgerId
from vellum.sim.checker import Violation
from vellum.sim.history import History, digest
from vellum.sim.network import current_node
from vellum.sim.workload import PASSWORD

if TYPE_CHECKING:
    from vellum.client.bookkeeper import BookKeeper
    from vellum.client.named_record import NamedLedgerRecord
    from vellum.meta.api import MetadataStore
    from vellum.sim.workload import Workload

#: the names the actor writes
NAMES = ("orders", "events")
#: writer sessions the actor runs (spread over the names)
SESSIONS = 12
#: the quorum shapes of the names' segments (E, WQ, AQ)
SHAPES = ((3, 3, 2), (3, 2, 2), (4, 3, 2))
_PASSWORD = PASSWORD  # the plain workload's: its final phase opens the segments too


@contextlib.contextmanager
def named_clock(wall: Callable[[], float]) -> Iterator[None]:
    """The named-ledger client reads the run's wall clock (``ctime`` of records and segments)
    and names its writers ``sim`` (the host name and pid otherwise), for the length of a run."""
    saved = client_named._wall_clock, client_named._writer_identity
    client_named._wall_clock = wall
    client_named._writer_identity = lambda: "sim"
    try:
        yield
    finally:
        client_named._wall_clock, client_named._writer_identity = saved


class NamedWorkload:
    """The ``named`` actor of one run, and what it saw (``history``: kinds ``named-*``)."""

    def __init__(self, client: Callable[[str], Awaitable[BookKeeper]], history: History, rng: random.Random) -> None:
        """``client(name)``: an awaitable started ``BookKeeper`` as the network node ``name``."""
        self._client = client
        self._history = history
        self._rng = rng
        self.operations = 0
        #: name -> global entry id -> digest of the bytes its append was acknowledged with
        self.acked: dict[str, dict[int, str]] = {n: {} for n in NAMES}
        #: name -> the highest end a shrink was asked for (entries below it may be gone)
        self.shrunk: dict[str, int] = {n: 0 for n in NAMES}
        #: name -> (observer, global entry id, digest) of every entry read
        self.reads: dict[str, list[tuple[str, int, str]]] = {n: [] for n in NAMES}
        #: name -> (observer, ids in the order one read returned them)
        self.orders: dict[str, list[tuple[str, list[int]]]] = {n: [] for n in NAMES}
        #: names the final phase could not read back (``VellumError``): judged as lost if acked
        self.unread: dict[str, str] = {}
        #: the segments' ledger ids seen (writer sessions' and those of the records read), in
        #: order: what ``hand_over`` gives the plain promises
        self.segments: dict[int, None] = {}

    # ------------------------------------------------------------------------------ the actor
    async def run(self) -> None:
        current_node.set("named")
        named = NamedLedgers(await self._client("named"))
        rng = self._rng
        for session in range(1, SESSIONS + 1):
            name = rng.choice(NAMES)
            await self._session(named, name, session, rng)
            if rng.random() < 0.5:
                await self._read(named, name, "named-reader")
            await asyncio.sleep(rng.uniform(0.05, 0.5))

    async def _session(self, named: NamedLedgers, name: str, session: int, rng: random.Random) -> None:
        e, wq, aq = rng.choice(SHAPES)
        try:
            handle = await named.open(name, OpenMode.CREATE_OR_APPEND, password=_PASSWORD,
                                      ensemble_size=e, write_quorum_size=wq, ack_quorum_size=aq)
        except VellumError as exc:
            self._history.add("named", "named-open-failed", value=f"{name}: {type(exc).__name__}")
            return
        self.operations += 1
        self._history.add("named", "named-open", value=f"{name} session {session} ledger {handle.ledger_id}")
        segment = next(s for s in handle.record.segments if s.ledger_id == handle.ledger_id)  # the writer's
        self._note_segments(handle.record)
        for i in range(rng.randint(3, 15)):
            payload = f"{name}/{session}/{i}".encode()
            try:
                gid = await handle.append(payload)
            except VellumError as exc:
                self._history.add("named", "named-append-failed", value=f"{name}: {type(exc).__name__}")
                return  # this session's writer is done (fenced, or its ledger failed): abandoned
            self.operations += 1
            self.acked[name][gid] = digest(payload)
            self._history.add("named", "named-ack", entry=gid, value=f"{name} {digest(payload)}")
            # the same append as the segment's ledger saw it, for the plain promises
            self._history.add("named", "ack", segment.ledger_id, gid - segment.first_entry_id, digest(payload))
        if rng.random() < 0.3 and self.acked[name]:
            end = rng.randint(handle.start_entry_id, max(handle.start_entry_id, max(self.acked[name]) + 1))
            self.shrunk[name] = max(self.shrunk[name], end)  # asked for: entries below may go
            try:
                result = await handle.shrink(end)
                self._history.add("named", "named-shrink", entry=end, value=f"{name} -> {result!r}"[:160])
            except VellumError as exc:
                self._history.add("named", "named-shrink-failed", entry=end, value=f"{name}: {type(exc).__name__}")
            self.operations += 1
        if rng.random() < 0.6:
            try:
                await handle.close()
                self._history.add("named", "named-close", value=name)
            except VellumError as exc:
                self._history.add("named", "named-close-failed", value=f"{name}: {type(exc).__name__}")
        else:
            self._history.add("named", "named-abandon", value=name)  # the writer dies

    async def _read(self, named: NamedLedgers, name: str, observer: str) -> bool:
        """Read ``name`` from its start to its LAC (read-only: no fencing); False if it failed."""
        try:
            handle = await named.open(name, OpenMode.READ_ONLY, password=_PASSWORD)
            first, last = handle.start_entry_id, handle.last_add_confirmed
            entries = await handle.read(first, last) if last >= first else []
        except VellumError as exc:
            self._history.add(observer, "named-read-failed", value=f"{name}: {type(exc).__name__}")
            return False
        self.operations += 1
        ids = [e.entry_id for e in entries]
        self.orders[name].append((observer, ids))
        record = handle.record
        self._note_segments(record)
        for entry in entries:
            got = digest(bytes(entry.payload))
            self.reads[name].append((observer, entry.entry_id, got))
            segment = None
            for s in record.segments:  # in order: the last one starting at or before the entry (an
                if s.first_entry_id <= entry.entry_id:  # empty segment starts where the next does)
                    segment = s
            if segment is not None:  # the same entry as its segment's ledger holds it
                self._history.add(observer, "read", segment.ledger_id, entry.entry_id - segment.first_entry_id, got)
        self._history.add(observer, "named-read", value=f"{name} [{first}, {last}] {len(ids)} entries")
        return True

    # -------------------------------------------------------------------------- final phase
    async def final_phase(self) -> None:
        """Faults healed: read every name back from its start to its last entry."""
        current_node.set("named-final")
        named = NamedLedgers(await self._client("named-final"))
        for name in NAMES:
            if not self.acked[name]:
                continue
            for _ in range(10):  # a recovery still running elsewhere: try again
                try:  # a last writer session: fences and recovers an abandoned open segment (its new
                    # segment small: a bookie may be lost for good and another still registered read-only)
                    handle = await named.open(name, OpenMode.APPEND, password=_PASSWORD, ensemble_size=3,
                                              write_quorum_size=2, ack_quorum_size=2)
                    await handle.close()
                except VellumError as exc:
                    self._history.add("named-final", "named-open-failed", value=f"{name}: {type(exc).__name__}: {exc}")
                    self.unread[name] = f"the final writer session failed: {type(exc).__name__}"
                    await asyncio.sleep(1.0)
                    continue
                if await self._read(named, name, "named-final"):
                    self.unread.pop(name, None)
                    break
                self.unread[name] = "the final read failed"
                await asyncio.sleep(1.0)

    def _note_segments(self, record: NamedLedgerRecord) -> None:
        for segment in record.segments:
            self.segments.setdefault(segment.ledger_id, None)

    def hand_over(self, workload: Workload, store: MetadataStore) -> None:
        """After ``final_phase``: the segments join the plain workload's ledgers, so its final
        phase (before which this is called) recovers, reads back and judges them; a segment gone
        from the store (a shrink deleted it) joins its deleted ledgers, which the bookies' GC must
        have removed."""
        for lid in self.segments:
            if lid in workload.ledgers:
                continue
            workload.ledgers.append(lid)
            if not store.ledgers.ledger_exists(LedgerId(lid)):
                workload.deleted.add(lid)

    # ------------------------------------------------------------------------------- promise
    def check(self) -> list[Violation]:
        out: list[Violation] = []
        for name in NAMES:
            acked = self.acked[name]
            evidence = tuple(ev for ev in self._history.events if ev.kind.startswith("named")
                             and name in str(ev.value))[-40:]
            for observer, ids in self.orders[name]:
                if ids and ids != list(range(ids[0], ids[0] + len(ids))):
                    out.append(Violation("named-order", -1, ids[0], f"{name}: {observer} read ids out of order "
                                         f"or with a gap: {ids[:20]}", evidence))
            for observer, gid, got in self.reads[name]:
                want = acked.get(gid)
                if want is not None and want != got:
                    out.append(Violation("named-order", -1, gid, f"{name}: entry {gid} read by {observer} as {got}, "
                                         f"acknowledged as {want}", evidence))
            final = {gid for observer, gid, _ in self.reads[name] if observer == "named-final"}
            lost = sorted(gid for gid in acked if gid >= self.shrunk[name] and gid not in final)
            if lost:
                why = self.unread.get(name, "not in the final read")
                out.append(Violation("named-lost", -1, lost[0], f"{name}: {len(lost)} acknowledged entries "
                                     f"({lost[:10]}) at or after the start {self.shrunk[name]}: {why}", evidence))
        return out


__all__ = ["NAMES", "NamedWorkload", "named_clock"]
