"""Entry log format: header, records, ledgers map, and the scanner's prefix property."""

from __future__ import annotations

import struct

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vellum.errors import CorruptionError, UnknownFormatVersionError
from vellum.format import entrylog as fmt


def make_entry(ledger_id: int, entry_id: int, payload: bytes) -> bytes:
    """Test entry: ids, CRC32C, payload. Like BookKeeper's digest, the CRC covers the ids too
    (a flipped id must be detectable), computed over ids + payload."""
    ids = struct.pack(">qq", ledger_id, entry_id)
    return ids + struct.pack(">I", crc32c.crc32c(ids + payload)) + payload


def verify(entry: bytes) -> bool:
    if len(entry) < 20:
        return False
    (crc,) = struct.unpack_from(">I", entry, 16)
    return crc == crc32c.crc32c(entry[:16] + entry[20:])


def build_log(entries: list[bytes], *, sealed: bool) -> bytes:
    body = bytearray(fmt.encode_header())
    sizes: dict[int, int] = {}
    for e in entries:
        body += fmt.encode_record(e)
        lid = fmt.entry_ids(e)[0]
        sizes[lid] = sizes.get(lid, 0) + 4 + len(e)
    if sealed and sizes:
        offset = len(body)
        body += fmt.encode_ledgers_map(sizes)
        body[8:20] = fmt.encode_header_map_fields(offset, len(sizes))
    return bytes(body)


entry_st = st.builds(
    make_entry,
    st.integers(0, 2**63 - 1) | st.integers(0, 5),
    st.integers(0, 2**63 - 1) | st.integers(0, 20),
    st.binary(max_size=64),
)


def test_header_layout() -> None:
    h = fmt.encode_header(4096, 7)
    assert len(h) == 1024
    assert h[:4] == b"BKLO"
    assert h[4:8] == b"\x00\x00\x00\x01"
    assert struct.unpack(">qi", h[8:20]) == (4096, 7)
    assert h[20:] == bytes(1004)
    assert fmt.decode_header(h) == fmt.EntryLogHeader(1, 4096, 7)


def test_header_errors() -> None:
    bad = bytearray(fmt.encode_header())
    bad[0:4] = b"BKLJ"
    with pytest.raises(CorruptionError, match="fingerprint"):
        fmt.decode_header(bytes(bad), where="x.log")
    newer = bytearray(fmt.encode_header())
    newer[4:8] = struct.pack(">i", 2)
    with pytest.raises(UnknownFormatVersionError, match="version 2"):
        fmt.decode_header(bytes(newer))
    with pytest.raises(CorruptionError):
        fmt.decode_header(b"BKLO")
    assert fmt.decode_header(fmt.encode_header(version=0)).has_ledgers_map is False


def test_record_and_location_offsets() -> None:
    e = make_entry(3, 9, b"hello")
    log = build_log([e, e], sealed=False)
    records, report = fmt.scan_entry_log(log)
    assert [r.offset for r in records] == [1028, 1028 + len(e) + 4]
    assert records[0].entry == e and (records[0].ledger_id, records[0].entry_id) == (3, 9)
    assert report.stop is fmt.ScanStop.END and report.offset == len(log)


def test_ledgers_map_batches_of_10000() -> None:
    sizes = {lid: lid * 10 + 4 for lid in range(25_000)}
    data = fmt.encode_ledgers_map(sizes)
    # three batches: 10000 + 10000 + 5000 pairs
    assert len(data) == 3 * (4 + 20) + 16 * 25_000
    log = bytearray(fmt.encode_header())
    offset = len(log)
    log += data
    log[8:20] = fmt.encode_header_map_fields(offset, len(sizes))
    buf = bytes(log)
    assert fmt.read_ledgers_map(lambda o, n: buf[o : o + n], len(buf)) == sizes
    first = struct.unpack_from(">iqqi", buf, offset)
    assert first == (20 + 16 * 10_000, -1, -2, 10_000)
    # scanning skips map batches but reports them
    records, report = fmt.scan_entry_log(buf)
    assert records == [] and len(report.map_batches) == 3


