"""The session of a connection, as a specification: decoded requests in, decisions out.

``Session`` (server/session.py) is sans-IO: no socket, no loop, no clock. Each test feeds it
what a connection would decode (or the transport's reports: the TLS handshake's outcome, a
framing error) and states the decisions it must return, in order. A hypothesis state machine
then checks the invariants over any sequence of events."""

from __future__ import annotations

import collections
import functools
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from vellum.errors import EBADREQ, EBADVERSION, EOK, EUA
from vellum.proto import codec
from vellum.proto import messages as m
from vellum.security.auth import BookieAuthenticator, Identity
from vellum.security.tokens import TokenSigner, TokenVerifier, write_secret_file
from vellum.server import guard as g
from vellum.server.session import (
    Authenticated,
    Close,
    Dispatch,
    Phase,
    Refuse,
    Reply,
    Session,
    Trusted,
    UpgradeTls,
)

KEY = bytes(20)
PEER = "('10.0.0.7', 4242)"


def _entry(ledger_id: int, entry_id: int) -> bytes:
    return ledger_id.to_bytes(8, "big") + entry_id.to_bytes(8, "big") + bytes(24)


ADD = m.AddRequest(KEY, _entry(7, 0))
READ = m.ReadRequest(7, 0)
LIST = m.ListEntriesRequest(5, 7)
START_TLS = m.StartTlsRequest(1)


def _batch(n: int) -> m.AddBatch:
    """What a server-side decoder makes of ``n`` pipelined ADDs that arrived in one read."""
    frames = b"".join(codec.encode(m.AddRequest(KEY, _entry(7, i))) for i in range(n))
    (batch,) = codec.FrameDecoder(1 << 20, side="server", batch_adds=True).feed(frames)
    assert type(batch) is m.AddBatch
    return batch


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> tuple[TokenSigner, TokenVerifier]:
    secret: Path = write_secret_file(tmp_path_factory.mktemp("session") / "secret")
    return TokenSigner.from_secret_file(secret), TokenVerifier.from_secret_file(secret)


def _auth(tokens: tuple[TokenSigner, TokenVerifier], roles: tuple[str, ...] = ()) -> BookieAuthenticator:
    return BookieAuthenticator(["tls", "token"], authorized_roles=roles, token_verifier=tokens[1])


def _token(tokens: tuple[TokenSigner, TokenVerifier], subject: str = "app", roles: tuple[str, ...] = ("client",)
           ) -> m.AuthRequest:
    return m.AuthRequest(2, "token", tokens[0].issue(subject, roles).encode())


def _replies(decisions: list[Any]) -> list[Any]:
    return [d.message for d in decisions if type(d) is Reply]


# ------------------------------------------------------------- neither TLS nor authentication
def test_without_tls_or_authentication_a_session_serves_from_the_start() -> None:
    s = Session(peer=PEER, tls=False, auth=None)
    assert s.phase is Phase.SERVING and s.trusted
    batch = _batch(3)
    assert s.receive([batch, READ]) == [Dispatch([batch, READ])]


def test_the_fast_path_applies_only_to_operations_of_a_serving_session() -> None:
    serving = Session(peer=PEER, tls=False, auth=None)
    assert serving.dispatchable([_batch(2), READ, LIST])
    assert not serving.dispatchable([READ, START_TLS])  # START_TLS is the session's to answer
    assert not Session(peer=PEER, tls=True, auth=None).dispatchable([READ])


def test_operations_are_dispatched_in_arrival_order_with_the_session_answers_between_them() -> None:
    s = Session(peer=PEER, tls=False, auth=None)
    bad = m.BadFrame("unknown opcode 99", opcode=99, version=m.PROTOCOL_VERSION)
    auth = m.AuthRequest(3, "token", b"x")
    assert s.receive([ADD, START_TLS, READ, auth, bad, LIST]) == [
        Dispatch([ADD]),
        Refuse(g.START_TLS_UNAVAILABLE, f"START_TLS from {PEER} refused: TLS is not configured on this bookie"),
        Reply(m.StartTlsResponse(1, EBADREQ)),  # BookKeeper's answer when TLS is not configured
        Dispatch([READ]),
        Reply(m.AuthResponse(3, EOK, "authentication is off on this bookie")),
        Refuse(g.BAD_FRAME, f"bad frame from {PEER}: unknown opcode 99", "unknown opcode 99"),
        Reply(bad.error_response()),
        Dispatch([LIST]),
    ]
    assert s.serving


