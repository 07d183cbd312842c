"""The bookie's admin HTTP server (aiohttp), on the bookie's own event loop.

Paths and JSON shapes follow BookKeeper's REST API (``/heartbeat``, ``/metrics``,
``/api/v1/config/server_config``, ``/api/v1/bookie/...``, ``/api/v1/ledger/metadata``; the
other ``/api/v1/ledger/*`` paths are ``ledger_routes``). Handlers only parse and render: the work
is done by ``admin.BookieAdmin`` in a thread, so a slow metadata store never blocks the loop.
Errors come back as JSON ``{"error": "..."}`` with 400 (bad parameter), 404 (unknown ledger),
501 (a BookKeeper path whose change a running Vellum bookie cannot make: the answer says how
to make it), 503 (busy) or 500.

Security (``HttpSecurity``, docs/security.md), applied by one middleware to every route, the
ones other modules add included:

* mutating requests (PUT, POST, DELETE, PATCH: GC, compaction suspend/resume, the read-only
  switch, AutoRecovery switches, decommission...) need an admin credential whenever
  ``admin_required`` (the bookie port requires authentication) or a token key is set: a token
  (``Authorization: Bearer <token>``, audience ``audience``) or, over https that requires client
  certificates (``certificates``), the client certificate; either must carry the ``admin``
  role: 401 without a valid credential, 403 without the role. So do the reads in
  ``ADMIN_READS`` (``ledger/read``, ``bookie/sanity``). With ``tokens_for_reads`` every
  other request needs a credential too, with one of ``authorized_roles`` (or ``admin``) when
  that list is not empty. A bearer token, when sent, is the credential (a bad one is refused
  even over a good certificate). ``/heartbeat`` is always open (liveness probes). Refusals are
  logged with the peer, the method, the path and the reason, never the token;
* TLS is the server's ``ssl_context`` (``httpServerTlsEnable``). Each new connection's first
  byte is peeked before the handshake: one that does not open a TLS record (plain http sent to
  the https port) gets a plain-text ``400`` saying the port speaks https, rather than a
  connection closed without a word;
* a connection that has not sent a complete request head within ``header_read_timeout_s`` of
  its accept or of its previous answer is closed (``httpServerHeaderReadTimeoutMs``): a peer
  that sends half a request, or nothing, does not hold a descriptor for long;
* no response carries a password or a master key: JSON keys naming one are redacted
  (``"(redacted)"``, ``security.redaction.redact``, the rule the console applies too) on the
  way out, whatever the handler put there.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from vellum.admin.bookie_admin import BookieAdmin
from vellum.errors import IncorrectParameterError, SecurityError
from vellum.http.json_io import guarded, json_response, parse_json_object
from vellum.security.redaction import redact
from vellum.security.tls import peer_principal
from vellum.security.tokens import ADMIN_AUDIENCE, TokenVerifier
from vellum.stats import REGISTRY

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: the role a token needs for mutating endpoints
ADMIN_ROLE = "admin"
#: paths open whatever the settings (liveness probes)
OPEN_PATHS = frozenset({"/heartbeat"})
#: reads that need the admin role whenever changes do: ``ledger/read`` hands out any ledger's
#: entries, read with the bookie's own identity (past the bookie port's authentication and
#: authorizedRoles), and ``bookie/sanity`` writes and deletes a ledger
ADMIN_READS = frozenset({"/api/v1/ledger/read", "/api/v1/bookie/sanity"})
_MUTATING = frozenset({"PUT", "POST", "DELETE", "PATCH"})


@dataclass(frozen=True)
class HttpSecurity:
    """Who may call the admin API. ``verifier`` checks bearer tokens (None: tokens are not
    accepted) of audience ``audience``; ``certificates``: the https client certificate (CN and
    OU roles) is a credential too; mutating calls need a credential with ``ADMIN_ROLE`` when
    ``admin_required`` or a verifier is set; ``tokens_for_reads`` makes reads need a credential,
    with one of ``authorized_roles`` (or ``ADMIN_ROLE``) if that is not empty."""

    verifier: TokenVerifier | None = None
    audience: str = ADMIN_AUDIENCE
    tokens_for_reads: bool = False
    admin_required: bool = False
    certificates: bool = False
    authorized_roles: tuple[str, ...] = ()

    @property
    def mutations_need_admin(self) -> bool:
        return self.admin_required or self.verifier is not None


@dataclass(frozen=True)
class _Caller:
    """Who made a request, as its credential says."""

    principal: str
    roles: tuple[str, ...]
    method: str  # "token" | "certificate"


def _bearer(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def _refuse(request: web.Request, status: int, reason: str) -> web.Response:
    log.warning("admin HTTP %s %s from %s refused: %s", request.method, request.path, request.remote, reason)
    headers = {"WWW-Authenticate": 'Bearer realm="vellum"'} if status == 401 else None
    return web.Response(text=json.dumps({"error": reason}), status=status, content_type="application/json",
                        headers=headers)


def _caller(request: web.Request, security: HttpSecurity) -> _Caller | str | None:
    """The request's credential: a ``_Caller``, the reason a credential sent is refused, or
    None if it sent none."""
    token = _bearer(request)
    if token is not None:
        if security.verifier is None:
            return ("tokens are not accepted by this admin API (no tokenSecretKeyFile or tokenPublicKeyFile): "
                    "use a client certificate with the admin role over https")
        try:
            claims = security.verifier.verify(token, audience=security.audience)
        except SecurityError as e:
            return str(e)
        return _Caller(claims.subject, claims.roles, "token")
    if security.certificates and request.transport is not None:
        principal, roles = peer_principal(request.transport.get_extra_info("ssl_object"))
        if principal:
            return _Caller(principal, roles, "certificate")
    return None


def _ways(security: HttpSecurity, what: str) -> str:
    ways = []
    if security.verifier is not None:
        ways.append(f"a token{what} ('Authorization: Bearer <token>', `vellum security issue-token --for admin`)")
    if security.certificates:
        ways.append(f"a client certificate{what} over https")
    return " or ".join(ways) or f"a credential{what}, and this bookie accepts none (set tokenSecretKeyFile)"


def security_middleware(security: HttpSecurity) -> Any:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in OPEN_PATHS:
            mutating = request.method in _MUTATING or request.path in ADMIN_READS
            if security.mutations_need_admin if mutating else security.tokens_for_reads:
                caller = _caller(request, security)
                if isinstance(caller, str):
                    return _refuse(request, 401, caller)
                if caller is None:
                    what = f" with the {ADMIN_ROLE} role" if mutating else ""
                    return _refuse(request, 401, f"this call needs {_ways(security, what)}")
                who = f"principal {caller.principal!r} ({caller.method}, roles {list(caller.roles)})"
                if mutating and ADMIN_ROLE not in caller.roles:
                    return _refuse(request, 403, f"{who} lacks the {ADMIN_ROLE} role this call needs")
                allowed = set(security.authorized_roles) | {ADMIN_ROLE}
                if not mutating and security.authorized_roles and not allowed & set(caller.roles):
                    return _refuse(request, 403, f"{who} has none of the authorized roles "
                                                 f"{list(security.authorized_roles)} (authorizedRoles) nor "
                                                 f"{ADMIN_ROLE}")
        response = await handler(request)
        if isinstance(response, web.Response) and response.content_type == "application/json" and response.text:
            try:
                data = json.loads(response.text)
            except ValueError:
                return response
            clean, changed = redact(data)
            if changed:
                response.text = json.dumps(clean, indent=2)
        return response

    return middleware


_json = json_response


def _error(message: str, status: int) -> web.Response:
    return _json({"error": message}, status)


async def _body(request: web.Request) -> dict[str, Any]:
    return parse_json_object(await request.text())


def _int_param(request: web.Request, name: str) -> int:
    raw = request.query.get(name)
    if raw is None:
        raise IncorrectParameterError(f"missing query parameter {name}")
    try:
        return int(raw)
    except ValueError:
        raise IncorrectParameterError(f"{name}={raw!r} is not an integer") from None


def _bool(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise IncorrectParameterError(f"{name} must be a boolean, got {value!r}")


def build_app(admin: BookieAdmin, extra_routes: list[web.RouteDef] | None = None,
              security: HttpSecurity | None = None) -> web.Application:
    """The aiohttp application; ``extra_routes`` lets later features (GC) add their paths."""

    async def heartbeat(_r: web.Request) -> web.Response:
        return web.Response(text="OK\n")

    async def metrics(_r: web.Request) -> web.Response:
        body = generate_latest(REGISTRY)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def info(_r: web.Request) -> Any:
        return await asyncio.to_thread(admin.info)

    async def state(_r: web.Request) -> Any:
        return admin.state()

    async def readonly_get(_r: web.Request) -> Any:
        return {"readOnly": admin.state()["readOnly"]}

    async def readonly_put(r: web.Request) -> Any:
        body = await _body(r)
        if "readOnly" not in body:
            raise IncorrectParameterError('body must be {"readOnly": true|false}')
        return admin.set_read_only(_bool(body["readOnly"], "readOnly"))

    async def list_bookies(r: web.Request) -> Any:
        kind = r.query.get("type", "rw")
        hostnames = r.query.get("print_hostnames", "false").lower() == "true"
        return await asyncio.to_thread(admin.list_bookies, kind, hostnames)

    async def list_bookie_info(_r: web.Request) -> Any:
        found = await admin.list_bookie_info()
        return found if found else _error("Not found any Bookie info.", 404)

    async def cluster_info(_r: web.Request) -> Any:
        return await asyncio.to_thread(admin.cluster_info)

    async def sanity(_r: web.Request) -> Any:
        return await admin.sanity()

    async def server_config_get(_r: web.Request) -> Any:
        return admin.server_config()

    async def server_config_put(r: web.Request) -> Any:
        body = await _body(r)
        log.warning("admin HTTP PUT %s from %s refused: keys %s; the configuration is fixed at start", r.path,
                    r.remote, sorted(body))
        return _error(f"a running bookie's configuration does not change: set {', '.join(sorted(body)) or 'the keys'} "
                      "in its bk_server.conf and restart it (`vellum config show` lists the keys)", 501)

    async def expand_storage(r: web.Request) -> Any:
        log.warning("admin HTTP PUT %s from %s refused: storage is expanded at start", r.path, r.remote)
        return _error("a running bookie's directories are fixed: add the new empty directories to "
                      "ledgerDirectories (or indexDirectories) in its bk_server.conf, set allowStorageExpansion=true "
                      "and restart it; the start stamps their cookies and updates the metadata store's copy", 501)

    async def entry_location_compact_get(_r: web.Request) -> Any:
        return admin.entry_location_compaction()

    async def entry_location_compact(r: web.Request) -> Any:
        log.warning("admin HTTP %s %s from %s refused: not supported", r.method, r.path, r.remote)
        return _error("this bookie does not compact its entry-location index on request: RocksDB compacts it in "
                      "the background", 501)

    async def ledger_metadata(r: web.Request) -> Any:
        ledger_id = _int_param(r, "ledger_id")
        return await asyncio.to_thread(admin.ledger_metadata, ledger_id)

    async def list_disk_file(r: web.Request) -> Any:
        return await asyncio.to_thread(admin.list_disk_files, r.query.get("file_type"))

    async def last_log_mark(_r: web.Request) -> Any:
        return await asyncio.to_thread(admin.last_log_mark)

    async def is_ready(_r: web.Request) -> web.Response:
        st = admin.state()
        return web.Response(text="OK\n" if st["running"] else "not ready\n", status=200 if st["running"] else 503)

    app = web.Application(middlewares=[security_middleware(security or HttpSecurity())])
    app.add_routes(
        [
            web.get("/heartbeat", heartbeat),
            web.get("/metrics", metrics),
            web.get("/api/v1/config/server_config", guarded(server_config_get)),
            web.put("/api/v1/config/server_config", guarded(server_config_put)),
            web.get("/api/v1/bookie/info", guarded(info)),
            web.get("/api/v1/bookie/state", guarded(state)),
            web.get("/api/v1/bookie/state/readonly", guarded(readonly_get)),
            web.put("/api/v1/bookie/state/readonly", guarded(readonly_put)),
            web.get("/api/v1/bookie/is_ready", is_ready),
            web.get("/api/v1/bookie/sanity", guarded(sanity)),
            web.get("/api/v1/bookie/list_bookies", guarded(list_bookies)),
            web.get("/api/v1/bookie/list_bookie_info", guarded(list_bookie_info)),
            web.get("/api/v1/bookie/cluster_info", guarded(cluster_info)),
            web.get("/api/v1/bookie/list_disk_file", guarded(list_disk_file)),
            web.get("/api/v1/bookie/last_log_mark", guarded(last_log_mark)),
            web.put("/api/v1/bookie/expand_storage", guarded(expand_storage)),
            web.get("/api/v1/bookie/entry_location_compact", guarded(entry_location_compact_get)),
            web.put("/api/v1/bookie/entry_location_compact", guarded(entry_location_compact)),
            web.get("/api/v1/ledger/metadata", guarded(ledger_metadata)),
            *(extra_routes or []),
        ]
    )
    return app


#: the first byte of every TLS connection: a handshake record (ClientHello)
_TLS_HANDSHAKE = 0x16


def plain_http_answer(host: str, port: int) -> bytes:
    """What a plain-http request to the https port gets: a 400 in plain text that says so."""
    text = (f"400 Bad Request: this port speaks https, not http. Use https://{host}:{port}/ "
            "(the bookie has httpServerTlsEnable=true).\n").encode()
    head = ("HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(text)}\r\nConnection: close\r\n\r\n").encode()
    return head + text


class AdminHttpServer:
    """Runs ``build_app`` on (host, port) on the current event loop; over TLS, its own accept
    loop peeks at each connection's first byte (plain http gets ``plain_http_answer``)."""

    def __init__(
        self, admin: BookieAdmin, *, host: str, port: int, extra_routes: list[web.RouteDef] | None = None,
        security: HttpSecurity | None = None, ssl_context: ssl.SSLContext | None = None,
        header_read_timeout_s: float = 10.0,
    ) -> None:
        self._app = build_app(admin, extra_routes, security)
        self._header_read_timeout_s = header_read_timeout_s
        self._host = host
        self._port = port
        self._ssl = ssl_context
        self._runner: web.AppRunner | None = None
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._sorting: set[asyncio.Task[None]] = set()

    @property
    def scheme(self) -> str:
        return "https" if self._ssl is not None else "http"

    @property
    def port(self) -> int:
        return self._port

    async def start(self) -> None:
        # aiohttp's keep-alive timer runs from the accept and from each answer, and closes the
        # connection if no complete request head arrived meanwhile (a request being handled is
        # not affected): exactly a header read timeout.
        self._runner = web.AppRunner(self._app, access_log=None, keepalive_timeout=self._header_read_timeout_s)
        await self._runner.setup()
        if self._ssl is not None:
            await self._start_tls()
            return
        site = web.TCPSite(self._runner, self._host, self._port, reuse_address=True)
        await site.start()
        server = site._server  # the bound socket tells the real port when 0 was asked
        sockets = getattr(server, "sockets", None)
        if sockets:
            self._port = sockets[0].getsockname()[1]

    async def _start_tls(self) -> None:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(self._host or None, self._port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
        family, _type, _proto, _name, address = infos[0]
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(address)
            listener.listen(128)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        self._listener = listener
        self._port = listener.getsockname()[1]
        self._accepting = loop.create_task(self._accept(listener), name="admin-https-accept")

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _peer = await loop.sock_accept(listener)
            except OSError as e:
                log.warning("admin https port %d: accept failed: %s", self._port, e)
                await asyncio.sleep(0.1)  # e.g. out of descriptors: do not spin
                continue
            conn.setblocking(False)
            task = loop.create_task(self._sort(conn))
            self._sorting.add(task)
            task.add_done_callback(self._sorting.discard)

    async def _first_byte(self, conn: socket.socket) -> bytes:
        loop = asyncio.get_running_loop()
        readable: asyncio.Future[None] = loop.create_future()

        def ready() -> None:
            if not readable.done():
                readable.set_result(None)

        loop.add_reader(conn.fileno(), ready)
        try:
            await readable
        finally:
            loop.remove_reader(conn.fileno())
        return conn.recv(1, socket.MSG_PEEK)

    async def _sort(self, conn: socket.socket) -> None:
        """Hand a TLS connection to aiohttp; answer plain http with a 400; drop silence."""
        assert self._runner is not None and self._runner.server is not None and self._ssl is not None
        server = self._runner.server
        loop = asyncio.get_running_loop()
        handed = False  # once handed over, the transport owns (and closes) the socket
        try:
            first = await asyncio.wait_for(self._first_byte(conn), self._header_read_timeout_s)
            if first and first[0] == _TLS_HANDSHAKE:
                handed = True
                await loop.connect_accepted_socket(server, conn, ssl=self._ssl,
                                                   ssl_handshake_timeout=self._header_read_timeout_s)
            elif first:
                await self._refuse_plain_http(conn)
        except (OSError, TimeoutError) as e:  # ssl.SSLError is an OSError
            log.info("admin https connection dropped before its first request: %s", str(e) or type(e).__name__)
        finally:
            if not handed:
                conn.close()

    async def _refuse_plain_http(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            peer = conn.getpeername()[0]
        except OSError:
            peer = "?"
        # Read the request head first: closing with unread data would reset the connection
        # and the client could lose the answer.
        head = await asyncio.wait_for(loop.sock_recv(conn, 65536), self._header_read_timeout_s)
        line = head.split(b"\r\n", 1)[0][:120].decode("ascii", "replace")
        log.warning("admin https port %d: plain http from %s (%r) answered 400: this port speaks https",
                    self._port, peer, line)
        await loop.sock_sendall(conn, plain_http_answer(self._host, self._port))
        conn.shutdown(socket.SHUT_WR)
        try:  # until the client closes, briefly: its last bytes must not turn our close into a reset
            while await asyncio.wait_for(loop.sock_recv(conn, 65536), 1.0):
                pass
        except (OSError, TimeoutError):
            pass

    async def stop(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
            await asyncio.gather(self._accepting, return_exceptions=True)
            self._accepting = None
        for task in list(self._sorting):
            task.cancel()
        await asyncio.gather(*self._sorting, return_exceptions=True)
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
