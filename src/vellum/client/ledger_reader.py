"""The reader role of a ledger handle: verified range and batch reads, LAC reads, long poll, tail
(BookKeeper's ``ReadOnlyLedgerHandle`` reads, ``PendingReadOp``, ``ReadLastConfirmedOp``).

Responsibility: everything that reads one ledger, on one asyncio loop, for an opened ledger
(read only) and for a writing handle's own reads. What the handle knows of the ledger (metadata,
LAC, ensemble) lives in its ``LedgerView``; which replicas hold an entry comes from
``distribution.py``; reading one entry or batch from them is ``replica_read.py``.

Reads: only up to the LAC (``read_unconfirmed`` beyond it); each entry from the first replica of
its write set, a speculative read to the next replica after ``speculativeReadTimeout``, failover
on error (another round after a backoff if every replica pushed back); every entry is
digest-verified, a bad replica is skipped. Ranges are pipelined: a sliding window of
``READ_WINDOW`` entry reads (callbacks, no task per entry); unstriped ledgers (E == WQ) read
BATCH_READ chunks, several in flight spread over the replicas, falling back to entry reads for
a chunk no replica serves whole; striped ones read READ_STRIDED chunks per bookie, entry by entry
for what a bookie does not serve. Results always come back in entry-id order.

LAC: a handle with its own writer knows its LAC (it confirms it) and asks no bookie; a reader
asks the last ensemble and answers at quorum coverage (every write set has ``(WQ - AQ) + 1``
answers), learns the LAC piggy-backed on the entries it reads, long-polls for a newer one and
re-reads the metadata to notice a close or an ensemble change.

Invariants: never returns an entry above the LAC from ``read``/``batch_read``/``tail``; never an
unverified entry; the LAC only moves forward (``LedgerView.set_lac``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from vellum.client.distribution import (
    chunk_entries,
    plan_batched_chunks,
    plan_strided_chunks,
    segment_last,
    size_cut,
)
from vellum.client.ledger_view import LedgerView
from vellum.client.replica_read import (
    NEGATIVE_ANSWERS,
    EntryRead,
    ReplicaReads,
    answer_entries,
    answer_spans,
    collect_answers,
)
from vellum.errors import DigestMismatchError, IncorrectParameterError, ReadError, VellumError
from vellum.format.entry import ENTRY_HEADER_SIZE, Entry, PayloadSpans
from vellum.frozen import builder
from vellum.meta.model import LedgerMetadata

if TYPE_CHECKING:
    from vellum.client.context import ClientContext

log = logging.getLogger(__name__)

_T = TypeVar("_T")

#: entry reads outstanding at once in a range read (striped ledgers)
READ_WINDOW = 256
#: entries per BATCH_READ / READ_STRIDED chunk at most, bytes per answer, chunks in flight
BATCH_CHUNK_ENTRIES = 256
BATCH_CHUNK_BYTES = 2 * 1024 * 1024
BATCH_WINDOW = 4
#: entries per chunk of a bulk read (``read_payloads``) at most: a range is read in one chunk
#: per bookie up to this many entries each (and BATCH_CHUNK_BYTES)
BULK_CHUNK_ENTRIES = 4096


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One entry as returned by reads (payload only; the header was verified)."""

    ledger_id: int
    entry_id: int
    payload: bytes

    @property
    def length(self) -> int:
        return len(self.payload)


#: ``LedgerEntry(...)`` taking every field, for ``LedgerReader._to_ledger_entries`` (once per
#: entry read): about half the cost of the frozen class's own ``__init__`` (``vellum.frozen``)
_new_ledger_entry = builder(LedgerEntry)


class OwnWriter(Protocol):
    """What a reader needs of its handle's own writer: whether it may still confirm entries."""

    @property
    def stopped(self) -> bool: ...


