"""One pipelined connection to one bookie: framing, matching answers to requests, timeouts
of its requests, and the START_TLS / AUTH negotiation it runs through ``client/handshake.py``.
``client/bookie_client.py`` describes the behaviour (its module docstring) and owns the pool,
the reconnect backoff and the operations; a connection sees its owner only through
``ConnectionOwner``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol, cast

from vellum.client.handshake import NEGOTIATION_ERRORS, Handshake
from vellum.errors import (
    EOK,
    BookieHandleNotAvailableError,
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

#: under TLS, frames queued in one loop iteration leave as soon as this many bytes are queued
#: (``BookieConnection.send``), not all at the end of the iteration
TLS_FLUSH_BYTES: Final = 256 * 1024

CONNECTING, CONNECTED, CLOSED = 0, 1, 2

#: callback of the add fast path: ``None`` on success, the exception otherwise
AddCallback = Callable[[BaseException | None], None]
#: callback of an add sent to a write set (``BookieClient.add_quorum_cb``):
#: ``(token, ensemble index, bookie id, None | exception)``
QuorumAddCallback = Callable[[Any, int, str, BaseException | None], None]


@dataclass(frozen=True)
class ConnectionSettings:
    """How every connection of one client connects (``BookieClient``'s arguments)."""

    connect_timeout_s: float
    max_frame_size: int
    tls: ReloadingContext | None
    auth: ClientAuth | None
    start_tls_timeout_s: float


class ConnectionOwner(Protocol):
    """What a connection needs of the client that owns it."""

    settings: ConnectionSettings

    def connect_failed(self, bookie_id: str, reason: str) -> None:
        """A connect (or its negotiation) failed: back off before the next one."""

    def connect_succeeded(self, bookie_id: str) -> None:
        """The connection is up: no backoff."""

    def forget(self, conn: BookieConnection) -> None:
        """``conn`` is shutting down: the next request opens a new connection."""

    def gone(self, conn: BookieConnection) -> None:
        """``conn``'s socket is gone (``close`` no longer waits for it)."""


class Pending:
    """One request awaiting its answer. Completed exactly once: ``done`` guards that.

    Kept small (one is built per request and bookie): the (ledger, entry) ``key`` is the tuple
    the v2 tables are keyed by, and ``cb`` is either an add's ``AddCallback`` (``index`` -1)
    or, for an add of a write set, the ``QuorumAddCallback`` called
    ``cb(token, index, bookie id, exc)`` (``index`` >= 0, its ensemble index): no closure per
    bookie and entry on the add path."""

    __slots__ = ("cb", "conn", "deadline", "done", "fut", "index", "key", "next", "op", "request_id", "token")

    def __init__(
        self,
        conn: BookieConnection,
        op: int,
        key: tuple[int, int],
        request_id: int,
        cb: AddCallback | QuorumAddCallback | None,
        fut: asyncio.Future[Any] | None,
        deadline: float,
        token: Any = None,
        index: int = -1,
    ) -> None:
        self.conn = conn
        self.op = op
        self.key = key  # (ledger id, entry id)
        self.request_id = request_id  # 0 for v2 ADD/READ (matched by key)
        self.cb: Callable[..., None] | None = cb
        self.fut = fut
        # the request's timeout is the key of the connection's deque it is in (``timeouts``)
        self.deadline = deadline
        self.done = False
        # next request with the same (op, ledger, entry) key on this connection (v2 FIFO chain)
        self.next: Pending | None = None
        self.token = token
        self.index = index

    def describe(self) -> str:
        """``"<op> <ledger>:<entry> on <bookie>"`` (the context of every error message)."""
        name = m.OPCODE_NAMES.get(self.op, str(self.op))
        ledger_id, entry_id = self.key
        if self.op in (m.OP_ADD, m.OP_READ, m.OP_BATCH_READ):
            return f"{name} {ledger_id}:{entry_id} on {self.conn.bookie_id}"
        if self.op == m.OP_GET_BOOKIE_INFO:
            return f"{name} on {self.conn.bookie_id}"
        return f"{name} {ledger_id} on {self.conn.bookie_id}"

    def finish(self, exc: BaseException | None, value: Any = None) -> None:
        """Deliver the outcome (the caller has set ``done``)."""
        cb = self.cb
        if cb is not None:
            self.cb = None
            try:
                if self.index >= 0:
                    token, self.token = self.token, None
                    cb(token, self.index, self.conn.bookie_id, exc)
                else:
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


def parse_bookie_id(bookie_id: str) -> tuple[str, int]:
    host, sep, port = bookie_id.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise IncorrectParameterError(f"bookie id {bookie_id!r} is not host:port")
    if host.startswith("[") and host.endswith("]"):  # [ipv6]:port
        host = host[1:-1]
    return host, int(port)


class BookieConnection(asyncio.BufferedProtocol):
    """The connection to one bookie (see the module docstring)."""

    def __init__(self, client: ConnectionOwner, bookie_id: str, loop: asyncio.AbstractEventLoop) -> None:
        self.client = client
        self.bookie_id = bookie_id
        self.host, self.port = parse_bookie_id(bookie_id)  # a bad id fails the request at once
        self.loop = loop
        self.state = CONNECTING
        self.transport: asyncio.Transport | None = None
        # the TCP transport (``transport`` is the TLS one once START_TLS has upgraded it)
        self.tcp_transport: asyncio.BaseTransport | None = None
        # batch_adds: pipelined ADD answers come as one AddAnswers (columns), not an object each;
        # allocate_announced: a big answer (to a request of ours) gets its buffer once, at its size
        self.decoder = codec.FrameDecoder(client.settings.max_frame_size, side="client", batch_adds=True,
                                          allocate_announced=True)
        self.out: list[m.BytesLike] = []
        self.out_bytes = 0  # bytes in ``out`` (counted under TLS only)
        self.tls = client.settings.tls is not None  # frames go through TLS (read at every send and flush)
        self.flush_scheduled = False
        self.next_request_id = 0
        # v2 ops, keyed by (ledger id, entry id): head of the FIFO chain of pending requests
        self.adds: dict[tuple[int, int], Pending] = {}
        self.reads: dict[tuple[int, int], Pending] = {}
        # BATCH_READ and Vellum's ops, by request id
        self.by_id: dict[int, Pending] = {}
        # every request of this connection in issue order, one deque per timeout value (so
        # deadlines in a deque increase); answered ones are dropped lazily by the sweep
        self.timeouts: dict[float, deque[Pending]] = {}
        self.connect_task: asyncio.Task[None] | None = None
        # START_TLS and AUTH before the connection is up (client/handshake.py)
        self.handshake = Handshake(self, client.settings.tls, client.settings.auth, client.settings.start_tls_timeout_s)
        # done once the socket is gone (or was never opened); close() waits on it
        self.closed: asyncio.Future[None] = loop.create_future()
        self.closed.add_done_callback(lambda _f: client.gone(self))

    # ------------------------------------------------------------------------- lifecycle
    def start(self) -> None:
        self.connect_task = self.loop.create_task(self._connect())

    async def _connect(self) -> None:
        try:
            await asyncio.wait_for(
                self.loop.create_connection(lambda: self, self.host, self.port),
                self.client.settings.connect_timeout_s,
            )
            await self.handshake.run(lambda: self.state == CONNECTING)
            if self.state == CONNECTING and self.handshake.needed:
                self._up()
        except asyncio.CancelledError:
            # Cancelled by shutdown(), which has already failed the pending requests.
            if self.transport is not None:
                self.transport.close()
            self._socket_done()
            raise
        except NEGOTIATION_ERRORS as exc:
            err = self.handshake.failure(exc)
            if self.state != CLOSED:
                self.client.connect_failed(self.bookie_id, str(err))
                self.shutdown(err)
            self._socket_done()
        except Exception as exc:  # OSError (refused, unreachable), TimeoutError
            if self.state == CLOSED:  # shut down meanwhile (connection lost during START_TLS)
                self._socket_done()
                return
            reason = "timed out" if isinstance(exc, TimeoutError) else str(exc) or type(exc).__name__
            if self.transport is not None:
                reason = self.handshake.step(reason)
            self.client.connect_failed(self.bookie_id, reason)
            self.shutdown(
                BookieHandleNotAvailableError(f"cannot connect to bookie {self.bookie_id}: {reason}")
            )
            self._socket_done()

    def _socket_done(self) -> None:
        """After a failed or cancelled connect (the transport, if any, told to close): mark the
        connection ``closed`` if its socket is gone or going, i.e. it was never opened or its TCP
        transport is closing. A TLS transport that is closing still has its socket open, sending
        close_notify and waiting for the bookie's; ``connection_lost`` marks it ``closed`` once
        that ends, and ``BookieClient.close`` (which waits only for connections not yet
        ``closed``) cuts it short if it takes too long."""
        tcp = self.tcp_transport
        if (tcp is None or tcp.is_closing()) and not self.closed.done():
            self.closed.set_result(None)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A cast, not an isinstance check: uvloop's TCPTransport does not subclass asyncio.Transport.
        self.transport = transport = cast(asyncio.Transport, transport)
        self.tcp_transport = transport  # start_tls does not call connection_made again
        if self.state == CLOSED:  # shut down while connecting
            transport.close()
            return
        if self.handshake.needed:
            return  # up only after START_TLS and the handshake, and AUTH (_connect)
        self._up()

    def _up(self) -> None:
        self.state = CONNECTED
        self.client.connect_succeeded(self.bookie_id)
        if self.out:
            self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        err = self.handshake.lost(exc) if self.state == CONNECTING else None
        if err is not None:
            self.client.connect_failed(self.bookie_id, str(err))
            self.shutdown(err)
        else:
            why = f": {exc}" if exc else " (closed by the bookie)"
            self.shutdown(BookieHandleNotAvailableError(f"connection to bookie {self.bookie_id} lost{why}"))
        if not self.closed.done():
            self.closed.set_result(None)

    def shutdown(self, exc: VellumError) -> None:
        """Close the connection and fail everything pending on it with ``exc`` (idempotent)."""
        if self.state == CLOSED:
            return
        self.state = CLOSED
        self.client.forget(self)
        self.out = []
        self.out_bytes = 0
        if self.transport is not None:
            self.transport.close()
        elif self.connect_task is not None and asyncio.current_task() is not self.connect_task:
            self.connect_task.cancel()
        pending: list[Pending] = list(self.by_id.values())
        for table in (self.adds, self.reads):
            for head in table.values():
                p: Pending | None = head
                while p is not None:
                    pending.append(p)
                    p = p.next
        self.adds, self.reads, self.by_id, self.timeouts = {}, {}, {}, {}
        self.handshake.fail(exc)  # wakes _connect, which sees the connection closed
        for p in pending:
            if not p.done:
                p.done = True
                p.finish(exc)

    # ---------------------------------------------------------------------------- sending
    def send(self, parts: list[m.BytesLike]) -> None:
        self.out += parts
        if self.state != CONNECTED:
            return
        if self.tls:
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
        if out and self.transport is not None and self.state == CONNECTED:
            self.out = []
            self.out_bytes = 0
            # A TLS transport makes TLS records of each buffer: small frames go joined.
            self.transport.writelines(codec.coalesce(out) if self.tls else out)

    def new_request_id(self) -> int:
        self.next_request_id += 1
        return self.next_request_id

    # what the handshake needs of its connection (client/handshake.py, HandshakeLink)
    def is_closed(self) -> bool:
        return self.state == CLOSED

    def frames_buffered(self) -> bool:
        return bool(self.decoder.buffered)

    def bad_answer(self, reason: str) -> None:
        self._bad_answer(reason)

    def fail_security(self, err: SecurityError) -> None:
        """A security failure (refused, TLS required): back off and fail everything pending."""
        self.client.connect_failed(self.bookie_id, str(err))
        self.shutdown(err)

    # -------------------------------------------------------------------------- receiving
    def get_buffer(self, sizehint: int) -> memoryview:
        return self.decoder.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        try:
            messages: list[Any] = self.decoder.buffer_updated(nbytes)  # (no cast(): a call per read)
        except FramingError as exc:
            self._bad_answer(str(exc))
            return
        if self.state == CONNECTING:
            self.handshake.answer(messages)
            return
        for msg in messages:
            kind = type(msg)
            if kind is m.AddAnswers:
                self._answer_adds(msg.ledger_ids, msg.entry_ids, msg.statuses)
            elif kind is m.AddResponse:
                self._answer_adds((msg.ledger_id,), (msg.entry_id,), (msg.status,))
            elif kind is m.ReadResponse:
                self._answer_read(msg.ledger_id, msg.entry_id, msg.status, msg.entry)
            elif kind is m.BadFrame:
                self._bad_answer(msg.reason)
            elif kind is m.ErrorResponse:
                self._answer_error(msg)
            elif kind is m.AuthResponse:
                self.handshake.refused(msg.message)
            else:
                self._answer_by_id(msg)
            if self.state == CLOSED:
                return

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

    def _answer_adds(self, ledger_ids: Sequence[int], entry_ids: Sequence[int], statuses: Sequence[int]) -> None:
        """Match ADD answers (as columns, in arrival order) to the heads of their key chains:
        the add path's hot loop, one call per read of the socket rather than one per answer.
        Stops if a callback closed the connection (everything left was failed by ``shutdown``)."""
        adds = self.adds
        bookie_id = self.bookie_id
        for key, status in zip(zip(ledger_ids, entry_ids), statuses):
            p = adds.get(key)
            if p is None:
                log.debug("unexpected answer %d:%d from bookie %s: dropped", key[0], key[1], bookie_id)
                continue
            nxt = p.next
            if nxt is None:
                del adds[key]
            else:
                adds[key] = nxt
            if p.done:  # a timed-out request's placeholder absorbs its late answer
                continue
            p.done = True
            qcb = p.cb
            if status == EOK and p.index >= 0 and qcb is not None:  # an acked add of a write set: finish inlined
                p.cb = None
                token, p.token = p.token, None
                try:
                    qcb(token, p.index, bookie_id, None)
                except Exception:
                    log.exception("callback of %s raised", p.describe())
            elif status == EOK:
                p.finish(None)
            else:
                p.finish(error_for_wire_status(status, p.describe()))
            if self.state == CLOSED:
                return

    def _answer_read(self, ledger_id: int, entry_id: int, status: int, value: Any) -> None:
        reads = self.reads
        key = (ledger_id, entry_id)
        p = reads.get(key)
        if p is None:
            log.debug("unexpected answer %d:%d from bookie %s: dropped", ledger_id, entry_id, self.bookie_id)
            return
        nxt = p.next
        if nxt is None:
            del reads[key]
        else:
            reads[key] = nxt
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
            value = msg.entries  # FrameEntries: one buffer and the entries' offsets
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
        if p.op != RESPONSE_OPS.get(kind):
            p.finish(
                BookieHandleNotAvailableError(
                    f"bookie {self.bookie_id} answered {p.describe()} with a {kind.__name__}"
                )
            )
            return
        p.finish(None, value)

    def _answer_error(self, msg: m.ErrorResponse) -> None:
        if msg.opcode == m.OP_START_TLS and msg.request_id is None:
            self.handshake.tls_required()
            return
        p: Pending | None = None
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
        expired: list[tuple[Pending, float]] | None = None
        emptied: list[float] | None = None
        timeouts = self.timeouts
        for timeout_s, dq in timeouts.items():
            popleft = dq.popleft
            while dq:
                p = dq[0]
                if p.done:
                    popleft()
                elif p.deadline <= now:
                    popleft()
                    if expired is None:
                        expired = []
                    expired.append((p, timeout_s))
                else:
                    break
            if not dq:
                if emptied is None:
                    emptied = []
                emptied.append(timeout_s)
        if emptied is not None:
            for timeout_s in emptied:
                del timeouts[timeout_s]
        if expired is not None:
            for p, timeout_s in expired:
                if not p.done:
                    self.expire(p, timeout_s)
        return bool(self.timeouts)

    def expire(self, p: Pending, timeout_s: float) -> None:
        p.done = True
        if p.request_id:
            self.by_id.pop(p.request_id, None)
        # v2 ops stay in their chain: the spent placeholder absorbs a late answer.
        p.finish(TimeoutError_(f"{p.describe()} timed out after {timeout_s:g}s"))


RESPONSE_OPS: dict[type, int] = {
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
