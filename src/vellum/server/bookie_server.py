"""The bookie's network server: asyncio (uvloop) connections speaking the wire protocol.

Each connection decodes frames (``proto``), hands the work to ``AsyncBookie`` and writes the
answers back. Invariants:
- an ADD is answered only when the bookie reports the journal fsync covering it (the bookie's
  callback), a fencing READ only once the fence is durable;
- adds and reads in progress are bounded (``maxAddsInProgressLimit``,
  ``maxReadsInProgressLimit``, per bookie): past the bound a request is answered
  ETOOMANYREQUESTS at once, so memory stays bounded under overload;
- a frame with intact framing but bad contents gets an error answer and the connection keeps
  serving; broken framing (bad length) closes that connection only;
- responses are coalesced: everything ready in one loop iteration leaves in one write;
- the bookie is reached only through ``AsyncBookie`` (the thread<->loop seam), never directly;
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

A request refused for its master key (EUA: wrong key, or a new ledger's key its metadata does
not give) is logged with the ledger id, the request and the peer, never the key, at most one
line per ``KEY_REFUSAL_LOG_INTERVAL_S`` per process (the next line counts those left out): a
flood of bad keys cannot flood the log.

Metrics: each server counts with plain ints on the loop thread (``server/metrics.py``), so
that two servers in one process keep their own counts.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from vellum.bookie.executor import AsyncBookie
from vellum.errors import (
    EBADREQ,
    ENOENTRY,
    ENOLEDGER,
    EOK,
    ETOOMANYREQUESTS,
    EUA,
    FramingError,
    NoSuchEntryError,
    NoSuchLedgerError,
    SecurityError,
    UnauthorizedAccessError,
    VellumError,
    wire_status_for,
)
from vellum.proto import codec
from vellum.proto import messages as m
from vellum.security.auth import BookieAuthenticator, Identity
from vellum.security.tls import ReloadingContext, peer_principal
from vellum.server import guard as g
from vellum.server.guard import ConnectionGuard, PeerLimits, RefusalLog
from vellum.server.metrics import ServerCounters, ServerMetrics, process_server_metrics

log = logging.getLogger(__name__)

_LAC_OF_ENTRY = struct.Struct(">q")
#: an ADD response frame: length, header, status, ledger id, entry id
_ADD_OK = struct.Struct(">iIiqq")
_ADD_RESPONSE_HEADER = (m.PROTOCOL_VERSION << 24) | (m.OP_ADD << 16)
#: a TLS handshake that does not complete in this time closes the connection
TLS_HANDSHAKE_TIMEOUT_S = 10.0
#: at most one "master key refused" line per this many seconds (per process)
KEY_REFUSAL_LOG_INTERVAL_S = 5.0


class _KeyRefusalLog:
    """Rate-limited warnings for requests refused for their master key (loop thread only)."""

    def __init__(self, interval_s: float) -> None:
        self._interval_s = interval_s
        self._last = float("-inf")
        self._left_out = 0

    def note(self, what: str, ledger_id: int, peer: str, exc: BaseException) -> None:
        now = time.monotonic()
        if now - self._last < self._interval_s:
            self._left_out += 1
            return
        more = f" ({self._left_out} more refused since the last such line)" if self._left_out else ""
        self._last, self._left_out = now, 0
        log.warning("master key refused: %s of ledger %d from %s: %s%s", what, ledger_id, peer, exc, more)


_KEY_REFUSALS = _KeyRefusalLog(KEY_REFUSAL_LOG_INTERVAL_S)


@dataclass(frozen=True)
class ServerLimits:
    max_adds_in_progress: int = 10000  # 0 = unlimited (BookKeeper's meaning)
    max_reads_in_progress: int = 10000
    max_frame_size: int = m.DEFAULT_MAX_FRAME_SIZE
    #: what unauthenticated and idle connections may cost
    peers: PeerLimits = field(default_factory=PeerLimits)


class _Counters(ServerCounters):
    """Per-bookie counts shared by all connections (the loop thread only), and the admission
    of adds and reads against the in-progress limits."""

    __slots__ = ("limits",)

    def __init__(self, limits: ServerLimits) -> None:
        super().__init__()
        self.limits = limits

    def try_add(self) -> bool:
        limit = self.limits.max_adds_in_progress
        if limit and self.adds >= limit:
            return False
        self.adds += 1
        return True

    def try_read(self) -> bool:
        limit = self.limits.max_reads_in_progress
        if limit and self.reads >= limit:
            return False
        self.reads += 1
        return True


class BookieConnection(asyncio.BufferedProtocol):
    """One client connection. Reads go straight into the frame decoder's buffers (an ADD of a
    big entry lands in a buffer of its own and is journaled and cached from there, uncopied)."""

    def __init__(self, bookie: AsyncBookie, counters: _Counters, on_close: Callable[[BookieConnection], None],
                 tls: ReloadingContext | None = None, auth: BookieAuthenticator | None = None,
                 guard: ConnectionGuard | None = None) -> None:
        self._bookie = bookie
        self._counters = counters
        # The server's counters, held here so that counting a request costs one lookup.
        self._requests = counters.requests
        self._rejected = counters.rejected
        self._on_close = on_close
        # Pipelined ADDs of one read come decoded together (``AddBatch``), to go to the bookie
        # and back as one batch.
        limits = counters.limits
        # Trusted = upgraded to TLS when required and authenticated when authentication is on.
        self._trusted = tls is None and auth is None
        self._decoder = codec.FrameDecoder(
            limits.max_frame_size if self._trusted else min(limits.max_frame_size,
                                                            limits.peers.unauthenticated_max_frame_size),
            side="server", batch_adds=True)
        self._guard = guard if guard is not None else ConnectionGuard(
            limits.peers, RefusalLog(limits.peers.refusal_log_period_s, counters.refused), counters=counters)
        self._refusals = self._guard.refusals
        # bytes came or went since the guard last looked (idle timeout)
        self._active = False
        self._transport: asyncio.Transport | None = None
        self._out: list[bytes | bytearray | memoryview] = []
        self._flush_scheduled = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loop = asyncio.get_running_loop()
        # FORCE_LEDGER: adds issued / completed per ledger on this connection.
        self._issued: dict[int, int] = {}
        self._completed: dict[int, int] = {}
        self._force_waiters: list[tuple[int, int, Callable[[], None]]] = []
        self._handlers: dict[type, Callable[[Any], None]] = {
            m.ReadRequest: self._on_read,
            m.BatchReadRequest: self._on_batch_read,
            m.StridedReadRequest: self._on_strided_read,
            m.LongPollReadLacRequest: self._on_long_poll,
            m.ReadLacRequest: self._on_read_lac,
            m.WriteLacRequest: self._on_write_lac,
            m.ForceLedgerRequest: self._on_force,
            m.ListEntriesRequest: self._on_list_entries,
            m.GetBookieInfoRequest: self._on_bookie_info,
            m.LedgerClosedNote: self._on_ledger_closed,
            m.TrimRequest: self._on_trim,
            m.CollectRequest: self._on_collect,
            m.StartTlsRequest: self._on_start_tls,
            m.AuthRequest: self._on_auth,
            m.BadFrame: self._on_bad_frame,
        }
        self._tls = tls
        # True while this bookie requires TLS and the connection is not upgraded yet: every
        # request then goes through _before_tls instead of the handlers.
        self._awaiting_tls = tls is not None
        self._upgrading = False
        self._early: list[Any] = []
        self._upgrade_started = 0.0
        #: identity from the peer's certificate after a mutual-TLS handshake (for authorization)
        self.principal: str | None = None
        self.roles: tuple[str, ...] = ()
        self._auth = auth
        # False while authentication is on and this connection has not proved an authorized
        # identity: every request then goes through _before_auth.
        self._authorized = auth is None
        self._cert_identity: Identity | None = None
        #: who the connection is authenticated as (None without authentication)
        self.identity: Identity | None = None
        self._closing = False

    # ---------------------------------------------------------------------------- transport
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses but have the same interface.
        self._transport = cast(asyncio.Transport, transport)
        self._counters.connections += 1
        self._guard.accepted(self, authenticated=self._trusted)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._upgrading and not self._closing:
            # The TLS transport gave up (its handshake timeout) or the peer left mid-handshake:
            # the upgrade task is cancelled below without seeing an error, so say it here.
            elapsed = self._loop.time() - self._upgrade_started
            reason = (f"no handshake within {TLS_HANDSHAKE_TIMEOUT_S:g}s" if elapsed >= TLS_HANDSHAKE_TIMEOUT_S * 0.9
                      else f"the connection closed during the handshake ({exc or 'by the peer'})")
            self._closing = True
            self._refusals.refused(g.TLS_HANDSHAKE, self.peer_host(),
                                   f"TLS handshake with {self._peer()} failed: {reason}", reason.split(" (")[0])
        self._counters.connections -= 1
        self._guard.closed(self)
        self._transport = None
        for task in list(self._tasks):
            task.cancel()
        self._on_close(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._decoder.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self._active = True
        try:
            messages = self._decoder.buffer_updated(nbytes)
        except FramingError as e:
            if self._trusted:
                self.close_for(g.BAD_FRAMING, f"closing connection {self._peer()}: {e}")
            else:
                self.close_for(g.FRAME_TOO_BIG, (
                    f"closing unauthenticated connection {self._peer()}: {e}; before authenticating a peer may "
                    f"send frames of {self._decoder.max_frame_size} bytes at most (unauthenticatedMaxFrameSizeBytes)"))
            return
        if self._closing:
            return
        if self._awaiting_tls or not self._authorized:
            # The slow paths (refusals, the TLS upgrade, authentication) see single requests.
            messages = _unbatched(messages)
        if self._awaiting_tls:
            if self._upgrading:
                # Decrypted requests that arrived as the handshake completed, before the
                # upgrade task resumed: served once the TLS transport is in place. (Reading in
                # clear stopped at START_TLS, so these come through TLS.)
                self._early += messages
            else:
                self._before_tls(messages)
            return
        self._serve(messages)

    def _serve(self, messages: list[Any]) -> None:
        if self._authorized:
            self._dispatch(messages)
        elif not self._closing:
            self._before_auth(messages)

    def _dispatch(self, messages: list[Any]) -> None:
        handlers = self._handlers
        adds: list[m.AddRequest] = []
        for msg in messages:
            if type(msg) is m.AddBatch:
                if adds:
                    self._add_batch(adds)
                    adds = []
                self._add_decoded_batch(msg)
                continue
            if type(msg) is m.AddRequest:
                # Pipelined adds that arrived together go to the bookie as one batch (one
                # journal queue operation, one completion), in arrival order.
                adds.append(msg)
                continue
            if adds:
                self._add_batch(adds)
                adds = []
            handler = handlers.get(type(msg))
            if handler is None:
                self._send(m.ErrorResponse(EBADREQ))
                continue
            try:
                handler(msg)
            except Exception:  # a bug in one request must not take the connection down
                log.exception("request %r failed", type(msg).__name__)
        if adds:
            self._add_batch(adds)

    def _note_key_refusal(self, exc: BaseException, what: str, ledger_id: int) -> None:
        if isinstance(exc, UnauthorizedAccessError):
            who = f" ({self.identity.describe()})" if self.identity is not None else ""
            _KEY_REFUSALS.note(what, ledger_id, self._peer() + who, exc)

    def _peer(self) -> str:
        if self._transport is None:
            return "?"
        return str(self._transport.get_extra_info("peername"))

    def _send(self, msg: Any) -> None:
        if self._transport is None:
            return
        self._out.extend(codec.encode_parts(msg))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._out and self._transport is not None:
            self._active = True
            out, self._out = self._out, []
            # A TLS transport makes TLS records of each buffer: small answers go joined.
            self._transport.writelines(codec.coalesce(out) if self._tls is not None else out)

    def _spawn(self, coro: Any) -> None:
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

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
        return bool(self._tasks) or bool(self._force_waiters) or self._issued != self._completed

    def take_activity(self) -> bool:
        """Whether bytes came or went since the last call."""
        active, self._active = self._active, False
        return active

    def close_for(self, reason: str, message: str, detail: str = "") -> None:
        """Close this connection once what is queued is written: counted under ``reason`` and
        logged (``message``) rate-limited per (reason, peer address, ``detail``)."""
        if self._closing:
            return
        self._closing = True
        self._refusals.refused(reason, self.peer_host(), message, detail)
        self._flush()
        if self._transport is not None:
            self._transport.close()

    def _check_trusted(self) -> None:
        """Once upgraded (if TLS is required) and authenticated (if authentication is on): the
        full frame size applies and the connection leaves the unauthenticated budget."""
        if self._trusted or self._awaiting_tls or not self._authorized:
            return
        self._trusted = True
        self._decoder.max_frame_size = self._counters.limits.max_frame_size
        self._guard.authenticated(self)

    # ------------------------------------------------------------------------------- ADD
    def _add_batch(self, reqs: list[m.AddRequest]) -> None:
        """Admit a batch of ADDs (past the in-progress bound: TOOMANYREQUESTS at once), hand
        the rest to the bookie, answer refusals at once and the others when durable."""
        self._requests["ADD"] += len(reqs)
        counters = self._counters
        admitted: list[m.AddRequest] = []
        for req in reqs:
            if counters.try_add():
                admitted.append(req)
            else:
                self._rejected["ADD"] += 1
                self._send(m.AddResponse(ETOOMANYREQUESTS, req.ledger_id, req.entry_id))
        if not admitted:
            return
        issued = self._issued
        for req in admitted:
            issued[req.ledger_id] = issued.get(req.ledger_id, 0) + 1

        def on_result(refused: list[BaseException | None], exc: BaseException | None) -> None:
            self._answer_refused(admitted, refused, exc)

        self._bookie.add_entries_cb([(r.entry, bytes(r.master_key), r.is_recovery) for r in admitted], on_result)

    def _add_decoded_batch(self, batch: m.AddBatch) -> None:
        """``_add_batch`` for the pipelined ADDs of one read, decoded together: admitted and
        counted as a whole, handed to the bookie as one batch, and answered, once durable,
        with one buffer of responses."""
        n = len(batch.entries)
        counters = self._counters
        limit = counters.limits.max_adds_in_progress
        if limit and counters.adds + n > limit:
            self._add_batch(batch.requests())  # some are refused: one by one
            return
        self._requests["ADD"] += n
        counters.adds += n
        ledger_ids, entry_ids = batch.ledger_ids, batch.entry_ids
        _count_by_ledger(self._issued, ledger_ids)

        def on_result(refused: list[BaseException | None], exc: BaseException | None) -> None:
            if exc is None and refused.count(None) == n:
                counters.adds -= n
                _count_by_ledger(self._completed, ledger_ids)
                if self._transport is not None:
                    pack = _ADD_OK.pack
                    self._out.append(b"".join([pack(24, _ADD_RESPONSE_HEADER, EOK, lid, eid)
                                               for lid, eid in zip(ledger_ids, entry_ids)]))
                    if not self._flush_scheduled:
                        self._flush_scheduled = True
                        self._loop.call_soon(self._flush)
                if self._force_waiters:
                    self._check_force_waiters()
                return
            self._answer_refused(batch.requests(), refused, exc)

        self._bookie.add_entries_cb(list(zip(batch.entries, batch.keys, batch.recovery())), on_result)

    def _answer_refused(self, reqs: list[m.AddRequest], refused: list[BaseException | None],
                        exc: BaseException | None) -> None:
        status = EOK if exc is None else wire_status_for(exc)
        if exc is not None and not isinstance(exc, VellumError):
            log.error("adds failed: %r", exc)
        accepted = []
        for req, why in zip(reqs, refused):
            if why is None:
                accepted.append(req)
            else:
                self._note_key_refusal(why, f"ADD of entry {req.entry_id}", req.ledger_id)
                self._answer_adds([req], wire_status_for(why))
        if accepted:
            self._answer_adds(accepted, status)

    def _answer_adds(self, reqs: list[m.AddRequest], status: int) -> None:
        self._counters.adds -= len(reqs)
        completed = self._completed
        for req in reqs:
            completed[req.ledger_id] = completed.get(req.ledger_id, 0) + 1
            self._send(m.AddResponse(status, req.ledger_id, req.entry_id))
        if self._force_waiters:
            self._check_force_waiters()

    # ------------------------------------------------------------------------------ READ
    def _on_read(self, req: m.ReadRequest) -> None:
        self._requests["READ_FENCE" if req.is_fencing else "READ"] += 1
        if not req.is_fencing:
            # Entries in memory are answered on the loop; only disk reads go to a reader thread.
            cached = self._bookie.read_cached_entry(req.ledger_id, req.entry_id)
            if cached is not None:
                self._send(m.ReadResponse(EOK, req.ledger_id, req.entry_id, cached))
                return
        if not self._counters.try_read():
            self._rejected["READ"] += 1
            self._send(m.ReadResponse(ETOOMANYREQUESTS, req.ledger_id, req.entry_id))
            return
        self._spawn(self._read(req))

    async def _read(self, req: m.ReadRequest) -> None:
        try:
            if req.is_fencing:
                assert req.master_key is not None
                await self._bookie.fence(req.ledger_id, bytes(req.master_key))
            entry = await self._bookie.read_entry(req.ledger_id, req.entry_id)
            self._send(m.ReadResponse(EOK, req.ledger_id, req.entry_id, entry))
        except Exception as e:
            # Includes ENOENTRY/ENOLEDGER after a fence of a ledger this bookie holds nothing of:
            # the fence itself is durable, the reader learns there is no entry.
            self._note_key_refusal(e, "fencing READ", req.ledger_id)
            self._send(m.ReadResponse(wire_status_for(e), req.ledger_id, req.entry_id))
        finally:
            self._counters.reads -= 1

    def _on_batch_read(self, req: m.BatchReadRequest) -> None:
        self._requests["BATCH_READ"] += 1
        if not self._counters.try_read():
            self._rejected["BATCH_READ"] += 1
            self._send(m.BatchReadResponse(ETOOMANYREQUESTS, req.ledger_id, req.start_entry_id, req.request_id))
            return
        self._spawn(self._batch_read(req))

    async def _batch_read(self, req: m.BatchReadRequest) -> None:
        try:
            if req.is_fencing:
                assert req.master_key is not None
                await self._bookie.fence(req.ledger_id, bytes(req.master_key))
            entries = await self._bookie.read_entries(
                req.ledger_id, req.start_entry_id, req.max_count, self._response_budget(req.max_size)
            )
            status = EOK if entries else ENOENTRY
            self._send(m.BatchReadResponse(status, req.ledger_id, req.start_entry_id, req.request_id, tuple(entries)))
        except Exception as e:
            self._note_key_refusal(e, "fencing BATCH_READ", req.ledger_id)
            self._send(m.BatchReadResponse(wire_status_for(e), req.ledger_id, req.start_entry_id, req.request_id))
        finally:
            self._counters.reads -= 1

    def _response_budget(self, max_size: int) -> int:
        """Entry bytes a multi-entry answer may carry: the client's ``max_size`` (0 = any), never
        more than fits a frame (every entry is >= 32 bytes, so its 4-byte length adds <= 1/8)."""
        cap = (self._counters.limits.max_frame_size - 64) * 8 // 9
        return cap if max_size <= 0 else min(max_size, cap)

    def _on_strided_read(self, req: m.StridedReadRequest) -> None:
        self._requests["READ_STRIDED"] += 1
        if not self._counters.try_read():
            self._rejected["READ_STRIDED"] += 1
            self._send(m.StridedReadResponse(req.request_id, ETOOMANYREQUESTS, req.ledger_id, req.first_entry_id))
            return
        self._spawn(self._strided_read(req))

    async def _strided_read(self, req: m.StridedReadRequest) -> None:
        try:
            entries = await self._bookie.read_strided(
                req.ledger_id, req.first_entry_id, req.stride, req.max_count, self._response_budget(req.max_size)
            )
            status = EOK if entries else ENOENTRY
            self._send(m.StridedReadResponse(req.request_id, status, req.ledger_id, req.first_entry_id,
                                             tuple(entries)))
        except Exception as e:
            self._send(m.StridedReadResponse(req.request_id, wire_status_for(e), req.ledger_id, req.first_entry_id))
        finally:
            self._counters.reads -= 1

    # ------------------------------------------------------------------------------- LAC
    async def _lac_answer(self, ledger_id: int) -> tuple[bytes, bytes | memoryview]:
        lac_body = await self._bookie.read_explicit_lac(ledger_id)
        try:
            last = await self._bookie.read_entry(ledger_id, -1)
        except NoSuchEntryError:
            last = b""
        return lac_body or b"", last

    def _on_read_lac(self, req: m.ReadLacRequest) -> None:
        self._requests["READ_LAC"] += 1
        self._spawn(self._read_lac(req))

    async def _read_lac(self, req: m.ReadLacRequest) -> None:
        try:
            body, last = await self._lac_answer(req.ledger_id)
            self._send(m.ReadLacResponse(req.request_id, EOK, req.ledger_id, body, last))
        except Exception as e:
            self._send(m.ReadLacResponse(req.request_id, wire_status_for(e), req.ledger_id))

    def _on_long_poll(self, req: m.LongPollReadLacRequest) -> None:
        self._requests["LONG_POLL_READ_LAC"] += 1
        self._spawn(self._long_poll(req))

    async def _long_poll(self, req: m.LongPollReadLacRequest) -> None:
        try:
            await self._bookie.wait_for_lac(req.ledger_id, req.previous_lac, req.timeout_ms / 1000.0)
        except VellumError:
            pass  # timed out: answer with what the bookie has now
        try:
            body, last = await self._lac_answer(req.ledger_id)
            self._send(m.LongPollReadLacResponse(req.request_id, EOK, req.ledger_id, body, last))
        except NoSuchLedgerError:
            self._send(m.LongPollReadLacResponse(req.request_id, ENOLEDGER, req.ledger_id))
        except Exception as e:
            self._send(m.LongPollReadLacResponse(req.request_id, wire_status_for(e), req.ledger_id))

    def _on_write_lac(self, req: m.WriteLacRequest) -> None:
        self._requests["WRITE_LAC"] += 1
        self._spawn(self._write_lac(req))

    async def _write_lac(self, req: m.WriteLacRequest) -> None:
        try:
            await self._bookie.write_explicit_lac(req.ledger_id, bytes(req.master_key), req.lac, bytes(req.lac_body))
            self._send(m.WriteLacResponse(req.request_id, EOK, req.ledger_id))
        except Exception as e:
            self._note_key_refusal(e, "WRITE_LAC", req.ledger_id)
            self._send(m.WriteLacResponse(req.request_id, wire_status_for(e), req.ledger_id))

    # ----------------------------------------------------------------------------- FORCE
    def _on_force(self, req: m.ForceLedgerRequest) -> None:
        self._requests["FORCE_LEDGER"] += 1
        target = self._issued.get(req.ledger_id, 0)

        def answer() -> None:
            self._send(m.ForceLedgerResponse(req.request_id, EOK, req.ledger_id))

        # Adds are acknowledged only after fsync, so "durable" = every add issued so far on this
        # connection has been answered.
        if self._completed.get(req.ledger_id, 0) >= target:
            answer()
        else:
            self._force_waiters.append((req.ledger_id, target, answer))

    def _check_force_waiters(self) -> None:
        keep = []
        for ledger_id, target, answer in self._force_waiters:
            if self._completed.get(ledger_id, 0) >= target:
                answer()
            else:
                keep.append((ledger_id, target, answer))
        self._force_waiters = keep

    # ------------------------------------------------------------------------------ misc
    def _on_list_entries(self, req: m.ListEntriesRequest) -> None:
        self._requests["LIST_ENTRIES"] += 1
        self._spawn(self._list_entries(req))

    async def _list_entries(self, req: m.ListEntriesRequest) -> None:
        try:
            ids = await self._bookie.entry_ids(req.ledger_id)
            self._send(m.ListEntriesResponse(req.request_id, EOK, req.ledger_id, m.entry_ranges(ids)))
        except Exception as e:
            self._send(m.ListEntriesResponse(req.request_id, wire_status_for(e), req.ledger_id))

    def _on_bookie_info(self, req: m.GetBookieInfoRequest) -> None:
        self._requests["GET_BOOKIE_INFO"] += 1
        self._spawn(self._bookie_info(req))

    async def _bookie_info(self, req: m.GetBookieInfoRequest) -> None:
        try:
            info = await self._bookie.info()
            self._send(m.GetBookieInfoResponse(req.request_id, EOK, info.total_disk_bytes, info.free_disk_bytes))
        except Exception as e:
            self._send(m.GetBookieInfoResponse(req.request_id, wire_status_for(e), 0, 0))

    def _on_ledger_closed(self, note: m.LedgerClosedNote) -> None:
        self._requests["LEDGER_CLOSED"] += 1
        self._bookie.note_ledger_closed(note.ledger_id)

    def _on_trim(self, req: m.TrimRequest) -> None:
        self._requests["TRIM"] += 1
        self._spawn(self._trim(req))

    async def _trim(self, req: m.TrimRequest) -> None:
        try:
            await self._bookie.trim(req.ledger_id, bytes(req.master_key), req.end_entry_id)
            self._send(m.TrimResponse(req.request_id, EOK, req.ledger_id))
        except Exception as e:
            self._note_key_refusal(e, "TRIM", req.ledger_id)
            self._send(m.TrimResponse(req.request_id, wire_status_for(e), req.ledger_id))

    def _on_collect(self, req: m.CollectRequest) -> None:
        self._requests["COLLECT"] += 1
        self._spawn(self._collect(req))

    async def _collect(self, req: m.CollectRequest) -> None:
        try:
            out = await self._bookie.collect(req.ledger_id, bytes(req.master_key), req.end_entry_id)
        except Exception as e:
            status = wire_status_for(e)
            log.info("COLLECT of ledger %d below entry %d: answering %s: %s", req.ledger_id, req.end_entry_id,
                     status, e)
            self._send(m.CollectResponse(req.request_id, status, req.ledger_id))
            return
        log.info("COLLECT of ledger %d below entry %d: %d bytes reclaimed, %d garbage bytes left",
                 req.ledger_id, req.end_entry_id, out.reclaimed_bytes, out.garbage_bytes)
        self._send(m.CollectResponse(req.request_id, EOK, req.ledger_id, out.reclaimed_bytes, out.garbage_bytes))

    # ------------------------------------------------------------------------------- TLS
    def _on_start_tls(self, req: m.StartTlsRequest) -> None:
        self._requests["START_TLS"] += 1
        if self._tls is not None:
            # Inside TLS already: the client's confirmation that we accepted its handshake.
            self._send(m.StartTlsResponse(req.request_id, EOK))
            return
        self._refusals.refused(g.START_TLS_UNAVAILABLE, self.peer_host(),
                               f"START_TLS from {self._peer()} refused: TLS is not configured on this bookie")
        self._send(m.StartTlsResponse(req.request_id, EBADREQ))

    def _before_tls(self, messages: list[Any]) -> None:
        """Requests on a connection that must be upgraded first: START_TLS starts the upgrade,
        everything else is refused."""
        for i, msg in enumerate(messages):
            if type(msg) is m.StartTlsRequest:
                self._requests["START_TLS"] += 1
                if i + 1 < len(messages) or self._decoder.buffered:
                    # Bytes sent in clear after START_TLS must never be taken as TLS traffic.
                    self.close_for(g.PLAINTEXT, f"closing connection {self._peer()}: data after START_TLS "
                                                "before its answer")
                    return
                if self._transport is not None:
                    self._transport.pause_reading()  # nothing more in clear; start_tls resumes under TLS
                self._upgrading = True
                self._upgrade_started = self._loop.time()
                self._spawn(self._start_tls(msg))
                return
            self._refuse_plaintext(msg)
            return

    def _refuse_plaintext(self, msg: Any) -> None:
        """The notice that TLS is required, the request's own EUA answer, then the close."""
        self._send(m.ErrorResponse(EUA, opcode=m.OP_START_TLS))
        answer = _refusal(msg, EUA)
        if answer is not None:
            self._send(answer)
        self.close_for(g.PLAINTEXT, (
            f"plaintext request refused: this bookie requires TLS (peer {self._peer()} sent "
            f"{type(msg).__name__} without START_TLS), closing the connection"))

    async def _start_tls(self, req: m.StartTlsRequest) -> None:
        transport = self._transport
        assert self._tls is not None
        if transport is None:
            return
        peer = self._peer()
        try:
            context = self._tls.get()
            # The EOK answer leaves in clear, before any TLS record: written now, not coalesced.
            self._flush()
            transport.write(codec.encode(m.StartTlsResponse(req.request_id, EOK)))
            tls_transport = await self._loop.start_tls(
                transport, self, context, server_side=True, ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S,
            )
        except asyncio.CancelledError:
            raise
        except Exception as e:  # ssl.SSLError, a timeout, the peer gone
            reason = _tls_reason(e)
            if not self._closing:  # else closed on purpose (a deadline, the budget), logged then
                self._refusals.refused(g.TLS_HANDSHAKE, self.peer_host() if self._transport else str(peer),
                                       f"TLS handshake with {peer} failed: {reason}", reason)
            self._closing = True
            transport.close()
            return
        if tls_transport is None or self._transport is None:  # closed meanwhile
            return
        self._transport = cast(asyncio.Transport, tls_transport)
        ssl_object = tls_transport.get_extra_info("ssl_object")
        self.principal, self.roles = peer_principal(ssl_object)
        self._awaiting_tls = self._upgrading = False
        if self._closing:
            return
        log.info("TLS connection from %s (%s%s)", peer, ssl_object.version() if ssl_object else "?",
                 f", principal {self.principal!r}, roles {list(self.roles)}" if self.principal else "")
        if self._auth is not None:
            self._cert_identity = self._auth.from_certificate(self.principal, self.roles)
            if self._cert_identity is not None:
                try:
                    self._auth.authorize(self._cert_identity)
                except SecurityError:
                    pass  # not yet: a token may follow (AUTH); refused at the first other request
                else:
                    self._authenticated(self._cert_identity)
        self._check_trusted()
        early, self._early = self._early, []
        if early:
            self._serve(early)

    # ------------------------------------------------------------------------------ AUTH
    def _authenticated(self, identity: Identity) -> None:
        self.identity = identity
        self._authorized = True
        log.info("connection from %s authenticated: %s", self._peer(), identity.describe())
        self._check_trusted()

    def _on_auth(self, req: m.AuthRequest) -> None:
        self._requests["AUTH"] += 1
        if self._auth is None:
            self._send(m.AuthResponse(req.request_id, EOK, "authentication is off on this bookie"))
            return
        try:
            identity = self._auth.from_auth(req.auth_plugin_name, bytes(req.payload), self._cert_identity)
            self._auth.authorize(identity)
        except SecurityError as e:
            self._refuse_auth(req.request_id, f"authentication refused: {e}", "AUTH")
            return
        self._authenticated(identity)
        self._send(m.AuthResponse(req.request_id, EOK, _clip(f"authenticated as {identity.principal!r}")))

    def _before_auth(self, messages: list[Any]) -> None:
        """Requests on a connection that has not authenticated: START_TLS and AUTH are
        answered, anything else is refused and the connection closed."""
        for i, msg in enumerate(messages):
            kind = type(msg)
            if kind is m.StartTlsRequest:
                self._on_start_tls(msg)
            elif kind is m.AuthRequest:
                self._on_auth(msg)
                if not self._authorized:
                    return  # refused: closing
                rest = messages[i + 1:]
                if rest:
                    self._dispatch(rest)
                return
            else:
                assert self._auth is not None
                try:
                    self._auth.authorize(self.identity or self._cert_identity)
                    reason = "not authenticated"
                except SecurityError as e:
                    reason = str(e)
                self._requests[m.OPCODE_NAMES.get(getattr(kind, "OPCODE", -1), kind.__name__)] += 1
                answer = _refusal(msg, EUA)
                self._refuse_auth(m.AUTH_NOTICE_ID, f"request refused: {reason}", kind.__name__, answer)
                return

    def _refuse_auth(self, request_id: int, reason: str, what: str, answer: Any = None) -> None:
        """Answer EUA with ``reason`` (and ``answer``, the refused request's own EUA), log it,
        and close the connection once the answers are written."""
        self._send(m.AuthResponse(request_id, EUA, _clip(reason)))
        if answer is not None:
            self._send(answer)
        self.close_for(g.AUTH_REFUSED if what == "AUTH" else g.REQUEST_BEFORE_AUTH,
                       f"{what} from {self._peer()} refused, closing the connection: {reason}", reason)

    def _on_bad_frame(self, bad: m.BadFrame) -> None:
        self._requests["BAD_FRAME"] += 1
        self._refusals.refused(g.BAD_FRAME, self.peer_host(), f"bad frame from {self._peer()}: {bad.reason}",
                               bad.reason)
        answer = bad.error_response()
        if answer is not None:
            self._send(answer)


