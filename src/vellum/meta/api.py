"""The metadata-store interfaces every driver implements (ZooKeeper, embedded SQLite).

Responsibility: the contracts of BookKeeper's metadata roles, driver-independent:
``LedgerManager`` (ledger metadata with compare-and-set), ``LedgerIdGenerator``,
``RegistrationManager`` (bookie registration, cookies, instance id), ``LayoutManager``,
``KeyValueStore`` (small versioned records for later features), ``UnderReplicationManager``
(AutoRecovery's records, locks, switch and auditor election), and ``MetadataStore`` which
owns one session and hands out the others.

Invariants every driver keeps (the contract suite in tests/meta checks them):
- versions are opaque ints chosen by the store; a write succeeds only if the caller's expected
  version is the stored one (else ``MetadataVersionError``), and every successful write yields a
  new version;
- ``create`` of something that exists fails (``LedgerExistsError`` for ledgers,
  ``MetadataVersionError`` for key-value records); ``delete`` of something absent succeeds;
- ledger ids from the generator are unique across every process sharing the store;
- bookie registrations are ephemeral: they vanish when the owning session ends (expiry, close,
  crash); a store re-registers its bookies after it gets a new session;
- so are re-replication locks and auditor election votes; a candidate whose vote died with its
  session runs again (with a new vote) once the store has a new session;
- watch callbacks run on a driver thread, never while the driver holds a lock, and must not block;
- every method is safe to call from several threads; the calls block (the asyncio client runs
  them in a thread executor).
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from vellum.ids import BookieId, LedgerId
from vellum.meta.model import LedgerLayout, LedgerMetadata

T = TypeVar("T")


@dataclass(frozen=True)
class Versioned(Generic[T]):
    """A value and the store's version of it (the ``expected_version`` of the next CAS)."""

    value: T
    version: int


@dataclass(frozen=True)
class LedgerRange:
    """A sorted batch of existing ledger ids (one hierarchical leaf node, or one page of a flat list)."""

    ledger_ids: tuple[LedgerId, ...]

    @property
    def start(self) -> LedgerId:
        return self.ledger_ids[0]

    @property
    def end(self) -> LedgerId:
        return self.ledger_ids[-1]


class SessionEvent(enum.Enum):
    """What happened to the store's session.

    EXPIRED: the session is gone: ephemeral registrations vanished and a client must assume it
    may have been fenced (another writer may have recovered its ledgers).
    RECONNECTED: a new session exists and the store's bookie registrations were re-created.
    """

    EXPIRED = "expired"
    RECONNECTED = "reconnected"


class Watch(ABC):
    """A registered watch; ``cancel()`` stops further callbacks (idempotent)."""

    @abstractmethod
    def cancel(self) -> None: ...


LedgerWatcher = Callable[[LedgerId, "Versioned[LedgerMetadata] | None"], None]
"""Called with the ledger's current metadata after a change; ``None`` once it is deleted."""

BookiesWatcher = Callable[[frozenset[BookieId]], None]
"""Called with the full current set of registered bookies (of the watched kind) after a change."""

SessionListener = Callable[[SessionEvent], None]


class LedgerIdGenerator(ABC):
    """Hands out ledger ids unique across every client of the store."""

    @abstractmethod
    def generate_ledger_id(self) -> LedgerId: ...


class LedgerManager(ABC):
    """Ledger metadata: create, read, compare-and-set write, delete, iterate, watch."""

    @abstractmethod
    def create_ledger(self, metadata: LedgerMetadata) -> tuple[LedgerId, int]:
        """Store ``metadata`` under a freshly generated id; returns (ledger id, version)."""

    @abstractmethod
    def create_ledger_with_id(self, ledger_id: LedgerId, metadata: LedgerMetadata) -> int:
        """Store ``metadata`` under ``ledger_id``; ``LedgerExistsError`` if taken. Returns the version."""

    @abstractmethod
    def read_ledger(self, ledger_id: LedgerId) -> Versioned[LedgerMetadata]:
        """Current metadata and version; ``NoSuchLedgerError`` if absent, ``MetaStoreError`` if unreadable."""

    @abstractmethod
    def write_ledger(self, ledger_id: LedgerId, metadata: LedgerMetadata, expected_version: int) -> int:
        """Compare-and-set: replace only if the stored version is ``expected_version``.

        Returns the new version; ``MetadataVersionError`` on a conflict, ``NoSuchLedgerError``
        if the ledger was deleted.
        """

    @abstractmethod
    def delete_ledger(self, ledger_id: LedgerId, expected_version: int | None = None) -> None:
        """Delete (idempotent: absent is fine); with a version, ``MetadataVersionError`` on mismatch."""

    @abstractmethod
    def ledger_exists(self, ledger_id: LedgerId) -> bool: ...

    @abstractmethod
    def ledger_ranges(self, start_after: LedgerId | None = None) -> Iterator[LedgerRange]:
        """Existing ledger ids in ascending order, one bounded batch at a time (lazy).

        Ids created or deleted during the iteration may or may not appear. A failure raises:
        callers (GC) must never treat a partial listing as complete.
        """

    def iter_ledger_ids(self, start_after: LedgerId | None = None) -> Iterator[LedgerId]:
        """Every existing ledger id, ascending, without holding them all in memory."""
        for r in self.ledger_ranges(start_after):
            yield from r.ledger_ids

    @abstractmethod
    def watch_ledger(self, ledger_id: LedgerId, callback: LedgerWatcher) -> Watch:
        """Call ``callback`` after each change of the ledger's metadata (and once on delete)."""


