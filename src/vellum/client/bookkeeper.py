"""The asyncio client (``vellum.aio.BookKeeper``): create, open (with recovery), delete and list ledgers.

Responsibility: own the client's shared parts (metadata store session, bookie connections,
placement policy, the live lists of writable and read-only bookies) and hand out
:class:`~vellum.client.ledger.LedgerHandle` objects. BookKeeper's ``BookKeeper`` class.

Invariants:
- metadata-store calls block: they always run in a worker thread (``asyncio.to_thread``), never
  on the loop;
- the bookie lists follow the store's registrations (watches), so placement never picks a bookie
  that is gone or read-only as far as the store knows;
- a ledger is created OPEN with an ensemble chosen by the placement policy and
  ``E >= WQ >= AQ >= 1``; opening checks the password against the metadata before touching any
  bookie (a wrong one is ``UnauthorizedAccessError``) and takes the digest type from the metadata;
- open with recovery returns a read handle on the CLOSED ledger (``recovery.py``); open without
  recovery never fences and learns the LAC from the bookies (best effort).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vellum.client.bookie_client import BookieClient
from vellum.client.ledger import READER, WRITER, ClientContext, LedgerHandle
from vellum.client.metadata_security import open_configured_store
from vellum.client.placement import PlacementPolicy, parse_rack_mapping, placement_policy_for
from vellum.client.recovery import recover_ledger
from vellum.config import DEFAULT_DATA_DIR, ClientConfig, placement_policy_name
from vellum.errors import (
    ClientClosedError,
    IncorrectParameterError,
    NotEnoughBookiesError,
    UnauthorizedAccessError,
    VellumError,
)
from vellum.format.entry import DigestType
from vellum.ids import BookieId, LedgerId
from vellum.meta.api import MetadataStore, Versioned, Watch
from vellum.meta.model import DigestType as MetaDigestType
from vellum.meta.model import LedgerMetadata, LedgerState
from vellum.security.auth import TLS, ClientAuth, provider_name
from vellum.security.tls import ReloadingContext, TlsSettings

log = logging.getLogger(__name__)

#: where the embedded store lives when no metadataServiceUri is configured (vellum.config)
DEFAULT_SQLITE_PATH = Path(DEFAULT_DATA_DIR) / "metadata.db"  # the standalone cluster's store
#: the wall clock a new ledger's ``ctime`` is read from: a seam for the simulator's clock jumps
#: (docs/verification.md); nothing of the protocol reads it back
_wall_clock: Callable[[], float] = time.time


def client_tls(config: ClientConfig) -> ReloadingContext | None:
    """The client's TLS context for bookie connections (reloaded on change), or ``None`` when
    TLS is off (``tlsProviderFactoryClass`` empty). ``client*`` keys win over ``tls*`` ones, as
    in BookKeeper's ClientConfiguration. Bad files fail here."""
    if not config.tls_enabled:
        return None
    return ReloadingContext.for_client(TlsSettings(
        key_store=config.client_key_store or config.tls_key_store,
        certificate_path=config.tls_certificate_path,
        trust_store=config.client_trust_store or config.tls_trust_store,
        key_store_password_path=config.client_key_store_password_path or config.tls_key_store_password_path,
        trust_store_password_path=config.client_trust_store_password_path or config.tls_trust_store_password_path,
        key_store_type=config.client_key_store_type or config.tls_key_store_type,
        trust_store_type=config.client_trust_store_type or config.tls_trust_store_type,
        client_authentication=config.tls_client_authentication,
        enabled_protocols=config.tls_enabled_protocols,
        enabled_cipher_suites=config.tls_enabled_cipher_suites,
        hostname_verification=config.tls_hostname_verification_enabled,
        refresh_s=config.tls_cert_files_refresh_duration_s,
    ))


