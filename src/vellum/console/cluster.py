"""What each console page shows, gathered from the metadata store, the bookies' admin HTTP API
and Vellum's client; the templates only render it.

Responsibility: ``ClusterConsole`` owns the console's connections (one metadata store session,
one ``AdminHttp``, a client opened on first need), the ``BookieDirectory``, the bounded
``MetricsHistory`` filled by a background sampler, and one method per page returning plain
data. Invariants:
- nothing hangs a page: every metadata call runs in a thread under ``meta_timeout_s``, every
  bookie call under the admin HTTP timeout; a store that is down or not formatted raises
  ``SourceUnavailable`` with a sentence for the page, and is retried at the next request;
- memory is bounded: ledgers are paged on the server (at most ``PAGE_SIZE`` metadata records
  read per page, a search reads at most ``SEARCH_BUDGET`` records per request and says where it
  stopped), named ledgers likewise, metric history is a ring per bookie;
- read-only: the only writes are the ``actions`` (admin HTTP calls carrying the token).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from vellum.admin import recovery_admin
from vellum.client.bookkeeper import BookKeeper
from vellum.client.metadata_security import open_configured_store
from vellum.client.named_record import KEY_PREFIX, NamedLedgerRecord, deserialize_record
from vellum.config import ClientConfig
from vellum.console import replicas
from vellum.console.bookies import (
    DOWN,
    AdminHttp,
    AdminHttpError,
    BookieDirectory,
    BookieView,
    Registration,
    probe,
    read_registrations,
)
from vellum.console.cursors import NameLag, cursor_lag, name_lag, position_cursors
from vellum.console.promtext import MetricsFormatError, MetricsHistory, parse_metrics, tracked_values
from vellum.errors import ConfigError, NoSuchLedgerError, SecurityError, VellumError
from vellum.format.entry import parse_entry_header
from vellum.ids import BookieId, LedgerId
from vellum.meta import parse_metadata_uri
from vellum.meta.api import MetadataStore
from vellum.meta.model import LedgerMetadata, LedgerState
from vellum.security.admin_http_client import redacted_token
from vellum.security.redaction import redact
from vellum.security.tokens import ADMIN_AUDIENCE, TokenVerifier

log = logging.getLogger(__name__)
T = TypeVar("T")

#: ledgers (and named ledgers) per page
PAGE_SIZE = 50
#: metadata records a search reads at most per request before it says where it stopped
SEARCH_BUDGET = 2000
#: and seconds it reads them for at most (the page must answer quickly on a slow store)
SEARCH_TIME_BUDGET_S = 0.15
#: pseudo-bookie under which cluster-wide samples are kept
CLUSTER = "(cluster)"


class SourceUnavailable(Exception):
    """A source of the page (metadata store, client) cannot answer; the text is for the page."""


#: seconds a console session lasts at most (a login token's own expiry ends it sooner)
DEFAULT_SESSION_TTL_S = 8 * 3600.0


@dataclass(frozen=True)
class ConsoleSettings:
    metadata_uri: str
    #: the console's own admin token for the bookies' admin HTTP API (None: read-only)
    admin_token: str | None = None
    refresh_s: float = 5.0
    sample_interval_s: float = 5.0
    history_samples: int = 120
    meta_timeout_s: float = 5.0
    client_config: ClientConfig = field(default_factory=ClientConfig)
    lost_bookie_recovery_delay_s: int = 0
    #: CA certificate(s) (PEM) that the bookies' https admin API is checked against; "" = system
    #: CAs, and then the admin token is never sent (docs/security.md, "Console and admin token")
    http_ca_file: str = ""
    #: the key that verifies login tokens, as the bookies' tokenSecretKeyFile (HS256) or
    #: tokenPublicKeyFile (RS256/ES256); with one, every page needs a login
    token_secret_file: str = ""
    token_public_key_file: str = ""
    token_audience: str = ADMIN_AUDIENCE  # a login is an admin-HTTP credential (docs/security.md)
    #: names (``host`` or ``host:port``) the console is reached by besides its listening address
    public_names: tuple[str, ...] = ()
    session_ttl_s: float = DEFAULT_SESSION_TTL_S
    #: serve https with this certificate and key (PEM); "" = plain http
    tls_cert_file: str = ""
    tls_key_file: str = ""
    #: with https: accept a client certificate from this CA with the admin role as a login
    tls_client_ca_file: str = ""

    def __repr__(self) -> str:
        shown = ", ".join(f"{f.name}={redacted_token(self.admin_token) if f.name == 'admin_token' else repr(getattr(self, f.name))}"
                          for f in fields(self))
        return f"ConsoleSettings({shown})"

    @property
    def login_required(self) -> bool:
        return bool(self.token_secret_file or self.token_public_key_file or self.tls_client_ca_file)

    def token_verifier(self) -> TokenVerifier | None:
        """The key that verifies login tokens, or None; ``ConfigError`` naming the file if unusable."""
        if self.token_secret_file and self.token_public_key_file:
            raise ConfigError("give one of --token-secret-file and --token-public-key-file, not both")
        try:
            if self.token_secret_file:
                return TokenVerifier.from_secret_file(self.token_secret_file)
            if self.token_public_key_file:
                return TokenVerifier.from_public_key_file(self.token_public_key_file)
        except SecurityError as e:
            raise ConfigError(f"the console's login key: {e}") from None
        return None


# ----------------------------------------------------------------------------------- ledgers


def _text(value: bytes) -> str:
    return value.decode("utf-8", "backslashreplace")


def shown_custom(md: LedgerMetadata) -> dict[str, str]:
    """A ledger's custom metadata as the console shows (and searches) it: values under a
    secret key redacted, as admin HTTP does (``security.redaction``)."""
    shown: dict[str, str] = redact({k: _text(v) for k, v in sorted(md.custom_metadata.items())})[0]
    return shown


@dataclass(frozen=True)
class LedgerRow:
    ledger_id: int
    state: str
    ensemble: tuple[str, ...]
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    length: int
    entries: int | None  # None while open (the bookies know)
    last_entry_id: int
    ctime_ms: int
    custom: dict[str, str]
    segments: int
    digest: str

    @property
    def age_s(self) -> float | None:
        return max(0.0, time.time() - self.ctime_ms / 1000) if self.ctime_ms > 0 else None


def ledger_row(ledger_id: int, md: LedgerMetadata) -> LedgerRow:
    last_first = max(md.ensembles)
    return LedgerRow(
        ledger_id=ledger_id, state=md.state.name, ensemble=tuple(str(b) for b in md.ensembles[last_first]),
        ensemble_size=md.ensemble_size, write_quorum=md.write_quorum_size, ack_quorum=md.ack_quorum_size,
        length=md.length, entries=md.last_entry_id + 1 if md.state is LedgerState.CLOSED else None,
        last_entry_id=md.last_entry_id, ctime_ms=md.ctime_ms,
        custom=shown_custom(md),
        segments=len(md.ensembles), digest=md.digest_type.name,
    )


@dataclass(frozen=True)
class LedgerQuery:
    """A parsed search: ``state:open``, ``bookie:HOST:PORT``, ``KEY=VALUE`` (custom metadata),
    a number (start at that ledger id), other words (in custom metadata keys or values)."""

    text: str = ""
    state: str | None = None
    bookie: str | None = None
    custom: tuple[tuple[str, str], ...] = ()
    words: tuple[str, ...] = ()
    start_id: int | None = None

    @classmethod
    def parse(cls, text: str) -> LedgerQuery:
        state = bookie = None
        start_id = None
        custom: list[tuple[str, str]] = []
        words: list[str] = []
        for token in text.split():
            low = token.lower()
            if low.startswith("state:"):
                state = low[6:].upper()
            elif low.startswith("bookie:"):
                bookie = token[7:]
            elif token.isdigit() and start_id is None:
                start_id = int(token)
            elif "=" in token:
                k, _, v = token.partition("=")
                custom.append((k, v))
            else:
                words.append(low)
        return cls(text.strip()[:200], state, bookie, tuple(custom), tuple(words), start_id)

    @property
    def filters(self) -> bool:
        return bool(self.state or self.bookie or self.custom or self.words)

    def matches(self, md: LedgerMetadata) -> bool:
        if self.state and md.state.name != self.state:
            return False
        if self.bookie and not any(self.bookie in map(str, ens) for ens in md.ensembles.values()):
            return False
        texts = shown_custom(md)  # a secret is not found by guessing it either
        for k, v in self.custom:
            if texts.get(k) != v:
                return False
        return all(any(w in k.lower() or w in v.lower() for k, v in texts.items()) for w in self.words)


@dataclass
class LedgerPage:
    rows: list[LedgerRow]
    total: int | None
    next_after: int | None  # ``after`` of the next page, None on the last
    prev_before: int | None  # ``before`` of the previous page, None on the first
    scanned_to: int | None = None  # a search that used its budget stopped after this id
    missing_ids: list[int] = field(default_factory=list)  # listed but deleted before read


def _ids_page(store: MetadataStore, after: int | None, before: int | None, limit: int) -> tuple[list[int], bool, bool]:
    """(ids, more after, more before) of one page in ascending order."""
    ledgers = store.ledgers
    if before is not None:
        window: list[int] = []
        more_before = False
        for lid in ledgers.iter_ledger_ids():
            if lid >= before:
                break
            window.append(int(lid))
            if len(window) > limit:
                window.pop(0)
                more_before = True
        return window, True, more_before
    ids: list[int] = []
    more = False
    for lid in ledgers.iter_ledger_ids(None if after is None else LedgerId(after)):
        if len(ids) == limit:
            more = True
            break
        ids.append(int(lid))
    return ids, more, after is not None


def list_ledgers_page(store: MetadataStore, query: LedgerQuery, *, after: int | None, before: int | None,
                      limit: int = PAGE_SIZE, budget: int = SEARCH_BUDGET,
                      time_budget_s: float = SEARCH_TIME_BUDGET_S) -> LedgerPage:
    """Blocking: one page of ledgers (see ``LedgerQuery``); never reads more than ``limit``
    records without a filter; with one, at most ``budget`` records for at most ``time_budget_s``
    (then the page says after which ledger it stopped)."""
    if after is None and before is None and query.start_id is not None:
        after = query.start_id - 1 if query.start_id > 0 else None
    total = sum(len(r.ledger_ids) for r in store.ledgers.ledger_ranges())
    if not query.filters:
        ids, more, more_before = _ids_page(store, after, before, limit)
        rows, missing = [], []
        for lid in ids:
            try:
                rows.append(ledger_row(lid, store.ledgers.read_ledger(LedgerId(lid)).value))
            except NoSuchLedgerError:
                missing.append(lid)
        return LedgerPage(rows, total, ids[-1] if more and ids else None,
                          ids[0] if more_before and ids else None, missing_ids=missing)
    rows = []
    scanned = 0
    last_seen: int | None = None
    stopped = False
    deadline = time.monotonic() + time_budget_s
    for lid in store.ledgers.iter_ledger_ids(None if after is None else LedgerId(after)):
        if len(rows) == limit or scanned >= budget or (scanned and time.monotonic() > deadline):
            stopped = True
            break
        scanned += 1
        last_seen = int(lid)
        try:
            md = store.ledgers.read_ledger(lid).value
        except NoSuchLedgerError:
            continue
        if query.matches(md):
            rows.append(ledger_row(int(lid), md))
    full = len(rows) == limit
    return LedgerPage(rows, total, last_seen if stopped else None, None,
                      scanned_to=last_seen if stopped and not full else None)


# ----------------------------------------------------------------------------- named ledgers


@dataclass(frozen=True)
class NameRow:
    name: str
    state: str
    writer: str
    writer_epoch: int
    start_entry_id: int
    last_closed_entry_id: int
    segments: int
    open_ledger: int | None
    trimmed_to: int
    cursors: dict[str, str]
    error: str | None = None


def name_row(name: str, rec: NamedLedgerRecord) -> NameRow:
    seg = rec.open_segment
    return NameRow(name, rec.state, rec.writer, rec.writer_epoch, rec.start_entry_id, rec.closed_end - 1,
                   len(rec.segments), seg.ledger_id if seg is not None else None, rec.trimmed_to,
                   {k: _text(v)[:200] for k, v in sorted(rec.cursors.items())})


def list_names_page(store: MetadataStore, prefix: str, after: str | None, limit: int = PAGE_SIZE
                    ) -> tuple[list[NameRow], str | None]:
    """Blocking: one page of named ledgers, and the ``after`` of the next page."""
    keys = store.kv.list(KEY_PREFIX + prefix, start_after=None if after is None else KEY_PREFIX + after,
                         limit=limit + 1)
    more = len(keys) > limit
    rows = []
    for key in keys[:limit]:
        name = key[len(KEY_PREFIX):]
        got = store.kv.get(key)
        if got is None:
            continue
        try:
            rows.append(name_row(name, deserialize_record(got.value, where=f"named ledger {name}")))
        except VellumError as e:
            rows.append(NameRow(name, "?", "", 0, 0, -1, 0, None, 0, {}, error=str(e)))
    return rows, (rows[-1].name if more and rows else None)


def all_name_records(store: MetadataStore) -> list[tuple[str, NamedLedgerRecord | None]]:
    """Blocking: every named ledger's record (None where it is unreadable or was just deleted)."""
    out: list[tuple[str, NamedLedgerRecord | None]] = []
    for key in store.kv.list(KEY_PREFIX):
        name = key[len(KEY_PREFIX):]
        got = store.kv.get(key)
        if got is None:
            continue
        try:
            out.append((name, deserialize_record(got.value, where=f"named ledger {name}")))
        except VellumError as e:
            log.warning("console: named ledger %r: unreadable record left out of the metrics: %s", name, e)
            out.append((name, None))
    return out


