"""The entry lists of multi-entry answers (BATCH_READ, READ_STRIDED): where a decoded frame's
entries lie in its body (``FrameEntries``), and a bookie's answer laid out as the frame carries
it (``PackedEntries``). Both are sequences of entries, equal to any sequence of the same bytes.

Responsibility: hold a multi-entry answer's entries without an object per entry. The messages
that carry them are in ``messages.py``; their encoding in ``codec.py`` (layouts in
docs/protocol.md).
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterator, Sequence
from typing import Any, TypeAlias, overload

#: bytes-like values accepted in byte fields of messages built by callers
BytesLike: TypeAlias = bytes | bytearray | memoryview


def same_entries(entries: Sequence[BytesLike], other: object) -> bool | Any:
    """``entries == other`` for an entry list: equal to any sequence of the same bytes, in order
    (NotImplemented for what is not a sequence of entries, a bytes-like value or a str)."""
    if not isinstance(other, Sequence) or isinstance(other, (bytes, bytearray, memoryview, str)):
        return NotImplemented
    return len(entries) == len(other) and all(bytes(a) == bytes(b) for a, b in zip(entries, other))


class FrameEntries(Sequence[BytesLike]):
    """The entries of a multi-entry answer (BATCH_READ, READ_STRIDED) as one buffer and where
    each lies in it: entry i is ``body[starts[i]:ends[i]]``. Bulk readers check and decode the
    entries from these offsets without an object per entry; everyone else uses it as the
    sequence of entries it is (an item is a view of ``body``)."""

    __slots__ = ("body", "ends", "starts")

    def __init__(self, body: memoryview, starts: array[int], ends: array[int]) -> None:
        if len(starts) != len(ends):
            raise ValueError(f"FrameEntries: {len(starts)} starts but {len(ends)} ends")
        self.body = body
        self.starts = starts
        self.ends = ends

    def __len__(self) -> int:
        return len(self.starts)

    @overload
    def __getitem__(self, i: int) -> BytesLike: ...
    @overload
    def __getitem__(self, i: slice) -> FrameEntries: ...
    def __getitem__(self, i: int | slice) -> BytesLike | FrameEntries:
        if isinstance(i, slice):
            return FrameEntries(self.body, self.starts[i], self.ends[i])
        return self.body[self.starts[i]:self.ends[i]]

    def __eq__(self, other: object) -> bool:
        return same_entries(self, other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"FrameEntries({len(self)} entries, {len(self.body)} bytes)"


_RECORD_LEN = struct.Struct(">i")


class PackedEntries(Sequence[BytesLike]):
    """The entries of a multi-entry answer (BATCH_READ, READ_STRIDED) laid out as the frame
    carries them: ``parts`` are buffers of ``[int32 len][entry]`` records which, written one
    after the other, are the frame's entry list. The bookie builds it (a run of an entry log is
    already in this layout: ``[int32 size][entry]`` records) and the encoder writes ``parts`` as
    they are: no object and no length field per entry on the way out.

    Everyone else uses it as the sequence of entries it is: the first item lookup indexes the
    records once (one pass over the length fields); an item is a view of its part.
    """

    __slots__ = ("_count", "_index", "entry_bytes", "parts")

    def __init__(self) -> None:
        self.parts: list[BytesLike] = []
        self._count = 0
        #: bytes of the entries (length fields not counted)
        self.entry_bytes = 0
        self._index: tuple[list[BytesLike], array[int], array[int]] | None = None

    @property
    def wire_bytes(self) -> int:
        """Bytes of ``parts`` together (entries and their length fields)."""
        return self.entry_bytes + 4 * self._count

    def add(self, entry: BytesLike) -> None:
        """Append one entry (copied, with its length field, into a new part)."""
        self.add_all((entry,))

    def add_all(self, entries: Sequence[BytesLike]) -> None:
        """Append ``entries`` (copied, with their length fields, into one new part)."""
        if not entries:
            return
        pack = _RECORD_LEN.pack
        pieces: list[BytesLike] = []
        size = 0
        for entry in entries:
            n = len(entry)
            pieces.append(pack(n))
            pieces.append(entry)
            size += n
        self.parts.append(b"".join(pieces))
        self._count += len(entries)
        self.entry_bytes += size
        self._index = None

    def add_records(self, records: BytesLike, count: int, entry_bytes: int) -> None:
        """Append ``count`` entries of ``entry_bytes`` bytes together, laid out in ``records``
        exactly as ``[int32 len][entry]`` records (kept, not copied)."""
        if len(records) != entry_bytes + 4 * count:
            raise ValueError(f"PackedEntries: {len(records)} bytes cannot be {count} records of "
                             f"{entry_bytes} entry bytes")
        self.parts.append(records)
        self._count += count
        self.entry_bytes += entry_bytes
        self._index = None

    def extend(self, other: PackedEntries) -> None:
        """Append the entries of ``other`` (its parts, not copied)."""
        self.parts.extend(other.parts)
        self._count += other._count
        self.entry_bytes += other.entry_bytes
        self._index = None

    def _indexed(self) -> tuple[list[BytesLike], array[int], array[int]]:
        """(part of each entry, start, end): one pass over the length fields."""
        if self._index is None:
            owners: list[BytesLike] = []
            starts: array[int] = array("q")
            ends: array[int] = array("q")
            unpack = _RECORD_LEN.unpack_from
            for part in self.parts:
                pos, end = 0, len(part)
                while pos < end:
                    (size,) = unpack(part, pos)
                    owners.append(part)
                    starts.append(pos + 4)
                    pos += 4 + size
                    ends.append(pos)
            self._index = (owners, starts, ends)
        return self._index

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, i: int) -> BytesLike: ...
    @overload
    def __getitem__(self, i: slice) -> list[BytesLike]: ...
    def __getitem__(self, i: int | slice) -> BytesLike | list[BytesLike]:
        owners, starts, ends = self._indexed()
        if isinstance(i, slice):
            return [memoryview(p)[s:e] for p, s, e in zip(owners[i], starts[i], ends[i])]
        return memoryview(owners[i])[starts[i]:ends[i]]

    def __iter__(self) -> Iterator[BytesLike]:
        owners, starts, ends = self._indexed()
        for p, s, e in zip(owners, starts, ends):
            yield memoryview(p)[s:e]

    def __eq__(self, other: object) -> bool:
        return same_entries(self, other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PackedEntries({self._count} entries, {self.wire_bytes} bytes in {len(self.parts)} parts)"
