"""LedgerMetadata and layout: round trips and clear rejection of bad bytes (no store needed)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vellum.errors import IncorrectParameterError, MetaStoreError
from vellum.meta.model import (
    DigestType,
    LedgerLayout,
    LedgerMetadata,
    LedgerState,
    deserialize_ledger_metadata,
    serialize_ledger_metadata,
)
from vellum.meta.paths import flat_ledger_path, hierarchical_ledger_path, validate_kv_key


def md(**kw: object) -> LedgerMetadata:
    base: dict[str, object] = dict(
        ensemble_size=3, write_quorum_size=2, ack_quorum_size=2,
        ensembles={0: ("b1:3181", "b2:3181", "b3:3181")}, password=b"secret",
    )
    base.update(kw)
    return LedgerMetadata(**base)  # type: ignore[arg-type]


@given(
    password=st.binary(max_size=40),
    custom=st.dictionaries(st.text(max_size=10), st.binary(max_size=20), max_size=4),
    last=st.integers(-1, 1 << 62),
    state=st.sampled_from(list(LedgerState)),
    digest=st.sampled_from(list(DigestType)),
    changes=st.lists(st.integers(1, 1000), max_size=4, unique=True),
)
def test_round_trip(password: bytes, custom: dict[str, bytes], last: int, state: LedgerState,
                    digest: DigestType, changes: list[int]) -> None:
    m = md(password=password, custom_metadata=custom, last_entry_id=last, length=max(last, 0) * 10,
           state=state, digest_type=digest, ctime_ms=1234, creator_token=-5)
    for i, first in enumerate(sorted(changes)):
        m = m.with_ensemble(first, (f"x{i}:1", "b2:3181", "b3:3181"))
    data = serialize_ledger_metadata(m)
    assert data.startswith(b"VellumLedgerMetadata\t1\n")
    assert deserialize_ledger_metadata(data, where="t") == m


@given(
    password=st.binary(max_size=12),
    custom=st.dictionaries(st.text(max_size=6), st.binary(max_size=8), max_size=3),
    bookies=st.lists(st.text(min_size=1, max_size=8), min_size=3, max_size=3, unique=True),
    last=st.integers(-1, 1 << 62),
    changes=st.lists(st.integers(1, 1000), max_size=3, unique=True),
)
def test_serialized_body_is_the_indented_json_dump(password: bytes, custom: dict[str, bytes], bookies: list[str],
                                                   last: int, changes: list[int]) -> None:
    # serialize_ledger_metadata writes the body itself (json's indented encoder is Python): the
    # bytes must be json.dumps(to_json_dict(), indent=1), escapes of any text included
    m = md(password=password, custom_metadata=custom, last_entry_id=last, length=max(last, 0) * 3,
           ensembles={0: tuple(bookies)}, ctime_ms=1234, creator_token=-5)
    for first in sorted(changes):
        m = m.with_ensemble(first, tuple(reversed(bookies)))
    for value in (m, m.closed(last, 7)):
        expected = f"VellumLedgerMetadata\t1\n{json.dumps(value.to_json_dict(), indent=1)}\n".encode()
        assert serialize_ledger_metadata(value) == expected


def test_serialized_numbers_of_other_types_are_as_json_writes_them() -> None:
    m = md(ctime_ms=True)  # not made by this module, but json writes a bool as true
    expected = f"VellumLedgerMetadata\t1\n{json.dumps(m.to_json_dict(), indent=1)}\n".encode()
    assert b'"ctime": true' in expected and serialize_ledger_metadata(m) == expected


def test_fields_are_normalized() -> None:
    m = md(state=3, digest_type=int(DigestType.CRC32), password=bytearray(b"pw"), custom_metadata={"k": bytearray(b"v")},
           ensembles={0: ["b1:3181", "b2:3181", "b3:3181"]})
    assert m.state is LedgerState.CLOSED and m.digest_type is DigestType.CRC32
    assert type(m.password) is bytes and type(m.custom_metadata["k"]) is bytes
    assert type(m.ensembles[0]) is tuple and all(type(b) is str for b in m.ensembles[0])


def test_transitions_are_what_dataclasses_replace_gives_and_are_checked() -> None:
    # the helpers copy the fields themselves (LedgerMetadata._replace): the same values, and
    # still normalized and checked by __post_init__
    m = md(custom_metadata={"k": b"v"}, ctime_ms=7)
    for got, expected in [
        (m.with_ensemble(10, ["b4:1", "b2:3181", "b3:3181"]),
         dataclasses.replace(m, ensembles={**m.ensembles, 10: ("b4:1", "b2:3181", "b3:3181")})),
        (m.in_recovery(), dataclasses.replace(m, state=LedgerState.IN_RECOVERY)),
        (m.closed(41, 4200), dataclasses.replace(m, state=LedgerState.CLOSED, last_entry_id=41, length=4200)),
    ]:
        assert got == expected and vars(got) == vars(expected)
        assert type(got.ensembles[max(got.ensembles)]) is tuple
    with pytest.raises(IncorrectParameterError, match="lastEntryId/length"):
        m.closed(-2, 0)
    with pytest.raises(IncorrectParameterError, match="distinct bookies"):
        m.with_ensemble(10, ["b4:1", "b4:1", "b3:3181"])


def test_serialization_is_readable_and_password_is_in_clear() -> None:
    text = serialize_ledger_metadata(md()).decode()
    assert '"state": "OPEN"' in text and '"digestType": "CRC32C"' in text
    assert '"password": "c2VjcmV0"' in text  # base64 of b"secret": stored in clear, as BookKeeper does


def test_ensemble_for_and_transitions() -> None:
    m = md().with_ensemble(10, ("b4:1", "b2:3181", "b3:3181"))
    assert m.ensemble_for(9)[0] == "b1:3181" and m.ensemble_for(10)[0] == "b4:1"
    c = m.in_recovery().closed(41, 4200)
    assert c.is_closed and c.last_entry_id == 41 and m.state is LedgerState.OPEN


@pytest.mark.parametrize(
    "kw",
    [
        dict(ensemble_size=2),  # E < WQ
        dict(ack_quorum_size=3),  # AQ > WQ
        dict(ensembles={}),
        dict(ensembles={1: ("a:1", "b:1", "c:1")}),
        dict(ensembles={0: ("a:1", "a:1", "c:1")}),
    ],
)
def test_invalid_metadata_is_rejected(kw: dict[str, object]) -> None:
    with pytest.raises(IncorrectParameterError):
        md(**kw)


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (b"VellumLedgerMetadata\t2\n{}", "newer"),
        (b"BookieMetadataFormatVersion\t3\n\x08\x02", "BookKeeper's own"),
        (b"\x00\x01garbage", "not Vellum ledger metadata"),
        (b"VellumLedgerMetadata\t1\n{not json", "not valid JSON"),
        (b'VellumLedgerMetadata\t1\n{"ensembleSize": 3}', "lacks"),
        (b"VellumLedgerMetadata\t1\n[]", "JSON object"),
    ],
)
def test_bad_bytes_name_the_place(data: bytes, needle: str) -> None:
    with pytest.raises(MetaStoreError) as e:
        deserialize_ledger_metadata(data, where="znode /ledgers/00/0000/L0001")
    assert needle in str(e.value) and "/ledgers/00/0000/L0001" in str(e.value)


def test_paths() -> None:
    assert hierarchical_ledger_path("/ledgers", 1) == "/ledgers/00/0000/L0001"
    assert hierarchical_ledger_path("/ledgers", 1234567890) == "/ledgers/12/3456/L7890"
    assert hierarchical_ledger_path("/ledgers", 1 << 31) == "/ledgers/000/0000/0021/4748/L3648"
    assert flat_ledger_path("/ledgers", 42) == "/ledgers/L0000000042"


def test_layout_text_and_errors() -> None:
    lay = LedgerLayout("hierarchical")
    assert lay.serialize() == b"2\norg.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory:1"
    assert LedgerLayout.parse(lay.serialize(), where="x") == lay
    with pytest.raises(MetaStoreError, match="/ledgers/LAYOUT"):
        LedgerLayout.parse(b"2\norg.example.Other:1", where="/ledgers/LAYOUT")
    with pytest.raises(MetaStoreError, match="newer"):
        LedgerLayout.parse(b"3\norg.apache.bookkeeper.meta.FlatLedgerManagerFactory:1", where="x")


@pytest.mark.parametrize("key", ["", "a//b", "/a", "a/../b", "a b", "x" * 1025])
def test_bad_kv_keys(key: str) -> None:
    with pytest.raises(IncorrectParameterError):
        validate_kv_key(key)
