"""The metadata-store interfaces every driver implements (ZooKeeper, embedded SQLite).

Responsibility: the contracts of BookKeeper's metadata roles, driver-independent:
``LedgerManager`` (ledger metadata with compare-and-set), ``LedgerIdGenerator``,
``RegistrationManager`` (bookie registration, cookies, instance id), ``LayoutManager``,
``KeyValueStore`` (small versioned records for later features), and ``MetadataStore`` which
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
- watch callbacks run on a driver thread, never while the driver holds a lock, and must not block;
- every method is safe to call from several threads; the calls block (the asyncio client runs
  them in a thread executor).
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
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
class ClusterInfo:
    """What ``clusterinfo`` shows."""

    instance_id: str | None
    layout: LedgerLayout | None
    writable_bookies: int
    read_only_bookies: int
    ledger_count: int


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
        return ClusterInfo(
            instance_id=self.registration.get_instance_id(),
            layout=layout,
            writable_bookies=len(self.registration.list_bookies()),
            read_only_bookies=len(self.registration.list_bookies(read_only=True)),
            ledger_count=count,
        )

    def __enter__(self) -> MetadataStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