def test_a_bad_frame_with_a_different_version_is_answered_with_its_status_and_the_session_serves_on() -> None:
    s = Session(peer=PEER, tls=False, auth=None)
    bad = m.BadFrame("protocol version 9", status=EBADVERSION, version=9, opcode=1)
    (_refuse, reply) = s.receive([bad])
    assert reply == Reply(m.ErrorResponse(EBADVERSION, None, 1, None, None))
    assert s.receive([READ]) == [Dispatch([READ])]


def test_a_framing_error_of_a_trusted_connection_closes_it_as_bad_framing() -> None:
    s = Session(peer=PEER, tls=False, auth=None)
    assert s.framing_failed("frame length -1", 1024) == [
        Close(g.BAD_FRAMING, f"closing connection {PEER}: frame length -1")]
    assert s.closed and s.receive([READ]) == []


# ------------------------------------------------------------------------------- TLS required
def test_with_tls_required_start_tls_is_the_first_thing_served() -> None:
    s = Session(peer=PEER, tls=True, auth=None)
    assert s.phase is Phase.AWAITING_TLS and not s.trusted
    assert s.receive([START_TLS]) == [UpgradeTls(START_TLS)]
    assert s.phase is Phase.UPGRADING


def test_a_plaintext_request_before_start_tls_is_refused_with_the_notice_its_own_answer_and_the_close() -> None:
    s = Session(peer=PEER, tls=True, auth=None)
    decisions = s.receive([_batch(2)])  # a batch is refused as single requests: the first one
    assert decisions == [
        Reply(m.ErrorResponse(EUA, opcode=m.OP_START_TLS)),
        Reply(m.AddResponse(EUA, 7, 0)),
        Close(g.PLAINTEXT, f"plaintext request refused: this bookie requires TLS (peer {PEER} sent AddRequest "
                           "without START_TLS), closing the connection"),
    ]
    assert s.closed and s.receive([START_TLS]) == []


def test_a_note_before_start_tls_gets_the_notice_but_no_answer_of_its_own() -> None:
    s = Session(peer=PEER, tls=True, auth=None)
    decisions = s.receive([m.LedgerClosedNote(4, 7)])
    assert _replies(decisions) == [m.ErrorResponse(EUA, opcode=m.OP_START_TLS)]
    assert type(decisions[-1]) is Close


@pytest.mark.parametrize("more", ["another request", "bytes of a further frame"])
def test_data_after_start_tls_before_its_answer_closes_the_connection(more: str) -> None:
    s = Session(peer=PEER, tls=True, auth=None)
    decisions = (s.receive([START_TLS, READ]) if more == "another request"
                 else s.receive([START_TLS], buffered=True))
    assert decisions == [Close(g.PLAINTEXT, f"closing connection {PEER}: data after START_TLS before its answer")]
    assert s.closed


def test_requests_during_the_handshake_are_held_and_decided_once_it_completes() -> None:
    s = Session(peer=PEER, tls=True, auth=None)
    s.receive([START_TLS])
    assert s.receive([READ]) == [] and s.receive([LIST]) == []
    assert s.tls_established("alice", ("client",)) == [Trusted(), Dispatch([READ, LIST])]
    assert (s.principal, s.roles) == ("alice", ("client",))
    assert s.serving


def test_start_tls_inside_tls_is_answered_eok() -> None:
    s = Session(peer=PEER, tls=True, auth=None)
    s.receive([START_TLS])
    s.tls_established(None, ())
    assert s.receive([m.StartTlsRequest(9)]) == [Reply(m.StartTlsResponse(9, EOK))]


def test_a_failed_handshake_closes_the_connection_with_its_reason() -> None:
    s = Session(peer=PEER, tls=True, auth=None)
    s.receive([START_TLS])
    assert s.tls_failed("certificate verify failed") == [
        Close(g.TLS_HANDSHAKE, f"TLS handshake with {PEER} failed: certificate verify failed",
              "certificate verify failed")]
    assert s.closed and s.tls_established("alice", ()) == []


def test_an_unauthenticated_framing_error_names_the_unauthenticated_frame_limit() -> None:
    s = Session(peer=PEER, tls=True, auth=None)
    (close,) = s.framing_failed("frame length 99999 outside 0..16384", 16384)
    assert type(close) is Close and close.reason == g.FRAME_TOO_BIG
    assert "16384 bytes at most (unauthenticatedMaxFrameSizeBytes)" in close.message


