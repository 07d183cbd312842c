"""Batch and streaming writers of the ``vellum`` data source: exactly-once into a named ledger.

Responsibility: each task attempt writes its rows into a *staging ledger* of its own (a ledger
has one writer, so tasks cannot share one) and returns a commit message naming it; the driver's
commit publishes all staging ledgers of the job as new segments of the named ledger in **one
compare-and-set** of the name record; abort deletes them.

Protocol and invariants:
- before appending, a task registers its staging ledger under
  ``spark/staging/<job tag>/<partition>.<attempt>.<ledger id>`` in the metadata key-value store;
  right after the CAS the commit removes the registrations of the ledgers it published (they are
  segments now, no longer staging); commit and abort then delete every other registered ledger of
  the job (failed or speculative attempts, replays) and the registrations, so nothing is orphaned
  once the job ends; a driver that dies on the way leaves registrations ``vellum spark staging-gc``
  sweeps;
- a staging ledger is deleted only if no named ledger's segments reference it, checked against a
  fresh read of every name record right before the deletions (an unreadable record: nothing is
  deleted). The registrations alone cannot say "published": a driver killed between the CAS and
  their removal leaves published ledgers registered, and an applied CAS whose reply was lost
  looks like a failed (or replayed) commit to the driver;
- data becomes visible only through the CAS: before it readers see nothing of the job, after it
  everything (the staging ledgers are closed before their task reports success);
- streams: the same CAS also stores cursor ``spark.sink.<queryId>`` = the batch id, and a batch
  whose id is not above the stored one is a replay: its staging ledgers are deleted, the named
  ledger is untouched (exactly once per micro-batch across restarts and replays);
- ``mode("overwrite")`` replaces the name's segments by the job's in the same CAS; the old
  segments' ledgers are deleted after it;
- after each micro-batch's commit the driver keeps the name bounded (``merge.py``): small
  closed segments are merged into copies swapped in by CAS, and what they replaced (and old
  finished markers) is deleted after ``segmentRetireDelay``; that never fails the batch;
- writers hold only options and a job tag (picklable); commit relies only on the messages and
  the metadata store, since Spark runs it on a separate copy of the writer.

Speed: while a task writes, what its Python worker held before the task (pyspark, pyarrow, this
package: some 60,000 objects) is frozen out of the cyclic garbage collector (``gc.freeze``,
unfrozen when the task ends, whatever the outcome), so the collector's full passes, which the
add path's per-entry objects trigger, walk only what the task allocates (docs/spark.md
"## Speed"). Nothing is lost: frozen objects are collected again after the task. For the same
block the collector's young generation is collected every ``_YOUNG_COLLECTION_OBJECTS`` net
allocations instead of Python's 700: the adds in flight hold a few tracked objects each, so
at 700 the collector ran every few dozen adds and walked them all (about a seventh of the
client's CPU per entry, ``benchmarks/append_cpu.py``); the thresholds are restored after.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import concurrent.futures
import contextlib
import dataclasses
import gc
import json
import logging
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from vellum.client.blocking import BookKeeper
from vellum.client.blocking import LedgerHandle as BlockingLedgerHandle
from vellum.client.ledger import LedgerHandle as AsyncLedgerHandle
from vellum.errors import MetadataVersionError
from vellum.format.records import (
    ENTRY_FORMAT_KEY,
    RECORDS_V1,
    Record,
    encode_records,
    record_size,
    values_header,
)
from vellum.spark.connection import client, shared_client
from vellum.spark.options import COL_HEADERS, COL_KEY, COL_NAME, COL_TIMESTAMP, WriteOptions

log = logging.getLogger(__name__)

STAGING_PREFIX = "spark/staging/"
#: ``spark/finished/<job>``: written by the driver before it cleans a job's staging up (commit
#: or abort). A task that registers after the driver listed the registrations sees it and
#: removes its own staging ledger, so a task still running at abort leaves no orphan.
FINISHED_PREFIX = "spark/finished/"
TAG_JOB = "vellum.spark.job"
#: bytes of packed entries one task keeps in flight (bounds the window of big entries)
_PACKED_IN_FLIGHT_BYTES = 32 * 1024 * 1024
#: an appender keeps its window of adds in flight as about this many ``append_batch_async``
#: slices: one future per slice, and the next slice goes out once the oldest is acknowledged
_SLICES_IN_FLIGHT = 4


@dataclass(frozen=True)
class VellumCommit(WriterCommitMessage):  # type: ignore[misc]
    """What one successful task attempt wrote: a closed staging ledger (or ``ledger_id=-1`` if
    empty) for the ``name`` option; with a ``name`` column, ``segments`` lists one closed staging
    ledger per name the task's rows went to, ``(name, ledger id)``, and ``ledger_id`` is -1."""

    job: str
    partition_id: int
    attempt: int
    ledger_id: int
    rows: int
    bytes: int
    query_id: str | None = None
    batch_id: int | None = None
    segments: tuple[tuple[str, int], ...] = ()
    #: (ledger id, lowest, highest) append time (ms) of the records-v1 entries of each staging
    #: ledger: kept in its segment when published (docs/formats.md "Segment time range")
    time_ranges: tuple[tuple[int, int, int], ...] = ()

    def ledger_ids(self) -> list[int]:
        """Every staging ledger of this attempt."""
        return [lid for _n, lid in self.segments] + ([self.ledger_id] if self.ledger_id >= 0 else [])


