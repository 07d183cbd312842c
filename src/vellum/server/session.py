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

Each request the session answers itself is decided in three moves, each once: its ``Facts``
are asked (of the messages: its name and its own refusal; of the authenticator, at most one
``admit``); the decision function for its type in the phase the connection is in
(``_PHASES``, the one table of phases and request types) turns them into a ``Step`` without
asking anything more (pure); the step is taken (the phase after it, the identity proved, the
count). Operations of a trusted connection are dispatched without a question.

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

Requests are counted (``requests``, by opcode name; a bad frame as ``BAD_FRAME`` in every
phase) for the operations the session answers itself, but for a request refused before TLS
(counted as a refusal only); operations it dispatches are counted by their processors.
"""

from __future__ import annotations

import collections
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

from vellum.errors import EBADREQ, EOK, EUA
from vellum.proto import messages as m
from vellum.security.auth import Admission, BookieAuthenticator, Identity
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


@dataclass(frozen=True, slots=True)
class Facts:
    """What the session needs to know of one request it decides, asked once of the messages
    and of the authenticator: ``request`` (a batch's first add: a batch is refused as its first
    request), its ``name`` (the count it goes under), ``answer`` (its own answer refusing it
    EUA; None for a note) and ``admission`` (for AUTH, what it proves; for another request
    before the connection is trusted, why it is not served; None where there is nothing to
    ask: authentication off, TLS not yet up, START_TLS, a bad frame of a trusted connection)."""

    request: Any
    name: str
    answer: Any
    admission: Admission | None


@dataclass(frozen=True, slots=True)
class Step:
    """What one request decides: the ``decisions`` out, the ``phase`` after it, the
    ``identity`` it proved (None: unchanged), and whether it is ``counted`` under its name."""

    decisions: list[Decision]
    phase: Phase
    identity: Identity | None = None
    counted: bool = True


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
        if self._serving:
            for msg in messages:
                if type(msg) in _SESSION_REQUESTS:
                    break  # one the session answers: decided below, with the operations around it
            else:
                return [Dispatch(messages)]
        elif self._phase is Phase.UPGRADING:
            # Decrypted requests that arrived as the handshake completed, before the transport
            # reported it: decided once it has. (Reading in clear stopped at START_TLS.)
            self._early += messages
            return []
        return self._decide(messages, buffered)

    def tls_established(self, principal: str | None, roles: tuple[str, ...]) -> list[Decision]:
        """The TLS handshake completed; ``principal`` and ``roles`` from the peer's certificate
        (None and () without one)."""
        if self._phase is not Phase.UPGRADING:
            return []
        self.principal, self.roles = principal, roles
        out: list[Decision] = []
        if self._auth is None:
            self._enter(Phase.SERVING)
            out.append(_TRUSTED)
        else:
            certificate = self._auth.from_certificate(principal, roles)
            admission = self._auth.admit(certificate)
            self.cert_identity = certificate
            # Not admitted: a token may follow (AUTH); refused at the first other request.
            step = _trust(admission, Phase.AWAITING_AUTH, [])
            self._apply(step)
            out += step.decisions
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

    # ------------------------------------------------------------------------ one request
    def _decide(self, messages: list[Any], buffered: bool) -> list[Decision]:
        """Each request the session answers: its facts asked once, the phase's decision
        (``_PHASES``), the step taken; operations of a trusted connection go out in ``Dispatch``
        decisions between them, in arrival order."""
        out: list[Decision] = []
        ops: list[Any] = []
        last = len(messages) - 1
        for i, msg in enumerate(messages):
            if self._serving and type(msg) not in _SESSION_REQUESTS:
                ops.append(msg)
                continue
            if ops:
                out.append(Dispatch(ops))
                ops = []
            phase = self._phase
            rules = _PHASES.get(phase)
            if rules is None:  # closed (or upgrading: nothing follows START_TLS): nothing more is decided
                return out
            facts = self._ask(msg)
            decide = rules.get(type(facts.request)) or rules[None]
            step = decide(self, facts, phase, i < last or buffered)
            if step.counted:
                self._requests[facts.name] += 1
            self._apply(step)
            out += step.decisions
        if ops:
            out.append(Dispatch(ops))
        return out

    def _ask(self, msg: Any) -> Facts:
        """The request's facts: one question to the messages (its refusal; a batch stands for
        its first add) and at most one to the authenticator (see ``Facts``)."""
        kind = type(msg)
        if kind is m.AddBatch:
            msg = msg.requests()[0]
            kind = m.AddRequest
        auth = self._auth
        admission = None
        if auth is not None and self._phase is not Phase.AWAITING_TLS:
            if kind is m.AuthRequest:
                admission = auth.admit(self.cert_identity, msg.auth_plugin_name, bytes(msg.payload))
            elif kind is not m.StartTlsRequest and not self._serving:
                admission = auth.admit(self.cert_identity)
        name = "BAD_FRAME" if kind is m.BadFrame else m.OPCODE_NAMES[kind.OPCODE]
        return Facts(msg, name, m.refusal_for(msg, EUA), admission)

    def _apply(self, step: Step) -> None:
        """Take ``step``: the identity it proved, the phase after it."""
        if step.identity is not None:
            self.identity = step.identity
        self._enter(step.phase)


# ------------------------------------------------------------------- decisions, per phase
# Pure: each takes the session (for its peer, and whether TLS is on), the request's facts, the
# phase it arrived in and whether more follows it in this read (``more``), and returns the step;
# nothing is asked here (the facts hold the answers).
def _upgrade(s: Session, f: Facts, phase: Phase, more: bool) -> Step:
    """START_TLS before TLS: the upgrade starts, unless bytes follow it in clear (they must
    never be taken as TLS traffic)."""
    if more:
        return Step([Close(g.PLAINTEXT, f"closing connection {s.peer}: data after START_TLS before its answer")],
                    Phase.CLOSED)
    return Step([UpgradeTls(f.request)], Phase.UPGRADING)


def _plaintext(s: Session, f: Facts, phase: Phase, more: bool) -> Step:
    """Anything else before TLS: the notice, the request's own refusal, and the close."""
    return Step([Reply(m.ErrorResponse(EUA, opcode=m.OP_START_TLS)), *_answer(f), Close(g.PLAINTEXT, (
        f"plaintext request refused: this bookie requires TLS (peer {s.peer} sent "
        f"{type(f.request).__name__} without START_TLS), closing the connection"))], Phase.CLOSED, counted=False)