# ---------------------------------------------------------------------------- authentication
def test_with_authentication_on_a_request_before_auth_is_refused_with_the_notice_and_the_close(
        tokens: tuple[TokenSigner, TokenVerifier]) -> None:
    requests: collections.Counter[str] = collections.Counter()
    s = Session(peer=PEER, tls=False, auth=_auth(tokens), requests=requests)
    assert s.phase is Phase.AWAITING_AUTH
    decisions = s.receive([LIST, READ])
    reason = ("not authenticated: this bookie requires a client certificate from the cluster's CA (mutual TLS) "
              "or a token (clientAuthProviderFactoryClass=token)")
    assert decisions == [
        Reply(m.AuthResponse(m.AUTH_NOTICE_ID, EUA, f"request refused: {reason}")),
        Reply(m.ErrorResponse(EUA, 5, m.OP_LIST_ENTRIES, 7)),
        Close(g.REQUEST_BEFORE_AUTH,
              f"ListEntriesRequest from {PEER} refused, closing the connection: request refused: {reason}",
              f"request refused: {reason}"),
    ]
    assert s.closed and requests["LIST_ENTRIES"] == 1


def test_a_batch_or_a_bad_frame_before_auth_is_refused_as_one_request_and_counted_under_its_name(
        tokens: tuple[TokenSigner, TokenVerifier]) -> None:
    requests: collections.Counter[str] = collections.Counter()
    s = Session(peer=PEER, tls=False, auth=_auth(tokens), requests=requests)
    (notice, answer, close) = s.receive([_batch(3)])  # its first add: the connection closes after it
    assert answer == Reply(m.AddResponse(EUA, 7, 0))
    assert type(notice) is Reply and notice.message.request_id == m.AUTH_NOTICE_ID
    assert type(close) is Close and close.message.startswith(f"AddRequest from {PEER} refused")
    bad = m.BadFrame("unknown opcode 99", opcode=99, version=m.PROTOCOL_VERSION)
    s = Session(peer=PEER, tls=False, auth=_auth(tokens), requests=requests)
    (_notice, answer, close) = s.receive([bad])
    assert answer == Reply(bad.error_response()) and type(close) is Close
    # A bad frame counts as BAD_FRAME in every phase (it once counted as "BadFrame" here).
    assert requests == collections.Counter({"ADD": 1, "BAD_FRAME": 1})


def test_a_valid_token_authenticates_and_the_requests_after_it_are_served(
        tokens: tuple[TokenSigner, TokenVerifier]) -> None:
    s = Session(peer=PEER, tls=False, auth=_auth(tokens, roles=("client",)))
    auth = _token(tokens)
    identity = Identity("app", ("client",), "token")
    assert s.receive([auth, READ, LIST]) == [
        Authenticated(identity),
        Trusted(),
        Reply(m.AuthResponse(2, EOK, "authenticated as 'app'")),
        Dispatch([READ, LIST]),
    ]
    assert s.identity == identity and s.serving


def test_a_refused_token_is_answered_eua_with_the_reason_and_closes(tokens: tuple[TokenSigner, TokenVerifier]) -> None:
    s = Session(peer=PEER, tls=False, auth=_auth(tokens, roles=("admin",)))
    decisions = s.receive([_token(tokens, roles=("client",)), READ])
    (reply, close) = decisions
    assert type(reply) is Reply and reply.message.status == EUA and reply.message.request_id == 2
    assert "has none of the authorized roles ['admin'] (authorizedRoles)" in reply.message.message
    assert type(close) is Close and close.reason == g.AUTH_REFUSED
    assert s.closed and s.identity is None


def test_an_authorized_certificate_authenticates_at_the_handshake(tokens: tuple[TokenSigner, TokenVerifier]) -> None:
    s = Session(peer=PEER, tls=True, auth=_auth(tokens, roles=("client",)))
    s.receive([START_TLS])
    identity = Identity("alice", ("client",), "tls")
    assert s.tls_established("alice", ("client",)) == [Authenticated(identity), Trusted()]
    assert s.serving and s.identity == identity


def test_a_certificate_without_an_authorized_role_waits_for_a_token(tokens: tuple[TokenSigner, TokenVerifier]) -> None:
    s = Session(peer=PEER, tls=True, auth=_auth(tokens, roles=("client",)))
    s.receive([START_TLS])
    assert s.tls_established("root", ("ops",)) == []
    assert s.phase is Phase.AWAITING_AUTH and s.cert_identity == Identity("root", ("ops",), "tls")
    decisions = s.receive([_token(tokens, subject="ops", roles=("client",)), READ])
    assert [type(d) for d in decisions] == [Authenticated, Trusted, Reply, Dispatch]
    assert s.identity == Identity("ops", ("client",), "token") and s.principal == "root"


