"""Packed entries decoded a batch at a time (``vellum.spark.packed_arrow``) give exactly the rows
of decoding them one by one, and anything the batch path does not build or finds wrong goes the
entry-by-entry way, with the same error naming the entry."""

from __future__ import annotations

import struct
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vellum.client.ledger_reader import LedgerEntry
from vellum.errors import CorruptionError, UnknownFormatVersionError
from vellum.format.records import Record, decode_records, encode_records, pack, unpack
from vellum.spark import record_columns
from vellum.spark.packed_arrow import binary_column, decode_values
from vellum.spark.reader import EntryRange

APPEND_MS = 1_750_000_000_000
def _unpack_entries(part: EntryRange, entries: list[LedgerEntry], records: bool) -> Any:
    return record_columns.unpack(part.ledger_id, part.base, [e.entry_id for e in entries],
                                 [e.payload for e in entries], records)


PART = EntryRange("n", 7, 100, 100, 10_000, b"")
batches = st.lists(st.lists(st.binary(max_size=40), min_size=1, max_size=40), min_size=1, max_size=12)


def _records_entry(values: list[bytes], i: int) -> bytes:
    return encode_records([Record(v) for v in values], APPEND_MS + i)


@settings(max_examples=80, deadline=None)
@given(batches, st.booleans())
def test_a_batch_of_bare_values_decodes_as_its_entries_do(entries: list[list[bytes]], records: bool) -> None:
    payloads = [_records_entry(v, i) if records else pack(v) for i, v in enumerate(entries)]
    got = decode_values([memoryview(p) for p in payloads] if len(entries) % 2 else payloads, records)
    assert got is not None  # the batch path serves every valid bare-values batch
    got.value.validate(full=True)
    assert got.value.to_pylist() == [v for p in payloads for v in unpack(p)]
    assert got.entry_index.to_pylist() == [i for i, v in enumerate(entries) for _ in v]
    assert got.batch_index.to_pylist() == [j for v in entries for j in range(len(v))]
    if records:
        assert got.append_ms is not None
        assert got.append_ms.to_pylist() == [decode_records(p).append_timestamp for p in payloads]
    else:
        assert got.append_ms is None


@settings(max_examples=40, deadline=None)
@given(batches)
def test_unpack_of_a_batch_matches_unpack_entry_by_entry(entries: list[list[bytes]]) -> None:
    got = [LedgerEntry(7, 3 + i, _records_entry(v, i)) for i, v in enumerate(entries)]
    fast = _unpack_entries(PART, got, True)
    slow = _slow_unpack(got)
    assert isinstance(fast[0], pa.Array) and fast[0].to_pylist() == slow[0]
    assert isinstance(fast[1], pa.Array) and fast[1].to_pylist() == slow[1]
    for col in ("value", "key", "timestamp", "timestamp_type", "headers"):
        a, b = getattr(fast[2], col), getattr(slow[2], col)
        assert (a is None and b is None) or a.to_pylist() == b.to_pylist(), col


def _slow_unpack(entries: list[LedgerEntry]) -> tuple[list[int], list[int], record_columns.RecordColumns]:
    saved = record_columns.decode_values
    record_columns.decode_values = lambda *_a: None  # type: ignore[assignment]
    try:
        ids, index, cols = _unpack_entries(PART, entries, True)
    finally:
        record_columns.decode_values = saved
    assert isinstance(ids, list) and isinstance(index, list)
    return ids, index, cols


def _patched(entry: bytes, pos: int, fmt: str, value: int) -> bytes:
    out = bytearray(entry)
    struct.pack_into(fmt, out, pos, value)
    return bytes(out)


GOOD = _records_entry([b"abc", b"de", b"f"], 0)  # header 20, offsets at 20..36 (0, 3, 5, 6), data
BROKEN = {
    "first offset not 0": _patched(GOOD, 20, "<I", 1),
    "middle offset beyond the end": _patched(GOOD, 24, "<I", 9),
    "offsets out of order": _patched(_patched(GOOD, 24, "<I", 4), 28, "<I", 2),
    "last offset short of the data": _patched(GOOD, 32, "<I", 5),
    "last offset beyond the data": _patched(GOOD, 32, "<I", 7),
    "count too big": _patched(GOOD, 4, "<I", 9),
    "count 0": _patched(GOOD, 4, "<I", 0),
    "magic": b"VRX\x01" + GOOD[4:],
    "trailing byte": GOOD + b"x",
    "truncated header": GOOD[:10],
    "unknown flag": _patched(GOOD, 8, "<I", 64),
}


