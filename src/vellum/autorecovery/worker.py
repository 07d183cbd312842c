"""A replication worker: heals under-replicated ledgers one at a time (BookKeeper's
``ReplicationWorker``).

Loop: take the lock of an under-replicated ledger nobody works on; find its bad fragments;
replace each (copy, then one compare-and-set of the ledger's metadata); when none is left,
delete the record (only if nobody marked it again meanwhile) and let go of the lock.

A ledger that cannot heal because no bookie may take a fragment's place (no spare bookie, or
the placement policy's constraint cannot be met: ``cannot_heal``) is said once: the reason is
recorded in the metadata store and logged as a warning only when it is new or changed; the
ledger is retried when the registered bookies change, else every ``BLOCKED_RETRY_S``.

A fragment is bad when its bookie is not registered (lost, decommissioned), or when the record
names the bookie (the auditor found entries missing or corrupt there) and a verified read of
the fragment from it fails. Replacing a fragment:
1. pick a bookie for its position through the placement policy (not in the segment, and not a
   lost one: a bookie the record names that is registered again is a fine target, and so is a
   registered bookie whose fragment of another segment of this ledger is bad, as in BookKeeper:
   avoiding it too left two such bookies blocking each other on a small cluster);
2. copy the fragment's entries to it (``copier``: read from the surviving replicas, digest
   verified, recovery adds, batched, throttled);
3. CAS the segment with the new bookie in that position; on a conflict re-read and retry while
   the segment still names the bad bookie there (a writer's ensemble change only adds segments;
   the writer rebases over ours, see ``client/metadata_update``). If someone else replaced it,
   the copy is left as extra replicas (GC of over-replicated ledgers is BookKeeper's business
   too); nothing is ever copied twice into one fragment by one worker holding the lock.

Open ledgers: the writer keeps writing meanwhile; closed segments are healed at once. The open
segment (the last of an unclosed ledger) has no end yet: it is left to its writer, who replaces
a failed bookie itself when it writes, for ``openLedgerRereplicationGracePeriod`` after the
record was made (by the wall clock against the record's ctime, and at most that long after this
worker first deferred it, by its monotonic clock: a wall clock stepped back cannot stretch it);
past that the worker fences and recovers the ledger (closing it), then heals the now closed
segment. A ledger deleted meanwhile is done. Any failure releases the lock (the
ledger is retried after ``rwRereplicateBackoffMs``, by this or another worker); a worker that
dies loses its lock with its metadata session.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import socket
import time

from vellum import stats
from vellum.autorecovery.cannot_heal import (
    NOT_ENOUGH_BOOKIES,
    CannotHealError,
    CannotHealRecords,
    no_spare_bookie,
    placement_unmet,
)
from vellum.autorecovery.copier import FragmentCopier
from vellum.autorecovery.fragments import Fragment, fragments, replace_bookie
from vellum.autorecovery.settings import AutoRecoverySettings
from vellum.client.bookkeeper import BookKeeper
from vellum.client.recovery import recover_ledger
from vellum.errors import MetadataVersionError, NoSuchLedgerError, NotEnoughBookiesError, VellumError
from vellum.ids import LedgerId
from vellum.meta.api import UnderReplicatedLedger, UnderReplicationManager, Versioned
from vellum.meta.model import LedgerMetadata

log = logging.getLogger(__name__)

REREPLICATED = stats.counter("replication_worker_REREPLICATED_LEDGERS", "ledgers a replication worker healed")
FRAGMENTS = stats.counter("replication_worker_REPLACED_FRAGMENTS", "fragments copied to a replacement bookie")
FAILED = stats.counter("replication_worker_FAILED_LEDGERS", "attempts that left a ledger for a retry")

_MAX_CAS = 50
#: test flag (the simulator's regression seed): avoid, as targets, every bookie whose fragments of
#: the ledger are bad, registered or not (the behaviour before the fix)
_avoid_registered_bad_bookies = False
#: test flag (the simulator's regression seed): give up on a ledger at its first fragment no
#: bookie may take, leaving the others unhealed (the behaviour before the fix)
_stop_at_unhealable_fragment = False
#: test flag (the simulator's regression test): False reverts the fix that ends an open ledger's
#: grace period once this worker itself deferred the ledger that long (its monotonic clock), so a
#: wall clock stepped back after the ledger was marked no longer holds its recovery for the step
_bound_grace_by_own_wait = True
#: seconds before a ledger that cannot heal is tried again while the registered bookies stay the same
BLOCKED_RETRY_S = 60.0


class Outcome(enum.Enum):
    HEALED = "healed"        # nothing bad is left: the record may go
    DEFERRED = "deferred"    # only the open fragment of an unclosed ledger is left, in its grace
    FAILED = "failed"        # retry later


class ReplicationWorker:
    """See the module docstring. ``run`` until ``stop`` is set; ``heal`` one ledger."""

    def __init__(self, bk: BookKeeper, settings: AutoRecoverySettings, *, worker_id: str | None = None) -> None:
        self._bk = bk
        self._settings = settings
        self.worker_id = worker_id or socket.gethostname()
        self._copier = FragmentCopier(bk.context.bookie_client, batch=settings.entry_batch_size,
                                      rate_bytes=settings.rate_by_bytes, timeout_s=settings.request_timeout_s,
                                      yield_target_s=settings.yield_target_s)
        #: ledger -> monotonic time before which this worker leaves it alone
        self._retry_after: dict[int, float] = {}
        #: ledgers left because they cannot heal, retried early when the bookies change
        self._blocked: set[int] = set()
        self._bookies_seen: frozenset[str] = frozenset()
        self.cannot_heal = CannotHealRecords(bk.store.kv)
        self.current: int | None = None
        #: ledgers whose lock this worker holds but failed to release: released before the next one
        self._unreleased: set[int] = set()
        #: ledger -> (record version, monotonic time) this worker first deferred its open fragment
        self._deferring: dict[int, tuple[int, float]] = {}
        #: bookies whose answer to this worker's last verified read of them was unknown (checked first)
        self._unanswered: set[str] = set()

    async def run(self, stop: asyncio.Event) -> None:
        """Heal ledgers until ``stop`` is set. Nothing ends this loop but ``stop`` (or
        cancellation): a metadata call that fails (a lost reply while the ZooKeeper client
        reconnects) leaves the ledger for a retry, and a lock whose release failed is released
        again before the next ledger is taken (it would otherwise stay held as long as this
        session lives: nobody, this worker included, could heal that ledger)."""
        urm = self._bk.store.underreplication
        while not stop.is_set():
            now = time.monotonic()
            self._retry_blocked_if_bookies_changed()
            self._retry_after = {lid: t for lid, t in self._retry_after.items() if t > now}
            try:
                await self._release_unreleased(urm)
                lid = await asyncio.to_thread(self._acquire_or_wait, urm, set(self._retry_after))
            except Exception as exc:  # logged; the loop must outlive any failure
                _log_failure(exc, "replication worker %s: cannot look for work: %s", self.worker_id, exc)
                await _sleep_or_stop(stop, self._settings.backoff_ms / 1000)
                continue
            if lid is None:
                continue
            self.current = int(lid)
            try:
                await self._process(urm, lid)
            except Exception as exc:  # logged; the ledger is retried after the backoff
                _log_failure(exc, "replication worker %s: ledger %d left for a retry: %s", self.worker_id, lid, exc)
                FAILED.inc()
                self._retry_after[int(lid)] = time.monotonic() + self._settings.backoff_ms / 1000
                await self._release(urm, lid)
            finally:
                self.current = None

    def _acquire_or_wait(self, urm: UnderReplicationManager, exclude: set[int]) -> LedgerId | None:
        """Lock a ledger to heal, or wait (at most a second) for the records to change. One call on
        one thread: the store remembers, per thread, what the scan saw, so the wait is for a change
        after this scan (a watch, or a reconnection, wakes it; the bound re-checks anyway)."""
        lid = urm.acquire_ledger_to_rereplicate(exclude, worker_id=self.worker_id)
        if lid is None:
            urm.wait_for_work(1.0)
        return lid

    async def _release(self, urm: UnderReplicationManager, lid: LedgerId) -> None:
        """Let go of a ledger's lock; a failed release is retried before the next ledger is taken."""
        try:
            await asyncio.to_thread(urm.release_ledger, lid)
            self._unreleased.discard(int(lid))
        except VellumError as exc:
            self._unreleased.add(int(lid))
            log.warning("replication worker %s: cannot release ledger %d yet (released before the next ledger "
                        "is taken): %s", self.worker_id, lid, exc)

    async def _release_unreleased(self, urm: UnderReplicationManager) -> None:
        for lid in sorted(self._unreleased):
            await asyncio.to_thread(urm.release_ledger, LedgerId(lid))  # raises: the loop backs off
            self._unreleased.discard(lid)
            log.info("replication worker %s: released ledger %d after an earlier failure", self.worker_id, lid)

    def _retry_blocked_if_bookies_changed(self) -> None:
        ctx = self._bk.context
        bookies = frozenset(ctx.writable_bookies) | frozenset(f"ro:{b}" for b in ctx.read_only_bookies)
        if bookies != self._bookies_seen:
            self._bookies_seen = bookies
            for lid in self._blocked:
                self._retry_after.pop(lid, None)
            self._blocked.clear()

    async def _process(self, urm: UnderReplicationManager, lid: LedgerId) -> None:
        """Heal one locked ledger and let go of it. A failing metadata call raises (``run``
        releases the lock and retries the ledger later)."""
        record = await asyncio.to_thread(urm.get_under_replicated, lid)
        blocked: CannotHealError | None = None
        try:
            outcome = await self.heal(int(lid), record)
        except CannotHealError as exc:
            blocked, outcome = exc, Outcome.FAILED
        except NotEnoughBookiesError as exc:  # the client's own (e.g. a recovery's ensemble change)
            blocked, outcome = CannotHealError(NOT_ENOUGH_BOOKIES, str(exc)), Outcome.FAILED
        except Exception as exc:  # every failure releases the lock for a retry
            _log_failure(exc, "replication worker %s: ledger %d left for a retry: %s", self.worker_id, lid, exc)
            outcome = Outcome.FAILED
        try:
            if blocked is not None:
                if await asyncio.to_thread(self.cannot_heal.record, int(lid), blocked.kind, blocked.reason,
                                           self.worker_id):
                    log.warning("replication worker %s: ledger %d cannot heal: %s (said once; "
                                "`vellum shell listunderreplicated` shows it)", self.worker_id, lid, blocked.reason)
                else:
                    log.debug("replication worker %s: ledger %d still cannot heal: %s", self.worker_id, lid,
                              blocked.reason)
            else:
                await asyncio.to_thread(self.cannot_heal.clear, int(lid))
        except VellumError as exc:
            log.warning("replication worker %s: cannot record why ledger %d cannot heal: %s", self.worker_id,
                        lid, exc)
        if outcome is Outcome.HEALED:
            self._deferring.pop(int(lid), None)
            deleted = await asyncio.to_thread(urm.mark_replicated, lid)
            REREPLICATED.inc()
            log.info("replication worker %s: ledger %d re-replicated%s", self.worker_id, lid,
                     "" if deleted else " (marked again meanwhile: the record stays)")
            return
        if outcome is Outcome.FAILED:
            FAILED.inc()
        delay = self._settings.backoff_ms / 1000 if outcome is Outcome.FAILED else 1.0
        if blocked is not None:
            delay = max(delay, BLOCKED_RETRY_S)
            self._blocked.add(int(lid))
        self._retry_after[int(lid)] = time.monotonic() + delay
        await self._release(urm, lid)

    async def heal(self, ledger_id: int, record: UnderReplicatedLedger | None) -> Outcome:
        """Replace every bad fragment of the ledger (see the module docstring)."""
        ctx = self._bk.context
        suspects = {str(b) for b in record.replicas} if record is not None else set()
        try:
            current = await ctx.read_metadata(ledger_id)
        except NoSuchLedgerError:
            log.info("ledger %d was deleted: nothing to re-replicate", ledger_id)
            return Outcome.HEALED
        bad = await self._bad_fragments(ledger_id, current.value, suspects)
        avoid = self._avoid(bad)
        if any(f.is_open for f in bad):
            marked_ms = record.ctime_ms if record is not None and record.ctime_ms > 0 else 0
            waited_ms = time.time() * 1000 - marked_ms
            grace_ms = self._settings.open_ledger_grace_period_ms
            if waited_ms < grace_ms and self._deferred_ms(ledger_id, record) < grace_ms:
                await self._replace_all(ledger_id, [f for f in bad if not f.is_open], avoid)
                return Outcome.DEFERRED
            self._deferring.pop(ledger_id, None)
            log.info("ledger %d: its open fragment on %s is still bad after the %d ms grace period: "
                     "fencing and recovering the ledger", ledger_id,
                     ", ".join(f.bookie for f in bad if f.is_open), self._settings.open_ledger_grace_period_ms)
            await recover_ledger(ctx, ledger_id, current.value.password)
            current = await ctx.read_metadata(ledger_id)
            bad = await self._bad_fragments(ledger_id, current.value, suspects)
            avoid = self._avoid(bad)
        await self._replace_all(ledger_id, bad, avoid)
        return Outcome.HEALED

    def _deferred_ms(self, ledger_id: int, record: UnderReplicatedLedger | None) -> float:
        """How long this worker has been deferring this record of the ledger, on its monotonic
        clock. The grace period ends when either clock says it passed: the wall clock against the
        record's ctime (so the time since another process marked it counts), or this bound (so a
        wall clock stepped back after the marking, the ctime then in its future, cannot hold the
        ledger's recovery for the length of the step; BookKeeper's worker times the grace with a
        timer of its own)."""
        if not _bound_grace_by_own_wait:
            return 0.0
        version = record.version if record is not None else -1
        now = time.monotonic()
        seen = self._deferring.get(ledger_id)
        if seen is None or seen[0] != version:  # first deferral of this record (re-marked: a new one)
            self._forget_deferrals_before(now - 2 * self._settings.open_ledger_grace_period_ms / 1000)
            self._deferring[ledger_id] = (version, now)
            return 0.0
        return (now - seen[1]) * 1000

    def _forget_deferrals_before(self, horizon: float) -> None:
        """Drop what this worker remembers of deferrals older than ``horizon``: a ledger it looked
        at again within the grace period would have had its entry ended (the grace over), so
        these are ledgers healed, recovered or deleted by another worker meanwhile, and a daemon
        running for months must not keep one per ledger it ever deferred."""
        old = [lid for lid, (_version, since) in self._deferring.items() if since < horizon]
        for lid in old:
            del self._deferring[lid]

    async def _replace_all(self, ledger_id: int, bad: list[Fragment], avoid: set[str]) -> None:
        """Replace every fragment that can be replaced; one that cannot (no bookie may take its
        place) does not stop the others, as in BookKeeper; the first such reason is raised at
        the end (the ledger is then recorded as one that cannot heal, and retried)."""
        blocked: NotEnoughBookiesError | None = None
        for f in bad:
            try:
                await self._replace(ledger_id, f, avoid)
            except NotEnoughBookiesError as exc:
                if _stop_at_unhealable_fragment:
                    raise
                log.info("ledger %d: fragment at %d on %s cannot be replaced now (%s); replacing the others",
                         ledger_id, f.first_entry, f.bookie, exc)
                blocked = blocked or exc
        if blocked is not None:
            raise blocked

    def _avoid(self, bad: list[Fragment]) -> set[str]:
        """The bookies no copy of this ledger goes to besides the fragment's segment: those of bad
        fragments that are not registered (lost). A registered bookie that misses entries of
        another segment may take a copy; avoiding it too, two of them blocked each other (each
        fragment's only spare was the other's bookie: "no spare bookie" with a spare up)."""
        if _avoid_registered_bad_bookies:
            return {f.bookie for f in bad}
        ctx = self._bk.context
        registered = set(ctx.writable_bookies) | set(ctx.read_only_bookies)
        return {f.bookie for f in bad if f.bookie not in registered}

    async def _bad_fragments(self, ledger_id: int, md: LedgerMetadata, suspects: set[str]) -> list[Fragment]:
        """The fragments to replace, in segment and position order: those on bookies that are not
        registered, and the closed ones on a bookie the record names that a verified read finds
        missing or corrupt entries of. A check whose answer is unknown (a timeout, no connection)
        raises: the ledger is retried later.

        Any unknown answer decides the outcome, so the order of the checks does not change it;
        the fragments of a bookie whose answer was unknown in this worker's last check go first,
        so that a retry while that bookie stays unreachable fails after one check instead of
        verifying every entry of the other suspects' fragments again first."""
        ctx = self._bk.context
        registered = set(ctx.writable_bookies) | set(ctx.read_only_bookies)
        listed = list(fragments(ledger_id, md))
        checks = [f for f in listed if f.bookie in registered and f.bookie in suspects and not f.is_open]
        checks.sort(key=lambda f: f.bookie not in self._unanswered)  # stable: else in fragment order
        missing: set[tuple[int, int]] = set()
        for f in checks:
            try:
                held = await self._copier.holds(f, md, verify=True)
            except Exception:
                self._unanswered.add(f.bookie)
                raise
            self._unanswered.discard(f.bookie)
            if not held:
                missing.add((f.first_entry, f.index))
        return [f for f in listed if f.bookie not in registered or (f.first_entry, f.index) in missing]

    async def _replace(self, ledger_id: int, fragment: Fragment, avoid: set[str]) -> None:
        """Copy ``fragment`` to a bookie outside its segment and outside ``avoid`` (``_avoid``),
        then publish it. A bookie the record names that is registered again may take the copy."""
        ctx = self._bk.context
        current = await ctx.read_metadata(ledger_id)
        md = current.value
        if md.ensembles.get(fragment.first_entry, ())[fragment.index:fragment.index + 1] != (fragment.bookie,):
            return  # someone replaced it already
        # the fragment's end from the metadata read now (a recovery may have closed the ledger)
        fresh = next(f for f in fragments(ledger_id, md)
                     if f.first_entry == fragment.first_entry and f.index == fragment.index)
        segment = [str(b) for b in md.ensembles[fragment.first_entry]]
        # a lost bookie may never have been registered while this client ran: learn where it was
        # (may run the topology script) off the loop
        await asyncio.to_thread(ctx.placement.learn, segment)
        writable, read_only = ctx.writable_bookies, ctx.read_only_bookies
        if not set(writable) - set(read_only) - set(segment) - avoid:
            raise no_spare_bookie(fragment.bookie, len(segment), writable=writable, read_only=read_only,
                                  excluded=avoid | {fragment.bookie})
        try:
            target = ctx.placement.replace_bookie(
                segment, fragment.index, md.write_quorum_size, writable=writable, read_only=read_only,
                exclude=set(segment) | avoid, ack_quorum=md.ack_quorum_size,
            )
        except NotEnoughBookiesError as exc:
            raise placement_unmet(fragment.bookie, f"ensemblePlacementPolicy={ctx.config.ensemble_placement_policy}",
                                  exc) from exc
        entries = len(fresh.entries(md.write_quorum_size))
        log.info("ledger %d: copying fragment [%d..%s] of %s (%d entries) to %s", ledger_id, fresh.first_entry,
                 fresh.last_entry, fresh.bookie, entries, target)
        copied = await self._copier.copy(fresh, md, target)
        await self._cas_replace(ledger_id, current, fresh, target)
        FRAGMENTS.inc()
        log.info("ledger %d: fragment at %d moved from %s to %s (%d bytes)", ledger_id, fresh.first_entry,
                 fresh.bookie, target, copied)

    async def _cas_replace(self, ledger_id: int, current: Versioned[LedgerMetadata], fragment: Fragment,
                           target: str) -> None:
        ctx = self._bk.context
        for _ in range(_MAX_CAS):
            md = current.value
            segment = md.ensembles.get(fragment.first_entry)
            if segment is None or str(segment[fragment.index]) != fragment.bookie:
                log.info("ledger %d: fragment at %d was replaced by someone else", ledger_id, fragment.first_entry)
                return
            try:
                await ctx.write_metadata(ledger_id, replace_bookie(md, fragment.first_entry, fragment.index, target),
                                         current.version)
                return
            except MetadataVersionError:
                current = await ctx.read_metadata(ledger_id)
        raise MetadataVersionError(f"ledger {ledger_id}: replacing a fragment lost {_MAX_CAS} CAS races")


def _log_failure(exc: Exception, msg: str, *args: object) -> None:
    """A metadata store that is unavailable for a moment is expected (one line); anything else
    is a bug worth its traceback."""
    if isinstance(exc, VellumError):
        log.warning(msg, *args)
    else:
        log.exception(msg, *args)


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        pass
