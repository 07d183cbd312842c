"""Packed entries: many rows (records) in one ledger entry.

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

Row ``i`` is ``data[offsets[i]:offsets[i + 1]]``. Pure: encoding and decoding only.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from vellum.errors import CorruptionError, UnknownFormatVersionError

MAGIC = b"VRB\x01"
#: custom-metadata key of a ledger whose entries are all in a non-plain format
ENTRY_FORMAT_KEY = "vellum.entryFormat"
#: the value for this module's format
ROWS_V1 = b"rows-v1"
_HEAD = struct.Struct("<4sI")
HEADER_SIZE = _HEAD.size  # 8
#: offsets are uint32: a packed entry's data is below 4 GiB (frames are far smaller anyway)
MAX_DATA = 0xFFFFFFFF


def is_packed(custom_metadata: Mapping[str, bytes]) -> bool:
    """Whether a ledger with this custom metadata holds packed entries.

    Raises ``UnknownFormatVersionError`` for an entry format this version does not know (a newer
    writer), rather than handing its bytes out as rows or as plain entries.
    """
    fmt = custom_metadata.get(ENTRY_FORMAT_KEY)
    if fmt is None:
        return False
    if bytes(fmt) == ROWS_V1:
        return True
    raise UnknownFormatVersionError(
        f"ledger entry format {bytes(fmt)!r} (custom metadata {ENTRY_FORMAT_KEY}) is not known to this "
        f"Vellum version, which reads {ROWS_V1!r} and plain entries"
    )


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
    """The rows of one packed entry, in order."""
    return decode(entry, where=where).rows()
