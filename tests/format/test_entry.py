"""The stored entry format: digests, verification, LAC bodies, master keys (format/entry.py)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vellum.errors import CorruptionError, DigestMismatchError, IncorrectParameterError
from vellum.format.entry import (
    ENTRY_HEADER_SIZE,
    DigestManager,
    DigestType,
    Entry,
    checksum_matches,
    checksums_match,
    digest_length,
    mac_key,
    master_key,
    parse_entry_header,
    sniff_checksum,
)

INT64 = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
CHECKED = [DigestType.CRC32, DigestType.CRC32C, DigestType.HMAC]

# bookkeeper.md §2.1: ledger 1, entry 0, LAC -1, length 5, payload b"hello"
EXAMPLE_HEADER = bytes.fromhex("00000000000000010000000000000000ffffffffffffffff0000000000000005")


# -- worked example (bookkeeper.md §1.5, §2.1) -----------------------------------------------


@pytest.mark.parametrize(
    ("digest_type", "digest_hex"),
    [
        (DigestType.CRC32, "0000000030a56872"),
        (DigestType.CRC32C, "e3a5f74d"),
        (DigestType.HMAC, "00107b7f219e26462e04e16e6e7a7f41e046e090"),
        (DigestType.DUMMY, ""),
    ],
)
def test_worked_example(digest_type: DigestType, digest_hex: str) -> None:
    entry = DigestManager(1, digest_type, b"").compute(0, -1, 5, b"hello")
    assert entry == EXAMPLE_HEADER + bytes.fromhex(digest_hex) + b"hello"


def test_master_key_of_empty_password() -> None:
    assert master_key(b"").hex() == "850bf1071c5e3d8c24235676f8816ae0cbe2f14f"
    assert len(master_key(b"secret")) == 20
    assert master_key(b"a") != master_key(b"b")
    assert mac_key(b"") != master_key(b"")  # different prefixes: "mac" vs "ledger"


# -- digest types ------------------------------------------------------------------------------


def test_digest_lengths() -> None:
    assert [digest_length(t) for t in DigestType] == [8, 20, 4, 0]
    assert [int(t) for t in DigestType] == [1, 2, 3, 4]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("CRC32", DigestType.CRC32),
        ("crc32c", DigestType.CRC32C),
        ("Hmac", DigestType.HMAC),
        ("MAC", DigestType.HMAC),
        (" dummy ", DigestType.DUMMY),
    ],
)
def test_parse_digest_type(name: str, expected: DigestType) -> None:
    assert DigestType.parse(name) is expected


def test_parse_unknown_digest_type_names_the_choices() -> None:
    with pytest.raises(IncorrectParameterError, match=r"'SHA256'.*CRC32, CRC32C, HMAC"):
        DigestType.parse("SHA256")
    with pytest.raises(ValueError):  # also usable as a plain ValueError by config parsing
        DigestType.parse("")


# -- round trips -------------------------------------------------------------------------------


@given(
    digest_type=st.sampled_from(list(DigestType)),
    ledger_id=INT64,
    entry_id=INT64,
    lac=INT64,
    length=INT64,
    payload=st.binary(max_size=300),
    password=st.binary(max_size=10),
    wrap=st.sampled_from([bytes, bytearray, memoryview]),
)
def test_round_trip(
    digest_type: DigestType,
    ledger_id: int,
    entry_id: int,
    lac: int,
    length: int,
    payload: bytes,
    password: bytes,
    wrap: type,
) -> None:
    dm = DigestManager(ledger_id, digest_type, password)
    stored = dm.compute(entry_id, lac, length, wrap(payload))
    assert isinstance(stored, bytes)
    assert len(stored) == ENTRY_HEADER_SIZE + digest_length(digest_type) + len(payload)
    assert dm.compute_prefix(entry_id, lac, length, payload) + payload == stored
    assert parse_entry_header(stored) == (ledger_id, entry_id, lac, length)
    for view in (stored, memoryview(stored), bytearray(stored)):
        got = dm.verify(view, entry_id)
        assert got == Entry(ledger_id, entry_id, lac, length, payload)
        assert type(got.payload) is bytes
    assert dm.verify(stored) == got


@given(
    digest_type=st.sampled_from(list(DigestType)),
    ledger_id=INT64,
    lac=INT64,
    password=st.binary(max_size=10),
)
def test_lac_round_trip(digest_type: DigestType, ledger_id: int, lac: int, password: bytes) -> None:
    dm = DigestManager(ledger_id, digest_type, password)
    body = dm.compute_lac(lac)
    assert len(body) == 16 + digest_length(digest_type)
    assert dm.verify_lac(body) == lac
    assert dm.verify_lac(memoryview(body)) == lac


# -- corruption is detected --------------------------------------------------------------------


def _flip(data: bytes, bit: int) -> bytes:
    out = bytearray(data)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


@pytest.mark.parametrize("digest_type", CHECKED)
def test_every_single_bit_flip_of_an_entry_is_detected(digest_type: DigestType) -> None:
    dm = DigestManager(7, digest_type, b"pw")
    stored = dm.compute(3, 2, 100, b"payload of twenty b")
    assert dm.verify(stored).payload == b"payload of twenty b"
    for bit in range(len(stored) * 8):
        with pytest.raises(DigestMismatchError):
            dm.verify(_flip(stored, bit))


@pytest.mark.parametrize("digest_type", CHECKED)
def test_every_single_bit_flip_of_a_lac_body_is_detected(digest_type: DigestType) -> None:
    dm = DigestManager(7, digest_type, b"pw")
    body = dm.compute_lac(41)
    for bit in range(len(body) * 8):
        with pytest.raises(DigestMismatchError):
            dm.verify_lac(_flip(body, bit))


def test_dummy_checks_ids_but_not_payload() -> None:
    dm = DigestManager(7, DigestType.DUMMY)
    stored = dm.compute(3, 2, 1, b"x")
    # DUMMY has no digest: a flipped payload passes, by definition.
    assert dm.verify(_flip(stored, (len(stored) - 1) * 8)).payload == b"y"
    with pytest.raises(DigestMismatchError, match="ledger id 8"):
        dm.verify(b"\x00" * 7 + b"\x08" + stored[8:])
    with pytest.raises(DigestMismatchError, match="expected entry 4"):
        dm.verify(stored, 4)


def test_hmac_with_wrong_password_fails() -> None:
    stored = DigestManager(5, DigestType.HMAC, b"right").compute(0, -1, 3, b"abc")
    with pytest.raises(DigestMismatchError, match=r"ledger 5 entry 0: HMAC digest mismatch"):
        DigestManager(5, DigestType.HMAC, b"wrong").verify(stored)
    lac_body = DigestManager(5, DigestType.HMAC, b"right").compute_lac(9)
    with pytest.raises(DigestMismatchError):
        DigestManager(5, DigestType.HMAC, b"wrong").verify_lac(lac_body)


def test_crc_types_ignore_the_password() -> None:
    for digest_type in (DigestType.CRC32, DigestType.CRC32C):
        stored = DigestManager(5, digest_type, b"a").compute(0, -1, 3, b"abc")
        assert DigestManager(5, digest_type, b"b").verify(stored).payload == b"abc"


@pytest.mark.parametrize("digest_type", list(DigestType))
def test_a_verified_entry_is_an_entry_like_any_other(digest_type: DigestType) -> None:
    # verify makes its Entry through a class of Entry's layout (one that is not frozen), then
    # gives it its class: what comes out must be an Entry in every way.
    dm = DigestManager(5, digest_type, b"pw")
    got = dm.verify(dm.compute(4, 3, 7, b"payload"), 4)
    made = Entry(5, 4, 3, 7, b"payload")
    assert type(got) is Entry and got == made and hash(got) == hash(made)
    assert repr(got) == "Entry(ledger_id=5, entry_id=4, lac=3, length=7, payload=b'payload')"
    assert (got.ledger_id, got.entry_id, got.lac, got.length, got.payload) == (5, 4, 3, 7, b"payload")
    assert dataclasses.replace(got, lac=9) == Entry(5, 4, 9, 7, b"payload")
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.lac = 5  # type: ignore[misc]  # frozen: the assignment is what is tested


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_a_crc32c_entry_verifies_from_any_buffer_and_names_a_bad_digest(kind: type) -> None:
    dm = DigestManager(5, DigestType.CRC32C)
    stored = dm.compute(4, 3, 7, b"payload")
    assert dm.verify(kind(stored), 4) == Entry(5, 4, 3, 7, b"payload")
    assert type(dm.verify(kind(stored)).payload) is bytes
    bad = bytearray(stored)
    bad[-1] ^= 1
    with pytest.raises(DigestMismatchError, match=r"ledger 5 entry 4: CRC32C digest mismatch"):
        dm.verify(kind(bytes(bad)), 4)


def test_wrong_ledger_or_entry_id_is_named() -> None:
    stored = DigestManager(5, DigestType.CRC32C).compute(4, 3, 3, b"abc")
    with pytest.raises(DigestMismatchError, match=r"ledger 6: entry 4 carries ledger id 5"):
        DigestManager(6, DigestType.CRC32C).verify(stored)
    with pytest.raises(DigestMismatchError, match=r"ledger 5: expected entry 9, found entry 4"):
        DigestManager(5, DigestType.CRC32C).verify(stored, 9)


@pytest.mark.parametrize("digest_type", list(DigestType))
def test_short_entries_are_rejected(digest_type: DigestType) -> None:
    dm = DigestManager(5, digest_type)
    minimal = dm.compute(0, -1, 0, b"")
    assert dm.verify(minimal).payload == b""
    for cut in range(len(minimal)):
        with pytest.raises(DigestMismatchError, match="shorter"):
            dm.verify(minimal[:cut])


def test_lac_body_of_wrong_size_or_ledger_is_rejected() -> None:
    dm = DigestManager(5, DigestType.CRC32C)
    body = dm.compute_lac(3)
    with pytest.raises(DigestMismatchError, match="LAC body of 19 bytes"):
        dm.verify_lac(body[:-1])
    with pytest.raises(DigestMismatchError, match="LAC body of 21 bytes"):
        dm.verify_lac(body + b"\x00")
    with pytest.raises(DigestMismatchError, match="ledger id 5"):
        DigestManager(6, DigestType.CRC32C).verify_lac(body)


def test_crc32_digest_high_half_is_zero() -> None:
    stored = DigestManager(1, DigestType.CRC32).compute(0, -1, 5, b"hello")
    assert stored[32:36] == b"\x00\x00\x00\x00"


def test_parse_entry_header_needs_32_bytes() -> None:
    assert parse_entry_header(EXAMPLE_HEADER) == (1, 0, -1, 5)
    with pytest.raises(CorruptionError, match="31 bytes"):
        parse_entry_header(EXAMPLE_HEADER[:31])


def test_unknown_digest_type_value_is_rejected() -> None:
    with pytest.raises(ValueError):
        DigestManager(1, 9)  # type: ignore[arg-type]


# -- keyless checksums a bookie verifies (defect D5 of docs/correctness.md) ---------------------------------


@given(st.sampled_from(list(DigestType)), INT64, st.integers(0, 1 << 40), st.binary(max_size=300))
def test_sniff_names_crc_types_and_never_hmac_or_dummy(
    digest_type: DigestType, entry_id: int, length: int, payload: bytes
) -> None:
    entry = DigestManager(7, digest_type, b"pw").compute(entry_id, -1, length, payload)
    keyless = digest_type in (DigestType.CRC32, DigestType.CRC32C)
    # HMAC and DUMMY entries could match a CRC only by a 2**-32 chance.
    assert sniff_checksum(entry) == (digest_type if keyless else None)
    assert checksum_matches(entry, digest_type) is keyless
    assert checksum_matches(memoryview(entry), digest_type) is keyless


@pytest.mark.parametrize("digest_type", [DigestType.CRC32, DigestType.CRC32C])
def test_every_single_bit_flip_fails_the_keyless_check(digest_type: DigestType) -> None:
    entry = DigestManager(3, digest_type).compute(4, 3, 40, b"payload of the entry")
    for bit in range(len(entry) * 8):
        assert not checksum_matches(_flip(entry, bit), digest_type), bit


@given(st.sampled_from(list(DigestType)), st.lists(st.tuples(st.binary(max_size=200), st.booleans()), max_size=12),
       st.binary(max_size=7))
def test_a_run_is_checked_in_one_pass_up_to_its_first_bad_entry(
    digest_type: DigestType, spec: list[tuple[bytes, bool]], gap: bytes
) -> None:
    """``checksums_match`` over entries laid out in one buffer (with bytes between them) counts
    the entries, from the first, that ``checksum_matches`` accepts."""
    buf = bytearray()
    starts, ends, singles = [], [], []
    for i, (payload, damaged) in enumerate(spec):
        entry = DigestManager(7, digest_type, b"pw").compute(i, i - 1, 0, payload)
        if damaged:
            entry = _flip(entry, 8 * (len(entry) - 1))
        buf += gap
        starts.append(len(buf))
        buf += entry
        ends.append(len(buf))
        singles.append(checksum_matches(entry, digest_type))
    want = next((i for i, ok in enumerate(singles) if not ok), len(singles))
    assert checksums_match(memoryview(bytes(buf)), starts, ends, digest_type) == want


def test_keyless_check_of_short_entries_and_other_types() -> None:
    assert sniff_checksum(b"") is None and sniff_checksum(bytes(35)) is None
    assert not checksum_matches(bytes(35), DigestType.CRC32C)
    assert not checksum_matches(bytes(39), DigestType.CRC32)
    hmac_entry = DigestManager(3, DigestType.HMAC, b"pw").compute(0, -1, 1, b"x")
    assert not checksum_matches(hmac_entry, DigestType.HMAC)  # needs the password: never "matches"


@pytest.mark.parametrize("digest_type", list(DigestType))
def test_verify_payloads_checks_each_entry_as_verify_does(digest_type: DigestType) -> None:
    from vellum.errors import DigestMismatchError

    dm = DigestManager(9, digest_type, b"pw")
    stored = [dm.compute(3 + 2 * i, 1 + i, 100 * i, bytes([i]) * (i * 7)) for i in range(6)]
    payloads, lac = dm.verify_payloads([memoryview(s) for s in stored[:3]] + stored[3:], 3, stride=2)
    assert [bytes(p) for p in payloads] == [dm.verify(s).payload for s in stored]
    assert lac == 6
    assert dm.verify_payloads([], 0) == ([], -1)
    bad_cases = [
        ([*stored[:2], stored[2][:20]], 3),  # shorter than the header
        ([stored[0], stored[2]], 3),  # the second is not entry 5
        ([DigestManager(8, digest_type, b"pw").compute(3, 1, 0, b"x")], 3),  # another ledger's
    ]
    if digest_type is not DigestType.DUMMY:
        flipped = bytearray(stored[4])
        flipped[-1] ^= 1
        bad_cases.append(([stored[3], bytes(flipped)], 9))
    for entries, first in bad_cases:
        wrong = entries[-1]
        with pytest.raises(DigestMismatchError) as alone:
            dm.verify(wrong, first + 2 * (len(entries) - 1))
        with pytest.raises(DigestMismatchError) as batched:
            dm.verify_payloads(entries, first, stride=2)
        assert str(batched.value) == str(alone.value)


@pytest.mark.parametrize("digest_type", list(DigestType))
@given(payloads=st.lists(st.binary(max_size=300), min_size=1, max_size=20), first=st.integers(0, 2**40),
       lac=st.integers(-1, 2**40))
def test_a_run_is_computed_as_its_entries_one_by_one(digest_type: DigestType, payloads: list[bytes], first: int,
                                                    lac: int) -> None:
    dm = DigestManager(9, digest_type, b"pw")
    lengths: list[int] = []
    total = 17
    for p in payloads:
        total += len(p)
        lengths.append(total)
    views: list[bytes | bytearray | memoryview] = [memoryview(p) if k % 2 else bytearray(p)
                                                   for k, p in enumerate(payloads)]
    run = dm.compute_run(first, lac, lengths, views)
    assert run == [dm.compute(first + k, lac, lengths[k], p) for k, p in enumerate(payloads)]
    assert all(type(e) is bytes for e in run)
    with pytest.raises(ValueError, match="ledger 9: 0 lengths for"):
        dm.compute_run(first, lac, [], payloads)