# --------------------------------------------------------------------------------- storage / GC


def explain_log(log: dict[str, Any], alive: set[int]) -> dict[str, Any]:
    """One entry log of ``/api/v1/bookie/entrylogs`` with live / dead bytes against the ledgers
    that exist now, and what keeps it on disk (the gc-report explanation)."""
    per_ledger = {}
    for k, v in (log.get("ledgerBytes") or {}).items():
        with contextlib.suppress(TypeError, ValueError):
            per_ledger[int(k)] = int(v)
    total = int(log.get("totalBytes") or log.get("size") or 0)
    data = sum(per_ledger.values()) or total
    live = sum(n for lid, n in per_ledger.items() if lid in alive)
    pinned = sorted((lid for lid in per_ledger if lid in alive), key=lambda lid: -per_ledger[lid])
    dead = [lid for lid in per_ledger if lid not in alive]
    active = bool(log.get("active"))
    if active:
        why = "active: being written; GC examines only flushed logs"
    elif log.get("held"):
        why = f"held: {log['held']}; GC keeps it until those ledgers are deleted (see the bookie log)"
    elif not pinned:
        why = "no live ledger left: deleted at the next GC pass"
    else:
        shown = ", ".join(str(lid) for lid in pinned[:5]) + (f" and {len(pinned) - 5} more" if len(pinned) > 5 else "")
        ratio = live / data if data else 0.0
        why = (f"pinned by live ledger{'s' if len(pinned) > 1 else ''} {shown} ({ratio:.0%} live); "
               + ("compaction copies it out when its usage falls below a compaction threshold" if dead
                  else "every byte is live"))
    return {
        "logId": str(log.get("logId", "?")), "ledgerDir": str(log.get("ledgerDir", "")), "totalBytes": total,
        "liveBytes": live, "deadBytes": max(0, data - live) if not active else 0, "active": active,
        "ledgers": len(per_ledger), "pinnedBy": pinned[:20], "pinnedCount": len(pinned), "deadLedgers": len(dead),
        "why": why, "mtime": log.get("mtime"),
    }


