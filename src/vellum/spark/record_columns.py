"""Arrow columns of the source's rows: packed (``rows-v1``) and ``records-v1`` entries decoded
into the value, key, timestamp, timestampType and headers columns.

Responsibility: ``unpack`` turns a run of entries' payloads into its rows' global entry ids,
batch indexes and ``RecordColumns``: a whole run at once through ``packed_arrow`` when it can,
else entry by entry, each entry's little-endian sections becoming Arrow arrays without copying a
row (Arrow validates every offset in C). Invariant: both paths give the same rows, and a bad
entry fails with a ``CorruptionError`` naming the ledger and entry either way (the batch path
falls back to the entry path on any check it cannot pass). No I/O.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from vellum.errors import CorruptionError
from vellum.format.entry import BytesLike
from vellum.format.records import RecordsView, decode, decode_records
from vellum.spark.packed_arrow import ONE32, ZERO32, arange, decode_values

#: packed entries store little-endian offsets; Arrow takes them as they are only on such hosts
_BIG_ENDIAN = sys.byteorder == "big"
#: milliseconds to Spark's microseconds (a bound scalar: see packed_arrow.ZERO32)
_MS_TO_US = pa.scalar(1000, pa.int64())


@dataclass
class RecordColumns:
    """The record columns of a run of rows (None: null for every row): ``value`` (also the
    ``payload`` alias), and for ``records-v1`` entries ``key``, ``timestamp`` (Spark's
    microseconds, UTC), ``timestampType`` (0 event time given by the writer, 1 append time) and
    ``headers`` (Kafka's ``array<struct<key, value>>``, null for a record without headers)."""

    value: Sequence[BytesLike] | pa.Array | None
    key: pa.Array | None = None
    timestamp: pa.Array | None = None
    timestamp_type: pa.Array | None = None
    headers: pa.Array | None = None


#: Kafka's header shape: array<struct<key: string, value: binary>>
HEADER_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))


def _binary(type_: pa.DataType, n: int, validity: memoryview | None, offsets: memoryview, data: memoryview,
            where: str, what: str) -> pa.Array:
    """A binary/string Arrow array straight from a packed entry's little-endian section (no row
    copied); Arrow's full validation checks the offsets (and UTF-8 of strings) in C."""
    if _BIG_ENDIAN:
        offs = [int.from_bytes(offsets[4 * i:4 * i + 4], "little") for i in range(n + 1)]
        offsets = memoryview(pa.array(offs, pa.int32()).buffers()[1])
    arr = pa.Array.from_buffers(type_, n, [None if validity is None else pa.py_buffer(validity),
                                           pa.py_buffer(offsets), pa.py_buffer(data)])
    try:
        arr.validate(full=True)
    except pa.ArrowInvalid as exc:
        raise CorruptionError(f"{where}: packed entry {what} are invalid ({exc})") from None
    return arr


def _record_columns(view: RecordsView, where: str) -> RecordColumns:
    """Arrow columns of one records-v1 entry."""
    n = view.count
    value = _binary(pa.binary(), n, None, view.value_offsets, view.values, where, "value offsets")
    key = None
    if view.key_offsets is not None and view.keys is not None:
        key = _binary(pa.binary(), n, view.key_validity, view.key_offsets, view.keys, where, "key offsets")
    append_us = pa.scalar(view.append_timestamp * 1000, pa.int64())
    if view.timestamps is not None and view.ts_validity is not None:
        # copied (n * 8 bytes): an entry's sections are not 8-byte aligned
        event = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(bytes(view.timestamps))])
        if _BIG_ENDIAN:
            event = pa.array([int.from_bytes(view.timestamps[8 * i:8 * i + 8], "little", signed=True)
                              for i in range(n)], pa.int64())
        given = pa.Array.from_buffers(pa.bool_(), n, [None, pa.py_buffer(bytes(view.ts_validity))])
        try:
            micros = pc.if_else(given, pc.multiply_checked(event, _MS_TO_US), append_us)
        except pa.ArrowInvalid:
            raise CorruptionError(f"{where}: a record timestamp is beyond what Spark can represent "
                                  "(year 9999)") from None
        ts_type = pc.if_else(given, ZERO32, ONE32)
    else:
        micros = pa.repeat(append_us, n)
        ts_type = pa.repeat(ONE32, n)
    headers = None
    if view.header_offsets is not None:
        assert view.header_name_offsets is not None and view.header_names is not None
        assert view.header_value_offsets is not None and view.header_values is not None
        h = view.header_count
        names = _binary(pa.string(), h, None, view.header_name_offsets, view.header_names, where, "header names")
        values = _binary(pa.binary(), h, None, view.header_value_offsets, view.header_values, where,
                         "header values")
        offs = pa.array([int.from_bytes(view.header_offsets[4 * i:4 * i + 4], "little") for i in range(n + 1)],
                        pa.int32())
        empty = pc.equal(pc.subtract(offs.slice(1), offs.slice(0, n)), ZERO32)  # Kafka: no headers -> null
        try:
            headers = pa.ListArray.from_arrays(offs, pa.StructArray.from_arrays([names, values], ["key", "value"]),
                                               type=HEADER_TYPE, mask=empty)
            headers.validate(full=True)
        except (pa.ArrowInvalid, ValueError) as exc:
            raise CorruptionError(f"{where}: packed entry header offsets are invalid ({exc})") from None
    return RecordColumns(value, key, micros.cast(pa.timestamp("us", tz="UTC")), ts_type, headers)


