"""The handle of an open named ledger (:class:`NamedLedgerHandle`): one writer session or reader.

Responsibility: append (a writer), read and tail with global entry ids across segments,
shrink, cursors and close, for one name, over the segment ledgers' handles. It is opened by
:class:`vellum.client.named.NamedLedgers` and stays bound to it: the handle reads and CASes the
record through its ``_get`` / ``_get_existing`` / ``_cas`` and shrinks with its writer's LAC
through ``_shrink``; NamedLedgers gives a writing handle its segment writer once
(:meth:`NamedLedgerHandle._adopt_writer`), that writer reports ensemble changes to it
(:meth:`NamedLedgerHandle._record_ensemble_change`), and a reader learns the open segment's
LAC on open (:meth:`NamedLedgerHandle._segment_reader`). The two modules are one unit; these
methods are its seam, not public API.

Invariants:
- global entry id = the segment's first entry id + the entry's id in its ledger; a writer's
  ids continue the record's sequence and follow call order;
- only entries confirmed by the bookies (LAC) or by the record (a closed segment's last entry)
  are returned; entries below the record's start are refused (``EntriesShrunkError``);
- a writer changes the record only while its session holds it (``NamedLedgerRecord.held_by``):
  the record names a new ensemble before the ledger's metadata does, so acquirers that fence
  the bookies the record names stop this writer; a fenced writer never re-opens the record;
- a writer that failed (fenced, no bookies) leaves its segment to the next acquirer's recovery.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING

from vellum.client.ledger import LedgerHandle
from vellum.client.named_record import CAS_RETRIES, NamedLedgerEntry, NamedLedgerRecord, Segment, ShrinkResult
from vellum.errors import (
    EntriesShrunkError,
    IllegalOpError,
    IncorrectParameterError,
    LedgerClosedError,
    LedgerFencedError,
    MetadataVersionError,
    NoSuchEntryError,
    ReadError,
    VellumError,
)
from vellum.meta.api import Versioned
from vellum.meta.model import LedgerMetadata

if TYPE_CHECKING:
    from vellum.client.named import NamedLedgers

__all__ = ["NamedLedgerHandle"]


class NamedLedgerHandle:
    """An open named ledger: a writer (CREATE/APPEND) or a reader (READ_ONLY). Entry ids are global.

    Readers see the record as of their last refresh: on open, and whenever a read or tail passes
    the end they know of (or finds the open segment idle); ``refresh()`` forces one.
    """

    def __init__(self, named: NamedLedgers, record: Versioned[NamedLedgerRecord]) -> None:
        self._named = named
        self._bk = named.bookkeeper
        self._record = record.value
        self._version = record.version
        self._writer: LedgerHandle | None = None  # with _writer_segment: set once, by _adopt_writer
        self._writer_segment: Segment | None = None
        self._readers: dict[int, LedgerHandle] = {}
        self._last_future: asyncio.Future[int] | None = None
        self._closed = False

    def _adopt_writer(self, writer: LedgerHandle, segment: Segment) -> None:
        """Become the writer session of ``segment`` (the record's open last segment) through
        ``writer``, its ledger's handle. Called once, by the :class:`NamedLedgers` that opened
        this handle to write; the handle exists first because the writer reports its ensemble
        changes to it (:meth:`_record_ensemble_change`)."""
        if self._writer is not None:
            raise IllegalOpError(f"named ledger {self.name!r}: this handle already has a writer")
        self._writer, self._writer_segment = writer, segment

    # ------------------------------------------------------------------ properties
    @property
    def name(self) -> str:
        return self._record.name

    @property
    def record(self) -> NamedLedgerRecord:
        return self._record

    @property
    def version(self) -> int:
        """The record version this handle last saw (for CAS of cursors)."""
        return self._version

    @property
    def is_writer(self) -> bool:
        return self._writer is not None

    @property
    def writer_epoch(self) -> int:
        return self._writer_segment.epoch if self._writer_segment is not None else self._record.writer_epoch

    @property
    def start_entry_id(self) -> int:
        return self._record.start_entry_id

    @property
    def ledger_id(self) -> int | None:
        """The writer's current segment ledger (None for a reader)."""
        return self._writer.ledger_id if self._writer is not None else None

    @property
    def last_add_confirmed(self) -> int:
        """Global id of the last confirmed entry this handle knows (``start - 1`` if none)."""
        rec = self._record
        if self._writer is not None and self._writer_segment is not None:
            return self._writer_segment.first_entry_id + self._writer.last_add_confirmed
        seg = rec.open_segment
        if seg is not None:
            h = self._readers.get(seg.ledger_id)
            lac = h.last_add_confirmed if h is not None else -1
            return max(seg.first_entry_id + lac, rec.closed_end - 1)
        return rec.closed_end - 1

    def __repr__(self) -> str:
        return (f"NamedLedgerHandle(name={self.name!r}, {'writer' if self.is_writer else 'reader'}, "
                f"start={self.start_entry_id}, lac={self.last_add_confirmed})")

    # ------------------------------------------------------------------ writes
    def append_async(self, data: bytes | bytearray | memoryview) -> asyncio.Future[int]:
        """Append one entry; the future completes with its global entry id once acknowledged."""
        w = self._writer
        loop = asyncio.get_running_loop()
        if w is None or self._writer_segment is None:
            fut: asyncio.Future[int] = loop.create_future()
            fut.set_exception(IllegalOpError(f"named ledger {self.name!r} was opened read-only"))
            return fut
        if self._closed:
            fut = loop.create_future()
            fut.set_exception(LedgerClosedError(f"named ledger {self.name!r}: handle closed"))
            return fut
        base = self._writer_segment.first_entry_id
        inner = w.append_async(data)
        out: asyncio.Future[int] = loop.create_future()

        def transfer(f: asyncio.Future[int]) -> None:
            if out.done():
                return
            exc = f.exception()
            if exc is not None:
                out.set_exception(exc)
            else:
                out.set_result(base + f.result())

        inner.add_done_callback(transfer)
        self._last_future = out
        return out

    async def append(self, data: bytes | bytearray | memoryview) -> int:
        return await self.append_async(data)

    async def _record_ensemble_change(self, md: LedgerMetadata) -> None:
        """Write the writer segment's new ensembles into the record (before the ledger's metadata)."""
        seg = self._writer_segment
        assert seg is not None
        ensembles = {k: tuple(str(b) for b in v) for k, v in md.ensembles.items()}
        rec, version = self._record, self._version
        for _ in range(CAS_RETRIES):
            if not rec.held_by(seg):
                raise LedgerFencedError(
                    f"named ledger {self.name!r}: writer epoch {seg.epoch} was fenced by epoch {rec.writer_epoch}"
                )
            updated = rec.with_open_ensembles(ensembles)
            try:
                version = await self._named._cas(updated, version)
            except MetadataVersionError:
                current = await self._named._get(self.name)
                if current is None:
                    raise LedgerFencedError(f"named ledger {self.name!r} was deleted") from None
                rec, version = current.value, current.version
                continue
            self._record, self._version = updated, version
            self._writer_segment = updated.segments[-1]
            return
        raise MetadataVersionError(f"named ledger {self.name!r}: ensemble change lost too many CAS races")

    # ------------------------------------------------------------------ reads
    async def refresh(self) -> NamedLedgerRecord:
        """Re-read the record (1 metadata read): new segments, closes, shrink."""
        got = await self._named._get_existing(self.name)
        self._adopt(got)
        return self._record

    def _adopt(self, got: Versioned[NamedLedgerRecord]) -> None:
        if got.version == self._version:
            return
        self._record, self._version = got.value, got.version
        live = {s.ledger_id for s in got.value.segments}
        for lid in [lid for lid in self._readers if lid not in live]:
            del self._readers[lid]

    async def _segment_reader(self, seg: Segment) -> LedgerHandle:
        if self._writer is not None and seg.ledger_id == self._writer.ledger_id:
            return self._writer
        h = self._readers.get(seg.ledger_id)
        if h is None:
            h = await self._bk.open_ledger(seg.ledger_id, password=self._record.password, recovery=False)
            self._readers[seg.ledger_id] = h
        return h

    async def read_last_add_confirmed(self) -> int:
        """Refresh the record and the open segment's LAC from the bookies; the global LAC."""
        if self._writer is not None:
            return self.last_add_confirmed
        await self.refresh()
        seg = self._record.open_segment
        if seg is not None:
            h = await self._segment_reader(seg)
            with contextlib.suppress(VellumError):
                await h.read_last_add_confirmed()
        return self.last_add_confirmed

    def _check_start(self, first: int) -> None:
        if first < self._record.start_entry_id:
            raise EntriesShrunkError(
                f"named ledger {self.name!r}: entry {first} is below the start {self._record.start_entry_id} "
                "(shrunk)"
            )

    async def read(self, first_entry_id: int, last_entry_id: int) -> list[NamedLedgerEntry]:
        """Entries ``first..last`` (global ids, inclusive), all confirmed, possibly across segments."""
        if first_entry_id < 0 or first_entry_id > last_entry_id:
            raise IncorrectParameterError(f"named ledger {self.name!r}: bad entry range {first_entry_id}..{last_entry_id}")
        if last_entry_id > self.last_add_confirmed:
            await self.read_last_add_confirmed()
        self._check_start(first_entry_id)
        if last_entry_id > self.last_add_confirmed:
            raise ReadError(
                f"named ledger {self.name!r}: cannot read {first_entry_id}..{last_entry_id} beyond the "
                f"last add confirmed {self.last_add_confirmed}"
            )
        out: list[NamedLedgerEntry] = []
        nxt = first_entry_id
        while nxt <= last_entry_id:
            batch = await self._read_some(nxt, last_entry_id)
            out.extend(batch)
            nxt = batch[-1].entry_id + 1
        return out

    async def _read_some(self, first: int, last: int) -> list[NamedLedgerEntry]:
        """Entries from ``first`` up to ``last`` within one segment (at least one)."""
        for attempt in range(2):
            seg = self._record.segment_for(first)
            if seg is None:
                if attempt == 0:
                    await self.refresh()
                    self._check_start(first)
                    continue
                raise NoSuchEntryError(f"named ledger {self.name!r}: no segment holds entry {first}")
            h = await self._segment_reader(seg)
            lo = first - seg.first_entry_id
            hi = last - seg.first_entry_id
            try:
                if seg.last_entry_id is not None:
                    # Closed in the record: every entry up to its last was recovered to AQ bookies,
                    # even if the ledger's own metadata is not closed yet.
                    hi = min(hi, seg.last_entry_id - seg.first_entry_id)
                    entries = await h.read_unconfirmed(lo, hi)
                else:
                    hi = min(hi, h.last_add_confirmed)
                    entries = await h.read(lo, hi)
            except NoSuchEntryError:
                if attempt == 0:  # trimmed or dropped meanwhile?
                    await self.refresh()
                    self._check_start(first)
                    continue
                raise
            base = seg.first_entry_id
            return [NamedLedgerEntry(base + e.entry_id, e.payload, seg.ledger_id, e.entry_id) for e in entries]
        raise NoSuchEntryError(f"named ledger {self.name!r}: entry {first} not found")

    async def tail(
        self, start_entry_id: int | None = None, *, poll_timeout_s: float = 1.0, batch_size: int = 64
    ) -> AsyncGenerator[NamedLedgerEntry, None]:
        """Every entry from ``start_entry_id`` (default: the start) in order, as it becomes
        confirmed, across writer sessions: when the open segment is closed (or fenced) and a new
        one appears, continue there. Never ends for a reader; a writer's tail ends when it closes.
        Raises ``EntriesShrunkError`` if the position falls below the start."""
        nxt = self._record.start_entry_id if start_entry_id is None else start_entry_id
        while True:
            self._check_start(nxt)
            rec = self._record
            seg = rec.segment_for(nxt)
            if seg is None:
                if self._writer is not None:
                    if self._closed:
                        return
                    await asyncio.sleep(poll_timeout_s)
                    continue
                # Past the end of the closed segments and no open one yet: wait for the next writer.
                before = self._version
                await self.refresh()
                if self._version == before:
                    await asyncio.sleep(poll_timeout_s)
                continue
            h = await self._segment_reader(seg)
            local = nxt - seg.first_entry_id
            bound = (seg.last_entry_id - seg.first_entry_id) if seg.last_entry_id is not None else h.last_add_confirmed
            if local <= bound:
                for e in await self._read_some(nxt, seg.first_entry_id + min(bound, local + batch_size - 1)):
                    yield e
                    nxt = e.entry_id + 1
                continue
            if seg.last_entry_id is not None:
                continue  # segment finished: segment_for(nxt) moves to the next one
            if h is self._writer:
                if self._closed or not self._writer.is_writable:
                    return  # our own writer stopped: nothing more will be confirmed
                await h.wait_for_lac(h.last_add_confirmed, poll_timeout_s)
                continue
            before = h.last_add_confirmed
            lac = await h.wait_for_lac(before, poll_timeout_s)
            if lac <= before:
                # Idle: the writer may be gone (fenced, closed): the record says what happened.
                await self.refresh()

    # ------------------------------------------------------------------ shrink / cursors
    async def shrink(self, end_entry_id: int, force: bool = False) -> ShrinkResult:
        """See :meth:`NamedLedgers.shrink`. Not allowed on a READ_ONLY handle (it changes state)."""
        if self._writer is None:
            raise IllegalOpError(f"named ledger {self.name!r} was opened read-only: use NamedLedgers.shrink")
        result = await self._named._shrink(self.name, end_entry_id, force, self.last_add_confirmed)
        await self.refresh()
        return result

    def get_cursor(self, key: str) -> tuple[bytes | None, int]:
        """(value, record version) as of this handle's view; ``refresh()`` first for the newest."""
        return self._record.cursors.get(key), self._version

    async def set_cursor(self, key: str, value: bytes | None, expected_version: int) -> int:
        """CAS the cursor into the record; ``MetadataVersionError`` if the record moved on."""
        if expected_version == self._version:
            updated = self._record.with_cursors({key: value})
            version = await self._named._cas(updated, expected_version)
            self._record, self._version = updated, version
            return version
        version = await self._named.set_cursor(self.name, key, value, expected_version)
        await self.refresh()
        return version

    # ------------------------------------------------------------------ close
    async def close(self, *, time_range: tuple[int, int] | None = None, entries: int = 0) -> None:
        """A writer closes its segment: its ledger (CLOSED at the LAC), then the record. A writer
        that failed (fenced, no bookies) leaves the segment to the next acquirer's recovery.

        ``time_range``: (lowest, highest) append time of ``entries`` records-v1 entries the caller
        (the producer) wrote; kept in the closed segment (docs/formats.md "Segment time range")
        only if they are every entry of it."""
        if self._closed:
            return
        self._closed = True
        w, seg = self._writer, self._writer_segment
        if w is None or seg is None:
            return
        if self._last_future is not None:
            await asyncio.gather(self._last_future, return_exceptions=True)  # drains: futures complete in order
        if not w.is_writable:
            w.abandon()
            return
        await w.close()
        closed = seg.closed(w.last_add_confirmed, w.length)
        if time_range is not None and entries > 0 and closed.entry_count == entries \
                and 0 <= time_range[0] <= time_range[1]:
            closed = dataclasses.replace(closed, time_range=time_range)
        rec, version = self._record, self._version
        for _ in range(CAS_RETRIES):
            if not rec.held_by(seg):
                mine = next((s for s in rec.segments if s.ledger_id == seg.ledger_id), None)
                if mine is not None and mine.last_entry_id not in (None, closed.last_entry_id):
                    raise LedgerFencedError(
                        f"named ledger {self.name!r}: segment {seg.ledger_id} was closed by another writer at "
                        f"{mine.last_entry_id}; this writer's last entry is {closed.last_entry_id}"
                    )
                return  # the next writer closed it the same way
            updated = rec.with_writer_closed(closed)
            try:
                version = await self._named._cas(updated, version)
            except MetadataVersionError:
                current = await self._named._get(self.name)
                if current is None:
                    return
                rec, version = current.value, current.version
                continue
            self._record, self._version = updated, version
            if not closed.entry_count:
                await self._named._delete_ledgers([seg.ledger_id])
            return
        raise MetadataVersionError(f"named ledger {self.name!r}: close lost too many CAS races")

    async def __aenter__(self) -> NamedLedgerHandle:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
