"""Check a fragment on its bookie, and copy a fragment to a new bookie (async, Vellum's client).

``FragmentCopier.holds``: does the fragment's bookie hold every entry it should, intact? With
``verify=False`` it asks for the list of entry ids (LIST_ENTRIES, one request); with
``verify=True`` it reads every entry and checks its digest, which also finds corrupt copies
(the replicas check).

``FragmentCopier.copy``: read each entry of the fragment from the other bookies of its write
set (the first one that answers with an intact copy: digest verified, ids checked), else from
the fragment's own bookie (a bookie replaced because it misses some entries of the fragment may
hold the only surviving copy of others: its intact copies are as good as any), and write
it to the new bookie with a recovery add (accepted even when the ledger is fenced). How much is
in flight and how fast (``pacing``): at most ``batch`` entries, fewer while the bookies are busy
with foreground traffic (``YieldingWindow``, unless ``yield_target_s`` is None), and at most
``rate_bytes`` per second (``replicationRateByBytes``). The verified reads of ``holds`` are
paced the same way.
An entry no surviving replica holds intact fails the copy (``LedgerRecoveryError``): the
fragment is never replaced with a partial copy.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from vellum import stats
from vellum.autorecovery.fragments import Fragment
from vellum.autorecovery.pacing import RateLimiter, YieldingWindow
from vellum.client.bookie_client import BookieClient
from vellum.errors import (
    DigestMismatchError,
    LedgerRecoveryError,
    NoSuchEntryError,
    NoSuchLedgerError,
    ReadError,
    VellumError,
)
from vellum.format.entry import DigestManager, DigestType, master_key
from vellum.meta.model import LedgerMetadata

log = logging.getLogger(__name__)

ENTRIES_WRITTEN = stats.counter("replication_worker_NUM_ENTRIES_WRITTEN",
                                "entries re-replicated to a replacement bookie")
BYTES_WRITTEN = stats.counter("replication_worker_NUM_BYTES_WRITTEN", "bytes re-replicated to a replacement bookie")
BYTES_READ = stats.counter("replication_worker_NUM_BYTES_READ", "bytes read from surviving replicas")
WINDOW = stats.gauge("replication_worker_ENTRIES_IN_FLIGHT_ALLOWED",
                     "entries a replication worker (or the auditor's replicas check) may have in flight now: "
                     "smaller while it yields to foreground traffic", ("role",))
QUEUING = stats.gauge("replication_worker_QUEUING_DELAY_SECONDS",
                      "delay of a replication worker's requests above the lowest seen lately (last round)", ("role",))


T = TypeVar("T")

#: test flag (the simulator's regression seed): False reads an entry only from the other bookies
#: of its write set, never from the fragment's own bookie (the behaviour before the fix)
_read_from_replaced_bookie = True


class FragmentCopier:
    """See the module docstring. One per worker; ``timeout_s`` bounds each request."""

    def __init__(self, client: BookieClient, *, batch: int, rate_bytes: int, timeout_s: float,
                 yield_target_s: float | None = None, role: str = "worker",
                 progress: Callable[[int, int], None] | None = None) -> None:
        self._bc = client
        window_gauge, queuing_gauge = WINDOW.labels(role), QUEUING.labels(role)

        def on_round(window: float, queuing_s: float) -> None:
            window_gauge.set(window)
            queuing_gauge.set(queuing_s)

        self.window = YieldingWindow(batch, yield_target_s, on_round=on_round)
        window_gauge.set(self.window.window)
        self._limiter = RateLimiter(rate_bytes)
        self._timeout = timeout_s
        self._progress = progress or (lambda _done, _total: None)

    async def holds(self, fragment: Fragment, md: LedgerMetadata, *, verify: bool) -> bool:
        """Whether the fragment's bookie holds all of the fragment's (closed) entries."""
        entries = fragment.entries(md.write_quorum_size)
        if not entries:
            return True
        if not verify:
            try:
                ranges = await self._bc.list_entries(fragment.bookie, fragment.ledger_id, timeout_s=self._timeout)
            except NoSuchLedgerError:
                return False
            held = _in_ranges(ranges)
            return all(held(e) for e in entries)
        digest = DigestManager(fragment.ledger_id, DigestType(int(md.digest_type)), md.password)

        async def intact(entry_id: int) -> bool:
            async with self.window.slot():
                try:
                    raw = await self._timed(self._bc.read(fragment.bookie, fragment.ledger_id, entry_id,
                                                          timeout_s=self._timeout))
                    await self._limiter.acquire(len(raw))
                    digest.verify(raw, entry_id)
                    return True
                except (NoSuchEntryError, NoSuchLedgerError):
                    return False  # the bookie answered: it does not have it
                except (DigestMismatchError, ReadError) as exc:
                    # The bookie answered with a copy that fails its digest, or EIO (it found its
                    # stored copy corrupt): this replica needs repair.
                    log.warning("ledger %d entry %d on %s: %s", fragment.ledger_id, entry_id, fragment.bookie, exc)
                    return False
                # Anything else (timeout, no connection, limbo's "unknown") leaves the answer
                # unknown: raised, never taken for "missing".

        # The first read whose answer is unknown (a timeout, no connection) decides: ``holds``
        # raises it. The reads not answered yet are cancelled then, not left to run on: their
        # answers would be thrown away, and meanwhile they would hold the window's slots (and
        # the bookie) from the next check or copy of this worker.
        tasks = [asyncio.ensure_future(intact(e)) for e in entries]
        try:
            results = await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                if not t.done():
                    t.cancel()
        return all(results)

    async def copy(self, fragment: Fragment, md: LedgerMetadata, target: str) -> int:
        """Copy the fragment's entries to ``target``; returns the bytes copied."""
        entries = fragment.entries(md.write_quorum_size)
        digest = DigestManager(fragment.ledger_id, DigestType(int(md.digest_type)), md.password)
        key = master_key(md.password)
        done = 0
        copied = 0

        async def one(entry_id: int) -> None:
            nonlocal done, copied
            async with self.window.slot():
                t0 = time.monotonic()
                raw = await self._read_intact(fragment, md, digest, entry_id)
                took = time.monotonic() - t0
                await self._limiter.acquire(len(raw))
                t0 = time.monotonic()
                await self._bc.add(target, key, raw, recovery=True, timeout_s=self._timeout)
                self.window.done(took + time.monotonic() - t0)
                ENTRIES_WRITTEN.inc()
                BYTES_WRITTEN.inc(len(raw))
                copied += len(raw)
                done += 1
                if done % 100 == 0 or done == len(entries):
                    self._progress(done, len(entries))

        tasks = [asyncio.ensure_future(one(e)) for e in entries]
        try:
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                if not t.done():
                    t.cancel()
        return copied

    async def _read_intact(self, fragment: Fragment, md: LedgerMetadata, digest: DigestManager,
                           entry_id: int) -> bytes:
        problems: list[str] = []
        sources = fragment.sources(entry_id, md.write_quorum_size)
        if _read_from_replaced_bookie:
            sources.append(fragment.bookie)  # last: it is being replaced, but may hold the only copy
        for source in sources:
            try:
                raw = await self._bc.read(source, fragment.ledger_id, entry_id, timeout_s=self._timeout)
                digest.verify(raw, entry_id)
            except VellumError as exc:
                problems.append(f"{source}: {exc}")
                continue
            BYTES_READ.inc(len(raw))
            return bytes(raw)
        raise LedgerRecoveryError(
            f"ledger {fragment.ledger_id} entry {entry_id}: no intact copy on any replica "
            f"({'; '.join(problems) or 'none'}); fragment at {fragment.first_entry} on "
            f"{fragment.bookie} not replaced"
        )

    async def _timed(self, op: Awaitable[T]) -> T:
        """Await one request and tell the window how long it took."""
        t0 = time.monotonic()
        result = await op
        self.window.done(time.monotonic() - t0)
        return result


def _in_ranges(ranges: tuple[tuple[int, int], ...]) -> Callable[[int], bool]:
    def held(entry_id: int) -> bool:
        return any(lo <= entry_id <= hi for lo, hi in ranges)

    return held