def _value_column(batch: pa.RecordBatch, column: str) -> pa.Array:
    """The batch's value column (``value``, or its alias ``payload``) as a binary array without
    nulls (strings become their UTF-8)."""
    idx = batch.schema.get_field_index(column)
    if idx < 0:  # callers that skipped save()'s schema check: the alias either way
        column = "payload" if column == "value" else "value"
        idx = batch.schema.get_field_index(column)
    if idx < 0:
        raise ValueError("[VELLUM_WRITE] the DataFrame needs a 'value' column (binary or string)")
    col = batch.column(idx)
    if col.null_count:
        raise ValueError(f"[VELLUM_WRITE] column {column} is null in {col.null_count} row(s): every row needs a "
                         "value (filter them out, or coalesce them to an empty value)")
    if not pa.types.is_binary(col.type):
        col = col.cast(pa.binary())  # string (UTF-8 already) and large types: no re-encoding
    return col


def _offsets(column: pa.Array) -> memoryview:
    """The ``len + 1`` int32 offsets of a non-empty binary array into its data buffer (slices
    honoured), as a view: no copy."""
    start = column.offset
    return memoryview(column.buffers()[1])[4 * start:4 * (start + len(column) + 1)].cast("i")


def pack_column(column: pa.Array, max_rows: int, max_bytes: int, now_ms: int | None = None) -> list[bytes]:
    """Cut a binary column into ``records-v1`` entries of bare values (``vellum.format.records``),
    rows kept in order.

    An entry takes rows while it has fewer than ``max_rows`` and their bytes stay within
    ``max_bytes``; a row bigger than ``max_bytes`` gets an entry of its own. The rows' bytes are
    sliced straight out of the Arrow data buffer: one copy per entry, no Python object per row.
    """
    n = len(column)
    if n == 0:
        return []
    offs = _offsets(column).tolist()
    data = column.buffers()[2]
    mv = memoryview(data) if data is not None else memoryview(b"")
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    out: list[bytes] = []
    i = 0
    while i < n:
        j = bisect.bisect_right(offs, offs[i] + max_bytes, i + 1, min(n, i + max_rows) + 1) - 1
        if j <= i:
            j = i + 1
        base = offs[i]
        out.append(values_header(j - i, [o - base for o in offs[i:j + 1]], now_ms) + mv[base:offs[j]])
        i = j
    return out


def _record_column_names(opts: WriteOptions) -> list[str]:
    return [c for c in (COL_KEY, COL_TIMESTAMP, COL_HEADERS) if c in opts.columns]


