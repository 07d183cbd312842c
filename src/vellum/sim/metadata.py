"""``SimMetadataStore``: an in-memory metadata driver for the simulator.

Responsibility: the parts of ``meta.api`` the client, the simulated bookies and AutoRecovery
use, with the drivers' semantics (the contract suite in tests/meta): versions start at 0 and
grow by one per write; a write is a compare-and-set on the version; ``create_ledger_with_id``
accepts a row carrying the caller's creator token as the caller's own earlier create; a delete
of a missing ledger succeeds; bookie registrations and their watches; AutoRecovery's records
(under-replicated ledgers that merge their replicas, exclusive re-replication locks, the
switch, the lost-bookie delay, the audit timestamps, the auditor election: the lowest live vote
leads) and the key-value area. Metadata travels serialized (``serialize_ledger_metadata``), so
every reader gets its own copy, as from a real store: what a reader gets is what the row's
bytes parse to. A row keeps a copy of the metadata it was written from and is serialized and
parsed at its first read, not at each write (many rows are rewritten before anyone reads them);
later reads of it get a copy of that parse (``_own_copy``), not a parse each.

Sessions: one ``SimMetadataStore`` is one session on a cluster that every session of a run
shares (``session(name)`` opens another). Registrations, locks and auditor votes belong to the
session that made them. ``expire(outage_s)`` ends a session as a server-side expiry does: they
vanish at once, listeners hear ``EXPIRED``, every call fails with ``MetadataStoreUnavailableError``
(what the ZooKeeper driver raises for ``SessionExpiredError``) for ``outage_s``, then the store
has a new session id, re-creates its registrations, votes again (at the end of the line) and
listeners hear ``RECONNECTED``: the real drivers' reconnect path. ``close`` ends it for good.

Watch callbacks, election callbacks and session events run on the loop after the change
(``call_soon``, or after a seeded delay: ``SimCluster.watch_delay``); a watch reads the state
when it fires, as a ZooKeeper watcher re-reads the node.

Cookies are kept (version and bytes per bookie, compare-and-set as the drivers): the real
bookie (``sim/real_bookie.py``) stamps its cookie there at first start and checks it at every
start. Not simulated (these raise ``MetaStoreError``): the layout.

Invariants: single-threaded (the simulator's loop); calls are synchronous: the latency and the
faults of the store (lost replies) are the loop's executor hook's business (``runner``). The one
call that blocks in a real driver, ``wait_for_work``, returns at once and leaves a *block* for
the hook (``take_block``, ``wake_after``): the hook answers the call when the records change or
the timeout passes, on virtual time.
"""

from __future__ import annotations

import asyncio
import copy
import socket
from collections.abc import Callable, Collection, Iterable, Iterator

from vellum.errors import (
    IncorrectParameterError,
    LedgerExistsError,
    MetadataStoreUnavailableError,
    MetadataVersionError,
    MetaStoreError,
    NoSuchLedgerError,
)
from vellum.ids import BookieId, LedgerId
from vellum.meta import underreplication as UR
from vellum.meta.api import (
    AuditorElection,
    BookiesWatcher,
    DelayWatcher,
    KeyValueStore,
    LayoutManager,
    LedgerIdGenerator,
    LedgerManager,
    LedgerRange,
    LedgerWatcher,
    MetadataStore,
    RegistrationManager,
    SessionEvent,
    SessionListener,
    UnderReplicatedLedger,
    UnderReplicationManager,
    Versioned,
    Watch,
)
from vellum.meta.model import LedgerMetadata, deserialize_ledger_metadata, serialize_ledger_metadata

#: the virtual wall clock's epoch: ``time.time()`` of a simulated run at loop time 0 (ms stamps
#: of the records and the audit times)
EPOCH_S = 1_700_000_000.0


class _Watch(Watch):
    def __init__(self, registry: list[_Watch], fire: Callable[[], None]) -> None:
        self._registry = registry
        self.fire = fire
        registry.append(self)

    def cancel(self) -> None:
        if self in self._registry:
            self._registry.remove(self)


#: ``on_write(ledger_id, metadata)``: told of every successful create and write (the history)
WriteHook = Callable[[int, LedgerMetadata], None]


