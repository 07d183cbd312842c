"""Arrow columns of a whole run of packed entries in one pass (the Spark read path's fast path).

Responsibility: turn the payloads of consecutive entries of a packed ledger (``rows-v1``, or
``records-v1`` entries without a header section: what the Spark sink and producers write unless
records carry headers) into the value and key columns, the per-row entry ids and batch indexes,
the append and event timestamps, with a constant number of Arrow calls per batch. Per entry only
its fixed header (and validity bits) is unpacked and its offsets appended to one array; the
rows' bytes are copied once, by ``bytes.join``. A run of one-row entries read where they lie in
the bookies' answers (what a producer writes) costs no Python work per entry at all: Arrow cuts
each entry's fixed header from its row (``cut_spans``) and the headers are checked as columns.
Byte layouts: ``vellum.format.records``. Plain entries' payloads become one binary column the
same way (``binary_column``).

Invariants:
- the same rows and the same checks as decoding each entry alone: every entry's magic, count,
  flags, section sizes, first and last offsets are checked here, and the offsets' order by
  Arrow's full validation of the result; an entry that fails any check, or that has a section
  this fast path does not build, makes :func:`decode_values` return None, and the caller decodes
  the batch entry by entry (which names the entry and what is wrong in its error);
- little-endian hosts only (the offsets are appended as stored): elsewhere it returns None.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate

import pyarrow as pa
import pyarrow.compute as pc

from vellum.format.entry import BytesLike, PayloadSpans
from vellum.format.records import (
    FLAG_KEYS,
    FLAG_TIMESTAMPS,
    HEADER_SIZE,
    MAGIC,
    RECORDS_HEADER_SIZE,
    RECORDS_MAGIC,
)

_LITTLE = sys.byteorder == "little"
_ROWS_HEAD = struct.Struct("<4sI")
_RECORDS_HEAD = struct.Struct("<4sIIq")
_ROWS_HEAD_2 = struct.Struct(_ROWS_HEAD.format + "II")  # and the first two offsets
_RECORDS_HEAD_2 = struct.Struct(_RECORDS_HEAD.format + "II")
_last_offset = struct.Struct("<I").unpack_from
_first_last = struct.Struct("<II").unpack_from
# Scalars bound once: a Python int handed to a pyarrow.compute function is converted on every
# call, and without pandas installed that conversion retries ``import pandas`` each time (~40 us,
# more than the rest of a batch's Arrow calls together).
ZERO32 = pa.scalar(0, pa.int32())
ONE32 = pa.scalar(1, pa.int32())
_INT64 = pa.int64()


def arange(start: int, n: int, type_: pa.DataType = _INT64, step: int = 1) -> pa.Array:
    """``start, start + step, ...`` (``n`` values) of ``type_``, built in C (``pa.array`` of a
    range makes a Python int per value)."""
    return pc.cumulative_sum(pa.repeat(pa.scalar(step, type_), n), start=pa.scalar(start - step, type_))


@dataclass(frozen=True)
class PackedColumns:
    """Rows of a run of packed entries: ``entry_index[i]`` is the position (in the run) of
    row i's entry, ``batch_index[i]`` its index inside that entry; ``append_ms`` one value per
    entry (records) or None (rows); ``key`` (null where a record has none) and ``event_ms``
    with ``given`` (whether a record has an event timestamp) are None when no entry has them."""

    rows: int
    value: pa.Array
    entry_index: pa.Array
    batch_index: pa.Array
    append_ms: pa.Array | None
    key: pa.Array | None = None
    event_ms: pa.Array | None = None
    given: pa.Array | None = None


def _bits(bitmap: memoryview, n: int) -> bytes:
    """``n`` validity bits (least significant first) as one 0/1 byte each."""
    if n == 1:
        return b"\x01" if bitmap[0] & 1 else b"\x00"
    v = int.from_bytes(bitmap, "little")
    return bytes((v >> i) & 1 for i in range(n))


def _validity(flags: array[int], n_rows: int) -> pa.Buffer:
    """Arrow validity bitmap of 0/1 bytes."""
    return pc.cast(pa.Array.from_buffers(pa.int8(), n_rows, [None, pa.py_buffer(flags)]), pa.bool_()).buffers()[1]


def decode_values(payloads: Sequence[BytesLike], records: bool) -> PackedColumns | None:
    """The rows of ``payloads`` (each one packed entry), or None if any entry is not a valid
    entry of the format or has a header section (then decode them one by one)."""
    if not _LITTLE or not payloads:
        return None
    if isinstance(payloads, PayloadSpans):
        fast = _decode_single_rows(payloads, records)
        if fast is None:
            fast = _decode_bare_spans(payloads, records)
        if fast is not None:
            return fast
        # not all bare values (or a check failed): the general pass below, entry by entry views
    unpack_head = (_RECORDS_HEAD if records else _ROWS_HEAD).unpack_from
    hsize = RECORDS_HEADER_SIZE if records else HEADER_SIZE
    magic = RECORDS_MAGIC if records else MAGIC
    # Per entry: its row count, its sections' sizes and its offsets but the last (an entry's
    # first offset is 0 and its last its section's size: both checked here) appended as stored.
    # The key and timestamp sections are filled only once some entry has one (the rows before
    # it get zeros then): bare values, what producers and the sink write, cost no work for them.
    offs, koffs = array("I"), array("I")
    counts, sizes, ksizes = array("q"), array("q"), array("q")
    stamps, event = array("q"), array("q")
    kvalid, tvalid = array("b"), array("b")
    chunks: list[memoryview] = []
    kchunks: list[memoryview] = []
    any_keys = any_ts = False
    add_offsets, add_count, add_size, add_ksize = offs.frombytes, counts.append, sizes.append, ksizes.append
    add_chunk, add_stamp = chunks.append, stamps.append
    keyed = FLAG_KEYS | FLAG_TIMESTAMPS
    try:
        for p in payloads:
            fields = unpack_head(p)
            n = fields[1]
            if fields[0] != magic or n < 1:
                return None
            flags = 0
            if records:
                flags = fields[2]
                if flags & ~keyed:  # headers (or a newer format): entry by entry
                    return None
                add_stamp(fields[3])
            mv = p if type(p) is memoryview else memoryview(p)
            size = len(mv)
            data = hsize + 4 * (n + 1)
            if not flags:  # bare values
                if data > size:
                    return None
                first_off, vsize = _first_last(mv, hsize) if n == 1 else (_last_offset(mv, hsize)[0],
                                                                           _last_offset(mv, data - 4)[0])
                if first_off != 0 or data + vsize != size:
                    return None
                add_offsets(mv[hsize:data - 4])
                add_count(n)
                add_size(vsize)
                add_chunk(mv[data:size])
                add_ksize(0)
                if any_keys:
                    koffs.frombytes(bytes(4 * n))
                    kvalid.frombytes(bytes(n))
                if any_ts:
                    tvalid.frombytes(bytes(n))
                    event.frombytes(bytes(8 * n))
                continue
            rows_before = len(offs)
            bitmap = (n + 7) // 8
            ko = tv = 0
            if flags & FLAG_KEYS:
                ko = data + bitmap
                data = ko + 4 * (n + 1)
            if flags & FLAG_TIMESTAMPS:
                tv = data
                data = tv + bitmap + 8 * n
            if data > size:
                return None
            vsize = _last_offset(mv, hsize + 4 * n)[0]
            ksize = _last_offset(mv, ko + 4 * n)[0] if ko else 0
            if data + vsize + ksize != size:
                return None
            add_offsets(mv[hsize:hsize + 4 * n])
            if offs[rows_before] != 0:
                return None
            add_count(n)
            add_size(vsize)
            add_chunk(mv[data:data + vsize])
            add_ksize(ksize)
            if ko and not any_keys:
                any_keys = True
                koffs.frombytes(bytes(4 * rows_before))
                kvalid.frombytes(bytes(rows_before))
            if any_keys:
                if ko:
                    first = len(koffs)
                    koffs.frombytes(mv[ko:ko + 4 * n])
                    if koffs[first] != 0:
                        return None
                    kvalid.frombytes(_bits(mv[ko - bitmap:ko], n))
                    kchunks.append(mv[data + vsize:size])
                else:
                    koffs.frombytes(bytes(4 * n))
                    kvalid.frombytes(bytes(n))
            if tv and not any_ts:
                any_ts = True
                tvalid.frombytes(bytes(rows_before))
                event.frombytes(bytes(8 * rows_before))
            if any_ts:
                if tv:
                    tvalid.frombytes(_bits(mv[tv:tv + bitmap], n))
                    event.frombytes(mv[tv + bitmap:tv + bitmap + 8 * n])
                else:
                    tvalid.frombytes(bytes(n))
                    event.frombytes(bytes(8 * n))
    except struct.error:  # an entry shorter than its header
        return None
    return _columns(records, offs, koffs, counts, sizes, ksizes, stamps, event, kvalid, tvalid, chunks, kchunks,
                    any_keys, any_ts)


def _i64(values: array[int]) -> pa.Array:
    """An int64 Arrow array over a Python ``array('q')`` (no copy)."""
    return pa.Array.from_buffers(_INT64, len(values), [None, pa.py_buffer(values)])


def _raw(arr: pa.Array, width: int) -> memoryview:
    """The ``width``-byte values of a fixed-width Arrow array without nulls, as bytes."""
    return memoryview(arr.buffers()[1])[arr.offset * width:(arr.offset + len(arr)) * width]


def cut_spans(spans: PayloadSpans, cut: int,
              heads_ok: Callable[[memoryview], bool] | None = None) -> tuple[memoryview, pa.Array] | None:
    """Every item of ``spans`` cut ``cut`` bytes in: the first ``cut`` bytes of each item, joined
    (``cut * len(spans)`` bytes, item order), and the rest of each as one binary array. Built by
    Arrow in C with no Python object per item: the items' spans become the offsets of one
    array over the answers' bytes, whose pieces ``take`` gathers in item order. None if an
    item is shorter than ``cut``, if items overlap, beyond binary's 2 GiB, or if ``heads_ok``
    (asked before the rests are gathered) refuses the heads."""
    m = len(spans)
    bufs = spans.buffers
    starts, ends = _i64(spans.starts), _i64(spans.ends)
    data: BytesLike
    if len(bufs) == 1:
        data = bufs[0]
    else:  # the answers one after another (one copy): items are spans of one buffer then
        data = b"".join(bufs)
        bases = _i64(array("q", accumulate(map(len, bufs), initial=0)))
        shift = pc.take(bases, pa.Array.from_buffers(pa.uint32(), m, [None, pa.py_buffer(spans.buf)]))
        starts, ends = pc.add(starts, shift), pc.add(ends, shift)
    if m == 0 or pc.min(pc.subtract(ends, starts)).as_py() < cut:
        return None
    # Items in the order they lie in ``data``; each contributes three pieces to one array's
    # offsets (its first ``cut`` bytes, its rest, the gap to the next item): never decreasing
    # unless items overlap, which Arrow's full validation rejects.
    order = pc.sort_indices(starts)
    first = pc.take(starts, order)
    offsets = array("q", bytes(8 * (3 * m + 1)))
    for k, column in enumerate((first, pc.add(first, pa.scalar(cut, _INT64)), pc.take(ends, order))):
        piece = array("q")
        piece.frombytes(_raw(column, 8))
        offsets[k:3 * m:3] = piece
    offsets[3 * m] = offsets[3 * m - 1]
    pieces = pa.Array.from_buffers(pa.large_binary(), 3 * m, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    try:
        pieces.validate(full=True)
        at = pc.multiply(pc.sort_indices(order), pa.scalar(3, _INT64))  # item i's first piece
        head_data = pc.take(pieces, at).buffers()[2]
        heads = memoryview(head_data if head_data is not None else b"")[:cut * m]
        if heads_ok is not None and not heads_ok(heads):
            return None
        rest = pc.take(pieces, pc.add(at, pa.scalar(1, _INT64))).cast(pa.binary())
    except pa.ArrowInvalid:
        return None
    return heads, rest


_RECORDS_WORDS = (RECORDS_HEADER_SIZE + 8) // 4  # magic count flags stamp(2) offsets[0] offsets[1]
_ROWS_WORDS = (HEADER_SIZE + 8) // 4  # magic count offsets[0] offsets[1]
_ONE_ROW = (1).to_bytes(4, "little")
_ZERO_WORD = bytes(4)


def _decode_single_rows(spans: PayloadSpans, records: bool) -> PackedColumns | None:
    """:func:`decode_values` of a run of one-row entries of bare values (what a producer writes
    one record at a time) with no Python work per entry: each entry's fixed header and its
    row are cut apart by :func:`cut_spans`, and the headers checked as columns of words
    (magic, count 1, no flags, first offset 0, last offset the row's size). None if any entry
    is not such an entry (the per-entry passes decide then)."""
    m = len(spans)
    w = _RECORDS_WORDS if records else _ROWS_WORDS
    first = spans.starts[0]
    if spans.ends[0] - first < 4 * w or spans.buffers[spans.buf[0]][first + 4:first + 8] != _ONE_ROW:
        return None  # many rows an entry (what the sink writes): not worth gathering the heads
    words = array("I")

    def heads_ok(heads: memoryview) -> bool:
        words.frombytes(heads)
        return (words[0::w].tobytes() == (RECORDS_MAGIC if records else MAGIC) * m
                and words[1::w].tobytes() == _ONE_ROW * m
                and words[w - 2::w].tobytes() == _ZERO_WORD * m
                and (not records or words[2::w].tobytes() == _ZERO_WORD * m))

    got = cut_spans(spans, 4 * w, heads_ok)
    if got is None:
        return None
    value = got[1]
    # the last offset is the row's size (int32 sizes: the same bytes as uint32 ones)
    if words[w - 1::w].tobytes() != bytes(_raw(pc.binary_length(value), 4)):
        return None
    append_ms = None
    if records:
        stamps = array("I", bytes(8 * m))  # int64 little-endian: low word, high word
        stamps[0::2] = words[3::w]
        stamps[1::2] = words[4::w]
        append_ms = pa.Array.from_buffers(_INT64, m, [None, pa.py_buffer(stamps)])
    return PackedColumns(m, value, arange(0, m, pa.int32()), pa.repeat(ZERO32, m), append_ms)


def _decode_bare_spans(spans: PayloadSpans, records: bool) -> PackedColumns | None:
    """:func:`decode_values` of a run whose entries all hold bare values (what producers and
    the sink write), read where they lie in the bookies' answers: per entry one unpack of its
    header and first offsets, no view of the entry. None if any entry is not such an entry or
    fails a check (the general pass then decides)."""
    bufs, which, starts, ends = spans.buffers, spans.buf, spans.starts, spans.ends
    hsize = RECORDS_HEADER_SIZE if records else HEADER_SIZE
    head = (_RECORDS_HEAD_2 if records else _ROWS_HEAD_2).unpack_from
    magic = RECORDS_MAGIC if records else MAGIC
    offs = array("I")
    counts, sizes, stamps = array("q"), array("q"), array("q")
    chunks: list[memoryview] = []
    add_offsets, add_count, add_size, add_chunk, add_stamp = (offs.frombytes, counts.append, sizes.append,
                                                              chunks.append, stamps.append)
    one_offset = bytes(4)
    fixed = hsize + 8  # the header and the first two offsets
    for b, s, e in zip(which, starts, ends):
        if s + fixed > e:
            return None
        src = bufs[b]
        fields = head(src, s)
        n = fields[1]
        if fields[0] != magic or n < 1:
            return None
        if records:
            if fields[2]:  # keys, timestamps, headers: the general pass
                return None
            add_stamp(fields[3])
        data = s + hsize + 4 * (n + 1)
        if n == 1:
            if fields[-2] != 0:
                return None
            vsize = fields[-1]
            add_offsets(one_offset)
        else:
            if fields[-2] != 0 or data > e:
                return None
            vsize = _last_offset(src, data - 4)[0]
            add_offsets(src[s + hsize:data - 4])
        if data + vsize != e:
            return None
        add_count(n)
        add_size(vsize)
        add_chunk(src[data:e])
    zeros = array("q")
    return _columns(records, offs, array("I"), counts, sizes, array("q", bytes(8 * len(counts))), stamps, zeros,
                    array("b"), array("b"), chunks, [], False, False)


def _columns(records: bool, offs: array[int], koffs: array[int], counts: array[int], sizes: array[int],
             ksizes: array[int], stamps: array[int], event: array[int], kvalid: array[int], tvalid: array[int],
             chunks: list[memoryview], kchunks: list[memoryview], any_keys: bool, any_ts: bool) -> PackedColumns | None:
    """The Arrow columns of what a decoding pass collected (see :func:`decode_values`)."""
    m = len(counts)
    n_rows = len(offs)
    bases = array("q", accumulate(sizes, initial=0))
    kbases = array("q", accumulate(ksizes, initial=0))
    if bases[-1] > 0x7FFFFFFF or kbases[-1] > 0x7FFFFFFF:
        return None  # beyond binary's int32 offsets: entry by entry
    try:
        if n_rows == m:  # one row per entry: the entries' data starts are the offsets
            entry_index = arange(0, m, pa.int32())
            offsets = pa.py_buffer(array("i", bases))
            key_offsets = pa.py_buffer(array("i", kbases)) if any_keys else None
            batch_index = pa.repeat(ZERO32, m)
        else:
            row_starts = array("i", accumulate(counts, initial=0))
            lists = pa.ListArray.from_arrays(pa.Array.from_buffers(pa.int32(), m + 1, [None, pa.py_buffer(row_starts)]),
                                             pa.nulls(n_rows, pa.null()))
            entry_index = pc.list_parent_indices(lists).cast(pa.int32())
            offsets = _shifted(offs, bases, entry_index, n_rows, m)
            key_offsets = _shifted(koffs, kbases, entry_index, n_rows, m) if any_keys else None
            starts = pa.Array.from_buffers(pa.int32(), m, [None, pa.py_buffer(row_starts)])
            row = arange(0, n_rows, pa.int32())
            batch_index = pc.subtract(row, pc.take(starts, entry_index))
        value = pa.Array.from_buffers(pa.binary(), n_rows, [None, offsets, pa.py_buffer(b"".join(chunks))])
        value.validate(full=True)  # every entry's offsets in order, inside its data
        key = None
        if any_keys:
            key = pa.Array.from_buffers(pa.binary(), n_rows, [_validity(kvalid, n_rows), key_offsets,
                                                               pa.py_buffer(b"".join(kchunks))])
            key.validate(full=True)
    except pa.ArrowInvalid:  # offsets out of order, or beyond int32 once shifted
        return None
    append_ms = pa.Array.from_buffers(pa.int64(), m, [None, pa.py_buffer(stamps)]) if records else None
    event_ms = given = None
    if any_ts:
        event_ms = pa.Array.from_buffers(pa.int64(), n_rows, [None, pa.py_buffer(event)])
        given = pa.Array.from_buffers(pa.int8(), n_rows, [None, pa.py_buffer(tvalid)]).cast(pa.bool_())
    return PackedColumns(n_rows, value, entry_index, batch_index, append_ms, key, event_ms, given)


def _shifted(raw: array[int], bases: array[int], entry_index: pa.Array, n_rows: int, m: int) -> pa.Buffer:
    """Int32 offsets of a column: each entry's offsets (but the last) plus where its data
    starts in the joined data, then the total."""
    wide = pa.Array.from_buffers(pa.uint32(), n_rows, [None, pa.py_buffer(raw)]).cast(pa.int64())
    shifted = pc.add(wide, pc.take(pa.Array.from_buffers(pa.int64(), m, [None, pa.py_buffer(bases)]), entry_index))
    return pa.concat_arrays([shifted, pa.array([bases[-1]], pa.int64())]).cast(pa.int32()).buffers()[1]


def binary_column(payloads: Sequence[BytesLike]) -> pa.Array:
    """Plain entries' payloads as one binary column: their bytes joined once and their offsets
    from their lengths (``pa.array`` of the list costs ~2 us a row in Python objects); the
    payloads of a bulk read's answers (``PayloadSpans``) gathered by Arrow (``cut_spans``)."""
    if isinstance(payloads, PayloadSpans) and len(payloads):
        got = cut_spans(payloads, 0)
        if got is not None:
            return got[1]
    data = b"".join(payloads)
    if len(data) > 0x7FFFFFFF:
        return pa.array(payloads, pa.large_binary()).cast(pa.binary())  # raises: beyond binary's offsets
    offsets = array("i", accumulate(map(len, payloads), initial=0))
    return pa.Array.from_buffers(pa.binary(), len(payloads), [None, pa.py_buffer(offsets), pa.py_buffer(data)])
