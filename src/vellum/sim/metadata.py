"""``SimMetadataStore``: an in-memory metadata driver for the simulator.

Responsibility: the parts of ``meta.api`` the client and the simulated bookies use, with the
embedded driver's semantics (``meta/sqlite.py``): versions start at 0 and grow by one per write;
a write is a compare-and-set on the version; ``create_ledger_with_id`` accepts a row carrying
the caller's creator token as the caller's own earlier create; a delete of a missing ledger
succeeds; bookie registrations and their watches. Metadata travels serialized
(``serialize_ledger_metadata``), so every reader gets its own copy, as from a real store.

Not simulated (these raise ``MetaStoreError``): the layout, the key-value area, cookies and
AutoRecovery's records. Watch callbacks run on the loop (``call_soon``), after the change.

Invariants: single-threaded (the simulator's loop); calls are synchronous: the latency and the
faults of the store (lost replies) are the loop's executor hook's business (``runner``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

from vellum.errors import LedgerExistsError, MetadataVersionError, MetaStoreError, NoSuchLedgerError
from vellum.ids import BookieId, LedgerId
from vellum.meta.api import (
    BookiesWatcher,
    KeyValueStore,
    LayoutManager,
    LedgerIdGenerator,
    LedgerManager,
    LedgerRange,
    LedgerWatcher,
    MetadataStore,
    RegistrationManager,
    SessionListener,
    UnderReplicationManager,
    Versioned,
    Watch,
)
from vellum.meta.model import LedgerMetadata, deserialize_ledger_metadata, serialize_ledger_metadata


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


class _Ledgers(LedgerManager, LedgerIdGenerator):
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.on_write: WriteHook | None = None
        self._rows: dict[int, tuple[int, bytes]] = {}
        #: ledger id -> (the stored row it was parsed from, its password): see ``password_of``
        self._passwords: dict[int, tuple[bytes, bytes]] = {}
        self._last_id = 0
        self._watches: dict[int, list[_Watch]] = {}

    def generate_ledger_id(self) -> LedgerId:
        self._last_id += 1
        return LedgerId(self._last_id)

    def _changed(self, ledger_id: int) -> None:
        for w in list(self._watches.get(ledger_id, [])):
            self._loop.call_soon(w.fire)

    def create_ledger(self, metadata: LedgerMetadata) -> tuple[LedgerId, int]:
        ledger_id = self.generate_ledger_id()
        while ledger_id in self._rows:
            ledger_id = self.generate_ledger_id()
        self._rows[ledger_id] = (0, serialize_ledger_metadata(metadata))
        return ledger_id, 0

    def create_ledger_with_id(self, ledger_id: LedgerId, metadata: LedgerMetadata) -> int:
        row = self._rows.get(ledger_id)
        if row is None:
            self._rows[ledger_id] = (0, serialize_ledger_metadata(metadata))
            self._last_id = max(self._last_id, int(ledger_id))
            return 0
        held = deserialize_ledger_metadata(row[1], where=f"sim ledgers[{ledger_id}]")
        if metadata.creator_token and held.creator_token == metadata.creator_token:
            return 0
        raise LedgerExistsError(f"ledger {ledger_id} already exists (simulated store, another creator)")

    def read_ledger(self, ledger_id: LedgerId) -> Versioned[LedgerMetadata]:
        row = self._rows.get(ledger_id)
        if row is None:
            raise NoSuchLedgerError(f"no ledger {ledger_id} (simulated store)")
        return Versioned(deserialize_ledger_metadata(row[1], where=f"sim ledgers[{ledger_id}]"), row[0])

    def write_ledger(self, ledger_id: LedgerId, metadata: LedgerMetadata, expected_version: int) -> int:
        row = self._rows.get(ledger_id)
        if row is None:
            raise NoSuchLedgerError(f"no ledger {ledger_id} (simulated store)")
        if row[0] != expected_version:
            raise MetadataVersionError(
                f"ledger {ledger_id} changed: expected version {expected_version}, the store has {row[0]}")
        self._rows[ledger_id] = (row[0] + 1, serialize_ledger_metadata(metadata))
        if self.on_write is not None:
            self.on_write(ledger_id, metadata)
        self._changed(ledger_id)
        return row[0] + 1

    def delete_ledger(self, ledger_id: LedgerId, expected_version: int | None = None) -> None:
        row = self._rows.get(ledger_id)
        if row is None:
            return
        if expected_version is not None and row[0] != expected_version:
            raise MetadataVersionError(
                f"ledger {ledger_id} changed: expected version {expected_version}, the store has {row[0]}")
        del self._rows[ledger_id]
        self._changed(ledger_id)

    def ledger_exists(self, ledger_id: LedgerId) -> bool:
        return ledger_id in self._rows

    def password_of(self, ledger_id: int) -> bytes | None:
        """The password in a ledger's stored metadata, None if it has none: what a simulated
        bookie's master-key check asks on every first add of a ledger. Parsed once per stored
        row (the cache keeps the row it parsed and is used only while that row is the stored one)."""
        row = self._rows.get(ledger_id)
        if row is None:
            return None
        cached = self._passwords.get(ledger_id)
        if cached is not None and cached[0] is row[1]:
            return cached[1]
        password = deserialize_ledger_metadata(row[1], where=f"sim ledgers[{ledger_id}]").password
        self._passwords[ledger_id] = (row[1], password)
        return password

    def ledger_ranges(self, start_after: LedgerId | None = None) -> Iterator[LedgerRange]:
        ids = sorted(i for i in self._rows if start_after is None or i > start_after)
        if ids:
            yield LedgerRange(tuple(LedgerId(i) for i in ids))

    def watch_ledger(self, ledger_id: LedgerId, callback: LedgerWatcher) -> Watch:
        def fire() -> None:
            row = self._rows.get(ledger_id)
            callback(ledger_id, None if row is None else Versioned(
                deserialize_ledger_metadata(row[1], where=f"sim ledgers[{ledger_id}]"), row[0]))

        return _Watch(self._watches.setdefault(ledger_id, []), fire)


class _Registration(RegistrationManager):
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._bookies: dict[BookieId, bool] = {}  # bookie id -> read-only
        self._watches: list[_Watch] = []

    def _changed(self) -> None:
        for w in list(self._watches):
            self._loop.call_soon(w.fire)

    def register_bookie(self, bookie_id: BookieId, *, read_only: bool = False, data: bytes = b"") -> None:
        self._bookies[bookie_id] = read_only
        self._changed()

    def get_bookie_data(self, bookie_id: BookieId) -> bytes | None:
        return b"" if bookie_id in self._bookies else None

    def unregister_bookie(self, bookie_id: BookieId) -> None:
        if self._bookies.pop(bookie_id, None) is not None:
            self._changed()

    def list_bookies(self, *, read_only: bool = False) -> frozenset[BookieId]:
        return frozenset(b for b, ro in self._bookies.items() if ro == read_only)

    def watch_bookies(self, callback: BookiesWatcher, *, read_only: bool = False) -> Watch:
        w = _Watch(self._watches, lambda: callback(self.list_bookies(read_only=read_only)))
        self._loop.call_soon(w.fire)
        return w

    def get_cookie(self, bookie_id: BookieId) -> Versioned[bytes] | None:
        raise MetaStoreError("cookies are not simulated")

    def put_cookie(self, bookie_id: BookieId, data: bytes, expected_version: int | None) -> int:
        raise MetaStoreError("cookies are not simulated")

    def remove_cookie(self, bookie_id: BookieId, expected_version: int | None = None) -> None:
        raise MetaStoreError("cookies are not simulated")

    def list_cookies(self) -> frozenset[BookieId]:
        return frozenset(self._bookies)

    def get_instance_id(self) -> str | None:
        return "simulated"


class SimMetadataStore(MetadataStore):
    """One in-memory store shared by every simulated client and bookie (see the module docstring)."""

    uri = "sim://"

    def __init__(self, loop: asyncio.AbstractEventLoop, on_write: WriteHook | None = None) -> None:
        self._ledgers = _Ledgers(loop)
        self._ledgers.on_write = on_write
        self._registration = _Registration(loop)

    @property
    def ledgers(self) -> LedgerManager:
        return self._ledgers

    @property
    def id_generator(self) -> LedgerIdGenerator:
        return self._ledgers

    def password_of(self, ledger_id: int) -> bytes | None:
        """The password in a ledger's stored metadata (None: no such ledger); for the simulated
        bookies' master-key check."""
        return self._ledgers.password_of(ledger_id)

    @property
    def registration(self) -> RegistrationManager:
        return self._registration

    @property
    def layout(self) -> LayoutManager:
        raise MetaStoreError("the layout is not simulated")

    @property
    def kv(self) -> KeyValueStore:
        raise MetaStoreError("the key-value area is not simulated")

    @property
    def underreplication(self) -> UnderReplicationManager:
        raise MetaStoreError("AutoRecovery's records are not simulated")

    @property
    def session_id(self) -> int:
        return 1

    def is_formatted(self) -> bool:
        return True

    def format(self, ledger_manager_type: str | None = None, *, force: bool = False) -> str:
        return "simulated"

    def add_session_listener(self, listener: SessionListener) -> Callable[[], None]:
        return lambda: None

    def close(self) -> None:
        pass
