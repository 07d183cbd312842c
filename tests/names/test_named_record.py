"""The named-ledger record: readable, versioned serialization; names; segment lookup."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vellum.client.named import (
    NamedLedgerRecord,
    Segment,
    deserialize_record,
    serialize_record,
    validate_name,
)
from vellum.errors import IncorrectParameterError, MetaStoreError
from vellum.format.entry import DigestType


def _record(**kw: object) -> NamedLedgerRecord:
    base: dict[str, object] = dict(
        name="tenant/ns/log", digest_type=DigestType.CRC32C, password=b"pw\x00", ensemble_size=3,
        write_quorum_size=2, ack_quorum_size=2,
        segments=(Segment(7, 0, 9, 120, 1), Segment(9, 10, None, 0, 2, 3, 2, 2, {0: ("a:1", "b:1", "c:1")})),
        writer_epoch=2, writer="host:1", start_entry_id=3, trimmed_to=0, cursors={"sink": b"batch-4"},
        ctime_ms=1, custom_metadata={"k": b"v"},
    )
    base.update(kw)
    return NamedLedgerRecord(**base)  # type: ignore[arg-type]


def test_round_trip_and_readable() -> None:
    rec = _record()
    data = serialize_record(rec)
    header, body = data.split(b"\n", 1)
    assert header == b"VellumNamedLedger\t1"
    doc = json.loads(body)
    assert doc["segments"][0] == {"ledgerId": 7, "firstEntryId": 0, "state": "CLOSED", "epoch": 1,
                                  "lastEntryId": 9, "length": 120}
    assert doc["segments"][1]["ensembles"] == {"0": ["a:1", "b:1", "c:1"]}
    assert deserialize_record(data, where="test") == rec


@given(
    start=st.integers(0, 1000),
    cursors=st.dictionaries(st.text(min_size=1, max_size=5), st.binary(max_size=20), max_size=3),
    password=st.binary(max_size=16),
)
def test_round_trip_property(start: int, cursors: dict[str, bytes], password: bytes) -> None:
    rec = _record(start_entry_id=start, cursors=cursors, password=password)
    assert deserialize_record(serialize_record(rec), where="t") == rec


def test_newer_version_foreign_and_malformed_are_refused() -> None:
    data = serialize_record(_record())
    with pytest.raises(MetaStoreError, match="newer"):
        deserialize_record(data.replace(b"\t1\n", b"\t2\n", 1), where="t")
    with pytest.raises(MetaStoreError, match="not a named-ledger record"):
        deserialize_record(b"VellumLedgerMetadata\t1\n{}", where="t")
    with pytest.raises(MetaStoreError, match="malformed"):
        deserialize_record(b"VellumNamedLedger\t1\n{\"name\": 1}", where="t")


def test_segment_lookup() -> None:
    rec = _record()
    assert rec.segment_for(0).ledger_id == 7  # type: ignore[union-attr]
    assert rec.segment_for(9).ledger_id == 7  # type: ignore[union-attr]
    assert rec.segment_for(10).ledger_id == 9  # type: ignore[union-attr]
    assert rec.segment_for(10**6).ledger_id == 9  # type: ignore[union-attr]
    assert rec.state == "OPEN"
    closed = _record(segments=(Segment(7, 0, 9, 120, 1),))
    assert closed.segment_for(10) is None
    assert closed.closed_end == 10
    assert closed.state == "CLOSED"


@pytest.mark.parametrize("bad", ["", "/a", "a//b", "a/./b", "a/../b", "a b", "a/b/", "ü"])
def test_bad_names(bad: str) -> None:
    with pytest.raises(IncorrectParameterError):
        validate_name(bad)


def test_good_names() -> None:
    for good in ["log", "tenant/ns/log", "a.b/c-d_e/f~g:h@i=j+k"]:
        assert validate_name(good) == good
