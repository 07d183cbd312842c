"""Records entries (``records-v1``): layout, round trips over every chunking into entries, and
clear errors on bad bytes."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vellum.errors import CorruptionError, UnknownFormatVersionError
from vellum.format.records import (
    ENTRY_FORMAT_KEY,
    RECORDS_ENTRY_OVERHEAD,
    RECORDS_MAGIC,
    RECORDS_V1,
    ROWS_V1,
    Record,
    decode_records,
    encode_records,
    encode_values,
    entry_format,
    is_packed,
    record_size,
    unpack,
)

headers = st.lists(st.tuples(st.text(max_size=8), st.binary(max_size=12)), max_size=4).map(tuple)
records = st.builds(
    Record,
    value=st.binary(max_size=60),
    key=st.none() | st.binary(max_size=20),
    timestamp=st.none() | st.integers(0, 2**63 - 1),
    headers=headers,
)


def test_layout_of_bare_values() -> None:
    got = encode_records([Record(b"ab"), Record(b"c")], append_timestamp=1234)
    assert got == RECORDS_MAGIC + struct.pack("<IIq", 2, 0, 1234) + struct.pack("<3I", 0, 2, 3) + b"abc"
    assert encode_values(2, [0, 2, 3], b"abc", 1234) == got


def test_layout_with_every_section() -> None:
    got = encode_records([Record(b"v", b"k", 7, (("h", b"x"),)), Record(b"", None, None, ())], append_timestamp=9)
    want = (RECORDS_MAGIC + struct.pack("<IIq", 2, 7, 9) + struct.pack("<3I", 0, 1, 1)
            + bytes([0b01]) + struct.pack("<3I", 0, 1, 1)            # keys: record 0 only
            + bytes([0b01]) + struct.pack("<2q", 7, 0)               # timestamps: record 0 only
            + struct.pack("<3I", 0, 1, 1) + struct.pack("<2I", 0, 1) + struct.pack("<2I", 0, 1)
            + b"v" + b"k" + b"h" + b"x")
    assert got == want


@given(st.lists(records, min_size=1, max_size=30), st.integers(0, 2**62))
def test_round_trip(recs: list[Record], append_ts: int) -> None:
    entry = encode_records(recs, append_ts)
    view = decode_records(entry)
    assert view.records() == recs
    assert view.append_timestamp == append_ts
    assert decode_records(memoryview(entry), check_offsets=False).records() == recs
    assert unpack(entry) == [r.value for r in recs]
    assert len(entry) <= RECORDS_ENTRY_OVERHEAD + sum(
        record_size(len(r.value), None if r.key is None else len(r.key), r.headers) for r in recs)


@given(st.lists(records, min_size=1, max_size=12), st.data())
def test_every_chunking_into_entries_reads_back_the_same_records(recs: list[Record], data: st.DataObject) -> None:
    # A producer may cut the stream of records into entries anywhere: any cut reads back the same.
    cuts = sorted(data.draw(st.sets(st.integers(1, len(recs) - 1), max_size=len(recs) - 1)) if len(recs) > 1 else [])
    bounds = [0, *cuts, len(recs)]
    entries = [encode_records(recs[a:b], 1) for a, b in itertools.pairwise(bounds)]
    assert [r for e in entries for r in decode_records(e).records()] == recs


@given(st.lists(records, min_size=1, max_size=8), st.data())
def test_truncated_entry_is_refused(recs: list[Record], data: st.DataObject) -> None:
    entry = encode_records(recs, 5)
    cut = data.draw(st.integers(0, len(entry) - 1))
    with pytest.raises(CorruptionError):
        decode_records(entry[:cut]).records()


@given(st.lists(records, min_size=1, max_size=8), st.data())
def test_flipped_byte_is_refused_or_keeps_the_bytes(recs: list[Record], data: st.DataObject) -> None:
    entry = bytearray(encode_records(recs, 5))
    pos = data.draw(st.integers(0, len(entry) - 1))
    entry[pos] ^= data.draw(st.integers(1, 255))
    try:
        got = decode_records(bytes(entry)).records()
    except CorruptionError:
        return
    # What survives the checks has the same number of records, and never more value bytes.
    assert len(got) == len(recs)
    assert sum(len(r.value) for r in got) == sum(len(r.value) for r in recs)


def test_errors_say_what_and_where() -> None:
    with pytest.raises(CorruptionError, match="ledger 7 entry 3: not a records entry"):
        decode_records(b"plain payload, long enough to parse", where="ledger 7 entry 3")
    with pytest.raises(CorruptionError, match="too short for a records entry header"):
        decode_records(RECORDS_MAGIC)
    with pytest.raises(UnknownFormatVersionError, match="flags 0x8"):
        decode_records(RECORDS_MAGIC + struct.pack("<IIq", 1, 8, 0) + struct.pack("<2I", 0, 0))
    with pytest.raises(CorruptionError, match="key offsets"):
        decode_records(RECORDS_MAGIC + struct.pack("<IIq", 1, 1, 0) + struct.pack("<2I", 0, 0) + b"\x01")
    bad = RECORDS_MAGIC + struct.pack("<IIq", 2, 0, 0) + struct.pack("<3I", 0, 3, 2) + b"xy"
    with pytest.raises(CorruptionError, match="value offset 2"):
        decode_records(bad)
    with pytest.raises(CorruptionError, match="after its last section"):
        decode_records(RECORDS_MAGIC + struct.pack("<IIq", 1, 0, 0) + struct.pack("<2I", 0, 1) + b"xy")
    with pytest.raises(ValueError, match="at least one record"):
        encode_records([], 0)
    with pytest.raises(ValueError, match="milliseconds since the Unix epoch"):
        encode_records([Record(b"v", timestamp=-1)], 0)


def test_ledger_marker_knows_both_packed_formats() -> None:
    assert entry_format({}) is None
    assert entry_format({ENTRY_FORMAT_KEY: ROWS_V1}) == ROWS_V1
    assert entry_format({ENTRY_FORMAT_KEY: RECORDS_V1}) == RECORDS_V1
    assert is_packed({ENTRY_FORMAT_KEY: RECORDS_V1})
    with pytest.raises(UnknownFormatVersionError, match="records-v1"):
        entry_format({ENTRY_FORMAT_KEY: b"records-v9"})
