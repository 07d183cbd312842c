"""Packed entries (many rows per entry): layout, round trips, and clear errors on bad bytes."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vellum.errors import CorruptionError, UnknownFormatVersionError
from vellum.format.records import (
    ENTRY_FORMAT_KEY,
    MAGIC,
    ROWS_V1,
    decode,
    is_packed,
    pack,
    pack_header,
    unpack,
)


def test_layout_is_magic_count_offsets_data() -> None:
    got = pack([b"ab", b"", b"cde"])
    assert got == MAGIC + struct.pack("<I", 3) + struct.pack("<4I", 0, 2, 2, 5) + b"abcde"
    assert pack_header(3, [0, 2, 2, 5]) + b"abcde" == got


@given(st.lists(st.binary(max_size=300), min_size=1, max_size=50))
def test_round_trip(rows: list[bytes]) -> None:
    entry = pack(rows)
    assert unpack(entry) == rows
    assert unpack(memoryview(entry)) == rows
    assert decode(entry).count == len(rows)


@given(st.lists(st.binary(max_size=40), min_size=1, max_size=10), st.data())
def test_truncated_entry_is_refused(rows: list[bytes], data: st.DataObject) -> None:
    entry = pack(rows)
    cut = data.draw(st.integers(0, len(entry) - 1))
    with pytest.raises(CorruptionError):
        unpack(entry[:cut])


@given(st.lists(st.binary(max_size=40), min_size=1, max_size=10), st.data())
def test_flipped_header_byte_never_yields_wrong_rows(rows: list[bytes], data: st.DataObject) -> None:
    entry = bytearray(pack(rows))
    header_len = 8 + 4 * (len(rows) + 1)
    pos = data.draw(st.integers(0, header_len - 1))
    entry[pos] ^= data.draw(st.integers(1, 255))
    try:
        got = unpack(bytes(entry))
    except CorruptionError:
        return
    # A flipped offset byte can only survive the checks by describing another valid split of
    # the same data; the bytes themselves are never invented or lost.
    assert b"".join(got) == b"".join(rows)


def test_errors_say_what_and_where() -> None:
    with pytest.raises(CorruptionError, match="ledger 7 entry 3: not a packed entry"):
        unpack(b"plain payload here", where="ledger 7 entry 3")
    with pytest.raises(CorruptionError, match="too short"):
        unpack(b"VRB")
    bad = MAGIC + struct.pack("<I", 2) + struct.pack("<3I", 0, 3, 2) + b"xy"
    with pytest.raises(CorruptionError, match="offset of row 2"):
        unpack(bad)
    with pytest.raises(CorruptionError, match="data is 1 bytes"):
        unpack(MAGIC + struct.pack("<I", 1) + struct.pack("<2I", 0, 5) + b"x")
    with pytest.raises(ValueError, match="at least one row"):
        pack([])


def test_ledger_marker() -> None:
    assert not is_packed({})
    assert not is_packed({"app": b"x"})
    assert is_packed({ENTRY_FORMAT_KEY: ROWS_V1})
    with pytest.raises(UnknownFormatVersionError, match="rows-v9"):
        is_packed({ENTRY_FORMAT_KEY: b"rows-v9"})
