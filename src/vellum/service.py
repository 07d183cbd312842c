"""Composition root of one bookie service: from a ServerConfig, the metadata store, the bookie
(built by ``bookie/assembly.py``), its network server, the admin HTTP server and the
registration, started and stopped in order. Running several bookie processes on one machine
(``vellum standalone``, the test clusters) is ``standalone.py``'s job, not this module's.

Start order: metadata store (the cluster must be formatted) -> listen addresses resolved
(``server/listen.py``: an unreachable combination stops here) -> local storage (locks, cookies
checked against the store's copy, journal replay) -> limbo marking if the bookie may have lost
data (``dataIntegrityChecking``: every ledger of this bookie in the store, before anything is
served; ``admin/integrity_check.py``) -> network server -> admin HTTP -> metrics port
(``prometheusStatsHttpPort``, metrics only) -> registration (writable
or read-only as the bookie is, following every later change: ``bookie/registration.py``) -> the
background integrity check while any ledger is limbo (its own client, on this loop).
Stop order is the reverse: deregister first so clients stop choosing this bookie, then close
the server, then the clean storage shutdown (final checkpoint, unclean-shutdown marker removed).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import signal
import ssl
from collections.abc import Iterator
from pathlib import Path

from vellum.admin.bookie_admin import BookieAdmin
from vellum.admin.gc_admin import DiskThresholds, GcAdmin
from vellum.admin.integrity_check import IntegrityCheck, mark_ledgers_limbo
from vellum.admin.ledger_admin import LedgerAdmin
from vellum.autorecovery.daemon import AutoRecovery, AutoRecoveryThread
from vellum.autorecovery.settings import AutoRecoverySettings
from vellum.bookie.assembly import OpenedBookie, open_bookie
from vellum.bookie.executor import AsyncBookie
from vellum.bookie.metrics import process_bookie_metrics
from vellum.bookie.registration import BookieRegistration
from vellum.client.bookkeeper import BookKeeper
from vellum.client.metadata_security import open_configured_store
from vellum.config import ClientConfig, ServerConfig, build_config
from vellum.errors import CookieError, MetaStoreError, NoSuchLedgerError
from vellum.format.cookie import Cookie
from vellum.format.entry import master_key
from vellum.http.admin_http import AdminHttpServer, HttpSecurity
from vellum.http.autorecovery_routes import autorecovery_routes
from vellum.http.gc_routes import gc_routes
from vellum.http.ledger_routes import ledger_routes
from vellum.ids import BookieId, LedgerId, bookie_id_for
from vellum.meta.api import LedgerManager, MetadataStore, SessionEvent, Versioned
from vellum.security.auth import BookieAuthenticator
from vellum.security.tls import ReloadingContext, TlsSettings
from vellum.security.tokens import TokenVerifier
from vellum.server.bookie_server import BookieServer, ServerLimits
from vellum.server.guard import PeerLimits
from vellum.server.listen import ListenAddresses, advertised_host, resolve_listen_addresses
from vellum.server.metrics import process_server_metrics
from vellum.server.metrics_http import MetricsHttpServer

log = logging.getLogger(__name__)


def default_metadata_uri(config: ServerConfig) -> str:
    """``metadataServiceUri``, or the embedded store next to the first ledger dir's parent."""
    if config.metadata_service_uri:
        return config.metadata_service_uri
    base = Path(config.ledger_directories[0]).resolve().parent
    return f"sqlite:///{base / 'metadata.db'}"


def bookie_id_of(config: ServerConfig, port: int) -> BookieId:
    return BookieId(config.bookie_id) if config.bookie_id else bookie_id_for(advertised_host(config), port)