def existing_among(store: MetadataStore, wanted: set[int]) -> set[int]:
    """Blocking: which of ``wanted`` exist, from one listing (memory: the wanted set)."""
    if not wanted:
        return set()
    if len(wanted) <= 64:
        return {lid for lid in wanted if store.ledgers.ledger_exists(LedgerId(lid))}
    out: set[int] = set()
    for r in store.ledgers.ledger_ranges():
        out.update(int(x) for x in r.ledger_ids if int(x) in wanted)
    return out


# --------------------------------------------------------------------------------------- console


class ClusterConsole:
    """See the module docstring."""

    def __init__(self, settings: ConsoleSettings, *, store: MetadataStore | None = None) -> None:
        self.settings = settings
        try:
            self.http = AdminHttp(token=settings.admin_token, ca_file=settings.http_ca_file)
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(f"cannot load the CA certificates of --http-ca-file {settings.http_ca_file}: {e}") from None
        self.directory = BookieDirectory()
        self.history = MetricsHistory(settings.history_samples)
        self.decommissioning: dict[str, float] = {}
        self._store = store
        self._owns_store = store is None
        self._store_error: str | None = None
        self._store_retry_at = 0.0
        self._store_lock = asyncio.Lock()
        self._client: BookKeeper | None = None
        self._client_lock = asyncio.Lock()
        self._sampler: asyncio.Task[None] | None = None
        self.started_at = time.time()

    @property
    def read_only(self) -> bool:
        return not self.settings.admin_token

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        with contextlib.suppress(SourceUnavailable):
            await self.store()
        self._sampler = asyncio.get_running_loop().create_task(self._sample_forever(), name="console-sampler")

    async def close(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.close()
        await self.http.close()
        if self._owns_store and self._store is not None:
            await asyncio.to_thread(self._store.close)

    # -- sources --------------------------------------------------------------------------
    def _open_store(self) -> MetadataStore:
        uri = self.settings.metadata_uri
        parsed = parse_metadata_uri(uri)
        if parsed.driver == "sqlite" and not Path(parsed.path).exists():
            raise SourceUnavailable(f"no metadata store at {parsed.path} (the sqlite file does not exist)")
        store = open_configured_store(uri, self.settings.client_config, connect_timeout_s=self.settings.meta_timeout_s)
        try:
            if not store.is_formatted():
                raise SourceUnavailable(f"the metadata store {uri} is not formatted "
                                        f"(`vellum shell metaformat --uri {uri}`)")
        except BaseException:
            store.close()
            raise
        return store

    async def store(self) -> MetadataStore:
        if self._store is not None:
            return self._store
        async with self._store_lock:
            if self._store is not None:
                return self._store
            if time.monotonic() < self._store_retry_at and self._store_error:
                raise SourceUnavailable(self._store_error)
            try:
                self._store = await asyncio.wait_for(asyncio.to_thread(self._open_store),
                                                     self.settings.meta_timeout_s * 2)
                self._store_error = None
                return self._store
            except SourceUnavailable as e:
                self._store_error = str(e)
            except TimeoutError:
                self._store_error = (f"the metadata store {self.settings.metadata_uri} did not answer within "
                                     f"{self.settings.meta_timeout_s * 2:g}s")
            except Exception as e:  # any driver failure: a sentence on the page, retried later
                self._store_error = f"cannot open the metadata store {self.settings.metadata_uri}: {e}"
            self._store_retry_at = time.monotonic() + 2.0
            raise SourceUnavailable(self._store_error)

    async def meta(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(store, *args)`` in a thread, bounded by the metadata timeout."""
        store = await self.store()
        try:
            return await asyncio.wait_for(asyncio.to_thread(fn, store, *args, **kwargs),
                                          self.settings.meta_timeout_s)
        except TimeoutError:
            raise SourceUnavailable(f"the metadata store {self.settings.metadata_uri} did not answer within "
                                    f"{self.settings.meta_timeout_s:g}s") from None
        except (NoSuchLedgerError, SourceUnavailable):
            raise
        except VellumError as e:
            raise SourceUnavailable(f"the metadata store {self.settings.metadata_uri} failed: {e}") from None

    async def client(self) -> BookKeeper:
        if self._client is not None:
            return self._client
        async with self._client_lock:
            if self._client is None:
                store = await self.store()
                self._client = await BookKeeper(config=self.settings.client_config, store=store).start()
        return self._client

    # -- bookies --------------------------------------------------------------------------
    async def _registrations(self) -> tuple[Registration, list[recovery_admin.UnderReplicatedRow]]:
        reg = await self.meta(read_registrations)
        ur = await self.meta(lambda s: recovery_admin.list_under_replicated(s))
        return reg, ur

    async def bookies(self, *, with_gc: bool = True) -> tuple[list[BookieView], list[recovery_admin.UnderReplicatedRow]]:
        reg, ur = await self._registrations()
        missing = {b for row in ur for b in row.missing_replicas}
        await self._forget_decommissioned(reg, missing)
        known = self.directory.update(reg, missing | set(self.decommissioning))
        views = await asyncio.gather(*(probe(self.http, k, reg, with_gc=with_gc,
                                             decommissioning=k.bookie_id in self.decommissioning)
                                       for k in known))
        return list(views), ur

    async def _forget_decommissioned(self, reg: Registration, missing: set[str]) -> None:
        """A bookie that is not registered and whose cookie is gone from the metadata store was
        decommissioned (from this console, the shell or admin HTTP; the decommission ends by
        deleting the cookie): it left the cluster, so it is no longer shown, down or otherwise,
        and its metric history goes with it. A bookie still named as a missing replica stays."""
        registered = reg.writable | reg.read_only
        gone = [k.bookie_id for k in self.directory.known() if k.bookie_id not in registered
                and k.bookie_id not in missing]
        gone += [b for b in self.decommissioning if b not in registered and b not in gone]
        if not gone:
            return
        cookies = await self.meta(lambda s: {b: s.registration.get_cookie(BookieId(b)) for b in gone})
        for b, cookie in cookies.items():
            if cookie is None:
                self.decommissioning.pop(b, None)
                self.directory.forget(b)
                self.history.forget(b)

    def up_urls(self, views: list[BookieView]) -> list[str]:
        return [v.http_url for v in views if v.up and v.http_url]

    async def _sample_once(self) -> None:
        try:
            reg = await self.meta(read_registrations)
            ur_count = await self.meta(lambda s: sum(1 for _ in s.underreplication.list_under_replicated()))
        except SourceUnavailable:
            return
        now = time.time()
        self.history.add(CLUSTER, now, {"underReplicatedRecords": float(ur_count)})

        async def scrape(bookie: str, url: str) -> None:
            try:
                text = await self.http.call(url, "/metrics", parse_json=False)
                self.history.add(bookie, now, tracked_values(parse_metrics(text)))
            except (AdminHttpError, MetricsFormatError) as e:
                log.debug("metrics of %s: %s", bookie, e)

        await asyncio.gather(*(scrape(b, u) for b, u in reg.http.items() if u))
        self.history.forget_except([*reg.http, CLUSTER, *(k.bookie_id for k in self.directory.known())])

    async def _sample_forever(self) -> None:
        while True:
            try:
                await self._sample_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # the sampler must outlive any one bad answer
                log.exception("console metrics sampler")
            await asyncio.sleep(self.settings.sample_interval_s)

    # -- pages ----------------------------------------------------------------------------
    async def cluster_page(self) -> dict[str, Any]:
        views, ur = await self.bookies(with_gc=False)
        auditor = await self.meta(recovery_admin.who_is_auditor)
        enabled = await self.meta(recovery_admin.status)
        ledger_count = await self.meta(lambda s: sum(len(r.ledger_ids) for r in s.ledgers.ledger_ranges()))
        charts = {}
        for v in views:
            t1, adds = self.history.rates(v.bookie_id, "adds")
            t2, reads = self.history.rates(v.bookie_id, "reads")
            charts[v.bookie_id] = {"t": t1, "series": [{"label": "adds/s", "values": adds},
                                                      {"label": "reads/s", "values": reads if t1 == t2 else []}]}
        counts: dict[str, int] = {}
        for v in views:
            counts[v.state] = counts.get(v.state, 0) + 1
        return {"bookies": views, "charts": charts, "auditor": auditor, "replication_enabled": enabled,
                "under_replicated": len(ur), "ledger_count": ledger_count, "counts": counts,
                "last_rates": {v.bookie_id: (self.history.last_rate(v.bookie_id, "adds"),
                                             self.history.last_rate(v.bookie_id, "reads")) for v in views}}

    async def ledgers_page(self, query: LedgerQuery, after: int | None, before: int | None) -> LedgerPage:
        return await self.meta(list_ledgers_page, query, after=after, before=before)

    async def ledger_page(self, ledger_id: int) -> dict[str, Any]:
        versioned = await self.meta(lambda s: s.ledgers.read_ledger(LedgerId(ledger_id)))
        md = versioned.value
        row = ledger_row(ledger_id, md)
        bookies = sorted({str(b) for ens in md.ensembles.values() for b in ens})
        bk = await self.client()
        bc = bk.bookie_client
        timeout = 2.0

        async def held(b: str) -> tuple[str, Any]:
            try:
                return b, await asyncio.wait_for(bc.list_entries(b, ledger_id, timeout_s=timeout), timeout + 0.5)
            except TimeoutError:
                return b, f"no answer within {timeout:g}s"
            except Exception as e:  # down, no such ledger, limbo: what the bookie said
                return b, f"{type(e).__name__}: {e}"

        async def lac_of(b: str) -> tuple[str, Any]:
            try:
                explicit, last = await asyncio.wait_for(bc.read_lac(b, ledger_id, timeout_s=timeout), timeout + 0.5)
                lac = entry = None
                if last:
                    _l, entry, lac, _n = parse_entry_header(last)
                if explicit and len(explicit) >= 16:
                    lac = max(lac if lac is not None else -1, int.from_bytes(explicit[8:16], "big", signed=True))
                return b, (lac, entry)
            except Exception as e:
                return b, f"{type(e).__name__}: {e}"

        answers = dict(await asyncio.gather(*(held(b) for b in bookies)))
        last_ens = [str(b) for b in md.ensembles[max(md.ensembles)]]
        lacs: dict[str, Any] = {}
        if not md.is_closed:
            lacs = dict(await asyncio.gather(*(lac_of(b) for b in last_ens)))
        if md.is_closed:
            last_entry = lac = md.last_entry_id
        else:
            # BookKeeper's readLastAddConfirmed: the highest LAC the last ensemble's bookies know
            # (each entry carries the LAC of its writer); entries past it may lack their quorum.
            known = [v[0] for v in lacs.values() if isinstance(v, tuple) and v[0] is not None]
            lac = max(known) if known else -1
            stored = [v[1] for v in lacs.values() if isinstance(v, tuple) and v[1] is not None]
            last_entry = max(stored) if stored else lac
        segs = []
        for seg in replicas.segments(md.ensembles, lac):
            states = []
            for index, b in enumerate(seg.ensemble):
                ans = answers.get(b)
                if isinstance(ans, tuple):
                    states.append({"bookie": b, "state": replicas.replica_state(
                        seg, index, ans, md.ensemble_size, md.write_quorum_size), "error": None})
                else:
                    states.append({"bookie": b, "state": None, "error": str(ans)})
            segs.append({"segment": seg, "replicas": states})
        stored_last = {b: v[1] for b, v in lacs.items() if isinstance(v, tuple)}
        return {"ledger": row, "metadata": md, "version": versioned.version, "segments": segs, "lac": lac,
                "last_entry": last_entry, "lac_answers": lacs, "stored_last": stored_last,
                "password_set": bool(md.password)}

    async def names_page(self, prefix: str, after: str | None) -> dict[str, Any]:
        rows, next_after = await self.meta(list_names_page, prefix, after)
        return {"rows": rows, "next_after": next_after, "prefix": prefix, "after": after}

    async def name_page(self, name: str) -> dict[str, Any]:
        got = await self.meta(lambda s: s.kv.get(KEY_PREFIX + name))
        if got is None:
            raise NoSuchLedgerError(f"no named ledger {name!r}")
        rec = deserialize_record(got.value, where=f"named ledger {name}")
        last_entry = rec.closed_end - 1
        lac_error = None
        seg = rec.open_segment
        if seg is not None:
            try:
                bk = await self.client()
                h = await asyncio.wait_for(bk.open_ledger(seg.ledger_id, password=rec.password, recovery=False), 5.0)
                last_entry = seg.first_entry_id + h.last_add_confirmed
            except Exception as e:  # the open segment's bookies: shown, not fatal
                lac_error = f"{type(e).__name__}: {e}"
        positions = position_cursors(rec)
        cursors = [{"name": k, "value": _text(v)[:200], "lag": cursor_lag(v, last_entry),
                    "retain": k in positions and positions[k].retain}
                   for k, v in sorted(rec.cursors.items())]
        return {"name": name, "record": rec, "row": name_row(name, rec), "version": got.version,
                "last_entry": last_entry, "lac_error": lac_error, "cursors": cursors,
                "entries": max(0, last_entry - rec.start_entry_id + 1),
                "size": sum(s.length for s in rec.segments if not s.is_open)}

    async def _readable_end(self, rec: NamedLedgerRecord) -> int | None:
        """The id after the name's last readable entry (the open segment's LAC + 1, asked of its
        bookies); None if they could not be asked (logged)."""
        seg = rec.open_segment
        if seg is None:
            return rec.closed_end
        try:
            bk = await self.client()
            h = await asyncio.wait_for(bk.open_ledger(seg.ledger_id, password=rec.password, recovery=False), 5.0)
            return max(rec.start_entry_id, seg.first_entry_id + h.last_add_confirmed + 1)
        except Exception as e:  # the open segment's bookies: its lag is left out, not a failed scrape
            log.warning("console: named ledger %r: the LAC of open segment %d could not be read (%s: %s); "
                        "its cursors' lag is left out", rec.name, seg.ledger_id, type(e).__name__, e)
            return None

    async def name_lags(self) -> list[NameLag]:
        """Every named ledger's segment count, end and position cursors' lag (``/metrics``).
        The bookies are asked only for the names that have a position cursor and an open segment."""
        out: list[NameLag] = []
        for _name, rec in await self.meta(all_name_records):
            if rec is None:
                continue
            end = await self._readable_end(rec) if position_cursors(rec) else None
            out.append(name_lag(rec, end))
        return out

    async def storage_page(self) -> dict[str, Any]:
        views, _ur = await self.bookies(with_gc=True)
        raw: dict[str, Any] = {}

        async def logs(v: BookieView) -> None:
            assert v.http_url is not None
            try:
                got = await self.http.call(v.http_url, "/api/v1/bookie/entrylogs")
                raw[v.bookie_id] = got if isinstance(got, list) else f"unexpected answer: {str(got)[:80]}"
            except AdminHttpError as e:
                raw[v.bookie_id] = str(e)

        await asyncio.gather(*(logs(v) for v in views if v.up and v.http_url))
        wanted = {int(k) for logs_ in raw.values() if isinstance(logs_, list) for log_ in logs_
                  if isinstance(log_, dict) for k in (log_.get("ledgerBytes") or {})
                  if str(k).lstrip("-").isdigit()}
        alive = await self.meta(existing_among, wanted)
        per_bookie = []
        for v in views:
            got = raw.get(v.bookie_id)
            explained = [explain_log(log_, alive) for log_ in got if isinstance(log_, dict)] if isinstance(got, list) else []
            t, reclaimed = self.history.series(v.bookie_id, "reclaimedDeletion")
            _t2, compacted = self.history.series(v.bookie_id, "reclaimedCompaction")
            gc = v.gc or []
            per_bookie.append({
                "view": v, "logs": explained, "error": got if isinstance(got, str) else None,
                "live": sum(x["liveBytes"] for x in explained), "dead": sum(x["deadBytes"] for x in explained),
                "reclaimed": sum(int(g.get("reclaimedBytes") or 0) for g in gc),
                "compacted": sum(int(g.get("compactedBytes") or 0) for g in gc),
                "gc": gc, "suspended_major": any(g.get("isMajorGcSuspended") for g in gc),
                "suspended_minor": any(g.get("isMinorGcSuspended") for g in gc),
                "chart": {"t": t, "series": [{"label": "reclaimed by deletion (bytes)", "values": reclaimed},
                                             {"label": "reclaimed by compaction (bytes)",
                                              "values": compacted if len(compacted) == len(t) else []}]},
            })
        return {"bookies": per_bookie}

    async def recovery_page(self) -> dict[str, Any]:
        views, ur = await self.bookies(with_gc=False)
        auditor = await self.meta(recovery_admin.who_is_auditor)
        enabled = await self.meta(recovery_admin.status)
        delay = await self.meta(recovery_admin.get_lost_bookie_recovery_delay,
                                self.settings.lost_bookie_recovery_delay_s)
        up = [v.bookie_id for v in views if v.up]
        t, rate = self.history.cluster_rates("rereplicatedBytes", up)
        t_ur, ur_counts = self.history.series(CLUSTER, "underReplicatedRecords")
        _t3, ledgers_rate = self.history.cluster_rates("rereplicatedLedgers", up)
        eta = None
        if len(ur_counts) >= 2 and t_ur[-1] > t_ur[0]:
            healed_per_s = (ur_counts[0] - ur_counts[-1]) / (t_ur[-1] - t_ur[0])
            if healed_per_s > 0 and ur_counts[-1] > 0:
                eta = ur_counts[-1] / healed_per_s
        lost = [v for v in views if not v.up]
        per_lost = {v.bookie_id: sum(1 for row in ur if v.bookie_id in row.missing_replicas) for v in lost}
        return {"rows": ur[:500], "total": len(ur), "auditor": auditor, "enabled": enabled, "delay": delay,
                "cannot_heal": recovery_admin.cannot_heal_reasons(ur),
                "lost": lost, "per_lost": per_lost, "eta_s": eta, "bookies": views,
                "rate_chart": {"t": t, "series": [{"label": "re-replicated bytes/s", "values": rate}]},
                "ur_chart": {"t": t_ur, "series": [{"label": "under-replicated ledgers", "values": ur_counts}]},
                "ledgers_rate": ledgers_rate[-1] if ledgers_rate else None,
                "bytes_rate": rate[-1] if rate else None,
                "up_bookies": [v for v in views if v.up and v.http_url],
                "down_bookies": [v for v in views if v.state == DOWN]}