def global_ids(ids: Sequence[int], base: int) -> pa.Array:
    """The global entry ids (int64) of ledger entries ``ids`` of a segment starting at ``base``."""
    if isinstance(ids, range):
        return arange(ids.start + base, len(ids), step=ids.step)
    return pc.add(pa.array(ids, pa.int64()), pa.scalar(base, pa.int64()))


def unpack(ledger_id: int, base: int, entry_ids: Sequence[int], payloads: Sequence[BytesLike],
           records: bool) -> tuple[list[int] | pa.Array, list[int] | pa.Array, RecordColumns]:
    """Rows of packed entries (``rows-v1``, or ``records-v1`` when ``records``): the ledger
    entries ``entry_ids`` of ledger ``ledger_id`` (global ids start at ``base``) whose payloads
    are ``payloads``; their rows' global entry ids, batch
    indexes and columns.

    Entries without headers are decoded together (``vellum.spark.packed_arrow``: a few Arrow
    calls per batch, not per entry); a run with headers, or one that fails a check there, entry
    by entry: each entry's offsets and data become Arrow arrays without copying a row (the
    format is little-endian like Arrow); Arrow's full validation checks every offset in C; an
    error names the entry.
    """
    fast = decode_values(payloads, records)
    if fast is not None:
        one_row_each = fast.rows == len(payloads)  # then row i is entry i: no take
        ids = global_ids(entry_ids, base)
        if not one_row_each:
            ids = pc.take(ids, fast.entry_index)
        if fast.append_ms is None:
            return ids, fast.batch_index, RecordColumns(fast.value)
        try:
            micros = pc.multiply_checked(fast.append_ms, _MS_TO_US)
            if not one_row_each:
                micros = pc.take(micros, fast.entry_index)
            ts_type = pa.repeat(ONE32, fast.rows)
            if fast.event_ms is not None and fast.given is not None:
                micros = pc.if_else(fast.given, pc.multiply_checked(fast.event_ms, _MS_TO_US), micros)
                ts_type = pc.if_else(fast.given, ZERO32, ONE32)
        except pa.ArrowInvalid:
            pass  # a timestamp beyond int64 microseconds: the entry-by-entry path names the entry
        else:
            return ids, fast.batch_index, RecordColumns(
                fast.value, fast.key, micros.cast(pa.timestamp("us", tz="UTC")), ts_type)
    id_list: list[int] = []
    index: list[int] = []
    parts: list[RecordColumns] = []
    for entry_id, payload in zip(entry_ids, payloads, strict=True):
        where = f"ledger {ledger_id} entry {entry_id}"
        if records:
            rview = decode_records(memoryview(payload), where=where, check_offsets=False)
            parts.append(_record_columns(rview, where))
            count = rview.count
        else:
            view = decode(memoryview(payload), where=where, check_offsets=_BIG_ENDIAN)
            parts.append(RecordColumns(_binary(pa.binary(), view.count, None, view.offsets_raw, view.data, where,
                                               "offsets")))
            count = view.count
        id_list.extend([entry_id + base] * count)
        index.extend(range(count))
    return id_list, index, _concat(parts, len(id_list))


def _concat(parts: list[RecordColumns], n: int) -> RecordColumns:
    """One RecordColumns of consecutive runs; a column absent from every run stays None."""

    def join(arrays: list[pa.Array | None], counts: list[int], type_: pa.DataType) -> pa.Array | None:
        if all(a is None for a in arrays):
            return None
        return pa.concat_arrays([pa.nulls(c, type_) if a is None else a for a, c in zip(arrays, counts, strict=True)])

    counts = [len(p.value) if p.value is not None else 0 for p in parts]
    value = join([p.value for p in parts], counts, pa.binary()) if parts else pa.array([], pa.binary())  # type: ignore[misc]
    return RecordColumns(
        value if value is not None else pa.nulls(n, pa.binary()),
        join([p.key for p in parts], counts, pa.binary()),
        join([p.timestamp for p in parts], counts, pa.timestamp("us", tz="UTC")),
        join([p.timestamp_type for p in parts], counts, pa.int32()),
        join([p.headers for p in parts], counts, HEADER_TYPE),
    )
