"""One connection's session, sans-IO: decoded requests in, decisions out.

A ``Session`` decides what becomes of the requests a connection decodes, from where the
connection stands: upgraded to TLS or not, authenticated or not. It never touches a socket, a
loop or a clock; the transport (``server/bookie_server.py``) feeds it events and carries out
the decisions it returns, in order. The model is h11: events in, events out, so the whole
protocol of upgrading and authenticating a connection is unit-testable without a network.

Phases::

    AWAITING_TLS --START_TLS--> UPGRADING --tls_established--> AWAITING_AUTH --AUTH ok--> SERVING
         |                          |                              |   (certificate identity  ^
         |                          |                              +---- authorized) --------+
         +-- (no TLS required) -----+-- (no authentication) ---------------------------------+
    any phase --refusal, framing error, failed handshake, close()--> CLOSED

Invariants:
- with TLS required, nothing but START_TLS is served before the upgrade: any other request is
  answered with the notice ``ErrorResponse(EUA, opcode=START_TLS)`` and its own EUA answer, and
  the connection is closed; bytes after START_TLS and before its answer close the connection
  (they would be taken as TLS records);
- with authentication on, nothing but START_TLS and AUTH is served before an authorized
  identity is proved (a mutual-TLS certificate or an AUTH token): any other request gets the
  notice ``AuthResponse(AUTH_NOTICE_ID, EUA, reason)``, its own EUA answer, and the close; a
  refused AUTH is answered EUA with the reason, then the close;
- requests that arrive during the TLS handshake are held and decided once it is over;
- ``Trusted`` is decided exactly once, when the connection reaches SERVING after starting
  unauthenticated (the transport then raises the frame size and leaves the guard's budget);
- in SERVING, operations go out in ``Dispatch`` decisions in arrival order; START_TLS, AUTH and
  bad frames are answered here, between them, so replies keep the order of requests;
- after CLOSED, nothing more is decided.

Requests are counted (``requests``, by opcode name) for the operations the session answers
itself; operations it dispatches are counted by their processors.
"""

from __future__ import annotations

import collections
import enum
from dataclasses import dataclass
from typing import Any, TypeAlias

from vellum.errors import EBADREQ, EOK, EUA, SecurityError
from vellum.proto import messages as m
from vellum.security.auth import BookieAuthenticator, Identity
from vellum.server import guard as g


