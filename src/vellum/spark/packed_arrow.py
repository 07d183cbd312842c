"""Arrow columns of a whole run of packed entries in one pass (the Spark read path's fast path).

Responsibility: turn the payloads of consecutive entries of a packed ledger (``rows-v1``, or
``records-v1`` entries of bare values: no key, event timestamp or header section, what the Spark
sink and a producer without keys write) into one value column, the per-row entry ids and batch
indexes and, for records, the append timestamps, with a constant number of Arrow calls per
batch. Per entry only its fixed header is unpacked and its offsets appended to one array; the
rows' bytes are copied once, by ``bytes.join``. Byte layouts: ``vellum.format.records``. Plain
entries' payloads become one binary column the same way (``binary_column``).

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
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import pyarrow as pa
import pyarrow.compute as pc

from vellum.format.entry import BytesLike
from vellum.format.records import HEADER_SIZE, MAGIC, RECORDS_HEADER_SIZE, RECORDS_MAGIC

_LITTLE = sys.byteorder == "little"
_ROWS_HEAD = struct.Struct("<4sI")
_RECORDS_HEAD = struct.Struct("<4sIIq")
_last_offset = struct.Struct("<I").unpack_from


@dataclass(frozen=True)
class PackedColumns:
    """Rows of a run of packed entries: ``entry_index[i]`` is the position (in the run) of
    row i's entry, ``batch_index[i]`` its index inside that entry; ``append_ms`` one value per
    entry (records) or None (rows)."""

    rows: int
    value: pa.Array
    entry_index: pa.Array
    batch_index: pa.Array
    append_ms: pa.Array | None


def decode_values(payloads: Sequence[BytesLike], records: bool) -> PackedColumns | None:
    """The rows of ``payloads`` (each one packed entry), or None if any entry is not a valid
    bare-values entry of the format (then decode them one by one)."""
    if not _LITTLE or not payloads:
        return None
    unpack_head = (_RECORDS_HEAD if records else _ROWS_HEAD).unpack_from
    hsize = RECORDS_HEADER_SIZE if records else HEADER_SIZE
    magic = RECORDS_MAGIC if records else MAGIC
    # Per entry: its row count, its data size and its offsets but the last (its first offset
    # is 0 and its last the data size: both checked here) appended to `offs` as stored.
    offs = array("I")
    counts = array("q")
    sizes = array("q")
    stamps = array("q")
    chunks: list[memoryview] = []
    try:
        for p in payloads:
            fields = unpack_head(p)
            if fields[0] != magic:
                return None
            n = fields[1]
            if records:
                if fields[2]:  # keys, timestamps or headers: decoded entry by entry
                    return None
                stamps.append(fields[3])
            data = hsize + 4 * (n + 1)
            size = len(p) - data
            if n < 1 or size < 0:
                return None
            mv = memoryview(p)
            first = len(offs)
            offs.frombytes(mv[hsize:data - 4])
            if offs[first] != 0 or _last_offset(mv, data - 4)[0] != size:
                return None
            counts.append(n)
            sizes.append(size)
            chunks.append(mv[data:])
    except struct.error:  # an entry shorter than its header
        return None
    m = len(counts)
    n_rows = len(offs)
    bases = array("q", accumulate(sizes, initial=0))
    if bases[-1] > 0x7FFFFFFF:
        return None  # beyond binary's int32 offsets: entry by entry
    values_data = b"".join(chunks)  # the rows' bytes, copied once
    try:
        if n_rows == m:  # one row per entry: the entries' data starts are the offsets
            entry_index = pa.array(range(m), pa.int32())
            offsets = pa.py_buffer(array("i", bases))
            batch_index = pa.repeat(pa.scalar(0, pa.int32()), m)
        else:
            row_starts = array("i", accumulate(counts, initial=0))
            lists = pa.ListArray.from_arrays(pa.Array.from_buffers(pa.int32(), m + 1, [None, pa.py_buffer(row_starts)]),
                                             pa.nulls(n_rows, pa.null()))
            entry_index = pc.list_parent_indices(lists).cast(pa.int32())
            # each entry's offsets plus where its data starts in values_data
            raw = pa.Array.from_buffers(pa.uint32(), n_rows, [None, pa.py_buffer(offs)]).cast(pa.int64())
            shifted = pc.add(raw, pc.take(pa.Array.from_buffers(pa.int64(), m, [None, pa.py_buffer(bases)]), entry_index))
            offsets = pa.concat_arrays([shifted, pa.array([bases[-1]], pa.int64())]).cast(pa.int32()).buffers()[1]
            starts = pa.Array.from_buffers(pa.int32(), m, [None, pa.py_buffer(row_starts)])
            row = pc.cumulative_sum(pa.repeat(pa.scalar(1, pa.int32()), n_rows))  # 1..n_rows
            batch_index = pc.subtract(pc.subtract(row, pc.take(starts, entry_index)), 1)
        value = pa.Array.from_buffers(pa.binary(), n_rows, [None, offsets, pa.py_buffer(values_data)])
        value.validate(full=True)  # every entry's offsets in order, inside its data
    except pa.ArrowInvalid:  # offsets out of order, or beyond int32 once shifted
        return None
    append_ms = pa.Array.from_buffers(pa.int64(), m, [None, pa.py_buffer(stamps)]) if records else None
    return PackedColumns(n_rows, value, entry_index, batch_index, append_ms)


def binary_column(payloads: Sequence[BytesLike]) -> pa.Array:
    """Plain entries' payloads as one binary column: their bytes joined once and their offsets
    from their lengths (``pa.array`` of the list costs ~2 us a row in Python objects)."""
    data = b"".join(payloads)
    if len(data) > 0x7FFFFFFF:
        return pa.array(payloads, pa.large_binary()).cast(pa.binary())  # raises: beyond binary's offsets
    offsets = array("i", accumulate(map(len, payloads), initial=0))
    return pa.Array.from_buffers(pa.binary(), len(payloads), [None, pa.py_buffer(offsets), pa.py_buffer(data)])
