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

Ensemble change (write failure to bookie ``i``: dead, timeout, read-only, overloaded...):
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

Close (design.md rule 10): wait for pending adds, then CAS the metadata to CLOSED with
``last entry = LAC`` and the length at the LAC; a conflict re-reads, accepts a CLOSED ledger only
if its last entry equals this writer's LAC, and never overwrites anyone else's close.

Reads: only up to the LAC (``read_unconfirmed`` beyond it); each entry from the first replica of
its write set, a speculative read to the next replica after ``speculativeReadTimeout``, failover
on error; every entry is digest-verified, a bad replica is skipped.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import deque
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

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
    UnauthorizedAccessError,
    VellumError,
    WriteError,
)
from vellum.format.entry import DigestManager, DigestType, Entry, master_key
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


# ------------------------------------------------------------------------------ distribution


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
    configuration and the live bookie lists (kept current by the client's registration watches)."""

    def __init__(
        self,
        store: MetadataStore,
        bookie_client: BookieClient,
        placement: PlacementPolicy,
        config: ClientConfig,
    ) -> None:
        self.store = store
        self.bookie_client = bookie_client
        self.placement = placement
        self.config = config
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
    """An entry sent but not yet acknowledged to the caller."""

    __slots__ = ("acked", "entry", "entry_id", "future", "length")

    def __init__(self, entry_id: int, entry: bytes, length: int, future: asyncio.Future[int]) -> None:
        self.entry_id = entry_id
        self.entry = entry  # the stored bytes, kept for re-sending after an ensemble change
        self.length = length  # cumulative ledger length including this entry
        self.future = future
        self.acked = 0  # bitmask of ensemble indexes that acknowledged


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
        self._pending: deque[_PendingAdd] = deque()
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
        lac = self._lac
        self._last_lac_sent = lac if lac > self._last_lac_sent else self._last_lac_sent
        op = _PendingAdd(entry_id, self._digest.compute(entry_id, lac, length, data), length, fut)
        self._pending.append(op)
        self._send(op)
        return fut

    async def append(self, data: bytes | bytearray | memoryview) -> int:
        """Append one entry and wait for its acknowledgement; returns its entry id."""
        return await self.append_async(data)

    def _start_recovery(self, lac: int, length: int) -> None:
        """Recovery found the LAC (and the length at it): write-backs continue from LAC + 1."""
        self._lac = lac
        self._next_entry_id = lac + 1
        self._lac_length = self._pushed_length = length

    def _recovery_add(self, entry: bytes, parsed: Entry) -> asyncio.Future[int]:
        """Write back a recovered entry (its stored bytes, unchanged) with the RECOVERY_ADD flag."""
        fut: asyncio.Future[int] = self._loop.create_future()
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
        self._pending.append(op)
        self._send(op)
        return fut

    def _send(self, op: _PendingAdd) -> None:
        """Send ``op`` to its write set (skipping bookies being replaced: the change re-sends)."""
        E = self._E
        ens = self._ensemble
        failed = self._failed
        add_cb = self._bc.add_cb
        on_done = self._on_add_done
        eid = op.entry_id
        for i in range(self._WQ):
            idx = (eid + i) % E
            if failed and idx in failed:
                continue
            bookie = ens[idx]
            add_cb(bookie, self._master_key, op.entry, self._recovery_flag,
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
        log.info("ledger %d: write of entry %d to bookie %s failed (%s); changing ensemble",
                 self.ledger_id, op.entry_id, bookie, exc)
        self._failed[idx] = bookie
        self._ever_failed.add(bookie)
        if not self._changing_ensemble:
            self._changing_ensemble = True
            self._change_task = self._loop.create_task(self._change_ensemble())

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
            self._lac = op.entry_id
            self._lac_length = op.length
            advanced = True
            if not op.future.done():
                op.future.set_result(op.entry_id)
        if advanced and self._lac_event is not None:
            self._lac_event.set()

    def _fail(self, exc: BaseException) -> None:
        """Fail every pending add and every later one with ``exc`` (the handle is unusable)."""
        if self._error is None:
            self._error = exc
        pending = self._pending
        self._pending = deque()
        for op in pending:
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
                    for i in range(self._WQ):
                        idx = (op.entry_id + i) % E
                        if idx in failed and idx not in self._failed:
                            bookie = new_ensemble[idx]
                            self._bc.add_cb(bookie, self._master_key, op.entry, self._recovery_flag,
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

    def _stop_timers(self) -> None:
        if self._retry_timer is not None:
            self._retry_timer.cancel()
            self._retry_timer = None
        if self._lac_timer is not None:
            self._lac_timer.cancel()
            self._lac_timer = None

    def _spawn(self, coro: Any) -> None:
        task = self._loop.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ---------------------------------------------------------------------- force / close
    async def _drain(self) -> None:
        """Wait until every add sent so far completed (acknowledged or failed)."""
        while self._pending:
            await asyncio.gather(*(op.future for op in list(self._pending)), return_exceptions=True)

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
            self._stop_timers()
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

        Unstriped segments (E == WQ) use one BATCH_READ to a replica; striped ones read entry by entry.
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
        ensemble = self._md.ensemble_for(start_entry_id)
        if self._E == self._WQ:
            replicas = [ensemble[i] for i in write_set(start_entry_id, self._E, self._WQ)]
            count = last - start_entry_id + 1
            errors: list[BaseException] = []
            for bookie in replicas:
                try:
                    raws = await self._bc.batch_read(bookie, self.ledger_id, start_entry_id, count, max_size,
                                                     timeout_s=self._read_timeout_s)
                    out: list[LedgerEntry] = []
                    for i, raw in enumerate(raws[:count]):
                        verified = self._digest.verify(raw, start_entry_id + i)
                        out.append(LedgerEntry(self.ledger_id, verified.entry_id, verified.payload))
                    if out:
                        return out
                    errors.append(NoSuchEntryError("empty batch"))
                except VellumError as exc:
                    errors.append(exc)
            log.debug("ledger %d: batch read from %d failed on every replica (%s); reading entries",
                      self.ledger_id, start_entry_id, errors)
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

    async def _read_range(self, first: int, last: int) -> list[LedgerEntry]:
        window = 256
        out: list[LedgerEntry] = []
        lid = self.ledger_id
        for lo in range(first, last + 1, window):
            hi = min(last, lo + window - 1)
            if lo == hi:
                parts = [await self._read_entry(lo)]
            else:
                parts = await asyncio.gather(*(self._read_entry(e) for e in range(lo, hi + 1)))
            for e in parts:
                if self._mode == READER and e.lac > self._lac and not self._md.is_closed:
                    self._set_lac(e.lac, None)
                out.append(LedgerEntry(lid, e.entry_id, e.payload))
        return out

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
    errors: list[BaseException] = []
    tasks: dict[asyncio.Task[bytes], str] = {}
    next_replica = 0

    def launch() -> None:
        nonlocal next_replica
        bookie = replicas[next_replica]
        next_replica += 1
        tasks[asyncio.ensure_future(bc.read(bookie, ledger_id, entry_id, timeout_s=timeout_s))] = bookie

    launch()
    running = set(tasks)
    try:
        while running:
            spec = speculative_s if speculative_s > 0 and next_replica < len(replicas) else None
            done, running = await asyncio.wait(running, timeout=spec, return_when=asyncio.FIRST_COMPLETED)
            if not done:
                launch()  # speculative read: the replica is slow
                running = {t for t in tasks if not t.done()}
                continue
            for t in done:
                exc = t.exception()
                if exc is None:
                    try:
                        return digest.verify(t.result(), entry_id)
                    except DigestMismatchError as e:
                        log.warning("ledger %d entry %d: bad replica on bookie %s: %s", ledger_id, entry_id,
                                    tasks[t], e)
                        errors.append(e)
                else:
                    errors.append(exc)
                if next_replica < len(replicas):
                    launch()
            running = {t for t in tasks if not t.done()}
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()
    if errors and all(isinstance(e, _NEGATIVE) for e in errors):
        raise NoSuchEntryError(f"ledger {ledger_id}: no bookie of {list(replicas)} has entry {entry_id}")
    first = next((e for e in errors if not isinstance(e, _NEGATIVE)), None)
    if isinstance(first, VellumError):
        raise type(first)(f"ledger {ledger_id} entry {entry_id}: read failed on {list(replicas)}: {first}")
    raise ReadError(f"ledger {ledger_id} entry {entry_id}: read failed on {list(replicas)}: {errors}")
