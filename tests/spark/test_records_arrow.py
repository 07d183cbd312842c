"""The source's Arrow columns of packed entries, without Spark: every records-v1 entry (and a mix
with rows-v1 entries) turns into the columns its records say, whatever the records hold."""

from __future__ import annotations

import datetime
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vellum.client.ledger_reader import LedgerEntry
from vellum.errors import CorruptionError
from vellum.format.records import Record, encode_records, pack
from vellum.spark.datasource import read_schema
from vellum.spark.reader import EntryRange, _batch
from vellum.spark.record_columns import RecordColumns, unpack

records = st.builds(
    Record,
    value=st.binary(max_size=30),
    key=st.none() | st.binary(max_size=10),
    timestamp=st.none() | st.integers(0, 4_102_444_800_000),  # up to year 2100
    headers=st.lists(st.tuples(st.text(max_size=5), st.binary(max_size=5)), max_size=3).map(tuple),
)
APPEND_MS = 1_750_000_000_000
def _unpack_entries(part: EntryRange, entries: list[LedgerEntry], records: bool) -> Any:
    return unpack(part.ledger_id, part.base, [e.entry_id for e in entries], [e.payload for e in entries], records)


PART = EntryRange("n", 7, 100, 100, 200, b"")


def _pylist(values: list[int] | pa.Array) -> list[int]:
    """Row ids and indexes come as Arrow arrays from the batch path, as lists entry by entry."""
    return values if isinstance(values, list) else values.to_pylist()


def _utc(ms: int) -> datetime.datetime:
    return datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(milliseconds=ms)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(records, min_size=1, max_size=6), min_size=1, max_size=4))
def test_records_entries_become_their_columns(entries: list[list[Record]]) -> None:
    got = [LedgerEntry(7, i, encode_records(recs, APPEND_MS)) for i, recs in enumerate(entries)]
    ids, index, cols = _unpack_entries(PART, got, True)
    flat = [r for recs in entries for r in recs]
    assert _pylist(ids) == [100 + i for i, recs in enumerate(entries) for _ in recs]
    assert _pylist(index) == [j for recs in entries for j in range(len(recs))]
    batch = _batch(_arrow_schema(), "n", 7, ids, index, cols, None).to_pydict()
    assert batch["value"] == batch["payload"] == [r.value for r in flat]
    assert batch["key"] == [r.key for r in flat]
    assert batch["timestamp"] == [_utc(APPEND_MS if r.timestamp is None else r.timestamp) for r in flat]
    assert batch["timestampType"] == [1 if r.timestamp is None else 0 for r in flat]
    assert batch["headers"] == [[{"key": k, "value": v} for k, v in r.headers] or None for r in flat]


def test_rows_v1_entries_have_null_record_columns() -> None:
    got = [LedgerEntry(7, 0, encode_records([Record(b"r", b"k", 5, (("h", b"v"),))], APPEND_MS))]
    _ids, _index, cols = _unpack_entries(PART, got, True)
    old_ids, old_index, old = _unpack_entries(PART, [LedgerEntry(7, 1, pack([b"a", b"b"]))], False)
    assert (old.key, old.timestamp, old.headers) == (None, None, None)
    batch = _batch(_arrow_schema(), "n", 7, old_ids, old_index, old, None).to_pydict()
    assert batch["value"] == [b"a", b"b"] and batch["key"] == [None, None] and batch["timestamp"] == [None, None]
    assert batch["headers"] == [None, None] and batch["timestampType"] == [None, None]
    assert cols.key is not None and cols.key.to_pylist() == [b"k"]


def test_corrupt_records_entry_names_ledger_and_entry() -> None:
    entry = bytearray(encode_records([Record(b"abc"), Record(b"de")], APPEND_MS))
    entry[24] = 9  # the middle value offset (3) beyond the end (5): Arrow's validation finds it
    with pytest.raises(CorruptionError, match="ledger 7 entry 3: packed entry value offsets are invalid"):
        _unpack_entries(PART, [LedgerEntry(7, 3, bytes(entry))], True)


def _arrow_schema() -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(read_schema(False, include_headers=True), timezone="UTC")


def test_plain_entries_have_null_record_columns() -> None:
    batch = _batch(_arrow_schema(), None, 7, [0, 1], [0, 0], RecordColumns([b"x", b"y"]), None).to_pydict()
    assert batch["value"] == [b"x", b"y"] and batch["key"] == [None, None] and batch["name"] == [None, None]


def test_timestamp_beyond_spark_is_a_clear_error() -> None:
    entry = encode_records([Record(b"v", timestamp=2**62)], APPEND_MS)
    with pytest.raises(CorruptionError, match="ledger 7 entry 4: a record timestamp is beyond"):
        _unpack_entries(PART, [LedgerEntry(7, 4, entry)], True)
