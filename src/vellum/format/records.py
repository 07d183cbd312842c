"""Packed entries: many rows (``rows-v1``) or records (``records-v1``) in one ledger entry.

One BookKeeper entry per row costs a journal record, a write-cache slot, an index entry and a
quorum round trip per row; Pulsar packs a batch of messages into one entry for that reason, and
Vellum's Spark sink does the same by default. A ledger whose entries are packed says so in its
custom metadata (``vellum.entryFormat = rows-v1``), so a reader never mistakes a plain entry
that happens to start with the magic for a packed one, nor the reverse.

Byte layout of a packed entry (little-endian, so the offsets can be handed to Apache Arrow as
a binary array's offsets buffer without copying)::

    magic  b"VRB\\x01"          4 bytes
    count  uint32              number of rows N (>= 1)
    offsets uint32 * (N + 1)   offsets[0] = 0, non-decreasing, offsets[N] = len(data)
    data                       the rows' bytes, concatenated

Row ``i`` is ``data[offsets[i]:offsets[i + 1]]``.

Records (``vellum.entryFormat = records-v1``): one or many *records* per entry, each a value
plus an optional key, an optional event timestamp and headers (name -> bytes, in order, names
may repeat), and per entry the writer's append timestamp. Columnar and little-endian like
``rows-v1``, so a reader hands each section to Apache Arrow as it is::

    magic            b"VRR\x01"                          4 bytes
    count            uint32 N (>= 1)                     4
    flags            uint32: 1 keys, 2 timestamps, 4 headers (other bits: a newer format)
    appendTimestamp  int64, ms since the Unix epoch      8   (the writer's clock, entry built)
    valueOffsets     uint32 * (N + 1)
    if keys:         keyValidity  ceil(N / 8) bytes (bit i, LSB first: record i has a key)
                     keyOffsets   uint32 * (N + 1)
    if timestamps:   tsValidity   ceil(N / 8) bytes;  timestamps int64 * N (ms; 0 where absent)
    if headers:      headerOffsets    uint32 * (N + 1)  record i's headers are H[hdr[i]:hdr[i+1]]
                     headerKeyOffsets uint32 * (H + 1)  H = headerOffsets[N]
                     headerValOffsets uint32 * (H + 1)
    data             values, then keys, then header names (UTF-8), then header values

Every offsets array starts at 0, never decreases, and ends at its data's length; the sections
fill the entry exactly. Pure: encoding and decoding only.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from vellum.errors import CorruptionError, UnknownFormatVersionError

MAGIC = b"VRB\x01"
#: custom-metadata key of a ledger whose entries are all in a non-plain format
ENTRY_FORMAT_KEY = "vellum.entryFormat"
#: the marker values of this module's formats
ROWS_V1 = b"rows-v1"
RECORDS_V1 = b"records-v1"
RECORDS_MAGIC = b"VRR\x01"
_HEAD = struct.Struct("<4sI")
HEADER_SIZE = _HEAD.size  # 8
#: offsets are uint32: a packed entry's data is below 4 GiB (frames are far smaller anyway)
MAX_DATA = 0xFFFFFFFF


def entry_format(custom_metadata: Mapping[str, bytes]) -> bytes | None:
    """The entry format a ledger's custom metadata declares: ``ROWS_V1``, ``RECORDS_V1``, or
    None for plain entries.

    Raises ``UnknownFormatVersionError`` for an entry format this version does not know (a newer
    writer), rather than handing its bytes out as rows or as plain entries.
    """
    fmt = custom_metadata.get(ENTRY_FORMAT_KEY)
    if fmt is None:
        return None
    if bytes(fmt) in (ROWS_V1, RECORDS_V1):
        return bytes(fmt)
    raise UnknownFormatVersionError(
        f"ledger entry format {bytes(fmt)!r} (custom metadata {ENTRY_FORMAT_KEY}) is not known to this "
        f"Vellum version, which reads {ROWS_V1!r}, {RECORDS_V1!r} and plain entries"
    )


def is_packed(custom_metadata: Mapping[str, bytes]) -> bool:
    """Whether a ledger with this custom metadata holds packed entries (rows or records); see
    :func:`entry_format` for the error on an unknown format."""
    return entry_format(custom_metadata) is not None


def pack(rows: Sequence[bytes]) -> bytes:
    """One packed entry holding ``rows`` in order (at least one row)."""
    if not rows:
        raise ValueError("a packed entry holds at least one row")
    offsets = [0]
    total = 0
    for r in rows:
        total += len(r)
        offsets.append(total)
    if total > MAX_DATA:
        raise ValueError(f"packed entry data of {total} bytes exceeds the 4 GiB offset range")
    return b"".join([_HEAD.pack(MAGIC, len(rows)), struct.pack(f"<{len(offsets)}I", *offsets), *rows])


def pack_header(count: int, offsets: Sequence[int]) -> bytes:
    """Magic, count and offsets for ``count`` rows whose byte offsets (starting at 0) are given;
    the caller appends the data (used to pack straight from columnar buffers)."""
    if count < 1 or len(offsets) != count + 1 or offsets[0] != 0:
        raise ValueError(f"need count >= 1 and count + 1 offsets starting at 0, got {count} and {len(offsets)}")
    if offsets[-1] > MAX_DATA:
        raise ValueError(f"packed entry data of {offsets[-1]} bytes exceeds the 4 GiB offset range")
    return _HEAD.pack(MAGIC, count) + struct.pack(f"<{count + 1}I", *offsets)


@dataclass(frozen=True, slots=True)
class PackedView:
    """A decoded packed entry: ``offsets`` (N + 1 ints) index into ``data``; no row is copied."""

    count: int
    offsets_raw: memoryview  # the (N + 1) uint32 little-endian offsets, as stored
    data: memoryview

    def rows(self) -> list[bytes]:
        offs = struct.unpack(f"<{self.count + 1}I", self.offsets_raw)
        data = self.data
        return [bytes(data[offs[i]:offs[i + 1]]) for i in range(self.count)]


def decode(entry: bytes | memoryview, *, where: str = "entry", check_offsets: bool = True) -> PackedView:
    """Parse a packed entry; ``CorruptionError`` naming ``where`` if it is not a valid one.

    ``check_offsets=False`` skips the per-row monotonicity check for callers that validate the
    offsets themselves (Arrow's full validation does, in C).
    """
    mv = memoryview(entry).cast("B")
    if len(mv) < HEADER_SIZE:
        raise CorruptionError(f"{where}: {len(mv)} bytes is too short for a packed entry header ({HEADER_SIZE})")
    magic, count = _HEAD.unpack_from(mv)
    if magic != MAGIC:
        raise CorruptionError(f"{where}: not a packed entry (magic {bytes(magic)!r}, expected {MAGIC!r})")
    if count < 1:
        raise CorruptionError(f"{where}: packed entry with {count} rows")
    end_offsets = HEADER_SIZE + 4 * (count + 1)
    if end_offsets > len(mv):
        raise CorruptionError(f"{where}: packed entry claims {count} rows but has only {len(mv)} bytes")
    offsets_raw = mv[HEADER_SIZE:end_offsets]
    data = mv[end_offsets:]
    first = int.from_bytes(offsets_raw[:4], "little")
    last = int.from_bytes(offsets_raw[-4:], "little")
    if first != 0 or last != len(data):
        raise CorruptionError(f"{where}: packed entry offsets run {first}..{last} but its data is "
                              f"{len(data)} bytes")
    if check_offsets:
        offs = struct.unpack(f"<{count + 1}I", offsets_raw)
        for i in range(count):
            if offs[i] > offs[i + 1]:
                raise CorruptionError(f"{where}: packed entry offset of row {i + 1} ({offs[i + 1]}) is "
                                      f"below that of row {i} ({offs[i]})")
    return PackedView(count, offsets_raw, data)


def unpack(entry: bytes | memoryview, *, where: str = "entry") -> list[bytes]:
    """The rows of one packed entry, in order (of a ``records-v1`` entry: the records' values)."""
    if bytes(memoryview(entry)[:4]) == RECORDS_MAGIC:
        return [r.value for r in decode_records(entry, where=where).records()]
    return decode(entry, where=where).rows()


# =========================================================================== records-v1

FLAG_KEYS = 1
FLAG_TIMESTAMPS = 2
FLAG_HEADERS = 4
_KNOWN_FLAGS = FLAG_KEYS | FLAG_TIMESTAMPS | FLAG_HEADERS
_RHEAD = struct.Struct("<4sIIq")
RECORDS_HEADER_SIZE = _RHEAD.size  # 20
#: each data section stays below 2 GiB: Arrow's binary offsets are int32
MAX_SECTION = 0x7FFFFFFF

#: a header: (name, value)
Header = tuple[str, bytes]


@dataclass(frozen=True, slots=True)
class Record:
    """One record: ``value`` plus optional ``key``, event ``timestamp`` (ms since the Unix
    epoch, >= 0) and ``headers`` (in order; a name may repeat, as in Kafka)."""

    value: bytes
    key: bytes | None = None
    timestamp: int | None = None
    headers: tuple[Header, ...] = ()


def _bitmap(present: Sequence[bool]) -> bytes:
    out = bytearray((len(present) + 7) // 8)
    for i, p in enumerate(present):
        if p:
            out[i >> 3] |= 1 << (i & 7)
    return bytes(out)


def _bit(bitmap: memoryview, i: int) -> bool:
    return bool(bitmap[i >> 3] >> (i & 7) & 1)


def _offsets_of(parts: Sequence[bytes], what: str) -> list[int]:
    offs = [0]
    total = 0
    for p in parts:
        total += len(p)
        offs.append(total)
    if total > MAX_SECTION:
        raise ValueError(f"records entry: {what} of {total} bytes exceed the 2 GiB section limit")
    return offs


#: bytes of a records entry beyond its records' :func:`record_size` (header and final offsets)
RECORDS_ENTRY_OVERHEAD = RECORDS_HEADER_SIZE + 5 * 4


def record_size(value_len: int, key_len: int | None, headers: Sequence[Header]) -> int:
    """Bytes a record adds to an entry at most (as if every section were present; a bitmap
    byte counted per record): what producers use to bound their batches."""
    return (value_len + (key_len or 0) + 4 + 4 + 2 + 8 + 4
            + sum(len(k.encode("utf-8")) + len(v) + 8 for k, v in headers))


def encode_records(records: Sequence[Record], append_timestamp: int) -> bytes:
    """One ``records-v1`` entry holding ``records`` in order (at least one).

    Sections for keys, timestamps and headers are written only if some record has one, so an
    entry of bare values costs the header and one offset per record.
    """
    n = len(records)
    if n == 0:
        raise ValueError("a records entry holds at least one record")
    has_keys = any(r.key is not None for r in records)
    has_ts = any(r.timestamp is not None for r in records)
    has_headers = any(r.headers for r in records)
    flags = (FLAG_KEYS if has_keys else 0) | (FLAG_TIMESTAMPS if has_ts else 0) | (FLAG_HEADERS if has_headers else 0)
    values = [bytes(r.value) for r in records]
    parts: list[bytes] = [_RHEAD.pack(RECORDS_MAGIC, n, flags, append_timestamp),
                          struct.pack(f"<{n + 1}I", *_offsets_of(values, "values"))]
    data: list[bytes] = list(values)
    if has_keys:
        keys = [b"" if r.key is None else bytes(r.key) for r in records]
        parts.append(_bitmap([r.key is not None for r in records]))
        parts.append(struct.pack(f"<{n + 1}I", *_offsets_of(keys, "keys")))
        data.extend(keys)
    if has_ts:
        for r in records:
            if r.timestamp is not None and not 0 <= r.timestamp < 1 << 63:
                raise ValueError(f"record timestamp {r.timestamp} is not milliseconds since the Unix epoch (>= 0)")
        parts.append(_bitmap([r.timestamp is not None for r in records]))
        parts.append(struct.pack(f"<{n}q", *(r.timestamp or 0 for r in records)))
    if has_headers:
        hdr = [0]
        names: list[bytes] = []
        hvalues: list[bytes] = []
        for r in records:
            for k, v in r.headers:
                names.append(k.encode("utf-8"))
                hvalues.append(bytes(v))
            hdr.append(len(names))
        h = len(names)
        parts.append(struct.pack(f"<{n + 1}I", *hdr))
        parts.append(struct.pack(f"<{h + 1}I", *_offsets_of(names, "header names")))
        parts.append(struct.pack(f"<{h + 1}I", *_offsets_of(hvalues, "header values")))
        data.extend(names)
        data.extend(hvalues)
    return b"".join(parts + data)


def values_header(count: int, offsets: Sequence[int], append_timestamp: int) -> bytes:
    """Everything of a ``records-v1`` entry of ``count`` bare values but their data: the caller
    appends the values' bytes, whose ``offsets`` (starting at 0) are given (columnar writers)."""
    if count < 1 or len(offsets) != count + 1 or offsets[0] != 0:
        raise ValueError(f"need count >= 1 and count + 1 offsets starting at 0, got {count} and {len(offsets)}")
    if offsets[-1] > MAX_SECTION:
        raise ValueError(f"records entry: values of {offsets[-1]} bytes exceed the 2 GiB section limit")
    return _RHEAD.pack(RECORDS_MAGIC, count, 0, append_timestamp) + struct.pack(f"<{count + 1}I", *offsets)


def encode_values(count: int, offsets: Sequence[int], data: bytes | memoryview, append_timestamp: int) -> bytes:
    """A ``records-v1`` entry of ``count`` bare values (no key, timestamp or header), straight
    from their byte ``offsets`` (starting at 0) and concatenated ``data`` (columnar writers)."""
    if len(offsets) != count + 1 or offsets[-1] != len(data):
        raise ValueError(f"need count + 1 offsets ending at len(data) ({len(data)}), got {len(offsets)} offsets")
    return values_header(count, offsets, append_timestamp) + bytes(data)


@dataclass(frozen=True, slots=True)
class RecordsView:
    """A decoded ``records-v1`` entry: the raw sections (no record copied). Offsets are the
    little-endian uint32 arrays as stored; absent sections are None."""

    count: int
    append_timestamp: int
    value_offsets: memoryview
    values: memoryview
    key_validity: memoryview | None
    key_offsets: memoryview | None
    keys: memoryview | None
    ts_validity: memoryview | None
    timestamps: memoryview | None  # int64 LE * count
    header_offsets: memoryview | None
    header_name_offsets: memoryview | None
    header_names: memoryview | None
    header_value_offsets: memoryview | None
    header_values: memoryview | None

    @property
    def header_count(self) -> int:
        return 0 if self.header_offsets is None else int.from_bytes(self.header_offsets[-4:], "little")

    def records(self) -> list[Record]:
        n = self.count
        vo = struct.unpack(f"<{n + 1}I", self.value_offsets)
        values = [bytes(self.values[vo[i]:vo[i + 1]]) for i in range(n)]
        keys: list[bytes | None] = [None] * n
        if self.key_offsets is not None and self.keys is not None and self.key_validity is not None:
            ko = struct.unpack(f"<{n + 1}I", self.key_offsets)
            keys = [bytes(self.keys[ko[i]:ko[i + 1]]) if _bit(self.key_validity, i) else None for i in range(n)]
        stamps: list[int | None] = [None] * n
        if self.timestamps is not None and self.ts_validity is not None:
            ts = struct.unpack(f"<{n}q", self.timestamps)
            stamps = [ts[i] if _bit(self.ts_validity, i) else None for i in range(n)]
        headers: list[tuple[Header, ...]] = [()] * n
        if self.header_offsets is not None:
            assert self.header_name_offsets is not None and self.header_names is not None
            assert self.header_value_offsets is not None and self.header_values is not None
            h = self.header_count
            ho = struct.unpack(f"<{n + 1}I", self.header_offsets)
            no = struct.unpack(f"<{h + 1}I", self.header_name_offsets)
            hv = struct.unpack(f"<{h + 1}I", self.header_value_offsets)
            try:
                all_h = [(bytes(self.header_names[no[j]:no[j + 1]]).decode("utf-8"),
                          bytes(self.header_values[hv[j]:hv[j + 1]])) for j in range(h)]
            except UnicodeDecodeError as exc:
                raise CorruptionError(f"records entry: a header name is not UTF-8 ({exc})") from None
            headers = [tuple(all_h[ho[i]:ho[i + 1]]) for i in range(n)]
        return [Record(values[i], keys[i], stamps[i], headers[i]) for i in range(n)]


class _Cursor:
    """Walks the sections of an entry, naming the section that does not fit."""

    def __init__(self, mv: memoryview, pos: int, where: str) -> None:
        self.mv, self.pos, self.where = mv, pos, where

    def take(self, size: int, what: str) -> memoryview:
        if size < 0 or self.pos + size > len(self.mv):
            raise CorruptionError(f"{self.where}: records entry too short for its {what} ({size} bytes at offset "
                                  f"{self.pos}, entry is {len(self.mv)} bytes)")
        out = self.mv[self.pos:self.pos + size]
        self.pos += size
        return out


def _check_offsets(raw: memoryview, count: int, end: int, what: str, where: str, full: bool) -> None:
    first = int.from_bytes(raw[:4], "little")
    last = int.from_bytes(raw[-4:], "little")
    if first != 0 or last != end:
        raise CorruptionError(f"{where}: records entry {what} offsets run {first}..{last}, expected 0..{end}")
    if full:
        offs = struct.unpack(f"<{count + 1}I", raw)
        for i in range(count):
            if offs[i] > offs[i + 1]:
                raise CorruptionError(f"{where}: records entry {what} offset {i + 1} ({offs[i + 1]}) is below "
                                      f"offset {i} ({offs[i]})")


def decode_records(entry: bytes | memoryview, *, where: str = "entry", check_offsets: bool = True) -> RecordsView:
    """Parse a ``records-v1`` entry; ``CorruptionError`` naming ``where`` and the section if it
    is not a valid one, ``UnknownFormatVersionError`` for flags of a newer writer.

    ``check_offsets=False`` skips the per-record monotonicity checks for callers that validate
    the offsets themselves (Arrow's full validation does, in C).
    """
    mv = memoryview(entry).cast("B")
    if len(mv) < RECORDS_HEADER_SIZE:
        raise CorruptionError(f"{where}: {len(mv)} bytes is too short for a records entry header "
                              f"({RECORDS_HEADER_SIZE})")
    magic, n, flags, append_ts = _RHEAD.unpack_from(mv)
    if magic != RECORDS_MAGIC:
        raise CorruptionError(f"{where}: not a records entry (magic {bytes(magic)!r}, expected {RECORDS_MAGIC!r})")
    if n < 1:
        raise CorruptionError(f"{where}: records entry with {n} records")
    if flags & ~_KNOWN_FLAGS:
        raise UnknownFormatVersionError(f"{where}: records entry flags {flags:#x} include sections this Vellum "
                                        f"version does not know (it reads {_KNOWN_FLAGS:#x})")
    cur = _Cursor(mv, RECORDS_HEADER_SIZE, where)
    bitmap = (n + 7) // 8
    value_offsets = cur.take(4 * (n + 1), "value offsets")
    key_validity = key_offsets = ts_validity = timestamps = None
    header_offsets = name_offsets = hvalue_offsets = None
    if flags & FLAG_KEYS:
        key_validity = cur.take(bitmap, "key validity bitmap")
        key_offsets = cur.take(4 * (n + 1), "key offsets")
    if flags & FLAG_TIMESTAMPS:
        ts_validity = cur.take(bitmap, "timestamp validity bitmap")
        timestamps = cur.take(8 * n, "timestamps")
    h = 0
    if flags & FLAG_HEADERS:
        header_offsets = cur.take(4 * (n + 1), "header offsets")
        if int.from_bytes(header_offsets[:4], "little") != 0:
            raise CorruptionError(f"{where}: records entry header offsets do not start at 0")
        h = int.from_bytes(header_offsets[-4:], "little")
        name_offsets = cur.take(4 * (h + 1), "header name offsets")
        hvalue_offsets = cur.take(4 * (h + 1), "header value offsets")
    sections: list[tuple[str, memoryview, int]] = [("value", value_offsets, n)]
    if key_offsets is not None:
        sections.append(("key", key_offsets, n))
    if name_offsets is not None and hvalue_offsets is not None:
        sections += [("header name", name_offsets, h), ("header value", hvalue_offsets, h)]
    datas: list[memoryview] = []
    for what, offs, count in sections:
        size = int.from_bytes(offs[-4:], "little")
        datas.append(cur.take(size, f"{what} data"))
        _check_offsets(offs, count, size, what, where, check_offsets)
    if cur.pos != len(mv):
        raise CorruptionError(f"{where}: records entry has {len(mv) - cur.pos} bytes after its last section")
    if header_offsets is not None:
        _check_offsets(header_offsets, n, h, "header", where, True)
    keys = datas[1] if key_offsets is not None else None
    names = hvalues = None
    if header_offsets is not None:
        names, hvalues = datas[-2], datas[-1]
    return RecordsView(n, append_ts, value_offsets, datas[0], key_validity, key_offsets, keys, ts_validity,
                       timestamps, header_offsets, name_offsets, names, hvalue_offsets, hvalues)