def _unbatched(messages: list[Any]) -> list[Any]:
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


def _count_by_ledger(counts: dict[int, int], ledger_ids: list[int]) -> None:
    """Add one per id in ``ledger_ids`` to ``counts`` (usually all one ledger: one update)."""
    first = ledger_ids[0]
    n = ledger_ids.count(first)
    counts[first] = counts.get(first, 0) + n
    if n != len(ledger_ids):
        for lid in ledger_ids:
            if lid != first:
                counts[lid] = counts.get(lid, 0) + 1


def _refusal(msg: Any, status: int) -> Any:
    """The answer refusing ``msg`` with ``status``: a v2 op gets its own response type (a v2
    client matches those), a Vellum op an ``ErrorResponse`` with its ids; a note gets none."""
    kind = type(msg)
    if kind is m.AddRequest:
        return m.AddResponse(status, msg.ledger_id, msg.entry_id)
    if kind is m.ReadRequest:
        return m.ReadResponse(status, msg.ledger_id, msg.entry_id)
    if kind is m.BatchReadRequest:
        return m.BatchReadResponse(status, msg.ledger_id, msg.start_entry_id, msg.request_id)
    if kind is m.LedgerClosedNote:
        return None
    if kind is m.BadFrame:
        return msg.error_response()
    return m.ErrorResponse(status, getattr(msg, "request_id", None), kind.OPCODE, getattr(msg, "ledger_id", None))


def _clip(text: str) -> str:
    """``text`` cut to what an AUTH response may carry (UTF-8 bytes, whole characters)."""
    return text.encode()[:m.MAX_AUTH_MESSAGE].decode(errors="ignore")


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
        self._counters = _Counters(limits)
        self._metrics = metrics if metrics is not None else process_server_metrics()
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[BookieConnection] = set()
        self._guard: ConnectionGuard | None = None

    @property
    def port(self) -> int:
        return self._port

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        peers = self._counters.limits.peers
        guard = self._guard = ConnectionGuard(peers, RefusalLog(peers.refusal_log_period_s, self._counters.refused),
                                              counters=self._counters)

        def factory() -> BookieConnection:
            conn = BookieConnection(self._bookie, self._counters, self._connections.discard, self._tls, self._auth,
                                    guard)
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
