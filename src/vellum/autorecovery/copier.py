"""Check a fragment on its bookie, and copy a fragment to a new bookie (async, Vellum's client).

``FragmentCopier.holds``: does the fragment's bookie hold every entry it should, intact? With
``verify=False`` it asks for the list of entry ids (LIST_ENTRIES, one request); with
``verify=True`` it reads every entry and checks its digest, which also finds corrupt copies
(the replicas check).

``FragmentCopier.copy``: read each entry of the fragment from the other bookies of its write
set (the first one that answers with an intact copy: digest verified, ids checked), and write
it to the new bookie with a recovery add (accepted even when the ledger is fenced), at most
``batch`` entries in flight and at most ``rate_bytes`` per second (``replicationRateByBytes``).
An entry no surviving replica holds intact fails the copy (``LedgerRecoveryError``): the
fragment is never replaced with a partial copy.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from vellum import stats
from vellum.autorecovery.fragments import Fragment
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


class RateLimiter:
    """At most ``rate`` units per second on average (``rate <= 0``: unlimited)."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self._clock = clock
        self._next = clock()

    async def acquire(self, units: int) -> None:
        if self.rate <= 0:
            return
        now = self._clock()
        start = max(now, self._next)
        self._next = start + units / self.rate
        if start > now:
            await asyncio.sleep(start - now)


class FragmentCopier:
    """See the module docstring. One per worker; ``timeout_s`` bounds each request."""

    def __init__(self, client: BookieClient, *, batch: int, rate_bytes: int, timeout_s: float,
                 progress: Callable[[int, int], None] | None = None) -> None:
        self._bc = client
        self._batch = max(1, batch)
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
        sem = asyncio.Semaphore(self._batch)

        async def intact(entry_id: int) -> bool:
            async with sem:
                try:
                    raw = await self._bc.read(fragment.bookie, fragment.ledger_id, entry_id, timeout_s=self._timeout)
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

        results = await asyncio.gather(*(intact(e) for e in entries))
        return all(results)

    async def copy(self, fragment: Fragment, md: LedgerMetadata, target: str) -> int:
        """Copy the fragment's entries to ``target``; returns the bytes copied."""
        entries = fragment.entries(md.write_quorum_size)
        digest = DigestManager(fragment.ledger_id, DigestType(int(md.digest_type)), md.password)
        key = master_key(md.password)
        sem = asyncio.Semaphore(self._batch)
        done = 0
        copied = 0

        async def one(entry_id: int) -> None:
            nonlocal done, copied
            async with sem:
                raw = await self._read_intact(fragment, md, digest, entry_id)
                await self._limiter.acquire(len(raw))
                await self._bc.add(target, key, raw, recovery=True, timeout_s=self._timeout)
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
        for source in fragment.sources(entry_id, md.write_quorum_size):
            try:
                raw = await self._bc.read(source, fragment.ledger_id, entry_id, timeout_s=self._timeout)
                digest.verify(raw, entry_id)
            except VellumError as exc:
                problems.append(f"{source}: {exc}")
                continue
            BYTES_READ.inc(len(raw))
            return bytes(raw)
        raise LedgerRecoveryError(
            f"ledger {fragment.ledger_id} entry {entry_id}: no intact copy on the other replicas "
            f"({'; '.join(problems) or 'none'}); fragment at {fragment.first_entry} on "
            f"{fragment.bookie} not replaced"
        )


def _in_ranges(ranges: tuple[tuple[int, int], ...]) -> Callable[[int], bool]:
    def held(entry_id: int) -> bool:
        return any(lo <= entry_id <= hi for lo, hi in ranges)

    return held