def test_map_missing_or_inconsistent_falls_back() -> None:
    entries = [make_entry(1, i, b"x" * i) for i in range(5)]
    sealed = bytearray(build_log(entries, sealed=True))

    def reader(b: bytes | bytearray):  # type: ignore[no-untyped-def]
        data = bytes(b)
        return lambda o, n: data[o : o + n]

    assert fmt.read_ledgers_map(reader(sealed), len(sealed)) == fmt.ledger_sizes(
        fmt.scan_entry_log(sealed)[0]
    )
    unsealed = build_log(entries, sealed=False)
    assert fmt.read_ledgers_map(reader(unsealed), len(unsealed)) is None
    wrong_count = bytearray(sealed)
    wrong_count[16:20] = struct.pack(">i", 2)
    assert fmt.read_ledgers_map(reader(wrong_count), len(wrong_count)) is None
    cut = sealed[:-3]
    assert fmt.read_ledgers_map(reader(cut), len(cut)) is None


@settings(max_examples=60, deadline=None)
@given(st.lists(entry_st, max_size=12), st.booleans(), st.data())
def test_cut_at_any_offset_scans_to_a_prefix(entries: list[bytes], sealed: bool, data: st.DataObject) -> None:
    log = build_log(entries, sealed=sealed)
    full, report = fmt.scan_entry_log(log, verify=verify)
    assert [r.entry for r in full] == entries
    assert report.stop is fmt.ScanStop.END
    cut = data.draw(st.integers(fmt.HEADER_SIZE, len(log)))
    records, report = fmt.scan_entry_log(log[:cut], verify=verify)
    got = [r.entry for r in records]
    assert got == entries[: len(got)]
    if report.stop is fmt.ScanStop.END:
        # a clean end means the cut fell on a record boundary (or inside the map)
        assert report.offset == cut


@settings(max_examples=150, deadline=None)
@given(st.lists(entry_st, min_size=1, max_size=10), st.data())
def test_flipped_byte_never_yields_a_wrong_record(entries: list[bytes], data: st.DataObject) -> None:
    log = bytearray(build_log(entries, sealed=data.draw(st.booleans())))
    pos = data.draw(st.integers(fmt.HEADER_SIZE, len(log) - 1))
    log[pos] ^= 1 << data.draw(st.integers(0, 7))
    records, _report = fmt.scan_entry_log(bytes(log), verify=verify)
    got = [r.entry for r in records]
    assert got == entries[: len(got)]


@settings(max_examples=40, deadline=None)
@given(st.lists(entry_st, max_size=8), st.integers(1, 4096))
def test_read_callable_and_any_chunking_agree(entries: list[bytes], chunk: int) -> None:
    log = build_log(entries, sealed=True)
    scanner = fmt.EntryLogScanner(lambda o, n: log[o : o + n], end=len(log))
    scanner.CHUNK = chunk
    assert [r.entry for r in scanner] == entries
    assert scanner.report.stop is fmt.ScanStop.END


def test_padding_is_skipped_and_small_sizes_are_corrupt() -> None:
    e1, e2 = make_entry(1, 0, b"a"), make_entry(1, 1, b"b")
    log = fmt.encode_header() + fmt.encode_record(e1) + b"\xf0" * 5 + bytes(37) + fmt.encode_record(e2)
    records, report = fmt.scan_entry_log(log, verify=verify)
    assert [r.entry for r in records] == [e1, e2]
    assert report.padding_bytes == 42
    # trailing zeros (preallocated space) are a clean end
    records, report = fmt.scan_entry_log(log + bytes(1000), verify=verify)
    assert len(records) == 2 and report.stop is fmt.ScanStop.END
    bad = fmt.encode_header() + fmt.encode_record(e1) + struct.pack(">i", 7) + b"x" * 7
    records, report = fmt.scan_entry_log(bad)
    assert len(records) == 1 and report.stop is fmt.ScanStop.CORRUPT and report.offset == 1024 + 4 + len(e1)
    assert "size 7" in report.reason