@pytest.mark.parametrize("what", sorted(BROKEN))
def test_a_broken_entry_fails_as_it_does_alone(what: str) -> None:
    """Next to good entries, a broken one makes the batch path step aside; the entry-by-entry
    path then raises what it raises for that entry alone (naming the ledger and the entry)."""
    bad = BROKEN[what]
    assert decode_values([GOOD, bad, GOOD], True) is None
    entries = [LedgerEntry(7, 10, GOOD), LedgerEntry(7, 11, bad), LedgerEntry(7, 12, GOOD)]
    with pytest.raises((CorruptionError, UnknownFormatVersionError)) as alone:
        _slow_unpack([LedgerEntry(7, 11, bad)])
    with pytest.raises(type(alone.value)) as batched:
        _unpack_entries(PART, entries, True)
    assert str(batched.value) == str(alone.value) and "ledger 7 entry 11" in str(batched.value)


ONE = _records_entry([b"abc"], 0)  # one record (what a producer writes): header 20, offsets 20..28 (0, 3), data
BROKEN_ONE = {
    "first offset not 0": _patched(ONE, 20, "<I", 1),
    "last offset short of the data": _patched(ONE, 24, "<I", 2),
    "last offset beyond the data": _patched(ONE, 24, "<I", 9),
    "trailing byte": ONE + b"x",
    "no data": ONE[:28],
    "offsets cut": ONE[:26],
    "count 0": _patched(ONE, 4, "<I", 0),
    "count 2": _patched(ONE, 4, "<I", 2),
    "magic": b"VRX\x01" + ONE[4:],
    "unknown flag": _patched(ONE, 8, "<I", 64),
}


@pytest.mark.parametrize("what", sorted(BROKEN_ONE))
def test_a_broken_one_record_entry_fails_as_it_does_alone(what: str) -> None:
    """One-record entries have a shortcut of their own in the batch path: a broken one among
    good ones still makes it step aside, and the entry path names it."""
    bad = BROKEN_ONE[what]
    assert decode_values([ONE, ONE], True) is not None
    assert decode_values([ONE, bad, ONE], True) is None
    entries = [LedgerEntry(7, 10, ONE), LedgerEntry(7, 11, bad), LedgerEntry(7, 12, ONE)]
    with pytest.raises((CorruptionError, UnknownFormatVersionError)) as alone:
        _slow_unpack([LedgerEntry(7, 11, bad)])
    with pytest.raises(type(alone.value)) as batched:
        _unpack_entries(PART, entries, True)
    assert str(batched.value) == str(alone.value) and "ledger 7 entry 11" in str(batched.value)


def test_bare_entries_around_keyed_ones_get_null_keys_and_append_times() -> None:
    """Key and timestamp sections are built only from the first entry that has one: the bare
    entries before it and after it read as null keys and append-time timestamps."""
    bare = [_records_entry([b"a"], 1), _records_entry([b"b", b"c"], 2)]
    keyed = encode_records([Record(b"d", key=b"k")], APPEND_MS + 3)
    timed = encode_records([Record(b"e", timestamp=5), Record(b"f")], APPEND_MS + 4)
    payloads = [*bare, keyed, bare[0], timed, bare[1]]
    got = [LedgerEntry(7, 3 + i, p) for i, p in enumerate(payloads)]
    assert decode_values(payloads, True) is not None
    fast = _unpack_entries(PART, got, True)
    slow = _slow_unpack(got)
    assert fast[2].value.to_pylist() == [b"a", b"b", b"c", b"d", b"a", b"e", b"f", b"b", b"c"]
    assert fast[2].key.to_pylist() == [None, None, None, b"k", None, None, None, None, None]
    for col in ("value", "key", "timestamp", "timestamp_type"):
        assert getattr(fast[2], col).to_pylist() == getattr(slow[2], col).to_pylist(), col


def test_rows_v1_broken_entry_fails_as_it_does_alone() -> None:
    good = pack([b"ab", b"c"])
    bad = _patched(good, 16, "<I", 9)  # offsets 0, 2, 9 over 3 bytes of data
    assert decode_values([good, good], False) is not None
    assert decode_values([good, bad], False) is None
    with pytest.raises(CorruptionError, match=r"ledger 7 entry 1: packed entry offsets run 0\.\.9"):
        _unpack_entries(PART, [LedgerEntry(7, 0, good), LedgerEntry(7, 1, bad)], False)


