"""The writer role of a ledger handle: pipelined appends with quorum acks, the in-flight window and
back-pressure, ensemble changes, explicit LAC, close (BookKeeper's ``LedgerHandle`` write side,
``PendingAddOp`` and ``EnsembleChangeOp``).

Responsibility: everything that adds entries to one ledger and changes its metadata while it is
written, on one asyncio loop. A writer is either the ledger's *writer* (created ledger: appends,
explicit LAC, close) or a *recovery writer* (``recovery=True``: the write-backs of
``recovery.py``, sent with the RECOVERY_ADD flag that fenced bookies accept, against the
IN_RECOVERY metadata). What the handle knows of the ledger lives in its ``LedgerView``.

Write path (per append: one digest, one future, one ADD frame sent to the ``WQ`` bookies of the
write set, no task):
- entry ids are assigned in call order; entry ``e`` goes to its write set
  ``{ensemble[(e + i) % E] : i < WQ}`` (round-robin striping, ``distribution.py``) and carries
  the writer's LAC at send time (piggy-backed LAC) and the cumulative ledger length;
- an entry is acknowledged to the caller once ``AQ`` bookies of its write set acknowledged it
  *and* every earlier entry was acknowledged: futures complete strictly in entry-id order, and
  the LAC is the last acknowledged entry.

``append_batch_async`` appends many entries in one call, in order: each is still its own
entry (digest, ADD frame to its write set: frames of one loop iteration leave each connection
in one write) but the batch has one future, completed with its last entry id once every entry
of it is acknowledged, and the checks and bookkeeping of a call are done once per batch (the
Spark sink appends a task's rows this way). The entries of a batch that are sent at once (and
the queued appends sent together when acks open the window) go to the bookie client in one
``add_quorum_batch_cb`` call: connections, clock and send once per bookie per batch, while each
(entry, bookie) is still its own request with its own deadline and answer.

Adds in flight are bounded (``max_adds_in_flight``, default 4096): ``append_async`` beyond it
still returns its future at once (entry id and length are fixed in call order) but the entry is
queued, built and sent once earlier adds are acknowledged, so one burst cannot flood a bookie.

Back-pressure (a bookie answers TOOMANYREQUESTS) is not a failure: the add is re-sent to the
same bookie after a short exponential backoff (5 ms doubling to 200 ms, jittered), and the
writer halves its send window (AIMD, floor 16, growing back ~1 per window of acks;
``backpressure.py``). Only an add still refused after the add timeout counts as a write failure
(then the ensemble changes).

Ensemble change (write failure to bookie ``i``: dead, timeout, read-only...):
- the placement policy picks a replacement (not in the ensemble, not read-only), preferring a
  bookie that never failed for this writer; when none is left, one that failed earlier and is
  registered writable again is taken back rather than keep the failing one (rule 11 of
  docs/correctness.md, "When no spare is left"); the new segment ``{LAC + 1 -> new ensemble}`` is written to
  the metadata by compare-and-set (``metadata_update.py``), and only then are the entries not
  yet acknowledged re-sent to the new bookie;
- ``on_ensemble_change(new metadata)``, when given, runs before every such compare-and-set and
  may refuse the change by raising: a named ledger's segment writer first writes the new bookies
  into its name record, so that whoever fences the name fences them too;
- while a change is in flight no entry is acknowledged to the caller (rule 5 of docs/correctness.md: never ack
  an entry whose ensemble is not in the persisted metadata); acks from a replaced bookie are
  ignored, so only bookies of the persisted ensemble count towards ``AQ``;
- a CAS conflict re-reads the metadata: if the ledger left the state this writer writes in
  (fenced: IN_RECOVERY/CLOSED by someone else, or deleted), every pending and later add fails.
- no replacement available (NotEnoughBookiesError): if every write set still has ``AQ`` live
  members the writer keeps going without the failed bookie (entries under-replicated, like
  BookKeeper's delayed ensemble change) and retries the change every second; otherwise every
  pending and later add fails. At most ``maxNumEnsembleChanges`` changes per writer.
A ``LedgerFencedError`` from a bookie fails the writer the same way, and so does a
``SecurityError`` (TLS refused either way, the bookie's certificate not trusted): that is this
client's or the cluster's configuration, not a failed bookie, and replacing the bookie would
only hide the reason behind a NotEnoughBookiesError.

Delayed write failure (rule 11 of docs/correctness.md): a write that fails or times out after its entry was
already acknowledged (the other ``AQ`` bookies were faster) still marks that bookie failed and
changes the ensemble, so a bookie that stops answering is replaced even while the ack quorum
holds; the change is persisted before any later ack (rule 5 of docs/correctness.md). The acknowledged entry itself stays
one copy short until re-replication repairs it: it is logged and counted in
``bookkeeper_client_ADD_ENTRY_UR`` (BookKeeper's under-replicated adds).

Close (rule 10 of docs/correctness.md): wait for pending adds, then CAS the metadata to CLOSED with
``last entry = LAC`` and the length at the LAC; a conflict re-reads, accepts a CLOSED ledger only
if its last entry equals this writer's LAC, and never overwrites anyone else's close. A recovery
writer closes through :meth:`LedgerWriter.close_metadata` at the recovered end instead, and
accepts a close by a concurrent recoverer.

``metadata_writes=False`` (a probe whose metadata came from elsewhere, e.g. a name record): the
writer never writes the ledger's metadata; an ensemble change or close fails with
``LedgerRecoveryError`` instead.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import math
from collections import deque
from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from vellum import stats
from vellum.client.backpressure import WINDOW_CUT_INTERVAL_S, backoff_delay, cut_window
from vellum.client.ledger_view import LedgerView
from vellum.client.metadata_update import EnsembleChangeHook, LedgerMetadataUpdater
from vellum.errors import (
    ClientClosedError,
    IllegalOpError,
    IncorrectParameterError,
    LedgerClosedError,
    LedgerFencedError,
    LedgerRecoveryError,
    NotEnoughBookiesError,
    SecurityError,
    TooManyRequestsError,
    UnauthorizedAccessError,
    VellumError,
    WriteError,
)
from vellum.format.entry import Entry, master_key
from vellum.meta.api import Versioned
from vellum.meta.model import LedgerMetadata

if TYPE_CHECKING:
    from vellum.client.context import ClientContext

log = logging.getLogger(__name__)

#: delay before retrying an ensemble change that found no replacement bookie
_ENSEMBLE_RETRY_S = 1.0
#: a bookie that failed a write of this ledger is taken back (no never-failed spare left) at most
#: once in this long: a bookie that is down (but still registered until its session times out)
#: fails a write at once, and taking such bookies back again and again made the writer change its
#: ensemble in a loop that never waited (docs/verification.md, "rack")
_TAKE_BACK_AFTER_S = _ENSEMBLE_RETRY_S
#: a test flag (docs/verification.md, "Regression seeds"): True as shipped; False takes a failed
#: bookie back however recently it was taken back (the defect above)
_wait_before_take_back = True
_ADDS_UNDER_REPLICATED = stats.counter(
    "bookkeeper_client_ADD_ENTRY_UR",
    "acknowledged entries that then missed a copy (a write to a bookie of their write set failed "
    "or timed out after the ack quorum answered): under-replicated until re-replication",
)

#: A write that fails after its entry was acknowledged still replaces its bookie
#: (rule 11 of docs/correctness.md). A test flag, for the simulator's regression seeds only
#: (docs/verification.md): they turn it off to show the defect it fixes is found again. Never
#: change it in production.
_replace_after_ack = True


def copy_error(exc: BaseException) -> BaseException:
    """A fresh exception of the same kind (one instance per future keeps tracebacks apart)."""
    if isinstance(exc, VellumError):
        return type(exc)(str(exc))
    return exc


class _PendingAdd:
    """An entry appended but not yet acknowledged to the caller (queued or sent)."""

    __slots__ = ("acked", "backoff_deadline", "backoffs", "data", "done", "entry", "entry_id", "future", "length")

    def __init__(
        self, entry_id: int, entry: bytes | memoryview | None, length: int, future: asyncio.Future[int] | None,
        data: bytes | None = None
    ) -> None:
        self.entry_id = entry_id
        # the stored bytes, kept for re-sending after an ensemble change; None while queued (the
        # entry is built when it is sent, so that it carries the LAC of that moment)
        self.entry = entry
        self.data = data  # the payload of a queued entry
        self.length = length  # cumulative ledger length including this entry
        # completed with the entry id once acknowledged; None for an entry of a batch other than
        # its last (the batch's one future is the last entry's)
        self.future = future
        self.done = False  # acknowledged to the caller, or failed
        self.acked = 0  # bitmask of ensemble indexes that acknowledged
        self.backoffs = 0  # re-sends after back-pressure (TooManyRequestsError)
        self.backoff_deadline = 0.0  # loop time after which back-pressure counts as a failure


class LedgerWriter:
    """The writer (or recovery writer) of one open ledger; see the module docstring. Made by
    ``LedgerHandle``, which registers itself in ``ctx.writers`` and forwards to it."""

    def __init__(
        self,
        ctx: ClientContext,
        view: LedgerView,
        password: bytes,
        *,
        recovery: bool = False,
        on_ensemble_change: EnsembleChangeHook | None = None,
        metadata_writes: bool = True,
    ) -> None:
        self._ctx = ctx
        self._bc = ctx.bookie_client
        self._config = ctx.config
        self._view = view
        self.ledger_id = view.ledger_id
        self._digest = view.digest
        self._master_key = master_key(password)
        self._loop = asyncio.get_running_loop()
        schedule = view.schedule
        self._E = schedule.ensemble_size
        self._WQ = schedule.write_quorum_size
        self._AQ = schedule.ack_quorum_size
        self._write_sets = schedule.write_sets  # indexed by entry_id % E on the append path
        self._add_timeout_s = float(self._config.add_entry_timeout_s)
        self.recovery = recovery
        self._metadata = LedgerMetadataUpdater(ctx, view, recovery=recovery, on_ensemble_change=on_ensemble_change,
                                               metadata_writes=metadata_writes)
        self._next_entry_id = view.lac + 1  # == last_add_pushed + 1
        self._pushed_length = view.lac_length
        self._pending: deque[_PendingAdd] = deque()  # sent, in entry-id order
        self._waiting: deque[_PendingAdd] = deque()  # appended beyond the in-flight bound, not sent
        self._max_in_flight = ctx.max_adds_in_flight
        self._window: float = self._max_in_flight  # current bound of adds in flight (<= the maximum)
        self._window_cut_at = 0.0
        self._error: BaseException | None = None  # set once: every later add fails with it
        self._closing = False
        self._close_future: asyncio.Future[None] | None = None
        # ensemble change state
        self._failed: dict[int, str] = {}  # ensemble index -> bookie that failed there
        self._ever_failed: set[str] = set()
        self._taken_back_at: dict[str, float] = {}  # bookie -> loop time it was last taken back
        self._changing_ensemble = False
        self._change_task: asyncio.Task[None] | None = None
        self._num_ensemble_changes = 0
        self._retry_timer: asyncio.TimerHandle | None = None
        # explicit LAC
        self._last_lac_sent = -1  # max of the piggy-backed LAC in sent entries and explicit LACs
        self._lac_timer: asyncio.TimerHandle | None = None
        self._background: set[asyncio.Task[Any]] = set()
        if not recovery and self._config.explicit_lac_interval_ms > 0:
            self._lac_timer = self._loop.call_later(
                self._config.explicit_lac_interval_ms / 1000.0, self._explicit_lac_tick
            )

    # ---------------------------------------------------------------------------- properties
    @property
    def last_add_pushed(self) -> int:
        return self._next_entry_id - 1

    @property
    def is_writable(self) -> bool:
        return not self._view.closed and not self._closing and self._error is None

    @property
    def stopped(self) -> bool:
        """True once this writer will confirm nothing more (closed, abandoned or failed)."""
        return self._view.closed or self._error is not None

    @property
    def max_adds_in_flight(self) -> int:
        """Adds this writer keeps in flight at most; appends beyond it wait in a queue."""
        return self._max_in_flight

    @max_adds_in_flight.setter
    def max_adds_in_flight(self, value: int) -> None:
        if value < 1:
            raise IncorrectParameterError(f"max_adds_in_flight must be >= 1, got {value}")
        self._max_in_flight = self._window = value
        self._send_waiting()

    @property
    def adds_in_flight(self) -> int:
        """Adds sent and not yet acknowledged (queued appends not included)."""
        return len(self._pending)

    @property
    def timers_armed(self) -> bool:
        """True while a timer of this writer (explicit LAC, ensemble-change retry) is pending."""
        return self._lac_timer is not None or self._retry_timer is not None

    # ================================================================================= adds
    def append_async(self, data: bytes | bytearray | memoryview) -> asyncio.Future[int]:
        """Append one entry; the future completes with its entry id once it is acknowledged.

        Call it many times without awaiting to pipeline; futures complete in entry-id order.
        """
        fut: asyncio.Future[int] = self._loop.create_future()
        refusal = self._append_refusal()
        if refusal is not None:
            fut.set_exception(refusal)
            return fut
        entry_id = self._next_entry_id
        self._next_entry_id = entry_id + 1
        length = self._pushed_length + len(data)
        self._pushed_length = length
        if len(self._pending) < self._window and not self._waiting:
            op = _PendingAdd(entry_id, self._build_entry(entry_id, length, data), length, fut)
            self._pending.append(op)
            self._send(op)
        else:
            # Bounded adds in flight: one burst must not flood the bookies. The id and length are
            # fixed now (call order); the entry is built and sent once earlier adds completed.
            payload = data if isinstance(data, bytes) else bytes(data)
            self._waiting.append(_PendingAdd(entry_id, None, length, fut, payload))
        return fut

    def append_batch_async(self, entries: Sequence[bytes | bytearray | memoryview]) -> asyncio.Future[int]:
        """Append ``entries`` in order, as many ``append_async`` calls would (ids in call
        order, the same in-flight bound, the same ordering of acknowledgements), with one
        future: it completes with the last entry's id once every entry of the batch is
        acknowledged, or fails with the writer's error (then no entry of the batch is known to
        be acknowledged past the LAC). An empty batch is refused (``IncorrectParameterError``):
        it would have no entry whose acknowledgement the future waits for."""
        fut: asyncio.Future[int] = self._loop.create_future()
        refusal = self._append_refusal()
        if refusal is not None:
            fut.set_exception(refusal)
            return fut
        if not entries:
            fut.set_exception(IncorrectParameterError(f"ledger {self.ledger_id}: append_batch_async of no entries"))
            return fut
        n = len(entries)
        first = self._next_entry_id
        # cumulative ledger length up to and including each entry
        lengths = list(itertools.accumulate(map(len, entries), initial=self._pushed_length))[1:]
        pending, waiting = self._pending, self._waiting
        # the leading entries that fit in the window now are built (one digest pass over the
        # run) and sent; the rest queue, as one append_async each would
        now = 0 if waiting else min(n, max(0, math.ceil(self._window - len(pending))))
        sent: list[_PendingAdd] = []
        if now:
            built = self._build_run(first, lengths[:now], entries[:now] if now < n else entries)
            sent = list(map(_PendingAdd, range(first, first + now), built, lengths, itertools.repeat(None, now)))
            pending.extend(sent)
        for k in range(now, n):
            data = entries[k]
            waiting.append(_PendingAdd(first + k, None, lengths[k], None, data if isinstance(data, bytes) else bytes(data)))
        (sent[-1] if now == n else waiting[-1]).future = fut  # the batch's one future: its last entry's
        self._next_entry_id = first + n
        self._pushed_length = lengths[-1]
        if sent:
            self._send_batch(sent)
        return fut

    def _append_refusal(self) -> BaseException | None:
        """Why this writer takes no append now (None: it does)."""
        if self.recovery:
            return (LedgerClosedError(f"ledger {self.ledger_id} is closed")
                    if self._view.closed or self._view.metadata.is_closed
                    else IllegalOpError(f"ledger {self.ledger_id} was opened read-only: appends are not allowed"))
        if self._closing or self._view.closed:
            return LedgerClosedError(f"ledger {self.ledger_id} is closed")
        if self._error is not None:
            return copy_error(self._error)
        return None

    def _lac_to_send(self) -> int:
        """The LAC an entry built now carries (remembered as sent: explicit LACs skip it)."""
        lac = self._view.lac
        if lac > self._last_lac_sent:
            self._last_lac_sent = lac
        return lac

    def _build_entry(self, entry_id: int, length: int, data: bytes | bytearray | memoryview) -> bytes:
        return self._digest.compute(entry_id, self._lac_to_send(), length, data)

    def _build_run(self, first_entry_id: int, lengths: Sequence[int],
                   payloads: Sequence[bytes | bytearray | memoryview]) -> list[bytes]:
        """``_build_entry`` of consecutive entries, sent now: they carry the same LAC."""
        return self._digest.compute_run(first_entry_id, self._lac_to_send(), lengths, payloads)

    def _send_waiting(self) -> None:
        """Send queued appends while fewer adds than the window are in flight."""
        waiting, pending = self._waiting, self._pending
        limit = self._window
        sent: list[_PendingAdd] = []
        while waiting and len(pending) < limit and self._error is None:
            op = waiting.popleft()
            if op.entry is None:
                assert op.data is not None
                op.entry = self._build_entry(op.entry_id, op.length, op.data)
                op.data = None
            pending.append(op)
            sent.append(op)
        if len(sent) == 1:
            self._send(sent[0])
        elif sent:
            self._send_batch(sent)

    def start_recovery(self, lac: int, length: int) -> None:
        """Recovery found the LAC (and the cumulative length at it): the write-backs of
        :meth:`recovery_add` continue from ``lac + 1``. Recovery writers only."""
        if not self.recovery:
            raise IllegalOpError(f"ledger {self.ledger_id}: start_recovery on a writer handle")
        view = self._view
        view.lac = lac
        self._next_entry_id = lac + 1
        view.lac_length = self._pushed_length = length

    def recovery_add(self, entry: bytes | memoryview, parsed: Entry) -> asyncio.Future[int]:
        """Write back a recovered entry (its stored bytes, unchanged, ``parsed`` = its verified
        header) with the RECOVERY_ADD flag, which fenced bookies accept. Entries must come in
        entry-id order from ``lac + 1`` (see :meth:`start_recovery`); the future completes with
        the entry id once ``AQ`` bookies have it. Recovery writers only."""
        fut: asyncio.Future[int] = self._loop.create_future()
        if not self.recovery:
            fut.set_exception(IllegalOpError(f"ledger {self.ledger_id}: recovery_add on a writer handle"))
            return fut
        if self._error is not None:
            fut.set_exception(copy_error(self._error))
            return fut
        if parsed.entry_id != self._next_entry_id:
            fut.set_exception(LedgerRecoveryError(
                f"ledger {self.ledger_id}: recovered entry {parsed.entry_id} out of order "
                f"(expected {self._next_entry_id})"
            ))
            return fut
        self._next_entry_id += 1
        self._pushed_length = parsed.length
        op = _PendingAdd(parsed.entry_id, entry, parsed.length, fut)
        if len(self._pending) < self._window and not self._waiting:
            self._pending.append(op)
            self._send(op)
        else:
            self._waiting.append(op)
        return fut

    def _send(self, op: _PendingAdd) -> None:
        """Send ``op`` to its write set (skipping bookies being replaced: the change re-sends)."""
        entry = op.entry
        assert entry is not None
        write_set = self._write_sets[op.entry_id % self._E]
        failed = self._failed
        if failed:
            write_set = tuple(idx for idx in write_set if idx not in failed)
        # One frame for the whole write set (the same buffers to each bookie), answered
        # through _on_add_done(op, idx, bookie, exc) without a closure per bookie.
        self._bc.add_quorum_cb(self._view.ensemble, write_set, self._master_key, entry, self.recovery,
                               self._on_add_done, op, self._add_timeout_s)

    def _send_batch(self, ops: list[_PendingAdd]) -> None:
        """:meth:`_send` of consecutive entries, in entry order, in one call to the bookie
        client (each entry still its own ADD to each bookie of its write set)."""
        write_sets = self._write_sets
        E = self._E
        failed = self._failed
        if failed:
            sets = [tuple(idx for idx in write_sets[op.entry_id % E] if idx not in failed) for op in ops]
        else:
            sets = [write_sets[op.entry_id % E] for op in ops]
        entries: list[bytes | memoryview] = []
        for op in ops:
            assert op.entry is not None  # built before it is sent
            entries.append(op.entry)
        self._bc.add_quorum_batch_cb(self._view.ensemble, sets, self._master_key, entries, self.recovery,
                                     self._on_add_done, ops, self._add_timeout_s)

    def _on_add_done(self, op: _PendingAdd, idx: int, bookie: str, exc: BaseException | None) -> None:
        if exc is None:
            if self._view.ensemble[idx] != bookie or op.done:
                return  # a replaced bookie's late answer, or an add already failed
            acked = op.acked | (1 << idx)
            op.acked = acked
            if acked.bit_count() >= self._AQ:  # below its quorum an entry completes nothing
                self._complete_adds()
            return
        if isinstance(exc, LedgerFencedError):
            self._fail(LedgerFencedError(
                f"ledger {self.ledger_id} is fenced (bookie {bookie} refused entry {op.entry_id}): "
                "another client opened it with recovery"
            ))
            return
        if isinstance(exc, (UnauthorizedAccessError, ClientClosedError, SecurityError)):
            self._fail(exc)
            return
        if self._view.ensemble[idx] != bookie or self._error is not None:
            return  # already replaced: the ensemble change re-sent (or will re-send) this entry
        if isinstance(exc, TooManyRequestsError) and idx not in self._failed:
            # Back-pressure is not a failure: the bookie is alive and asks us to slow down. Send
            # the entry to it again after a short, growing delay; only an add that stays refused
            # for the add timeout counts as a failed write (then the ensemble changes).
            now = self._loop.time()
            if now - self._window_cut_at >= WINDOW_CUT_INTERVAL_S:
                # Send less: the bookies' limit is below what this writer keeps in flight.
                self._window_cut_at = now
                self._window = cut_window(self._window, len(self._pending))
            if op.backoff_deadline == 0.0:
                op.backoff_deadline = now + self._add_timeout_s
            if now < op.backoff_deadline:
                delay = backoff_delay(op.backoffs)
                op.backoffs += 1
                self._loop.call_later(delay, self._resend_add, op, idx, bookie)
                return
        # Rule 11 of docs/correctness.md: an entry acknowledged by the others before this bookie failed is one copy
        # short; dropping the error would leave every later entry short too, with nothing said.
        acked = op.done
        if acked:
            _ADDS_UNDER_REPLICATED.inc()
            if not _replace_after_ack:
                return  # the defect the flag brings back: the late failure is dropped
        if self._failed.get(idx) == bookie:
            return  # already being replaced (said once, at its first failure)
        if acked:
            log.warning("ledger %d: entry %d was acknowledged, but its write to bookie %s then failed (%s): "
                        "under-replicated; replacing the bookie", self.ledger_id, op.entry_id, bookie, exc,
                        extra={"ledger_id": self.ledger_id, "entry_id": op.entry_id, "peer": str(bookie)})
        else:
            log.info("ledger %d: write of entry %d to bookie %s failed (%s); changing ensemble",
                     self.ledger_id, op.entry_id, bookie, exc,
                     extra={"ledger_id": self.ledger_id, "entry_id": op.entry_id, "peer": str(bookie)})
        self._failed[idx] = bookie
        self._ever_failed.add(bookie)
        if not self._changing_ensemble:
            self._changing_ensemble = True
            self._change_task = self._loop.create_task(self._change_ensemble())

    def _resend_add(self, op: _PendingAdd, idx: int, bookie: str) -> None:
        """Send ``op`` to ``bookie`` again after back-pressure, unless that became pointless."""
        if (self._error is not None or self._view.ensemble[idx] != bookie
                or idx in self._failed or op.acked & (1 << idx)):
            return  # failed, or the bookie is being replaced (the change re-sends)
        # An acknowledged entry is re-sent too: its copy on this bookie is still owed (rule 11 of docs/correctness.md).
        self._send_to(op, idx, bookie)

    def _send_to(self, op: _PendingAdd, idx: int, bookie: str) -> None:
        """Send ``op`` to one bookie of its write set (a re-send: back-pressure, ensemble change)."""
        entry = op.entry
        assert entry is not None
        self._bc.add_cb(bookie, self._master_key, entry, self.recovery,
                        functools.partial(self._on_add_done, op, idx, bookie), self._add_timeout_s)

    def _complete_adds(self) -> None:
        """Acknowledge, in entry-id order, every leading entry that reached its ack quorum."""
        if self._changing_ensemble:
            return  # rule 5 of docs/correctness.md: the new segment is not persisted yet
        pending = self._pending
        view = self._view
        aq = self._AQ
        advanced = False
        while pending:
            op = pending[0]
            if op.acked.bit_count() < aq:
                break
            pending.popleft()
            if self._window < self._max_in_flight:
                self._window += 1.0 / self._window  # about +1 per window of acknowledged adds
            view.lac = op.entry_id
            view.lac_length = op.length
            advanced = True
            op.done = True
            fut = op.future
            if fut is not None and not fut.done():
                fut.set_result(op.entry_id)
        if advanced:
            if self._waiting:
                self._send_waiting()
            view.wake()

    def _fail(self, exc: BaseException) -> None:
        """Fail every pending add and every later one with ``exc`` (the writer is unusable)."""
        if self._error is None:
            self._error = exc
        pending = self._pending
        self._pending = deque()
        waiting = self._waiting
        self._waiting = deque()
        for op in (*pending, *waiting):
            op.done = True
            fut = op.future
            if fut is not None and not fut.done():
                fut.set_exception(copy_error(exc))
        self._view.wake()

    # ======================================================================= ensemble change
    async def _change_ensemble(self) -> None:
        try:
            while self._failed and self._error is None:
                failed = dict(self._failed)
                if self._num_ensemble_changes >= self._config.max_num_ensemble_changes:
                    raise WriteError(
                        f"ledger {self.ledger_id}: maxNumEnsembleChanges "
                        f"({self._config.max_num_ensemble_changes}) reached"
                    )
                old_ensemble = self._view.ensemble
                new_ensemble = list(old_ensemble)
                for idx in sorted(failed):
                    new_ensemble[idx] = self._replacement(new_ensemble, idx, old_ensemble)
                first_entry_id = self._view.lac + 1
                await self._metadata.add_segment(first_entry_id, new_ensemble)  # the view adopts it
                log.info("ledger %d: ensemble change at entry %d: %s -> %s", self.ledger_id,
                         first_entry_id, old_ensemble, new_ensemble,
                         extra={"ledger_id": self.ledger_id, "entry_id": first_entry_id})
                self._num_ensemble_changes += 1
                for idx, bookie in failed.items():
                    if self._failed.get(idx) == bookie:
                        del self._failed[idx]
                # Re-send every entry not yet acknowledged to the bookies that replaced failed
                # ones: acks from the old bookies no longer count (the metadata does not list them).
                clear = 0
                for idx in failed:
                    clear |= 1 << idx
                write_sets, E = self._write_sets, self._E
                for op in list(self._pending):
                    op.acked &= ~clear
                    for idx in write_sets[op.entry_id % E]:
                        if idx in failed and idx not in self._failed:
                            self._send_to(op, idx, new_ensemble[idx])
        except NotEnoughBookiesError as e:
            if self._failed and self._view.schedule.ack_quorum_possible(self._failed):
                # No spare bookie, but every write set still has AQ live members: keep writing
                # to them (under-replicated, like BookKeeper's delayed ensemble change) and try
                # the change again later.
                log.warning("ledger %d: no replacement for failed bookies %s (%s); writing to the "
                            "remaining ones and retrying the ensemble change", self.ledger_id,
                            sorted(self._failed.values()), e, extra={"ledger_id": self.ledger_id})
                self._retry_timer = self._loop.call_later(_ENSEMBLE_RETRY_S, self._retry_ensemble_change)
            else:
                self._fail(NotEnoughBookiesError(
                    f"ledger {self.ledger_id}: no replacement bookie for the ensemble change: {e}"
                ))
        except VellumError as e:
            self._fail(e)
        except Exception as e:  # never leave adds hanging on an unexpected failure
            log.exception("ledger %d: ensemble change failed", self.ledger_id,
                          extra={"ledger_id": self.ledger_id})
            self._fail(WriteError(f"ledger {self.ledger_id}: ensemble change failed: {e!r}"))
        finally:
            self._changing_ensemble = False
            self._change_task = None
        self._complete_adds()

    def _replacement(self, new_ensemble: list[str], idx: int, old_ensemble: Sequence[str]) -> str:
        """A bookie for place ``idx`` (rule 11 of docs/correctness.md, "When no spare is left"):
        one that never failed a write of this ledger if the placement finds one; else one
        that failed earlier but is registered writable again (not one of the ensemble, which
        holds every bookie failing now, nor one taken back in the last ``_TAKE_BACK_AFTER_S``),
        rather than keep a bookie known to lack entries. ``NotEnoughBookiesError`` when neither
        exists (the change is retried after ``_ENSEMBLE_RETRY_S``)."""
        ctx = self._ctx
        taken = set(old_ensemble) | set(new_ensemble)

        def pick(exclude: set[str]) -> str:
            return ctx.placement.replace_bookie(
                new_ensemble, idx, self._WQ, writable=ctx.writable_bookies, read_only=ctx.read_only_bookies,
                exclude=frozenset(exclude), ack_quorum=self._AQ)

        try:
            return pick(taken | self._ever_failed)
        except NotEnoughBookiesError:
            if not self._ever_failed - taken:
                raise  # nobody to take back
        now = self._loop.time()
        recent = {b for b, at in self._taken_back_at.items() if now - at < _TAKE_BACK_AFTER_S} \
            if _wait_before_take_back else set()
        bookie = pick(taken | recent)
        self._taken_back_at[bookie] = now
        log.info("ledger %d: no bookie that never failed is left; taking back %s (it failed a write of this "
                 "ledger earlier and is registered writable again) for position %d", self.ledger_id, bookie, idx,
                 extra={"ledger_id": self.ledger_id, "peer": str(bookie)})
        return bookie

    def _retry_ensemble_change(self) -> None:
        self._retry_timer = None
        if self._failed and not self._changing_ensemble and self._error is None and not self._view.closed:
            self._changing_ensemble = True
            self._change_task = self._loop.create_task(self._change_ensemble())

    # ---------------------------------------------------------------------- explicit LAC
    def _explicit_lac_tick(self) -> None:
        self._lac_timer = None
        if self._view.closed or self._error is not None:
            return
        lac = self._view.lac
        if lac > self._last_lac_sent and not self._changing_ensemble:
            # The writer is idle (no entry carried this LAC): tell the bookies explicitly so that
            # tailing readers can read the last entries.
            self._last_lac_sent = lac
            self._spawn(self._send_explicit_lac(lac))
        self._lac_timer = self._loop.call_later(
            self._config.explicit_lac_interval_ms / 1000.0, self._explicit_lac_tick
        )

    async def _send_explicit_lac(self, lac: int) -> None:
        body = self._digest.compute_lac(lac)
        ensemble = self._view.ensemble
        results = await asyncio.gather(
            *(self._bc.write_lac(b, self.ledger_id, self._master_key, lac, body, timeout_s=self._add_timeout_s)
              for b in ensemble),
            return_exceptions=True,
        )
        for b, r in zip(ensemble, results):
            if isinstance(r, BaseException):
                log.debug("ledger %d: explicit LAC %d to bookie %s failed: %s", self.ledger_id, lac, b, r,
                          extra={"ledger_id": self.ledger_id, "peer": str(b)})

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = self._loop.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ------------------------------------------------------------------- stop / force / close
    def stop_timers(self) -> None:
        """Cancel this writer's timers (explicit LAC, ensemble-change retry). Idempotent; the
        writer stays usable otherwise."""
        if self._retry_timer is not None:
            self._retry_timer.cancel()
            self._retry_timer = None
        if self._lac_timer is not None:
            self._lac_timer.cancel()
            self._lac_timer = None

    def _stop(self) -> None:
        """The handle is closed: wake its LAC waiters, cancel background work."""
        self._view.closed = True
        self._view.wake()
        for task in list(self._background):
            task.cancel()

    def abandon(self) -> None:
        """Give the writer up without touching the ledger's metadata (no close): stops the timers
        and background work; adds not yet acknowledged and every later one fail with
        ``LedgerClosedError``. Idempotent."""
        self.stop_timers()
        if self._error is None and (self._pending or self._waiting):
            self._fail(LedgerClosedError(f"ledger {self.ledger_id}: handle abandoned"))
        self._stop()

    async def _drain(self) -> None:
        """Wait until every add sent so far completed (acknowledged or failed)."""
        while self._pending or self._waiting:
            # an entry of a batch without a future completes before its batch's last entry
            await asyncio.gather(*(op.future for op in (*self._pending, *self._waiting) if op.future is not None),
                                 return_exceptions=True)

    async def force(self) -> int:
        """Wait for every pending add, then ask the current ensemble to force the ledger to disk.

        Entries are fsynced before they are acknowledged, so this is a barrier; it returns the LAC.
        """
        await self._drain()
        if self._error is not None:
            raise copy_error(self._error)
        ensemble = self._view.ensemble
        results = await asyncio.gather(
            *(self._bc.force(b, self.ledger_id, timeout_s=self._add_timeout_s) for b in ensemble),
            return_exceptions=True,
        )
        ok = sum(1 for r in results if not isinstance(r, BaseException))
        if ok < self._AQ:
            errors = [r for r in results if isinstance(r, BaseException)]
            raise WriteError(f"ledger {self.ledger_id}: force reached {ok} bookies, need {self._AQ}: {errors[0]}")
        return self._view.lac

    async def close(self) -> None:
        """Close the writer; the ledger's writer closes the ledger in the metadata at its LAC (see
        the module docstring); a recovery writer leaves the metadata to :meth:`close_metadata`."""
        if self._close_future is not None:
            await asyncio.shield(self._close_future)
            return
        self._close_future = self._loop.create_future()
        self._closing = True
        try:
            self.stop_timers()
            view = self._view
            if not self.recovery and not view.metadata.is_closed:
                await self._drain()
                await self.close_metadata(view.lac, view.lac_length)
                for b in view.ensemble:
                    self._bc.ledger_closed(b, self.ledger_id)
            self._close_future.set_result(None)
        except BaseException as e:
            self._close_future.set_exception(copy_error(e))
            self._close_future.exception()  # retrieved: later close() calls re-raise it themselves
            raise
        finally:
            self._closing = False
            self._stop()

    async def close_metadata(self, last_entry_id: int, length: int) -> Versioned[LedgerMetadata]:
        """CAS the metadata to CLOSED(last_entry_id, length) (rule 10 of docs/correctness.md, conflict rules in
        ``metadata_update.py``); the handle adopts the closed metadata, which is returned. A
        recovery writer closes this way at the recovered end and accepts a concurrent
        recoverer's close."""
        return await self._metadata.close(last_entry_id, length)