def server_tls(config: ServerConfig) -> ReloadingContext | None:
    """The bookie port's TLS context (reloaded on change), or ``None`` when TLS is off
    (``tlsProviderFactoryClass`` empty). Bad files fail here, at start."""
    if not config.tls_enabled:
        return None
    return ReloadingContext.for_server(TlsSettings(
        key_store=config.tls_key_store,
        certificate_path=config.tls_certificate_path,
        trust_store=config.tls_trust_store,
        key_store_password_path=config.tls_key_store_password_path,
        trust_store_password_path=config.tls_trust_store_password_path,
        key_store_type=config.tls_key_store_type,
        trust_store_type=config.tls_trust_store_type,
        client_authentication=config.tls_client_authentication,
        enabled_protocols=config.tls_enabled_protocols,
        enabled_cipher_suites=config.tls_enabled_cipher_suites,
        refresh_s=config.tls_cert_files_refresh_duration_s,
    ))


def token_verifier(config: ServerConfig) -> TokenVerifier | None:
    """The key that verifies tokens (bookie port AUTH, admin HTTP), or ``None`` if none is set."""
    if config.token_secret_key_file:
        return TokenVerifier.from_secret_file(config.token_secret_key_file, max_lifetime_s=config.token_max_lifetime_s)
    if config.token_public_key_file:
        return TokenVerifier.from_public_key_file(config.token_public_key_file,
                                                  max_lifetime_s=config.token_max_lifetime_s)
    return None


def http_security(config: ServerConfig, verifier: TokenVerifier | None, host: str) -> HttpSecurity:
    """Who may call the admin HTTP API: admin tokens (``httpServerTokenAudience``) and, over
    https requiring client certificates, the certificates; an admin credential for every change
    whenever the bookie port requires authentication (unless ``httpServerAdminInsecure``, which
    the config only accepts said on purpose) or a token key is set."""
    if config.auth_providers and not config.admin_credential_required:
        log.warning("httpServerAdminInsecure=true: the admin HTTP API on %s:%d lets anyone who reaches it change "
                    "this bookie (GC, read-only, decommission), although its bookie port requires authentication",
                    host, config.http_server_port)
    return HttpSecurity(verifier=verifier, audience=config.http_server_token_audience,
                        tokens_for_reads=config.http_server_token_required_for_reads,
                        admin_required=config.admin_credential_required,
                        certificates=config.http_client_certificates,
                        authorized_roles=config.authorized_roles)


def server_auth(config: ServerConfig, verifier: TokenVerifier | None) -> BookieAuthenticator | None:
    """The bookie port's authentication (``bookieAuthProviderFactoryClass``, ``authorizedRoles``),
    or ``None`` when it is off."""
    if not config.auth_providers:
        return None
    if "token" in config.auth_providers and not config.tls_enabled:
        log.warning("token authentication without TLS: tokens travel in clear and can be replayed by "
                    "anyone on the network; set tlsProviderFactoryClass")
    return BookieAuthenticator(config.auth_providers, authorized_roles=config.authorized_roles,
                               token_verifier=verifier, audience=config.token_audience)


def bookie_client_config(config: ServerConfig, what: str) -> ClientConfig:
    """The client a bookie (or AutoRecovery) talks to other bookies with: the bookie's own
    certificate (role ``bookie``) and ZooKeeper identity (``client_security_values``), and the
    placement policy of its file for the replacement bookies it picks, with the metadata session
    timeout of its file (``zkTimeout``) like the bookie's own session."""
    return build_config(ClientConfig, {**config.client_placement_values(), **config.client_security_values(),
                                       "zkTimeout": config.zk_timeout_ms}, source=what)


def http_tls(config: ServerConfig) -> ssl.SSLContext | None:
    """The admin HTTP server's TLS context (``httpServerTlsEnable``; certificates reloaded for
    new connections like the bookie port's), or ``None``."""
    if not config.http_server_tls_enable:
        return None
    holder = ReloadingContext.for_server(TlsSettings(
        key_store=config.http_server_key_store_path,
        certificate_path=config.http_server_certificate_path or config.http_server_key_store_path,
        key_store_password=config.http_server_key_store_password,
        trust_store=config.http_server_trust_store_path,
        client_authentication=bool(config.http_server_trust_store_path),
        enabled_protocols=config.tls_enabled_protocols,
        enabled_cipher_suites=config.tls_enabled_cipher_suites,
        refresh_s=config.tls_cert_files_refresh_duration_s,
    ))
    return holder.switching_context()