def test_entries_with_headers_take_the_entry_path() -> None:
    keyed = encode_records([Record(b"v", key=b"k")], APPEND_MS)
    headed = encode_records([Record(b"v", headers=(("h", b"x"),))], APPEND_MS)
    assert decode_values([GOOD, keyed], True) is not None
    assert decode_values([GOOD, headed], True) is None
    got = [LedgerEntry(7, 1, GOOD), LedgerEntry(7, 2, keyed), LedgerEntry(7, 3, headed)]
    ids, _index, cols = _unpack_entries(PART, got, True)
    assert ids == [101, 101, 101, 102, 103]
    assert cols.key is not None and cols.key.to_pylist() == [None, None, None, b"k", None]
    assert cols.headers is not None and cols.headers.to_pylist()[-1] == [{"key": "h", "value": b"x"}]


keyed_records = st.builds(
    Record,
    value=st.binary(max_size=20),
    key=st.none() | st.binary(max_size=10),
    timestamp=st.none() | st.integers(0, 4_102_444_800_000),
)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(keyed_records, min_size=1, max_size=12), min_size=1, max_size=10))
def test_records_with_keys_and_timestamps_decode_as_entry_by_entry(entries: list[list[Record]]) -> None:
    got = [LedgerEntry(7, 3 + i, encode_records(recs, APPEND_MS + i)) for i, recs in enumerate(entries)]
    assert decode_values([e.payload for e in got], True) is not None
    fast = _unpack_entries(PART, got, True)
    slow = _slow_unpack(got)
    assert fast[0].to_pylist() == slow[0] and fast[1].to_pylist() == slow[1]
    for col in ("value", "key", "timestamp", "timestamp_type"):
        a, b = getattr(fast[2], col), getattr(slow[2], col)
        if a is None or b is None:  # a column no entry has: null either way
            assert (a is None or a.null_count == len(a)) and (b is None or b.null_count == len(b)), col
        else:
            assert a.to_pylist() == b.to_pylist(), col


KEYED = encode_records([Record(b"ab", key=b"k1", timestamp=7), Record(b"c", key=None, timestamp=None)], 0)
# header 20, value offsets 20..32 (0, 2, 3), key validity 32, key offsets 33..45 (0, 2, 2),
# timestamp validity 45, timestamps 46..62, then values (3 bytes) and keys (2 bytes)


@pytest.mark.parametrize(("what", "bad"), [
    ("key offsets not from 0", _patched(KEYED, 33, "<I", 1)),
    ("key offsets beyond the keys", _patched(KEYED, 41, "<I", 9)),
    ("key offsets out of order", _patched(KEYED, 37, "<I", 3)),
    ("timestamp beyond Spark", _patched(KEYED, 46, "<q", 2**62)),
    ("truncated", KEYED[:-1]),
])
def test_a_broken_keyed_entry_fails_as_it_does_alone(what: str, bad: bytes) -> None:
    entries = [LedgerEntry(7, 10, KEYED), LedgerEntry(7, 11, bad)]
    with pytest.raises((CorruptionError, UnknownFormatVersionError)) as alone:
        _slow_unpack([LedgerEntry(7, 11, bad)])
    with pytest.raises(type(alone.value)) as batched:
        _unpack_entries(PART, entries, True)
    assert str(batched.value) == str(alone.value) and "ledger 7 entry 11" in str(batched.value), what


@settings(max_examples=40, deadline=None)
@given(st.lists(st.binary(max_size=50), max_size=30))
def test_plain_payloads_become_one_binary_column(values: list[bytes]) -> None:
    payloads = [memoryview(v) if i % 2 else v for i, v in enumerate(values)]
    column = binary_column(payloads)
    column.validate(full=True)
    assert column.type == pa.binary() and column.to_pylist() == values


@pytest.mark.parametrize("ids", [range(3, 9), range(3, 20, 3), [4, 9, 10]])
def test_global_ids_are_the_ledger_ids_shifted_by_the_segment_base(ids: Any) -> None:
    """Every id of a range (a strided one too) or list, plus the segment's first global id."""
    assert record_columns.global_ids(ids, 100).to_pylist() == [i + 100 for i in ids]
