"""The bookie's request processors: one per operation (BookKeeper's ``...Processor`` classes).

A connection's ``Processors`` take the operations its session dispatched (``server/session.py``)
and hand each to the processor of its type; every processor reaches the bookie only through
``AsyncBookie`` (the thread<->loop seam) and answers only through the connection's
``ReplyWriter`` (``server/replies.py``), so every reply is encoded by the codec.

Invariants:
- an ADD is answered only when the bookie reports the journal fsync covering it, a fencing
  READ only once the fence is durable;
- adds and reads in progress are bounded per bookie (``maxAddsInProgressLimit``,
  ``maxReadsInProgressLimit``): past the bound a request is answered ETOOMANYREQUESTS at once;
- a processor decides what it needs before it hands a request down (admission, the adds issued
  per ledger, how an outcome becomes a status), hands it down once, and answers the outcome
  with one reply: the pipelined ADDs of one read (an ``AddBatch``) go to the bookie as one
  batch and, when all are durable, are answered with one buffer carrying each add's status; a
  READ is one ``AsyncBookie.read_cb`` (no task), answered with one READ response
  (``ReplyWriter.send_read``: its frame encoded from its fields, no message object); BATCH_READ,
  READ_STRIDED and READ_LAC likewise (``read_entries_cb``, ``read_strided_cb``, ``read_lac_cb``),
  and a long poll waits on a LAC watcher and a timer (``watch_lac_cb``), no task per request;
  LIST_ENTRIES, GET_BOOKIE_INFO and TRIM are answered from the done callback of the future the
  bookie's reader pool returns (``_on_reader``), WRITE_LAC and COLLECT from one callback each
  (``write_explicit_lac_cb``, ``collect_cb``): no task per request either;
- FORCE_LEDGER is answered once every add issued before it on the connection is answered;
- an exception turned into an error status is logged once, with the request's ledger and entry
  ids (``extra={"ledger_id", "entry_id", "peer"}``), and counted in
  ``bookkeeper_server_REQUEST_ERRORS{op, status}`` (``Channel.status_for``). Expected answers
  (no such entry, fenced, read-only, overload) are logged at DEBUG; a refused master key and an
  I/O error as warnings; anything that is neither a ``VellumError`` nor an ``OSError`` is a bug:
  logged with its traceback and answered EINTERNAL, never EIO (a bug must not look like a
  disk error). Warnings and errors are rate-limited per process (``FAILURE_LOG_INTERVAL_S``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from vellum.bookie.executor import AsyncBookie, CollectOutcome
from vellum.errors import (
    EBADREQ,
    EINTERNAL,
    EIO,
    ENOENTRY,
    EOK,
    ETOOMANYREQUESTS,
    EUA,
    WIRE_STATUS_NAMES,
    VellumError,
    wire_status_for,
)
from vellum.proto import messages as m
from vellum.server.metrics import ServerCounters
from vellum.server.replies import ReplyWriter

# The server's logger: operators and tests follow one logger for the request path.
log = logging.getLogger("vellum.server.bookie_server")

#: at most one warning/error line per kind (master key, I/O, unexpected) per this many seconds
FAILURE_LOG_INTERVAL_S = 5.0
#: the same for "master key refused" lines (kept under its own name: operators know it)
KEY_REFUSAL_LOG_INTERVAL_S = FAILURE_LOG_INTERVAL_S


#: the clock the rate-limited log lines read (``time.monotonic`` in production); the simulator
#: gives it the loop's virtual clock, so a replayed seed logs the same lines (docs/verification.md)
_monotonic = time.monotonic


class _RateLimitedLog:
    """At most one line of a kind per ``interval_s`` at ``level`` (loop thread only): ``due``
    says whether the next line is written; the writer (``Channel.status_for``) writes it."""

    __slots__ = ("_interval_s", "_last", "_left_out", "level")

    def __init__(self, level: int, interval_s: float) -> None:
        self.level = level
        self._interval_s = interval_s
        self._last = float("-inf")
        self._left_out = 0

    def due(self) -> str | None:
        """None: this line is left out (counted); else write it, followed by the text returned
        (how many were left out since the last one, or nothing)."""
        now = _monotonic()
        if now - self._last < self._interval_s:
            self._left_out += 1
            return None
        more = f" ({self._left_out} more since the last such line)" if self._left_out else ""
        self._last, self._left_out = now, 0
        return more


_KEY_REFUSALS = _RateLimitedLog(logging.WARNING, KEY_REFUSAL_LOG_INTERVAL_S)
_IO_ERRORS = _RateLimitedLog(logging.WARNING, FAILURE_LOG_INTERVAL_S)
_UNEXPECTED = _RateLimitedLog(logging.ERROR, FAILURE_LOG_INTERVAL_S)


class Counters(ServerCounters):
    """Per-bookie counts shared by all connections (the loop thread only), and the admission
    of adds and reads against the in-progress limits (0 = unlimited, BookKeeper's meaning)."""

    __slots__ = ("max_adds", "max_frame_size", "max_reads")

    def __init__(self, *, max_adds: int, max_reads: int, max_frame_size: int) -> None:
        super().__init__()
        self.max_adds = max_adds
        self.max_reads = max_reads
        self.max_frame_size = max_frame_size

    def admit_adds(self, n: int) -> int:
        """How many of ``n`` pipelined adds fit the in-progress bound: the first ones; counted
        as requests, the others as rejected, the admitted ones as in progress."""
        self.requests["ADD"] += n
        limit = self.max_adds
        room = n if not limit or self.adds + n <= limit else max(0, limit - self.adds)
        if room < n:
            self.rejected["ADD"] += n - room
        self.adds += room
        return room

    def try_read(self) -> bool:
        if self.max_reads and self.reads >= self.max_reads:
            return False
        self.reads += 1
        return True


class Channel:
    """What the processors of one connection share: the bookie, the server's counters, the
    reply writer, the connection's tasks, and its adds issued/answered per ledger (FORCE)."""

    __slots__ = ("bookie", "completed", "counters", "describe_peer", "force_waiters", "issued", "loop", "reading",
                 "replies", "tasks", "watches")

    def __init__(self, bookie: AsyncBookie, counters: Counters, replies: ReplyWriter,
                 loop: asyncio.AbstractEventLoop, describe_peer: Callable[[], str]) -> None:
        self.bookie = bookie
        self.counters = counters
        self.replies = replies
        self.loop = loop
        #: the peer (and who it is authenticated as) for log lines
        self.describe_peer = describe_peer
        self.tasks: set[asyncio.Task[Any]] = set()
        self.issued: dict[int, int] = {}
        self.completed: dict[int, int] = {}
        self.force_waiters: list[tuple[int, int, Callable[[], None]]] = []
        #: requests other than ADD and FORCE handed to the bookie and not answered yet (reads,
        #: a long poll's answer, LIST_ENTRIES, GET_BOOKIE_INFO, TRIM, WRITE_LAC, COLLECT: they
        #: hold no task)
        self.reading = 0
        #: the long polls waiting for the LAC: each one's function that drops its watch and timer
        self.watches: set[Callable[[], None]] = set()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = self.loop.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def busy(self) -> bool:
        """A request is in progress: a read, a long poll, an add not answered yet, a FORCE."""
        return (bool(self.tasks) or bool(self.reading) or bool(self.watches) or bool(self.force_waiters)
                or self.issued != self.completed)

    def cancel(self) -> None:
        """The connection closed: its tasks are cancelled and its long polls stop waiting."""
        for task in list(self.tasks):
            task.cancel()
        watches, self.watches = self.watches, set()
        for drop in watches:
            drop()

    def hand_down(self, call: Callable[..., None], *args: Any) -> None:
        """Hand a request to the bookie (``call(*args)``), counted in ``reading`` until its answer
        (which takes it off); if the hand-down itself raises (a bug), the count is undone and
        the exception goes to the bug guard (``Processor.refuse``), which answers it."""
        self.reading += 1
        try:
            call(*args)
        except BaseException:
            self.reading -= 1
            raise

    def status_for(self, exc: BaseException, op: str, ledger_id: int | None, entry_id: int | None = None,
                   what: str | None = None, *, count: int = 1, quiet: bool = False,
                   expected_level: int = logging.DEBUG) -> int:
        """The status answering ``exc`` for ``count`` ``op`` requests; counted, and logged unless
        ``quiet`` (the same exception already logged for another request of a batch); see the
        module docstring. ``what`` names the request in the log line (default: ``op`` and the
        entry); ``expected_level``: the level of an expected answer's line (an admin operation's
        failures are worth INFO)."""
        if isinstance(exc, VellumError):
            status = wire_status_for(exc)
        elif isinstance(exc, OSError):
            status = EIO
        else:
            status = EINTERNAL
        self.counters.errors[(op, WIRE_STATUS_NAMES.get(status) or str(status))] += count
        if quiet:
            return status
        if status != EINTERNAL and status != EUA and status != EIO and not log.isEnabledFor(expected_level):
            return status  # an expected answer whose line would not be written: no text built for it
        if what is None:
            what = op if entry_id is None else f"{op} of entry {entry_id}"
        peer = self.describe_peer()
        extra = {"ledger_id": ledger_id, "entry_id": entry_id, "peer": peer}
        request = f"{what} of ledger {ledger_id} from {peer}"
        if status == EINTERNAL:
            limit, line, trace = _UNEXPECTED, f"{request} failed unexpectedly, answering EINTERNAL: {exc!r}", exc
        elif status == EUA:
            limit, line, trace = _KEY_REFUSALS, f"master key refused: {request}: {exc}", None
        elif status == EIO:
            limit, line, trace = _IO_ERRORS, f"{request}: answering EIO: {exc}", None
        else:
            if log.isEnabledFor(expected_level):
                log.log(expected_level, "%s: answering %s: %s", request, WIRE_STATUS_NAMES.get(status, status), exc,
                        extra=extra)
            return status
        more = limit.due()
        if more is not None:
            log.log(limit.level, "%s%s", line, more, extra=extra, exc_info=trace)
        return status

    def answer(self, result: Any, exc: BaseException | None, ok: Callable[[Any], Any],
               failed: Callable[[int], Any], op: str, ledger_id: int | None, entry_id: int | None = None,
               what: str | None = None) -> None:
        """Answer one request, once: ``ok(result)`` when the bookie did it (``exc`` None), else
        ``failed(status)`` with ``exc``'s status (``status_for``: counted and logged). A bug
        building or sending ``ok``'s answer is answered as one (EINTERNAL), never as EIO."""
        failing = exc is not None
        while True:  # at most twice: ok's answer, then the failure's if that one could not be made or sent
            if not failing:
                try:
                    msg = ok(result)
                except Exception as e:
                    exc, failing = e, True
            if failing:
                assert exc is not None
                msg = failed(self.status_for(exc, op, ledger_id, entry_id, what))
            try:
                self.replies.send(msg)
                return
            except Exception as e:
                if failing:
                    raise
                exc, failing = e, True

    def check_force_waiters(self) -> None:
        completed = self.completed
        keep = []
        for ledger_id, target, answer in self.force_waiters:
            if completed.get(ledger_id, 0) >= target:
                answer()
            else:
                keep.append((ledger_id, target, answer))
        self.force_waiters = keep

    def response_budget(self, max_size: int) -> int:
        """Entry bytes a multi-entry answer may carry: the client's ``max_size`` (0 = any), never
        more than fits a frame (every entry is >= 32 bytes, so its 4-byte length adds <= 1/8)."""
        cap = (self.counters.max_frame_size - 64) * 8 // 9
        return cap if max_size <= 0 else min(max_size, cap)


class Processor:
    """One operation's processing for one connection: ``op`` names the operation (its
    opcode's name, as its requests and failures are counted and logged)."""

    __slots__ = ("bookie", "ch", "counters", "op", "send")

    def __init__(self, ch: Channel, op: str) -> None:
        self.ch = ch
        self.op = op
        self.bookie = ch.bookie
        self.counters = ch.counters
        self.send = ch.replies.send

    def __call__(self, req: Any) -> None:
        """Process ``req``, guarded: a processor that raises (a bug) answers its own request
        (``refuse``), and the connection and the requests after it go on."""
        try:
            self.process(req)
        except Exception as e:
            self.refuse(req, e)

    def process(self, req: Any) -> None:
        raise NotImplementedError

    def refuse(self, req: Any, exc: Exception) -> None:
        """The bug guard: what this processor raised for ``req`` is counted and logged once
        with the request's ids (``Channel.status_for``: a bug is EINTERNAL, never EIO), and
        answered with that status as the request's own refusal, the one question to the
        messages."""
        status = self.ch.status_for(exc, self.op, getattr(req, "ledger_id", None), _first_entry(req))
        answer = m.refusal_for(req, status)
        if answer is not None:
            self.send(answer)


# ----------------------------------------------------------------------------------- ADD
class AddProcessor(Processor):
    """ADD: admitted against the in-progress bound, handed to the bookie as one batch, answered
    with one reply once all are durable (the adds past the bound at once)."""

    __slots__ = ()

    def process(self, req: m.AddRequest) -> None:
        self.add_batch(m.AddBatch.of_requests((req,)))

    def add_batch(self, batch: m.AddBatch) -> None:
        """Pipelined ADDs (decoded together by the codec, or single frames gathered with
        ``AddBatch.of_requests``). Everything the processor decides is decided here, before
        the batch goes down: how many fit the in-progress bound (``Counters.admit_adds``: the
        adds past it, the last ones, are answered ETOOMANYREQUESTS at once), the adds issued
        per ledger (FORCE), and how the bookie's answer becomes statuses (``_statuses``). The
        admitted adds go to the bookie as one batch; once all are durable (or refused) their
        answers leave in one reply."""
        ch = self.ch
        counters = self.counters
        n = len(batch)
        room = counters.admit_adds(n)
        ledger_ids, entry_ids = batch.ledger_ids, batch.entry_ids
        if room < n:
            ledger_ids, entry_ids = ledger_ids[:room], entry_ids[:room]
        if room:
            _count_by_ledger(ch.issued, ledger_ids)
        statuses = self._statuses

        def on_result(refused: list[BaseException | None], exc: BaseException | None) -> None:
            counters.adds -= room
            _count_by_ledger(ch.completed, ledger_ids)
            # All durable is the common case: one status for all.
            status = EOK if exc is None and refused.count(None) == room else statuses(
                ledger_ids, entry_ids, refused, exc)
            ch.replies.send_adds(status, ledger_ids, entry_ids)
            if ch.force_waiters:
                ch.check_force_waiters()

        if room < n:
            ch.replies.send_adds(ETOOMANYREQUESTS, batch.ledger_ids[room:], batch.entry_ids[room:])
            if not room:
                return
            batch = batch.take(range(room))
        self.bookie.add_batch_cb(batch, on_result)

    def _statuses(self, ledger_ids: list[int], entry_ids: list[int], refused: list[BaseException | None],
                  exc: BaseException | None) -> list[int]:
        """Per add of a batch with refusals or a failed journal: each refused add its own
        status, the accepted ones the durability outcome. Each distinct exception is logged
        once (one failure of a batch is one line, not one per entry) and every add counted."""
        status_for = self.ch.status_for
        accepted = [i for i, why in enumerate(refused) if why is None]
        accepted_status = EOK
        logged: dict[int, int] = {}
        if exc is not None and accepted:
            first, last = accepted[0], accepted[-1]
            logged[id(exc)] = accepted_status = status_for(
                exc, "ADD", ledger_ids[first], entry_ids[first],
                what=_entries_text(entry_ids[first], entry_ids[last], len(accepted)), count=len(accepted))
        out: list[int] = []
        for i, why in enumerate(refused):
            if why is None:
                out.append(accepted_status)
            else:
                seen = id(why) in logged
                logged[id(why)] = status = status_for(why, "ADD", ledger_ids[i], entry_ids[i], quiet=seen)
                out.append(status)
        return out


def _entries_text(first: int, last: int, n: int) -> str:
    return f"ADD of entry {first}" if n == 1 else f"ADD of {n} entries {first}..{last}"


def _count_by_ledger(counts: dict[int, int], ledger_ids: list[int]) -> None:
    """Add one per id in ``ledger_ids`` to ``counts`` (usually all one ledger: one update)."""
    if not ledger_ids:
        return
    first = ledger_ids[0]
    n = ledger_ids.count(first)
    counts[first] = counts.get(first, 0) + n
    if n != len(ledger_ids):
        for lid in ledger_ids:
            if lid != first:
                counts[lid] = counts.get(lid, 0) + 1


# ---------------------------------------------------------------------------------- READ
class ReadProcessor(Processor):
    """READ (with the fence flag: fence first, durably): admitted against the in-progress
    bound, handed to the bookie once (``AsyncBookie.read_cb``: from memory on the loop when
    the entry is cached, else on a reader thread), answered with one reply."""

    __slots__ = ()

    def process(self, req: m.ReadRequest) -> None:
        ch = self.ch
        counters = self.counters
        send_read = ch.replies.send_read  # the answer's frame from its fields (no ReadResponse)
        ledger_id, entry_id = req.ledger_id, req.entry_id
        fencing = req.is_fencing
        op = "READ_FENCE" if fencing else "READ"
        counters.requests[op] += 1
        if not counters.try_read():
            counters.rejected["READ"] += 1
            send_read(ETOOMANYREQUESTS, ledger_id, entry_id)
            return

        def answer(entry: bytes | memoryview | None, exc: BaseException | None) -> None:
            """The bookie's outcome (on the loop): the one answer of this READ, an entry only
            with EOK, else the error's status."""
            counters.reads -= 1
            ch.reading -= 1
            if exc is None:
                assert entry is not None
                send_read(EOK, ledger_id, entry_id, entry)
                return
            # Includes ENOENTRY/ENOLEDGER after a fence of a ledger this bookie holds nothing
            # of: the fence itself is durable, the reader learns there is no entry.
            what = f"fencing READ of entry {entry_id}" if fencing else None
            send_read(ch.status_for(exc, op, ledger_id, entry_id, what), ledger_id, entry_id)

        fence_key = None
        if fencing:
            assert req.master_key is not None
            fence_key = bytes(req.master_key)
        # ``_admitted`` inline (one READ per request: two Python calls less each): counted in
        # ``reading`` until answered; a hand-down that raises undoes both counts
        ch.reading += 1
        try:
            self.bookie.read_cb(ledger_id, entry_id, fence_key, answer)
        except BaseException:
            ch.reading -= 1
            counters.reads -= 1
            raise


def _admitted(ch: Channel, call: Callable[..., None], *args: Any) -> None:
    """Hand down a read admitted against the in-progress bound (``Counters.try_read``); if the
    hand-down raises, the admission is undone with it (the bound must not leak)."""
    try:
        ch.hand_down(call, *args)
    except BaseException:
        ch.counters.reads -= 1
        raise


_NO_ENTRIES: tuple[m.BytesLike, ...] = ()


def _read_run(ch: Channel, op: str, ledger_id: int, first: int,
              reply: Callable[[int, Sequence[m.BytesLike]], Any], call: Callable[..., None], *args: Any,
              fencing: bool = False) -> None:
    """A multi-entry read (BATCH_READ, READ_STRIDED): counted, admitted against the in-progress
    bound (refused ETOOMANYREQUESTS past it), handed to the bookie once (``call(*args,
    answer)``), answered once with ``reply(status, entries)``: the bookie's ``PackedEntries``
    as they are (the run's buffers, no object per entry), ENOENTRY for an empty run, the
    failure's status (``Channel.status_for``, logged there) otherwise."""
    counters = ch.counters
    send = ch.replies.send
    counters.requests[op] += 1
    if not counters.try_read():
        counters.rejected[op] += 1
        send(reply(ETOOMANYREQUESTS, _NO_ENTRIES))
        return

    def answered(entries: m.PackedEntries | None, exc: BaseException | None) -> None:
        counters.reads -= 1
        ch.reading -= 1
        ch.answer(entries, exc, found, missing, op, ledger_id, first, f"fencing {op}" if fencing else None)

    def found(entries: m.PackedEntries) -> Any:
        return reply(EOK if entries else ENOENTRY, entries)

    def missing(status: int) -> Any:
        return reply(status, _NO_ENTRIES)

    _admitted(ch, call, *args, answered)


class BatchReadProcessor(Processor):
    """BATCH_READ: consecutive entries (``AsyncBookie.read_entries_cb``, on a reader thread;
    fencing first with the fence flag), one ``_read_run``."""

    __slots__ = ()

    def process(self, req: m.BatchReadRequest) -> None:
        ledger_id, first, request_id = req.ledger_id, req.start_entry_id, req.request_id
        fence_key = None
        if req.is_fencing:
            assert req.master_key is not None
            fence_key = bytes(req.master_key)
        _read_run(self.ch, "BATCH_READ", ledger_id, first,
                  lambda status, entries: m.BatchReadResponse(status, ledger_id, first, request_id, entries),
                  self.bookie.read_entries_cb, ledger_id, first, req.max_count,
                  self.ch.response_budget(req.max_size), fence_key, fencing=req.is_fencing)


class StridedReadProcessor(Processor):
    """READ_STRIDED: entries ``first, first + stride, ...`` (``AsyncBookie.read_strided_cb``, on
    a reader thread), one ``_read_run``."""

    __slots__ = ()

    def process(self, req: m.StridedReadRequest) -> None:
        ledger_id, first, request_id = req.ledger_id, req.first_entry_id, req.request_id
        _read_run(self.ch, "READ_STRIDED", ledger_id, first,
                  lambda status, entries: m.new_strided_read_response(request_id, status, ledger_id, first, entries),
                  self.bookie.read_strided_cb, ledger_id, first, req.stride, req.max_count,
                  self.ch.response_budget(req.max_size))


# ----------------------------------------------------------------------------------- LAC
class ReadLacProcessor(Processor):
    """READ_LAC: the explicit LAC and the last entry (``AsyncBookie.read_lac_cb``: one reader
    thread hop), answered with one reply. Not bounded by ``maxReadsInProgressLimit``."""

    __slots__ = ()

    def process(self, req: m.ReadLacRequest) -> None:
        self.counters.requests["READ_LAC"] += 1
        read_lac(self.ch, "READ_LAC", m.ReadLacResponse, req.request_id, req.ledger_id)


def read_lac(ch: Channel, op: str, response: type[m.ReadLacResponse] | type[m.LongPollReadLacResponse],
             request_id: int, ledger_id: int) -> None:
    """Read what the bookie has of the ledger's LAC and answer it with one ``response``."""

    def answer(got: tuple[bytes, bytes | memoryview] | None, exc: BaseException | None) -> None:
        ch.reading -= 1
        ch.answer(got, exc, lambda got: response(request_id, EOK, ledger_id, got[0], got[1]),
                  lambda status: response(request_id, status, ledger_id), op, ledger_id)

    ch.hand_down(ch.bookie.read_lac_cb, ledger_id, answer)


class LongPollProcessor(Processor):
    """LONG_POLL_READ_LAC: waits (holding no thread and no task: a LAC watcher and a timer,
    ``AsyncBookie.watch_lac_cb``) for the LAC to pass the client's, at most the request's
    timeout, then answers as READ_LAC with what the bookie has then. A connection that closes
    drops its waiting polls (``Channel.cancel``)."""

    __slots__ = ()

    def process(self, req: m.LongPollReadLacRequest) -> None:
        ch = self.ch
        self.counters.requests["LONG_POLL_READ_LAC"] += 1
        request_id, ledger_id = req.request_id, req.ledger_id
        drop: Callable[[], None] | None = None
        answered = False

        def passed() -> None:  # on the loop: the LAC passed, or the timeout (the answer is the same)
            nonlocal answered
            answered = True
            if drop is not None:
                ch.watches.discard(drop)
            read_lac(ch, "LONG_POLL_READ_LAC", m.LongPollReadLacResponse, request_id, ledger_id)

        drop = self.bookie.watch_lac_cb(ledger_id, req.previous_lac, req.timeout_ms / 1000.0, passed)
        if not answered:
            ch.watches.add(drop)


class WriteLacProcessor(Processor):
    """WRITE_LAC: store the explicit LAC (``AsyncBookie.write_explicit_lac_cb``, no task),
    answered once durable, or with the failure's status."""

    __slots__ = ()

    def process(self, req: m.WriteLacRequest) -> None:
        ch = self.ch
        self.counters.requests["WRITE_LAC"] += 1
        request_id, ledger_id = req.request_id, req.ledger_id

        def durable(exc: BaseException | None) -> None:  # on the loop, once
            ch.reading -= 1
            ch.answer(None, exc, lambda _none: m.WriteLacResponse(request_id, EOK, ledger_id),
                      lambda status: m.WriteLacResponse(request_id, status, ledger_id), "WRITE_LAC", ledger_id)

        ch.hand_down(self.bookie.write_explicit_lac_cb, ledger_id, bytes(req.master_key), req.lac,
                     bytes(req.lac_body), durable)


# --------------------------------------------------------------------------------- FORCE
class ForceProcessor(Processor):
    """FORCE_LEDGER: adds are acknowledged only after fsync, so "durable" = every add issued
    so far on this connection to the ledger has been answered."""

    __slots__ = ()

    def process(self, req: m.ForceLedgerRequest) -> None:
        ch = self.ch
        self.counters.requests["FORCE_LEDGER"] += 1
        target = ch.issued.get(req.ledger_id, 0)
        send = self.send

        def answer() -> None:
            send(m.ForceLedgerResponse(req.request_id, EOK, req.ledger_id))

        if ch.completed.get(req.ledger_id, 0) >= target:
            answer()
        else:
            ch.force_waiters.append((req.ledger_id, target, answer))


# -------------------------------------------------------------------------- admin and misc
def _on_reader(ch: Channel, op: str, ledger_id: int | None, ok: Callable[[Any], Any], failed: Callable[[int], Any],
               call: Callable[..., asyncio.Future[Any]], *args: Any) -> None:
    """A request the bookie answers from its reader pool with a future (``AsyncBookie.entry_ids``,
    ``info``, ``trim``): handed down once (``call(*args)``) and answered once, from the future's
    done callback (no task): ``ok(result)``, or ``failed(status)`` for the failure
    (``Channel.answer``). The connection counts as busy (``Channel.reading``) until then; a call
    cancelled (the bookie stopping) is not answered."""

    def answer(result: Any, exc: BaseException | None) -> None:
        ch.answer(result, exc, ok, failed, op, ledger_id)

    def done(fut: asyncio.Future[Any]) -> None:  # on the loop
        ch.reading -= 1
        if fut.cancelled():
            return
        exc = fut.exception()
        if exc is not None:
            answer(None, exc)
        else:
            answer(fut.result(), None)

    try:
        fut = call(*args)
    except Exception as e:  # not handed down (the reader pool was shut down): answered at once
        answer(None, e)
        return
    ch.reading += 1
    fut.add_done_callback(done)


class ListEntriesProcessor(Processor):
    """LIST_ENTRIES: the ids of the ledger's entries this bookie holds, as ranges (``_on_reader``)."""

    __slots__ = ()

    def process(self, req: m.ListEntriesRequest) -> None:
        self.counters.requests["LIST_ENTRIES"] += 1
        request_id, ledger_id = req.request_id, req.ledger_id
        _on_reader(self.ch, "LIST_ENTRIES", ledger_id,
                   lambda ids: m.ListEntriesResponse(request_id, EOK, ledger_id, m.entry_ranges(ids)),
                   lambda status: m.ListEntriesResponse(request_id, status, ledger_id),
                   self.bookie.entry_ids, ledger_id)


class BookieInfoProcessor(Processor):
    """GET_BOOKIE_INFO: disk capacity and free space (``_on_reader``)."""

    __slots__ = ()

    def process(self, req: m.GetBookieInfoRequest) -> None:
        self.counters.requests["GET_BOOKIE_INFO"] += 1
        request_id = req.request_id
        _on_reader(self.ch, "GET_BOOKIE_INFO", None,
                   lambda info: m.GetBookieInfoResponse(request_id, EOK, info.total_disk_bytes, info.free_disk_bytes),
                   lambda status: m.GetBookieInfoResponse(request_id, status, 0, 0),
                   self.bookie.info)


class LedgerClosedProcessor(Processor):
    """LEDGER_CLOSED: an advisory note, never answered."""

    __slots__ = ()

    def process(self, note: m.LedgerClosedNote) -> None:
        self.counters.requests["LEDGER_CLOSED"] += 1
        self.bookie.note_ledger_closed(note.ledger_id)


class TrimProcessor(Processor):
    """TRIM: drop the ledger's entries below an entry id (``_on_reader``)."""

    __slots__ = ()

    def process(self, req: m.TrimRequest) -> None:
        self.counters.requests["TRIM"] += 1
        request_id, ledger_id = req.request_id, req.ledger_id
        _on_reader(self.ch, "TRIM", ledger_id,
                   lambda _none: m.TrimResponse(request_id, EOK, ledger_id),
                   lambda status: m.TrimResponse(request_id, status, ledger_id),
                   self.bookie.trim, ledger_id, bytes(req.master_key), req.end_entry_id)


class CollectProcessor(Processor):
    """COLLECT: trim, then wait for a GC pass that reclaims the space (``AsyncBookie.collect_cb``:
    no task, no thread held while the passes run); answered once."""

    __slots__ = ()

    def process(self, req: m.CollectRequest) -> None:
        ch = self.ch
        send = self.send
        self.counters.requests["COLLECT"] += 1
        request_id, ledger_id, end_entry_id = req.request_id, req.ledger_id, req.end_entry_id

        def collected(out: CollectOutcome | None, exc: BaseException | None) -> None:  # on the loop, once
            ch.reading -= 1
            if exc is not None:
                status = ch.status_for(exc, "COLLECT", ledger_id, what=f"COLLECT below entry {end_entry_id}",
                                       expected_level=logging.INFO)
                send(m.CollectResponse(request_id, status, ledger_id))
                return
            assert out is not None
            log.info("COLLECT of ledger %d below entry %d: %d bytes reclaimed, %d garbage bytes left",
                     ledger_id, end_entry_id, out.reclaimed_bytes, out.garbage_bytes,
                     extra={"ledger_id": ledger_id, "entry_id": end_entry_id, "peer": ch.describe_peer()})
            send(m.CollectResponse(request_id, EOK, ledger_id, out.reclaimed_bytes, out.garbage_bytes))

        ch.hand_down(self.bookie.collect_cb, ledger_id, bytes(req.master_key), end_entry_id, collected)


# ------------------------------------------------------------------------------- dispatch
#: the processor of each operation (ADD, single or batched, has its own path: ``AddProcessor``)
_PROCESSORS: dict[type[Any], type[Processor]] = {
    m.ReadRequest: ReadProcessor,
    m.BatchReadRequest: BatchReadProcessor,
    m.StridedReadRequest: StridedReadProcessor,
    m.LongPollReadLacRequest: LongPollProcessor,
    m.ReadLacRequest: ReadLacProcessor,
    m.WriteLacRequest: WriteLacProcessor,
    m.ForceLedgerRequest: ForceProcessor,
    m.ListEntriesRequest: ListEntriesProcessor,
    m.GetBookieInfoRequest: BookieInfoProcessor,
    m.LedgerClosedNote: LedgerClosedProcessor,
    m.TrimRequest: TrimProcessor,
    m.CollectRequest: CollectProcessor,
}


def _first_entry(req: Any) -> int | None:
    """The entry a request names first (a multi-entry read: where its run starts), for log lines."""
    for name in ("entry_id", "start_entry_id", "first_entry_id"):
        entry_id = getattr(req, name, None)
        if entry_id is not None:
            return int(entry_id)
    return None


class Processors:
    """A connection's processors, by request type; ``dispatch`` takes what the session
    dispatched, in arrival order. Each operation's processor is made at its first request (a
    connection that only adds and reads makes three, not a dozen)."""

    __slots__ = ("_add", "_by_type", "_ch")

    def __init__(self, ch: Channel) -> None:
        self._ch = ch
        self._add = AddProcessor(ch, m.OPCODE_NAMES[m.OP_ADD])
        self._by_type: dict[type, Processor] = {}  # made as their requests come (``_made``)

    def _made(self, kind: type[Any]) -> Processor | None:
        """The processor of requests of type ``kind``, made now (None: no operation's)."""
        processor = _PROCESSORS.get(kind)
        if processor is None:
            return None
        made = self._by_type[kind] = processor(self._ch, m.OPCODE_NAMES[kind.OPCODE])
        return made

    def dispatch(self, requests: list[Any]) -> None:
        add = self._add
        by_type = self._by_type
        adds: list[m.AddRequest] = []
        for req in requests:
            kind = type(req)
            if kind is m.AddRequest:
                # Pipelined adds that arrived one by one go to the bookie as one batch too.
                adds.append(req)
                continue
            if adds:
                add.add_batch(m.AddBatch.of_requests(adds))
                adds = []
            if kind is m.AddBatch:
                add.add_batch(req)
                continue
            processor = by_type.get(kind) or self._made(kind)  # every operation but ADD
            if processor is not None:
                processor(req)  # guarded: a bug answers its own request (``Processor.refuse``)
            else:
                self._ch.replies.send(m.ErrorResponse(EBADREQ))
        if adds:
            add.add_batch(m.AddBatch.of_requests(adds))
