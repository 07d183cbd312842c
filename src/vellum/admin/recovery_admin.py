"""AutoRecovery use-cases, shared by the shell (``vellum shell ...``) and the admin HTTP API
(``/api/v1/autorecovery/*``), so both do exactly the same thing.

Metadata-only (any process that can open the metadata store):
- ``list_under_replicated``: the records, with their missing replicas, mark time, lock owner
  and, when a replication worker found it cannot heal the ledger, why (``cannot_heal``);
- ``who_is_auditor``, ``status`` / ``set_enabled`` (the global switch), the lost-bookie delay,
  ``trigger_audit`` (re-sets the delay, which makes the auditor mark every lost bookie's ledgers
  at once, as BookKeeper's ``triggeraudit``);
- ``cluster_state``: BookKeeper's ``cluster_info`` AutoRecovery fields.
With a client (async):
- ``recover``: heal every ledger with a fragment on the given bookies from this process, as
  BookKeeper's ``recover`` (no AutoRecovery daemon needed), with progress;
- ``decommission``: a bookie that is shut down leaves the cluster: its ledgers are marked
  under-replicated (no delay), the replication workers move them, this waits (with progress)
  until no ledger names it, then deletes its cookie from the metadata store.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from vellum.autorecovery.cannot_heal import CannotHeal, CannotHealRecords
from vellum.autorecovery.fragments import bookies_of
from vellum.autorecovery.settings import AutoRecoverySettings
from vellum.autorecovery.worker import Outcome, ReplicationWorker
from vellum.client.bookkeeper import BookKeeper
from vellum.client.placement import PlacementPolicy
from vellum.config import ClientConfig
from vellum.errors import (
    DigestMismatchError,
    IllegalOpError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
    VellumError,
)
from vellum.ids import BookieId, LedgerId
from vellum.meta.api import MetadataStore, UnderReplicatedLedger

Progress = Callable[[str, int, int], None]
"""``progress(what, done, total)``."""


@dataclass(frozen=True)
class UnderReplicatedRow:
    ledger_id: int
    missing_replicas: tuple[str, ...]
    ctime_ms: int
    locked_by: str | None
    #: why a replication worker cannot heal it (None: nothing known against healing)
    cannot_heal: CannotHeal | None = None

    def to_json(self) -> dict[str, Any]:
        return {"ledgerId": self.ledger_id, "missingReplicas": list(self.missing_replicas),
                "ctime": self.ctime_ms, "lockedBy": self.locked_by,
                "cannotHeal": self.cannot_heal.to_json() if self.cannot_heal is not None else None}


def list_under_replicated(store: MetadataStore, *, missing_replica: str | None = None,
                          excluding_missing_replica: str | None = None) -> list[UnderReplicatedRow]:
    urm = store.underreplication
    why = CannotHealRecords(store.kv).all()
    rows = []
    for rec in urm.list_under_replicated():
        replicas = tuple(str(b) for b in rec.replicas)
        if missing_replica is not None and missing_replica not in replicas:
            continue
        if excluding_missing_replica is not None and excluding_missing_replica in replicas:
            continue
        rows.append(UnderReplicatedRow(int(rec.ledger_id), replicas, rec.ctime_ms, urm.lock_owner(rec.ledger_id),
                                       why.get(int(rec.ledger_id))))
    return rows


def cannot_heal_reasons(rows: Sequence[UnderReplicatedRow]) -> list[tuple[str, int]]:
    """The distinct reasons why listed ledgers cannot heal, commonest first, with their counts."""
    counts: dict[str, int] = {}
    for row in rows:
        if row.cannot_heal is not None:
            counts[row.cannot_heal.reason] = counts.get(row.cannot_heal.reason, 0) + 1
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def who_is_auditor(store: MetadataStore) -> str | None:
    auditor = store.underreplication.current_auditor()
    return str(auditor) if auditor is not None else None


def status(store: MetadataStore) -> bool:
    """Whether re-replication is enabled (the global switch)."""
    return store.underreplication.is_replication_enabled()


def set_enabled(store: MetadataStore, enabled: bool) -> None:
    urm = store.underreplication
    if enabled:
        urm.enable_replication()
    else:
        urm.disable_replication()


def get_lost_bookie_recovery_delay(store: MetadataStore, default_s: int) -> int:
    stored = store.underreplication.get_lost_bookie_recovery_delay()
    return stored if stored is not None else default_s


def set_lost_bookie_recovery_delay(store: MetadataStore, seconds: int) -> None:
    if seconds < 0:
        raise ValueError(f"the lost-bookie recovery delay must be >= 0 seconds, not {seconds}")
    store.underreplication.set_lost_bookie_recovery_delay(seconds)


def trigger_audit(store: MetadataStore, default_s: int) -> int:
    """Re-set the delay to its value: the auditor marks every lost bookie's ledgers now."""
    delay = get_lost_bookie_recovery_delay(store, default_s)
    store.underreplication.set_lost_bookie_recovery_delay(delay)
    return delay


