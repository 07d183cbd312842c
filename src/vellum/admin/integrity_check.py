"""The data-integrity check of a bookie that may have lost data (``dataIntegrityChecking``,
BookKeeper's ``DataIntegrityCheckImpl``; rule 12 of docs/correctness.md). Runs in the bookie process, on its
event loop, with Vellum's own client; the limbo state it works on is ``bookie/integrity.py``.

1. Before the bookie serves anything (``mark_ledgers_limbo``, called by ``service.py`` when
   ``OpenedBookie.integrity_check_needed``): every ledger whose ensembles (any segment) contain
   this bookie is listed from the metadata store and marked limbo and fenced, with the master key
   of its metadata's password; then a checkpoint makes that durable and the
   ``INTEGRITY_CHECK_NEEDED`` marker is removed. A metadata store that fails midway fails the
   start (a partial listing is never taken as complete); the marker stays for the next start.

2. In the background (``IntegrityCheck.run``), for each limbo ledger, until none is left:
   - its metadata is read again; a ledger gone from the store was deleted: limbo is cleared
     ("no such ledger" is then the truth, and GC removes what is left);
   - a ledger that is not CLOSED and has this bookie in its last ensemble is recovered first
     (open with recovery, as BookKeeper does): the local fence already stops its writer from
     getting entries acknowledged here, and only a closed ledger tells which entries this bookie
     should hold. This bookie answers "unknown" to the fencing and recovery reads of that
     recovery, which count as neither positive nor negative;
   - the entries to hold are those of every segment whose ensemble contains this bookie and
     whose write set (``distribution.write_set``) includes its index: up to the next segment's
     first entry - 1, or up to the last entry for the last segment of a closed ledger (the last
     segment of a ledger left open is never this bookie's: see above);
   - each such entry the bookie does not hold is read from the other replicas of its write set
     (digest verified against the ledger's digest type and password) and stored through the
     bookie's own recovery-add path (journaled, fsynced), in batches;
   - only when every such entry is held is limbo cleared (``Bookie.clear_limbo``). An entry that
     every other replica of a quorum-covering set says it does not have (``(WQ - AQ) + 1``
     explicit negatives) cannot have been acknowledged, or was trimmed everywhere: it is skipped
     and logged. Any other failure (a replica down, a digest mismatch on every copy, a recovery
     that cannot complete) leaves the ledger limbo and is retried every ``retry_interval_s``.
   Progress is logged (``integrity check: ledger N: copied k entries (i/n ledgers)``) and
   exported: ``bookie_DATA_INTEGRITY_LIMBO_LEDGERS`` (``bookie/metrics.py``), and the counters
   below.

A bookie that crashes during the check resumes it at its next start: the limbo flags are in its
ledger storage. Ledgers are checked one at a time (their entries stay together in the entry
log), ``_WINDOW`` entry reads in flight.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from vellum import stats
from vellum.bookie.assembly import OpenedBookie
from vellum.bookie.bookie import Bookie
from vellum.bookie.executor import AsyncBookie
from vellum.client.bookkeeper import BookKeeper
from vellum.client.distribution import RoundRobinSchedule
from vellum.client.replica_read import NEGATIVE_ANSWERS
from vellum.errors import DigestMismatchError, LedgerRecoveryError, NoSuchLedgerError, ReadError
from vellum.format.entry import DigestManager, DigestType, master_key
from vellum.ids import LedgerId
from vellum.meta.api import LedgerManager
from vellum.meta.model import LedgerMetadata

log = logging.getLogger(__name__)

#: pause between two passes over the ledgers still limbo
RETRY_INTERVAL_S = 10.0
#: entry reads in flight, and entries per recovery-add batch
_WINDOW = 64

_COPIED = stats.counter("bookie_DATA_INTEGRITY_ENTRIES_COPIED",
                        "entries the integrity check copied back from other replicas into this bookie")
_REPAIRED = stats.counter("bookie_DATA_INTEGRITY_LEDGERS_REPAIRED",
                          "limbo ledgers whose entries are all back on this bookie (limbo cleared)")
_FAILED = stats.counter("bookie_DATA_INTEGRITY_LEDGER_FAILURES",
                        "attempts to repair a limbo ledger that failed (the ledger stays limbo; retried)")


# ---------------------------------------------------------------------------------- before serving


def ledgers_of_bookie(ledgers: LedgerManager, bookie_id: str) -> dict[int, LedgerMetadata]:
    """Every ledger whose ensembles (any segment) contain ``bookie_id``, with its metadata.
    Blocking; a store failure raises (never a partial answer)."""
    found: dict[int, LedgerMetadata] = {}
    for lid in ledgers.iter_ledger_ids():
        try:
            md = ledgers.read_ledger(LedgerId(lid)).value
        except NoSuchLedgerError:
            continue  # deleted since the listing
        if any(bookie_id in ensemble for ensemble in md.ensembles.values()):
            found[int(lid)] = md
    return found


def mark_ledgers_limbo(opened: OpenedBookie, ledgers: LedgerManager, bookie_id: str,
                       say: Callable[[str], None] = log.info) -> int:
    """Step 1 of the module docstring; returns how many ledgers were marked. Blocking."""
    reason = opened.integrity_check_needed or "requested"
    bookie = opened.bookie
    held = ledgers_of_bookie(ledgers, bookie_id)
    marked = sum(1 for lid, md in sorted(held.items()) if bookie.mark_limbo(lid, master_key(md.password)))
    bookie.checkpoint()  # the keys, fences and limbo flags are durable before the marker goes
    opened.integrity_marking_done()
    say(f"integrity check: this bookie may have lost data ({reason}): {marked} ledger(s) marked limbo "
        "and fenced; they answer 'unknown' for what this bookie lacks until it is copied back")
    return marked


# ----------------------------------------------------------------------------------- what to hold


@dataclass(frozen=True)
class Segment:
    """Entries ``first..last`` of one segment, stored on ``ensemble``; this bookie is at ``index``."""

    first: int
    last: int
    ensemble: tuple[str, ...]
    index: int


def segments_to_hold(md: LedgerMetadata, bookie_id: str) -> list[Segment]:
    """The segments with this bookie whose end is known: every one but the last, and the last of a
    CLOSED ledger (up to its last entry). Empty ranges are left out."""
    firsts = sorted(md.ensembles)
    out: list[Segment] = []
    for k, first in enumerate(firsts):
        ensemble = tuple(str(b) for b in md.ensembles[first])
        if bookie_id not in ensemble:
            continue
        if k + 1 < len(firsts):
            last = firsts[k + 1] - 1
        elif md.is_closed:
            last = md.last_entry_id
        else:
            continue
        if last >= first:
            out.append(Segment(first, last, ensemble, ensemble.index(bookie_id)))
    return out


def entries_to_hold(md: LedgerMetadata, segment: Segment) -> list[int]:
    """The entry ids of ``segment`` whose write set includes this bookie's index."""
    schedule = RoundRobinSchedule(md.ensemble_size, md.write_quorum_size, md.ack_quorum_size)
    return [e for e in range(segment.first, segment.last + 1) if segment.index in schedule.write_set(e)]