def _start_tls(s: Session, f: Facts, phase: Phase, more: bool) -> Step:
    """START_TLS once TLS is up, or not required: inside TLS, the client's confirmation that we
    accepted its handshake; without TLS configured, BookKeeper's answer (EBADREQ)."""
    if s._tls:
        return Step([Reply(m.StartTlsResponse(f.request.request_id, EOK))], phase)
    return Step([Refuse(g.START_TLS_UNAVAILABLE, f"START_TLS from {s.peer} refused: TLS is not configured on this bookie"),
                 Reply(m.StartTlsResponse(f.request.request_id, EBADREQ))], phase)


def _auth(s: Session, f: Facts, phase: Phase, more: bool) -> Step:
    """AUTH once TLS is up, or not required: authenticated (and trusted, if not yet), refused
    (and closed), or answered EOK with authentication off."""
    request_id = f.request.request_id
    if f.admission is None:
        return Step([Reply(m.AuthResponse(request_id, EOK, "authentication is off on this bookie"))], phase)
    identity = f.admission.identity
    if identity is None:
        return _refuse_auth(s, request_id, f"authentication refused: {f.admission.refusal}", "AUTH")
    return _trust(f.admission, phase, [Reply(m.AuthResponse(request_id, EOK,
                                                            clip(f"authenticated as {identity.principal!r}")))])


def _unauthenticated(s: Session, f: Facts, phase: Phase, more: bool) -> Step:
    """Any other request before authentication: the notice with the reason, the request's own
    refusal, and the close."""
    assert f.admission is not None
    return _refuse_auth(s, m.AUTH_NOTICE_ID, f"request refused: {f.admission.refusal or 'not authenticated'}",
                        type(f.request).__name__, f.answer)


def _bad_frame(s: Session, f: Facts, phase: Phase, more: bool) -> Step:
    """A bad frame of a trusted connection: its error answer; the connection serves on."""
    reason = f.request.reason
    return Step([Refuse(g.BAD_FRAME, f"bad frame from {s.peer}: {reason}", reason), *_answer(f)], phase)


Decide: TypeAlias = Callable[[Session, Facts, Phase, bool], Step]
#: How each request the session answers is decided, by phase and request type (None: any other
#: type; in SERVING only bad frames reach it, operations being dispatched). UPGRADING holds
#: requests until the handshake is over and CLOSED decides none, so neither is here.
_PHASES: dict[Phase, dict[type | None, Decide]] = {
    Phase.AWAITING_TLS: {m.StartTlsRequest: _upgrade, None: _plaintext},
    Phase.AWAITING_AUTH: {m.StartTlsRequest: _start_tls, m.AuthRequest: _auth, None: _unauthenticated},
    Phase.SERVING: {m.StartTlsRequest: _start_tls, m.AuthRequest: _auth, None: _bad_frame},
}


def _trust(admission: Admission, phase: Phase, then: list[Decision]) -> Step:
    """An ``admission`` in ``phase``: authenticated (``Trusted`` once, when the connection
    was not serving), then ``then``; not admitted, no change."""
    identity = admission.identity
    if identity is None:
        return Step(then, phase)
    if phase is Phase.SERVING:  # authenticated again (a new token): no change of phase
        return Step([Authenticated(identity), *then], phase, identity)
    return Step([Authenticated(identity), _TRUSTED, *then], Phase.SERVING, identity)


def _refuse_auth(s: Session, request_id: int, reason: str, what: str, answer: Any = None) -> Step:
    """Answer EUA with ``reason`` (and ``answer``, the refused request's own EUA), then close."""
    out: list[Decision] = [Reply(m.AuthResponse(request_id, EUA, clip(reason)))]
    if answer is not None:
        out.append(Reply(answer))
    out.append(Close(g.AUTH_REFUSED if what == "AUTH" else g.REQUEST_BEFORE_AUTH,
                     f"{what} from {s.peer} refused, closing the connection: {reason}", reason))
    return Step(out, Phase.CLOSED)


def _answer(f: Facts) -> list[Decision]:
    """The request's own refusal, as a reply (none for a note)."""
    return [] if f.answer is None else [Reply(f.answer)]


def clip(text: str) -> str:
    """``text`` cut to what an AUTH response may carry (UTF-8 bytes, whole characters)."""
    return text.encode()[:m.MAX_AUTH_MESSAGE].decode(errors="ignore")
