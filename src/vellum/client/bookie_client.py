"""Talking to bookies: one pooled, pipelined connection per bookie, shared by every ledger.

Responsibility: turn client operations (add, read, fencing read, batch read, LAC reads, explicit
LAC, force, list entries, bookie info, advisory ledger close, trim) into wire frames
(``vellum.proto``) on a connection to the right bookie, and turn the bookie's answers back into
results or :mod:`vellum.errors` exceptions. Everything runs on one asyncio loop; nothing here
blocks or spawns threads.

Connections (``BookieConnection``, an ``asyncio.BufferedProtocol`` reading into a ``FrameDecoder``:
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
* START_TLS and authentication (a client made with ``tls`` or ``auth``): a new connection is
  up only once its ``Handshake`` (``client/handshake.py``) has negotiated them; what it
  refuses fails everything pending with a :class:`SecurityError`.

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

Parts: ``BookieClient`` here (the pool, the reconnect backoff, the timeout sweep, one method per
operation building its frame and mapping its answer); one connection (framing, matching,
timeouts of one socket) is ``client/bookie_connection.py``; START_TLS and authentication of a
new connection are ``client/handshake.py``.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Final

from vellum.client.bookie_connection import (
    CONNECTED,
    AddCallback,
    BookieConnection,
    ConnectionSettings,
    Pending,
    QuorumAddCallback,
)
from vellum.client.bookie_connection import (
    TLS_FLUSH_BYTES as TLS_FLUSH_BYTES,  # the slice size, with the docstring
)
from vellum.client.bookie_upkeep_ops import DEFAULT_TIMEOUT_S, BookieUpkeepOps
from vellum.errors import (
    BookieHandleNotAvailableError,
    ClientClosedError,
    IncorrectParameterError,
    VellumError,
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
#: BookKeeper's startTLSTimeoutSecs default
DEFAULT_START_TLS_TIMEOUT_S: Final = 10.0

_ENTRY_IDS = struct.Struct(">qq")  # first 16 bytes of a stored entry: ledgerId, entryId
#: one bookie of a batch of adds (``BookieClient._batch_target``)
_BatchTarget = tuple[BookieConnection, dict[tuple[int, int], Pending], deque[Pending], list[m.BytesLike]]



class BookieClient(BookieUpkeepOps):
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
        self.settings = ConnectionSettings(connect_timeout_s, max_frame_size, tls, auth, start_tls_timeout_s)
        self._backoff_initial_s = reconnect_backoff_s
        self._backoff_max_s = max_reconnect_backoff_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._conns: dict[str, BookieConnection] = {}
        self._all_conns: set[BookieConnection] = set()  # including closing ones, for close()
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

    def _connection(self, bookie_id: str) -> BookieConnection:
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
        conn = BookieConnection(self, bookie_id, loop)
        self._conns[bookie_id] = conn
        self._all_conns.add(conn)
        conn.start()
        return conn

    # what a connection needs of its owner (client/bookie_connection.py, ConnectionOwner)
    def forget(self, conn: BookieConnection) -> None:
        if self._conns.get(conn.bookie_id) is conn:
            del self._conns[conn.bookie_id]

    def gone(self, conn: BookieConnection) -> None:
        self._all_conns.discard(conn)

    def connect_failed(self, bookie_id: str, reason: str) -> None:
        previous = self._backoff.get(bookie_id)
        delay = self._backoff_initial_s if previous is None else min(previous[1] * 2, self._backoff_max_s)
        self._backoff[bookie_id] = (self._get_loop().time() + delay, delay, reason)

    def connect_succeeded(self, bookie_id: str) -> None:
        self._backoff.pop(bookie_id, None)

    def is_connected(self, bookie_id: str) -> bool:
        """True if a connection to ``bookie_id`` is up (not merely being opened)."""
        conn = self._conns.get(bookie_id)
        return conn is not None and conn.state == CONNECTED

    # --------------------------------------------------------------------------- requests
    def _deadlines(self, conn: BookieConnection, timeout_s: float) -> deque[Pending]:
        """The deque of ``conn``'s requests with ``timeout_s`` (in issue order, so by deadline),
        with the sweep armed: every request goes in one."""
        dq = conn.timeouts.get(timeout_s)
        if dq is None:
            dq = conn.timeouts[timeout_s] = deque()
        if self._sweep_handle is None:
            self._sweep_handle = conn.loop.call_later(_SWEEP_INTERVAL_S, self._sweep)
        return dq

    def _submit_v2(
        self,
        bookie_id: str,
        op: int,
        ledger_id: int,
        entry_id: int,
        parts: list[m.BytesLike],
        cb: AddCallback | QuorumAddCallback | None,
        fut: asyncio.Future[Any] | None,
        timeout_s: float,
        token: Any = None,
        index: int = -1,
    ) -> None:
        """Send a v2 ADD or READ: chain its request under its (ledger, entry) key, put it in its
        timeout deque and queue its frame. Raises if the bookie cannot be asked now
        (``_connection``)."""
        conn = self._conns.get(bookie_id)
        if conn is None:
            conn = self._connection(bookie_id)
        key = (ledger_id, entry_id)
        p = Pending(conn, op, key, 0, cb, fut, conn.loop.time() + timeout_s, token, index)
        table = conn.adds if op == m.OP_ADD else conn.reads
        head = table.get(key)
        if head is None:
            table[key] = p
        else:  # same key already in flight: answers come back in order, append to the chain
            while head.next is not None:
                head = head.next
            head.next = p
        dq = conn.timeouts.get(timeout_s)
        if dq is None or self._sweep_handle is None:
            dq = self._deadlines(conn, timeout_s)
        dq.append(p)
        conn.send(parts)

    def _submit_by_id(
        self,
        bookie_id: str,
        op: int,
        ledger_id: int,
        entry_id: int,
        build: Callable[[int], list[m.BytesLike]],
        timeout_s: float,
    ) -> asyncio.Future[Any]:
        """A request matched by its id, its frame made by ``build(request_id)``; a failure known
        at once (closed client, bookie in reconnect backoff) comes back as an already failed
        future, as in ``read_future``."""
        try:
            conn = self._connection(bookie_id)
        except VellumError as exc:
            failed: asyncio.Future[Any] = self._get_loop().create_future()
            failed.set_exception(exc)
            return failed
        request_id = conn.new_request_id()
        parts = build(request_id)
        loop = conn.loop
        fut: asyncio.Future[Any] = loop.create_future()
        p = Pending(conn, op, (ledger_id, entry_id), request_id, None, fut, loop.time() + timeout_s)
        conn.by_id[request_id] = p
        self._deadlines(conn, timeout_s).append(p)
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
        for conn in tuple(self._conns.values()):
            if conn.timeouts:
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
            parts = codec.encode_add_request(master_key, entry, m.FLAG_RECOVERY_ADD if recovery else 0)
            self._submit_v2(bookie_id, m.OP_ADD, ledger_id, entry_id, parts, callback, None, timeout_s)
        except (VellumError, struct.error) as exc:
            err: BaseException = exc
            if isinstance(exc, struct.error):
                err = IncorrectParameterError(
                    f"ADD on {bookie_id}: entry of {len(entry)} bytes has no header"
                )
            self._get_loop().call_soon(callback, err)

    def add_quorum_cb(
        self,
        ensemble: Sequence[str],
        indexes: Sequence[int],
        master_key: bytes,
        entry: m.BytesLike,
        recovery: bool,
        callback: QuorumAddCallback,
        token: Any,
        timeout_s: float,
    ) -> None:
        """``add_cb`` of one entry to the bookies ``ensemble[i]`` for ``i`` in ``indexes`` (an
        entry's write set): the frame is built once and the same buffers go to every bookie,
        and each bookie's outcome is ``callback(token, i, ensemble[i], None | exc)``, once, on
        the loop thread (no closure per bookie and entry). A bookie that cannot be asked now
        fails only its own callback, through ``call_soon`` like every failure known at once."""
        try:
            ledger_id, entry_id = _ENTRY_IDS.unpack_from(entry)
            parts = codec.encode_add_request(master_key, entry, m.FLAG_RECOVERY_ADD if recovery else 0)
        except (VellumError, struct.error) as exc:
            err: BaseException = exc
            if isinstance(exc, struct.error):
                err = IncorrectParameterError(
                    f"ADD on {', '.join(ensemble[i] for i in indexes)}: entry of {len(entry)} bytes has no header"
                )
            for i in indexes:
                self._get_loop().call_soon(callback, token, i, ensemble[i], err)
            return
        for i in indexes:
            try:
                self._submit_v2(ensemble[i], m.OP_ADD, ledger_id, entry_id, parts, callback, None, timeout_s,
                                token, i)
            except VellumError as exc:
                self._get_loop().call_soon(callback, token, i, ensemble[i], exc)

    def add_quorum_batch_cb(
        self,
        ensemble: Sequence[str],
        write_sets: Sequence[Sequence[int]],
        master_key: bytes,
        entries: Sequence[m.BytesLike],
        recovery: bool,
        callback: QuorumAddCallback,
        tokens: Sequence[Any],
        timeout_s: float,
    ) -> None:
        """:meth:`add_quorum_cb` of many entries at once: ``entries[k]`` goes to the bookies
        ``ensemble[i]`` for ``i`` in ``write_sets[k]`` and each bookie's outcome is
        ``callback(tokens[k], i, ensemble[i], None | exc)``, once, on the loop thread.

        Still one ADD request per entry and bookie on the wire, each with its own pending
        request, key chain and deadline (the same timeout semantics as one call per entry);
        what is done once per batch instead of once per entry is finding each bookie's
        connection, reading the clock and queueing the frames on each connection (one
        ``send`` per bookie per batch outside TLS; under TLS one per entry, so that a burst
        still leaves in slices as it is queued)."""
        loop = self._get_loop()
        flags = m.FLAG_RECOVERY_ADD if recovery else 0
        encode_head = codec.encode_add_head
        unpack = _ENTRY_IDS.unpack_from
        tls = self.settings.tls is not None
        # ensemble index -> (connection, its ADD key table, its timeout deque, its queued parts),
        # or in ``failed`` the reason it cannot be asked now
        targets: dict[int, _BatchTarget] = {}
        failed: dict[int, VellumError] = {}
        deadline = loop.time() + timeout_s
        # An ADD's frame head depends on the entry's length only (the key and flags are the
        # batch's): entries of one length (one-row entries of fixed-size rows) share one head.
        heads: dict[int, m.BytesLike] = {}
        new_pending = object.__new__
        op_add = m.OP_ADD
        for write_set, entry, token in zip(write_sets, entries, tokens, strict=True):
            try:
                ledger_id, entry_id = unpack(entry)
                size = len(entry)
                frame_head = heads.get(size)
                if frame_head is None:
                    frame_head = heads[size] = encode_head(master_key, size, flags)
                parts = [frame_head, entry]
            except (VellumError, struct.error) as exc:
                err: BaseException = exc
                if isinstance(exc, struct.error):
                    err = IncorrectParameterError(
                        f"ADD on {', '.join(ensemble[i] for i in write_set)}: entry of {len(entry)} bytes has no header"
                    )
                for i in write_set:
                    loop.call_soon(callback, token, i, ensemble[i], err)
                continue
            key = (ledger_id, entry_id)
            for i in write_set:
                target = targets.get(i)
                if target is None:  # first time this bookie is seen in the batch, or it cannot be asked
                    failure = failed.get(i)
                    if failure is None:
                        found = self._batch_target(ensemble[i], timeout_s)
                        if isinstance(found, VellumError):
                            failure = failed[i] = found
                        else:
                            target = targets[i] = found
                    if failure is not None:
                        loop.call_soon(callback, token, i, ensemble[i], failure)
                        continue
                    assert target is not None
                conn, table, dq, out = target
                # Pending(conn, OP_ADD, key, 0, callback, None, deadline, token, i), its slots
                # set here: the constructor's call is a third of a request's cost on this path
                # (tests/client/test_bookie_client.py checks the two alike)
                p = new_pending(Pending)
                p.conn = conn
                p.op = op_add
                p.key = key
                p.request_id = 0
                p.cb = callback
                p.fut = None
                p.deadline = deadline
                p.done = False
                p.next = None
                p.token = token
                p.index = i
                head = table.setdefault(key, p)
                if head is not p:  # same key already in flight: answers come back in order
                    while head.next is not None:
                        head = head.next
                    head.next = p
                dq.append(p)
                if tls:
                    conn.send(parts)
                else:
                    out += parts
        for conn, _table, _dq, out in targets.values():
            if out:
                conn.send(out)

    def _batch_target(self, bookie_id: str, timeout_s: float) -> _BatchTarget | VellumError:
        """A bookie of a batch of adds: its connection, its ADD key table, the deque its
        requests' deadlines go to (the sweep armed), and the list its frames are gathered in;
        or why it cannot be asked."""
        try:
            conn = self._connection(bookie_id)
        except VellumError as exc:
            return exc
        return conn, conn.adds, self._deadlines(conn, timeout_s), []

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
        parts = codec.encode_read_request(ledger_id, entry_id, flags, fence_master_key)
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
            parts = codec.encode_read_request(ledger_id, entry_id)
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
    ) -> m.FrameEntries:
        """BATCH_READ: consecutive stored entries from ``start_entry_id`` (at least one, or
        NoSuchEntryError), at most ``max_count`` entries / ``max_size`` bytes."""
        result: m.FrameEntries = await self.batch_read_future(bookie_id, ledger_id, start_entry_id, max_count,
                                                              max_size, timeout_s=timeout_s)
        return result

    def batch_read_future(
        self,
        bookie_id: str,
        ledger_id: int,
        start_entry_id: int,
        max_count: int,
        max_size: int,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> asyncio.Future[m.FrameEntries]:
        """:meth:`batch_read` as a future, without a coroutine or task (as :meth:`read_future`)."""
        return self._submit_by_id(
            bookie_id,
            m.OP_BATCH_READ,
            ledger_id,
            start_entry_id,
            lambda rid: codec.encode_parts(m.BatchReadRequest(ledger_id, start_entry_id, rid, max_count, max_size)),
            timeout_s,
        )

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
    ) -> m.FrameEntries:
        """READ_STRIDED: stored entries ``first, first + stride, ...`` (at least one, or
        NoSuchEntryError), at most ``max_count`` entries / about ``max_size`` bytes."""
        fut = self._submit_by_id(
            bookie_id,
            m.OP_READ_STRIDED,
            ledger_id,
            first_entry_id,
            lambda rid: codec.encode_strided_read_request(rid, ledger_id, first_entry_id, stride, max_count, max_size),
            timeout_s,
        )
        result: m.FrameEntries = await fut
        return result

    async def read_lac(
        self, bookie_id: str, ledger_id: int, *, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> tuple[bytes, bytes]:
        """``(explicit LAC body, last stored entry)`` of the ledger on the bookie; either may be b""."""
        result: tuple[bytes, bytes] = await self.read_lac_future(bookie_id, ledger_id, timeout_s=timeout_s)
        return result

    def read_lac_future(
        self, bookie_id: str, ledger_id: int, *, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> asyncio.Future[tuple[bytes, bytes]]:
        """:meth:`read_lac` as a future, without a coroutine or task (as :meth:`read_future`)."""
        return self._submit_by_id(
            bookie_id, m.OP_READ_LAC, ledger_id, -1, lambda rid: codec.encode_read_lac_request(rid, ledger_id), timeout_s
        )

    async def long_poll_lac(
        self, bookie_id: str, ledger_id: int, previous_lac: int, timeout_ms: int
    ) -> tuple[bytes, bytes]:
        """Like :meth:`read_lac`, but the bookie holds the answer until its LAC for the ledger
        passes ``previous_lac`` or ``timeout_ms`` elapse (then it answers with what it has)."""
        result: tuple[bytes, bytes] = await self.long_poll_lac_future(bookie_id, ledger_id, previous_lac, timeout_ms)
        return result

    def long_poll_lac_future(
        self, bookie_id: str, ledger_id: int, previous_lac: int, timeout_ms: int
    ) -> asyncio.Future[tuple[bytes, bytes]]:
        """:meth:`long_poll_lac` as a future, without a coroutine or task (as :meth:`read_future`)."""
        return self._submit_by_id(
            bookie_id,
            m.OP_LONG_POLL_READ_LAC,
            ledger_id,
            -1,
            lambda rid: codec.encode_parts(m.LongPollReadLacRequest(rid, ledger_id, previous_lac, timeout_ms)),
            timeout_ms / 1000.0 + LONG_POLL_MARGIN_S,
        )

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
            lambda rid: codec.encode_parts(m.WriteLacRequest(rid, ledger_id, lac, master_key, lac_body)),
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
            lambda rid: codec.encode_parts(m.ForceLedgerRequest(rid, ledger_id)),
            timeout_s,
        )
        await fut

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