def test_truncated_and_failed_verification_reports() -> None:
    e = make_entry(2, 5, b"payload")
    log = fmt.encode_header() + fmt.encode_record(e)
    _, report = fmt.scan_entry_log(log[:-1])
    assert report.stop is fmt.ScanStop.TRUNCATED and report.offset == 1024 and "past the end" in report.reason
    flipped = bytearray(log)
    flipped[-1] ^= 0xFF
    records, report = fmt.scan_entry_log(bytes(flipped), verify=verify, where="3.log")
    assert records == [] and report.stop is fmt.ScanStop.CORRUPT
    scanner = fmt.EntryLogScanner(bytes(flipped), verify=verify, where="3.log")
    list(scanner)
    assert scanner.describe_stop().startswith("3.log offset 1024: corrupt")
    neg = fmt.encode_header() + fmt.encode_record(struct.pack(">qq", -5, 0))
    _, report = fmt.scan_entry_log(neg)
    assert report.stop is fmt.ScanStop.CORRUPT and "negative" in report.reason


# ---------------------------------------------------------------------------------------------
# Skipping scans (GC and compaction): an unreadable record is skipped, not the end of the scan


def _three_records() -> tuple[list[bytes], int, int]:
    """Entries, the offset of the middle record's size field, and of its body."""
    entries = [make_entry(1, i, bytes([65 + i]) * (30 + i)) for i in range(3)]
    mid = fmt.HEADER_SIZE + 4 + len(entries[0])
    return entries, mid, mid + 4


@pytest.mark.parametrize("damage", ["size_too_small", "negative_ids", "size_past_end", "size_one_off"])
def test_skipping_scan_resumes_after_an_unreadable_record(damage: str) -> None:
    entries, mid, body = _three_records()
    log = bytearray(build_log(entries, sealed=False))
    if damage == "size_too_small":
        log[mid : mid + 4] = struct.pack(">i", 7)
    elif damage == "negative_ids":
        log[body : body + 8] = struct.pack(">q", -99)
    elif damage == "size_past_end":
        log[mid : mid + 4] = struct.pack(">i", 0x3FFFFFFF)
    else:
        log[mid : mid + 4] = struct.pack(">i", len(entries[1]) + 1)
    # Without skipping the scan stops there for good (what GC used to do).
    records, report = fmt.scan_entry_log(bytes(log), verify=verify)
    assert [r.entry for r in records] == entries[:1] and report.stop is not fmt.ScanStop.END
    # Skipping: the records after it are read, the span is reported with its offset.
    records, report = fmt.scan_entry_log(bytes(log), verify=verify, skip_corrupt=True)
    assert [r.entry for r in records] == [entries[0], entries[2]]
    assert report.stop is fmt.ScanStop.END and not report.complete
    (span,) = report.skipped
    assert span.offset == mid and span.resume == body + len(entries[1])
    assert span.reason


def test_skipping_scan_of_a_clean_or_torn_log() -> None:
    entries, _mid, _body = _three_records()
    log = build_log(entries, sealed=True)
    records, report = fmt.scan_entry_log(log, skip_corrupt=True)
    assert [r.entry for r in records] == entries and report.complete
    # A torn tail (the last record cut) stays a torn tail: nothing plausible follows it.
    records, report = fmt.scan_entry_log(build_log(entries, sealed=False)[:-3], skip_corrupt=True)
    assert [r.entry for r in records] == entries[:2]
    assert report.stop is fmt.ScanStop.TRUNCATED and not report.skipped and not report.complete


@settings(max_examples=150, deadline=None)
@given(st.lists(entry_st, min_size=1, max_size=10), st.data())
def test_skipping_scan_with_a_flipped_byte_yields_only_written_records(
    entries: list[bytes], data: st.DataObject
) -> None:
    log = bytearray(build_log(entries, sealed=data.draw(st.booleans())))
    pos = data.draw(st.integers(fmt.HEADER_SIZE, len(log) - 1))
    log[pos] ^= 1 << data.draw(st.integers(0, 7))
    records, report = fmt.scan_entry_log(bytes(log), verify=verify, skip_corrupt=True)
    # With verification every record yielded is one that was written, in order.
    got = [r.entry for r in records]
    it = iter(entries)
    assert all(any(g == e for e in it) for g in got)
    if report.complete:
        assert got == entries
