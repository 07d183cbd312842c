"""RocksDB key/value layouts of DbLedgerStorage and the hand-written LedgerData protobuf."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vellum.errors import CorruptionError
from vellum.format import ledger_index as li

i64 = st.integers(-(2**63), 2**63 - 1)


@given(i64, i64, st.integers(0, 2**63 - 1))
def test_location_key_and_value_round_trip(lid: int, eid: int, loc: int) -> None:
    key = li.location_key(lid, eid)
    assert len(key) == 16 and li.decode_location_key(key) == (lid, eid)
    assert li.decode_location(li.encode_location(loc)) == loc
    assert li.decode_ledger_key(li.ledger_key(lid)) == lid


def test_exact_bytes() -> None:
    assert li.location_key(1, 2).hex() == "00000000000000010000000000000002"
    assert li.encode_location((3 << 32) | 1028).hex() == "0000000300000404"
    assert li.STORAGE_FLAGS_KEY.hex() == "ffffffffffff1103"
    data = li.LedgerData(exists=True, fenced=False, master_key=b"\x01\x02")
    assert data.encode().hex() == "080110001a020102"
    full = li.LedgerData(exists=True, fenced=True, master_key=b"", explicit_lac=b"ab", limbo=True)
    assert full.encode().hex() == "080110011a00220261622801"


def test_bytewise_order_puts_negative_ids_last() -> None:
    keys = sorted(
        [li.location_key(5, -1), li.location_key(5, 0), li.location_key(5, 2**63 - 1), li.location_key(6, 0)]
    )
    assert keys == [
        li.location_key(5, 0),
        li.location_key(5, 2**63 - 1),
        li.location_key(5, -1),
        li.location_key(6, 0),
    ]
    assert li.ledger_upper_key(5) == li.location_key(5, 2**63 - 1)


@given(
    st.booleans(),
    st.booleans(),
    st.binary(max_size=40),
    st.none() | st.binary(max_size=300),
    st.none() | st.booleans(),
    st.none() | st.sampled_from([li.DIGEST_NOT_CHECKABLE, 1, 3]),
)
def test_ledger_data_round_trip(
    exists: bool, fenced: bool, key: bytes, lac: bytes | None, limbo: bool | None, digest_type: int | None
) -> None:
    data = li.LedgerData(exists, fenced, key, lac, limbo, digest_type)
    assert li.LedgerData.decode(data.encode()) == data


def test_vellum_digest_type_is_field_100_and_optional() -> None:
    data = li.LedgerData(exists=True, fenced=False, master_key=b"\x01\x02", digest_type=3)
    # tag (100 << 3 | 0) = 800 is the varint a0 06; a reader without the field skips it
    assert data.encode().hex() == "080110001a020102" + "a00603"
    assert li.LedgerData.decode(bytes.fromhex("080110001a020102")).digest_type is None


def test_unknown_fields_are_skipped() -> None:
    base = li.LedgerData(exists=True, fenced=True, master_key=b"k").encode()
    extra = (
        bytes([0x30, 0x96, 0x01])  # field 6 varint 150
        + bytes([0x3A, 0x03])
        + b"xyz"  # field 7 bytes
        + bytes([0x41])
        + bytes(8)  # field 8 fixed64
        + bytes([0x4D])
        + bytes(4)  # field 9 fixed32
    )
    assert li.LedgerData.decode(extra + base + extra) == li.LedgerData(True, True, b"k")


@pytest.mark.parametrize(
    "raw",
    [
        bytes([0x08, 0x01, 0x10, 0x00]),  # masterKey missing
        bytes([0x08, 0x01, 0x10, 0x00, 0x1A, 0x05, 0x01]),  # length past the end
        bytes([0x08, 0xFF]),  # truncated varint
        bytes([0x0B]),  # group wire type
    ],
)
def test_malformed_ledger_data(raw: bytes) -> None:
    with pytest.raises(CorruptionError):
        li.LedgerData.decode(raw, where="ledgers key 7")


def test_storage_flags_and_bad_sizes() -> None:
    assert li.decode_storage_flags(li.encode_storage_flags(li.NEEDS_INTEGRITY_CHECK)) == 1
    with pytest.raises(CorruptionError):
        li.decode_location(b"\x00" * 7)
    with pytest.raises(CorruptionError):
        li.decode_location_key(b"\x00" * 15)
