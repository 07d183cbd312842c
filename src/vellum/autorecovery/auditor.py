"""The auditor: finds the ledgers that lost replicas and marks them under-replicated
(BookKeeper's ``Auditor``). One per cluster, elected (``daemon``); it runs while it leads.

What it does while leading, in two loops so that a long audit pass never delays noticing a lost
bookie: every ``tick_s`` (1 s), the lost-bookie watch; beside it, the periodic checks:
- **lost bookies** (the configured ``lostBookieRecoveryDelay`` is stored in the metadata store
  by the first auditor if none is there): a bookie that was registered (writable or read-only) and is not any more
  is *lost* from that moment; once it has been gone ``lostBookieRecoveryDelay`` seconds (the
  value set in the metadata store by ``vellum shell lostbookierecoverydelay`` wins over the
  configuration), every ledger with a fragment on it is marked under-replicated with that
  bookie as the missing replica. A bookie that comes back before is forgotten. Changing the
  delay in the store (``triggeraudit`` sets it to its current value) marks every lost bookie's
  ledgers at once, as BookKeeper does.
- **bookie check** (at start, then every ``auditorPeriodicBookieCheckInterval``): a scan of every
  ledger's metadata for bookies that are not registered at all (lost while no auditor ran, or
  before this one was elected); they join the lost bookies (the delay applies from then).
- **ledger check** (every ``auditorPeriodicCheckInterval``): every closed fragment on a
  registered bookie is asked for its entry list (LIST_ENTRIES); a fragment missing entries is
  marked with that bookie. ``auditorLedgerVerificationPercentage`` of the ledgers are read and
  verified entry by entry instead.
- **replicas check** (every ``auditorReplicasCheckInterval``): every closed fragment of every
  ledger is read from its bookie and each entry's digest verified: this finds entries lost or
  corrupted on bookies that are up (a wiped dir, a flipped bit).
- **placement check** (every ``auditorPeriodicPlacementPolicyCheckInterval``): ledgers with a
  segment the placement policy would not choose (``PlacementPolicy.adheres``: a write quorum on
  fewer racks than it could span) are counted (``auditor_PLACEMENT_POLICY_NOT_ADHERING_LEDGERS``)
  and logged; they are not re-replicated (their copies are all there).
- **cannot-heal summary** (every ``cannot_heal_summary_s``, 300 s, while there are any): the
  ledgers a replication worker found it cannot heal (no spare bookie, placement cannot be met;
  ``cannot_heal``; each said once by the worker that found it) are counted
  (``auditor_LEDGERS_THAT_CANNOT_HEAL``) and summarized in one log line; records of ledgers
  that are no longer under-replicated are swept.
The audit times are stored (``checkallledgersctime``, ``replicascheckctime``) so a newly elected
auditor continues the schedule instead of starting over.

Invariants: the auditor only marks; it never copies or changes ledger metadata. Marking is
idempotent (a record gains replicas). A check that cannot reach a bookie marks nothing for it
(unknown is not missing).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Iterable

from vellum import stats
from vellum.autorecovery.cannot_heal import CannotHeal, CannotHealRecords, summarize
from vellum.autorecovery.copier import FragmentCopier
from vellum.autorecovery.fragments import bookies_of, fragments
from vellum.autorecovery.settings import AutoRecoverySettings
from vellum.client.bookkeeper import BookKeeper
from vellum.errors import NoSuchLedgerError, VellumError
from vellum.ids import LedgerId
from vellum.meta.model import LedgerMetadata

log = logging.getLogger(__name__)

#: a test flag (docs/verification.md, "Regression seeds"): False reverts the fix that counts a
#: stored audit time ahead of the wall clock (a clock stepped back) as a check just done
_clamp_future_audit_time = True

MARKED = stats.counter("auditor_MARKED_LEDGERS", "times the auditor marked a ledger under-replicated")
LOST_BOOKIES = stats.gauge("auditor_LOST_BOOKIES", "bookies the auditor counts as lost")
UNDER_REPLICATED = stats.gauge("auditor_NUM_UNDER_REPLICATED_LEDGERS", "under-replicated ledger records")
NOT_ADHERING = stats.gauge("auditor_PLACEMENT_POLICY_NOT_ADHERING_LEDGERS",
                           "ledgers the last placement check found not adhering to the placement policy")
CANNOT_HEAL = stats.gauge("auditor_LEDGERS_THAT_CANNOT_HEAL",
                         "under-replicated ledgers a replication worker found no bookie to heal them with")
CHECKS = stats.counter("auditor_CHECKS", "audit passes completed", ("check",))


class Auditor:
    """See the module docstring. ``run`` while this process leads the election."""

    def __init__(self, bk: BookKeeper, settings: AutoRecoverySettings) -> None:
        self._bk = bk
        self._settings = settings
        self._copier = FragmentCopier(bk.context.bookie_client, batch=settings.entry_batch_size,
                                      rate_bytes=-1, timeout_s=settings.request_timeout_s,
                                      yield_target_s=settings.yield_target_s, role="auditor")
        #: bookie -> monotonic time it was first seen missing
        self.lost: dict[str, float] = {}
        self._store_delay: int | None = None
        self._triggered = False
        self._cannot_heal = CannotHealRecords(bk.store.kv)
        self._next_summary = time.monotonic() + settings.cannot_heal_summary_s

    # ------------------------------------------------------------------------------ loop
    async def run(self, stop: asyncio.Event) -> None:
        bk = self._bk
        urm = bk.store.underreplication
        loop = asyncio.get_running_loop()

        def on_delay(delay: int | None) -> None:
            loop.call_soon_threadsafe(self._delay_changed, delay)

        if await asyncio.to_thread(urm.get_lost_bookie_recovery_delay) is None:
            # As BookKeeper's auditor: the configured delay becomes the cluster's, which the shell
            # and HTTP then show and `triggeraudit` re-sets.
            await asyncio.to_thread(urm.set_lost_bookie_recovery_delay, self._settings.lost_bookie_recovery_delay_s)
        watch = await asyncio.to_thread(urm.watch_lost_bookie_recovery_delay, on_delay)
        self._triggered = False  # the watch's first call is the current value, not a trigger
        try:
            await self.bookie_check()
            # Two loops: noticing lost bookies must not wait behind a long audit pass (a ledger
            # or replicas check over many ledgers can take minutes), so the periodic checks run
            # beside the lost-bookie watch. Both only mark, which is idempotent.
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._watch_lost_bookies(stop))
                tg.create_task(self._periodic_checks(stop))
        finally:
            watch.cancel()

    async def _tick(self, stop: asyncio.Event) -> None:
        try:
            await asyncio.wait_for(stop.wait(), self._settings.tick_s)
        except TimeoutError:
            pass

    async def _watch_lost_bookies(self, stop: asyncio.Event) -> None:
        """Every tick: which bookies left or came back, and mark the ledgers of those gone longer
        than the delay (or at once after a trigger)."""
        urm = self._bk.store.underreplication
        known = self._registered()
        ticks = 0
        while not stop.is_set():
            now = time.monotonic()
            registered = self._registered()
            for gone in known - registered:
                self.lost.setdefault(gone, now)
                log.warning("auditor: bookie %s is gone; its ledgers are marked under-replicated in %d s "
                            "unless it comes back", gone, self.delay_s)
            known = registered
            for back in [b for b in self.lost if b in registered]:
                del self.lost[back]
                log.info("auditor: bookie %s is back", back)
            await self._mark_due(now)
            LOST_BOOKIES.set(len(self.lost))
            if ticks % 10 == 0:
                UNDER_REPLICATED.set(await asyncio.to_thread(lambda: sum(1 for _ in urm.list_under_replicated())))
            ticks += 1
            await self._tick(stop)

    async def _periodic_checks(self, stop: asyncio.Event) -> None:
        """The bookie, ledger, replicas and placement checks and the cannot-heal summary, each on
        its interval, continuing the schedule stored by the previous auditor."""
        urm = self._bk.store.underreplication
        settings = self._settings
        now_wall = time.time()
        next_bookie = time.monotonic() + settings.bookie_check_interval_s
        next_ledger = await self._next_time(urm.get_check_all_ledgers_ctime, settings.ledger_check_interval_s,
                                            now_wall)
        next_replicas = await self._next_time(urm.get_replicas_check_ctime, settings.replicas_check_interval_s,
                                              now_wall)
        next_placement = await self._next_time(urm.get_placement_policy_check_ctime,
                                               settings.placement_policy_check_interval_s, now_wall)
        while not stop.is_set():
            now = time.monotonic()
            if settings.bookie_check_interval_s > 0 and now >= next_bookie:
                await self.bookie_check()
                next_bookie = now + settings.bookie_check_interval_s
            if next_ledger is not None and now >= next_ledger:
                await self.ledger_check(verify_share=settings.ledger_verification_percentage / 100)
                await asyncio.to_thread(urm.set_check_all_ledgers_ctime, int(time.time() * 1000))
                next_ledger = now + settings.ledger_check_interval_s
            if next_replicas is not None and now >= next_replicas:
                await self.replicas_check()
                await asyncio.to_thread(urm.set_replicas_check_ctime, int(time.time() * 1000))
                next_replicas = now + settings.replicas_check_interval_s
            if next_placement is not None and now >= next_placement:
                await self.placement_check()
                await asyncio.to_thread(urm.set_placement_policy_check_ctime, int(time.time() * 1000))
                next_placement = now + settings.placement_policy_check_interval_s
            if now >= self._next_summary:
                await self.cannot_heal_summary()
                self._next_summary = now + settings.cannot_heal_summary_s
            await self._tick(stop)

    def _delay_changed(self, delay: int | None) -> None:
        # BookKeeper's Auditor.lostBookieRecoveryDelayChanged: re-setting the value it has
        # (`triggeraudit`) or setting 0 audits now; another value only changes how long lost
        # bookies are waited for (raising it before a rolling restart must not mark anything).
        before = self.delay_s
        self._store_delay = delay
        if self.delay_s in (0, before):
            self._triggered = True

    @property
    def delay_s(self) -> int:
        return self._store_delay if self._store_delay is not None else self._settings.lost_bookie_recovery_delay_s

    def _registered(self) -> set[str]:
        ctx = self._bk.context
        return {str(b) for b in ctx.writable_bookies} | {str(b) for b in ctx.read_only_bookies}

    @staticmethod
    async def _next_time(get_ctime: object, interval_s: int, now_wall: float) -> float | None:
        """Monotonic time of the next periodic check, continuing from the stored last one."""
        if interval_s <= 0:
            return None
        assert callable(get_ctime)
        last_ms = await asyncio.to_thread(get_ctime)
        since = now_wall - (last_ms / 1000 if last_ms else 0)
        if since < 0 and _clamp_future_audit_time:
            # The stored time is ahead of this clock: the wall clock was stepped back since (or
            # the last auditor's clock ran ahead). As BookKeeper's auditor, count it as just
            # done: the check comes one interval from now, not the step later (an hour's step
            # back would hold every check for an hour).
            since = 0.0
        return time.monotonic() + max(0.0, interval_s - since)

    async def _mark_due(self, now: float) -> None:
        triggered, self._triggered = self._triggered, False
        due = {b for b, since in self.lost.items() if triggered or now - since >= self.delay_s}
        if due:
            marked = await self.mark_ledgers_on(due)
            log.warning("auditor: %d ledgers with fragments on lost bookie(s) %s marked under-replicated",
                        marked, ", ".join(sorted(due)))
            for b in due:  # marked: the bookie check marks again whatever is still on them
                self.lost.pop(b, None)

    async def cannot_heal_summary(self) -> int:
        """Sweep stale cannot-heal records, log one line about the others; how many there are."""
        urm = self._bk.store.underreplication

        def sweep_and_read() -> dict[int, CannotHeal]:
            self._cannot_heal.sweep(lambda: [int(r.ledger_id) for r in urm.list_under_replicated()])
            return dict(self._cannot_heal.all())

        records = await asyncio.to_thread(sweep_and_read)
        CANNOT_HEAL.set(len(records))
        if records:
            log.warning("auditor: %d under-replicated ledgers cannot heal (`vellum shell listunderreplicated` "
                        "shows each): %s", len(records), summarize(records))
        return len(records)

    # ---------------------------------------------------------------------------- checks
    async def _ledgers(self) -> list[tuple[int, LedgerMetadata]]:
        store = self._bk.store

        def read_all() -> list[tuple[int, LedgerMetadata]]:
            out = []
            for lid in store.ledgers.iter_ledger_ids():
                try:
                    out.append((int(lid), store.ledgers.read_ledger(lid).value))
                except NoSuchLedgerError:
                    continue  # deleted meanwhile
            return out

        return await asyncio.to_thread(read_all)

    async def _mark(self, ledger_id: int, bookies: Iterable[str]) -> None:
        urm = self._bk.store.underreplication
        await asyncio.to_thread(urm.mark_under_replicated, LedgerId(ledger_id), sorted(bookies))
        MARKED.inc()

    async def mark_ledgers_on(self, bookies: set[str]) -> int:
        """Mark every ledger with a fragment on one of ``bookies``; how many were marked."""
        count = 0
        for lid, md in await self._ledgers():
            on = bookies_of(md) & bookies
            if on:
                await self._mark(lid, on)
                count += 1
        return count

    async def bookie_check(self) -> None:
        """Bookies named by ledgers but not registered join the lost bookies."""
        registered = self._registered()
        now = time.monotonic()
        named: set[str] = set()
        for _lid, md in await self._ledgers():
            named |= bookies_of(md)
        for b in named - registered:
            if b not in self.lost:
                log.warning("auditor: bookie %s holds ledger fragments but is not registered", b)
            self.lost.setdefault(b, now)
        CHECKS.labels("bookie").inc()

    async def placement_check(self) -> int:
        """Ledgers with an ensemble the placement policy would not choose today (e.g. a write
        quorum on fewer racks than it could span) are counted and logged; how many."""
        policy = self._bk.context.placement
        registered = self._registered()
        bad = 0
        ledgers = await self._ledgers()
        # where the members of every ensemble are (may run the topology script): off the loop
        await asyncio.to_thread(policy.learn, {str(b) for _lid, md in ledgers for b in bookies_of(md)})
        for lid, md in ledgers:
            for first, ensemble in md.ensembles.items():
                members = [str(b) for b in ensemble]
                if not policy.adheres(members, md.write_quorum_size, bookies=registered | set(members),
                                      ack_quorum=md.ack_quorum_size):
                    log.warning("auditor placement check: ledger %d segment at %d (%s) does not adhere to the "
                                "placement policy", lid, first, ", ".join(members))
                    bad += 1
                    break
        NOT_ADHERING.set(bad)
        CHECKS.labels("placement").inc()
        return bad

    async def ledger_check(self, *, verify_share: float = 0.0) -> int:
        """Closed fragments on registered bookies that miss entries are marked; how many."""
        return await self._check_fragments(lambda: random.random() < verify_share, "ledger")

    async def replicas_check(self) -> int:
        """Every closed fragment read and verified from its bookie; bad ones are marked."""
        return await self._check_fragments(lambda: True, "replicas")

    async def _check_fragments(self, verify: object, name: str) -> int:
        assert callable(verify)
        registered = self._registered()
        bad = 0
        for lid, md in await self._ledgers():
            full = bool(verify())
            missing: set[str] = set()
            for f in fragments(lid, md):
                if f.is_open or f.bookie not in registered:
                    continue  # open: its writer's; unregistered: the lost-bookie path's
                try:
                    if not await self._copier.holds(f, md, verify=full):
                        missing.add(f.bookie)
                except NoSuchLedgerError:
                    break
                except VellumError as exc:
                    log.info("auditor %s check: ledger %d on %s unknown (%s)", name, lid, f.bookie, exc)
            if missing:
                log.warning("auditor %s check: ledger %d misses entries on %s", name, lid, ", ".join(sorted(missing)))
                await self._mark(lid, missing)
                bad += 1
        CHECKS.labels(name).inc()
        return bad
