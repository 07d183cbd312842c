"""Talking to bookies: one pooled, pipelined connection per bookie, shared by every ledger.

Responsibility: turn client operations (add, read, fencing read, batch read, LAC reads, explicit
LAC, force, list entries, bookie info, advisory ledger close, trim) into wire frames
(``vellum.proto``) on a connection to the right bookie, and turn the bookie's answers back into
results or :mod:`vellum.errors` exceptions. Everything runs on one asyncio loop; nothing here
blocks or spawns threads.

Connections (``_Connection``, an ``asyncio.BufferedProtocol`` reading into a ``FrameDecoder``:
big answers land in buffers of their own, decoded without copying their entries):

* one per bookie id (``"host:port"``), opened lazily by the first request; requests made while
  it is still connecting are queued and leave as soon as it is up;
* pipelined: any number of requests in flight; frames queued in one loop iteration leave in one
  ``transport.writelines`` call, entry payloads are never copied (``codec.encode_parts``); under
  TLS a burst leaves in slices of ``TLS_FLUSH_BYTES`` as it is queued, so that the first slice
  is encrypted and on the wire while the next adds are built (docs/security.md);
* a lost connection, a failed connect or a malformed answer fails every request pending on it at
  once with :class:`BookieHandleNotAvailableError` naming the bookie; the next request reconnects.
  After a failed *connect* the bookie is not retried for a short, growing backoff (requests in
  that window fail at once) so a dead bookie is not hammered; a connection lost after it was up
  is retried immediately (the bookie may just have restarted).
* TLS (a client made with ``tls``): the first frame on a new connection is START_TLS and nothing
  else leaves until its answer; on EOK the connection is upgraded (``loop.start_tls``, the
  context current at that moment, so rotated certificates apply to new connections), then
  START_TLS is sent once more inside TLS and the bookie's EOK confirms that it accepted the
  handshake (with TLS 1.3 the client's side completes before the bookie has checked the client
  certificate, and a bookie that refuses it just closes); only then is the connection up. A
  bookie that answers START_TLS with an error "does not offer TLS"; a failed handshake (the
  bookie's certificate not from the trusted CA, expired) or a connection closed before the
  confirmation (the bookie refused our certificate) fails the connection with
  :class:`SecurityError` naming the bookie and the reason. A client without TLS that reaches a bookie requiring it gets the bookie's notice
  (``ErrorResponse(EUA, opcode=START_TLS)``) and fails everything pending with a
  :class:`SecurityError` saying the bookie requires TLS. Security failures back off like failed
  connects.
* Authentication (a client made with ``auth``, a ``ClientAuth``): after START_TLS (if any) the
  connection sends AUTH (a token, or ``tls`` to have its certificate checked) and nothing else
  until the answer; the connection is up only on EOK. A refusal (EUA with the bookie's reason),
  and the bookie's notice ``AuthResponse(AUTH_NOTICE_ID, EUA, reason)`` that precedes the
  refusal of a request on an unauthenticated connection, fail everything pending with a
  :class:`SecurityError` naming the bookie and carrying that reason.

Matching answers to requests:

* ADD and READ are BookKeeper v2 frames without a request id: answers are matched by
  (op, ledger id, entry id), first-in first-out per key (a singly linked chain of pending
  requests per key, usually of length one);
* BATCH_READ and Vellum's own operations carry a per-connection request id and are matched by it.

Timeouts: no timer and no ``wait_for`` per request. Each connection keeps its requests in
issue order in one deque per timeout value (deadlines in such a deque increase, since the loop
clock is monotonic); one periodic sweep per client (every ``_SWEEP_INTERVAL_S``, armed only
while requests are pending) pops answered requests off the fronts and expires overdue ones with
:class:`TimeoutError_`. A timed-out request-id op is forgotten, so its late answer is dropped;
a timed-out v2 op stays in its key chain as a spent placeholder that absorbs its late answer, so
that answer is never mistaken for a later request with the same (op, ledger, entry).

Invariants: every request completes exactly once (answer, error, timeout, connection failure or
client close), on the loop thread; a callback that raises is logged and never breaks the
connection; this module never imports ``vellum.server``.

Size: about 840 lines for two classes, ``_Connection`` (~270: framing, matching, timeouts of one
socket) and ``BookieClient`` (~410: one method per operation, each building its frame and
mapping its answer). They share the pending-request records and the timeout sweep, and every
operation's code is a few lines on each side of that seam; splitting the file would put each
operation's request and answer in two modules.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import struct
from collections import deque
from collections.abc import Callable
from typing import Any, Final, cast

from vellum.errors import (
    EOK,
    WIRE_STATUS_NAMES,
    BookieHandleNotAvailableError,
    ClientClosedError,
    FramingError,
    IncorrectParameterError,
    SecurityError,
    TimeoutError_,
    VellumError,
    error_for_wire_status,
)
from vellum.proto import codec
from vellum.proto import messages as m
from vellum.security.auth import ClientAuth
from vellum.security.tls import ReloadingContext

log = logging.getLogger(__name__)

#: resolution of request timeouts: how often overdue requests are looked for
_SWEEP_INTERVAL_S: Final = 0.05
#: a long poll's network timeout is its server-side wait plus this (the bookie answers at the end
#: of the wait with what it has, so the answer is due shortly after ``timeout_ms``)
LONG_POLL_MARGIN_S: Final = 5.0
DEFAULT_TIMEOUT_S: Final = 5.0
#: BookKeeper's startTLSTimeoutSecs default
DEFAULT_START_TLS_TIMEOUT_S: Final = 10.0
#: under TLS, frames queued in one loop iteration leave as soon as this many bytes are queued
#: (``_Connection.send``), not all at the end of the iteration
TLS_FLUSH_BYTES: Final = 256 * 1024

_ENTRY_IDS = struct.Struct(">qq")  # first 16 bytes of a stored entry: ledgerId, entryId

_CONNECTING, _CONNECTED, _CLOSED = 0, 1, 2

#: callback of the add fast path: ``None`` on success, the exception otherwise
AddCallback = Callable[[BaseException | None], None]


class _Pending:
    """One request awaiting its answer. Completed exactly once: ``done`` guards that."""

    __slots__ = (
        "cb",
        "conn",
        "deadline",
        "done",
        "entry_id",
        "fut",
        "ledger_id",
        "next",
        "op",
        "request_id",
        "timeout_s",
    )

    def __init__(
        self,
        conn: _Connection,
        op: int,
        ledger_id: int,
        entry_id: int,
        request_id: int,
        cb: AddCallback | None,
        fut: asyncio.Future[Any] | None,
        deadline: float,
        timeout_s: float,
    ) -> None:
        self.conn = conn
        self.op = op
        self.ledger_id = ledger_id
        self.entry_id = entry_id
        self.request_id = request_id  # 0 for v2 ADD/READ (matched by key)
        self.cb = cb
        self.fut = fut
        self.deadline = deadline
        self.timeout_s = timeout_s
        self.done = False
        # next request with the same (op, ledger, entry) key on this connection (v2 FIFO chain)
        self.next: _Pending | None = None

    def describe(self) -> str:
        """``"<op> <ledger>:<entry> on <bookie>"`` (the context of every error message)."""
        name = m.OPCODE_NAMES.get(self.op, str(self.op))
        if self.op in (m.OP_ADD, m.OP_READ, m.OP_BATCH_READ):
            return f"{name} {self.ledger_id}:{self.entry_id} on {self.conn.bookie_id}"
        if self.op == m.OP_GET_BOOKIE_INFO:
            return f"{name} on {self.conn.bookie_id}"
        return f"{name} {self.ledger_id} on {self.conn.bookie_id}"

    def finish(self, exc: BaseException | None, value: Any = None) -> None:
        """Deliver the outcome (the caller has set ``done``)."""
        cb = self.cb
        if cb is not None:
            self.cb = None
            try:
                cb(exc)
            except Exception:
                log.exception("callback of %s raised", self.describe())
            return
        fut = self.fut
        if fut is None:
            return
        self.fut = None  # the deque may keep this object a while: do not keep the result too
        if fut.done():  # the awaiting caller was cancelled
            return
        if exc is None:
            fut.set_result(value)
        else:
            fut.set_exception(exc)


def _parse_bookie_id(bookie_id: str) -> tuple[str, int]:
    host, sep, port = bookie_id.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise IncorrectParameterError(f"bookie id {bookie_id!r} is not host:port")
    if host.startswith("[") and host.endswith("]"):  # [ipv6]:port
        host = host[1:-1]
    return host, int(port)


class _Connection(asyncio.BufferedProtocol):
    """The connection to one bookie (see the module docstring)."""

    def __init__(self, client: BookieClient, bookie_id: str, loop: asyncio.AbstractEventLoop) -> None:
        self.client = client
        self.bookie_id = bookie_id
        self.host, self.port = _parse_bookie_id(bookie_id)  # a bad id fails the request at once
        self.loop = loop
        self.state = _CONNECTING
        self.transport: asyncio.Transport | None = None
        self.decoder = codec.FrameDecoder(client._max_frame_size, side="client")
        self.out: list[m.BytesLike] = []
        self.out_bytes = 0  # bytes in ``out`` (counted under TLS only)
        self.flush_scheduled = False
        self.next_request_id = 0
        # v2 ops, keyed by (ledger id, entry id): head of the FIFO chain of pending requests
        self.adds: dict[tuple[int, int], _Pending] = {}
        self.reads: dict[tuple[int, int], _Pending] = {}
        # BATCH_READ and Vellum's ops, by request id
        self.by_id: dict[int, _Pending] = {}
        # every request of this connection in issue order, one deque per timeout value (so
        # deadlines in a deque increase); answered ones are dropped lazily by the sweep
        self.timeouts: dict[float, deque[_Pending]] = {}
        self.connect_task: asyncio.Task[None] | None = None
        # TLS: the answer to our START_TLS (its status), awaited by _connect before the upgrade,
        # then again for the confirmation inside TLS (tls_confirming)
        self.tls_answer: asyncio.Future[int] | None = None
        self.tls_confirming = False
        # the answer to our AUTH, awaited by _connect
        self.auth_answer: asyncio.Future[m.AuthResponse] | None = None
        # done once the socket is gone (or was never opened); close() waits on it
        self.closed: asyncio.Future[None] = loop.create_future()
        self.closed.add_done_callback(lambda _f: client._all_conns.discard(self))

    # ------------------------------------------------------------------------- lifecycle
    def start(self) -> None:
        self.connect_task = self.loop.create_task(self._connect())

    async def _connect(self) -> None:
        try:
            await asyncio.wait_for(
                self.loop.create_connection(lambda: self, self.host, self.port),
                self.client._connect_timeout_s,
            )
            if self.client._tls is not None and self.state == _CONNECTING:
                await asyncio.wait_for(self._start_tls(self.client._tls), self.client._start_tls_timeout_s)
            if self.client._auth is not None and self.state == _CONNECTING:
                await asyncio.wait_for(self._authenticate(self.client._auth), self.client._start_tls_timeout_s)
            if self.state == _CONNECTING and (self.client._tls is not None or self.client._auth is not None):
                self._up()
        except asyncio.CancelledError:
            # Cancelled by shutdown(), which has already failed the pending requests.
            if self.transport is not None:
                self.transport.close()  # connection_lost will mark the connection closed
            elif not self.closed.done():
                self.closed.set_result(None)
            raise
        except (SecurityError, ssl.SSLError) as exc:
            err = exc if isinstance(exc, SecurityError) else SecurityError(
                f"TLS handshake with bookie {self.bookie_id} failed: {_ssl_reason(exc)}")
            if self.state != _CLOSED:
                self.client._connect_failed(self.bookie_id, str(err))
                self.shutdown(err)
            if not self.closed.done():
                self.closed.set_result(None)
        except Exception as exc:  # OSError (refused, unreachable), TimeoutError
            if self.state == _CLOSED:  # shut down meanwhile (connection lost during START_TLS)
                if not self.closed.done():
                    self.closed.set_result(None)
                return
            reason = "timed out" if isinstance(exc, TimeoutError) else str(exc) or type(exc).__name__
            if self.transport is not None and self.client._tls is not None:
                reason = f"TLS negotiation {reason}"
            elif self.transport is not None and self.client._auth is not None:
                reason = f"authentication {reason}"
            self.client._connect_failed(self.bookie_id, reason)
            self.shutdown(
                BookieHandleNotAvailableError(f"cannot connect to bookie {self.bookie_id}: {reason}")
            )
            if not self.closed.done():
                self.closed.set_result(None)

    async def _start_tls(self, tls: ReloadingContext) -> None:
        """START_TLS, then the handshake; the connection is up (``_up``) once both succeeded."""
        transport = self.transport
        assert transport is not None
        answer = self.tls_answer = self.loop.create_future()
        transport.write(codec.encode(m.StartTlsRequest(self.new_request_id())))
        status = await answer
        if status != EOK:
            raise SecurityError(
                f"bookie {self.bookie_id} does not offer TLS (it answered START_TLS with "
                f"{WIRE_STATUS_NAMES.get(status, status)}), and this client is configured for TLS "
                "(tlsProviderFactoryClass): turn TLS on at the bookie, or off at the client"
            )
        tls_transport = await self.loop.start_tls(transport, self, tls.get(), server_hostname=self.host)
        if tls_transport is None or self.state == _CLOSED:
            raise BookieHandleNotAvailableError(f"connection to bookie {self.bookie_id} closed during TLS setup")
        self.transport = cast(asyncio.Transport, tls_transport)
        # The bookie's EOK to a START_TLS inside TLS says it accepted the handshake.
        self.tls_confirming = True
        answer = self.tls_answer = self.loop.create_future()
        self.transport.write(codec.encode(m.StartTlsRequest(self.new_request_id())))
        status = await answer
        if status != EOK:
            raise SecurityError(f"bookie {self.bookie_id} did not confirm the TLS connection "
                                f"({WIRE_STATUS_NAMES.get(status, status)})")
        self.tls_confirming = False

    async def _authenticate(self, auth: ClientAuth) -> None:
        """AUTH with ``auth``'s provider; returns once the bookie accepted it (a refusal is
        turned into a SecurityError and the connection shut down by ``_handshake_answer``)."""
        transport = self.transport
        assert transport is not None
        payload = auth.payload()
        answer = self.auth_answer = self.loop.create_future()
        transport.write(codec.encode(m.AuthRequest(self.new_request_id(), auth.plugin, payload)))
        reply = await answer
        log.debug("bookie %s: %s", self.bookie_id, reply.message)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A cast, not an isinstance check: uvloop's TCPTransport does not subclass asyncio.Transport.
        self.transport = transport = cast(asyncio.Transport, transport)
        if self.state == _CLOSED:  # shut down while connecting
            transport.close()
            return
        if self.client._tls is not None or self.client._auth is not None:
            return  # up only after START_TLS and the handshake, and AUTH (_connect)
        self._up()

    def _up(self) -> None:
        self.state = _CONNECTED
        self.client._connect_succeeded(self.bookie_id)
        if self.out:
            self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.tls_confirming and self.state == _CONNECTING:
            # TLS 1.3: our side of the handshake completed, then the bookie checked our
            # certificate and closed (asyncio sends no alert): it refused this client.
            alert = f" ({_ssl_text(exc)})" if isinstance(exc, ssl.SSLError) else ""
            err = SecurityError(
                f"bookie {self.bookie_id} refused this client's certificate{alert}: it closed the connection "
                "right after the TLS handshake (mutual TLS: no certificate configured, not issued by a CA in "
                "the bookie's tlsTrustStore, or expired); the bookie's log says which"
            )
            self.client._connect_failed(self.bookie_id, str(err))
            self.shutdown(err)
        elif isinstance(exc, ssl.SSLError) and self.state == _CONNECTING:
            # The handshake failed (uvloop reports it here before start_tls raises).
            err = SecurityError(f"TLS handshake with bookie {self.bookie_id} failed: {_ssl_reason(exc)}")
            self.client._connect_failed(self.bookie_id, str(err))
            self.shutdown(err)
        else:
            why = f": {exc}" if exc else " (closed by the bookie)"
            self.shutdown(BookieHandleNotAvailableError(f"connection to bookie {self.bookie_id} lost{why}"))
        if not self.closed.done():
            self.closed.set_result(None)

    def shutdown(self, exc: VellumError) -> None:
        """Close the connection and fail everything pending on it with ``exc`` (idempotent)."""
        if self.state == _CLOSED:
            return
        self.state = _CLOSED
        self.client._forget(self)
        self.out = []
        self.out_bytes = 0
        if self.transport is not None:
            self.transport.close()
        elif self.connect_task is not None and asyncio.current_task() is not self.connect_task:
            self.connect_task.cancel()
        pending: list[_Pending] = list(self.by_id.values())
        for table in (self.adds, self.reads):
            for head in table.values():
                p: _Pending | None = head
                while p is not None:
                    pending.append(p)
                    p = p.next
        self.adds, self.reads, self.by_id, self.timeouts = {}, {}, {}, {}
        for answer in (self.tls_answer, self.auth_answer):
            if answer is not None and not answer.done():
                answer.set_exception(exc)  # wakes _connect, which sees the connection closed
        for p in pending:
            if not p.done:
                p.done = True
                p.finish(exc)

    # ---------------------------------------------------------------------------- sending
    def send(self, parts: list[m.BytesLike]) -> None:
        self.out += parts
        if self.state != _CONNECTED:
            return
        if self.client._tls is not None:
            # Under TLS a flush encrypts everything queued before its first byte leaves: a burst
            # of big adds leaves in slices instead, each encrypted and on the wire while the
            # next is built, and the TLS layer's buffers stay small (docs/security.md).
            self.out_bytes += sum(map(len, parts))
            if self.out_bytes >= TLS_FLUSH_BYTES:
                self._flush()
                return
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        # Everything queued during this loop iteration leaves in one writelines (one syscall).
        self.flush_scheduled = False
        out = self.out
        if out and self.transport is not None and self.state == _CONNECTED:
            self.out = []
            self.out_bytes = 0
            # A TLS transport makes TLS records of each buffer: small frames go joined.
            self.transport.writelines(codec.coalesce(out) if self.client._tls is not None else out)

    def new_request_id(self) -> int:
        self.next_request_id += 1
        return self.next_request_id

    # -------------------------------------------------------------------------- receiving
    def get_buffer(self, sizehint: int) -> memoryview:
        return self.decoder.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        try:
            messages = cast("list[Any]", self.decoder.buffer_updated(nbytes))
        except FramingError as exc:
            self._bad_answer(str(exc))
            return
        if self.state == _CONNECTING:
            self._handshake_answer(messages)
            return
        for msg in messages:
            kind = type(msg)
            if kind is m.AddResponse:
                self._answer_v2(self.adds, msg.ledger_id, msg.entry_id, msg.status, None)
            elif kind is m.ReadResponse:
                self._answer_v2(self.reads, msg.ledger_id, msg.entry_id, msg.status, msg.entry)
            elif kind is m.BadFrame:
                self._bad_answer(msg.reason)
            elif kind is m.ErrorResponse:
                self._answer_error(msg)
            elif kind is m.AuthResponse:
                self._refused(msg.message)
            else:
                self._answer_by_id(msg)
            if self.state == _CLOSED:
                return

    def _handshake_answer(self, messages: list[Any]) -> None:
        """Frames before the connection is up: the answer to our START_TLS or AUTH."""
        if not messages:
            return  # a partial frame so far
        if len(messages) == 1:
            msg = messages[0]
            kind = type(msg)
            answer = self.auth_answer
            if kind is m.AuthResponse:
                if msg.status != EOK or msg.request_id == m.AUTH_NOTICE_ID:
                    self._refused(msg.message)
                elif answer is not None and not answer.done() and not self.decoder.buffered:
                    answer.set_result(msg)
                else:
                    self._bad_answer("an unexpected AUTH answer")
                return
            if kind is m.ErrorResponse and msg.opcode == m.OP_AUTH and answer is not None:
                self._refused("it does not know AUTH (a bookie without authentication support)")
                return
        self._tls_answer(messages)

    def _refused(self, reason: str) -> None:
        """The bookie refused this client's authentication (or the lack of it): fail all."""
        err = SecurityError(f"bookie {self.bookie_id} refused this client: {reason or 'EUA'}")
        log.warning("%s", err)
        self.client._connect_failed(self.bookie_id, str(err))
        self.shutdown(err)

    def _tls_answer(self, messages: list[Any]) -> None:
        """Frames before the connection is up: only the answer to our START_TLS may come."""
        answer = self.tls_answer
        if answer is None or answer.done() or len(messages) != 1 or self.decoder.buffered:
            self._bad_answer(f"{len(messages)} unexpected frame(s) during START_TLS")
            return
        msg = messages[0]
        if type(msg) is m.StartTlsResponse:
            status = msg.status
        elif type(msg) is m.ErrorResponse and msg.opcode == m.OP_START_TLS:
            status = msg.status if msg.status != EOK else m.EBADREQ  # a bookie that does not know START_TLS
        else:
            self._bad_answer(f"a {type(msg).__name__} instead of the answer to START_TLS")
            return
        if status == EOK and self.transport is not None and not self.tls_confirming:
            self.transport.pause_reading()  # the next bytes are TLS: start_tls reads them
        answer.set_result(status)

    def eof_received(self) -> bool | None:
        return None  # let the transport close; connection_lost fails what is pending

    def _bad_answer(self, reason: str) -> None:
        # The bookie broke the protocol: no later answer on this connection can be trusted.
        log.warning("bookie %s sent a malformed answer (%s): closing the connection", self.bookie_id, reason)
        self.shutdown(
            BookieHandleNotAvailableError(
                f"bookie {self.bookie_id} sent a malformed answer ({reason}); connection closed"
            )
        )

    def _answer_v2(
        self, table: dict[tuple[int, int], _Pending], ledger_id: int, entry_id: int, status: int, value: Any
    ) -> None:
        key = (ledger_id, entry_id)
        p = table.get(key)
        if p is None:
            log.debug("unexpected answer %d:%d from bookie %s: dropped", ledger_id, entry_id, self.bookie_id)
            return
        nxt = p.next
        if nxt is None:
            del table[key]
        else:
            table[key] = nxt
        if p.done:  # a timed-out request's placeholder absorbs its late answer
            return
        p.done = True
        if status == EOK:
            p.finish(None, value)
        else:
            p.finish(error_for_wire_status(status, p.describe()))

    def _answer_by_id(self, msg: Any) -> None:
        p = self.by_id.pop(msg.request_id, None)
        if p is None or p.done:
            return  # late answer to a timed-out request
        p.done = True
        status = msg.status
        if status != EOK:
            p.finish(error_for_wire_status(status, p.describe()))
            return
        kind = type(msg)
        value: Any
        if kind is m.BatchReadResponse or kind is m.StridedReadResponse:
            value = list(msg.entries)
        elif kind is m.ReadLacResponse or kind is m.LongPollReadLacResponse:
            value = (bytes(msg.lac_body), bytes(msg.last_entry))
        elif kind is m.ListEntriesResponse:
            value = msg.ranges
        elif kind is m.GetBookieInfoResponse:
            value = (msg.total_disk_capacity, msg.free_disk_space)
        elif kind is m.CollectResponse:
            value = (msg.reclaimed_bytes, msg.garbage_bytes)
        else:
            value = None
        if p.op != _RESPONSE_OPS.get(kind):
            p.finish(
                BookieHandleNotAvailableError(
                    f"bookie {self.bookie_id} answered {p.describe()} with a {kind.__name__}"
                )
            )
            return
        p.finish(None, value)

    def _answer_error(self, msg: m.ErrorResponse) -> None:
        if msg.opcode == m.OP_START_TLS and msg.request_id is None:
            # The bookie's notice that it serves TLS connections only (it precedes its refusals).
            err = SecurityError(
                f"bookie {self.bookie_id} requires TLS and this client is configured without it: set "
                "tlsProviderFactoryClass=org.apache.bookkeeper.tls.TLSContextFactory and tlsTrustStore "
                "(plus tlsCertificatePath and tlsKeyStore if the bookie wants client certificates)"
            )
            log.warning("%s", err)
            self.client._connect_failed(self.bookie_id, str(err))
            self.shutdown(err)
            return
        p: _Pending | None = None
        if msg.request_id is not None and msg.request_id in self.by_id:
            p = self.by_id.pop(msg.request_id)
        elif msg.ledger_id is not None and msg.entry_id is not None and msg.opcode in (m.OP_ADD, m.OP_READ):
            table = self.adds if msg.opcode == m.OP_ADD else self.reads
            key = (msg.ledger_id, msg.entry_id)
            p = table.get(key)
            if p is not None:
                if p.next is None:
                    del table[key]
                else:
                    table[key] = p.next
        if p is None:
            log.warning("bookie %s sent an error answer matching no request: %r", self.bookie_id, msg)
            return
        if p.done:
            return
        p.done = True
        status = msg.status if msg.status != EOK else m.EBADREQ
        p.finish(error_for_wire_status(status, p.describe()))

    # --------------------------------------------------------------------------- timeouts
    def sweep(self, now: float) -> bool:
        """Expire overdue requests; True if requests are still pending."""
        expired: list[_Pending] = []
        timeouts = self.timeouts
        for timeout_s, dq in list(timeouts.items()):
            while dq:
                p = dq[0]
                if p.done:
                    dq.popleft()
                elif p.deadline <= now:
                    dq.popleft()
                    expired.append(p)
                else:
                    break
            if not dq:
                del timeouts[timeout_s]
        for p in expired:
            if not p.done:
                self.expire(p)
        return bool(self.timeouts)

    def expire(self, p: _Pending) -> None:
        p.done = True
        if p.request_id:
            self.by_id.pop(p.request_id, None)
        # v2 ops stay in their chain: the spent placeholder absorbs a late answer.
        p.finish(TimeoutError_(f"{p.describe()} timed out after {p.timeout_s:g}s"))