def cluster_state(store: MetadataStore) -> dict[str, Any]:
    """BookKeeper's ``cluster_info`` AutoRecovery fields."""
    urm = store.underreplication
    auditor = urm.current_auditor()
    under = next(iter(urm.list_under_replicated()), None) is not None
    why = CannotHealRecords(store.kv).all() if under else {}
    blocked = 0
    if why:  # only then every record is read (a stale reason, for a healed ledger, is not counted)
        blocked = len(set(why) & {int(r.ledger_id) for r in urm.list_under_replicated()})
    return {"auditorElected": auditor is not None, "auditorId": str(auditor) if auditor else "",
            "clusterUnderReplicated": under, "ledgerReplicationEnabled": urm.is_replication_enabled(),
            "ledgersThatCannotHeal": blocked}


def status_report(store: MetadataStore) -> dict[str, Any]:
    """The re-replication switch and the AutoRecovery state, as the shell and admin HTTP show them."""
    return {"enabled": status(store), **cluster_state(store)}


def _ledgers_on(store: MetadataStore, bookies: set[str]) -> list[int]:
    out = []
    for lid in store.ledgers.iter_ledger_ids():
        try:
            md = store.ledgers.read_ledger(lid).value
        except NoSuchLedgerError:
            continue
        if bookies_of(md) & bookies:
            out.append(int(lid))
    return out


async def recover(bk: BookKeeper, bookies: set[str], settings: AutoRecoverySettings, *,
                  progress: Progress | None = None) -> dict[int, str]:
    """Heal every ledger with a fragment on ``bookies`` from this process (BookKeeper's
    ``recover``); returns ``{ledger: outcome}``. Each ledger is locked like a worker would, so
    running AutoRecovery daemons never work on the same ledger at once."""
    say = progress or (lambda _w, _d, _t: None)
    store = bk.store
    urm = store.underreplication
    ledgers = await asyncio.to_thread(_ledgers_on, store, bookies)
    worker = ReplicationWorker(bk, settings, worker_id="shell-recover")
    results: dict[int, str] = {}
    for n, lid in enumerate(ledgers):
        say("ledgers", n, len(ledgers))
        await asyncio.to_thread(urm.mark_under_replicated, LedgerId(lid), sorted(bookies))
        record = await asyncio.to_thread(urm.get_under_replicated, LedgerId(lid))
        try:
            outcome = await worker.heal(lid, _with_grace_over(record))
        except VellumError as exc:
            results[lid] = f"failed: {exc}"
            continue
        if outcome is Outcome.HEALED:
            await asyncio.to_thread(urm.mark_replicated, LedgerId(lid))
            await asyncio.to_thread(worker.cannot_heal.clear, lid)
        results[lid] = outcome.value
    say("ledgers", len(ledgers), len(ledgers))
    return results


