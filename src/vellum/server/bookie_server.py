"""The bookie's network server: the transport of the request path.

The request path is BookKeeper's processors with a sans-IO middle:

- transport (here): ``BookieConnection`` moves bytes in (straight into the codec's
  ``FrameDecoder``) and out (``server/replies.py``), performs the TLS upgrade and closes;
- session (``server/session.py``): decoded requests in, decisions out (reply, dispatch, upgrade
  to TLS, refuse, close) from where the connection stands: upgraded, authenticated;
- processors (``server/processors.py``): one per operation, the only callers of ``AsyncBookie``
  (the thread<->loop seam);
- reply writer (``server/replies.py``): every answer encoded by the codec, coalesced per loop
  iteration.

Invariants:
- an ADD is answered only when the bookie reports the journal fsync covering it (the bookie's
  callback), a fencing READ only once the fence is durable;
- adds and reads in progress are bounded (``maxAddsInProgressLimit``,
  ``maxReadsInProgressLimit``, per bookie): past the bound a request is answered
  ETOOMANYREQUESTS at once, so memory stays bounded under overload;
- a frame with intact framing but bad contents gets an error answer and the connection keeps
  serving; broken framing (bad length) closes that connection only;
- responses are coalesced: everything ready in one loop iteration leaves in one write;
- with TLS configured (a ``ReloadingContext``), a connection is served only once it has been
  upgraded: START_TLS (BookKeeper's v3 negotiation) is answered EOK in clear and the TLS
  handshake follows (``loop.start_tls``, the context current at that moment, so rotated
  certificates apply to new connections); every other request before that is answered EUA,
  preceded by an ``ErrorResponse(EUA, opcode=START_TLS)`` notice that tells the client TLS is
  required ("plaintext request refused: this bookie requires TLS"), and the connection is
  closed. Bytes after START_TLS before its answer, or a failed handshake, close the connection.
  START_TLS inside TLS is answered EOK: the client's confirmation that the handshake was accepted.
  After a mutual-TLS handshake the peer certificate's CN and OU roles are kept on the
  connection (``principal``, ``roles``) for authorization. Without TLS configured, START_TLS is
  answered EBADREQ (BookKeeper's answer when TLS is not configured) and the connection serves on.
- with authentication configured (a ``BookieAuthenticator``: ``bookieAuthProviderFactoryClass``,
  ``authorizedRoles``), a connection is served only once it is authenticated and authorized:
  by its mutual-TLS certificate (``tls`` provider, decided right after the handshake) or by an
  AUTH request (a token, or ``tls`` to confirm the certificate). Until then only START_TLS and
  AUTH are answered; any other request gets the notice ``AuthResponse(AUTH_NOTICE_ID, EUA,
  reason)``, its own EUA answer, and the connection is closed (logged with the peer and the
  reason). A refused AUTH is answered EUA with the reason, then the connection is closed.
  Without authentication configured, AUTH is answered EOK ("authentication is off").
- a connection is *unauthenticated* until it is upgraded (when TLS is required) and
  authenticated (when authentication is on); with neither configured, every connection is
  authenticated from its accept. Until then it may send frames of
  ``unauthenticatedMaxFrameSizeBytes`` at most (a longer announced length closes it), and the
  ``ConnectionGuard`` (``server/guard.py``) bounds how many such connections there are and how
  long each may last; afterwards ``nettyMaxFrameSizeBytes`` applies. Receive buffers grow with
  the bytes received, never with a length announced (``FrameDecoder``). Every refusal or
  close decided here is counted by reason and logged rate-limited (``RefusalLog``).

A request refused for its master key (EUA) is logged with the ledger id, the request and the
peer, never the key, rate-limited (``server/processors.py``); every other error answer is
logged and counted there too.

Metrics: each server counts with plain ints on the loop thread (``server/metrics.py``), so
that two servers in one process keep their own counts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

from vellum.bookie.executor import AsyncBookie
from vellum.errors import EOK, FramingError
from vellum.proto import codec
from vellum.proto import messages as m
from vellum.security.auth import BookieAuthenticator, Identity
from vellum.security.tls import ReloadingContext, peer_principal
from vellum.server.guard import ConnectionGuard, PeerLimits, RefusalLog
from vellum.server.metrics import ServerMetrics, process_server_metrics
from vellum.server.processors import Channel, Counters, Processors
from vellum.server.replies import ReplyWriter
from vellum.server.session import (
    Authenticated,
    Close,
    Decision,
    Dispatch,
    Phase,
    Refuse,
    Reply,
    Session,
    UpgradeTls,
)

log = logging.getLogger(__name__)

#: a TLS handshake that does not complete in this time closes the connection
TLS_HANDSHAKE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class ServerLimits:
    max_adds_in_progress: int = 10000  # 0 = unlimited (BookKeeper's meaning)
    max_reads_in_progress: int = 10000
    max_frame_size: int = m.DEFAULT_MAX_FRAME_SIZE
    #: what unauthenticated and idle connections may cost
    peers: PeerLimits = field(default_factory=PeerLimits)


class BookieConnection(asyncio.BufferedProtocol):
    """One client connection's transport. Reads go straight into the frame decoder's buffers
    (an ADD of a big entry lands in a buffer of its own and is journaled and cached from there,
    uncopied); the session decides, the processors serve, the reply writer answers."""

    def __init__(self, bookie: AsyncBookie, counters: Counters, limits: ServerLimits,
                 on_close: Callable[[BookieConnection], None], tls: ReloadingContext | None = None,
                 auth: BookieAuthenticator | None = None, guard: ConnectionGuard | None = None) -> None:
        self._limits = limits
        self._counters = counters
        self._on_close = on_close
        self._tls = tls
        self._auth = auth
        trusted = tls is None and auth is None
        # Pipelined ADDs of one read come decoded together (``AddBatch``), to go to the bookie
        # and back as one batch.
        self._decoder = codec.FrameDecoder(
            limits.max_frame_size if trusted else min(limits.max_frame_size, limits.peers.unauthenticated_max_frame_size),
            side="server", batch_adds=True)
        self._guard = guard if guard is not None else ConnectionGuard(
            limits.peers, RefusalLog(limits.peers.refusal_log_period_s, counters.refused), counters=counters)
        self._refusals = self._guard.refusals
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._replies = ReplyWriter(self._loop, coalesce=tls is not None)
        self._channel = Channel(bookie, counters, self._replies, self._loop, self._describe_peer)
        self._processors = Processors(self._channel)
        # made at connection_made (it names the peer)
        self._session = Session(peer="?", tls=tls is not None, auth=auth, requests=counters.requests)
        # bytes came since the guard last looked (idle timeout)
        self._active = False
        self._upgrade_started = 0.0
        self._closing = False

    # ------------------------------------------------------------------ who the peer is
    @property
    def principal(self) -> str | None:
        """The peer certificate's CN after a mutual-TLS handshake (for authorization)."""
        return self._session.principal

    @property
    def roles(self) -> tuple[str, ...]:
        return self._session.roles

    @property
    def identity(self) -> Identity | None:
        """Who the connection is authenticated as (None without authentication)."""
        return self._session.identity

    # ---------------------------------------------------------------------------- transport
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses but have the same interface.
        self._transport = cast(asyncio.Transport, transport)
        self._replies.attach(self._transport)
        self._session.peer = self._peer()
        self._counters.connections += 1
        self._guard.accepted(self, authenticated=self._session.trusted)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._upgrading and not self._closing:
            # The TLS transport gave up (its handshake timeout) or the peer left mid-handshake:
            # the upgrade task is cancelled below without seeing an error, so say it here.
            elapsed = self._loop.time() - self._upgrade_started
            reason = (f"no handshake within {TLS_HANDSHAKE_TIMEOUT_S:g}s" if elapsed >= TLS_HANDSHAKE_TIMEOUT_S * 0.9
                      else f"the connection closed during the handshake ({exc or 'by the peer'})")
            self._decide(self._session.tls_failed(reason))
        self._closing = True
        self._session.close()
        self._counters.connections -= 1
        self._guard.closed(self)
        self._transport = None
        self._replies.detach()
        self._channel.cancel()
        self._on_close(self)

    @property
    def _upgrading(self) -> bool:
        return self._session.phase is Phase.UPGRADING

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._decoder.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self._active = True
        try:
            messages = self._decoder.buffer_updated(nbytes)
        except FramingError as e:
            self._decide(self._session.framing_failed(str(e), self._decoder.max_frame_size))
            return
        if not messages:
            return
        session = self._session
        if session.dispatchable(messages):  # the hot path: what receive() would decide, undecorated
            self._processors.dispatch(messages)
            return
        self._decide(session.receive(messages, buffered=self._decoder.buffered > 0))

    def _decide(self, decisions: list[Decision]) -> None:
        """Carry out the session's decisions, in order. (The connection's own acts are
        written first, closing and the TLS upgrade, then what it hands on: requests to the
        processors, replies to the writer, refusals to the log; the hot path's dispatch does
        not come here, ``buffer_updated`` hands it over directly.)"""
        for d in decisions:
            if isinstance(d, Close):
                self._close(d.reason, d.message, d.detail)
            elif isinstance(d, UpgradeTls):
                if self._transport is not None:
                    self._transport.pause_reading()  # nothing more in clear; start_tls resumes under TLS
                self._upgrade_started = self._loop.time()
                upgrade = self._start_tls(d.request)
                self._channel.spawn(upgrade)
            elif isinstance(d, Dispatch):
                self._processors.dispatch(d.requests)
            elif isinstance(d, Reply):
                self._replies.send(d.message)
            elif isinstance(d, Refuse):
                self._refusals.refused(d.reason, self.peer_host(), d.message, d.detail)
            elif isinstance(d, Authenticated):
                log.info("connection from %s authenticated: %s", self._peer(), d.identity.describe(),
                         extra={"peer": self._peer()})
            else:  # Trusted
                self._decoder.max_frame_size = self._limits.max_frame_size
                self._guard.authenticated(self)

    def _peer(self) -> str:
        if self._transport is None:
            return "?"
        return str(self._transport.get_extra_info("peername"))

    def _describe_peer(self) -> str:
        identity = self._session.identity
        return self._peer() + (f" ({identity.describe()})" if identity is not None else "")

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    # ------------------------------------------------------------- the guard's questions
    def peer_host(self) -> str:
        """The peer's address without its port (what refusals are rate-limited by)."""
        peer = self._transport.get_extra_info("peername") if self._transport is not None else None
        return str(peer[0]) if isinstance(peer, tuple) and peer else str(peer or "?")

    def is_busy(self) -> bool:
        """A request is in progress: a read, a long poll, an add not answered yet, a FORCE."""
        return self._channel.busy()

    def take_activity(self) -> bool:
        """Whether bytes came or went since the last call."""
        active = self._active or self._replies.wrote
        self._active = self._replies.wrote = False
        return active

    def close_for(self, reason: str, message: str, detail: str = "") -> None:
        """Close this connection once what is queued is written: counted under ``reason`` and
        logged (``message``) rate-limited per (reason, peer address, ``detail``)."""
        self._session.close()
        self._close(reason, message, detail)

    def _close(self, reason: str, message: str, detail: str) -> None:
        if self._closing:
            return
        self._closing = True
        self._refusals.refused(reason, self.peer_host(), message, detail)
        self._replies.flush()
        if self._transport is not None:
            self._transport.close()

    # ------------------------------------------------------------------------------- TLS
    async def _start_tls(self, req: m.StartTlsRequest) -> None:
        transport = self._transport
        assert self._tls is not None
        if transport is None:
            return
        try:
            context = self._tls.get()
            # The EOK answer leaves in clear, before any TLS record: written now, not coalesced.
            self._replies.send_now(m.StartTlsResponse(req.request_id, EOK))
            tls_transport = await self._loop.start_tls(
                transport, self, context, server_side=True, ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S,
            )
        except asyncio.CancelledError:
            raise
        except Exception as e:  # ssl.SSLError, a timeout, the peer gone
            if not self._closing:  # else closed on purpose (a deadline, the budget), logged then
                self._decide(self._session.tls_failed(_tls_reason(e)))
            self._closing = True
            transport.close()
            return
        if tls_transport is None or self._transport is None:  # closed meanwhile
            return
        self._transport = cast(asyncio.Transport, tls_transport)
        self._replies.attach(self._transport)
        ssl_object = tls_transport.get_extra_info("ssl_object")
        principal, roles = peer_principal(ssl_object)
        if self._closing:
            return
        log.info("TLS connection from %s (%s%s)", self._session.peer, ssl_object.version() if ssl_object else "?",
                 f", principal {principal!r}, roles {list(roles)}" if principal else "",
                 extra={"peer": self._session.peer})
        self._decide(self._session.tls_established(principal, roles))