class RegistrationManager(ABC):
    """Bookie registration (ephemeral, writable or read-only), cookies and the instance id."""

    @abstractmethod
    def register_bookie(self, bookie_id: BookieId, *, read_only: bool = False, data: bytes = b"") -> None:
        """Register (or move between writable and read-only) for as long as this session lives.

        The store remembers the registration and re-creates it after a new session.
        """

    @abstractmethod
    def get_bookie_data(self, bookie_id: BookieId) -> bytes | None:
        """The data a live registration of ``bookie_id`` carries (writable or read-only), or
        None when it is not registered. Bookies put their service info there (admin HTTP
        address), as BookKeeper's BookieServiceInfo does."""

    @abstractmethod
    def unregister_bookie(self, bookie_id: BookieId) -> None:
        """Remove this store's registration of ``bookie_id`` (idempotent)."""

    @abstractmethod
    def list_bookies(self, *, read_only: bool = False) -> frozenset[BookieId]:
        """Bookies registered as writable (default) or read-only, with live sessions."""

    @abstractmethod
    def watch_bookies(self, callback: BookiesWatcher, *, read_only: bool = False) -> Watch:
        """Call ``callback`` with the new set after each change (and once at once with the current set)."""

    @abstractmethod
    def get_cookie(self, bookie_id: BookieId) -> Versioned[bytes] | None: ...

    @abstractmethod
    def put_cookie(self, bookie_id: BookieId, data: bytes, expected_version: int | None) -> int:
        """Create (``expected_version=None``) or CAS-update a cookie; returns the new version."""

    @abstractmethod
    def remove_cookie(self, bookie_id: BookieId, expected_version: int | None = None) -> None: ...

    @abstractmethod
    def list_cookies(self) -> frozenset[BookieId]:
        """Every bookie id the store holds a cookie for: each bookie that ever joined the
        cluster and was not decommissioned, running or not (BookKeeper's ``getAllBookies``)."""

    @abstractmethod
    def get_instance_id(self) -> str | None:
        """The cluster's instance id (a UUID written at format time), or None if not formatted."""


class LayoutManager(ABC):
    """The cluster's ledger layout, written once by format."""

    @abstractmethod
    def read_layout(self) -> LedgerLayout | None: ...

    @abstractmethod
    def store_layout(self, layout: LedgerLayout) -> None:
        """Write the layout; ``MetadataVersionError`` if one exists already."""

    @abstractmethod
    def delete_layout(self) -> None: ...


class KeyValueStore(ABC):
    """Small versioned records under path-like keys (``"named/ns/ledger-a"``): for later features.

    Keys are non-empty '/'-separated segments of ``[A-Za-z0-9._~:@=+-]`` (no empty, '.' or '..'
    segment), at most 1024 characters; values are small (< 1 MB) bytes.
    """

    @abstractmethod
    def get(self, key: str) -> Versioned[bytes] | None: ...

    @abstractmethod
    def create(self, key: str, value: bytes) -> int:
        """Create; ``MetadataVersionError`` if the key exists. Returns the version."""

    @abstractmethod
    def cas(self, key: str, value: bytes, expected_version: int) -> int:
        """Replace only at ``expected_version``; ``MetadataVersionError`` otherwise (also if absent)."""

    @abstractmethod
    def delete(self, key: str, expected_version: int | None = None) -> bool:
        """Delete; returns whether it existed. ``MetadataVersionError`` on a version mismatch."""

    @abstractmethod
    def list(self, prefix: str = "", *, start_after: str | None = None, limit: int | None = None) -> list[str]:
        """Keys starting with ``prefix`` (a string prefix, not only whole segments), sorted."""