def client_auth(config: ClientConfig) -> ClientAuth | None:
    """What the client authenticates bookie connections with (``clientAuthProviderFactoryClass``),
    or ``None``. A token file that cannot be read fails here."""
    provider = config.client_auth_provider_factory_class.strip()
    if not provider:
        return None
    if provider_name(provider) == TLS:
        return ClientAuth.certificate()
    return ClientAuth.token(token=config.client_auth_token, token_file=config.client_auth_token_file)


class BookKeeper:
    """Asyncio BookKeeper client. ``async with BookKeeper(uri) as bk: ...`` or ``start()``/``close()``.

    ``store`` (an open metadata store) and ``placement`` may be injected; an injected store is
    not closed by :meth:`close`. ``max_adds_in_flight`` bounds each ledger handle's adds in
    flight (appends beyond it are queued until earlier ones are acknowledged).
    """

    def __init__(
        self,
        metadata_uri: str | None = None,
        *,
        config: ClientConfig | None = None,
        store: MetadataStore | None = None,
        placement: PlacementPolicy | None = None,
        max_adds_in_flight: int | None = None,
    ) -> None:
        self.config = config or ClientConfig()
        if max_adds_in_flight is None:
            max_adds_in_flight = self.config.max_adds_in_flight
        if max_adds_in_flight < 1:
            raise IncorrectParameterError(f"max_adds_in_flight must be >= 1, got {max_adds_in_flight}")
        self._max_adds_in_flight = max_adds_in_flight
        self._uri = metadata_uri if metadata_uri is not None else self.config.metadata_service_uri
        self._store = store
        self._owns_store = store is None
        self._placement = placement
        self._ctx: ClientContext | None = None
        self._bookie_client: BookieClient | None = None
        self._watches: list[Watch] = []
        self._started = False
        self._closed = False

    # -------------------------------------------------------------------------- lifecycle
    async def start(self) -> BookKeeper:
        if self._started:
            return self
        if self._closed:
            raise ClientClosedError("this BookKeeper client was closed")
        loop = asyncio.get_running_loop()
        tls = await asyncio.to_thread(client_tls, self.config)  # bad TLS files fail before anything opens
        auth = await asyncio.to_thread(client_auth, self.config)
        if self._store is None:
            self._store = await asyncio.to_thread(
                open_configured_store,
                self._uri,
                self.config,
                default_sqlite_path=DEFAULT_SQLITE_PATH,
                session_timeout_s=self.config.zk_timeout_ms / 1000.0,
            )
        store = self._store
        placement = self._placement
        if placement is None:
            placement = await asyncio.to_thread(_placement_from_config, self.config, store)
        self._bookie_client = BookieClient(tls=tls, start_tls_timeout_s=self.config.start_tls_timeout_s, auth=auth)
        ctx = self._ctx = ClientContext(store, self._bookie_client, placement, self.config,
                                        max_adds_in_flight=self._max_adds_in_flight)
        writable, read_only = await asyncio.to_thread(_list_bookies, store)
        ctx.writable_bookies, ctx.read_only_bookies = writable, read_only
        # network locations (the topology script) are learnt off the loop, here and on each change
        await asyncio.to_thread(placement.learn, writable | read_only, retry_failed=True)

        def on_change(read_only_kind: bool) -> Callable[[frozenset[BookieId]], None]:
            def apply(bookies: frozenset[BookieId]) -> None:
                # Watch callbacks run on a driver thread: learn the locations of the bookies
                # here (may run the topology script), then hand the new set to the loop.
                value = frozenset(str(b) for b in bookies)
                placement.learn(value, retry_failed=True)

                def set_value() -> None:
                    if read_only_kind:
                        ctx.read_only_bookies = value
                    else:
                        ctx.writable_bookies = value

                if not loop.is_closed():
                    loop.call_soon_threadsafe(set_value)

            return apply

        self._watches = await asyncio.to_thread(
            lambda: [
                store.registration.watch_bookies(on_change(False), read_only=False),
                store.registration.watch_bookies(on_change(True), read_only=True),
            ]
        )
        self._started = True
        return self

    async def close(self) -> None:
        """Stop watches, drop bookie connections (pending adds fail), close an owned store.

        Open ledgers are not closed (like BookKeeper): close them first. The timers of every
        writing handle made on this client (plain and named writers, recoveries) are stopped.
        """
        if self._closed:
            return
        self._closed = True
        if self._ctx is not None:
            for h in list(self._ctx.writers):
                h.stop_timers()
        for w in self._watches:
            w.cancel()
        self._watches = []
        if self._bookie_client is not None:
            await self._bookie_client.close()
        if self._owns_store and self._store is not None:
            await asyncio.to_thread(self._store.close)

    async def __aenter__(self) -> BookKeeper:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def store(self) -> MetadataStore:
        if self._store is None:
            raise ClientClosedError("BookKeeper client not started")
        return self._store

    @property
    def bookie_client(self) -> BookieClient:
        return self.context.bookie_client

    @property
    def writable_bookies(self) -> frozenset[str]:
        return self.context.writable_bookies

    @property
    def read_only_bookies(self) -> frozenset[str]:
        return self.context.read_only_bookies

    @property
    def context(self) -> ClientContext:
        """What this client's ledger handles share (metadata store, bookie connections,
        placement, configuration, live bookie lists): for layers built on the client, such as
        named ledgers, that make their own handles. ``ClientClosedError`` if the client is not
        started or is closed."""
        return self._context()

    def _context(self) -> ClientContext:
        if self._closed:
            raise ClientClosedError("this BookKeeper client is closed")
        if self._ctx is None:
            raise ClientClosedError("BookKeeper client not started: call start() or use 'async with'")
        return self._ctx

    # ---------------------------------------------------------------------------- ledgers
    async def create_ledger(
        self,
        *,
        ensemble_size: int | None = None,
        write_quorum_size: int | None = None,
        ack_quorum_size: int | None = None,
        digest_type: str | DigestType | None = None,
        password: bytes = b"",
        custom_metadata: dict[str, bytes] | None = None,
    ) -> LedgerHandle:
        """Create an OPEN ledger on an ensemble chosen by the placement policy; returns its writer."""
        ctx = self._context()
        cfg = self.config
        e = cfg.ensemble_size if ensemble_size is None else ensemble_size
        wq = cfg.write_quorum_size if write_quorum_size is None else write_quorum_size
        aq = cfg.ack_quorum_size if ack_quorum_size is None else ack_quorum_size
        if not e >= wq >= aq >= 1:
            raise IncorrectParameterError(
                f"need ensembleSize >= writeQuorumSize >= ackQuorumSize >= 1, got {e} >= {wq} >= {aq}"
            )
        if wq > 63:
            raise IncorrectParameterError(f"writeQuorumSize {wq} is too large")
        dt = parse_digest_type(digest_type if digest_type is not None else cfg.digest_type)
        if not isinstance(password, (bytes, bytearray)):
            raise IncorrectParameterError("password must be bytes")
        try:
            ensemble = self._new_ensemble(ctx, e, wq, aq)
        except NotEnoughBookiesError:
            # The watch may lag behind a registration that just happened: look again once.
            writable, read_only = await asyncio.to_thread(_list_bookies, ctx.store)
            await asyncio.to_thread(ctx.placement.learn, writable | read_only)
            ctx.writable_bookies, ctx.read_only_bookies = writable, read_only
            ensemble = self._new_ensemble(ctx, e, wq, aq)
        md = LedgerMetadata(
            ensemble_size=e,
            write_quorum_size=wq,
            ack_quorum_size=aq,
            ensembles={0: tuple(BookieId(b) for b in ensemble)},
            digest_type=MetaDigestType(int(dt)),
            password=bytes(password),
            state=LedgerState.OPEN,
            custom_metadata=dict(custom_metadata or {}),
            ctime_ms=int(_wall_clock() * 1000),
            creator_token=int.from_bytes(os.urandom(7), "big"),
        )
        ledger_id, version = await ctx.meta(ctx.store.ledgers.create_ledger, md)
        return LedgerHandle(ctx, int(ledger_id), Versioned(md, version), bytes(password), mode=WRITER)

    @staticmethod
    def _new_ensemble(ctx: ClientContext, e: int, wq: int, aq: int) -> list[str]:
        return list(ctx.placement.new_ensemble(
            e, wq, aq, writable=ctx.writable_bookies, read_only=ctx.read_only_bookies
        ))

    async def open_ledger(self, ledger_id: int, *, password: bytes = b"", recovery: bool = True) -> LedgerHandle:
        """Open for reading. ``recovery=True`` fences the ledger and closes it at its recovered end
        (the writer's later adds fail); ``recovery=False`` is a read-only look without fencing."""
        ctx = self._context()
        current = await ctx.read_metadata(ledger_id)
        if current.value.password != bytes(password):
            raise UnauthorizedAccessError(f"ledger {ledger_id}: wrong password")
        if recovery and not current.value.is_closed:
            current = await recover_ledger(ctx, ledger_id, bytes(password))
        handle = LedgerHandle(ctx, ledger_id, current, bytes(password), mode=READER)
        if not current.value.is_closed:
            try:
                await handle.read_last_add_confirmed()
            except VellumError as exc:  # best effort, like openLedgerNoRecovery
                log.info("ledger %d: LAC read on open failed (%s); LAC stays %d", ledger_id, exc,
                         handle.last_add_confirmed)
        return handle

    async def delete_ledger(self, ledger_id: int) -> None:
        """Delete the ledger's metadata (idempotent); bookies reclaim its entries later by GC."""
        ctx = self._context()
        await ctx.meta(ctx.store.ledgers.delete_ledger, LedgerId(ledger_id))

    async def list_ledgers(self) -> list[int]:
        """Every ledger id in the metadata store, ascending."""
        ctx = self._context()
        return await ctx.meta(lambda: [int(i) for i in ctx.store.ledgers.iter_ledger_ids()])

    async def ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        ctx = self._context()
        return (await ctx.read_metadata(ledger_id)).value

    async def ledger_exists(self, ledger_id: int) -> bool:
        ctx = self._context()
        return await ctx.meta(ctx.store.ledgers.ledger_exists, LedgerId(ledger_id))