async def _gather_window(jobs: list[Callable[[], Awaitable[_T]]], window: int) -> list[_T]:
    """Run ``jobs`` with at most ``window`` at once; their results in job order. The first
    failure propagates and the jobs still pending are cancelled."""
    if len(jobs) <= window:
        # All fit in the window: no semaphore (an uncontended one never suspends, so the
        # schedule is the same without it; most reads are one or two jobs).
        async def one(job: Callable[[], Awaitable[_T]]) -> _T:
            return await job()
    else:
        sem = asyncio.Semaphore(window)

        async def one(job: Callable[[], Awaitable[_T]]) -> _T:
            async with sem:
                return await job()

    # the loop's create_task: what ensure_future does with a coroutine, without its type checks
    loop = asyncio.get_running_loop()
    tasks = [loop.create_task(one(job)) for job in jobs]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()


class LedgerReader:
    """Reads of one open ledger; see the module docstring. ``own_writer``: the handle's writer,
    if it has one (then the LAC is the one it confirms: no bookie is asked for it, and ``tail``
    ends once that writer stopped)."""

    def __init__(self, ctx: ClientContext, view: LedgerView, *, own_writer: OwnWriter | None = None) -> None:
        self._ctx = ctx
        self._bc = ctx.bookie_client
        self._view = view
        self._own_writer = own_writer
        self.ledger_id = view.ledger_id
        self._digest = view.digest
        self._schedule = view.schedule
        self._E = view.schedule.ensemble_size
        self._WQ = view.schedule.write_quorum_size
        self._loop = asyncio.get_running_loop()
        config = ctx.config
        self._read_timeout_s = float(config.read_entry_timeout_s)
        self._replicas = ReplicaReads(self._bc, self._digest, self.ledger_id, self._read_timeout_s,
                                      config.speculative_read_timeout_ms / 1000.0)

    # ================================================================================== reads
    async def read(self, first_entry_id: int, last_entry_id: int) -> list[LedgerEntry]:
        """Entries ``first..last`` (inclusive), all at or below the LAC."""
        self._check_range(first_entry_id, last_entry_id)
        lac = self._view.lac
        if last_entry_id > lac:
            raise ReadError(
                f"ledger {self.ledger_id}: cannot read entries {first_entry_id}..{last_entry_id} beyond the "
                f"last add confirmed {lac} (use read_unconfirmed)"
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
        lac = self._view.lac
        if start_entry_id > lac:
            raise ReadError(
                f"ledger {self.ledger_id}: entry {start_entry_id} is beyond the last add confirmed {lac}"
            )
        # Do not cross a segment boundary: one batch is served by one write set.
        last = segment_last(start_entry_id, min(lac, start_entry_id + max_count - 1), self._view.metadata.ensembles)
        if self._E == self._WQ and max_size > 0:
            got = await self._read_batch(start_entry_id, last, 0, max_size)
            if got:
                return self._to_ledger_entries(got)
            log.debug("ledger %d: batch read from %d failed on every replica; reading entries",
                      self.ledger_id, start_entry_id)
            entries = self._to_ledger_entries(await self._read_entries(start_entry_id, last))
        else:
            entries = await self._read_range(start_entry_id, last)
        return entries[:size_cut((len(e.payload) for e in entries), max_size)]

    def _check_range(self, first: int, last: int) -> None:
        if first < 0 or first > last:
            raise IncorrectParameterError(f"ledger {self.ledger_id}: bad entry range {first}..{last}")
        md = self._view.metadata
        if md.is_closed and last > md.last_entry_id:
            raise ReadError(
                f"ledger {self.ledger_id} is closed at entry {md.last_entry_id}; "
                f"cannot read up to {last}"
            )

    def _to_ledger_entries(self, entries: Sequence[Entry]) -> list[LedgerEntry]:
        """Payloads of verified entries; a reader of an open ledger learns the LAC they carry."""
        lid = self.ledger_id
        view = self._view
        learn = self._own_writer is None and not view.metadata.is_closed
        out: list[LedgerEntry] = []
        for e in entries:
            if learn and e.lac > view.lac:
                view.set_lac(e.lac, None)
            out.append(_new_ledger_entry(lid, e.entry_id, e.payload))
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

    async def read_payloads(self, first_entry_id: int, last_entry_id: int) -> PayloadSpans:
        """The payloads of entries ``first..last`` in order, for bulk readers (the Spark
        source): the same reads, replica choice, failover and checks as ``read_unconfirmed``
        (every entry's digest, ledger id and entry id verified), but no object per entry: the
        payloads are spans of the bookies' answers, checked where they arrived. Reads beyond
        the LAC like ``read_unconfirmed``: callers read only entries they know were confirmed."""
        self._check_range(first_entry_id, last_entry_id)
        first, last = first_entry_id, last_entry_id
        if last - first < 8:
            return PayloadSpans.of([e.payload for e in await self._read_range(first, last)])
        ensembles = self._view.metadata.ensembles
        # One chunk per bookie of the ensemble where the bytes allow, not BATCH_CHUNK_ENTRIES:
        # each request costs the bookie and this client a fixed share of work (a thread hop,
        # an index lookup, a frame, a future) that 256-entry chunks of small entries paid
        # several times per range (docs/benchmarks.md, "Bulk reads in one request per bookie").
        per_chunk = self._chunk_entries(max(BATCH_CHUNK_ENTRIES, min(BULK_CHUNK_ENTRIES, -(-(last - first + 1) // self._E))))
        if self._E == self._WQ:
            chunks = plan_batched_chunks(first, last, ensembles, per_chunk)
            parts = await _gather_window([functools.partial(self._batched_payloads, lo, hi, k)
                                          for k, (lo, hi) in enumerate(chunks)], BATCH_WINDOW)
            return PayloadSpans.concat(parts)
        E = self._E
        strided = plan_strided_chunks(first, last, ensembles, E, per_chunk)
        got = await _gather_window([functools.partial(self._strided_payloads, start, count)
                                    for start, count in strided], BATCH_WINDOW)
        # each chunk's entries are every E-th of the range
        return PayloadSpans.interleave(last - first + 1,
                                       [(start - first, E, part) for (start, _), part in zip(strided, got, strict=True)])

    def _learn_lac(self, lac: int) -> None:
        """A reader of an open ledger learns the LAC its entries carry (``_to_ledger_entries``)."""
        if self._own_writer is None and not self._view.metadata.is_closed and lac > self._view.lac:
            self._view.set_lac(lac, None)

    async def _batched_payloads(self, first: int, last: int, rotation: int) -> PayloadSpans:
        """``_read_chunk`` for ``read_payloads``."""
        out: list[PayloadSpans] = []
        nxt = first
        while nxt <= last:
            replicas = self._schedule.replicas(self._view.metadata.ensemble_for(nxt), nxt, rotation)
            got, lac = await self._replicas.read_batch_payloads(nxt, last, replicas, BATCH_CHUNK_BYTES)
            if not got:
                out.append(PayloadSpans.of([e.payload for e in self._to_ledger_entries(await self._read_entries(nxt, last))]))
                break
            self._learn_lac(lac)
            out.append(got)
            nxt += len(got)  # a short answer (size cap): ask again for the rest
        return PayloadSpans.concat(out)

    async def _strided_payloads(self, start: int, count: int) -> PayloadSpans:
        """``_strided_chunk`` for ``read_payloads``: entries ``start, start + E, ...``."""
        E = self._E
        bookie = self._view.metadata.ensemble_for(start)[self._schedule.write_set(start)[0]]
        out: list[PayloadSpans] = []
        nxt, remaining = start, count
        while remaining > 0:
            got: PayloadSpans | None = None
            try:
                raws = await self._bc.read_strided(bookie, self.ledger_id, nxt, E, remaining, BATCH_CHUNK_BYTES,
                                                   timeout_s=self._read_timeout_s)
                got, lac = self._digest.verify_spans(answer_spans(raws[:remaining]), nxt, E)
                self._learn_lac(lac)
            except VellumError as e:
                log.debug("ledger %d: strided read of %d from %s failed: %s", self.ledger_id, nxt, bookie, e)
            if not got:
                # As _strided_chunk: the rest of the chunk entry by entry, from the other replicas.
                single = await self._read_ids(range(nxt, nxt + remaining * E, E))
                out.append(PayloadSpans.of([e.payload for e in self._to_ledger_entries(single)]))
                break
            out.append(got)
            nxt += len(got) * E  # a short answer (size cap, or a gap): ask again for the rest
            remaining -= len(got)
        return PayloadSpans.concat(out)

    def _chunk_entries(self, max_entries: int = BATCH_CHUNK_ENTRIES) -> int:
        """Entries per BATCH_READ / READ_STRIDED chunk: about ``BATCH_CHUNK_BYTES`` of them, at
        most ``max_entries``."""
        # Stored entries carry the header and digest too: the bookie's size cap counts them.
        return chunk_entries(self._view.lac, self._view.lac_length, ENTRY_HEADER_SIZE + self._digest.digest_length,
                             max_entries, BATCH_CHUNK_BYTES)

    async def _read_strided(self, first: int, last: int) -> list[Entry]:
        """Striped ledgers (E > WQ): ``first..last`` as READ_STRIDED chunks. The entries whose
        write set a bookie heads (``e % E``) are read from it with stride E, in chunks of about
        ``BATCH_CHUNK_BYTES``, at most ``BATCH_WINDOW`` in flight; what a bookie does not serve
        is read entry by entry (failover, speculative reads). Results in entry-id order."""
        chunks = plan_strided_chunks(first, last, self._view.metadata.ensembles, self._E, self._chunk_entries())
        parts = await _gather_window([functools.partial(self._strided_chunk, start, count)
                                      for start, count in chunks], BATCH_WINDOW)
        out = [e for part in parts for e in part]
        out.sort(key=lambda e: e.entry_id)
        return out

    async def _strided_chunk(self, start: int, count: int) -> list[Entry]:
        E = self._E
        bookie = self._view.metadata.ensemble_for(start)[self._schedule.write_set(start)[0]]
        out: list[Entry] = []
        nxt, remaining = start, count
        while remaining > 0:
            got: list[Entry] = []
            try:
                raws = await self._bc.read_strided(bookie, self.ledger_id, nxt, E, remaining, BATCH_CHUNK_BYTES,
                                                   timeout_s=self._read_timeout_s)
                got = list(map(self._digest.verify, answer_entries(raws, remaining), range(nxt, nxt + remaining * E, E)))
            except VellumError as e:
                log.debug("ledger %d: strided read of %d from %s failed: %s", self.ledger_id, nxt, bookie, e)
            if not got:
                # This bookie does not serve entry nxt: it goes the single-entry way (the other
                # replicas), and so does the rest of the chunk, concurrently.
                out.extend(await self._read_ids(range(nxt, nxt + remaining * E, E)))
                break
            out.extend(got)
            nxt += len(got) * E  # a short answer (size cap, or a gap): ask again for the rest
            remaining -= len(got)
        return out

    async def _read_entries(self, first: int, last: int) -> list[Entry]:
        """Verified entries ``first..last`` in order (``_read_ids``)."""
        if first == last:
            return [await self._read_entry(first)]
        return await self._read_ids(range(first, last + 1))

    async def _read_ids(self, ids: range) -> list[Entry]:
        """Verified entries ``ids`` in order, at most ``READ_WINDOW`` reads outstanding; each
        entry with its own speculative read and failover (``EntryRead``: callbacks, no task per
        entry). The first entry that cannot be read fails them all."""
        n = len(ids)
        if n == 0:
            return []
        results: list[Entry | None] = [None] * n
        done: asyncio.Future[None] = self._loop.create_future()
        active: set[EntryRead] = set()
        first, step = ids.start, ids.step
        at = 0  # the next position of ids to start
        remaining = n
        md = self._view.metadata
        replicas_of = self._schedule.replicas
        source = self._replicas

        def start_more() -> None:
            nonlocal at
            while at < n and len(active) < READ_WINDOW:
                eid = ids[at]
                at += 1
                r = EntryRead(source, eid, replicas_of(md.ensemble_for(eid), eid), on_done)
                active.add(r)
                r.start()

        def on_done(r: EntryRead) -> None:
            nonlocal remaining
            active.discard(r)
            if done.done():
                return
            if r.error is not None:
                done.set_exception(r.error)
                return
            results[(r.entry_id - first) // step] = r.result
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
        # Chunks of about BATCH_CHUNK_BYTES, so that big entries are read in parallel chunks
        # too (one chunk of 256 x 128 KiB entries was 16 sequential round trips to one replica).
        chunks = plan_batched_chunks(first, last, self._view.metadata.ensembles, self._chunk_entries())
        if len(chunks) == 1:
            return await self._read_chunk(first, last, 0)
        parts = await _gather_window([functools.partial(self._read_chunk, lo, hi, k)
                                      for k, (lo, hi) in enumerate(chunks)], BATCH_WINDOW)
        return [e for part in parts for e in part]

    async def _read_chunk(self, first: int, last: int, rotation: int) -> list[Entry]:
        out: list[Entry] = []
        nxt = first
        while nxt <= last:
            got = await self._read_batch(nxt, last, rotation, BATCH_CHUNK_BYTES)
            if not got:
                out.extend(await self._read_entries(nxt, last))
                break
            out.extend(got)
            nxt += len(got)  # a short answer (size cap): ask again for the rest
        return out

    async def _read_batch(self, first: int, last: int, rotation: int, max_size: int) -> list[Entry]:
        """One BATCH_READ of ``first..last``, replicas of its write set tried from ``rotation``."""
        replicas = self._schedule.replicas(self._view.metadata.ensemble_for(first), first, rotation)
        return await self._replicas.read_batch(first, last, replicas, max_size)

    async def _read_entry(self, entry_id: int) -> Entry:
        """One verified entry: first replica of its write set, speculative read to the next after
        ``speculativeReadTimeout``, the next replica at once on an error."""
        replicas = self._schedule.replicas(self._view.metadata.ensemble_for(entry_id), entry_id)
        return await self._replicas.read_entry(entry_id, replicas)

    # ----------------------------------------------------------------------------- LAC reads
    def _lac_from_answer(self, body: bytes, last: bytes) -> int:
        """LAC a bookie knows: max(explicit LAC, piggy-backed LAC of its last entry)."""
        lac = -1
        if body:
            lac = self._digest.verify_lac(body)
        if last:
            lac = max(lac, self._digest.verify(last).lac)
        return lac

    def _min_lac(self) -> int:
        # Entries before the last segment were all acknowledged: the segment starts at LAC + 1.
        return max(self._view.metadata.ensembles) - 1

    def _lac_is_known(self) -> bool:
        """No bookie needs asking: the ledger is closed, or this handle's own writer confirms it."""
        return self._view.metadata.is_closed or self._own_writer is not None

    async def read_last_add_confirmed(self) -> int:
        """Ask the last ensemble for the LAC and answer at quorum coverage (every write set has
        ``(WQ - AQ) + 1`` answers); the handle's LAC advances to it."""
        if self._lac_is_known():
            return self._view.lac
        return await self._read_lac(first_only=False)

    async def try_read_last_add_confirmed(self) -> int:
        """Best effort: the LAC from the first bookie that answers."""
        if self._lac_is_known():
            return self._view.lac
        return await self._read_lac(first_only=True)

    async def _read_lac(self, *, first_only: bool) -> int:
        view = self._view
        ensemble = list(view.ensemble)
        responded: set[int] = set()
        best = max(view.lac, self._min_lac())
        errors: list[BaseException] = []
        requests = {
            self._bc.read_lac_future(b, self.ledger_id, timeout_s=self._read_timeout_s): i
            for i, b in enumerate(ensemble)
        }

        def on_answer(idx: int, t: asyncio.Future[tuple[bytes, bytes]]) -> bool:
            nonlocal best
            exc = t.exception()
            if exc is None:
                try:
                    lac = self._lac_from_answer(*t.result())
                except DigestMismatchError as e:
                    errors.append(e)
                    return False
                best = max(best, lac)
                responded.add(idx)
                return first_only
            if isinstance(exc, NEGATIVE_ANSWERS):
                responded.add(idx)
            else:
                errors.append(exc)
            return False

        covered = await collect_answers(
            requests, on_answer, lambda: not first_only and self._schedule.has_quorum_coverage(responded)
        )
        if covered or (first_only and responded):
            view.set_lac(best, None)
            return view.lac
        raise ReadError(
            f"ledger {self.ledger_id}: LAC read reached no quorum coverage "
            f"({len(responded)} of {self._E} bookies answered; errors: {errors})"
        )

    async def wait_for_lac(self, previous_lac: int, timeout_s: float) -> int:
        """Long poll: return once the LAC passes ``previous_lac`` or ``timeout_s`` elapse (then
        the best LAC known). Any bookie's LAC is a confirmed one, so the first that moved wins."""
        view = self._view
        if view.lac > previous_lac or view.metadata.is_closed:
            return view.lac
        if self._own_writer is not None:
            await view.wait_for_lac(previous_lac, timeout_s)
            return view.lac
        start = self._loop.time()
        timeout_ms = max(1, int(timeout_s * 1000))
        requests = {
            self._bc.long_poll_lac_future(b, self.ledger_id, previous_lac, timeout_ms): i
            for i, b in enumerate(view.ensemble)
        }
        best = max(view.lac, self._min_lac())
        any_ok = False

        def on_answer(_idx: int, t: asyncio.Future[tuple[bytes, bytes]]) -> bool:
            nonlocal best, any_ok
            if t.exception() is not None:
                return False
            try:
                lac = self._lac_from_answer(*t.result())
            except DigestMismatchError:
                return False
            any_ok = True
            best = max(best, lac)
            return False

        await collect_answers(requests, on_answer, lambda: best > previous_lac)
        if not any_ok:
            # Every bookie failed at once: do not let a tail loop spin.
            remaining = timeout_s - (self._loop.time() - start)
            if remaining > 0:
                await asyncio.sleep(min(remaining, 0.1))
        view.set_lac(best, None)
        return view.lac

    async def refresh_metadata(self) -> LedgerMetadata:
        """Re-read the metadata (a reader notices CLOSED and ensemble changes; a writing handle's
        metadata is its own writer's, never replaced from here)."""
        view = self._view
        current = await self._ctx.read_metadata(self.ledger_id)
        if current.version != view.metadata_version and self._own_writer is None:
            view.adopt(current)
        return view.metadata

    async def tail(
        self, start_entry_id: int = 0, *, poll_timeout_s: float = 1.0, batch_size: int = 64
    ) -> AsyncGenerator[LedgerEntry, None]:
        """Yield every entry from ``start_entry_id`` in order as it becomes confirmed; ends once
        the ledger is closed and its last entry was yielded."""
        view = self._view
        own_writer = self._own_writer
        next_id = start_entry_id
        while True:
            if next_id <= view.lac:
                hi = min(view.lac, next_id + batch_size - 1)
                for entry in await self._read_range(next_id, hi):
                    yield entry
                next_id = hi + 1
                continue
            if view.metadata.is_closed:
                if next_id > view.metadata.last_entry_id:
                    return
                continue
            if own_writer is not None and own_writer.stopped:
                return  # our own writer stopped: nothing more will be confirmed
            before = view.lac
            lac = await self.wait_for_lac(before, poll_timeout_s)
            if lac <= before and own_writer is None:
                await self.refresh_metadata()