# ---------------------------------------------------------------------------------------- the job


class IntegrityCheck:
    """Copies back the entries of every limbo ledger, then clears its limbo (step 2 of the module
    docstring). ``run()`` returns when no ledger is limbo any more; cancel it to stop."""

    def __init__(self, *, bookie: Bookie, async_bookie: AsyncBookie, client: BookKeeper, bookie_id: str,
                 retry_interval_s: float = RETRY_INTERVAL_S) -> None:
        self._bookie = bookie
        self._async_bookie = async_bookie
        self._client = client
        self.bookie_id = str(bookie_id)
        self.retry_interval_s = retry_interval_s
        self.passes = 0

    async def run(self) -> None:
        while True:
            ids = self._bookie.limbo.ids()
            if not ids:
                if self.passes:
                    log.info("integrity check: done, no ledger is limbo any more")
                return
            self.passes += 1
            n = len(ids)
            log.info("integrity check: pass %d over %d limbo ledger(s)", self.passes, n)
            for i, ledger_id in enumerate(ids, 1):
                try:
                    copied = await self.repair(ledger_id)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    _FAILED.inc()
                    log.warning("integrity check: ledger %d: not repaired yet, stays limbo (%s: %s); "
                                "retried in %.0fs (%d/%d ledgers)", ledger_id, type(exc).__name__, exc,
                                self.retry_interval_s, i, n)
                    continue
                log.info("integrity check: ledger %d: copied %d entries (%d/%d ledgers)", ledger_id, copied, i, n)
            if self._bookie.limbo:
                await asyncio.sleep(self.retry_interval_s)

    async def repair(self, ledger_id: int) -> int:
        """Copy back what this bookie should hold of the ledger, then clear its limbo; returns
        the number of entries copied. Raises (the ledger stays limbo) if anything is missing."""
        ctx = self._client.context
        try:
            md = (await ctx.read_metadata(ledger_id)).value
        except NoSuchLedgerError:
            log.info("integrity check: ledger %d was deleted from the metadata store; limbo cleared", ledger_id)
            await asyncio.to_thread(self._bookie.clear_limbo, ledger_id)
            return 0
        if not md.is_closed and self.bookie_id in md.last_ensemble:
            log.info("integrity check: ledger %d is not closed and this bookie is in its last ensemble: "
                     "recovering it first", ledger_id)
            handle = await self._client.open_ledger(ledger_id, password=md.password, recovery=True)
            md = handle.metadata
            if not md.is_closed:
                raise LedgerRecoveryError(f"ledger {ledger_id}: still not closed after recovery")
        digest = DigestManager(ledger_id, DigestType(int(md.digest_type)), md.password)
        key = master_key(md.password)
        copied = 0
        for segment in segments_to_hold(md, self.bookie_id):
            wanted = entries_to_hold(md, segment)
            for start in range(0, len(wanted), _WINDOW):
                chunk = wanted[start:start + _WINDOW]
                missing = await asyncio.to_thread(self._missing, ledger_id, chunk)
                if missing:
                    copied += await self._copy(md, segment, digest, key, ledger_id, missing)
        await asyncio.to_thread(self._bookie.clear_limbo, ledger_id)
        _REPAIRED.inc()
        return copied

    def _missing(self, ledger_id: int, entry_ids: Sequence[int]) -> list[int]:
        return [e for e in entry_ids if not self._bookie.holds_entry(ledger_id, e)]

    async def _copy(self, md: LedgerMetadata, segment: Segment, digest: DigestManager, key: bytes,
                    ledger_id: int, entry_ids: list[int]) -> int:
        """Read ``entry_ids`` from the other replicas and store them here; returns how many were
        stored. Raises the first failure after storing the entries that were read."""
        schedule = RoundRobinSchedule(md.ensemble_size, md.write_quorum_size, md.ack_quorum_size)
        results = await asyncio.gather(
            *(self._read_elsewhere(schedule, segment, digest, ledger_id, e) for e in entry_ids),
            return_exceptions=True,
        )
        raws = [r for r in results if isinstance(r, bytes)]
        if raws:
            await self._store(raws, key)
            _COPIED.inc(len(raws))
        failure = next((r for r in results if isinstance(r, BaseException)), None)
        if failure is not None:
            raise failure
        return len(raws)

    async def _read_elsewhere(self, schedule: RoundRobinSchedule, segment: Segment, digest: DigestManager,
                              ledger_id: int, entry_id: int) -> bytes | None:
        """The verified entry from another replica of its write set; None if enough of them
        said explicitly they do not have it (never acknowledged, or trimmed)."""
        bc = self._client.bookie_client
        timeout = float(self._client.config.read_entry_timeout_s)
        others = [b for b in schedule.replicas(segment.ensemble, entry_id, rotation=entry_id)
                  if b != self.bookie_id]
        negatives = 0
        errors: list[BaseException] = []
        for bookie in others:
            try:
                raw = await bc.read(bookie, ledger_id, entry_id, timeout_s=timeout)
                digest.verify(raw, entry_id)
                return bytes(raw)
            except NEGATIVE_ANSWERS as exc:
                negatives += 1
                errors.append(exc)
            except DigestMismatchError as exc:
                log.warning("integrity check: ledger %d entry %d: bad copy on %s: %s", ledger_id, entry_id, bookie, exc)
                errors.append(exc)
            except Exception as exc:  # down, timeout, unknown (limbo elsewhere too): not a negative
                errors.append(exc)
        if negatives >= schedule.write_set_coverage:
            log.warning("integrity check: ledger %d entry %d: %d other replica(s) say they never had it "
                        "(never acknowledged, or trimmed): nothing to copy", ledger_id, entry_id, negatives)
            return None
        raise ReadError(f"ledger {ledger_id} entry {entry_id}: no other replica of {others} gave it: {errors}")

    async def _store(self, raws: list[bytes], key: bytes) -> None:
        """Recovery adds into this bookie (journaled and fsynced before this returns)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def on_result(refused: list[BaseException | None], error: BaseException | None) -> None:
            if fut.done():
                return
            first = next((r for r in refused if r is not None), None) or error
            if first is not None:
                fut.set_exception(first)
            else:
                fut.set_result(None)

        self._async_bookie.add_entries_cb([(raw, key, True) for raw in raws], on_result)
        await fut