# ------------------------------------------------------------------------------------ helpers


def _list_bookies(store: MetadataStore) -> tuple[frozenset[str], frozenset[str]]:
    reg = store.registration
    return (
        frozenset(str(b) for b in reg.list_bookies(read_only=False)),
        frozenset(str(b) for b in reg.list_bookies(read_only=True)),
    )


def parse_digest_type(value: Any) -> DigestType:
    """A digest type given by name (``"CRC32C"``), number or ``DigestType`` (named ledgers use it too)."""
    if isinstance(value, str):
        return DigestType.parse(value)
    try:
        return DigestType(int(value))
    except ValueError:
        raise IncorrectParameterError(f"unknown digest type {value!r}") from None


#: Key-value record holding the cluster's bookie -> rack mapping ("bookie_id /rack" lines), the
#: metadata-store alternative to ``networkTopologyScriptFileName`` (``vellum shell racks``).
RACK_MAPPING_KEY = "bookies/racks"


def _placement_from_config(config: ClientConfig, store: MetadataStore) -> PlacementPolicy:
    # may run the topology script or read the store: runs in a worker thread
    mapping = None
    if (placement_policy_name(config.ensemble_placement_policy) != "default"
            and not config.network_topology_script_file_name):
        record = store.kv.get(RACK_MAPPING_KEY)
        if record is not None:
            mapping = parse_rack_mapping(record.value.decode("utf-8"), source=f"metadata {RACK_MAPPING_KEY}")
    return placement_policy_for(config, rack_mapping=mapping)