def test_a_new_token_on_a_served_connection_is_not_trusted_twice(tokens: tuple[TokenSigner, TokenVerifier]) -> None:
    s = Session(peer=PEER, tls=False, auth=_auth(tokens))
    s.receive([_token(tokens)])
    decisions = s.receive([_token(tokens, subject="app-2")])
    assert [type(d) for d in decisions] == [Authenticated, Reply]


# ------------------------------------------------------------------------- any event sequence
@functools.cache
def _machine_keys() -> tuple[TokenSigner, TokenVerifier]:
    with tempfile.TemporaryDirectory(prefix="session-sm-") as tmp:
        secret = write_secret_file(Path(tmp) / "secret")
        return TokenSigner.from_secret_file(secret), TokenVerifier.from_secret_file(secret)


class SessionMachine(RuleBasedStateMachine):
    """Any sequence of requests and transport reports keeps the session's invariants."""

    def __init__(self) -> None:
        super().__init__()
        self.signer, self.verifier = _machine_keys()
        self.session: Session | None = None
        self.trusted_decided = 0
        self.served_before_trusted = False
        self.after_close: list[Any] = []

    @initialize(tls=st.booleans(), auth=st.booleans())
    def open(self, tls: bool, auth: bool) -> None:
        authenticator = (BookieAuthenticator(["tls", "token"], authorized_roles=["client"],
                                             token_verifier=self.verifier)
                         if auth else None)
        self.session = Session(peer=PEER, tls=tls, auth=authenticator)
        self.trusted_decided = 1 if self.session.trusted else 0

    def _apply(self, decisions: list[Any], was_closed: bool) -> None:
        if was_closed:
            self.after_close += decisions
        for d in decisions:
            if type(d) is Trusted:
                self.trusted_decided += 1
            if type(d) is Dispatch and self.trusted_decided == 0:
                self.served_before_trusted = True

    @rule(kind=st.sampled_from(["add", "batch", "read", "list", "start_tls", "good_token", "bad_token",
                                "bad_frame", "note"]),
          buffered=st.booleans())
    def receive(self, kind: str, buffered: bool) -> None:
        assert self.session is not None
        msg = {
            "add": ADD, "batch": _batch(2), "read": READ, "list": LIST, "start_tls": START_TLS,
            "good_token": m.AuthRequest(2, "token", self.signer.issue("app", ("client",)).encode()),
            "bad_token": m.AuthRequest(2, "token", b"not a token"),
            "bad_frame": m.BadFrame("bad", opcode=99, version=m.PROTOCOL_VERSION),
            "note": m.LedgerClosedNote(4, 7),
        }[kind]
        was_closed = self.session.closed
        fast = self.session.dispatchable([msg])
        decisions = self.session.receive([msg], buffered=buffered)
        # The transport's fast path decides exactly what receive() decides, when it applies.
        assert not fast or decisions == [Dispatch([msg])]
        assert fast or decisions != [Dispatch([msg])]
        self._apply(decisions, was_closed)

    @precondition(lambda self: self.session is not None and self.session.phase is Phase.UPGRADING)
    @rule(principal=st.sampled_from([None, "alice"]), roles=st.sampled_from([(), ("client",), ("ops",)]))
    def handshake_done(self, principal: str | None, roles: tuple[str, ...]) -> None:
        assert self.session is not None
        self._apply(self.session.tls_established(principal, roles), False)

    @rule()
    def handshake_failed_or_closed(self) -> None:
        assert self.session is not None
        was_closed = self.session.closed
        if self.session.phase is Phase.UPGRADING:
            self._apply(self.session.tls_failed("handshake failed"), was_closed)
        else:
            self.session.close()

    @invariant()
    def nothing_is_served_before_the_connection_is_trusted(self) -> None:
        assert not self.served_before_trusted

    @invariant()
    def trusted_is_decided_at_most_once(self) -> None:
        assert self.trusted_decided <= 1

    @invariant()
    def nothing_is_decided_after_the_close(self) -> None:
        assert self.after_close == []

    @invariant()
    def serving_means_trusted(self) -> None:
        if self.session is not None and self.session.serving:
            assert self.trusted_decided == 1


TestSessionMachine = SessionMachine.TestCase
TestSessionMachine.settings = settings(max_examples=100, stateful_step_count=12, deadline=None)
