"""A ledger handle: pipelined appends with quorum acks, ensemble changes, verified reads, LAC, close.

Responsibility: everything a client does with one open ledger (BookKeeper's ``LedgerHandle`` and
``ReadOnlyLedgerHandle``), on one asyncio loop. A handle is a *writer* (created, or the recovery
writer used by ``recovery.py``) or a *reader* (opened; read only).

Write path (per append: one digest, one future, ``WQ`` ``add_cb`` calls, no task):
- entry ids are assigned in call order; entry ``e`` goes to its write set
  ``{ensemble[(e + i) % E] : i < WQ}`` (round-robin striping) and carries the writer's LAC at send
  time (piggy-backed LAC) and the cumulative ledger length;
- an entry is acknowledged to the caller once ``AQ`` bookies of its write set acknowledged it
  *and* every earlier entry was acknowledged: futures complete strictly in entry-id order, and
  the LAC is the last acknowledged entry.

Adds in flight are bounded (``max_adds_in_flight``, default 4096): ``append_async`` beyond it
still returns its future at once (entry id and length are fixed in call order) but the entry is
queued, built and sent once earlier adds are acknowledged, so one burst cannot flood a bookie.

Back-pressure (a bookie answers TOOMANYREQUESTS) is not a failure: the add is re-sent to the
same bookie after a short exponential backoff (5 ms doubling to 200 ms, jittered), and the
handle halves its send window (AIMD, floor 16, growing back ~1 per window of acks). Only an add
still refused after the add timeout counts as a write failure (then the ensemble changes).

Ensemble change (write failure to bookie ``i``: dead, timeout, read-only...):
- the placement policy picks a replacement (not in the ensemble, not read-only, not a bookie that
  already failed for this handle); the new segment ``{LAC + 1 -> new ensemble}`` is written to the
  metadata by compare-and-set, and only then are the entries not yet acknowledged re-sent to the
  new bookie;
- while a change is in flight no entry is acknowledged to the caller (design.md rule 5: never ack
  an entry whose ensemble is not in the persisted metadata); acks from a replaced bookie are
  ignored, so only bookies of the persisted ensemble count towards ``AQ``;
- a CAS conflict re-reads the metadata: if the ledger left the state this handle writes in
  (fenced: IN_RECOVERY/CLOSED by someone else, or deleted), every pending and later add fails.
- no replacement available (NotEnoughBookiesError): if every write set still has ``AQ`` live
  members the writer keeps going without the failed bookie (entries under-replicated, like
  BookKeeper's delayed ensemble change) and retries the change every second; otherwise every
  pending and later add fails. At most ``maxNumEnsembleChanges`` changes per handle.
A ``LedgerFencedError`` from a bookie fails the handle the same way.

Delayed write failure (design.md rule 11): a write that fails or times out after its entry was
already acknowledged (the other ``AQ`` bookies were faster) still marks that bookie failed and
changes the ensemble, so a bookie that stops answering is replaced even while the ack quorum
holds; the change is persisted before any later ack (rule 5). The acknowledged entry itself stays
one copy short until re-replication repairs it: it is logged and counted in
``bookkeeper_client_ADD_ENTRY_UR`` (BookKeeper's under-replicated adds).

Close (design.md rule 10): wait for pending adds, then CAS the metadata to CLOSED with
``last entry = LAC`` and the length at the LAC; a conflict re-reads, accepts a CLOSED ledger only
if its last entry equals this writer's LAC, and never overwrites anyone else's close.

Reads: only up to the LAC (``read_unconfirmed`` beyond it); each entry from the first replica of
its write set, a speculative read to the next replica after ``speculativeReadTimeout``, failover
on error (another round after a backoff if every replica pushed back); every entry is
digest-verified, a bad replica is skipped. Ranges are pipelined: a sliding window of
``READ_WINDOW`` entry reads (callbacks, no task per entry); unstriped ledgers (E == WQ) read
BATCH_READ chunks, several in flight spread over the replicas, falling back to entry reads for
a chunk no replica serves whole. Results always come back in entry-id order.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import weakref
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from vellum import stats
from vellum.config import ClientConfig
from vellum.errors import (
    ClientClosedError,
    DigestMismatchError,
    IllegalOpError,
    IncorrectParameterError,
    LedgerClosedError,
    LedgerFencedError,
    LedgerRecoveryError,
    MetadataVersionError,
    NoSuchEntryError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
    ReadError,
    TooManyRequestsError,
    UnauthorizedAccessError,
    VellumError,
    WriteError,
)
from vellum.format.entry import ENTRY_HEADER_SIZE, DigestManager, DigestType, Entry, master_key
from vellum.ids import BookieId, LedgerId
from vellum.meta.api import MetadataStore, Versioned
from vellum.meta.model import LedgerMetadata, LedgerState

if TYPE_CHECKING:
    from vellum.client.bookie_client import BookieClient
    from vellum.client.placement import PlacementPolicy

log = logging.getLogger(__name__)

_T = TypeVar("_T")

#: errors that mean "this bookie does not have it" (explicit negatives for coverage)
_NEGATIVE = (NoSuchEntryError, NoSuchLedgerError)
#: delay before retrying an ensemble change that found no replacement bookie
_ENSEMBLE_RETRY_S = 1.0
_ADDS_UNDER_REPLICATED = stats.counter(
    "bookkeeper_client_ADD_ENTRY_UR",
    "acknowledged entries that then missed a copy (a write to a bookie of their write set failed "
    "or timed out after the ack quorum answered): under-replicated until re-replication",
)
#: back-pressure (TooManyRequestsError): first delay before re-sending to the same bookie, and
#: the cap of its exponential growth; the add still fails over after the add timeout
_BACKOFF_INITIAL_S = 0.005
_BACKOFF_MAX_S = 0.2
#: default bound of a handle's adds in flight (sent, not yet acknowledged); later appends queue
DEFAULT_MAX_ADDS_IN_FLIGHT = 4096
#: back-pressure shrinks a handle's send window (halved, at most once per this interval) down
#: to this floor; it grows back by about one per window of acknowledged adds (TCP-like AIMD),
#: up to ``max_adds_in_flight``
_MIN_WINDOW = 16
_WINDOW_CUT_INTERVAL_S = 0.005
#: entry reads outstanding at once in a range read (striped ledgers)
READ_WINDOW = 256
#: unstriped ledgers (E == WQ): entries per BATCH_READ, bytes per answer, chunks in flight
BATCH_CHUNK_ENTRIES = 256
BATCH_CHUNK_BYTES = 2 * 1024 * 1024
BATCH_WINDOW = 4


def backoff_delay(attempt: int) -> float:
    """Delay before retry ``attempt`` (0-based) after back-pressure: exponential from 5 ms,
    capped at 200 ms, with jitter so that rejected requests do not come back in one burst."""
    base = min(_BACKOFF_MAX_S, _BACKOFF_INITIAL_S * (1 << min(attempt, 16)))
    return base * (0.5 + random.random() / 2)


# ------------------------------------------------------------------------------ distribution


async def _gather_window(jobs: list[Callable[[], Awaitable[_T]]], window: int) -> list[_T]:
    """Run ``jobs`` with at most ``window`` at once; their results in job order. The first
    failure propagates and the jobs still pending are cancelled."""
    sem = asyncio.Semaphore(window)

    async def one(job: Callable[[], Awaitable[_T]]) -> _T:
        async with sem:
            return await job()

    tasks = [asyncio.ensure_future(one(job)) for job in jobs]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()


def write_set(entry_id: int, ensemble_size: int, write_quorum_size: int) -> list[int]:
    """Ensemble indexes storing ``entry_id``: round-robin striping (BookKeeper's
    ``RoundRobinDistributionSchedule``)."""
    return [(entry_id + i) % ensemble_size for i in range(write_quorum_size)]


def has_quorum_coverage(responded: set[int], ensemble_size: int, write_quorum_size: int, ack_quorum_size: int) -> bool:
    """True once every possible write set has ``(WQ - AQ) + 1`` members that answered.

    Then no write set can hold ``AQ`` bookies that did not answer, so no entry the answers do not
    show can have been acknowledged (BookKeeper's ``RRQuorumCoverageSet``).
    """
    need = write_quorum_size - ack_quorum_size + 1
    for start in range(ensemble_size):
        n = 0
        for i in range(write_quorum_size):
            if (start + i) % ensemble_size in responded:
                n += 1
        if n < need:
            return False
    return True


def ensemble_coverage(ensemble_size: int, ack_quorum_size: int) -> int:
    """Answers needed so that fewer than ``AQ`` bookies of the ensemble remain unfenced: ``(E - AQ) + 1``."""
    return ensemble_size - ack_quorum_size + 1


def copy_error(exc: BaseException) -> BaseException:
    """A fresh exception of the same kind (one instance per future keeps tracebacks apart)."""
    if isinstance(exc, VellumError):
        return type(exc)(str(exc))
    return exc


# --------------------------------------------------------------------------------- context


class ClientContext:
    """What handles share with their ``BookKeeper``: metadata store, bookie client, placement,
    configuration and the live bookie lists (kept current by the client's registration watches).

    ``writers``: every writing handle (writer or recovery) made on this context registers itself
    here, so that closing the client can stop their timers. ``max_adds_in_flight``: the bound of
    each handle's adds in flight (appends beyond it are queued, not sent).
    """

    def __init__(
        self,
        store: MetadataStore,
        bookie_client: BookieClient,
        placement: PlacementPolicy,
        config: ClientConfig,
        *,
        max_adds_in_flight: int = DEFAULT_MAX_ADDS_IN_FLIGHT,
    ) -> None:
        if max_adds_in_flight < 1:
            raise IncorrectParameterError(f"max_adds_in_flight must be >= 1, got {max_adds_in_flight}")
        self.store = store
        self.bookie_client = bookie_client
        self.placement = placement
        self.config = config
        self.max_adds_in_flight = max_adds_in_flight
        self.writers: weakref.WeakSet[LedgerHandle] = weakref.WeakSet()
        self.writable_bookies: frozenset[str] = frozenset()
        self.read_only_bookies: frozenset[str] = frozenset()

    async def meta(self, fn: Callable[..., _T], *args: Any) -> _T:
        """Run a blocking metadata-store call off the loop."""
        return await asyncio.to_thread(fn, *args)

    async def read_metadata(self, ledger_id: int) -> Versioned[LedgerMetadata]:
        return await self.meta(self.store.ledgers.read_ledger, LedgerId(ledger_id))

    async def write_metadata(self, ledger_id: int, md: LedgerMetadata, expected_version: int) -> int:
        return await self.meta(self.store.ledgers.write_ledger, LedgerId(ledger_id), md, expected_version)


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One entry as returned by reads (payload only; the header was verified)."""

    ledger_id: int
    entry_id: int
    payload: bytes

    @property
    def length(self) -> int:
        return len(self.payload)


class _PendingAdd:
    """An entry appended but not yet acknowledged to the caller (queued or sent)."""

    __slots__ = ("acked", "backoff_deadline", "backoffs", "data", "entry", "entry_id", "future", "length")

    def __init__(
        self, entry_id: int, entry: bytes | memoryview | None, length: int, future: asyncio.Future[int], data: bytes | None = None
    ) -> None:
        self.entry_id = entry_id
        # the stored bytes, kept for re-sending after an ensemble change; None while queued (the
        # entry is built when it is sent, so that it carries the LAC of that moment)
        self.entry = entry
        self.data = data  # the payload of a queued entry
        self.length = length  # cumulative ledger length including this entry
        self.future = future
        self.acked = 0  # bitmask of ensemble indexes that acknowledged
        self.backoffs = 0  # re-sends after back-pressure (TooManyRequestsError)
        self.backoff_deadline = 0.0  # loop time after which back-pressure counts as a failure


# ---------------------------------------------------------------------------------- handle

WRITER, RECOVERY, READER = "writer", "recovery", "reader"


class LedgerHandle:
    """An open ledger (see the module docstring). Create through ``BookKeeper``, not directly."""

    def __init__(
        self,
        ctx: ClientContext,
        ledger_id: int,
        metadata: Versioned[LedgerMetadata],
        password: bytes,
        *,
        mode: str = READER,
    ) -> None:
        self._ctx = ctx
        self._bc = ctx.bookie_client
        self._config = ctx.config
        self.ledger_id = ledger_id
        self._md = metadata.value
        self._md_version = metadata.version
        self._mode = mode
        self._password = password
        self._master_key = master_key(password)
        self._digest = DigestManager(ledger_id, DigestType(int(self._md.digest_type)), password)
        self._loop = asyncio.get_running_loop()
        md = self._md
        self._E = md.ensemble_size
        self._WQ = md.write_quorum_size
        self._AQ = md.ack_quorum_size
        self._ensemble: list[str] = list(md.last_ensemble)
        self._add_timeout_s = float(self._config.add_entry_timeout_s)
        self._read_timeout_s = float(self._config.read_entry_timeout_s)
        self._speculative_s = self._config.speculative_read_timeout_ms / 1000.0
        # LAC and the cumulative length at the LAC
        if md.is_closed:
            self._lac = md.last_entry_id
            self._lac_length = md.length
        else:
            self._lac = -1
            self._lac_length = 0
        self._next_entry_id = self._lac + 1  # == last_add_pushed + 1
        self._pushed_length = self._lac_length
        self._pending: deque[_PendingAdd] = deque()  # sent, in entry-id order
        self._waiting: deque[_PendingAdd] = deque()  # appended beyond the in-flight bound, not sent
        self._max_in_flight = ctx.max_adds_in_flight
        self._window: float = self._max_in_flight  # current bound of adds in flight (<= the maximum)
        self._window_cut_at = 0.0
        self._recovery_flag = mode == RECOVERY
        self._expected_state = LedgerState.IN_RECOVERY if mode == RECOVERY else LedgerState.OPEN
        self._error: BaseException | None = None  # set once: every later add fails with it
        self._closing = False
        self._closed = md.is_closed
        self._close_future: asyncio.Future[None] | None = None
        # ensemble change state
        self._failed: dict[int, str] = {}  # ensemble index -> bookie that failed there
        self._ever_failed: set[str] = set()
        self._changing_ensemble = False
        self._change_task: asyncio.Task[None] | None = None
        self._num_ensemble_changes = 0
        self._retry_timer: asyncio.TimerHandle | None = None
        # tailing: the writer wakes its own tail() readers when the LAC moves
        self._lac_event: asyncio.Event | None = None
        # explicit LAC
        self._last_lac_sent = -1  # max of the piggy-backed LAC in sent entries and explicit LACs
        self._lac_timer: asyncio.TimerHandle | None = None
        self._background: set[asyncio.Task[Any]] = set()
        if mode != READER:
            ctx.writers.add(self)
        if mode == WRITER and self._config.explicit_lac_interval_ms > 0:
            self._lac_timer = self._loop.call_later(
                self._config.explicit_lac_interval_ms / 1000.0, self._explicit_lac_tick
            )

    # ---------------------------------------------------------------------------- properties
    @property
    def metadata(self) -> LedgerMetadata:
        return self._md

    @property
    def metadata_version(self) -> int:
        return self._md_version

    @property
    def last_add_confirmed(self) -> int:
        return self._lac

    @property
    def last_add_pushed(self) -> int:
        return self._next_entry_id - 1

    @property
    def length(self) -> int:
        """Bytes of payload up to the LAC (for a closed ledger: the length in its metadata).

        A reader of an open ledger only knows it where it learnt the LAC from an entry header.
        """
        return self._lac_length

    @property
    def is_closed(self) -> bool:
        """True once the ledger is closed in the metadata (or this handle was closed)."""
        return self._closed or self._md.is_closed

    @property
    def is_writable(self) -> bool:
        return self._mode != READER and not self._closed and not self._closing and self._error is None

    @property
    def digest_manager(self) -> DigestManager:
        return self._digest

    @property
    def max_adds_in_flight(self) -> int:
        """Adds this handle keeps in flight at most; appends beyond it wait in a queue."""
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
    def ensemble(self) -> tuple[str, ...]:
        """The current (last) ensemble."""
        return tuple(self._ensemble)

    def __repr__(self) -> str:
        return (
            f"LedgerHandle(ledger_id={self.ledger_id}, mode={self._mode}, lac={self._lac}, "
            f"state={self._md.state.name})"
        )

    # ================================================================================= writes
    def append_async(self, data: bytes | bytearray | memoryview) -> asyncio.Future[int]:
        """Append one entry; the future completes with its entry id once it is acknowledged.

        Call it many times without awaiting to pipeline; futures complete in entry-id order.
        """
        fut: asyncio.Future[int] = self._loop.create_future()
        if self._mode != WRITER:
            fut.set_exception(
                LedgerClosedError(f"ledger {self.ledger_id} is closed")
                if self.is_closed
                else IllegalOpError(f"ledger {self.ledger_id} was opened read-only: appends are not allowed")
            )
            return fut
        if self._closing or self._closed:
            fut.set_exception(LedgerClosedError(f"ledger {self.ledger_id} is closed"))
            return fut
        if self._error is not None:
            fut.set_exception(copy_error(self._error))
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

    async def append(self, data: bytes | bytearray | memoryview) -> int:
        """Append one entry and wait for its acknowledgement; returns its entry id."""
        return await self.append_async(data)

    def _build_entry(self, entry_id: int, length: int, data: bytes | bytearray | memoryview) -> bytes:
        lac = self._lac
        if lac > self._last_lac_sent:
            self._last_lac_sent = lac
        return self._digest.compute(entry_id, lac, length, data)

    def _send_waiting(self) -> None:
        """Send queued appends while fewer adds than the window are in flight."""
        waiting, pending = self._waiting, self._pending
        limit = self._window
        while waiting and len(pending) < limit and self._error is None:
            op = waiting.popleft()
            if op.entry is None:
                assert op.data is not None
                op.entry = self._build_entry(op.entry_id, op.length, op.data)
                op.data = None
            pending.append(op)
            self._send(op)

    def start_recovery(self, lac: int, length: int) -> None:
        """Recovery found the LAC (and the cumulative length at it): the write-backs of
        :meth:`recovery_add` continue from ``lac + 1``. Recovery handles only."""
        if self._mode != RECOVERY:
            raise IllegalOpError(f"ledger {self.ledger_id}: start_recovery on a {self._mode} handle")
        self._lac = lac
        self._next_entry_id = lac + 1
        self._lac_length = self._pushed_length = length

    def recovery_add(self, entry: bytes | memoryview, parsed: Entry) -> asyncio.Future[int]:
        """Write back a recovered entry (its stored bytes, unchanged, ``parsed`` = its verified
        header) with the RECOVERY_ADD flag, which fenced bookies accept. Entries must come in
        entry-id order from ``lac + 1`` (see :meth:`start_recovery`); the future completes with
        the entry id once ``AQ`` bookies have it. Recovery handles only."""
        fut: asyncio.Future[int] = self._loop.create_future()
        if self._mode != RECOVERY:
            fut.set_exception(IllegalOpError(f"ledger {self.ledger_id}: recovery_add on a {self._mode} handle"))
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
        E = self._E
        ens = self._ensemble
        failed = self._failed
        add_cb = self._bc.add_cb
        on_done = self._on_add_done
        eid = op.entry_id
        entry = op.entry
        assert entry is not None
        for i in range(self._WQ):
            idx = (eid + i) % E
            if failed and idx in failed:
                continue
            bookie = ens[idx]
            add_cb(bookie, self._master_key, entry, self._recovery_flag,
                   functools.partial(on_done, op, idx, bookie), self._add_timeout_s)

    def _on_add_done(self, op: _PendingAdd, idx: int, bookie: str, exc: BaseException | None) -> None:
        if exc is None:
            if self._ensemble[idx] != bookie or op.future.done():
                return  # a replaced bookie's late answer, or an add already failed
            op.acked |= 1 << idx
            if (self._pending and self._pending[0] is op) or op.acked.bit_count() >= self._AQ:
                self._complete_adds()
            return
        if isinstance(exc, LedgerFencedError):
            self._fail(LedgerFencedError(
                f"ledger {self.ledger_id} is fenced (bookie {bookie} refused entry {op.entry_id}): "
                "another client opened it with recovery"
            ))
            return
        if isinstance(exc, (UnauthorizedAccessError, ClientClosedError)):
            self._fail(exc)
            return
        if self._ensemble[idx] != bookie or self._error is not None:
            return  # already replaced: the ensemble change re-sent (or will re-send) this entry
        if isinstance(exc, TooManyRequestsError) and idx not in self._failed:
            # Back-pressure is not a failure: the bookie is alive and asks us to slow down. Send
            # the entry to it again after a short, growing delay; only an add that stays refused
            # for the add timeout counts as a failed write (then the ensemble changes).
            now = self._loop.time()
            if now - self._window_cut_at >= _WINDOW_CUT_INTERVAL_S:
                # Send less: the bookies' limit is below what this handle keeps in flight.
                self._window_cut_at = now
                self._window = max(_MIN_WINDOW, min(self._window, len(self._pending)) // 2)
            if op.backoff_deadline == 0.0:
                op.backoff_deadline = now + self._add_timeout_s
            if now < op.backoff_deadline:
                delay = backoff_delay(op.backoffs)
                op.backoffs += 1
                self._loop.call_later(delay, self._resend_add, op, idx, bookie)
                return
        # Rule 11: an entry acknowledged by the others before this bookie failed is one copy
        # short; dropping the error would leave every later entry short too, with nothing said.
        acked = op.future.done() and not op.future.cancelled()
        if acked:
            _ADDS_UNDER_REPLICATED.inc()
        if self._failed.get(idx) == bookie:
            return  # already being replaced (said once, at its first failure)
        if acked:
            log.warning("ledger %d: entry %d was acknowledged, but its write to bookie %s then failed (%s): "
                        "under-replicated; replacing the bookie", self.ledger_id, op.entry_id, bookie, exc)
        else:
            log.info("ledger %d: write of entry %d to bookie %s failed (%s); changing ensemble",
                     self.ledger_id, op.entry_id, bookie, exc)
        self._failed[idx] = bookie
        self._ever_failed.add(bookie)
        if not self._changing_ensemble:
            self._changing_ensemble = True
            self._change_task = self._loop.create_task(self._change_ensemble())

    def _resend_add(self, op: _PendingAdd, idx: int, bookie: str) -> None:
        """Send ``op`` to ``bookie`` again after back-pressure, unless that became pointless."""
        if (self._error is not None or self._ensemble[idx] != bookie
                or idx in self._failed or op.acked & (1 << idx)):
            return  # failed, or the bookie is being replaced (the change re-sends)
        # An acknowledged entry is re-sent too: its copy on this bookie is still owed (rule 11).
        entry = op.entry
        assert entry is not None
        self._bc.add_cb(bookie, self._master_key, entry, self._recovery_flag,
                        functools.partial(self._on_add_done, op, idx, bookie), self._add_timeout_s)

    def _complete_adds(self) -> None:
        """Acknowledge, in entry-id order, every leading entry that reached its ack quorum."""
        if self._changing_ensemble:
            return  # rule 5: the new segment is not persisted yet
        pending = self._pending
        aq = self._AQ
        advanced = False
        while pending:
            op = pending[0]
            if op.acked.bit_count() < aq:
                break
            pending.popleft()
            if self._window < self._max_in_flight:
                self._window += 1.0 / self._window  # about +1 per window of acknowledged adds
            self._lac = op.entry_id
            self._lac_length = op.length
            advanced = True
            if not op.future.done():
                op.future.set_result(op.entry_id)
        if advanced:
            if self._waiting:
                self._send_waiting()
            if self._lac_event is not None:
                self._lac_event.set()

    def _fail(self, exc: BaseException) -> None:
        """Fail every pending add and every later one with ``exc`` (the handle is unusable)."""
        if self._error is None:
            self._error = exc
        pending = self._pending
        self._pending = deque()
        waiting = self._waiting
        self._waiting = deque()
        for op in (*pending, *waiting):
            if not op.future.done():
                op.future.set_exception(copy_error(exc))
        if self._lac_event is not None:
            self._lac_event.set()

    async def _change_ensemble(self) -> None:
        try:
            while self._failed and self._error is None:
                failed = dict(self._failed)
                if self._num_ensemble_changes >= self._config.max_num_ensemble_changes:
                    raise WriteError(
                        f"ledger {self.ledger_id}: maxNumEnsembleChanges "
                        f"({self._config.max_num_ensemble_changes}) reached"
                    )
                new_ensemble = list(self._ensemble)
                exclude = set(self._ensemble) | self._ever_failed
                ctx = self._ctx
                for idx in sorted(failed):
                    replacement = ctx.placement.replace_bookie(
                        new_ensemble, idx, self._WQ,
                        writable=ctx.writable_bookies, read_only=ctx.read_only_bookies,
                        exclude=frozenset(exclude),
                    )
                    new_ensemble[idx] = replacement
                    exclude.add(replacement)
                first_entry_id = self._lac + 1
                await self._persist_ensemble(first_entry_id, new_ensemble)
                log.info("ledger %d: ensemble change at entry %d: %s -> %s", self.ledger_id,
                         first_entry_id, self._ensemble, new_ensemble)
                self._ensemble = new_ensemble
                self._num_ensemble_changes += 1
                for idx, bookie in failed.items():
                    if self._failed.get(idx) == bookie:
                        del self._failed[idx]
                # Re-send every entry not yet acknowledged to the bookies that replaced failed
                # ones: acks from the old bookies no longer count (the metadata does not list them).
                clear = 0
                for idx in failed:
                    clear |= 1 << idx
                E = self._E
                for op in list(self._pending):
                    op.acked &= ~clear
                    entry = op.entry
                    assert entry is not None
                    for i in range(self._WQ):
                        idx = (op.entry_id + i) % E
                        if idx in failed and idx not in self._failed:
                            bookie = new_ensemble[idx]
                            self._bc.add_cb(bookie, self._master_key, entry, self._recovery_flag,
                                            functools.partial(self._on_add_done, op, idx, bookie),
                                            self._add_timeout_s)
        except NotEnoughBookiesError as e:
            if self._failed and self._ack_quorum_possible():
                # No spare bookie, but every write set still has AQ live members: keep writing
                # to them (under-replicated, like BookKeeper's delayed ensemble change) and try
                # the change again later.
                log.warning("ledger %d: no replacement for failed bookies %s (%s); writing to the "
                            "remaining ones and retrying the ensemble change", self.ledger_id,
                            sorted(self._failed.values()), e)
                self._retry_timer = self._loop.call_later(_ENSEMBLE_RETRY_S, self._retry_ensemble_change)
            else:
                self._fail(NotEnoughBookiesError(
                    f"ledger {self.ledger_id}: no replacement bookie for the ensemble change: {e}"
                ))
        except VellumError as e:
            self._fail(e)
        except Exception as e:  # never leave adds hanging on an unexpected failure
            log.exception("ledger %d: ensemble change failed", self.ledger_id)
            self._fail(WriteError(f"ledger {self.ledger_id}: ensemble change failed: {e!r}"))
        finally:
            self._changing_ensemble = False
            self._change_task = None
        self._complete_adds()

    def _ack_quorum_possible(self) -> bool:
        """Can every write set still reach AQ without the failed bookies?"""
        E, WQ = self._E, self._WQ
        for start in range(E):
            live = sum(1 for i in range(WQ) if (start + i) % E not in self._failed)
            if live < self._AQ:
                return False
        return True

    def _retry_ensemble_change(self) -> None:
        self._retry_timer = None
        if self._failed and not self._changing_ensemble and self._error is None and not self._closed:
            self._changing_ensemble = True
            self._change_task = self._loop.create_task(self._change_ensemble())

    async def _persist_ensemble(self, first_entry_id: int, new_ensemble: list[str]) -> None:
        """CAS the new segment into the metadata; on a conflict re-read and retry on top of it
        while the ledger is still in the state this handle writes in and its tail is ours."""
        fenced_cls = LedgerRecoveryError if self._mode == RECOVERY else LedgerFencedError
        for _ in range(100):
            md = self._md.with_ensemble(first_entry_id, [BookieId(b) for b in new_ensemble])
            try:
                version = await self._ctx.write_metadata(self.ledger_id, md, self._md_version)
            except MetadataVersionError:
                current = await self._ctx.read_metadata(self.ledger_id)
                cur = current.value
                if cur.state is not self._expected_state:
                    raise fenced_cls(
                        f"ledger {self.ledger_id} is {cur.state.name} in the metadata: fenced by another client"
                    ) from None
                if max(cur.ensembles) != max(self._md.ensembles) or cur.last_ensemble != self._md.last_ensemble:
                    raise fenced_cls(
                        f"ledger {self.ledger_id}: another client changed the ensemble of the open segment"
                    ) from None
                # Someone changed an earlier (closed) segment, e.g. re-replication: rebase.
                self._md, self._md_version = cur, current.version
                continue
            except NoSuchLedgerError:
                raise NoSuchLedgerError(f"ledger {self.ledger_id} was deleted") from None
            self._md, self._md_version = md, version
            return
        raise MetadataVersionError(f"ledger {self.ledger_id}: ensemble change lost too many CAS races")

    # ---------------------------------------------------------------------- explicit LAC
    def _explicit_lac_tick(self) -> None:
        self._lac_timer = None
        if self._closed or self._error is not None or self._mode != WRITER:
            return
        lac = self._lac
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
        results = await asyncio.gather(
            *(self._bc.write_lac(b, self.ledger_id, self._master_key, lac, body, timeout_s=self._add_timeout_s)
              for b in self._ensemble),
            return_exceptions=True,
        )
        for b, r in zip(self._ensemble, results):
            if isinstance(r, BaseException):
                log.debug("ledger %d: explicit LAC %d to bookie %s failed: %s", self.ledger_id, lac, b, r)

    def stop_timers(self) -> None:
        """Cancel this handle's timers (explicit LAC, ensemble-change retry). Idempotent; the
        handle stays usable otherwise. ``BookKeeper.close()`` calls it on every writing handle."""
        if self._retry_timer is not None:
            self._retry_timer.cancel()
            self._retry_timer = None
        if self._lac_timer is not None:
            self._lac_timer.cancel()
            self._lac_timer = None

    def abandon(self) -> None:
        """Give the handle up without touching the ledger's metadata (no close).

        For a writer that lost its ledger (fenced, no bookies) or a recovery probe whose result
        lives elsewhere: stops the timers and background work; adds not yet acknowledged and
        every later one fail with ``LedgerClosedError``; the ledger itself stays as it is in the
        metadata (the next opener's recovery decides its end). Idempotent.
        """
        self.stop_timers()
        if self._error is None and (self._pending or self._waiting):
            self._fail(LedgerClosedError(f"ledger {self.ledger_id}: handle abandoned"))
        self._closed = True
        if self._lac_event is not None:
            self._lac_event.set()
        for task in list(self._background):
            task.cancel()
        self._ctx.writers.discard(self)

    def _spawn(self, coro: Any) -> None:
        task = self._loop.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ---------------------------------------------------------------------- force / close
    async def _drain(self) -> None:
        """Wait until every add sent so far completed (acknowledged or failed)."""
        while self._pending or self._waiting:
            await asyncio.gather(*(op.future for op in (*self._pending, *self._waiting)), return_exceptions=True)

    async def force(self) -> int:
        """Wait for every pending add, then ask the current ensemble to force the ledger to disk.

        Entries are fsynced before they are acknowledged, so this is a barrier; it returns the LAC.
        """
        if self._mode == READER:
            return self._lac
        await self._drain()
        if self._error is not None:
            raise copy_error(self._error)
        results = await asyncio.gather(
            *(self._bc.force(b, self.ledger_id, timeout_s=self._add_timeout_s) for b in self._ensemble),
            return_exceptions=True,
        )
        ok = sum(1 for r in results if not isinstance(r, BaseException))
        if ok < self._AQ:
            errors = [r for r in results if isinstance(r, BaseException)]
            raise WriteError(f"ledger {self.ledger_id}: force reached {ok} bookies, need {self._AQ}: {errors[0]}")
        return self._lac

    async def close(self) -> None:
        """Close the handle; a writer closes the ledger in the metadata (see module docstring)."""
        if self._close_future is not None:
            await asyncio.shield(self._close_future)
            return
        self._close_future = self._loop.create_future()
        self._closing = True
        try:
            self.stop_timers()
            if self._mode == WRITER and not self._md.is_closed:
                await self._drain()
                await self._close_metadata(self._lac, self._lac_length)
                for b in self._ensemble:
                    self._bc.ledger_closed(b, self.ledger_id)
            self._close_future.set_result(None)
        except BaseException as e:
            self._close_future.set_exception(copy_error(e))
            self._close_future.exception()  # retrieved: later close() calls re-raise it themselves
            raise
        finally:
            self._closed = True
            self._closing = False
            if self._lac_event is not None:
                self._lac_event.set()
            for task in list(self._background):
                task.cancel()
            self._ctx.writers.discard(self)

    async def _close_metadata(self, last_entry_id: int, length: int) -> Versioned[LedgerMetadata]:
        """CAS the metadata to CLOSED(last_entry_id, length) (design.md rule 10).

        Conflict: re-read. CLOSED with the same last entry -> done (someone closed it the same
        way); CLOSED otherwise -> a writer gets LedgerFencedError, a recoverer accepts it (another
        recoverer won and its result is the ledger's). Left the expected state -> fenced; same
        state but changed -> rebase on it only if the open segment is unchanged.
        """
        while True:
            md = self._md.closed(last_entry_id, length)
            try:
                version = await self._ctx.write_metadata(self.ledger_id, md, self._md_version)
            except MetadataVersionError:
                current = await self._ctx.read_metadata(self.ledger_id)
                cur = current.value
                if cur.is_closed:
                    if cur.last_entry_id == last_entry_id or self._mode == RECOVERY:
                        self._adopt(current)
                        return current
                    raise LedgerFencedError(
                        f"ledger {self.ledger_id} was closed by another client at entry {cur.last_entry_id}; "
                        f"this writer's LAC is {last_entry_id}"
                    ) from None
                if cur.state is not self._expected_state or (
                    max(cur.ensembles) != max(self._md.ensembles) or cur.last_ensemble != self._md.last_ensemble
                ):
                    cls = LedgerRecoveryError if self._mode == RECOVERY else LedgerFencedError
                    raise cls(
                        f"ledger {self.ledger_id} is {cur.state.name} in the metadata and was changed by "
                        "another client: not closing over it"
                    ) from None
                self._md, self._md_version = cur, current.version
                continue
            current = Versioned(md, version)
            self._adopt(current)
            return current

    def _adopt(self, current: Versioned[LedgerMetadata]) -> None:
        self._md, self._md_version = current.value, current.version
        if current.value.is_closed:
            self._lac = current.value.last_entry_id
            self._lac_length = current.value.length

    # ================================================================================== reads
    async def read(self, first_entry_id: int, last_entry_id: int) -> list[LedgerEntry]:
        """Entries ``first..last`` (inclusive), all at or below the LAC."""
        self._check_range(first_entry_id, last_entry_id)
        if last_entry_id > self._lac:
            raise ReadError(
                f"ledger {self.ledger_id}: cannot read entries {first_entry_id}..{last_entry_id} beyond the "
                f"last add confirmed {self._lac} (use read_unconfirmed)"
            )
        return await self._read_range(first_entry_id, last_entry_id)

    async def read_unconfirmed(self, first_entry_id: int, last_entry_id: int) -> list[LedgerEntry]:
        """Entries ``first..last`` even beyond the LAC: no guarantee they stay (BookKeeper's
        ``readUnconfirmed``); an entry no bookie has raises NoSuchEntryError."""
        self._check_range(first_entry_id, last_entry_id)
        return await self._read_range(first_entry_id, last_entry_id)

    async def batch_read(self, start_entry_id: int, max_count: int, max_size: int = 0) -> list[LedgerEntry]:
        """Up to ``max_count`` entries (and about ``max_size`` bytes, 0 = no limit) from
        ``start_entry_id``, at or below the LAC; at least one if ``start`` <= LAC.

        Unstriped ledgers (E == WQ) use BATCH_READ: one request to a replica when ``max_size`` is
        set (the bookie enforces it), else pipelined chunks; striped ones read entry by entry,
        pipelined. Never crosses an ensemble change (one batch, one write set).
        """
        if start_entry_id < 0 or max_count <= 0:
            raise IncorrectParameterError(f"bad batch read start={start_entry_id} max_count={max_count}")
        if start_entry_id > self._lac:
            raise ReadError(
                f"ledger {self.ledger_id}: entry {start_entry_id} is beyond the last add confirmed {self._lac}"
            )
        last = min(self._lac, start_entry_id + max_count - 1)
        # Do not cross a segment boundary: one batch is served by one write set.
        for first in self._md.ensembles:
            if start_entry_id < first <= last:
                last = first - 1
                break
        if self._E == self._WQ and max_size > 0:
            got = await self._batch_from_replicas(start_entry_id, last, 0, max_size)
            if got:
                return self._to_ledger_entries(got)
            log.debug("ledger %d: batch read from %d failed on every replica; reading entries",
                      self.ledger_id, start_entry_id)
            entries = self._to_ledger_entries(await self._read_entries(start_entry_id, last))
        else:
            entries = await self._read_range(start_entry_id, last)
        if max_size > 0:
            size = 0
            for i, e in enumerate(entries):
                size += len(e.payload)
                if size > max_size and i > 0:
                    return entries[:i]
        return entries

    def _check_range(self, first: int, last: int) -> None:
        if first < 0 or first > last:
            raise IncorrectParameterError(f"ledger {self.ledger_id}: bad entry range {first}..{last}")
        if self._md.is_closed and last > self._md.last_entry_id:
            raise ReadError(
                f"ledger {self.ledger_id} is closed at entry {self._md.last_entry_id}; "
                f"cannot read up to {last}"
            )

    def _to_ledger_entries(self, entries: Sequence[Entry]) -> list[LedgerEntry]:
        """Payloads of verified entries; a reader of an open ledger learns the LAC they carry."""
        lid = self.ledger_id
        learn = self._mode == READER and not self._md.is_closed
        out: list[LedgerEntry] = []
        for e in entries:
            if learn and e.lac > self._lac:
                self._set_lac(e.lac, None)
            out.append(LedgerEntry(lid, e.entry_id, e.payload))
        return out

    async def _read_range(self, first: int, last: int) -> list[LedgerEntry]:
        """Entries ``first..last`` in order, pipelined: BATCH_READ chunks on unstriped ledgers
        (E == WQ), READ_STRIDED chunks on striped ones, a sliding window of single-entry reads
        for short ranges."""
        if last - first < 8:
            entries = await self._read_entries(first, last)
        elif self._E == self._WQ:
            entries = await self._read_batched(first, last)
        else:
            entries = await self._read_strided(first, last)
        return self._to_ledger_entries(entries)

    def _chunk_entries(self) -> int:
        """Entries per BATCH_READ / READ_STRIDED chunk: about ``BATCH_CHUNK_BYTES`` of them."""
        if self._lac >= 0 and self._lac_length > 0:
            # Stored entries carry the header and digest too: the bookie's size cap counts them.
            avg = self._lac_length // (self._lac + 1) + ENTRY_HEADER_SIZE + self._digest.digest_length
            return max(1, min(BATCH_CHUNK_ENTRIES, BATCH_CHUNK_BYTES // avg))
        return BATCH_CHUNK_ENTRIES

    async def _read_strided(self, first: int, last: int) -> list[Entry]:
        """Striped ledgers (E > WQ): ``first..last`` as READ_STRIDED chunks. The entries whose
        write set a bookie heads (``e % E``) are read from it with stride E, in chunks of about
        ``BATCH_CHUNK_BYTES``, at most ``BATCH_WINDOW`` in flight; what a bookie does not serve
        is read entry by entry (failover, speculative reads). Results in entry-id order."""
        E = self._E
        per_chunk = self._chunk_entries()
        starts = sorted(self._md.ensembles)
        chunks: list[tuple[int, int]] = []  # (first entry, count): one segment, one bookie
        for k, seg_first in enumerate(starts):
            lo = max(first, seg_first)
            hi = min(last, starts[k + 1] - 1) if k + 1 < len(starts) else last
            for r in range(E):
                e = lo + (r - lo) % E
                while e <= hi:
                    count = min(per_chunk, (hi - e) // E + 1)
                    chunks.append((e, count))
                    e += count * E
        chunks.sort()  # chunks of every bookie interleave in entry order
        parts = await _gather_window([functools.partial(self._strided_chunk, start, count)
                                      for start, count in chunks], BATCH_WINDOW)
        out = [e for part in parts for e in part]
        out.sort(key=lambda e: e.entry_id)
        return out

    async def _strided_chunk(self, start: int, count: int) -> list[Entry]:
        E = self._E
        bookie = self._md.ensemble_for(start)[start % E]
        out: list[Entry] = []
        nxt, remaining = start, count
        while remaining > 0:
            got: list[Entry] = []
            try:
                raws = await self._bc.read_strided(bookie, self.ledger_id, nxt, E, remaining, BATCH_CHUNK_BYTES,
                                                   timeout_s=self._read_timeout_s)
                got = [self._digest.verify(raw, nxt + i * E) for i, raw in enumerate(raws[:remaining])]
            except VellumError as e:
                log.debug("ledger %d: strided read of %d from %s failed: %s", self.ledger_id, nxt, bookie, e)
            if not got:
                # This bookie does not serve entry nxt: it goes the single-entry way (the other
                # replicas), and so does the rest of the chunk, concurrently.
                ids = [nxt + i * E for i in range(remaining)]
                out.extend(await asyncio.gather(*(self._read_entry(eid) for eid in ids)))
                break
            out.extend(got)
            nxt += len(got) * E  # a short answer (size cap, or a gap): ask again for the rest
            remaining -= len(got)
        return out

    async def _read_entries(self, first: int, last: int) -> list[Entry]:
        """Verified entries ``first..last`` in order, at most ``READ_WINDOW`` reads outstanding;
        each entry with its own speculative read and failover (``_EntryRead``). The first entry
        that cannot be read fails the whole range."""
        if first == last:
            return [await self._read_entry(first)]
        n = last - first + 1
        results: list[Entry | None] = [None] * n
        done: asyncio.Future[None] = self._loop.create_future()
        active: set[_EntryRead] = set()
        nxt = first
        remaining = n
        md = self._md
        E, WQ = self._E, self._WQ
        bc, digest, lid = self._bc, self._digest, self.ledger_id
        timeout_s, spec_s = self._read_timeout_s, self._speculative_s

        def start_more() -> None:
            nonlocal nxt
            while nxt <= last and len(active) < READ_WINDOW:
                eid = nxt
                nxt += 1
                ensemble = md.ensemble_for(eid)
                replicas = [ensemble[(eid + i) % E] for i in range(WQ)]
                r = _EntryRead(bc, digest, lid, eid, replicas, timeout_s, spec_s, on_done)
                active.add(r)
                r.start()

        def on_done(r: _EntryRead) -> None:
            nonlocal remaining
            active.discard(r)
            if done.done():
                return
            if r.error is not None:
                done.set_exception(r.error)
                return
            results[r.entry_id - first] = r.result
            remaining -= 1
            if remaining == 0:
                done.set_result(None)
            else:
                start_more()

        start_more()
        try:
            await done
        finally:
            for r in list(active):
                r.cancel()
        return results  # type: ignore[return-value]  # every slot is filled once done succeeded

    async def _read_batched(self, first: int, last: int) -> list[Entry]:
        """Unstriped ledgers: ``first..last`` as BATCH_READ chunks (``BATCH_CHUNK_ENTRIES``), at
        most ``BATCH_WINDOW`` in flight, spread over the replicas; a chunk no replica serves
        whole falls back to single-entry reads (failover and "no such entry" per entry)."""
        chunks: list[tuple[int, int]] = []
        bounds = sorted(self._md.ensembles)
        # Chunks of about BATCH_CHUNK_BYTES, so that big entries are read in parallel chunks
        # too (one chunk of 256 x 128 KiB entries was 16 sequential round trips to one replica).
        per_chunk = self._chunk_entries()
        lo = first
        while lo <= last:
            hi = min(last, lo + per_chunk - 1)
            for b in bounds:  # a chunk stays in one segment: one write set
                if lo < b <= hi:
                    hi = b - 1
                    break
            chunks.append((lo, hi))
            lo = hi + 1
        if len(chunks) == 1:
            return await self._read_chunk(first, last, 0)
        parts = await _gather_window([functools.partial(self._read_chunk, lo, hi, k)
                                      for k, (lo, hi) in enumerate(chunks)], BATCH_WINDOW)
        return [e for part in parts for e in part]

    async def _read_chunk(self, first: int, last: int, rotation: int) -> list[Entry]:
        out: list[Entry] = []
        nxt = first
        while nxt <= last:
            got = await self._batch_from_replicas(nxt, last, rotation, BATCH_CHUNK_BYTES)
            if not got:
                out.extend(await self._read_entries(nxt, last))
                break
            out.extend(got)
            nxt += len(got)  # a short answer (size cap): ask again for the rest
        return out

    async def _batch_from_replicas(self, first: int, last: int, rotation: int, max_size: int) -> list[Entry]:
        """One BATCH_READ of ``first..last`` (at most ``max_size`` bytes), verified; replicas of the
        write set tried from ``rotation``, the next one after ``speculativeReadTimeout`` or at once
        on an error. ``[]`` if no replica answered with a verified batch."""
        ensemble = self._md.ensemble_for(first)
        ws = write_set(first, self._E, self._WQ)
        replicas = [ensemble[ws[(rotation + i) % len(ws)]] for i in range(len(ws))]
        count = last - first + 1
        errors: list[BaseException] = []
        tasks: dict[asyncio.Task[list[bytes | memoryview]], str] = {}
        next_replica = 0

        def launch() -> None:
            nonlocal next_replica
            bookie = replicas[next_replica]
            next_replica += 1
            task = asyncio.ensure_future(self._bc.batch_read(
                bookie, self.ledger_id, first, count, max_size, timeout_s=self._read_timeout_s))
            tasks[task] = bookie

        launch()
        running = set(tasks)
        try:
            while running:
                spec = self._speculative_s if self._speculative_s > 0 and next_replica < len(replicas) else None
                done, running = await asyncio.wait(running, timeout=spec, return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    launch()
                    running = {t for t in tasks if not t.done()}
                    continue
                for t in done:
                    exc = t.exception()
                    if exc is None:
                        try:
                            raws = t.result()[:count]
                            got = [self._digest.verify(raw, first + i) for i, raw in enumerate(raws)]
                        except DigestMismatchError as e:
                            log.warning("ledger %d: bad batch from bookie %s at %d: %s", self.ledger_id,
                                        tasks[t], first, e)
                            errors.append(e)
                        else:
                            if got:
                                return got
                            errors.append(NoSuchEntryError("empty batch"))
                    else:
                        errors.append(exc)
                    if next_replica < len(replicas):
                        launch()
                running = {t for t in tasks if not t.done()}
        finally:
            for t in tasks:
                if not t.done():
                    t.cancel()
                elif not t.cancelled():
                    t.exception()
        log.debug("ledger %d: batch read %d..%d failed on every replica: %s", self.ledger_id, first, last, errors)
        return []

    async def _read_entry(self, entry_id: int) -> Entry:
        """One verified entry: first replica of its write set, speculative read to the next after
        ``speculativeReadTimeout``, the next replica at once on an error."""
        ensemble = self._md.ensemble_for(entry_id)
        replicas = [ensemble[i] for i in write_set(entry_id, self._E, self._WQ)]
        return await read_entry_from(
            self._bc, self._digest, self.ledger_id, entry_id, replicas,
            timeout_s=self._read_timeout_s, speculative_s=self._speculative_s,
        )

    def _set_lac(self, lac: int, length: int | None) -> None:
        if lac > self._lac:
            self._lac = lac
            if length is not None:
                self._lac_length = length
            if self._lac_event is not None:
                self._lac_event.set()

    # ----------------------------------------------------------------------------- LAC reads
    def _lac_from_answer(self, body: bytes, last: bytes) -> tuple[int, Entry | None]:
        """LAC a bookie knows: max(explicit LAC, piggy-backed LAC of its last entry)."""
        lac = -1
        entry: Entry | None = None
        if body:
            lac = self._digest.verify_lac(body)
        if last:
            entry = self._digest.verify(last)
            lac = max(lac, entry.lac)
        return lac, entry

    def _min_lac(self) -> int:
        # Entries before the last segment were all acknowledged: the segment starts at LAC + 1.
        return max(self._md.ensembles) - 1

    async def read_last_add_confirmed(self) -> int:
        """Ask the last ensemble for the LAC and answer at quorum coverage (every write set has
        ``(WQ - AQ) + 1`` answers); the handle's LAC advances to it."""
        if self._md.is_closed or self._mode != READER:
            return self._lac
        return await self._read_lac(first_only=False)

    async def try_read_last_add_confirmed(self) -> int:
        """Best effort: the LAC from the first bookie that answers."""
        if self._md.is_closed or self._mode != READER:
            return self._lac
        return await self._read_lac(first_only=True)

    async def _read_lac(self, *, first_only: bool) -> int:
        ensemble = list(self._ensemble)
        E, WQ, AQ = self._E, self._WQ, self._AQ
        responded: set[int] = set()
        best = max(self._lac, self._min_lac())
        errors: list[BaseException] = []
        tasks = {
            asyncio.ensure_future(self._bc.read_lac(b, self.ledger_id, timeout_s=self._read_timeout_s)): i
            for i, b in enumerate(ensemble)
        }
        try:
            pending = set(tasks)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    idx = tasks[t]
                    exc = t.exception()
                    if exc is None:
                        try:
                            lac, _ = self._lac_from_answer(*t.result())
                        except DigestMismatchError as e:
                            errors.append(e)
                            continue
                        best = max(best, lac)
                        responded.add(idx)
                        if first_only:
                            self._set_lac(best, None)
                            return self._lac
                    elif isinstance(exc, _NEGATIVE):
                        responded.add(idx)
                    else:
                        errors.append(exc)
                if not first_only and has_quorum_coverage(responded, E, WQ, AQ):
                    self._set_lac(best, None)
                    return self._lac
        finally:
            for t in tasks:
                if not t.done():
                    t.cancel()
        if first_only and responded:
            self._set_lac(best, None)
            return self._lac
        raise ReadError(
            f"ledger {self.ledger_id}: LAC read reached no quorum coverage "
            f"({len(responded)} of {E} bookies answered; errors: {errors})"
        )

    async def wait_for_lac(self, previous_lac: int, timeout_s: float) -> int:
        """Long poll: return once the LAC passes ``previous_lac`` or ``timeout_s`` elapse (then
        the best LAC known). Any bookie's LAC is a confirmed one, so the first that moved wins."""
        if self._lac > previous_lac or self._md.is_closed:
            return self._lac
        if self._mode != READER:
            event = self._lac_event
            if event is None:
                event = self._lac_event = asyncio.Event()
            event.clear()
            if self._lac <= previous_lac and not self._closed:
                try:
                    await asyncio.wait_for(event.wait(), timeout_s)
                except TimeoutError:
                    pass
            return self._lac
        start = self._loop.time()
        timeout_ms = max(1, int(timeout_s * 1000))
        tasks = [
            asyncio.ensure_future(self._bc.long_poll_lac(b, self.ledger_id, previous_lac, timeout_ms))
            for b in self._ensemble
        ]
        best = max(self._lac, self._min_lac())
        any_ok = False
        try:
            pending = set(tasks)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    if t.exception() is not None:
                        continue
                    try:
                        lac, _ = self._lac_from_answer(*t.result())
                    except DigestMismatchError:
                        continue
                    any_ok = True
                    best = max(best, lac)
                if best > previous_lac:
                    break
        finally:
            for t in tasks:
                if not t.done():
                    t.cancel()
        if not any_ok:
            # Every bookie failed at once: do not let a tail loop spin.
            remaining = timeout_s - (self._loop.time() - start)
            if remaining > 0:
                await asyncio.sleep(min(remaining, 0.1))
        self._set_lac(best, None)
        return self._lac

    async def refresh_metadata(self) -> LedgerMetadata:
        """Re-read the metadata (a reader notices CLOSED and ensemble changes)."""
        current = await self._ctx.read_metadata(self.ledger_id)
        if current.version != self._md_version and self._mode == READER:
            self._md, self._md_version = current.value, current.version
            self._ensemble = list(current.value.last_ensemble)
            if current.value.is_closed:
                self._lac = current.value.last_entry_id
                self._lac_length = current.value.length
                if self._lac_event is not None:
                    self._lac_event.set()
        return self._md

    async def tail(
        self, start_entry_id: int = 0, *, poll_timeout_s: float = 1.0, batch_size: int = 64
    ) -> AsyncGenerator[LedgerEntry, None]:
        """Yield every entry from ``start_entry_id`` in order as it becomes confirmed; ends once
        the ledger is closed and its last entry was yielded."""
        next_id = start_entry_id
        while True:
            if next_id <= self._lac:
                hi = min(self._lac, next_id + batch_size - 1)
                for entry in await self._read_range(next_id, hi):
                    yield entry
                next_id = hi + 1
                continue
            if self._md.is_closed:
                if next_id > self._md.last_entry_id:
                    return
                continue
            if self._mode != READER and (self._closed or self._error is not None):
                return  # our own writer stopped: nothing more will be confirmed
            before = self._lac
            lac = await self.wait_for_lac(before, poll_timeout_s)
            if lac <= before and self._mode == READER:
                await self.refresh_metadata()


# ----------------------------------------------------------------------------- replica reads

#: rounds over a write set whose replicas all pushed back (TooManyRequestsError) before giving up
_READ_BACKOFF_ROUNDS = 8


class _EntryRead:
    """Reads and verifies one entry from its replicas with callbacks only (no task, no coroutine):
    the first replica; a speculative read to the next one every ``speculative_s`` without an
    answer; the next one at once on an error or a bad digest. If every replica pushed back
    (TooManyRequestsError), another round after a short backoff, within the read timeout.

    ``on_done(self)`` runs exactly once (unless cancelled), with ``result`` or ``error`` set.
    """

    __slots__ = ("bc", "deadline", "digest", "entry_id", "error", "errors", "finished", "futures", "ledger_id",
                 "loop", "next_replica", "on_done", "outstanding", "replicas", "result", "rounds", "speculative_s",
                 "timeout_s", "timer")

    def __init__(
        self,
        bc: BookieClient,
        digest: DigestManager,
        ledger_id: int,
        entry_id: int,
        replicas: Sequence[str],
        timeout_s: float,
        speculative_s: float,
        on_done: Callable[[_EntryRead], None],
    ) -> None:
        self.bc = bc
        self.digest = digest
        self.ledger_id = ledger_id
        self.entry_id = entry_id
        self.replicas = replicas
        self.timeout_s = timeout_s
        self.speculative_s = speculative_s
        self.on_done = on_done
        self.loop = asyncio.get_running_loop()
        self.deadline = 0.0
        self.next_replica = 0
        self.outstanding = 0
        self.rounds = 0
        self.errors: list[BaseException] = []
        self.futures: list[asyncio.Future[bytes | memoryview]] = []
        self.timer: asyncio.TimerHandle | None = None
        self.result: Entry | None = None
        self.error: BaseException | None = None
        self.finished = False

    def start(self) -> None:
        self.deadline = self.loop.time() + self.timeout_s
        self._launch()

    def cancel(self) -> None:
        """Stop: no callback, outstanding answers are dropped."""
        self.finished = True
        self._stop()

    def _stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        for f in self.futures:
            if not f.done():
                f.cancel()

    def _launch(self) -> None:
        bookie = self.replicas[self.next_replica]
        self.next_replica += 1
        fut = self.bc.read_future(bookie, self.ledger_id, self.entry_id, timeout_s=self.timeout_s)
        self.futures.append(fut)
        self.outstanding += 1
        fut.add_done_callback(functools.partial(self._answered, bookie))
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.speculative_s > 0 and self.next_replica < len(self.replicas):
            self.timer = self.loop.call_later(self.speculative_s, self._speculate)

    def _speculate(self) -> None:
        self.timer = None
        if not self.finished and self.next_replica < len(self.replicas):
            self._launch()  # the replica is slow: ask the next one too

    def _answered(self, bookie: str, fut: asyncio.Future[bytes]) -> None:
        if self.finished or fut.cancelled():
            return
        self.outstanding -= 1
        exc = fut.exception()
        if exc is None:
            try:
                entry = self.digest.verify(fut.result(), self.entry_id)
            except DigestMismatchError as e:
                log.warning("ledger %d entry %d: bad replica on bookie %s: %s", self.ledger_id, self.entry_id,
                            bookie, e)
                self.errors.append(e)
            else:
                self._finish(entry, None)
                return
        else:
            self.errors.append(exc)
        if self.next_replica < len(self.replicas):
            self._launch()  # failover at once
        elif self.outstanding == 0:
            recent = self.errors[-len(self.replicas):]
            if (all(isinstance(e, TooManyRequestsError) for e in recent) and self.rounds < _READ_BACKOFF_ROUNDS
                    and self.loop.time() < self.deadline):
                # Every replica pushed back: back-pressure, not a failure. Another round later.
                delay = backoff_delay(self.rounds)
                self.rounds += 1
                self.next_replica = 0
                self.timer = self.loop.call_later(delay, self._retry_round)
                return
            self._finish(None, read_failure(self.ledger_id, self.entry_id, self.replicas, self.errors))

    def _retry_round(self) -> None:
        self.timer = None
        if not self.finished:
            self._launch()

    def _finish(self, entry: Entry | None, error: BaseException | None) -> None:
        self.finished = True
        self.result, self.error = entry, error
        self._stop()
        self.on_done(self)


def read_failure(ledger_id: int, entry_id: int, replicas: Sequence[str], errors: list[BaseException]) -> VellumError:
    """The error of a read that no replica served: NoSuchEntryError if every replica said it has
    no such entry, else the first other error (its class, with the context)."""
    if errors and all(isinstance(e, _NEGATIVE) for e in errors):
        return NoSuchEntryError(f"ledger {ledger_id}: no bookie of {list(replicas)} has entry {entry_id}")
    first = next((e for e in errors if not isinstance(e, _NEGATIVE)), None)
    if isinstance(first, VellumError):
        return type(first)(f"ledger {ledger_id} entry {entry_id}: read failed on {list(replicas)}: {first}")
    return ReadError(f"ledger {ledger_id} entry {entry_id}: read failed on {list(replicas)}: {errors}")


async def read_entry_from(
    bc: BookieClient,
    digest: DigestManager,
    ledger_id: int,
    entry_id: int,
    replicas: Sequence[str],
    *,
    timeout_s: float,
    speculative_s: float,
) -> Entry:
    """Read and verify ``entry_id`` from ``replicas`` in order (speculative + failover).

    Raises NoSuchEntryError if every replica said it has no such entry, else the first other error.
    """
    fut: asyncio.Future[Entry] = asyncio.get_running_loop().create_future()

    def on_done(r: _EntryRead) -> None:
        if fut.done():
            return
        if r.error is not None:
            fut.set_exception(r.error)
        else:
            assert r.result is not None
            fut.set_result(r.result)

    reader = _EntryRead(bc, digest, ledger_id, entry_id, replicas, timeout_s, speculative_s, on_done)
    reader.start()
    try:
        return await fut
    finally:
        if not reader.finished:
            reader.cancel()