@dataclass(frozen=True)
class UnderReplicatedLedger:
    """A ledger the auditor marked for re-replication (BookKeeper's ``UnderreplicatedLedger``).

    ``replicas`` are the missing bookies (sorted); ``ctime_ms`` is when the record was created or
    last gained a replica (``-1`` if the writer stored none); ``version`` is the store's version,
    the ``expected_version`` of ``mark_replicated``.
    """

    ledger_id: LedgerId
    replicas: tuple[BookieId, ...]
    ctime_ms: int
    version: int


DelayWatcher = Callable[[int | None], None]
"""Called with the lost-bookie recovery delay (seconds, or None when unset)."""


class AuditorElection(ABC):
    """One candidacy in the auditor election (at most one leader per cluster at a time).

    The lowest live vote leads. When the leader resigns or its session ends, the next candidate
    leads and its ``on_leader`` runs (on a driver thread, must not block). A leader whose session
    expires stops leading (``on_lost`` runs) and, once the store has a new session, runs again
    with a new vote at the end of the line. As with any lease, a leader cut off from the store
    learns that it lost only when its session is declared expired.
    """

    @property
    @abstractmethod
    def bookie_id(self) -> BookieId: ...

    @property
    @abstractmethod
    def is_leader(self) -> bool:
        """Whether this candidate is the auditor now."""

    @abstractmethod
    def leader(self) -> BookieId | None:
        """The current auditor's bookie id (any candidate's), or None if nobody runs."""

    @abstractmethod
    def wait_leader(self, timeout_s: float) -> bool:
        """Block until this candidate leads (True) or ``timeout_s`` passed / it resigned (False)."""

    @abstractmethod
    def resign(self) -> None:
        """Withdraw the vote (the next candidate takes over); no callback runs after it. Idempotent."""

    def __enter__(self) -> AuditorElection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.resign()


class UnderReplicationManager(ABC):
    """AutoRecovery's metadata: under-replicated ledgers, their locks, the global switch, the
    lost-bookie recovery delay, audit timestamps and the auditor election (BookKeeper's
    ``LedgerUnderreplicationManager`` and ``LedgerAuditorManager``).

    Locks and votes belong to this store's session: they vanish when it ends. The records, the
    switch, the delay and the timestamps are persistent.
    """

    # -- under-replicated ledgers ---------------------------------------------------------

    @abstractmethod
    def mark_under_replicated(self, ledger_id: LedgerId, missing_replicas: Iterable[str]) -> None:
        """Create the record, or add the bookies to its replica set (idempotent; a new replica
        bumps the version and the ctime, so a worker busy with the old version keeps the record)."""

    @abstractmethod
    def get_under_replicated(self, ledger_id: LedgerId) -> UnderReplicatedLedger | None: ...

    @abstractmethod
    def list_under_replicated(self) -> Iterator[UnderReplicatedLedger]:
        """Every record, in ledger id order, read lazily."""

    @abstractmethod
    def acquire_ledger_to_rereplicate(
        self, exclude: Collection[int] = (), *, worker_id: str | None = None
    ) -> LedgerId | None:
        """Take the lock of a record nobody holds (not in ``exclude``) for this session; its id,
        or None when there is none or replication is disabled. Never blocks on other workers.

        ``worker_id`` is written into the lock (``lock_owner``); default: this host's name.
        """

    @abstractmethod
    def wait_for_work(self, timeout_s: float) -> bool:
        """After an ``acquire_ledger_to_rereplicate`` of this thread found nothing: block until
        something changed that may make a record available (a record marked, a lock released,
        replication enabled: True) or ``timeout_s`` passed (False). True at once if this thread
        never tried to acquire."""

    @abstractmethod
    def release_ledger(self, ledger_id: LedgerId) -> None:
        """Give this session's lock back without finishing (idempotent)."""

    @abstractmethod
    def mark_replicated(self, ledger_id: LedgerId, expected_version: int | None = None) -> bool:
        """Delete the record and release this session's lock; whether the record was deleted.

        The record stays when its version is no longer ``expected_version`` (it was marked again,
        e.g. a second bookie was lost). ``None``: the version seen when this session acquired the
        ledger, or any version if it did not. Idempotent; call again after an unavailable store.
        """

    @abstractmethod
    def is_locked(self, ledger_id: LedgerId) -> bool:
        """Whether some live session holds the ledger's lock."""

    @abstractmethod
    def lock_owner(self, ledger_id: LedgerId) -> str | None:
        """The worker id in the ledger's lock ("" if the lock names none), None if unlocked."""

    # -- global switch and delay ----------------------------------------------------------

    @abstractmethod
    def disable_replication(self) -> None:
        """Stop handing out work to replication workers (idempotent; the auditor keeps marking)."""

    @abstractmethod
    def enable_replication(self) -> None:
        """Resume replication (idempotent)."""

    @abstractmethod
    def is_replication_enabled(self) -> bool: ...

    @abstractmethod
    def wait_replication_enabled(self, timeout_s: float) -> bool:
        """Block until replication is enabled (True) or ``timeout_s`` passed (False)."""

    @abstractmethod
    def get_lost_bookie_recovery_delay(self) -> int | None:
        """Seconds the auditor waits after losing a bookie; None when unset (config applies)."""

    @abstractmethod
    def set_lost_bookie_recovery_delay(self, seconds: int) -> None: ...

    @abstractmethod
    def watch_lost_bookie_recovery_delay(self, callback: DelayWatcher) -> Watch:
        """Call ``callback`` at once with the current delay and after each change."""

    # -- audit timestamps (ms since the epoch; None if never set) -------------------------

    @abstractmethod
    def get_check_all_ledgers_ctime(self) -> int | None: ...

    @abstractmethod
    def set_check_all_ledgers_ctime(self, ctime_ms: int) -> None: ...

    @abstractmethod
    def get_placement_policy_check_ctime(self) -> int | None: ...

    @abstractmethod
    def set_placement_policy_check_ctime(self, ctime_ms: int) -> None: ...

    @abstractmethod
    def get_replicas_check_ctime(self) -> int | None: ...

    @abstractmethod
    def set_replicas_check_ctime(self, ctime_ms: int) -> None: ...

    # -- auditor election -----------------------------------------------------------------

    @abstractmethod
    def elect_auditor(
        self,
        bookie_id: BookieId,
        on_leader: Callable[[], None] | None = None,
        *,
        on_lost: Callable[[], None] | None = None,
    ) -> AuditorElection:
        """Run for auditor as ``bookie_id``; returns at once (``wait_leader`` to block)."""

    @abstractmethod
    def current_auditor(self) -> BookieId | None:
        """The elected auditor's bookie id, or None; needs no candidacy."""