def service_info(bookie_id: str, http_host: str, http_port: int, scheme: str = "http") -> bytes:
    """Registration data: where the admin HTTP API listens (for tools such as gc-report), like
    BookKeeper's BookieServiceInfo. A wildcard bind address is published as the bookie id's
    host; an IPv6 literal in brackets."""
    host = http_host
    if host in ("", "0.0.0.0", "::"):
        host = str(bookie_id).rsplit(":", 1)[0]
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # IPv6 literal
    return json.dumps({"httpAddress": f"{scheme}://{host}:{http_port}"}).encode()


class BookieService:
    """One bookie: storage + server + HTTP + registration, on the running event loop."""

    def __init__(self, config: ServerConfig, *, metadata_uri: str | None = None) -> None:
        self.config = config
        self.metadata_uri = metadata_uri or default_metadata_uri(config)
        self.store: MetadataStore | None = None
        self.opened: OpenedBookie | None = None
        self.server: BookieServer | None = None
        self.http: AdminHttpServer | None = None
        self.metrics_http: MetricsHttpServer | None = None
        self.bookie_id: BookieId | None = None
        self.addresses: ListenAddresses | None = None
        self._async_bookie: AsyncBookie | None = None
        self._stopping = False
        self.registration: BookieRegistration | None = None
        self._integrity_task: asyncio.Task[None] | None = None
        self._integrity_client: BookKeeper | None = None
        self.autorecovery: AutoRecoveryThread | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        cfg = self.config
        self.store = await asyncio.to_thread(
            open_configured_store, self.metadata_uri, cfg,
        )
        store = self.store
        if not await asyncio.to_thread(store.is_formatted):
            raise MetaStoreError(
                f"the metadata store {self.metadata_uri} is not formatted: run "
                f"`vellum shell metaformat --uri {self.metadata_uri}` first"
            )
        # Before the disks: an unreachable address or a TLS mistake must not cost a journal replay.
        self.addresses = addresses = await asyncio.to_thread(resolve_listen_addresses, cfg)
        tls = server_tls(cfg)
        verifier = token_verifier(cfg)
        auth = server_auth(cfg, verifier)
        instance_id = await asyncio.to_thread(store.registration.get_instance_id)
        if cfg.bookie_port == 0 and not cfg.bookie_id:
            raise CookieError("bookiePort=0 needs an explicit bookieId: the id is bound to the disks by the cookie")
        self.bookie_id = bookie_id_of(cfg, cfg.bookie_port)
        # Read before the disks are looked at: a bookie whose disks were all wiped must be
        # refused before it stamps fresh cookies (which would let the next start through).
        stored = await asyncio.to_thread(store.registration.get_cookie, self.bookie_id)
        store_cookie = None if stored is None else Cookie.decode(
            stored.value, where=f"metadata cookie of {self.bookie_id}")
        self.opened = await asyncio.to_thread(
            open_bookie, cfg, bookie_id=self.bookie_id, instance_id=instance_id, progress=log.info,
            ledger_lister=MetadataLedgerLister(store.ledgers), store_cookie=store_cookie,
            metrics=process_bookie_metrics(),  # the registry the admin HTTP server exports
            master_key_check=MetadataMasterKeys(store.ledgers).matches if cfg.master_key_check_enabled else None,
        )
        await asyncio.to_thread(self._check_store_cookie, self.opened.cookie, stored, store_cookie)
        if self.opened.integrity_check_needed is not None:
            # Before anything is served: no answer of this bookie may deny an entry it lost.
            await asyncio.to_thread(mark_ledgers_limbo, self.opened, store.ledgers, self.bookie_id)
        bookie = self.opened.bookie
        self._async_bookie = AsyncBookie(bookie, loop)
        self.server = BookieServer(
            self._async_bookie,
            host=addresses.bind_host,
            port=cfg.bookie_port,
            limits=ServerLimits(
                max_adds_in_progress=cfg.max_adds_in_progress_limit,
                max_reads_in_progress=cfg.max_reads_in_progress_limit,
                max_frame_size=cfg.netty_max_frame_size_bytes,
                peers=PeerLimits(
                    unauthenticated_max_frame_size=cfg.unauthenticated_max_frame_size_bytes,
                    max_unauthenticated=cfg.unauthenticated_connections_limit,
                    authentication_timeout_s=cfg.authentication_timeout_ms / 1000.0,
                    idle_timeout_s=cfg.connection_idle_timeout_ms / 1000.0,
                    refusal_log_period_s=float(cfg.connection_refusal_log_period_s),
                ),
            ),
            metrics=process_server_metrics(),
            tls=tls,
            auth=auth,
        )
        await self.server.start()
        if cfg.http_server_enabled:
            admin_client = bookie_client_config(cfg, "the bookie's admin HTTP client")
            admin = BookieAdmin(
                bookie=bookie,
                bookie_id=self.bookie_id,
                store=store,
                config=cfg,
                client_config=admin_client,
                is_shutting_down=lambda: self._stopping,
            )
            self.http = AdminHttpServer(
                admin, host=addresses.http_host, port=cfg.http_server_port,
                extra_routes=gc_routes(GcAdmin(
                    bookie=bookie, bookie_id=self.bookie_id,
                    disk_thresholds=DiskThresholds(cfg.disk_usage_warn_threshold, cfg.disk_usage_threshold,
                                                   cfg.disk_usage_lwm_threshold)))
                + autorecovery_routes(store, self.metadata_uri, AutoRecoverySettings.from_config(cfg), admin_client)
                + ledger_routes(LedgerAdmin(store=store, client_config=admin_client)),
                security=http_security(cfg, verifier, addresses.http_host),
                ssl_context=http_tls(cfg),
                header_read_timeout_s=cfg.http_server_header_read_timeout_ms / 1000.0,
            )
            await self.http.start()
        if cfg.metrics_port_enabled:
            # BookKeeper's Prometheus port: metrics only, so it may listen wider than the admin API.
            self.metrics_http = MetricsHttpServer(cfg.prometheus_stats_http_address, cfg.prometheus_stats_http_port,
                                                  header_read_timeout_s=cfg.http_server_header_read_timeout_ms / 1000)
            await self.metrics_http.start()
        # The listener is attached before the first registration: that one may wait for a
        # crashed predecessor's registration to lapse, and a state change meanwhile must count.
        self.registration = BookieRegistration(store.registration, self.bookie_id,
                                               is_read_only=lambda: bookie.is_read_only, data=self._service_info())
        bookie.add_state_listener(self.registration.state_changed)
        store.add_session_listener(self._on_session_event)
        await asyncio.to_thread(self.registration.register)
        await self._start_integrity_check()
        if cfg.auto_recovery_daemon_enabled:
            self.autorecovery = AutoRecoveryThread(AutoRecovery(
                self.metadata_uri, bookie_id=str(self.bookie_id), settings=AutoRecoverySettings.from_config(cfg),
                client_config=bookie_client_config(cfg, "the bookie's AutoRecovery client")))
            await asyncio.to_thread(self.autorecovery.start)
        log.info(
            "bookie %s serving on %s:%d%s (http %s, metrics %s), metadata %s",
            self.bookie_id,
            addresses.bind_host,
            self.server.port,
            ((" with TLS only" + (" (mutual TLS)" if cfg.tls_client_authentication else "")) if tls else "")
            + (f", authentication {'+'.join(cfg.auth_providers)}, authorized roles "
               f"{list(cfg.authorized_roles) or 'any'}" if auth else ""),
            self.http.port if self.http else "off",
            f"{cfg.prometheus_stats_http_address}:{self.metrics_http.port}" if self.metrics_http else "off",
            self.metadata_uri,
        )

    async def _start_integrity_check(self) -> None:
        """Copy back the limbo ledgers' entries in the background (``dataIntegrityChecking``)."""
        assert self.opened is not None and self._async_bookie is not None and self.store is not None
        bookie = self.opened.bookie
        if not bookie.limbo:
            return
        if not self.config.data_integrity_checking:
            log.warning("%d ledger(s) are limbo (answered as unknown) but dataIntegrityChecking=false: nothing "
                        "copies them back; set it to true", len(bookie.limbo))
            return
        client_config = bookie_client_config(self.config, "the bookie's integrity-check client")
        self._integrity_client = await BookKeeper(config=client_config, store=self.store).start()
        check = IntegrityCheck(bookie=bookie, async_bookie=self._async_bookie, client=self._integrity_client,
                               bookie_id=str(self.bookie_id))
        self._integrity_task = asyncio.get_running_loop().create_task(check.run(), name="integrity-check")
        self._integrity_task.add_done_callback(_report_integrity_end)

    def _check_store_cookie(self, local: Cookie, stored: Versioned[bytes] | None, remote: Cookie | None) -> None:
        """The store keeps a copy of each bookie's cookie: a wiped disk must not rejoin silently.

        ``local`` is what the disks say now (stamped from the configuration); ``stored`` /
        ``remote`` is the store's copy as read before the disks were opened, the older one, so
        under ``allowStorageExpansion`` the disks may list more ledger dirs than it, and both
        copies then move to the expanded cookie (a CAS on the version read)."""
        assert self.store is not None and self.bookie_id is not None
        reg = self.store.registration
        if stored is None or remote is None:
            reg.put_cookie(self.bookie_id, local.encode(), None)
            return
        try:
            local.verify_matches(remote, allow_expansion=self.config.allow_storage_expansion)
        except CookieError as e:
            raise CookieError(f"cookie on disk differs from the metadata store's copy: {e}") from None
        if remote != local:
            reg.put_cookie(self.bookie_id, local.encode(), stored.version)

    def _service_info(self) -> bytes:
        if self.http is None or self.bookie_id is None or self.addresses is None:
            return b""
        return service_info(self.bookie_id, self.addresses.http_host, self.http.port, self.http.scheme)

    def _on_session_event(self, event: SessionEvent) -> None:
        # The store re-creates its ephemeral registrations itself after a new session; the
        # registration then checks them against the bookie's state, and an operator wants to
        # see it happen.
        if event is SessionEvent.EXPIRED:
            log.warning("metadata session of %s expired; waiting for a new one", self.bookie_id)
        elif event is SessionEvent.RECONNECTED:
            log.info("metadata session of %s re-established; registration restored", self.bookie_id)
            if self.registration is not None:
                self.registration.session_restored()  # the state may have changed meanwhile

    async def stop(self) -> None:
        self._stopping = True
        if self._integrity_task is not None:
            self._integrity_task.cancel()
            await asyncio.gather(self._integrity_task, return_exceptions=True)
        if self._integrity_client is not None:
            await self._integrity_client.close()
        if self.autorecovery is not None:
            await asyncio.to_thread(self.autorecovery.stop)
        if self.registration is not None:
            await asyncio.to_thread(self.registration.close)
        if self.store is not None and self.bookie_id is not None and self.registration is not None:
            try:
                await asyncio.to_thread(self.store.registration.unregister_bookie, self.bookie_id)
            except Exception:
                log.exception("deregistration failed")
        if self.server is not None:
            await self.server.stop()
        if self.http is not None:
            await self.http.stop()
        if self.metrics_http is not None:
            await self.metrics_http.stop()
        if self._async_bookie is not None:
            self._async_bookie.close()
        if self.opened is not None:
            await asyncio.to_thread(self.opened.close)
        if self.store is not None:
            await asyncio.to_thread(self.store.close)