def pack_records(batch: pa.RecordBatch, value: pa.Array, opts: WriteOptions, now_ms: int | None = None) -> list[bytes]:
    """Rows with a key, timestamp or headers column as ``records-v1`` entries, in row order,
    cut like :func:`pack_column` (``entryMaxRows``, ``entryMaxBytes`` counted with
    :func:`vellum.format.records.record_size`). Bad cells are errors naming the column."""
    n = batch.num_rows
    cols = {c: batch.column(batch.schema.get_field_index(c)) for c in _record_column_names(opts)}
    values = value.to_pylist()
    keys: list[bytes | None] = [None] * n
    if COL_KEY in cols:
        k = cols[COL_KEY]
        keys = (k if pa.types.is_binary(k.type) else k.cast(pa.binary())).to_pylist()
    stamps: list[int | None] = [None] * n
    if COL_TIMESTAMP in cols:
        us = cols[COL_TIMESTAMP].cast(pa.int64()).to_pylist()
        stamps = [None if t is None else t // 1000 for t in us]
        bad = next((t for t in stamps if t is not None and t < 0), None)
        if bad is not None:
            raise ValueError(f"[VELLUM_WRITE] column timestamp: {bad} ms is before 1970-01-01 (record "
                             "timestamps are milliseconds since the Unix epoch, >= 0); null means none")
    headers: list[tuple[tuple[str, bytes], ...]] = [()] * n
    if COL_HEADERS in cols:
        raw = cols[COL_HEADERS].to_pylist()
        headers = []
        for row in raw:
            hs = []
            for h in row or ():
                if h is None or h["key"] is None or h["value"] is None:
                    raise ValueError(f"[VELLUM_WRITE] column headers: a header, its key or its value is null "
                                     f"({h!r}); every header needs a key and a value (binary)")
                v = h["value"]
                hs.append((h["key"], v.encode() if isinstance(v, str) else bytes(v)))
            headers.append(tuple(hs))
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    out: list[bytes] = []
    cur: list[Record] = []
    cur_bytes = 0
    for i in range(n):
        rec = Record(values[i], keys[i], stamps[i], headers[i])
        size = record_size(len(rec.value), None if rec.key is None else len(rec.key), rec.headers)
        if cur and (len(cur) >= opts.entry_max_rows or cur_bytes + size > opts.entry_max_bytes):
            out.append(encode_records(cur, now_ms))
            cur, cur_bytes = [], 0
        cur.append(rec)
        cur_bytes += size
    if cur:
        out.append(encode_records(cur, now_ms))
    return out


def _route(batch: pa.RecordBatch, opts: WriteOptions) -> list[tuple[str, pa.RecordBatch]]:
    """``(name, rows)`` of a batch: all of it to the ``name`` option, or, with a ``name`` column
    (and no option), the rows of each name in the order they came (order kept within a name)."""
    if not opts.name_from_column:
        return [(opts.name, batch)]
    col = batch.column(batch.schema.get_field_index(COL_NAME))
    if col.null_count:
        raise ValueError(f"[VELLUM_WRITE] column name is null in {col.null_count} row(s): every row needs the "
                         "named ledger to go to (or set the option name for all rows)")
    names = pc.unique(col).to_pylist()
    if len(names) == 1:
        return [(names[0], batch)]
    return [(n, batch.filter(pc.equal(col, n))) for n in names]


@contextlib.contextmanager
def heap_frozen() -> Iterator[None]:
    """Freeze what the process holds out of the cyclic garbage collector for the block, and
    unfreeze it after (however the block ends). Left alone if something else froze objects
    already (its freeze is not ours to undo)."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


#: net allocations of tracked objects between young-generation collections while a task writes
_YOUNG_COLLECTION_OBJECTS = 20_000


@contextlib.contextmanager
def young_collections_spaced() -> Iterator[None]:
    """Collect the young generation every ``_YOUNG_COLLECTION_OBJECTS`` net allocations (at
    least) for the block, then restore the thresholds as they were (however the block ends)."""
    old = gc.get_threshold()
    gc.set_threshold(max(old[0], _YOUNG_COLLECTION_OBJECTS), *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)


def write_task(opts: WriteOptions, job: str, batches: Iterator[pa.RecordBatch],
               query_id: str | None = None, batch_id: int | None = None) -> VellumCommit:
    """Write one task attempt's rows into new staging ledgers, one per name its rows go to
    (executor side), with the worker's heap frozen out of the garbage collector and its young
    collections spaced out meanwhile (see the module docstring)."""
    with heap_frozen(), young_collections_spaced():
        return _write_task(opts, job, batches, query_id, batch_id)


def _write_task(opts: WriteOptions, job: str, batches: Iterator[pa.RecordBatch],
                query_id: str | None, batch_id: int | None) -> VellumCommit:
    ctx = TaskContext.get()
    partition = ctx.partitionId() if ctx is not None else 0
    attempt = ctx.attemptNumber() if ctx is not None else 0
    bk = shared_client(opts.metadata_uri, opts.client_properties)
    handles: dict[str, BlockingLedgerHandle] = {}
    # Append times of each staging ledger's records-v1 entries: never decreasing within a ledger
    # (a clock stepping back repeats the last time), which offsets by time rely on
    # (vellum.spark.timeseek); their range goes into the segment when published.
    times: dict[str, tuple[int, int]] = {}
    appenders: dict[str, _Appender] = {}
    rows = nbytes = 0
    try:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            for name, part in _route(batch, opts):
                handle = handles.get(name)
                if handle is None:
                    handle = handles[name] = _staging_ledger(bk, opts, name, job, partition, attempt)
                column = _value_column(part, opts.value_column)
                if _record_column_names(opts) or opts.packed:
                    lo, hi = times.get(name, (-1, -1))
                    now_ms = max(hi, int(time.time() * 1000))
                    times[name] = (now_ms if lo < 0 else lo, now_ms)
                if _record_column_names(opts):
                    entries = pack_records(part, column, opts, now_ms)
                    window = max(1, min(opts.max_in_flight, _PACKED_IN_FLIGHT_BYTES // opts.entry_max_bytes))
                elif opts.packed:
                    entries = pack_column(column, opts.entry_max_rows, opts.entry_max_bytes, now_ms)
                    window = max(1, min(opts.max_in_flight, _PACKED_IN_FLIGHT_BYTES // opts.entry_max_bytes))
                else:
                    entries = column.to_pylist()
                    window = opts.max_in_flight
                appender = appenders.get(name)
                if appender is None:
                    appender = appenders[name] = _Appender(bk, handle.aio, window)
                # Handed over, not awaited: the adds of this Arrow batch are in flight while the
                # next one is read from Spark and packed (the appender bounds what is queued).
                appender.add(entries)
                rows += len(column)
                if len(column):
                    offs = _offsets(column)
                    nbytes += offs[-1] - offs[0]  # the rows' bytes, without listing every offset
        for appender in appenders.values():
            appender.finish()  # every add acknowledged (or the task fails here)
        for handle in handles.values():
            handle.close()
        ranges = tuple((h.ledger_id, *times[n]) for n, h in handles.items() if n in times)
        if not opts.name_from_column:
            lid = handles[opts.name].ledger_id if handles else -1
            return VellumCommit(job, partition, attempt, lid, rows, nbytes, query_id, batch_id, time_ranges=ranges)
        return VellumCommit(job, partition, attempt, -1, rows, nbytes, query_id, batch_id,
                            tuple((n, h.ledger_id) for n, h in handles.items()), ranges)
    except BaseException:
        for appender in appenders.values():
            appender.abandon()
        for handle in handles.values():
            _drop_failed_staging(bk, handle.ledger_id)
        raise


def _drop_failed_staging(bk: BookKeeper, ledger_id: int) -> None:
    """Delete a failed task's staging ledger, best effort: commit/abort (or staging-gc) sweeps
    its registration anyway."""
    try:
        bk.delete_ledger(ledger_id)
    except Exception as exc:
        log.warning("staging ledger %d of failed task: delete failed (%s); left for cleanup", ledger_id, exc)


def _staging_ledger(bk: BookKeeper, opts: WriteOptions, name: str, job: str, partition: int,
                    attempt: int) -> BlockingLedgerHandle:
    """Create and register this attempt's staging ledger for ``name`` (with the name's digest
    and quorums: a name met in the ``name`` column is resolved here, on first sight)."""
    if opts.name_from_column:
        from vellum.client.named import validate_name
        from vellum.spark.names import resolve_write_settings

        try:
            validate_name(name)
        except ValueError as exc:
            raise ValueError(f"[VELLUM_WRITE] column name: {name!r} is not a valid name ({exc})") from None
        opts = resolve_write_settings(bk, dataclasses.replace(opts, name=name))
    handle = bk.create_ledger(
        ensemble_size=opts.ensemble_size, write_quorum_size=opts.write_quorum_size,
        ack_quorum_size=opts.ack_quorum_size, digest_type=opts.digest_type,
        password=opts.password,
        custom_metadata=_staging_metadata(opts, name, job, partition, attempt),
    )
    try:
        _register_staging(bk, job, partition, attempt, handle.ledger_id)
        if bk.aio.store.kv.get(f"{FINISHED_PREFIX}{job}") is not None:
            # The driver committed or aborted this job already (this attempt is late): undo the
            # registration ourselves; the caller's except deletes the ledger.
            bk.aio.store.kv.delete(_registration_key(job, partition, attempt, handle.ledger_id))
            raise RuntimeError(f"[VELLUM_WRITE] job {job} already finished; task attempt dropped")
    except BaseException:
        _drop_failed_staging(bk, handle.ledger_id)
        raise
    return handle


def _staging_metadata(opts: WriteOptions, name: str, job: str, partition: int, attempt: int) -> dict[str, bytes]:
    md = {TAG_JOB: job.encode(), "vellum.spark.name": name.encode(),
          "vellum.spark.partition": str(partition).encode(), "vellum.spark.attempt": str(attempt).encode()}
    if opts.packed or _record_column_names(opts):
        md[ENTRY_FORMAT_KEY] = RECORDS_V1  # readers decode every entry of this ledger into records
    return md


class _Appender:
    """Appends one task's entries to its staging ledger in order, pipelined across Arrow batches.

    ``add`` hands a batch's entries to the client's loop and returns at once, so the task reads
    and packs the next Arrow batch while these adds are in flight; ``finish`` waits until every
    add is acknowledged (the ack quorum's fsync: nothing is weaker than awaiting each batch).
    Order: the batches' coroutines start in submission order and issue their adds under one
    FIFO ``asyncio.Lock``, so entry ids follow the rows. The adds go in slices of about a
    quarter of the window, each one ``append_batch_async`` call with one future (per entry, a
    future and an await cost the task's loop more than the rest of the client's append path).
    Bounds: at most ``window`` adds outstanding (option ``maxInFlight``; the handle also rides
    out bookie back-pressure), and at most ``_HANDED_BATCHES`` batches handed over whose adds
    are not all issued yet (memory).
    """

    _HANDED_BATCHES = 2

    def __init__(self, bk: BookKeeper, handle: AsyncLedgerHandle, window: int) -> None:
        self._bk = bk
        self._handle = handle
        self._window = window
        self._lock = asyncio.Lock()  # binds to the client's loop on first use
        self._slice = max(1, window // _SLICES_IN_FLIGHT)
        # loop-owned: (future, adds) of each slice issued and not yet awaited, and their adds
        self._pending: collections.deque[tuple[asyncio.Future[int], int]] = collections.deque()
        self._outstanding = 0
        self._handed: collections.deque[concurrent.futures.Future[None]] = collections.deque()
        self._failed: BaseException | None = None  # loop-owned: the first failed add

    def add(self, entries: list[bytes]) -> None:
        while len(self._handed) >= self._HANDED_BATCHES:
            self._handed.popleft().result()  # raises the first failed add's error
        self._handed.append(self._bk.submit(self._issue(entries)))

    def finish(self) -> None:
        while self._handed:
            self._handed.popleft().result()
        self._bk.run(self._drain())

    def abandon(self) -> None:
        """The task failed: stop waiting (the staging ledger is dropped by the caller)."""
        for cf in self._handed:
            cf.cancel()
        self._handed.clear()

    async def _issue(self, entries: list[bytes]) -> None:
        async with self._lock:
            step, window = self._slice, self._window
            for start in range(0, len(entries), step):
                part = entries[start:start + step]
                while self._pending and self._outstanding + len(part) > window:
                    await self._ack_oldest()
                if self._failed is not None:
                    raise self._failed
                self._pending.append((self._handle.append_batch_async(part), len(part)))
                self._outstanding += len(part)

    async def _drain(self) -> None:
        async with self._lock:
            while self._pending:
                await self._ack_oldest()

    async def _ack_oldest(self) -> None:
        fut, adds = self._pending.popleft()
        self._outstanding -= adds
        try:
            await fut
        except BaseException as exc:
            self._failed = self._failed or exc
            for f, _adds in self._pending:
                if f.done() and not f.cancelled():
                    f.exception()  # retrieved: a failed handle fails every pending add alike
            raise


def _register_staging(bk: BookKeeper, job: str, partition: int, attempt: int, ledger_id: int) -> None:
    key = _registration_key(job, partition, attempt, ledger_id)
    bk.aio.store.kv.create(key, json.dumps({"ledgerId": ledger_id, "ctimeMs": int(time.time() * 1000)}).encode())


@dataclass(frozen=True)
class StagingCleanup:
    """What :func:`cleanup_staging` did with a job's staging ledgers."""

    deleted: int  # unpublished staging ledgers deleted
    published: int  # registrations dropped because a named ledger references their ledger (kept)


def _registration_key(job: str, partition: int, attempt: int, ledger_id: int) -> str:
    return f"{STAGING_PREFIX}{job}/{partition}.{attempt}.{ledger_id}"


def _registered_ledger(key: str) -> int:
    """The ledger id a registration key ends with (-1 if the key is not one of ours)."""
    try:
        return int(key.rsplit(".", 1)[1])
    except (IndexError, ValueError):
        return -1


def _forget_published(bk: BookKeeper, job: str, msgs: Sequence[VellumCommit], published: set[int]) -> None:
    """Remove the registrations of the ledgers the CAS just published: they are segments now.

    Keys come from the commit messages (no listing), so this is the first thing after the CAS;
    a driver killed before it finishes leaves registrations of published ledgers, which
    :func:`cleanup_staging` recognises from the name records and never deletes.
    """
    kv = bk.aio.store.kv
    for m in msgs:
        for lid in m.ledger_ids():
            if lid in published:
                kv.delete(_registration_key(job, m.partition_id, m.attempt, lid))


def cleanup_staging(bk: BookKeeper, job: str, keep: set[int], *, also: Sequence[int] = ()) -> StagingCleanup:
    """Delete the job's staging ledgers (registered ones and ``also``) that are not in ``keep``
    and that no named ledger references, then drop every registration of the job.

    ``keep``: ledgers the caller has just published. Whatever the caller believes, a ledger some
    name's segments reference is never deleted: the records are read fresh right before the
    deletions, and if they cannot all be read (``NameScanError``) nothing is deleted and the
    registrations stay for a later run. Idempotent (a retried commit or abort finds less).
    """
    from vellum.spark.names import referenced_ledgers

    kv = bk.aio.store.kv
    finished = f"{FINISHED_PREFIX}{job}"
    if kv.get(finished) is None:
        try:
            kv.create(finished, str(int(time.time() * 1000)).encode())
        except MetadataVersionError:
            pass  # a concurrent commit/abort of the same job wrote it
    keys = kv.list(f"{STAGING_PREFIX}{job}/")
    registered = {key: _registered_ledger(key) for key in keys}
    candidates = sorted({lid for lid in (*registered.values(), *also) if lid >= 0 and lid not in keep})
    referenced = referenced_ledgers(bk) if candidates else frozenset()
    deleted = published = 0
    for lid in candidates:
        if lid in referenced:
            published += 1
            log.info("staging ledger %d of job %s is a segment of a named ledger: kept, only its "
                     "registration is dropped", lid, job)
        else:
            bk.delete_ledger(lid)
            deleted += 1
    published += sum(1 for lid in registered.values() if lid in keep)
    for key in keys:
        kv.delete(key)
    return StagingCleanup(deleted, published)


def sweep_finished_markers(bk: BookKeeper, older_than_ms: float) -> int:
    """Delete ``spark/finished/<job>`` markers older than ``older_than_ms`` (late task attempts
    of such old jobs are long gone). Returns how many were deleted."""
    kv = bk.aio.store.kv
    now_ms = time.time() * 1000
    swept = 0
    for key in kv.list(FINISHED_PREFIX):
        got = kv.get(key)
        try:
            written = float(got.value) if got is not None else 0.0
        except ValueError:
            written = 0.0
        if now_ms - written >= older_than_ms and kv.delete(key):
            swept += 1
    return swept


def list_staging_jobs(bk: BookKeeper) -> dict[str, list[tuple[str, int, int]]]:
    """``{job: [(key, ledger id, ctime ms)]}`` of every registered staging ledger (for staging-gc)."""
    kv = bk.aio.store.kv
    out: dict[str, list[tuple[str, int, int]]] = {}
    for key in kv.list(STAGING_PREFIX):
        job = key[len(STAGING_PREFIX):].split("/", 1)[0]
        got = kv.get(key)
        ctime = 0
        lid = -1
        if got is not None:
            try:
                info = json.loads(got.value)
                lid, ctime = int(info["ledgerId"]), int(info["ctimeMs"])
            except (ValueError, KeyError):
                pass
        out.setdefault(job, []).append((key, lid, ctime))
    return out


def _published(messages: Sequence[WriterCommitMessage | None]) -> list[VellumCommit]:
    msgs = [m for m in messages if isinstance(m, VellumCommit)]
    return sorted(msgs, key=lambda m: m.partition_id)


def _target(opts: WriteOptions) -> str:
    """What the sink writes into, for log lines."""
    return repr(opts.name) if not opts.name_from_column else "(the names of the 'name' column)"


def _by_name(opts: WriteOptions, msgs: Sequence[VellumCommit]) -> dict[str, list[int]]:
    """The staging ledgers to publish into each name, in partition order (``msgs`` are sorted)."""
    out: dict[str, list[int]] = {} if opts.name_from_column else {opts.name: []}
    for m in msgs:
        for name, lid in m.segments:
            out.setdefault(name, []).append(lid)
        if m.ledger_id >= 0:
            out.setdefault(opts.name, []).append(m.ledger_id)
    return out


def commit_job(opts: WriteOptions, job: str, messages: Sequence[WriterCommitMessage | None], *,
               overwrite: bool, cursor: tuple[str, int] | None = None) -> bool:
    """Publish the job's staging ledgers by one CAS per name; False if the cursor says it is a
    replay for every name (a name whose cursor is already at the batch is left untouched).

    With a ``name`` column a job publishes into several names: each name's publish is atomic
    and exactly-once (the stream cursor lives in each name's record), the set of names is not
    (a driver that dies between two CASes leaves the first name published; a stream's replay
    then publishes only the others).
    """
    from vellum.spark.names import NameWriter

    msgs = _published(messages)
    published: set[int] = set()
    any_done = False
    time_ranges = {lid: (lo, hi) for m in msgs for lid, lo, hi in m.time_ranges}
    with client(opts.metadata_uri, opts.client_properties) as bk:
        for name, ids in sorted(_by_name(opts, msgs).items()):
            writer = NameWriter(bk, dataclasses.replace(opts, name=name))
            for attempt in range(20):
                try:
                    done = writer.publish(ids, overwrite=overwrite, cursor=cursor,
                                          time_ranges={i: time_ranges[i] for i in ids if i in time_ranges})
                    break
                except MetadataVersionError:
                    # Another writer changed the record between our read and CAS: re-read and retry.
                    time.sleep(min(1.0, 0.02 * 2 ** attempt))
            else:
                raise RuntimeError(f"[VELLUM_WRITE] could not publish into {name!r}: the name record kept "
                                   "changing (20 compare-and-set conflicts)")
            if done:
                published.update(ids)
                any_done = True
        # The CAS was the commit: an error from here on must not fail the job (Spark would abort
        # it, or a batch job be re-run, while its data is already visible). What is left behind
        # is safe for staging-gc, which never deletes a ledger a name references.
        try:
            _forget_published(bk, job, msgs, published)
            cleanup_staging(bk, job, published)
        except Exception as exc:
            log.warning("vellum sink %s: job %s is %s, but cleaning its staging up failed (%s); "
                        "run `vellum spark staging-gc` to remove what is left", _target(opts), job,
                        "committed" if any_done else "a replay (skipped)", exc)
        return any_done


def abort_job(opts: WriteOptions, job: str, messages: Sequence[WriterCommitMessage | None]) -> None:
    with client(opts.metadata_uri, opts.client_properties) as bk:
        # The messages' ledgers too (usually registered as well): a commit whose CAS was applied
        # but reported an error ends here, and cleanup_staging keeps what a name references.
        cleanup_staging(bk, job, set(), also=[lid for m in _published(messages) for lid in m.ledger_ids()])


class VellumBatchWriter(DataSourceArrowWriter):  # type: ignore[misc]
    """``df.write.format("vellum").mode("append"|"overwrite").save(name)``."""

    def __init__(self, opts: WriteOptions, overwrite: bool) -> None:
        self.opts = opts
        self.overwrite = overwrite
        # Created in the planner; every pickled copy (tasks, commit) shares it.
        self.job = f"b-{uuid.uuid4().hex}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> VellumCommit:
        return write_task(self.opts, self.job, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        commit_job(self.opts, self.job, messages, overwrite=self.overwrite)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        abort_job(self.opts, self.job, messages)


def _stream_ids() -> tuple[str, int]:
    ctx = TaskContext.get()
    query_id = ctx.getLocalProperty("sql.streaming.queryId") if ctx is not None else None
    batch_id = ctx.getLocalProperty("streaming.sql.batchId") if ctx is not None else None
    if not query_id or batch_id is None:
        raise RuntimeError("[VELLUM_WRITE] streaming write outside a streaming query (no query/batch id)")
    return query_id, int(batch_id)


def cursor_key(query_id: str) -> str:
    return f"spark.sink.{query_id}"


class VellumStreamWriter(DataSourceStreamArrowWriter):  # type: ignore[misc]
    """``df.writeStream.format("vellum")``: one CAS per micro-batch, replays skipped by batch id."""

    def __init__(self, opts: WriteOptions, overwrite: bool) -> None:
        self.opts = opts
        self.overwrite = overwrite
        # One token per run of the query (a restart gets a new writer): a batch replayed after
        # a restart is a new staging job, not the finished one (see FINISHED_PREFIX).
        self.run_token = uuid.uuid4().hex[:8]

    def write(self, iterator: Iterator[pa.RecordBatch]) -> VellumCommit:
        query_id, batch_id = _stream_ids()
        job = f"s-{query_id}.{batch_id}.{self.run_token}"
        return write_task(self.opts, job, iterator, query_id, batch_id)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        msgs = _published(messages)
        if not msgs:
            return  # no task reported: nothing was staged that a commit could name
        query_id = msgs[0].query_id
        assert query_id is not None
        done = commit_job(self.opts, msgs[0].job, messages, overwrite=self.overwrite,
                          cursor=(cursor_key(query_id), batchId))
        if not done:
            log.info("vellum sink %s: batch %d of query %s was committed before: replay skipped",
                     _target(self.opts), batchId, query_id)
        # Bounded for a year of micro-batches: merge small segments, retire what they replaced
        # (docs/spark.md "A sink that runs for a year"), in every name this batch wrote into;
        # never fails the committed batch.
        from vellum.spark.merge import keep_bounded

        bk = shared_client(self.opts.metadata_uri, self.opts.client_properties)
        for name in _by_name(self.opts, msgs):
            keep_bounded(bk, self.opts if name == self.opts.name else dataclasses.replace(self.opts, name=name))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        msgs = _published(messages)
        if msgs:
            abort_job(self.opts, msgs[0].job, messages)
