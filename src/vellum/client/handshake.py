"""START_TLS and authentication of a new bookie connection: the negotiation a connection runs
before it carries requests (``Handshake``), and the errors that say why a bookie and this client
could not agree.

* TLS (a client made with ``tls``): the first frame on a new connection is START_TLS and nothing
  else leaves until its answer; on EOK the connection is upgraded (``loop.start_tls``, the
  context current at that moment, so rotated certificates apply to new connections), then
  START_TLS is sent once more inside TLS and the bookie's EOK confirms that it accepted the
  handshake (with TLS 1.3 the client's side completes before the bookie has checked the client
  certificate, and a bookie that refuses it just closes); only then is the connection up. A
  bookie that answers START_TLS with an error "does not offer TLS"; a failed handshake (the
  bookie's certificate not from the trusted CA, expired) or a connection closed before the
  confirmation (the bookie refused our certificate) fails the connection with
  :class:`SecurityError` naming the bookie and the reason. A client without TLS that reaches a
  bookie requiring it gets the bookie's notice (``ErrorResponse(EUA, opcode=START_TLS)``) and
  fails everything pending with a :class:`SecurityError` saying the bookie requires TLS.
  Security failures back off like failed connects.
* Authentication (a client made with ``auth``, a ``ClientAuth``): after START_TLS (if any) the
  connection sends AUTH (a token, or ``tls`` to have its certificate checked) and nothing else
  until the answer; the connection is up only on EOK. A refusal (EUA with the bookie's reason),
  and the bookie's notice ``AuthResponse(AUTH_NOTICE_ID, EUA, reason)`` that precedes the
  refusal of a request on an unauthenticated connection, fail everything pending with a
  :class:`SecurityError` naming the bookie and carrying that reason.

The connection (``client/bookie_client.py``) owns the socket and calls the handshake: ``run``
after the TCP connect, ``answer`` with the frames that arrive before it is up, ``lost`` and
``fail`` when it goes away. The handshake sees the connection only through ``HandshakeLink``.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from typing import Any, Protocol, cast

from vellum.errors import EOK, WIRE_STATUS_NAMES, BookieHandleNotAvailableError, SecurityError, VellumError
from vellum.proto import codec
from vellum.proto import messages as m
from vellum.security.auth import ClientAuth
from vellum.security.tls import ReloadingContext

log = logging.getLogger(__name__)

#: what a failed negotiation raises (``Handshake.failure`` turns either into a SecurityError)
NEGOTIATION_ERRORS = (SecurityError, ssl.SSLError)


class HandshakeLink(Protocol):
    """What the handshake needs of its connection."""

    bookie_id: str
    host: str
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport | None

    def new_request_id(self) -> int: ...

    def is_closed(self) -> bool: ...

    def frames_buffered(self) -> bool: ...

    def bad_answer(self, reason: str) -> None: ...

    def fail_security(self, err: SecurityError) -> None: ...


class Handshake:
    """The negotiation of one connection: START_TLS (``tls``), then AUTH (``auth``)."""

    def __init__(self, conn: HandshakeLink, tls: ReloadingContext | None, auth: ClientAuth | None,
                 timeout_s: float) -> None:
        self._conn = conn
        self._tls = tls
        self._auth = auth
        self._timeout_s = timeout_s
        # TLS: the answer to our START_TLS (its status), awaited by run before the upgrade,
        # then again for the confirmation inside TLS (tls_confirming)
        self.tls_answer: asyncio.Future[int] | None = None
        self.tls_confirming = False
        # the answer to our AUTH, awaited by run
        self.auth_answer: asyncio.Future[m.AuthResponse] | None = None

    @property
    def needed(self) -> bool:
        """Does a new connection negotiate anything before it is up?"""
        return self._tls is not None or self._auth is not None

    async def run(self, connecting: Callable[[], bool]) -> None:
        """START_TLS and the handshake, then AUTH, each bounded by the timeout, while
        ``connecting()`` says the connection is still being set up."""
        if self._tls is not None and connecting():
            await asyncio.wait_for(self._start_tls(self._tls), self._timeout_s)
        if self._auth is not None and connecting():
            await asyncio.wait_for(self._authenticate(self._auth), self._timeout_s)

    def failure(self, exc: BaseException) -> SecurityError:
        """The SecurityError of a negotiation that raised ``exc`` (a SecurityError or an SSLError)."""
        if isinstance(exc, SecurityError):
            return exc
        assert isinstance(exc, ssl.SSLError)
        return SecurityError(f"TLS handshake with bookie {self._conn.bookie_id} failed: {_ssl_reason(exc)}")

    def step(self, reason: str) -> str:
        """``reason`` of a connect that failed once the socket was open, naming the step."""
        if self._tls is not None:
            return f"TLS negotiation {reason}"
        if self._auth is not None:
            return f"authentication {reason}"
        return reason

    async def _start_tls(self, tls: ReloadingContext) -> None:
        """START_TLS, then the handshake; the connection is up (``_up``) once both succeeded."""
        conn = self._conn
        transport = conn.transport
        assert transport is not None
        answer = self.tls_answer = conn.loop.create_future()
        transport.write(codec.encode(m.StartTlsRequest(conn.new_request_id())))
        status = await answer
        if status != EOK:
            raise SecurityError(
                f"bookie {conn.bookie_id} does not offer TLS (it answered START_TLS with "
                f"{WIRE_STATUS_NAMES.get(status, status)}), and this client is configured for TLS "
                "(tlsProviderFactoryClass): turn TLS on at the bookie, or off at the client"
            )
        protocol = cast(asyncio.BaseProtocol, conn)
        tls_transport = await conn.loop.start_tls(transport, protocol, tls.get(), server_hostname=conn.host)
        if tls_transport is None or conn.is_closed():
            raise BookieHandleNotAvailableError(f"connection to bookie {conn.bookie_id} closed during TLS setup")
        conn.transport = cast(asyncio.Transport, tls_transport)
        # The bookie's EOK to a START_TLS inside TLS says it accepted the handshake.
        self.tls_confirming = True
        answer = self.tls_answer = conn.loop.create_future()
        conn.transport.write(codec.encode(m.StartTlsRequest(conn.new_request_id())))
        status = await answer
        if status != EOK:
            raise SecurityError(f"bookie {conn.bookie_id} did not confirm the TLS connection "
                                f"({WIRE_STATUS_NAMES.get(status, status)})")
        self.tls_confirming = False

    async def _authenticate(self, auth: ClientAuth) -> None:
        """AUTH with ``auth``'s provider; returns once the bookie accepted it (a refusal is
        turned into a SecurityError and the connection shut down by ``answer``)."""
        conn = self._conn
        transport = conn.transport
        assert transport is not None
        payload = auth.payload()
        answer = self.auth_answer = conn.loop.create_future()
        transport.write(codec.encode(m.AuthRequest(conn.new_request_id(), auth.plugin, payload)))
        reply = await answer
        log.debug("bookie %s: %s", conn.bookie_id, reply.message)

    # -------------------------------------------------------------------------- answers
    def answer(self, messages: list[Any]) -> None:
        """Frames before the connection is up: the answer to our START_TLS or AUTH."""
        if not messages:
            return  # a partial frame so far
        if len(messages) == 1:
            msg = messages[0]
            kind = type(msg)
            answer = self.auth_answer
            if kind is m.AuthResponse:
                if msg.status != EOK or msg.request_id == m.AUTH_NOTICE_ID:
                    self.refused(msg.message)
                elif answer is not None and not answer.done() and not self._conn.frames_buffered():
                    answer.set_result(msg)
                else:
                    self._conn.bad_answer("an unexpected AUTH answer")
                return
            if kind is m.ErrorResponse and msg.opcode == m.OP_AUTH and answer is not None:
                self.refused("it does not know AUTH (a bookie without authentication support)")
                return
        self._tls_answer(messages)

    def refused(self, reason: str) -> None:
        """The bookie refused this client's authentication (or the lack of it): fail all."""
        err = SecurityError(f"bookie {self._conn.bookie_id} refused this client: {reason or 'EUA'}")
        log.warning("%s", err)
        self._conn.fail_security(err)

    def tls_required(self) -> None:
        """The bookie's notice that it serves TLS connections only (it precedes its refusals)."""
        err = SecurityError(
            f"bookie {self._conn.bookie_id} requires TLS and this client is configured without it: set "
            "tlsProviderFactoryClass=org.apache.bookkeeper.tls.TLSContextFactory and tlsTrustStore "
            "(plus tlsCertificatePath and tlsKeyStore if the bookie wants client certificates)"
        )
        log.warning("%s", err)
        self._conn.fail_security(err)

    def _tls_answer(self, messages: list[Any]) -> None:
        """Frames before the connection is up: only the answer to our START_TLS may come."""
        conn = self._conn
        answer = self.tls_answer
        if answer is None or answer.done() or len(messages) != 1 or conn.frames_buffered():
            conn.bad_answer(f"{len(messages)} unexpected frame(s) during START_TLS")
            return
        msg = messages[0]
        if type(msg) is m.StartTlsResponse:
            status = msg.status
        elif type(msg) is m.ErrorResponse and msg.opcode == m.OP_START_TLS:
            status = msg.status if msg.status != EOK else m.EBADREQ  # a bookie that does not know START_TLS
        else:
            conn.bad_answer(f"a {type(msg).__name__} instead of the answer to START_TLS")
            return
        if status == EOK and conn.transport is not None and not self.tls_confirming:
            conn.transport.pause_reading()  # the next bytes are TLS: start_tls reads them
        answer.set_result(status)

    # ------------------------------------------------------------------------------ end
    def lost(self, exc: Exception | None) -> SecurityError | None:
        """Why a connection lost before it was up failed, if that was the negotiation's doing."""
        if self.tls_confirming:
            # TLS 1.3: our side of the handshake completed, then the bookie checked our
            # certificate and closed (asyncio sends no alert): it refused this client.
            alert = f" ({_ssl_text(exc)})" if isinstance(exc, ssl.SSLError) else ""
            return SecurityError(
                f"bookie {self._conn.bookie_id} refused this client's certificate{alert}: it closed the connection "
                "right after the TLS handshake (mutual TLS: no certificate configured, not issued by a CA in "
                "the bookie's tlsTrustStore, or expired); the bookie's log says which"
            )
        if isinstance(exc, ssl.SSLError):
            # The handshake failed (uvloop reports it here before start_tls raises).
            return SecurityError(f"TLS handshake with bookie {self._conn.bookie_id} failed: {_ssl_reason(exc)}")
        return None

    def fail(self, exc: VellumError) -> None:
        """The connection is shutting down: wake ``run``, which sees the connection closed."""
        for answer in (self.tls_answer, self.auth_answer):
            if answer is not None and not answer.done():
                answer.set_exception(exc)


def _ssl_text(exc: ssl.SSLError) -> str:
    reason = str(getattr(exc, "verify_message", None) or exc.reason or exc)
    if reason.isupper():  # OpenSSL's code, e.g. TLSV13_ALERT_CERTIFICATE_REQUIRED
        reason = reason.replace("_", " ").lower()
    return reason


def _ssl_reason(exc: ssl.SSLError) -> str:
    reason = _ssl_text(exc)
    return f"the bookie refused this client ({reason})" if "alert" in reason else reason
