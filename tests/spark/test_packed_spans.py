"""Packed entries decoded where they lie in a bulk read's answer (``PayloadSpans``): the same
rows as decoding the same payloads handed one by one, and an entry that fails any check there
(the bytes of the next entry right after it) makes the batch path step aside, so that the
entry path names it as before."""

from __future__ import annotations

from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_packed_arrow import BROKEN, BROKEN_ONE, GOOD, ONE, PART, _records_entry, _slow_unpack

from vellum.client.ledger_reader import LedgerEntry
from vellum.errors import CorruptionError, UnknownFormatVersionError
from vellum.format.entry import PayloadSpans
from vellum.format.records import pack
from vellum.spark import packed_arrow, record_columns
from vellum.spark.packed_arrow import binary_column, cut_spans, decode_values


def _answer(payloads: list[bytes], pieces: int = 1) -> PayloadSpans:
    """The payloads as a bulk read hands them: spans of ``pieces`` answers, each payload after
    a 36-byte entry header and digest."""
    parts = []
    for k in range(pieces):
        body = bytearray(b"\xee" * 32)
        starts, ends = array("q"), array("q")
        for p in payloads[k::pieces]:
            body += b"\xaa" * 36
            starts.append(len(body))
            body += p
            ends.append(len(body))
        parts.append((k, pieces, PayloadSpans.in_one(memoryview(bytes(body)), starts, ends)))
    return PayloadSpans.interleave(len(payloads), [p for p in parts if len(p[2])])


def _same(a: object, b: object) -> None:
    assert (a is None) == (b is None)
    if a is None or b is None:
        return
    for col in ("rows", "value", "entry_index", "batch_index", "append_ms", "key", "event_ms", "given"):
        x, y = getattr(a, col), getattr(b, col)
        assert (x is None and y is None) or x == y or x.to_pylist() == y.to_pylist(), col


values = st.lists(st.lists(st.binary(max_size=60), min_size=1, max_size=4), min_size=1, max_size=20)


@settings(max_examples=80, deadline=None)
@given(values, st.booleans(), st.integers(1, 3))
def test_spans_decode_as_the_payloads_one_by_one(entries: list[list[bytes]], records: bool, pieces: int) -> None:
    payloads = [_records_entry(v, i) if records else pack(v) for i, v in enumerate(entries)]
    spans = _answer(payloads, pieces)
    got = decode_values(spans, records)
    assert got is not None
    assert packed_arrow._decode_bare_spans(spans, records) is not None  # served where it lies
    _same(got, decode_values(payloads, records))


@pytest.mark.parametrize("what", sorted(BROKEN) + sorted(f"one: {k}" for k in BROKEN_ONE))
def test_a_broken_entry_in_an_answer_fails_as_it_does_alone(what: str) -> None:
    good, bad = (ONE, BROKEN_ONE[what[5:]]) if what.startswith("one: ") else (GOOD, BROKEN[what])
    spans = _answer([good, bad, good])
    assert decode_values(_answer([good, good]), True) is not None
    assert decode_values(spans, True) is None
    with pytest.raises((CorruptionError, UnknownFormatVersionError)) as alone:
        _slow_unpack([LedgerEntry(7, 11, bad)])
    with pytest.raises(type(alone.value)) as batched:
        record_columns.unpack(PART.ledger_id, PART.base, [10, 11, 12], spans, True)
    assert str(batched.value) == str(alone.value) and "ledger 7 entry 11" in str(batched.value)


def test_mixed_one_record_and_many_record_entries_of_mixed_sizes() -> None:
    payloads = [_records_entry([b"x" * (i * 97 % 1500)] * (1 + i % 3), i) for i in range(40)]
    _same(decode_values(_answer(payloads, 3), True), decode_values(payloads, True))


one_row = st.lists(st.binary(max_size=60), min_size=1, max_size=30)


@settings(max_examples=80, deadline=None)
@given(one_row, st.booleans(), st.integers(1, 3))
def test_one_row_entries_are_decoded_as_columns(rows: list[bytes], records: bool, pieces: int) -> None:
    """What a producer writes (one record per entry): decoded with no work per entry, the same
    rows as the per-entry passes give."""
    payloads = [_records_entry([v], i) if records else pack([v]) for i, v in enumerate(rows)]
    spans = _answer(payloads, pieces)
    got = packed_arrow._decode_single_rows(spans, records)
    assert got is not None
    _same(got, packed_arrow._decode_bare_spans(spans, records))
    _same(decode_values(spans, records), decode_values(payloads, records))


def test_a_many_row_entry_among_one_row_entries_goes_the_per_entry_way() -> None:
    payloads = [_records_entry([b"a"], 0), _records_entry([b"b", b"c"], 1), _records_entry([b"d"], 2)]
    spans = _answer(payloads, 2)
    assert packed_arrow._decode_single_rows(spans, True) is None
    _same(decode_values(spans, True), decode_values(payloads, True))


@pytest.mark.parametrize("what", ["magic", "count 2", "first offset not 0", "last offset short", "trailing byte",
                                  "cut"])
def test_a_broken_one_row_plain_packed_entry_in_an_answer_steps_aside(what: str) -> None:
    good = pack([b"abc"])  # magic, count 1, offsets (0, 3), data
    bad = {"magic": b"VRX\x01" + good[4:], "count 2": good[:4] + (2).to_bytes(4, "little") + good[8:],
           "first offset not 0": good[:8] + (1).to_bytes(4, "little") + good[12:],
           "last offset short": good[:12] + (2).to_bytes(4, "little") + good[16:],
           "trailing byte": good + b"x", "cut": good[:14]}[what]
    assert decode_values(_answer([good, good]), False) is not None
    assert packed_arrow._decode_single_rows(_answer([good, bad, good]), False) is None
    assert decode_values(_answer([good, bad, good]), False) is None


items = st.lists(st.binary(max_size=50), max_size=25)


@settings(max_examples=80, deadline=None)
@given(items, st.integers(0, 12), st.integers(1, 3))
def test_cut_spans_gathers_heads_and_rests_in_item_order(values: list[bytes], cut: int, pieces: int) -> None:
    spans = _answer(values, pieces) if values else PayloadSpans.of([])
    got = cut_spans(spans, cut)
    if not values or min(map(len, values)) < cut:
        assert got is None
        return
    assert got is not None
    heads, rest = got
    assert bytes(heads) == b"".join(v[:cut] for v in values)
    rest.validate(full=True)
    assert rest.to_pylist() == [v[cut:] for v in values]
    assert binary_column(spans).to_pylist() == values == binary_column(values).to_pylist()


def test_cut_spans_refuses_overlapping_items() -> None:
    body = memoryview(b"0123456789")
    spans = PayloadSpans.in_one(body, array("q", [0, 3]), array("q", [5, 8]))
    assert cut_spans(spans, 0) is None
    assert binary_column(spans).to_pylist() == [b"01234", b"34567"]  # the per-item way still serves them