def _own_copy(md: LedgerMetadata) -> LedgerMetadata:
    """A copy of ``md`` that shares nothing mutable with it: a reader's own, as a parse of the
    same bytes would be (a ``LedgerMetadata`` is frozen; its two mappings are its only mutable
    parts, and their keys and values are immutable)."""
    own = copy.copy(md)
    object.__setattr__(own, "ensembles", dict(md.ensembles))
    object.__setattr__(own, "custom_metadata", dict(md.custom_metadata))
    return own


class _Row:
    """A ledger's stored row: its version, a copy of the metadata it was written from, and, from
    its first read on, what its bytes (``serialize_ledger_metadata``) parse to."""

    __slots__ = ("_parsed", "ledger_id", "version", "written")

    def __init__(self, ledger_id: int, version: int, metadata: LedgerMetadata) -> None:
        self.ledger_id = ledger_id
        self.version = version
        self.written = _own_copy(metadata)
        self._parsed: LedgerMetadata | None = None

    def read(self) -> LedgerMetadata:
        """The row as a reader gets it from a store: a copy of its own of what the bytes parse to."""
        parsed = self._parsed
        if parsed is None:
            parsed = self._parsed = deserialize_ledger_metadata(serialize_ledger_metadata(self.written),
                                                                where=f"sim ledgers[{self.ledger_id}]")
        return _own_copy(parsed)


class _Ledgers(LedgerManager, LedgerIdGenerator):
    def __init__(self, deliver: Callable[[Callable[[], None]], None]) -> None:
        self._deliver = deliver
        self.on_write: WriteHook | None = None
        self._rows: dict[int, _Row] = {}
        self._last_id = 0
        self._watches: dict[int, list[_Watch]] = {}

    def generate_ledger_id(self) -> LedgerId:
        self._last_id += 1
        return LedgerId(self._last_id)

    def _changed(self, ledger_id: int) -> None:
        for w in list(self._watches.get(ledger_id, [])):
            self._deliver(w.fire)

    def create_ledger(self, metadata: LedgerMetadata) -> tuple[LedgerId, int]:
        ledger_id = self.generate_ledger_id()
        while ledger_id in self._rows:
            ledger_id = self.generate_ledger_id()
        self._store_row(ledger_id, 0, metadata)
        return ledger_id, 0

    def create_ledger_with_id(self, ledger_id: LedgerId, metadata: LedgerMetadata) -> int:
        row = self._rows.get(ledger_id)
        if row is None:
            self._store_row(ledger_id, 0, metadata)
            self._last_id = max(self._last_id, int(ledger_id))
            return 0
        held = row.read()
        if metadata.creator_token and held.creator_token == metadata.creator_token:
            return 0
        raise LedgerExistsError(f"ledger {ledger_id} already exists (simulated store, another creator)")

    def _store_row(self, ledger_id: int, version: int, metadata: LedgerMetadata) -> None:
        """Store ``metadata`` as the ledger's row (serialized and parsed when first read)."""
        self._rows[ledger_id] = _Row(ledger_id, version, metadata)

    def read_ledger(self, ledger_id: LedgerId) -> Versioned[LedgerMetadata]:
        row = self._rows.get(ledger_id)
        if row is None:
            raise NoSuchLedgerError(f"no ledger {ledger_id} (simulated store)")
        return Versioned(row.read(), row.version)

    def write_ledger(self, ledger_id: LedgerId, metadata: LedgerMetadata, expected_version: int) -> int:
        row = self._rows.get(ledger_id)
        if row is None:
            raise NoSuchLedgerError(f"no ledger {ledger_id} (simulated store)")
        if row.version != expected_version:
            raise MetadataVersionError(
                f"ledger {ledger_id} changed: expected version {expected_version}, the store has {row.version}")
        self._store_row(ledger_id, row.version + 1, metadata)
        if self.on_write is not None:
            self.on_write(ledger_id, metadata)
        self._changed(ledger_id)
        return row.version + 1

    def delete_ledger(self, ledger_id: LedgerId, expected_version: int | None = None) -> None:
        row = self._rows.get(ledger_id)
        if row is None:
            return
        if expected_version is not None and row.version != expected_version:
            raise MetadataVersionError(
                f"ledger {ledger_id} changed: expected version {expected_version}, the store has {row.version}")
        del self._rows[ledger_id]
        self._changed(ledger_id)

    def ledger_exists(self, ledger_id: LedgerId) -> bool:
        return ledger_id in self._rows

    def password_of(self, ledger_id: int) -> bytes | None:
        """The password in a ledger's stored metadata, None if it has none: what a simulated
        bookie's master-key check asks on every first add of a ledger. Taken from the metadata the
        row was written from (the bytes hold it as given), without parsing the row."""
        row = self._rows.get(ledger_id)
        return None if row is None else row.written.password

    def ledger_ranges(self, start_after: LedgerId | None = None) -> Iterator[LedgerRange]:
        ids = sorted(i for i in self._rows if start_after is None or i > start_after)
        if ids:
            yield LedgerRange(tuple(LedgerId(i) for i in ids))

    def watch_ledger(self, ledger_id: LedgerId, callback: LedgerWatcher) -> Watch:
        def fire() -> None:
            row = self._rows.get(ledger_id)
            callback(ledger_id, None if row is None else Versioned(row.read(), row.version))

        return _Watch(self._watches.setdefault(ledger_id, []), fire)


