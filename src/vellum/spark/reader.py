"""Batch and streaming readers of the ``vellum`` data source.

Responsibility: plan partitions (entry ranges of one ledger each) on the driver and read them
on executors as Arrow record batches; for streams, compute offsets (``{"<ledger id or name>":
next entry id}``) under read limits, with throttled LAC refreshes and ``availableNow`` support.

Invariants:
- planning is deterministic given the offsets: ``partitions(start, end)`` only looks at the
  offsets and the (immutable) placement of already confirmed entries, so a micro-batch replanned
  after a restart reads exactly the same entries (exactly-once source with Spark's offset log);
- an executor reads only entries that were confirmed at planning time (<= LAC, or <= last
  entry of a closed ledger), so ``read_unconfirmed`` on that range never returns data a
  recovery could drop; ledgers are never opened with recovery (no fencing of live writers);
- offsets are JSON dicts with string keys and int values; a key absent from ``start`` means
  "from the key's first readable entry" (a newly discovered name or ledger);
- the reader objects hold only picklable option values; clients are created lazily in the
  process that uses them and never pickled;
- a stream's lag (entries and estimated bytes between each micro-batch's end and the readable
  end) is reported through ``reportLatestOffset`` (Spark's progress has no other place a Python
  source can fill); the optional position cursor (``cursorName``) is written only in
  ``commit``, after Spark recorded the batch as done, and never holds the query up;
- with ``failOnDataLoss=false`` a read skips exactly the lost entries (a :class:`Loss` each,
  logged once where found); losses found while planning ride on a partition, so the task that
  runs it writes every row of ``dataLossLocation`` with its query and micro-batch ids; a
  stream's losses are visible in its offsets, so a replanned batch finds them again.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from vellum.client.blocking import BookKeeper, LedgerEntry
from vellum.client.ledger import LedgerHandle as AsyncLedgerHandle
from vellum.errors import NoSuchEntryError, NoSuchLedgerError, VellumError
from vellum.format.entry import PayloadSpans
from vellum.format.records import RECORDS_V1, entry_format, is_packed
from vellum.spark.catalog import Bounds, Catalog, DataLossError, Span, catalog_for, resolve_offset
from vellum.spark.connection import client, drop_client, shared_client
from vellum.spark.loss import (
    BEFORE_START,
    DELETED,
    GAP,
    MISSING,
    SHRUNK,
    TRUNCATED,
    Loss,
    check_location,
    task_ids,
    write_losses,
)
from vellum.spark.options import (
    COL_BATCH_INDEX,
    COL_ENTRY,
    COL_HEADERS,
    COL_KEY,
    COL_LEDGER,
    COL_METADATA,
    COL_NAME,
    COL_PAYLOAD,
    COL_TIMESTAMP,
    COL_TIMESTAMP_TYPE,
    COL_VALUE,
    ReadOptions,
)
from vellum.spark.packed_arrow import ZERO32, binary_column
from vellum.spark.record_columns import RecordColumns, global_ids, unpack
from vellum.spark.timeseek import TimeSeek

log = logging.getLogger(__name__)
#: ranges of a partition read ahead of the one being converted (each about arrowBatchEntries rows)
_READS_AHEAD = 3


@dataclass(frozen=True)
class EntryRange:
    """Global entries ``[first, last]`` of ``key`` stored in ``ledger_id`` at ``global - base``."""

    key: str
    ledger_id: int
    base: int
    first: int
    last: int
    password: bytes = field(repr=False)  # never in a log line or error message


@dataclass(frozen=True)
class ReadPartition(InputPartition):  # type: ignore[misc]
    """One Spark task: entry ranges read one after the other (small segments share a task).

    ``losses``: ranges the planner found lost (already logged on the driver); the task records
    them in ``dataLossLocation``, where its ids (query, micro-batch) are known.
    """

    ranges: tuple[EntryRange, ...]
    losses: tuple[Loss, ...] = ()


def _split(key: str, spans: Sequence[Span], per_partition: int) -> list[EntryRange]:
    out: list[EntryRange] = []
    for s in spans:
        for lo in range(s.first, s.last + 1, per_partition):
            out.append(EntryRange(key, s.ledger_id, s.base, lo, min(s.last, lo + per_partition - 1), s.password))
    return out


def plan_partitions(
    opts: ReadOptions, catalog: Catalog, ranges: dict[str, tuple[int, int]],
    avg_entry_bytes: Mapping[str, int] | None = None, lost: list[Loss] | None = None,
) -> list[ReadPartition]:
    """Partitions for ``{key: (first, end)}`` honouring maxEntriesPerPartition, minPartitions
    and maxBytesPerPartition (estimated from each key's average entry size).

    ``lost``: losses found while planning; with failOnDataLoss=false the ranges that remain are
    planned, and the losses ride on the first partition (one of their own if nothing remains).
    """
    lost = list(lost or ())
    spans = {k: _spans(opts, catalog, k, a, b, lost) for k, (a, b) in sorted(ranges.items()) if b > a}
    per = opts.max_entries_per_partition
    total = sum(b - a for a, b in ranges.values() if b > a)
    if opts.min_partitions and total > 0:
        # Enough tasks for the requested parallelism, but never more than maxEntriesPerPartition each.
        per = max(1, min(per, math.ceil(total / opts.min_partitions)))
    pieces: list[tuple[EntryRange, int]] = []
    for key, ss in spans.items():
        avg = max(1, (avg_entry_bytes or {}).get(key, 1024))
        key_per = max(1, min(per, opts.max_bytes_per_partition // avg))  # big ranges split by bytes too
        pieces.extend((r, (r.last - r.first + 1) * avg) for r in _split(key, ss, key_per))
    parts = _group(pieces, opts.max_bytes_per_partition, per, opts.min_partitions or 1)
    if lost:
        parts = [dataclasses.replace(parts[0], losses=tuple(lost)), *parts[1:]] if parts else [
            ReadPartition((), tuple(lost))]
    return parts


def _spans(opts: ReadOptions, catalog: Catalog, key: str, first: int, end: int, lost: list[Loss]) -> list[Span]:
    """The spans of ``first..end-1``; where a name lost some of them, the spans of what remains."""
    try:
        return catalog.spans(key, first, end)
    except DataLossError as exc:
        failure = exc.loss
    bounds = catalog.bounds(key)
    if bounds is None:
        _data_loss(opts, _loss(opts, key, first, end - 1, DELETED, "before its entries were read"), lost)
        return []
    if first < bounds.first:
        cut = min(end, bounds.first)
        _data_loss(opts, _loss(opts, key, first, cut - 1, SHRUNK,
                               f"the first readable entry is now {bounds.first}"), lost)
        return _spans(opts, catalog, key, cut, end, lost) if cut < end else []
    _data_loss(opts, failure, lost)
    return []


def _group(pieces: list[tuple[EntryRange, int]], max_bytes: int, max_entries: int,
           min_parts: int) -> list[ReadPartition]:
    """Consecutive ranges packed into about equal tasks, like Spark packs small files.

    As many tasks as ``maxBytesPerPartition`` (and ``minPartitions``) ask for, each near the
    average size, never above ``maxEntriesPerPartition`` entries. Each task costs Spark ~0.1 s
    on a Python source, so many small segments (one per writing task) should not each be one.
    """
    if not pieces:
        return []
    total = sum(b for _r, b in pieces)
    n = max(1, math.ceil(total / max_bytes), min(min_parts, len(pieces)))
    target = total / n
    out: list[ReadPartition] = []
    cur: list[EntryRange] = []
    cur_bytes = cur_entries = 0
    for r, nbytes in pieces:
        entries = r.last - r.first + 1
        if cur and (cur_entries + entries > max_entries
                    or (cur_bytes + nbytes > target * 1.001 and len(out) < n - 1)):
            out.append(ReadPartition(tuple(cur)))
            cur, cur_bytes, cur_entries = [], 0, 0
        cur.append(r)
        cur_bytes += nbytes
        cur_entries += entries
    out.append(ReadPartition(tuple(cur)))
    return out


def _loss(opts: ReadOptions, key: str, first: int | None, last: int | None, reason: str, detail: str,
          ledger_id: int | None = None) -> Loss:
    """A loss of ``key`` (a name, or a ledger id in ledger mode)."""
    if opts.named:
        return Loss(key, ledger_id, first, last, reason, detail)
    return Loss(None, int(key), first, last, reason, detail)


def _deleted_under_stream(opts: ReadOptions, key: str, pos: int) -> Loss:
    """A stream's key vanished (found by latestOffset, recorded by partitions)."""
    return _loss(opts, key, pos, None, DELETED, "while the query was reading it")


def _truncated_under_stream(opts: ReadOptions, key: str, end: int, pos: int) -> Loss:
    """A stream's key has fewer entries than the query read (found by latestOffset, recorded by partitions)."""
    return _loss(opts, key, end, pos - 1, TRUNCATED,
                 f"it has only {end} entries but the query already read up to {pos} (replaced or truncated)")


def _data_loss(opts: ReadOptions, loss: Loss, lost: list[Loss] | None = None) -> None:
    """failOnDataLoss=true: fail naming the loss; false: log it and add it to ``lost`` (the rows)."""
    if opts.fail_on_data_loss:
        raise DataLossError(loss)
    log.warning("[LEDGER_DATA_LOSS] %s (skipped: failOnDataLoss=false%s)", loss.describe(),
                f"; recorded in {opts.data_loss_location}" if opts.data_loss_location else "")
    if lost is not None:
        lost.append(loss)


def read_range(opts: ReadOptions, schema: StructType, part: EntryRange,
               lost: list[Loss] | None = None) -> Iterator[pa.RecordBatch]:
    """Read one partition as Arrow batches of about ``arrowBatchEntries`` rows (executor side).

    Plain entries are one row each (``batchIndex`` 0); the entries of a ledger marked packed
    (``vellum.format.records``) are unpacked into their rows. Lost entries (failOnDataLoss=false)
    are added to ``lost``.
    """
    arrow_schema = to_arrow_schema(schema, timezone="UTC")  # as the Python data source worker checks it
    named = not opts.ledger_ids
    name_value = part.key if named else None
    with_md = opts.include_metadata
    try:
        bk = shared_client(opts.metadata_uri, opts.client_properties)
        # Metadata-only scan: ids come from the plan, no bookie is asked for payloads; only
        # packed ledgers must be read to know how many rows each entry holds.
        metadata_only = not opts.include_payload and not with_md
        if metadata_only and not is_packed(bk.ledger_metadata(part.ledger_id).custom_metadata):
            for lo in range(part.first, part.last + 1, opts.arrow_batch_entries):
                hi = min(part.last, lo + opts.arrow_batch_entries - 1)
                ids = list(range(lo, hi + 1))
                yield _batch(arrow_schema, name_value, part.ledger_id, ids, [0] * len(ids), RecordColumns(None), None)
            return
        handle = bk.open_ledger(part.ledger_id, password=part.password, recovery=False)
    except NoSuchLedgerError:
        _data_loss(opts, Loss(name_value, part.ledger_id, part.first, part.last, DELETED,
                              "the ledger was deleted before its entries were read"), lost)
        return
    except VellumError:
        drop_client(opts.metadata_uri, opts.client_properties)
        raise
    custom = dict(handle.metadata.custom_metadata)
    fmt = entry_format(custom)
    packed = fmt is not None
    rows_wanted = opts.arrow_batch_entries
    # Entries per read: the rows wanted for plain entries; for packed ones start small and
    # follow the rows per entry seen so far, so a batch stays near the rows wanted.
    step = rows_wanted if not packed else max(1, min(rows_wanted, 8))

    def fetch(lo: int) -> tuple[int, int, concurrent.futures.Future[PayloadSpans]]:
        hi = min(part.last, lo + step - 1)
        # Payloads only (verified, views of the bookies' answers): no object per entry.
        return lo, hi, bk.submit(handle.aio.read_payloads(lo - part.base, hi - part.base))

    # Reads stay in flight ahead (up to _READS_AHEAD ranges): the bookies and the client's loop
    # fetch the next ranges while this thread unpacks the current one and Spark consumes it.
    pending: collections.deque[tuple[int, int, concurrent.futures.Future[PayloadSpans]]] = collections.deque()
    next_lo = part.first

    def refill(depth: int) -> None:
        nonlocal next_lo
        while len(pending) < depth and next_lo <= part.last:
            got = fetch(next_lo)
            pending.append(got)
            next_lo = got[1] + 1

    refill(1)  # the first range alone: for packed entries its rows per entry set the step
    try:
        while pending:
            lo, hi, fut = pending.popleft()
            entry_ids: Sequence[int]
            try:
                payloads = fut.result()
                entry_ids = range(lo - part.base, hi - part.base + 1)  # ledger entry ids
            except (NoSuchEntryError, NoSuchLedgerError) as exc:
                if _ledger_deleted(bk, part.ledger_id):
                    _data_loss(opts, Loss(name_value, part.ledger_id, lo, part.last, DELETED,
                                          f"the ledger was deleted while it was read ({exc})"), lost)
                    return  # nothing after this range can be read either
                # A gap inside the ledger: keep every entry that remains, name exactly what is
                # lost (also when failing, failOnDataLoss=true), and go on with the ranges after
                # it (never drop the rest of the partition).
                entries, gone = bk.submit(_read_salvaging(handle.aio, lo - part.base, hi - part.base)).result()
                for first, last in _runs(gone):
                    _data_loss(opts, Loss(name_value, part.ledger_id, first + part.base, last + part.base, GAP,
                                          "no bookie has them"), lost)
                if not entries:
                    refill(_READS_AHEAD)
                    continue
                entry_ids = [e.entry_id for e in entries]
                payloads = PayloadSpans.of([e.payload for e in entries])
            if packed:
                row_ids, index, cols = unpack(part.ledger_id, part.base, entry_ids, payloads, fmt == RECORDS_V1)
                step = max(1, rows_wanted * len(payloads) // max(1, len(row_ids)))
            refill(_READS_AHEAD)
            if packed:
                if not opts.include_payload:
                    cols.value = None
                yield _batch(arrow_schema, name_value, part.ledger_id, row_ids, index, cols,
                             custom if with_md else None)
            else:
                n = len(payloads)
                yield _batch(arrow_schema, name_value, part.ledger_id, global_ids(entry_ids, part.base),
                             pa.repeat(ZERO32, n),
                             RecordColumns(binary_column(payloads) if opts.include_payload else None),
                             custom if with_md else None)
    finally:
        for _lo, _hi, fut in pending:
            fut.cancel()  # the consumer stopped early (or a range was lost): drop the reads ahead


def read_partition(opts: ReadOptions, schema: StructType, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """Every range of a planned partition, in order (executor side); then the partition's losses
    (the planner's and this task's) go to ``dataLossLocation``, one new file per task attempt."""
    if not isinstance(partition, ReadPartition):
        return  # Spark hands one placeholder partition when partitions() planned none
    lost = list(partition.losses)
    try:
        for r in partition.ranges:
            yield from read_range(opts, schema, r, lost)
    finally:
        # Also when the consumer stopped early (a limit): what was found lost is recorded.
        if lost and opts.data_loss_location:
            write_losses(opts.data_loss_location, lost, task_ids())


async def _read(handle: AsyncLedgerHandle, first: int, last: int) -> list[LedgerEntry]:
    """Entries ``first..last`` (all confirmed at planning time), as few round trips as possible.

    BATCH_READ (one request per replica for many entries) works below the handle's LAC and on
    unstriped segments; beyond the LAC this handle knows (its open-time LAC read may lag the
    planner's) entries are read one by one, which is safe for entries the plan saw confirmed.
    """
    out: list[LedgerEntry] = []
    pos = first
    while pos <= last:
        if pos <= handle.last_add_confirmed:
            got = await handle.batch_read(pos, last - pos + 1)
        else:
            got = await handle.read_unconfirmed(pos, last)
        if not got:
            raise NoSuchEntryError(f"ledger {handle.ledger_id}: entry {pos} not returned")
        out.extend(got)
        pos = got[-1].entry_id + 1
    return out


async def _read_salvaging(handle: AsyncLedgerHandle, first: int, last: int) -> tuple[list[LedgerEntry], list[int]]:
    """Entries ``first..last`` that some bookie still has, and the ids no bookie has.

    Used only after a range read failed with "no such entry" and ``failOnDataLoss=false``:
    where a multi-entry read fails, the entry at the failing position is asked for alone, so
    one lost entry costs one extra round trip and no readable entry after it is skipped.
    """
    out: list[LedgerEntry] = []
    lost: list[int] = []
    pos = first
    while pos <= last:
        try:
            got = await _read(handle, pos, last)
        except (NoSuchEntryError, NoSuchLedgerError):
            try:
                got = await handle.read_unconfirmed(pos, pos)
            except (NoSuchEntryError, NoSuchLedgerError):
                lost.append(pos)
                pos += 1
                continue
        out.extend(got)
        pos = got[-1].entry_id + 1
    return out, lost


def _runs(ids: list[int]) -> list[tuple[int, int]]:
    """Sorted ids as inclusive runs: [3, 4, 5, 9] -> [(3, 5), (9, 9)]."""
    runs: list[tuple[int, int]] = []
    for i in ids:
        if runs and runs[-1][1] == i - 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return runs


def _ledger_deleted(bk: BookKeeper, ledger_id: int) -> bool:
    """Whether the ledger's metadata is gone (then a failed read means the rest is gone too)."""
    try:
        bk.ledger_metadata(ledger_id)
    except NoSuchLedgerError:
        return True
    return False


def _batch(
    schema: pa.Schema,
    name: str | None,
    ledger_id: int,
    ids: list[int] | pa.Array,
    batch_index: list[int] | pa.Array,
    cols: RecordColumns,
    custom: dict[str, bytes] | None,
) -> pa.RecordBatch:
    """One Arrow batch of the read schema; each column is found by name (the schema's optional
    columns: ``payload``, ``headers``, ``customMetadata``)."""
    n = len(ids)
    if cols.value is None:
        value = pa.nulls(n, pa.binary())
    elif isinstance(cols.value, pa.Array):
        value = cols.value
    else:
        value = pa.array(cols.value, pa.binary())
    out: list[pa.Array] = []
    for f in schema:
        col: pa.Array | None
        if f.name in (COL_VALUE, COL_PAYLOAD):
            col = value
        elif f.name == COL_NAME:
            col = pa.nulls(n, pa.string()) if name is None else pa.repeat(pa.scalar(name, pa.string()), n)
        elif f.name == COL_LEDGER:
            col = pa.repeat(pa.scalar(ledger_id, pa.int64()), n)
        elif f.name == COL_ENTRY:
            col = ids if isinstance(ids, pa.Array) else pa.array(ids, pa.int64())
        elif f.name == COL_BATCH_INDEX:
            col = batch_index if isinstance(batch_index, pa.Array) else pa.array(batch_index, pa.int32())
        elif f.name == COL_KEY:
            col = cols.key
        elif f.name == COL_TIMESTAMP:
            col = cols.timestamp
        elif f.name == COL_TIMESTAMP_TYPE:
            col = cols.timestamp_type
        elif f.name == COL_HEADERS:
            col = cols.headers
        elif f.name == COL_METADATA:
            col = pa.array([list((custom or {}).items())] * n, f.type)
        else:  # pragma: no cover - the schema is fixed (datasource.read_schema)
            raise AssertionError(f"unknown read column {f.name}")
        out.append(pa.nulls(n, f.type) if col is None else col.cast(f.type) if col.type != f.type else col)
    return pa.RecordBatch.from_arrays(out, schema=schema)


class VellumBatchReader(DataSourceReader):  # type: ignore[misc]
    """``spark.read.format("vellum")``: a bounded scan of ledgers or named ledgers."""

    def __init__(self, opts: ReadOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema
        if opts.data_loss_location:
            check_location(opts.data_loss_location)

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.opts
        with client(opts.metadata_uri, opts.client_properties) as bk:
            catalog = catalog_for(opts, bk)
            keys = catalog.list_keys()
            starting, ending = opts.starting_map(), opts.ending_map()
            by_time = TimeSeek(opts, bk, keys)  # offsets by time: before startingOffsets / endingOffsets
            for what, offsets in (("startingOffsets", starting), ("endingOffsets", ending)):
                if isinstance(offsets, dict):
                    unknown = sorted(set(offsets) - set(keys))
                    if unknown:
                        raise ValueError(f"[VELLUM_OPTION] {what} names {unknown}, which the read does not select")
            ranges: dict[str, tuple[int, int]] = {}
            avg: dict[str, int] = {}
            lost: list[Loss] = []
            for key in keys:
                b = catalog.bounds(key)
                if b is None:
                    asked = starting.get(key) if isinstance(starting, dict) else None
                    _data_loss(opts, _loss(opts, key, asked if asked is not None and asked >= 0 else None, None,
                                           MISSING, f"the {_what(opts)} does not exist"), lost)
                    continue
                first = resolve_offset(starting.get(key, -2) if isinstance(starting, dict) else starting, b)
                end = resolve_offset(ending.get(key, -1) if isinstance(ending, dict) else ending, b)
                if by_time.active:
                    first, end = _or(by_time.starting(key, b), first), _or(by_time.ending(key, b), end)
                if first < b.first:
                    cut = min(b.first, end)
                    if cut > first:
                        _data_loss(opts, _loss(opts, key, first, cut - 1, BEFORE_START,
                                               f"startingOffsets asks for entry {first} but the first readable "
                                               f"entry is {b.first}"), lost)
                    first = b.first
                if end > b.end:
                    raise ValueError(f"[VELLUM_OPTION] endingOffsets of {key} is {end}, beyond the "
                                     f"{b.end} readable entries")
                ranges[key] = (first, max(first, end))
                avg[key] = b.avg_entry_bytes
            return plan_partitions(opts, catalog, ranges, avg, lost)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.opts, self.schema, partition)


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


def _what(opts: ReadOptions) -> str:
    return "ledger" if opts.ledger_ids is not None else "named ledger"


class VellumStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
    """``spark.readStream.format("vellum")``: offsets are the next entry id per ledger or name.

    Runs in one long-lived driver-side process per query run: the client, the reader handles and
    the LAC cache live for the run, never across restarts (the checkpoint carries the offsets).
    """

    def __init__(self, opts: ReadOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema
        self._bk: BookKeeper | None = None
        self._catalog: Catalog | None = None
        self._initial: dict[str, int] | None = None
        self._latest: dict[str, Bounds] = {}
        self._latest_at = -math.inf
        self._flowing = False  # the last refresh found new entries: the next one is not throttled
        self._target: dict[str, int] | None = None  # availableNow: frozen end
        self._pending: list[Loss] = []  # found by initialOffset: recorded by the next batch's tasks
        self._last_batch_at: float | None = None  # minEntriesPerTrigger: when the last batch was admitted
        self._reported: dict[str, int] = {}  # the offsets latestOffset returned last (lag is measured from them)
        self._cursors: dict[str, tuple[int, bool]] = {}  # cursorName: what this run stored per name
        if opts.data_loss_location:
            check_location(opts.data_loss_location)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_bk=None, _catalog=None, _latest={}, _latest_at=-math.inf, _flowing=False, _pending=[], _last_batch_at=None,
                     _reported={}, _cursors={})
        return state

    # --------------------------------------------------------------------------- helpers
    def _cat(self) -> Catalog:
        if self._catalog is None:
            self._bk = shared_client(self.opts.metadata_uri, self.opts.client_properties)
            self._catalog = catalog_for(self.opts, self._bk)
        return self._catalog

    def _refresh(self, *, force: bool = False) -> dict[str, Bounds]:
        """Bounds of every selected key; while idle, at most one refresh per ``lacPollIntervalMs``.

        Spark calls ``latestOffset`` ~40x/s with no trigger interval: each refresh is a quorum LAC
        read per open ledger (and a name-record read per name), so an idle stream is throttled.
        A refresh that found new entries does not throttle the next one: while data flows each
        micro-batch plans up to the freshest LAC instead of one up to ``lacPollIntervalMs`` old
        (which, with batches shorter than the interval, also left the next trigger empty).
        """
        now = time.monotonic()
        if not force and not self._flowing and (now - self._latest_at) * 1000 < self.opts.lac_poll_interval_ms:
            return self._latest
        cat = self._cat()
        fresh: dict[str, Bounds] = {}
        for key in cat.list_keys():
            b = cat.bounds(key)
            if b is not None:
                fresh[key] = b
        old = self._latest
        self._flowing = any(k not in old or b.end > old[k].end for k, b in fresh.items())
        self._latest, self._latest_at = fresh, now
        return fresh

    # --------------------------------------------------------------------------- Spark API
    def initialOffset(self) -> dict[str, int]:
        # Called twice at start: compute once so both calls agree.
        if self._initial is None:
            latest = self._refresh(force=True)
            starting = self.opts.starting_map()
            for key in self._cat().list_keys():
                if key not in latest:
                    asked = starting.get(key) if isinstance(starting, dict) else None
                    _data_loss(self.opts, _loss(self.opts, key, asked if asked is not None and asked >= 0 else None,
                                                None, MISSING, f"the {_what(self.opts)} does not exist"), self._pending)
            out: dict[str, int] = {}
            assert self._bk is not None
            by_time = TimeSeek(self.opts, self._bk, self._cat().list_keys())  # before startingOffsets
            for key, b in latest.items():
                spec = starting.get(key, -2) if isinstance(starting, dict) else starting
                out[key] = _or(by_time.starting(key, b) if by_time.active else None, resolve_offset(spec, b))
            self._initial = out
        return dict(self._initial)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.min_entries_per_trigger:
            # PySpark has no composite limit: ReadMinRows stands for every trigger option here
            # (latestOffset applies the maximums too). Trigger.Once passes ReadAllAvailable instead.
            return ReadMinRows(self.opts.min_entries_per_trigger)
        if self.opts.max_entries_per_trigger:
            return ReadMaxRows(self.opts.max_entries_per_trigger)
        if self.opts.max_bytes_per_trigger:
            return ReadMaxBytes(self.opts.max_bytes_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {k: b.end for k, b in self._refresh(force=True).items()}

    def reportLatestOffset(self) -> dict[str, dict[str, int]]:
        """What Spark shows as the source's ``latestOffset`` in the query's progress: per key the
        readable end (``latest``) and how far the micro-batch just planned ends behind it
        (``entriesBehind``, and ``bytesBehind`` estimated from the key's average entry size).
        Spark calls it right after ``latestOffset``; a key not planned yet has no lag fields."""
        return lag_report(self._latest, self._reported)

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        self._store_cursors(start)  # the last committed end (see _store_cursors)
        latest = self._refresh()
        target = dict(self._target) if self._target is not None else {k: b.end for k, b in latest.items()}
        end: dict[str, int] = {}
        avail: dict[str, int] = {}
        lossy = False  # offsets move past lost entries: that batch runs whatever minEntriesPerTrigger says
        for key, pos in start.items():
            # With failOnDataLoss=false the loss is logged and recorded by partitions(), which
            # finds it again in the offsets (also when a restarted query replans the batch).
            b = latest.get(key)
            if b is None:
                self._fail_on_loss(_deleted_under_stream(self.opts, key, pos))
                lossy = True
                continue  # dropped from the offsets: nothing more can be read from it
            if pos < b.first:
                self._fail_on_loss(_loss(self.opts, key, pos, b.first - 1, SHRUNK,
                                         f"the first readable entry is now {b.first}"))
                pos, lossy = b.first, True
            if pos > b.end:
                self._fail_on_loss(_truncated_under_stream(self.opts, key, b.end, pos))
                pos, lossy = b.end, True
            end[key] = pos
        for key, pos in end.items():
            avail[key] = max(0, min(target.get(key, pos), latest[key].end) - pos)
        waiting = sum(avail.values())
        for key, b in latest.items():
            if key not in end and key not in start:
                # Newly discovered: enter the offsets at its first readable entry, read from the
                # next trigger on, so every planned range has an explicit start (deterministic replay).
                end[key] = b.first
                waiting += max(0, min(target.get(key, b.end), b.end) - b.first)
        if not lossy and self._wait_for_more(limit, waiting):
            return dict(start)  # no new offsets: Spark starts no micro-batch
        rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        max_bytes = limit.max_bytes if isinstance(limit, ReadMaxBytes) else None
        if not isinstance(limit, ReadAllAvailable):
            # Both options apply whatever the default limit Spark passes back.
            rows = rows or self.opts.max_entries_per_trigger
            max_bytes = max_bytes or self.opts.max_bytes_per_trigger
        take = _allocate(avail, {k: latest[k].avg_entry_bytes for k in avail}, rows, max_bytes)
        out = {k: end[k] + take.get(k, 0) for k in end}
        if out != start:
            self._last_batch_at = time.monotonic()
        self._reported = dict(out)
        return out

    def _fail_on_loss(self, loss: Loss) -> None:
        if self.opts.fail_on_data_loss:
            raise DataLossError(loss)

    def _wait_for_more(self, limit: ReadLimit, waiting: int) -> bool:
        """minEntriesPerTrigger (Kafka's minOffsetsPerTrigger): start no micro-batch until that
        many entries wait across all keys, unless maxTriggerDelay has passed since the last batch
        (or since this run started) and at least one entry waits. ``availableNow`` ignores it: its
        end is frozen, so whatever is left of it is due (else the run would never finish)."""
        if not isinstance(limit, ReadMinRows) or self._target is not None:
            return False
        now = time.monotonic()
        if self._last_batch_at is None:
            self._last_batch_at = now  # the delay's clock starts with the run
        if waiting >= limit.min_rows:
            return False
        return waiting == 0 or (now - self._last_batch_at) * 1000 < self.opts.max_trigger_delay_ms

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        cat = self._cat()
        lost, self._pending = self._pending, []
        # Losses show in the offsets themselves (see latestOffset): a key dropped from `end` was
        # deleted, an end below the start was truncated; a name shrunk below the start is found
        # while planning (plan_partitions). So a replanned batch records them again.
        for key, pos in start.items():
            stop = end.get(key)
            if stop is None:
                _data_loss(self.opts, _deleted_under_stream(self.opts, key, pos), lost)
            elif stop < pos:
                _data_loss(self.opts, _truncated_under_stream(self.opts, key, stop, pos), lost)
        ranges: dict[str, tuple[int, int]] = {}
        for key, stop in end.items():
            first = start.get(key, stop)  # a key new in `end` enters at its start (see latestOffset)
            if stop > first:
                ranges[key] = (first, stop)
        # Entry sizes size the tasks; a restarted query replans its last batch before any
        # latestOffset, so learn them first (packed entries are ~128 KiB, not the 1 KiB default).
        latest = self._latest if all(k in self._latest for k in ranges) else self._refresh(force=True)
        return plan_partitions(self.opts, cat, ranges, {k: b.avg_entry_bytes for k, b in latest.items()}, lost)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.opts, self.schema, partition)

    def commit(self, end: dict[str, int]) -> None:
        """Positions live in Spark's checkpoint; nothing here may matter for correctness (the
        commit of the last availableNow batch only happens at the next run). With
        ``cursorName`` the committed end of each name is stored as a position cursor."""
        self._store_cursors(end)

    def _store_cursors(self, positions: Mapping[str, int]) -> None:
        """``cursorName``: store each name's committed position (skipped while unchanged).

        Called from ``commit(end)``, and from ``latestOffset(start)``: Spark hands a source the
        commit of batch N only when it plans batch N+1 *with data*, so an idle query's cursor
        would stay one batch behind; ``start`` of ``latestOffset`` is the end of the last batch
        in Spark's commit log (or the initial offsets, before which nothing will be read).
        A failure is logged and retried at the next call, never raised: the cursor serves
        monitoring and retention, not the query's correctness.
        """
        if self.opts.cursor_name is None:
            return
        from vellum.spark.names import store_position_cursor

        retain = self.opts.cursor_retain
        for name, pos in sorted(positions.items()):
            if self._cursors.get(name) == (pos, retain):
                continue  # unchanged since this run stored it: no record write
            try:
                self._cat()
                assert self._bk is not None
                stored = store_position_cursor(self._bk, name, self.opts.cursor_name, pos, retain=retain)
            except Exception as exc:
                log.warning("stream of %r: storing cursor %r at %d failed (%s: %s); retried at the next "
                            "trigger", name, self.opts.cursor_name, pos, type(exc).__name__, exc)
                continue
            if stored:
                self._cursors[name] = (pos, retain)
            else:
                log.info("stream of %r: cursor %r not stored: the named ledger no longer exists", name,
                         self.opts.cursor_name)


def lag_report(latest: Mapping[str, Bounds], positions: Mapping[str, int]) -> dict[str, dict[str, int]]:
    """Per key its readable end, and the entries (and estimated bytes) from ``positions`` to it."""
    out: dict[str, dict[str, int]] = {}
    for key, b in sorted(latest.items()):
        row = {"latest": b.end}
        pos = positions.get(key)
        if pos is not None:
            behind = max(0, b.end - pos)
            row.update(entriesBehind=behind, bytesBehind=behind * b.avg_entry_bytes)
        out[key] = row
    return out


def _allocate(
    avail: dict[str, int], avg_bytes: dict[str, int], max_rows: int | None, max_bytes: int | None
) -> dict[str, int]:
    """Entries to take per key: all available, or a share proportional to what each key has.

    Like Kafka's maxOffsetsPerTrigger: each key gets ``budget * avail / total`` (rounded down),
    then leftovers go in key order. A byte budget is turned into entries per key through the
    key's average entry size; at least one entry moves per trigger so a huge entry never stalls.
    """
    total = sum(avail.values())
    if total == 0:
        return {}
    budget = total
    if max_rows is not None:
        budget = min(budget, max_rows)
    if max_bytes is not None:
        weighted = sum(avail[k] * avg_bytes[k] for k in avail) / total
        budget = min(budget, max(1, int(max_bytes // max(1, weighted))))
    if budget >= total:
        return dict(avail)
    take = {k: (budget * a) // total for k, a in avail.items()}
    left = budget - sum(take.values())
    for k in sorted(avail):
        if left <= 0:
            break
        extra = min(left, avail[k] - take[k])
        take[k] += extra
        left -= extra
    return take