def _ssl_text(exc: ssl.SSLError) -> str:
    reason = str(getattr(exc, "verify_message", None) or exc.reason or exc)
    if reason.isupper():  # OpenSSL's code, e.g. TLSV13_ALERT_CERTIFICATE_REQUIRED
        reason = reason.replace("_", " ").lower()
    return reason


def _ssl_reason(exc: ssl.SSLError) -> str:
    reason = _ssl_text(exc)
    return f"the bookie refused this client ({reason})" if "alert" in reason else reason


_RESPONSE_OPS: dict[type, int] = {
    m.BatchReadResponse: m.OP_BATCH_READ,
    m.StridedReadResponse: m.OP_READ_STRIDED,
    m.LongPollReadLacResponse: m.OP_LONG_POLL_READ_LAC,
    m.ReadLacResponse: m.OP_READ_LAC,
    m.WriteLacResponse: m.OP_WRITE_LAC,
    m.ForceLedgerResponse: m.OP_FORCE_LEDGER,
    m.ListEntriesResponse: m.OP_LIST_ENTRIES,
    m.GetBookieInfoResponse: m.OP_GET_BOOKIE_INFO,
    m.TrimResponse: m.OP_TRIM,
    m.CollectResponse: m.OP_COLLECT,
}


class BookieClient:
    """Pooled, pipelined connections to bookies (see the module docstring).

    All methods must be called on the loop thread of the loop the client is first used on.
    """

    def __init__(
        self,
        *,
        connect_timeout_s: float = 5.0,
        max_frame_size: int = m.DEFAULT_MAX_FRAME_SIZE,
        reconnect_backoff_s: float = 0.1,
        max_reconnect_backoff_s: float = 2.0,
        tls: ReloadingContext | None = None,
        start_tls_timeout_s: float = DEFAULT_START_TLS_TIMEOUT_S,
        auth: ClientAuth | None = None,
    ) -> None:
        """``tls``: talk TLS to every bookie (START_TLS on each new connection), with the
        context it holds when the connection is made. ``auth``: authenticate each new
        connection (AUTH) before using it; ``start_tls_timeout_s`` bounds each of the two steps."""
        if connect_timeout_s <= 0:
            raise IncorrectParameterError(f"connect_timeout_s must be > 0, got {connect_timeout_s}")
        self._connect_timeout_s = connect_timeout_s
        self._tls = tls
        self._auth = auth
        self._start_tls_timeout_s = start_tls_timeout_s
        self._max_frame_size = max_frame_size
        self._backoff_initial_s = reconnect_backoff_s
        self._backoff_max_s = max_reconnect_backoff_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._conns: dict[str, _Connection] = {}
        self._all_conns: set[_Connection] = set()  # including closing ones, for close()
        # bookie id -> (retry not before this loop time, current backoff, last failure reason)
        self._backoff: dict[str, tuple[float, float, str]] = {}
        self._sweep_handle: asyncio.TimerHandle | None = None
        self._closed = False

    # ------------------------------------------------------------------------ connections
    def _get_loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop

    def _connection(self, bookie_id: str) -> _Connection:
        """The connection to ``bookie_id``, opening one if needed; raises if none can be had now."""
        conn = self._conns.get(bookie_id)
        if conn is not None:
            return conn
        if self._closed:
            raise ClientClosedError("bookie client is closed")
        loop = self._get_loop()
        backoff = self._backoff.get(bookie_id)
        if backoff is not None and loop.time() < backoff[0]:
            raise BookieHandleNotAvailableError(
                f"bookie {bookie_id} unavailable (last connect failed: {backoff[2]}); "
                f"retrying in {backoff[0] - loop.time():.2f}s"
            )
        conn = _Connection(self, bookie_id, loop)
        self._conns[bookie_id] = conn
        self._all_conns.add(conn)
        conn.start()
        return conn

    def _forget(self, conn: _Connection) -> None:
        if self._conns.get(conn.bookie_id) is conn:
            del self._conns[conn.bookie_id]

    def _connect_failed(self, bookie_id: str, reason: str) -> None:
        previous = self._backoff.get(bookie_id)
        delay = self._backoff_initial_s if previous is None else min(previous[1] * 2, self._backoff_max_s)
        self._backoff[bookie_id] = (self._get_loop().time() + delay, delay, reason)

    def _connect_succeeded(self, bookie_id: str) -> None:
        self._backoff.pop(bookie_id, None)

    def is_connected(self, bookie_id: str) -> bool:
        """True if a connection to ``bookie_id`` is up (not merely being opened)."""
        conn = self._conns.get(bookie_id)
        return conn is not None and conn.state == _CONNECTED

    # --------------------------------------------------------------------------- requests
    def _register(self, conn: _Connection, p: _Pending) -> None:
        dq = conn.timeouts.get(p.timeout_s)
        if dq is None:
            dq = conn.timeouts[p.timeout_s] = deque()
        dq.append(p)
        if self._sweep_handle is None:
            self._sweep_handle = conn.loop.call_later(_SWEEP_INTERVAL_S, self._sweep)

    def _submit_v2(
        self,
        bookie_id: str,
        op: int,
        ledger_id: int,
        entry_id: int,
        parts: list[m.BytesLike],
        cb: AddCallback | None,
        fut: asyncio.Future[Any] | None,
        timeout_s: float,
    ) -> None:
        conn = self._connection(bookie_id)
        p = _Pending(conn, op, ledger_id, entry_id, 0, cb, fut, conn.loop.time() + timeout_s, timeout_s)
        table = conn.adds if op == m.OP_ADD else conn.reads
        key = (ledger_id, entry_id)
        head = table.get(key)
        if head is None:
            table[key] = p
        else:  # same key already in flight: answers come back in order, append to the chain
            while head.next is not None:
                head = head.next
            head.next = p
        self._register(conn, p)
        conn.send(parts)

    def _submit_by_id(
        self,
        bookie_id: str,
        op: int,
        ledger_id: int,
        entry_id: int,
        build: Callable[[int], m.Request],
        timeout_s: float,
    ) -> asyncio.Future[Any]:
        conn = self._connection(bookie_id)
        request_id = conn.new_request_id()
        parts = codec.encode_parts(build(request_id))
        loop = conn.loop
        fut: asyncio.Future[Any] = loop.create_future()
        p = _Pending(conn, op, ledger_id, entry_id, request_id, None, fut, loop.time() + timeout_s, timeout_s)
        conn.by_id[request_id] = p
        self._register(conn, p)
        conn.send(parts)
        return fut

    def _sweep(self) -> None:
        """The periodic timeout sweep over every connection (armed while requests are pending).

        Per connection, so a request stuck on one bookie never holds back the lazy cleanup of
        answered requests to the others."""
        self._sweep_handle = None
        if self._closed:
            return
        loop = self._get_loop()
        now = loop.time()
        pending = False
        for conn in list(self._conns.values()):
            pending = conn.sweep(now) or pending
        if pending:
            self._sweep_handle = loop.call_later(_SWEEP_INTERVAL_S, self._sweep)

    # -------------------------------------------------------------------------- v2 ops
    def add_cb(
        self,
        bookie_id: str,
        master_key: bytes,
        entry: m.BytesLike,
        recovery: bool,
        callback: AddCallback,
        timeout_s: float,
    ) -> None:
        """Send an ADD of the stored ``entry``; ``callback(None | exc)`` runs once on the loop thread.

        The fast path of the ledger write path: no future, no task. Failures known at once
        (closed client, bookie in reconnect backoff, bad arguments) are delivered through
        ``call_soon``, never from inside this call.
        """
        try:
            ledger_id, entry_id = _ENTRY_IDS.unpack_from(entry)
            parts = codec.encode_parts(
                m.AddRequest(master_key, entry, m.FLAG_RECOVERY_ADD if recovery else 0)
            )
            self._submit_v2(bookie_id, m.OP_ADD, ledger_id, entry_id, parts, callback, None, timeout_s)
        except (VellumError, struct.error) as exc:
            err: BaseException = exc
            if isinstance(exc, struct.error):
                err = IncorrectParameterError(
                    f"ADD on {bookie_id}: entry of {len(entry)} bytes has no header"
                )
            self._get_loop().call_soon(callback, err)

    async def add(
        self,
        bookie_id: str,
        master_key: bytes,
        entry: m.BytesLike,
        *,
        recovery: bool = False,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        """ADD the stored ``entry`` (ledger and entry ids are read from it) under ``master_key``.

        ``recovery`` sends a recovery add (accepted on a fenced ledger).
        """
        if len(entry) < m.MIN_ENTRY_SIZE:
            raise IncorrectParameterError(f"ADD on {bookie_id}: entry of {len(entry)} bytes has no header")
        ledger_id, entry_id = _ENTRY_IDS.unpack_from(entry)
        parts = codec.encode_parts(m.AddRequest(master_key, entry, m.FLAG_RECOVERY_ADD if recovery else 0))
        fut: asyncio.Future[None] = self._get_loop().create_future()
        self._submit_v2(bookie_id, m.OP_ADD, ledger_id, entry_id, parts, None, fut, timeout_s)
        await fut

    async def read(
        self,
        bookie_id: str,
        ledger_id: int,
        entry_id: int,
        *,
        fence_master_key: bytes | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> bytes | memoryview:
        """READ one stored entry (``entry_id == -1``: the last entry the bookie has); a big one
        (16 KiB or more) as a read-only view of its own receive buffer.

        With ``fence_master_key`` this is a fencing read: the bookie fences the ledger (durably)
        before answering, so later normal adds fail with LedgerFencedError.
        """
        flags = m.FLAG_DO_FENCING if fence_master_key is not None else 0
        parts = codec.encode_parts(m.ReadRequest(ledger_id, entry_id, flags, fence_master_key))
        fut: asyncio.Future[bytes | memoryview] = self._get_loop().create_future()
        self._submit_v2(bookie_id, m.OP_READ, ledger_id, entry_id, parts, None, fut, timeout_s)
        return await fut

    def read_future(
        self, bookie_id: str, ledger_id: int, entry_id: int, *, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> asyncio.Future[bytes | memoryview]:
        """A plain (non-fencing) READ as a future, without a coroutine or task: the fast path of
        pipelined range reads. Failures known at once (closed client, bookie in reconnect
        backoff) come back as an already failed future, never as an exception from this call.
        Cancelling the future abandons the answer (the request itself still completes).
        """
        fut: asyncio.Future[bytes | memoryview] = self._get_loop().create_future()
        try:
            parts = codec.encode_parts(m.ReadRequest(ledger_id, entry_id, 0, None))
            self._submit_v2(bookie_id, m.OP_READ, ledger_id, entry_id, parts, None, fut, timeout_s)
        except VellumError as exc:
            fut.set_exception(exc)
        return fut

    async def batch_read(
        self,
        bookie_id: str,
        ledger_id: int,
        start_entry_id: int,
        max_count: int,
        max_size: int,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> list[bytes | memoryview]:
        """BATCH_READ: consecutive stored entries from ``start_entry_id`` (at least one, or
        NoSuchEntryError), at most ``max_count`` entries / ``max_size`` bytes."""
        fut = self._submit_by_id(
            bookie_id,
            m.OP_BATCH_READ,
            ledger_id,
            start_entry_id,
            lambda rid: m.BatchReadRequest(ledger_id, start_entry_id, rid, max_count, max_size),
            timeout_s,
        )
        result: list[bytes | memoryview] = await fut
        return result

    # -------------------------------------------------------------------- Vellum's own ops
    async def read_strided(
        self,
        bookie_id: str,
        ledger_id: int,
        first_entry_id: int,
        stride: int,
        max_count: int,
        max_size: int,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> list[bytes | memoryview]:
        """READ_STRIDED: stored entries ``first, first + stride, ...`` (at least one, or
        NoSuchEntryError), at most ``max_count`` entries / about ``max_size`` bytes."""
        fut = self._submit_by_id(
            bookie_id,
            m.OP_READ_STRIDED,
            ledger_id,
            first_entry_id,
            lambda rid: m.StridedReadRequest(rid, ledger_id, first_entry_id, stride, max_count, max_size),
            timeout_s,
        )
        result: list[bytes | memoryview] = await fut
        return result

    async def read_lac(
        self, bookie_id: str, ledger_id: int, *, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> tuple[bytes, bytes]:
        """``(explicit LAC body, last stored entry)`` of the ledger on the bookie; either may be b""."""
        fut = self._submit_by_id(
            bookie_id, m.OP_READ_LAC, ledger_id, -1, lambda rid: m.ReadLacRequest(rid, ledger_id), timeout_s
        )
        result: tuple[bytes, bytes] = await fut
        return result

    async def long_poll_lac(
        self, bookie_id: str, ledger_id: int, previous_lac: int, timeout_ms: int
    ) -> tuple[bytes, bytes]:
        """Like :meth:`read_lac`, but the bookie holds the answer until its LAC for the ledger
        passes ``previous_lac`` or ``timeout_ms`` elapse (then it answers with what it has)."""
        fut = self._submit_by_id(
            bookie_id,
            m.OP_LONG_POLL_READ_LAC,
            ledger_id,
            -1,
            lambda rid: m.LongPollReadLacRequest(rid, ledger_id, previous_lac, timeout_ms),
            timeout_ms / 1000.0 + LONG_POLL_MARGIN_S,
        )
        result: tuple[bytes, bytes] = await fut
        return result

    async def write_lac(
        self,
        bookie_id: str,
        ledger_id: int,
        master_key: bytes,
        lac: int,
        lac_body: bytes,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        """Store an explicit LAC (``lac_body`` from ``DigestManager.compute_lac``)."""
        fut = self._submit_by_id(
            bookie_id,
            m.OP_WRITE_LAC,
            ledger_id,
            lac,
            lambda rid: m.WriteLacRequest(rid, ledger_id, lac, master_key, lac_body),
            timeout_s,
        )
        await fut

    async def force(self, bookie_id: str, ledger_id: int, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        """FORCE_LEDGER: answers once every add sent on this connection for the ledger is durable."""
        fut = self._submit_by_id(
            bookie_id,
            m.OP_FORCE_LEDGER,
            ledger_id,
            -1,
            lambda rid: m.ForceLedgerRequest(rid, ledger_id),
            timeout_s,
        )
        await fut

    async def list_entries(
        self, bookie_id: str, ledger_id: int, *, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> tuple[tuple[int, int], ...]:
        """The entry ids the bookie holds for the ledger, as sorted disjoint inclusive ranges."""
        fut = self._submit_by_id(
            bookie_id,
            m.OP_LIST_ENTRIES,
            ledger_id,
            -1,
            lambda rid: m.ListEntriesRequest(rid, ledger_id),
            timeout_s,
        )
        result: tuple[tuple[int, int], ...] = await fut
        return result

    async def bookie_info(self, bookie_id: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[int, int]:
        """``(total disk capacity, free disk space)`` of the bookie's ledger dirs, in bytes."""
        fut = self._submit_by_id(
            bookie_id, m.OP_GET_BOOKIE_INFO, -1, -1, lambda rid: m.GetBookieInfoRequest(rid), timeout_s
        )
        result: tuple[int, int] = await fut
        return result

    def ledger_closed(self, bookie_id: str, ledger_id: int) -> None:
        """Advisory LEDGER_CLOSED note: fire and forget (never raises, never waits; the bookie
        never answers it). Dropped if the bookie cannot be reached right now."""
        try:
            conn = self._connection(bookie_id)
            conn.send(codec.encode_parts(m.LedgerClosedNote(conn.new_request_id(), ledger_id)))
        except Exception as exc:
            log.debug("LEDGER_CLOSED %d to bookie %s dropped: %s", ledger_id, bookie_id, exc)

    async def trim(
        self,
        bookie_id: str,
        ledger_id: int,
        end_entry_id: int,
        master_key: bytes,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        """Ask the bookie to drop the ledger's entries below ``end_entry_id``."""
        fut = self._submit_by_id(
            bookie_id,
            m.OP_TRIM,
            ledger_id,
            end_entry_id,
            lambda rid: m.TrimRequest(rid, ledger_id, end_entry_id, master_key),
            timeout_s,
        )
        await fut

    async def collect(
        self,
        bookie_id: str,
        ledger_id: int,
        end_entry_id: int,
        master_key: bytes,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> tuple[int, int]:
        """COLLECT: the bookie trims the ledger below ``end_entry_id`` (0: nothing), seals the
        active entry logs holding it and runs a garbage collection pass on its ledger dir(s);
        answered when that pass is done with ``(reclaimed bytes, garbage bytes left)``.
        ``NoSuchLedgerError``: the bookie does not hold the ledger (nothing to collect)."""
        fut = self._submit_by_id(
            bookie_id,
            m.OP_COLLECT,
            ledger_id,
            end_entry_id,
            lambda rid: m.CollectRequest(rid, ledger_id, end_entry_id, master_key),
            timeout_s,
        )
        result: tuple[int, int] = await fut
        return result

    # ------------------------------------------------------------------------------ close
    async def close(self) -> None:
        """Close every connection; pending requests fail with ClientClosedError. Idempotent."""
        if self._closed:
            return
        self._closed = True
        conns = list(self._all_conns)
        self._all_conns.clear()
        for conn in conns:
            conn.shutdown(
                ClientClosedError(f"bookie client closed; request to bookie {conn.bookie_id} abandoned")
            )
        if self._sweep_handle is not None:
            self._sweep_handle.cancel()
            self._sweep_handle = None
        # Let the transports finish closing so no socket outlives the client.
        tasks = [c.connect_task for c in conns if c.connect_task is not None and not c.connect_task.done()]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        waiters = [c.closed for c in conns if c.transport is not None and not c.closed.done()]
        if waiters:
            await asyncio.wait(waiters, timeout=2.0)
        # A TLS close (close_notify both ways) that has not finished by now, e.g. with a bookie
        # that hung up on a refused client, is cut short: no socket may outlive the client, nor
        # its shutdown run on a loop the caller is about to close.
        late = [c for c in conns if c.transport is not None and not c.closed.done()]
        for c in late:
            assert c.transport is not None
            c.transport.abort()
        if late:
            await asyncio.wait([c.closed for c in late], timeout=1.0)
