"""Journal format: header, records, padding with batch checksums, and the scanner's guarantees."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vellum.errors import UnknownFormatVersionError
from vellum.format.journal import (
    HEADER_SIZE_V5,
    PADDING_MASK,
    BatchCheck,
    RecordKind,
    StopReason,
    batch_crc,
    decode_header,
    encode_entry,
    encode_explicit_lac,
    encode_fence,
    encode_header,
    encode_master_key,
    encode_padding,
    padding_length,
    scan_journal_bytes,
)

ALIGN = 512


def entry_bytes(ledger_id: int, entry_id: int, payload: bytes) -> bytes:
    return struct.pack(">qqqq", ledger_id, entry_id, -1, len(payload)) + payload


Rec = tuple[str, int, int, bytes]  # (kind, ledger, entry, data)

records_st = st.one_of(
    st.tuples(st.just("entry"), st.integers(0, 2**40), st.integers(0, 2**40), st.binary(max_size=300)),
    st.tuples(st.just("master_key"), st.integers(0, 2**40), st.just(-0x1000), st.binary(max_size=40)),
    st.tuples(st.just("fence"), st.integers(0, 2**40), st.just(-0x2000), st.just(b"")),
    st.tuples(st.just("explicit_lac"), st.integers(0, 2**40), st.just(-0x8000), st.binary(max_size=60)),
)
batches_st = st.lists(st.lists(records_st, min_size=1, max_size=6), max_size=6)


def encode(rec: Rec) -> bytes:
    kind, ledger, entry, data = rec
    if kind == "entry":
        return encode_entry(entry_bytes(ledger, entry, data))
    if kind == "master_key":
        return encode_master_key(ledger, data)
    if kind == "fence":
        return encode_fence(ledger)
    return encode_explicit_lac(ledger, data)


def build(batches: list[list[Rec]], *, checksums: bool = True, prealloc: int = 0) -> bytes:
    """A journal the way the writer lays it out: header, batches each ended by a padding record."""
    out = bytearray(encode_header(6, batch_checksums=checksums))
    for batch in batches:
        body = b"".join(encode(r) for r in batch)
        out += body
        out += encode_padding(len(out), ALIGN, batch_crc(body) if checksums else None)
    return bytes(out) + bytes(prealloc)


def expected(rec: Rec) -> tuple[RecordKind, int, int, bytes]:
    kind, ledger, entry, data = rec
    if kind == "entry":
        return RecordKind.ENTRY, ledger, entry, entry_bytes(ledger, entry, data)
    return RecordKind(kind), ledger, entry, data


def seen(data: bytes) -> tuple[list[tuple[RecordKind, int, int, bytes]], object]:
    records, stop = scan_journal_bytes(data)
    return [(r.kind, r.ledger_id, r.entry_id, r.data) for r in records], stop


# ------------------------------------------------------------------ header


def test_header_round_trip_and_layout() -> None:
    h = encode_header(6)
    assert len(h) == HEADER_SIZE_V5 and h[:4] == b"BKLG" and h[4:8] == b"\0\0\0\x06"
    assert h[8:12] == b"VCRC" and h[12:] == bytes(500)
    d = decode_header(h)
    assert (d.version, d.size, d.batch_checksums) == (6, 512, True)
    assert decode_header(encode_header(5, batch_checksums=False)).batch_checksums is False
    v4 = encode_header(4)
    assert len(v4) == 8 and decode_header(v4.ljust(512, b"\0")).size == 8


def test_no_magic_is_v1() -> None:
    d = decode_header(bytes(512))
    assert (d.version, d.size) == (1, 0)


@pytest.mark.parametrize("version", [7, 0, -1, 1000])
def test_unknown_version_names_it(version: int) -> None:
    data = b"BKLG" + struct.pack(">i", version) + bytes(504)
    with pytest.raises(UnknownFormatVersionError, match=f"version {version}"):
        decode_header(data, where="x.txn")
    with pytest.raises(UnknownFormatVersionError):
        scan_journal_bytes(data)


def test_cannot_write_unwritable_version() -> None:
    with pytest.raises(UnknownFormatVersionError):
        encode_header(3)


# ------------------------------------------------------------------ records and padding


def test_special_record_layouts() -> None:
    assert encode_fence(7) == struct.pack(">iqq", 16, 7, -8192)
    assert encode_master_key(7, b"k" * 20) == struct.pack(">iqqi", 40, 7, -4096, 20) + b"k" * 20
    assert encode_explicit_lac(7, b"lac") == struct.pack(">iqqi", 23, 7, -32768, 3) + b"lac"


@given(st.integers(0, 10_000), st.sampled_from([16, 512, 4096]))
def test_padding_reaches_an_alignment_boundary(position: int, align: int) -> None:
    pad = encode_padding(position, align, 0x1234)
    assert (position + len(pad)) % align == 0
    mask, pad_len = struct.unpack_from(">ii", pad)
    assert mask == PADDING_MASK and pad_len >= 8 and pad[8:12] == b"VCRC"
    bk = encode_padding(position, align, None)
    assert (position + len(bk)) % align == 0
    if bk:
        assert struct.unpack_from(">ii", bk)[1] >= 0 and bk[8:] == bytes(len(bk) - 8)
    # BookKeeper: no padding at a boundary; fewer than 8 bytes left -> the following boundary
    assert padding_length(1024, 512, vellum=False) == 0
    assert padding_length(1020, 512, vellum=False) == 4 + 512


# ------------------------------------------------------------------ scanning


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(batches_st, st.sampled_from([0, 700]))
def test_scan_returns_every_record_in_order(batches: list[list[Rec]], prealloc: int) -> None:
    data = build(batches, prealloc=prealloc)
    got, stop = seen(data)
    assert got == [expected(r) for b in batches for r in b]
    assert stop.reason is StopReason.END  # type: ignore[attr-defined]
    records, _ = scan_journal_bytes(data)
    assert all(r.check is BatchCheck.VERIFIED for r in records)


@given(batches_st)
def test_bookkeeper_file_without_checksums_is_accepted_unchecked(batches: list[list[Rec]]) -> None:
    data = build(batches, checksums=False, prealloc=100)
    records, stop = scan_journal_bytes(data)
    assert [(r.kind, r.ledger_id, r.entry_id, r.data) for r in records] == [
        expected(r) for b in batches for r in b
    ]
    assert stop.clean and all(r.check is BatchCheck.UNCHECKED for r in records)


def test_scan_from_a_batch_boundary_and_record_offsets() -> None:
    batches = [[("entry", 1, 0, b"a")], [("entry", 1, 1, b"b"), ("fence", 1, -0x2000, b"")]]
    data = build(batches)
    records, _ = scan_journal_bytes(data)
    assert records[0].offset == 512 and records[1].offset == 1024
    assert records[2].offset == records[1].end
    later, stop = scan_journal_bytes(data, start=1024)
    assert [r.entry_id for r in later] == [1, -0x2000] and stop.clean


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=60)
@given(batches_st.filter(lambda b: len(b) > 0), st.data())
def test_cut_at_any_offset_scans_to_a_prefix(batches: list[list[Rec]], data: st.DataObject) -> None:
    full = build(batches)
    everything = [expected(r) for b in batches for r in b]
    cut = data.draw(st.integers(0, len(full)))
    got, _stop = seen(full[:cut])
    assert got == everything[: len(got)]
    # only whole batches survive: the count is a batch boundary
    boundaries = {0}
    n = 0
    for b in batches:
        n += len(b)
        boundaries.add(n)
    assert len(got) in boundaries
    if cut == len(full):
        assert len(got) == len(everything)


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=150)
@given(batches_st.filter(lambda b: len(b) > 0), st.data())
def test_flipped_byte_never_yields_a_wrong_record(batches: list[list[Rec]], data: st.DataObject) -> None:
    full = bytearray(build(batches, prealloc=64))
    everything = [expected(r) for b in batches for r in b]
    where = data.draw(st.integers(0, len(full) - 1))
    full[where] ^= data.draw(st.integers(1, 255))
    try:
        got, _stop = seen(bytes(full))
    except UnknownFormatVersionError:
        return  # a flipped version byte is reported as such
    assert got == everything[: len(got)]


def test_flip_in_a_batch_is_a_checksum_mismatch() -> None:
    batches = [[("entry", 1, 0, b"x" * 100)], [("entry", 1, 1, b"y" * 100)]]
    data = bytearray(build(batches))
    data[1024 + 40] ^= 0xFF  # inside the second batch's entry payload
    got, stop = seen(bytes(data))
    assert [g[2] for g in got] == [0]
    assert stop.reason is StopReason.CHECKSUM_MISMATCH and stop.valid_end == 1024  # type: ignore[attr-defined]
    assert "offset" in stop.describe("j.txn")  # type: ignore[attr-defined]


def test_zero_padding_in_a_checksummed_file_is_rejected() -> None:
    out = bytearray(encode_header(6))
    out += encode_entry(entry_bytes(1, 0, b"p"))
    out += encode_padding(len(out), ALIGN, None)
    got, stop = seen(bytes(out))
    assert got == [] and stop.reason is StopReason.CHECKSUM_MISMATCH  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("tail", "reason"),
    [
        (struct.pack(">i", -5), StopReason.CORRUPT_LENGTH),
        (struct.pack(">i", 7) + bytes(7), StopReason.CORRUPT_LENGTH),
        (struct.pack(">ii", PADDING_MASK, -3), StopReason.CORRUPT_LENGTH),
        (encode_entry(entry_bytes(1, 5, b"z")) + bytes(64), StopReason.UNTERMINATED_BATCH),
        (encode_entry(entry_bytes(1, 5, b"z"))[:-3], StopReason.TRUNCATED),
        (struct.pack(">iqqi", 20, 1, -0x1000, 99), StopReason.CORRUPT_RECORD),
        (struct.pack(">iqq", 20, 1, -0x2000) + bytes(4), StopReason.CORRUPT_RECORD),
        (b"\0\0", StopReason.END),
        (b"\0\x01", StopReason.TRUNCATED),
    ],
)
def test_stop_reasons(tail: bytes, reason: StopReason) -> None:
    data = build([[("entry", 1, 0, b"ok")]]) + tail
    got, stop = seen(data)
    assert [g[2] for g in got] == [0]
    assert stop.reason is reason, stop  # type: ignore[attr-defined]
    assert stop.valid_end == 1024  # type: ignore[attr-defined]


def test_unknown_negative_entry_id_is_other() -> None:
    body = struct.pack(">qq", 3, -77) + b"zz"
    out = bytearray(encode_header(6))
    rec = struct.pack(">i", len(body)) + body
    out += rec
    out += encode_padding(len(out), ALIGN, batch_crc(rec))
    records, stop = scan_journal_bytes(bytes(out))
    assert [(r.kind, r.entry_id, r.data) for r in records] == [(RecordKind.OTHER, -77, b"zz")]
    assert stop.clean