def _with_grace_over(record: UnderReplicatedLedger | None) -> UnderReplicatedLedger | None:
    """An operator's ``recover`` does not wait for open ledgers' writers: the grace is over."""
    if record is None:
        return None
    return UnderReplicatedLedger(record.ledger_id, record.replicas, 1, record.version)


async def decommission(bk: BookKeeper, bookie: str, *, timeout_s: float = 3600.0,
                       progress: Progress | None = None, poll_s: float = 1.0) -> int:
    """Move every ledger off ``bookie`` (shut down) and delete its cookie; returns the number of
    ledgers that were on it. Needs replication workers running (in bookies or alone)."""
    say = progress or (lambda _w, _d, _t: None)
    store = bk.store
    reg = store.registration
    registered = await asyncio.to_thread(lambda: reg.list_bookies() | reg.list_bookies(read_only=True))
    if BookieId(bookie) in registered:
        raise IllegalOpError(f"bookie {bookie} is still registered: stop it first (decommission moves the "
                             "ledgers of a bookie that is shut down)")
    urm = store.underreplication
    if not await asyncio.to_thread(urm.is_replication_enabled):
        raise IllegalOpError("re-replication is disabled: enable it first (`vellum shell autorecovery enable`)")
    ledgers = await asyncio.to_thread(_ledgers_on, store, {bookie})
    total = len(ledgers)
    for lid in ledgers:
        await asyncio.to_thread(urm.mark_under_replicated, LedgerId(lid), [bookie])
    deadline = time.monotonic() + timeout_s
    while True:
        left = await asyncio.to_thread(_ledgers_on, store, {bookie})
        say("ledgers moved", total - len(left), total)
        if not left:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(left)} of {total} ledgers still on {bookie} after {timeout_s:g}s "
                               f"(are replication workers running? `vellum shell listunderreplicated`)")
        await asyncio.sleep(poll_s)
    if await asyncio.to_thread(reg.get_cookie, BookieId(bookie)) is not None:
        await asyncio.to_thread(reg.remove_cookie, BookieId(bookie))
    return total


class _OnlyThisBookie(PlacementPolicy):
    """Placement for the sanity check: the one bookie under test, or nothing."""

    def __init__(self, bookie: str) -> None:
        self._bookie = bookie

    def new_ensemble(self, size: int, write_quorum: int, ack_quorum: int, *, writable: Collection[str],
                     read_only: Collection[str], exclude: Collection[str] = ()) -> list[str]:
        if self._bookie not in writable or self._bookie in exclude:
            raise NotEnoughBookiesError(f"bookie {self._bookie} is not registered as writable")
        return [self._bookie]

    def replace_bookie(self, ensemble: Sequence[str], index: int, write_quorum: int, *, writable: Collection[str],
                       read_only: Collection[str], exclude: Collection[str] = (),
                       ack_quorum: int | None = None) -> str:
        raise NotEnoughBookiesError(f"the sanity check uses bookie {self._bookie} only")


async def bookie_sanity(metadata_uri: str | None, bookie: str, entries: int = 10, *,
                        config: ClientConfig | None = None, store: MetadataStore | None = None) -> None:
    """Write ``entries`` to a ledger on ``bookie`` alone, read them back, delete the ledger
    (BookKeeper's ``bookiesanity``). Raises what went wrong. ``store``: an open metadata store
    to use (stays open) instead of opening ``metadata_uri``."""
    async with BookKeeper(metadata_uri, config=config, store=store, placement=_OnlyThisBookie(bookie)) as bk:
        lh = await bk.create_ledger(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1)
        try:
            payloads = [f"bookiesanity {i}".encode() for i in range(entries)]
            for p in payloads:
                await lh.append(p)
            got = await lh.read(0, entries - 1)
            if [g.payload for g in got] != payloads:
                raise DigestMismatchError(f"bookie {bookie} returned entries that differ from those written")
            await lh.close()
        finally:
            await bk.delete_ledger(lh.ledger_id)
