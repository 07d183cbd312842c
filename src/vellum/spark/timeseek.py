"""Offsets by time: turn startingTimestamp / endingTimestamp (and their per-name JSON forms) into
entry ids, Kafka's ``offsetsForTimes`` for ledgers and named ledgers (docs/spark.md "Offsets by
time").

Responsibility: on the driver, find per key (a ledger id or a name) the first entry whose
*append time* is at or after a given time, reading O(log n) entries per ledger; validate the
time options against what the read selects; apply ``startingOffsetsByTimestampStrategy``.

What time means: an entry's append time, the writer's clock (ms) when it built the entry
(``records-v1``'s ``appendTimestamp``, docs/formats.md; the ``timestamp`` column of a record
without an event time, ``timestampType`` 1). Every record of a packed entry shares it.

Invariants:
- within one ledger append times never decrease (the producer and the Spark sink repeat the
  last time when the clock steps back), so a search inside a ledger is a binary search; across
  the segments of a name they may go back (segments of parallel tasks, writers on other hosts),
  so segments are scanned in order and the answer is the first entry of the name, in entry-id
  order, whose append time is >= t: every entry before it was appended before t (the same
  answer as taking the running maximum of append times, which is what Kafka's time index holds);
- a segment is skipped whole when its time range (kept in the name record, or read from its
  first and last entries) ends before t; a search reads at most ``PROBES`` entries per round
  (one round trip, in parallel) and the last ``SCAN`` entries in one range read;
- a ledger of plain or ``rows-v1`` entries has no time: a search that has to look inside one
  fails with ``[VELLUM_OPTION]`` naming the option, the key and the ledger;
- nothing here changes a ledger or a record (read handles, ``recovery=False``).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from vellum.client.blocking import BookKeeper, LedgerEntry, LedgerHandle
from vellum.client.ledger import LedgerHandle as AsyncLedgerHandle
from vellum.errors import NoSuchEntryError
from vellum.format.records import RECORDS_V1, decode_records, entry_format
from vellum.spark.catalog import Bounds
from vellum.spark.options import OptionError, ReadOptions, TimeSpec

log = logging.getLogger(__name__)

#: entries probed per round of the search (read in parallel: one round trip)
PROBES = 8
#: a candidate range this small is read whole, in one range read
SCAN = 32


@dataclass(frozen=True)
class TimedSpan:
    """Global entries ``[first, last]`` stored in ``ledger_id`` at ``global - base``, with the
    (lowest, highest) append time of its segment when the name record keeps it."""

    ledger_id: int
    base: int
    first: int
    last: int
    time_range: tuple[int, int] | None = None
    password: bytes = field(default=b"", repr=False)  # never in a log line or error message


class NoTimeError(Exception):
    """A ledger whose entries carry no append time (plain or ``rows-v1``)."""

    def __init__(self, span: TimedSpan, fmt: str) -> None:
        super().__init__(f"ledger {span.ledger_id}")
        self.span = span
        self.fmt = fmt


#: append times of global entry ids of a span, in the order asked
TimesOf = Callable[[TimedSpan, list[int]], list[int]]


def first_at_or_after(times_of: Callable[[list[int]], list[int]], lo: int, hi: int, t: int) -> int | None:
    """The first id in ``[lo, hi]`` whose time is >= ``t`` (times non-decreasing), or None.

    Keeps: every id below ``lo`` has a time < t; ``end`` (or nothing, if ``end > hi``) has a
    time >= t. Each round reads ``PROBES`` ids spread over ``[lo, end)`` and cuts it to one of
    ``PROBES + 1`` pieces; the last ``SCAN`` ids are read in one range.
    """
    end = hi + 1
    while end - lo > SCAN:
        n = end - lo
        probes = sorted({lo + (n * i) // (PROBES + 1) for i in range(1, PROBES + 1)})
        new_lo = lo
        for p, ts in zip(probes, times_of(probes), strict=True):
            if ts >= t:
                end = p
                break
            new_lo = p + 1
        lo = new_lo
    if lo < end:
        for i, ts in zip(range(lo, end), times_of(list(range(lo, end))), strict=True):
            if ts >= t:
                return i
    return end if end <= hi else None


def seek(times_of: TimesOf, spans: Sequence[TimedSpan], t: int) -> int | None:
    """The first global entry of ``spans`` (in order) appended at or after ``t``, or None."""
    for span in spans:
        if span.last < span.first:
            continue
        if span.time_range is not None:
            low, high = span.time_range  # of the whole segment: a readable suffix starts >= low
        else:
            got = times_of(span, [span.first] if span.first == span.last else [span.first, span.last])
            low, high = got[0], got[-1]
        if high < t:
            continue  # every entry of this span was appended before t
        if low >= t:
            return span.first
        found = first_at_or_after(lambda ids, s=span: times_of(s, ids), span.first, span.last, t)  # type: ignore[misc]
        if found is not None:
            return found
    return None


class EntryTimes:
    """Append times of entries read from the bookies (driver side), handles kept per ledger."""

    def __init__(self, bk: BookKeeper) -> None:
        self._bk = bk
        self._handles: dict[int, LedgerHandle] = {}
        self.entries_read = 0

    def __call__(self, span: TimedSpan, ids: list[int]) -> list[int]:
        h = self._handles.get(span.ledger_id)
        if h is None:
            h = self._bk.open_ledger(span.ledger_id, password=span.password, recovery=False)
            fmt = entry_format(h.metadata.custom_metadata)
            if fmt != RECORDS_V1:
                raise NoTimeError(span, "plain" if fmt is None else fmt.decode())
            self._handles[span.ledger_id] = h
        local = [i - span.base for i in ids]
        if local == list(range(local[0], local[-1] + 1)):
            entries = self._bk.run(_read_range(h.aio, local[0], local[-1]))
        else:
            entries = self._bk.run(_read_each(h.aio, local))
        self.entries_read += len(entries)
        return [decode_records(e.payload, where=f"ledger {span.ledger_id} entry {e.entry_id}",
                               check_offsets=False).append_timestamp for e in entries]

    def close(self) -> None:
        """Let go of the read handles (a read handle's close changes nothing in the ledger)."""
        handles, self._handles = self._handles, {}
        for h in handles.values():
            h.close()


async def _read_range(handle: AsyncLedgerHandle, first: int, last: int) -> list[LedgerEntry]:
    """Entries ``first..last`` (confirmed when the read was planned), in as few reads as it takes."""
    out: list[LedgerEntry] = []
    pos = first
    while pos <= last:
        got = await handle.read_unconfirmed(pos, last)
        if not got:
            raise NoSuchEntryError(f"ledger {handle.ledger_id}: entry {pos} not returned")
        out.extend(got)
        pos = got[-1].entry_id + 1
    return out


async def _read_each(handle: AsyncLedgerHandle, ids: list[int]) -> list[LedgerEntry]:
    """Single entries, read in parallel (one round trip for a round of probes)."""
    got = await asyncio.gather(*(handle.read_unconfirmed(i, i) for i in ids))
    return [g[0] for g in got]


def _iso(ms: int) -> str:
    try:
        return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat(timespec="milliseconds")
    except (OverflowError, ValueError, OSError):
        return "beyond year 9999"


class TimeSeek:
    """Offsets by time of one planning (batch partitions, or a stream's initial offsets)."""

    def __init__(self, opts: ReadOptions, bk: BookKeeper, keys: Sequence[str]) -> None:
        self._opts = opts
        self._bk = bk
        self._times = EntryTimes(bk)
        what = "ledgers" if opts.ledger_ids is not None else "names"
        for spec in (opts.starting_times, opts.ending_times):
            if spec is None:
                continue
            unknown = sorted(set(dict(spec.per_key)) - set(keys))
            if unknown:
                raise OptionError(f"option {spec.option} names {unknown}, which the read does not select (it "
                                  f"selects the {what} {sorted(keys)})")

    @property
    def active(self) -> bool:
        return self._opts.starting_times is not None or self._opts.ending_times is not None

    def starting(self, key: str, bounds: Bounds) -> int | None:
        """The starting offset of ``key`` by time, or None: startingOffsets applies to it."""
        spec = self._opts.starting_times
        t = spec.time_of(key) if spec is not None else None
        if spec is None or t is None:
            return None
        found = self._seek(spec, key, t, bounds)
        if found is not None:
            return found
        if self._opts.timestamp_strategy == "latest":
            log.info("%s %s: no entry appended at or after %s (%d ms); starting at its end %d "
                     "(startingOffsetsByTimestampStrategy=latest)", self._what(), key, _iso(t), t, bounds.end)
            return bounds.end
        future = " (a time in the future)" if t > datetime.datetime.now(datetime.UTC).timestamp() * 1000 else ""
        raise OptionError(
            f"option {spec.option}: {self._what()} {key!r} has no entry appended at or after {_iso(t)} "
            f"({t} ms){future}; set startingOffsetsByTimestampStrategy=latest to start at its end instead, or "
            "give an earlier time")

    def ending(self, key: str, bounds: Bounds) -> int | None:
        """The (exclusive) ending offset of ``key`` by time, or None: endingOffsets applies.
        No entry at or after the time: the end (Kafka: latest)."""
        spec = self._opts.ending_times
        t = spec.time_of(key) if spec is not None else None
        if spec is None or t is None:
            return None
        found = self._seek(spec, key, t, bounds)
        return bounds.end if found is None else found

    def _what(self) -> str:
        return "ledger" if self._opts.ledger_ids is not None else "named ledger"

    def _seek(self, spec: TimeSpec, key: str, t: int, bounds: Bounds) -> int | None:
        spans = self._spans(key, bounds)
        before = self._times.entries_read
        try:
            found = seek(self._times, spans, t)
        except NoTimeError as exc:
            s = exc.span
            raise OptionError(
                f"option {spec.option}: {self._what()} {key!r} has entries without a time: ledger {s.ledger_id} "
                f"(entries {s.first}..{s.last}) holds {exc.fmt} entries, and only records-v1 entries (written by "
                "the producer or the Spark sink) carry an append time; use startingOffsets / endingOffsets with "
                "entry ids for it") from None
        finally:
            self._times.close()
        if found is not None:
            found = min(max(found, bounds.first), bounds.end)
        log.info("%s of %s %r: %s -> %s (%d entries read)", spec.option, self._what(), key, _iso(t),
                 "none" if found is None else f"entry {found}", self._times.entries_read - before)
        return found

    def _spans(self, key: str, bounds: Bounds) -> list[TimedSpan]:
        if bounds.end <= bounds.first:
            return []
        if self._opts.ledger_ids is not None:
            return [TimedSpan(int(key), 0, bounds.first, bounds.end - 1, None, self._opts.password)]
        from vellum.spark.names import NameReader

        view = NameReader(self._bk).view(key)
        if view is None:
            return []
        out = []
        for seg in view.segments:
            first = max(seg.first_entry_id, view.start_entry_id, bounds.first)
            last = min(seg.last_readable, bounds.end - 1)
            if first <= last:
                out.append(TimedSpan(seg.ledger_id, seg.first_entry_id, first, last, seg.time_range, view.password))
        return out