class Phase(enum.Enum):
    AWAITING_TLS = "awaiting TLS"
    UPGRADING = "upgrading to TLS"
    AWAITING_AUTH = "awaiting authentication"
    SERVING = "serving"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class Reply:
    """Send ``message``."""

    message: Any


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Hand ``requests`` (operations of a trusted connection, in arrival order) to the processors."""

    requests: list[Any]


@dataclass(frozen=True, slots=True)
class UpgradeTls:
    """Answer ``request`` EOK in clear, read nothing more in clear, and start the TLS handshake;
    then report ``tls_established`` or ``tls_failed``."""

    request: m.StartTlsRequest


@dataclass(frozen=True, slots=True)
class Refuse:
    """Count a refusal under ``reason`` and log ``message`` (rate-limited per ``detail``); the
    connection serves on."""

    reason: str
    message: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Close:
    """Count and log as ``Refuse``, then close the connection once what is queued is written."""

    reason: str
    message: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Authenticated:
    """The connection proved ``identity`` (to be logged)."""

    identity: Identity


@dataclass(frozen=True, slots=True)
class Trusted:
    """The connection is upgraded and authenticated as required: full frame size from now on."""


Decision: TypeAlias = Reply | Dispatch | UpgradeTls | Refuse | Close | Authenticated | Trusted
#: requests the session answers itself in every phase
_SESSION_REQUESTS = (m.StartTlsRequest, m.AuthRequest, m.BadFrame)
_TRUSTED = Trusted()


class Session:
    """The decisions for one connection (see the module docstring)."""

    __slots__ = ("_auth", "_early", "_phase", "_requests", "_serving", "_tls", "cert_identity", "identity", "peer",
                 "principal", "roles")

    def __init__(self, *, peer: str, tls: bool, auth: BookieAuthenticator | None,
                 requests: collections.Counter[str] | None = None) -> None:
        """``peer`` names the connection in log messages; ``tls``: TLS is required (START_TLS
        first); ``auth``: authentication is on; ``requests``: where answered requests are
        counted by opcode name."""
        self.peer = peer
        self._tls = tls
        self._auth = auth
        self._requests: collections.Counter[str] = requests if requests is not None else collections.Counter()
        self._phase = Phase.AWAITING_TLS if tls else Phase.AWAITING_AUTH if auth is not None else Phase.SERVING
        self._serving = self._phase is Phase.SERVING  # the hot path's one test, kept with _phase
        self._early: list[Any] = []
        #: from the peer's certificate after a mutual-TLS handshake (for authorization)
        self.principal: str | None = None
        self.roles: tuple[str, ...] = ()
        self.cert_identity: Identity | None = None
        #: who the connection is authenticated as (None without authentication)
        self.identity: Identity | None = None

    def _enter(self, phase: Phase) -> None:
        self._phase = phase
        self._serving = phase is Phase.SERVING

    @property
    def phase(self) -> Phase:
        return self._phase

    @property
    def serving(self) -> bool:
        return self._phase is Phase.SERVING

    @property
    def closed(self) -> bool:
        return self._phase is Phase.CLOSED

    @property
    def trusted(self) -> bool:
        """Upgraded and authenticated as required (from the start, with neither configured)."""
        return self._phase is Phase.SERVING

    # ------------------------------------------------------------------------------ events
    def dispatchable(self, messages: list[Any]) -> bool:
        """Would ``receive(messages)`` decide just ``Dispatch(messages)``? (Serving, and none of
        them is a request the session answers: the transport's fast path, deciding nothing else.)"""
        if not self._serving:
            return False
        for msg in messages:  # noqa: SIM110 (a loop: all() of a generator costs more, per read)
            if type(msg) in _SESSION_REQUESTS:
                return False
        return True

    def receive(self, messages: list[Any], *, buffered: bool = False) -> list[Decision]:
        """Decoded requests arrived (``buffered``: bytes of a further, incomplete frame
        follow them). Returns what to do, in order."""
        phase = self._phase
        if phase is Phase.SERVING:
            for msg in messages:
                if type(msg) in _SESSION_REQUESTS:
                    return self._serve(messages)
            return [Dispatch(messages)]
        if phase is Phase.CLOSED:
            return []
        messages = unbatched(messages)  # the slow paths see single requests
        if phase is Phase.UPGRADING:
            # Decrypted requests that arrived as the handshake completed, before the transport
            # reported it: decided once it has. (Reading in clear stopped at START_TLS.)
            self._early += messages
            return []
        if phase is Phase.AWAITING_TLS:
            return self._before_tls(messages, buffered)
        return self._before_auth(messages)

    def tls_established(self, principal: str | None, roles: tuple[str, ...]) -> list[Decision]:
        """The TLS handshake completed; ``principal`` and ``roles`` from the peer's certificate
        (None and () without one)."""
        if self._phase is not Phase.UPGRADING:
            return []
        self.principal, self.roles = principal, roles
        out: list[Decision] = []
        self._enter(Phase.AWAITING_AUTH)
        if self._auth is None:
            self._enter(Phase.SERVING)
            out.append(_TRUSTED)
        else:
            self.cert_identity = self._auth.from_certificate(principal, roles)
            if self.cert_identity is not None:
                try:
                    self._auth.authorize(self.cert_identity)
                except SecurityError:
                    pass  # not yet: a token may follow (AUTH); refused at the first other request
                else:
                    out += self._authenticated(self.cert_identity)
        early, self._early = self._early, []
        if early:
            out += self.receive(early)
        return out

    def tls_failed(self, reason: str) -> list[Decision]:
        """The TLS handshake failed (or the peer left during it) for ``reason``."""
        if self._phase is Phase.CLOSED:
            return []
        self._enter(Phase.CLOSED)
        return [Close(g.TLS_HANDSHAKE, f"TLS handshake with {self.peer} failed: {reason}", reason.split(" (")[0])]

    def framing_failed(self, error: str, max_frame_size: int) -> list[Decision]:
        """The byte stream broke its framing (``error``): the connection cannot go on."""
        if self._phase is Phase.CLOSED:
            return []
        trusted = self.trusted
        self._enter(Phase.CLOSED)
        if trusted:
            return [Close(g.BAD_FRAMING, f"closing connection {self.peer}: {error}")]
        return [Close(g.FRAME_TOO_BIG, (
            f"closing unauthenticated connection {self.peer}: {error}; before authenticating a peer may "
            f"send frames of {max_frame_size} bytes at most (unauthenticatedMaxFrameSizeBytes)"))]

    def close(self) -> None:
        """The transport closes the connection (a deadline, the budget, the server stopping)."""
        self._enter(Phase.CLOSED)
        self._early = []

    # ----------------------------------------------------------------------------- phases
    def _before_tls(self, messages: list[Any], buffered: bool) -> list[Decision]:
        """START_TLS starts the upgrade; anything else is refused and closes the connection."""
        msg = messages[0]
        if type(msg) is m.StartTlsRequest:
            self._requests["START_TLS"] += 1
            if len(messages) > 1 or buffered:
                # Bytes sent in clear after START_TLS must never be taken as TLS traffic.
                self._enter(Phase.CLOSED)
                return [Close(g.PLAINTEXT, f"closing connection {self.peer}: data after START_TLS before its answer")]
            self._enter(Phase.UPGRADING)
            return [UpgradeTls(msg)]
        self._enter(Phase.CLOSED)
        out: list[Decision] = [Reply(m.ErrorResponse(EUA, opcode=m.OP_START_TLS))]
        answer = m.refusal_for(msg, EUA)
        if answer is not None:
            out.append(Reply(answer))
        out.append(Close(g.PLAINTEXT, (
            f"plaintext request refused: this bookie requires TLS (peer {self.peer} sent "
            f"{type(msg).__name__} without START_TLS), closing the connection")))
        return out

    def _before_auth(self, messages: list[Any]) -> list[Decision]:
        """START_TLS and AUTH are answered; anything else is refused and closes the connection."""
        assert self._auth is not None
        out: list[Decision] = []
        for i, msg in enumerate(messages):
            kind = type(msg)
            if kind is m.StartTlsRequest:
                out += self._start_tls(msg)
            elif kind is m.AuthRequest:
                out += self._on_auth(msg)
                if self._phase is Phase.SERVING:
                    rest = messages[i + 1:]
                    if rest:
                        out += self.receive(rest)
                return out
            else:
                try:
                    self._auth.authorize(self.identity or self.cert_identity)
                    reason = "not authenticated"
                except SecurityError as e:
                    reason = str(e)
                self._requests[m.OPCODE_NAMES.get(getattr(kind, "OPCODE", -1), kind.__name__)] += 1
                answer = m.refusal_for(msg, EUA)
                return out + self._refuse_auth(m.AUTH_NOTICE_ID, f"request refused: {reason}", kind.__name__,
                                               answer)
        return out

    def _serve(self, messages: list[Any]) -> list[Decision]:
        """SERVING, with requests the session answers among the operations."""
        out: list[Decision] = []
        ops: list[Any] = []
        for msg in messages:
            kind = type(msg)
            if kind not in _SESSION_REQUESTS:
                ops.append(msg)
                continue
            if ops:
                out.append(Dispatch(ops))
                ops = []
            if kind is m.StartTlsRequest:
                out += self._start_tls(msg)
            elif kind is m.AuthRequest:
                out += self._on_auth(msg)
                if self._phase is Phase.CLOSED:
                    return out
            else:
                out += self._bad_frame(msg)
        if ops:
            out.append(Dispatch(ops))
        return out

    # --------------------------------------------------------------------------- requests
    def _start_tls(self, req: m.StartTlsRequest) -> list[Decision]:
        self._requests["START_TLS"] += 1
        if self._tls:
            # Inside TLS already: the client's confirmation that we accepted its handshake.
            return [Reply(m.StartTlsResponse(req.request_id, EOK))]
        return [Refuse(g.START_TLS_UNAVAILABLE,
                       f"START_TLS from {self.peer} refused: TLS is not configured on this bookie"),
                Reply(m.StartTlsResponse(req.request_id, EBADREQ))]

    def _on_auth(self, req: m.AuthRequest) -> list[Decision]:
        self._requests["AUTH"] += 1
        if self._auth is None:
            return [Reply(m.AuthResponse(req.request_id, EOK, "authentication is off on this bookie"))]
        try:
            identity = self._auth.from_auth(req.auth_plugin_name, bytes(req.payload), self.cert_identity)
            self._auth.authorize(identity)
        except SecurityError as e:
            return self._refuse_auth(req.request_id, f"authentication refused: {e}", "AUTH")
        return [*self._authenticated(identity),
                Reply(m.AuthResponse(req.request_id, EOK, clip(f"authenticated as {identity.principal!r}")))]

    def _authenticated(self, identity: Identity) -> list[Decision]:
        self.identity = identity
        if self._phase is Phase.SERVING:  # authenticated again (a new token): no change of phase
            return [Authenticated(identity)]
        self._enter(Phase.SERVING)
        return [Authenticated(identity), _TRUSTED]

    def _refuse_auth(self, request_id: int, reason: str, what: str, answer: Any = None) -> list[Decision]:
        """Answer EUA with ``reason`` (and ``answer``, the refused request's own EUA), then close."""
        self._enter(Phase.CLOSED)
        out: list[Decision] = [Reply(m.AuthResponse(request_id, EUA, clip(reason)))]
        if answer is not None:
            out.append(Reply(answer))
        out.append(Close(g.AUTH_REFUSED if what == "AUTH" else g.REQUEST_BEFORE_AUTH,
                         f"{what} from {self.peer} refused, closing the connection: {reason}", reason))
        return out

    def _bad_frame(self, bad: m.BadFrame) -> list[Decision]:
        self._requests["BAD_FRAME"] += 1
        out: list[Decision] = [Refuse(g.BAD_FRAME, f"bad frame from {self.peer}: {bad.reason}", bad.reason)]
        answer = bad.error_response()
        if answer is not None:
            out.append(Reply(answer))
        return out


def unbatched(messages: list[Any]) -> list[Any]:
    """``messages`` with every ``AddBatch`` replaced by its single ``AddRequest``s."""
    if not any(type(msg) is m.AddBatch for msg in messages):
        return messages
    out: list[Any] = []
    for msg in messages:
        if type(msg) is m.AddBatch:
            out += msg.requests()
        else:
            out.append(msg)
    return out


def clip(text: str) -> str:
    """``text`` cut to what an AUTH response may carry (UTF-8 bytes, whole characters)."""
    return text.encode()[:m.MAX_AUTH_MESSAGE].decode(errors="ignore")