def _report_integrity_end(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("integrity check stopped: %r; limbo ledgers stay limbo until the next start",
                  task.exception(), exc_info=task.exception())


class MetadataLedgerLister:
    """GC's view of the metadata store (``storage.gc.LedgerLister``): ledger ids range by range
    (hierarchical: one leaf partition at a time) and a fresh existence check."""

    def __init__(self, ledgers: LedgerManager) -> None:
        self._ledgers = ledgers

    def ledger_ranges(self) -> Iterator[list[int]]:
        for r in self._ledgers.ledger_ranges():
            yield [int(i) for i in r.ledger_ids]

    def ledger_exists(self, ledger_id: int) -> bool:
        return self._ledgers.ledger_exists(LedgerId(ledger_id))


class MetadataMasterKeys:
    """The bookie's check of a new ledger's master key (``Bookie``'s ``master_key_check``,
    ``ledgerMasterKeyCheck``): the ledger's metadata must exist and its password must give the
    key (``SHA1("ledger" + password)``; an empty password too). A store that cannot answer
    raises (the bookie refuses that request as retryable, never sets the key unchecked)."""

    def __init__(self, ledgers: LedgerManager) -> None:
        self._ledgers = ledgers

    def matches(self, ledger_id: int, key: bytes) -> bool:
        try:
            metadata = self._ledgers.read_ledger(LedgerId(ledger_id)).value
        except NoSuchLedgerError:
            return False
        return hmac.compare_digest(master_key(metadata.password), bytes(key))


def raise_descriptor_limit(config: ServerConfig) -> int:
    """Raise this process's soft descriptor limit to its hard limit (the JVM does the same for
    BookKeeper) and warn when ``unauthenticatedConnectionsLimit`` would leave few descriptors
    for authenticated clients and storage; returns the soft limit now in force."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as e:
            log.warning("could not raise the descriptor limit from %d to %d: %s", soft, target, e)
    budget = config.unauthenticated_connections_limit
    if soft != resource.RLIM_INFINITY and (budget == 0 or budget > soft // 2):
        log.warning("unauthenticatedConnectionsLimit=%d (0 = no bound) leaves few of the %d file descriptors "
                    "(ulimit -n) for authenticated clients, journals and entry logs: raise the limit or lower "
                    "unauthenticatedConnectionsLimit", budget, soft)
    return soft


def run_bookie(config: ServerConfig, *, metadata_uri: str | None = None) -> int:
    """Run one bookie until SIGTERM/SIGINT; returns the process exit code."""
    import uvloop

    raise_descriptor_limit(config)

    async def main() -> int:
        service = BookieService(config, metadata_uri=metadata_uri)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await service.start()
        except BaseException:
            await service.stop()
            raise
        print(f"READY {service.bookie_id} port={service.server.port if service.server else 0} "
              f"http={service.http.port if service.http else 0} "
              f"metrics={service.metrics_http.port if service.metrics_http else 0}", flush=True)
        await stop.wait()
        log.info("shutting down bookie %s", service.bookie_id)
        await service.stop()
        return 0

    return uvloop.run(main())


def run_autorecovery(config: ServerConfig, *, metadata_uri: str | None = None, worker_id: str | None = None) -> int:
    """``vellum autorecovery``: an auditor candidate and a replication worker, alone in this
    process, until SIGTERM/SIGINT; returns the exit code. The candidate's id is the bookie id
    of the configuration (as BookKeeper's AutoRecoveryMain) unless ``worker_id`` is given."""
    import uvloop

    uri = metadata_uri or default_metadata_uri(config)
    ident = worker_id or str(bookie_id_of(config, config.bookie_port))

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        recovery = AutoRecovery(uri, bookie_id=ident, settings=AutoRecoverySettings.from_config(config),
                                client_config=bookie_client_config(config, "the AutoRecovery client"))
        print(f"READY autorecovery {ident} metadata={uri}", flush=True)
        await recovery.run(stop)
        return 0

    return uvloop.run(main())