def _tls_reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return f"no handshake within {TLS_HANDSHAKE_TIMEOUT_S:g}s"
    reason = str(getattr(exc, "verify_message", None) or getattr(exc, "reason", None) or exc or type(exc).__name__)
    if reason.isupper():  # OpenSSL's code, e.g. PEER_DID_NOT_RETURN_A_CERTIFICATE
        reason = reason.replace("_", " ").lower()
    return reason


class BookieServer:
    """Listens on (host, port) and serves the bookie protocol."""

    def __init__(self, bookie: AsyncBookie, *, host: str, port: int, limits: ServerLimits,
                 metrics: ServerMetrics | None = None, tls: ReloadingContext | None = None,
                 auth: BookieAuthenticator | None = None) -> None:
        """``metrics`` exports this server's counts while it serves (default: the process's,
        on the registry the admin HTTP server exports). ``tls``: serve TLS connections only
        (START_TLS), with the context it holds when each connection upgrades. ``auth``: serve
        only authenticated, authorized connections."""
        self._tls = tls
        self._auth = auth
        self._bookie = bookie
        self._host = host
        self._port = port
        self._limits = limits
        self._counters = Counters(max_adds=limits.max_adds_in_progress, max_reads=limits.max_reads_in_progress,
                                  max_frame_size=limits.max_frame_size)
        self._metrics = metrics if metrics is not None else process_server_metrics()
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[BookieConnection] = set()
        self._guard: ConnectionGuard | None = None

    @property
    def port(self) -> int:
        return self._port

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        peers = self._limits.peers
        guard = self._guard = ConnectionGuard(peers, RefusalLog(peers.refusal_log_period_s, self._counters.refused),
                                              counters=self._counters)

        def factory() -> BookieConnection:
            conn = BookieConnection(self._bookie, self._counters, self._limits, self._connections.discard, self._tls,
                                    self._auth, guard)
            self._connections.add(conn)  # tracked so that stop() can close it
            return conn

        self._server = await loop.create_server(factory, self._host, self._port, reuse_address=True)
        self._port = self._server.sockets[0].getsockname()[1]
        guard.start(self._server.sockets[0].fileno())
        self._metrics.track(self._counters)

    async def stop(self) -> None:
        if self._server is None:
            return
        self._metrics.untrack(self._counters)
        if self._guard is not None:
            await self._guard.stop()
        self._server.close()
        for conn in list(self._connections):
            conn.close()
        await self._server.wait_closed()
        self._server = None