@dataclass(frozen=True)
class ClusterInfo:
    """What ``clusterinfo`` shows."""

    instance_id: str | None
    layout: LedgerLayout | None
    writable_bookies: int
    read_only_bookies: int
    ledger_count: int
    #: bookies with a cookie or a registration; those neither writable nor read-only are down
    total_bookies: int = 0

    @property
    def unavailable_bookies(self) -> int:
        return self.total_bookies - self.writable_bookies - self.read_only_bookies


class MetadataStore(ABC):
    """One connection (session) to a metadata store and the managers that share it."""

    uri: str

    @property
    @abstractmethod
    def ledgers(self) -> LedgerManager:
        """The cluster's ledger manager; ``MetaStoreError`` if the cluster is not formatted."""

    @property
    @abstractmethod
    def id_generator(self) -> LedgerIdGenerator: ...

    @property
    @abstractmethod
    def registration(self) -> RegistrationManager: ...

    @property
    @abstractmethod
    def layout(self) -> LayoutManager: ...

    @property
    @abstractmethod
    def kv(self) -> KeyValueStore: ...

    @property
    @abstractmethod
    def underreplication(self) -> UnderReplicationManager:
        """AutoRecovery's records, locks, switch and election (works before format too)."""

    @property
    @abstractmethod
    def session_id(self) -> int:
        """Id of the current session (changes after an expiry)."""

    @abstractmethod
    def is_formatted(self) -> bool: ...

    @abstractmethod
    def format(self, ledger_manager_type: str | None = None, *, force: bool = False) -> str:
        """Initialise the cluster (paths, layout, instance id); returns the instance id.

        ``MetaStoreError`` if already formatted and not ``force``; ``force`` wipes everything.
        """

    @abstractmethod
    def add_session_listener(self, listener: SessionListener) -> Callable[[], None]:
        """Be told about session expiry / renewal; returns a function that removes the listener."""

    @abstractmethod
    def close(self) -> None:
        """End the session (its registrations vanish) and release resources; idempotent."""

    def cluster_info(self) -> ClusterInfo:
        layout = self.layout.read_layout()
        count = sum(len(r.ledger_ids) for r in self.ledgers.ledger_ranges()) if layout else 0
        reg = self.registration
        writable = reg.list_bookies()
        read_only = reg.list_bookies(read_only=True) - writable
        # A registered bookie always has a cookie; the union keeps the count of down bookies
        # from going negative if one was removed by hand while the bookie runs.
        known = reg.list_cookies() | writable | read_only
        return ClusterInfo(
            instance_id=reg.get_instance_id(),
            layout=layout,
            writable_bookies=len(writable),
            read_only_bookies=len(read_only),
            ledger_count=count,
            total_bookies=len(known),
        )

    def __enter__(self) -> MetadataStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