class _Blocked:
    """A call that blocks in a real driver (``wait_for_work``): answered at the first change or
    at its timeout, once."""

    __slots__ = ("_then", "done", "timeout_s")

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._then: Callable[[], None] | None = None
        self.done = False

    def wake(self) -> None:
        if not self.done:
            self.done = True
            if self._then is not None:
                self._then()


class SimCluster:
    """What every session of one run shares: the ledgers, the registrations, AutoRecovery's
    records, the key-value area, and how watches are delivered."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        #: seconds before a watch (or election, or session) callback runs; None: at once (call_soon)
        self.watch_delay: Callable[[], float] | None = None
        self.ledgers = _Ledgers(self.deliver)
        #: bookie id -> (read-only, owning session id, data)
        self.bookies: dict[BookieId, tuple[bool, int, bytes]] = {}
        self.bookie_watches: list[_Watch] = []
        self.kv: dict[str, tuple[int, bytes]] = {}
        #: bookie id -> (version, cookie bytes)
        self.cookies: dict[BookieId, tuple[int, bytes]] = {}
        # AutoRecovery's records
        #: ledger id -> (version, missing replicas sorted, ctime ms)
        self.records: dict[int, tuple[int, tuple[str, ...], int]] = {}
        #: ledger id -> (owning session id, worker id, record version when acquired)
        self.locks: dict[int, tuple[int, str, int]] = {}
        self.replication_enabled = True
        self.delay: int | None = None
        self.delay_watches: list[_Watch] = []
        self.ctimes: dict[str, int] = {}
        #: seconds the wall clock of ``wall_s`` is ahead of ``EPOCH_S`` + virtual time (the
        #: ``clock`` fault steps it, forward or back)
        self.wall_offset = 0.0
        #: (vote sequence number, candidacy), in vote order: the first leads
        self.votes: list[tuple[int, _SimCandidacy]] = []
        self.changes = 0
        #: ``on_record(kind, ledger id, replicas)``: told when a record is marked ("ur-marked") or
        #: deleted as replicated ("ur-replicated") (the history)
        self.on_record: Callable[[str, int, str], None] | None = None
        self._blocked: list[_Blocked] = []
        self._block: _Blocked | None = None
        self._next_session = 0
        self._next_vote = 0

    def new_session_id(self) -> int:
        self._next_session += 1
        return self._next_session

    def new_vote(self) -> int:
        self._next_vote += 1
        return self._next_vote

    def wall_s(self) -> float:
        """The wall clock of the processes that stamp records and audit times (the marker's,
        as ``meta/underreplication.now_ms`` in production): ``EPOCH_S`` plus virtual time plus
        ``wall_offset``, which the ``clock`` fault steps (``sim/autorecovery.py`` gives
        AutoRecovery's ``time.time`` this clock)."""
        return EPOCH_S + self.loop.time() + self.wall_offset

    def now_ms(self) -> int:
        return int(self.wall_s() * 1000)

    def deliver(self, fn: Callable[[], None]) -> None:
        if self.watch_delay is None:
            self.loop.call_soon(fn)
        else:
            self.loop.call_later(self.watch_delay(), fn)

    def bookies_changed(self) -> None:
        for w in list(self.bookie_watches):
            self.deliver(w.fire)

    def work_changed(self) -> None:
        """Something may have made a record available: wake the blocked ``wait_for_work`` calls."""
        self.changes += 1
        blocked, self._blocked = self._blocked, []
        for b in blocked:
            self.loop.call_soon(b.wake)

    def leader_vote(self) -> tuple[int, _SimCandidacy] | None:
        return self.votes[0] if self.votes else None

    def elect(self) -> None:
        """Each candidacy learns whether it leads now (the lowest vote does)."""
        lead = self.leader_vote()
        for _seq, cand in list(self.votes):
            if lead is not None and cand is lead[1]:
                cand.state.won()
            else:
                cand.state.lost()

    # ------------------------------------------------------ blocking calls (the executor hook)
    def block(self, timeout_s: float) -> None:
        self._block = _Blocked(timeout_s)

    def take_block(self) -> _Blocked | None:
        """The block the call that just ran left (``wait_for_work`` found nothing), if any."""
        b, self._block = self._block, None
        return b

    def wake_after(self, blocked: _Blocked, then: Callable[[], None]) -> None:
        """Run ``then`` at the first change of the records or after the block's timeout."""
        blocked._then = then
        self._blocked.append(blocked)
        self.loop.call_later(blocked.timeout_s, blocked.wake)


class _SimCandidacy(UR.Candidacy):
    def __init__(self, session: SimMetadataStore, bookie_id: BookieId, on_leader: Callable[[], None] | None,
                 on_lost: Callable[[], None] | None) -> None:
        cluster = session.cluster
        super().__init__(bookie_id, session._current_auditor, on_leader, on_lost, cluster.deliver)
        self._session = session
        self._cluster = cluster

    def vote(self) -> None:
        if not self.state.closed:
            self._cluster.votes.append((self._cluster.new_vote(), self))

    def withdraw(self) -> None:
        self._cluster.votes = [(s, c) for s, c in self._cluster.votes if c is not self]

    def resign(self) -> None:
        if not self.state.close():
            return
        self.withdraw()
        if self in self._session._candidacies:
            self._session._candidacies.remove(self)
        self._cluster.elect()


class _SessionPart:
    def __init__(self, session: SimMetadataStore) -> None:
        self._s = session
        self._c = session.cluster


class _SessionLedgers(_SessionPart, LedgerManager, LedgerIdGenerator):
    """The cluster's ledgers through one session (a call fails while the session is expired)."""

    def generate_ledger_id(self) -> LedgerId:
        self._s.check("generating a ledger id")
        return self._c.ledgers.generate_ledger_id()

    def create_ledger(self, metadata: LedgerMetadata) -> tuple[LedgerId, int]:
        self._s.check("creating a ledger")
        return self._c.ledgers.create_ledger(metadata)

    def create_ledger_with_id(self, ledger_id: LedgerId, metadata: LedgerMetadata) -> int:
        self._s.check(f"creating ledger {ledger_id}")
        return self._c.ledgers.create_ledger_with_id(ledger_id, metadata)

    def read_ledger(self, ledger_id: LedgerId) -> Versioned[LedgerMetadata]:
        self._s.check(f"reading ledger {ledger_id}")
        return self._c.ledgers.read_ledger(ledger_id)

    def write_ledger(self, ledger_id: LedgerId, metadata: LedgerMetadata, expected_version: int) -> int:
        self._s.check(f"writing ledger {ledger_id}")
        return self._c.ledgers.write_ledger(ledger_id, metadata, expected_version)

    def delete_ledger(self, ledger_id: LedgerId, expected_version: int | None = None) -> None:
        self._s.check(f"deleting ledger {ledger_id}")
        self._c.ledgers.delete_ledger(ledger_id, expected_version)

    def ledger_exists(self, ledger_id: LedgerId) -> bool:
        self._s.check(f"reading ledger {ledger_id}")
        return self._c.ledgers.ledger_exists(ledger_id)

    def ledger_ranges(self, start_after: LedgerId | None = None) -> Iterator[LedgerRange]:
        self._s.check("listing ledgers")
        return self._c.ledgers.ledger_ranges(start_after)

    def watch_ledger(self, ledger_id: LedgerId, callback: LedgerWatcher) -> Watch:
        self._s.check(f"watching ledger {ledger_id}")
        return self._c.ledgers.watch_ledger(ledger_id, callback)


class _SessionRegistration(_SessionPart, RegistrationManager):
    def register_bookie(self, bookie_id: BookieId, *, read_only: bool = False, data: bytes = b"") -> None:
        self._s.check(f"registering {bookie_id}")
        self._s._registered[bookie_id] = (read_only, data)
        self._c.bookies[bookie_id] = (read_only, self._s.session_id, data)
        self._c.bookies_changed()

    def get_bookie_data(self, bookie_id: BookieId) -> bytes | None:
        self._s.check(f"reading the registration of {bookie_id}")
        held = self._c.bookies.get(bookie_id)
        return None if held is None else held[2]

    def unregister_bookie(self, bookie_id: BookieId) -> None:
        self._s.check(f"unregistering {bookie_id}")
        self._s._registered.pop(bookie_id, None)
        if self._c.bookies.pop(bookie_id, None) is not None:
            self._c.bookies_changed()

    def _list(self, read_only: bool) -> frozenset[BookieId]:
        return frozenset(b for b, (ro, _sid, _data) in self._c.bookies.items() if ro == read_only)

    def list_bookies(self, *, read_only: bool = False) -> frozenset[BookieId]:
        self._s.check("listing bookies")
        return self._list(read_only)

    def watch_bookies(self, callback: BookiesWatcher, *, read_only: bool = False) -> Watch:
        self._s.check("watching bookies")
        w = _Watch(self._c.bookie_watches, lambda: callback(self._list(read_only)))
        self._c.deliver(w.fire)
        return w

    def get_cookie(self, bookie_id: BookieId) -> Versioned[bytes] | None:
        self._s.check(f"reading the cookie of {bookie_id}")
        row = self._c.cookies.get(bookie_id)
        return None if row is None else Versioned(row[1], row[0])

    def put_cookie(self, bookie_id: BookieId, data: bytes, expected_version: int | None) -> int:
        self._s.check(f"writing the cookie of {bookie_id}")
        row = self._c.cookies.get(bookie_id)
        if (row is None) != (expected_version is None) or (row is not None and row[0] != expected_version):
            raise MetadataVersionError(f"cookie of {bookie_id} changed: expected version {expected_version} "
                                       "(simulated store)")
        version = 0 if row is None else row[0] + 1
        self._c.cookies[bookie_id] = (version, bytes(data))
        return version

    def remove_cookie(self, bookie_id: BookieId, expected_version: int | None = None) -> None:
        self._s.check(f"removing the cookie of {bookie_id}")
        row = self._c.cookies.get(bookie_id)
        if row is not None and expected_version is not None and row[0] != expected_version:
            raise MetadataVersionError(f"cookie of {bookie_id} changed: expected version {expected_version} "
                                       "(simulated store)")
        self._c.cookies.pop(bookie_id, None)

    def list_cookies(self) -> frozenset[BookieId]:
        self._s.check("listing cookies")
        return frozenset(self._c.cookies)

    def get_instance_id(self) -> str | None:
        return "simulated"


class _SessionKv(_SessionPart, KeyValueStore):
    def get(self, key: str) -> Versioned[bytes] | None:
        self._s.check(f"reading {key}")
        row = self._c.kv.get(key)
        return None if row is None else Versioned(row[1], row[0])

    def create(self, key: str, value: bytes) -> int:
        self._s.check(f"creating {key}")
        if key in self._c.kv:
            raise MetadataVersionError(f"{key} exists already (simulated store)")
        self._c.kv[key] = (0, bytes(value))
        return 0

    def cas(self, key: str, value: bytes, expected_version: int) -> int:
        self._s.check(f"writing {key}")
        row = self._c.kv.get(key)
        if row is None or row[0] != expected_version:
            raise MetadataVersionError(f"{key} changed: expected version {expected_version} (simulated store)")
        self._c.kv[key] = (row[0] + 1, bytes(value))
        return row[0] + 1

    def delete(self, key: str, expected_version: int | None = None) -> bool:
        self._s.check(f"deleting {key}")
        row = self._c.kv.get(key)
        if row is None:
            return False
        if expected_version is not None and row[0] != expected_version:
            raise MetadataVersionError(f"{key} changed: expected version {expected_version} (simulated store)")
        del self._c.kv[key]
        return True

    def list(self, prefix: str = "", *, start_after: str | None = None, limit: int | None = None) -> list[str]:
        self._s.check(f"listing {prefix}")
        keys = sorted(k for k in self._c.kv if k.startswith(prefix) and (start_after is None or k > start_after))
        return keys if limit is None else keys[:limit]


class _SessionUnderReplication(_SessionPart, UnderReplicationManager):
    """AutoRecovery's records through one session; its locks and votes are this session's."""

    def mark_under_replicated(self, ledger_id: LedgerId, missing_replicas: Iterable[str]) -> None:
        self._s.check(f"marking ledger {ledger_id} under-replicated")
        c = self._c
        row = c.records.get(int(ledger_id))
        if row is None:
            c.records[int(ledger_id)] = (0, tuple(sorted({str(m) for m in missing_replicas})), c.now_ms())
        else:
            merged = UR.merge_replicas(row[1], missing_replicas)
            if merged is None:
                return
            c.records[int(ledger_id)] = (row[0] + 1, merged, c.now_ms())
        if c.on_record is not None:
            c.on_record("ur-marked", int(ledger_id), " ".join(c.records[int(ledger_id)][1]))
        c.work_changed()

    def get_under_replicated(self, ledger_id: LedgerId) -> UnderReplicatedLedger | None:
        self._s.check(f"reading the record of ledger {ledger_id}")
        row = self._c.records.get(int(ledger_id))
        if row is None:
            return None
        return UnderReplicatedLedger(LedgerId(int(ledger_id)), tuple(BookieId(r) for r in row[1]), row[2], row[0])

    def list_under_replicated(self) -> Iterator[UnderReplicatedLedger]:
        self._s.check("listing under-replicated ledgers")
        rows = sorted(self._c.records.items())
        return iter([UnderReplicatedLedger(LedgerId(lid), tuple(BookieId(r) for r in row[1]), row[2], row[0])
                     for lid, row in rows])

    def acquire_ledger_to_rereplicate(self, exclude: Collection[int] = (), *,
                                      worker_id: str | None = None) -> LedgerId | None:
        self._s.check("acquiring a ledger to re-replicate")
        c = self._c
        self._s._scanned = c.changes
        if not c.replication_enabled:
            return None
        for lid in sorted(c.records):
            if lid in exclude or lid in c.locks:
                continue
            owner = socket.gethostname() if worker_id is None else worker_id
            c.locks[lid] = (self._s.session_id, owner, c.records[lid][0])
            return LedgerId(lid)
        return None

    def wait_for_work(self, timeout_s: float) -> bool:
        self._s.check("waiting for work")
        if self._s._scanned is None or self._s._scanned != self._c.changes:
            return True
        self._c.block(timeout_s)
        return False

    def release_ledger(self, ledger_id: LedgerId) -> None:
        self._s.check(f"releasing ledger {ledger_id}")
        lock = self._c.locks.get(int(ledger_id))
        if lock is not None and lock[0] == self._s.session_id:
            del self._c.locks[int(ledger_id)]
            self._c.work_changed()

    def mark_replicated(self, ledger_id: LedgerId, expected_version: int | None = None) -> bool:
        self._s.check(f"marking ledger {ledger_id} replicated")
        c, lid = self._c, int(ledger_id)
        lock = c.locks.get(lid)
        mine = lock is not None and lock[0] == self._s.session_id
        if expected_version is None and mine:
            assert lock is not None
            expected_version = lock[2]
        row = c.records.get(lid)
        deleted = row is not None and (expected_version is None or row[0] == expected_version)
        if deleted:
            del c.records[lid]
            if c.on_record is not None:
                c.on_record("ur-replicated", lid, self._s.name)
        if mine:
            del c.locks[lid]
            c.work_changed()
        return deleted

    def is_locked(self, ledger_id: LedgerId) -> bool:
        self._s.check(f"reading the lock of ledger {ledger_id}")
        return int(ledger_id) in self._c.locks

    def lock_owner(self, ledger_id: LedgerId) -> str | None:
        self._s.check(f"reading the lock of ledger {ledger_id}")
        lock = self._c.locks.get(int(ledger_id))
        return None if lock is None else lock[1]

    def disable_replication(self) -> None:
        self._s.check("disabling replication")
        self._c.replication_enabled = False

    def enable_replication(self) -> None:
        self._s.check("enabling replication")
        if not self._c.replication_enabled:
            self._c.replication_enabled = True
            self._c.work_changed()

    def is_replication_enabled(self) -> bool:
        self._s.check("reading the replication switch")
        return self._c.replication_enabled

    def wait_replication_enabled(self, timeout_s: float) -> bool:
        """Does not block (single-threaded): whether replication is enabled now."""
        return self.is_replication_enabled()

    def get_lost_bookie_recovery_delay(self) -> int | None:
        self._s.check("reading the lost bookie recovery delay")
        return self._c.delay

    def set_lost_bookie_recovery_delay(self, seconds: int) -> None:
        if seconds < 0:
            raise IncorrectParameterError(f"lost bookie recovery delay must be >= 0 s, got {seconds}")
        self._s.check("setting the lost bookie recovery delay")
        self._c.delay = int(seconds)
        for w in list(self._c.delay_watches):
            self._c.deliver(w.fire)

    def watch_lost_bookie_recovery_delay(self, callback: DelayWatcher) -> Watch:
        self._s.check("watching the lost bookie recovery delay")
        w = _Watch(self._c.delay_watches, lambda: callback(self._c.delay))
        callback(self._c.delay)
        return w

    def _get_ctime(self, name: str) -> int | None:
        self._s.check(f"reading {name}")
        return self._c.ctimes.get(name)

    def _set_ctime(self, name: str, ctime_ms: int) -> None:
        self._s.check(f"writing {name}")
        self._c.ctimes[name] = int(ctime_ms)

    def get_check_all_ledgers_ctime(self) -> int | None:
        return self._get_ctime("checkallledgersctime")

    def set_check_all_ledgers_ctime(self, ctime_ms: int) -> None:
        self._set_ctime("checkallledgersctime", ctime_ms)

    def get_placement_policy_check_ctime(self) -> int | None:
        return self._get_ctime("placementpolicycheckctime")

    def set_placement_policy_check_ctime(self, ctime_ms: int) -> None:
        self._set_ctime("placementpolicycheckctime", ctime_ms)

    def get_replicas_check_ctime(self) -> int | None:
        return self._get_ctime("replicascheckctime")

    def set_replicas_check_ctime(self, ctime_ms: int) -> None:
        self._set_ctime("replicascheckctime", ctime_ms)

    def elect_auditor(self, bookie_id: BookieId, on_leader: Callable[[], None] | None = None, *,
                      on_lost: Callable[[], None] | None = None) -> AuditorElection:
        self._s.check("running for auditor")
        cand = _SimCandidacy(self._s, bookie_id, on_leader, on_lost)
        self._s._candidacies.append(cand)
        cand.vote()
        self._c.elect()
        return cand

    def current_auditor(self) -> BookieId | None:
        self._s.check("reading the auditor election")
        return self._s._current_auditor()


class SimMetadataStore(MetadataStore):
    """One session on a simulated cluster (see the module docstring): the first one made with
    a loop makes the cluster, ``session(name)`` opens others on it."""

    uri = "sim://"

    def __init__(self, loop: asyncio.AbstractEventLoop, on_write: WriteHook | None = None, *,
                 name: str = "store", cluster: SimCluster | None = None) -> None:
        self.cluster = cluster if cluster is not None else SimCluster(loop)
        if on_write is not None:
            self.cluster.ledgers.on_write = on_write
        self.name = name
        self._id = self.cluster.new_session_id()
        self.expired = False
        self._closed = False
        self._listeners: list[SessionListener] = []
        #: this session's registrations, re-created after a new session
        self._registered: dict[BookieId, tuple[bool, bytes]] = {}
        self._candidacies: list[_SimCandidacy] = []
        #: ``changes`` when this session last looked for work (None: never)
        self._scanned: int | None = None
        self._ledgers = _SessionLedgers(self)
        self._registration = _SessionRegistration(self)
        self._kv = _SessionKv(self)
        self._underreplication = _SessionUnderReplication(self)

    def session(self, name: str) -> SimMetadataStore:
        """Another session on the same cluster (another process's store)."""
        return SimMetadataStore(self.cluster.loop, name=name, cluster=self.cluster)

    # ------------------------------------------------------------------------- the session
    def check(self, what: str) -> None:
        """Raise what a driver raises while its session is gone."""
        if self._closed:
            raise MetadataStoreUnavailableError(f"simulated store of {self.name} is closed ({what})")
        if self.expired:
            raise MetadataStoreUnavailableError(
                f"simulated ZooKeeper unavailable while {what}: SessionExpiredError (session of {self.name})")

    def _purge(self) -> None:
        """The session's ephemeral state goes: registrations, locks, votes."""
        c, sid = self.cluster, self._id
        gone = [b for b, (_ro, owner, _d) in c.bookies.items() if owner == sid]
        for b in gone:
            del c.bookies[b]
        if gone:
            c.bookies_changed()
        locks = [lid for lid, lock in c.locks.items() if lock[0] == sid]
        for lid in locks:
            del c.locks[lid]
        if locks:
            c.work_changed()
        for cand in self._candidacies:
            cand.withdraw()
            cand.state.lost()
        c.elect()

    def _emit(self, event: SessionEvent) -> None:
        for fn in list(self._listeners):
            self.cluster.deliver(lambda fn=fn: fn(event))  # type: ignore[misc]

    def expire(self, outage_s: float) -> bool:
        """The server ends this session (see the module docstring); False if it is not live."""
        if self.expired or self._closed:
            return False
        self.expired = True
        self._purge()
        self._emit(SessionEvent.EXPIRED)
        self.cluster.loop.call_later(outage_s, self._renew)
        return True

    def _renew(self) -> None:
        if self._closed:
            return
        c = self.cluster
        self._id = c.new_session_id()
        self.expired = False
        self._scanned = None
        for b, (ro, data) in self._registered.items():
            c.bookies[b] = (ro, self._id, data)
        if self._registered:
            c.bookies_changed()
        for cand in self._candidacies:
            cand.vote()
        c.elect()
        self._emit(SessionEvent.RECONNECTED)

    def _current_auditor(self) -> BookieId | None:
        lead = self.cluster.leader_vote()
        return None if lead is None else lead[1].bookie_id

    # --------------------------------------------------------------------- the managers
    @property
    def ledgers(self) -> LedgerManager:
        return self._ledgers

    @property
    def id_generator(self) -> LedgerIdGenerator:
        return self._ledgers

    def password_of(self, ledger_id: int) -> bytes | None:
        """The password in a ledger's stored metadata (None: no such ledger); for the simulated
        bookies' master-key check."""
        return self.cluster.ledgers.password_of(ledger_id)

    @property
    def registration(self) -> RegistrationManager:
        return self._registration

    @property
    def layout(self) -> LayoutManager:
        raise MetaStoreError("the layout is not simulated")

    @property
    def kv(self) -> KeyValueStore:
        return self._kv

    @property
    def underreplication(self) -> UnderReplicationManager:
        return self._underreplication

    @property
    def session_id(self) -> int:
        return self._id

    def is_formatted(self) -> bool:
        return True

    def format(self, ledger_manager_type: str | None = None, *, force: bool = False) -> str:
        return "simulated"

    def add_session_listener(self, listener: SessionListener) -> Callable[[], None]:
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    # --------------------------------------------------------- the simulator's hooks
    def take_block(self) -> _Blocked | None:
        return self.cluster.take_block()

    def wake_after(self, blocked: _Blocked, then: Callable[[], None]) -> None:
        self.cluster.wake_after(blocked, then)

    def close(self) -> None:
        if self._closed:
            return
        for cand in self._candidacies:
            cand.state.close()  # no callback after the end of the session
        self._purge()
        self._candidacies = []
        self._registered = {}
        self._closed = True
