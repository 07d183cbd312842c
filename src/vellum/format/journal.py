"""BookKeeper journal file format (versions 1-6) with Vellum's batch checksums. Pure: no I/O.

Responsibility: encode the journal header and records, and scan a journal's bytes back into
typed records, reporting where and why the scan stopped. The storage layer
(``vellum.storage.journal``) owns files, threads and fsync.

Byte layout (all integers big-endian, as BookKeeper's ``JournalChannel`` / ``Journal``)::

    header   V1: none (records start at 0; a file without the magic is V1)
             V2-V4: "BKLG" int32 version                       (8 bytes)
             V5+:   "BKLG" int32 version, zero-padded to 512 bytes
    record   int32 len, then len bytes of body; the body starts ledgerId(8) entryId(8):
             entryId >= 0        a full client entry (ledgerId entryId LAC length digest payload)
             entryId = -0x1000   master key:   ledgerId, -4096,  int32 keyLen, key
             entryId = -0x2000   fence:        ledgerId, -8192               (16 bytes)
             entryId = -0x8000   explicit LAC: ledgerId, -32768, int32 lacLen, lac body
             other negative ids  unknown meta records (BookKeeper skips them on replay)
    padding  int32 -0x100, int32 padLen, padLen bytes   (V5+, written before every flush so the
             position after it is a multiple of journalAlignmentSize; if fewer than 8 bytes remain
             to the boundary the padding reaches the following boundary)

Vellum extension (documented in docs/formats.md, "## Journal"): *batch checksums*.

- A V5+ header written by Vellum carries ``"VCRC"`` at offset 8 (inside BookKeeper's zero
  padding, which BookKeeper never reads). It declares "every batch in this file is checksummed".
- Every flush ("batch") ends with a padding record whose bytes are
  ``"VCRC" uint32 crc32c zeros...`` (padLen >= 8, so Vellum pads to the following boundary when
  fewer than 16 bytes remain). The CRC32C covers every byte from the end of the previous padding
  record (or the end of the header) up to and including this padding record's 8-byte
  ``-0x100, padLen`` prefix, so a corrupted padLen is detected too.
- Vellum writes a padding record at every flush, even when the position is already aligned
  (BookKeeper skips it then), so every batch has a terminator.
- A BookKeeper reader sees a valid V5/V6 file: a header it reads magic and version from and
  padding records it skips.

Scanning invariants:

- In a checksummed file, records are yielded only after their batch's checksum matched
  (``BatchCheck.VERIFIED``); records after the last valid batch are the torn tail and are never
  yielded. A file cut at any byte therefore scans to a prefix of its records, and a flipped
  byte yields a stop report or a shorter prefix, never a wrong record (up to CRC32C collisions).
- Files without the header flag (BookKeeper-written, or V1-V4) are scanned record by record
  (``BatchCheck.UNCHECKED``); padding records are skipped whatever their content.
- A scan must start at a batch boundary: the end of the header or the end of a padding record
  (every ``LogMark`` Vellum writes is one).
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import crc32c

from vellum.errors import CorruptionError, UnknownFormatVersionError
from vellum.ids import (
    METAENTRY_ID_FENCE_KEY,
    METAENTRY_ID_LEDGER_EXPLICITLAC,
    METAENTRY_ID_LEDGER_KEY,
)

JOURNAL_MAGIC = b"BKLG"
#: Versions this module reads; the journal writes 4..6 (BookKeeper's minimum writable is V4).
MIN_READ_VERSION = 1
CURRENT_JOURNAL_VERSION = 6
MIN_WRITE_VERSION = 4
#: First version with the 512-byte header and padding records.
V5 = 5
#: First version that may contain explicit-LAC records.
V6 = 6
HEADER_SIZE_V2 = 8
HEADER_SIZE_V5 = 512

#: Header flag (bytes 8..12 of a V5+ header): every batch of this file carries a checksum.
VELLUM_CHECKSUM_FLAG = b"VCRC"
#: First 4 bytes of a Vellum padding body, followed by the batch CRC32C.
BATCH_CRC_MARKER = b"VCRC"
PADDING_MASK = -0x100
#: Smallest padding body Vellum writes: marker (4) + CRC32C (4).
VELLUM_MIN_PAD_LEN = 8
#: ledgerId(8) + entryId(8): the smallest valid record body.
MIN_RECORD_BODY = 16

_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_HDR = struct.Struct(">4si")
_IDS = struct.Struct(">qq")
_IDS_LEN = struct.Struct(">iqq")  # len prefix + ledgerId + entryId
_META = struct.Struct(">iqqi")  # len prefix + ledgerId + entryId + int32 inner length
_PAD = struct.Struct(">ii")


# ------------------------------------------------------------------------------------- header


@dataclass(frozen=True, slots=True)
class JournalHeader:
    """A decoded journal header: format version, header size, and Vellum's checksum flag."""

    version: int
    size: int
    batch_checksums: bool


def header_size(version: int) -> int:
    if version >= V5:
        return HEADER_SIZE_V5
    return 0 if version <= 1 else HEADER_SIZE_V2


def encode_header(version: int = CURRENT_JOURNAL_VERSION, *, batch_checksums: bool = True) -> bytes:
    """The header Vellum writes. ``batch_checksums`` only exists from V5 (padding records)."""
    if not MIN_WRITE_VERSION <= version <= CURRENT_JOURNAL_VERSION:
        raise UnknownFormatVersionError(
            f"cannot write journal format version {version} "
            f"(writable: {MIN_WRITE_VERSION}..{CURRENT_JOURNAL_VERSION})"
        )
    head = _HDR.pack(JOURNAL_MAGIC, version)
    if version < V5:
        return head
    flag = VELLUM_CHECKSUM_FLAG if batch_checksums else b"\0\0\0\0"
    return (head + flag).ljust(HEADER_SIZE_V5, b"\0")


def decode_header(data: bytes, *, where: str = "journal") -> JournalHeader:
    """Decode the first bytes of a journal file (pass at least 512 when available).

    No magic means V1 (no header; records start at 0). A magic with a version outside 1..6
    raises ``UnknownFormatVersionError`` naming the version.
    """
    if len(data) < HEADER_SIZE_V2 or bytes(data[:4]) != JOURNAL_MAGIC:
        return JournalHeader(version=1, size=0, batch_checksums=False)
    _magic, version = _HDR.unpack_from(data, 0)
    if not MIN_READ_VERSION <= version <= CURRENT_JOURNAL_VERSION:
        raise UnknownFormatVersionError(
            f"{where}: unknown journal format version {version} at offset 4 "
            f"(this Vellum reads versions {MIN_READ_VERSION}..{CURRENT_JOURNAL_VERSION})"
        )
    size = max(header_size(version), HEADER_SIZE_V2)
    checksums = version >= V5 and bytes(data[8:12]) == VELLUM_CHECKSUM_FLAG
    return JournalHeader(version=version, size=size, batch_checksums=checksums)


# ------------------------------------------------------------------------------------- records


def encode_entry(entry: bytes) -> bytes:
    """A client entry record: ``int32 len`` + the stored entry (which starts ledgerId entryId)."""
    return entry_prefix(entry) + entry


def entry_prefix(entry: bytes | bytearray | memoryview) -> bytes:
    """The ``int32 len`` that starts a client entry's record (so a writer can append the entry
    itself without building the record first)."""
    if len(entry) < MIN_RECORD_BODY:
        raise ValueError(f"a journal entry needs at least {MIN_RECORD_BODY} bytes, got {len(entry)}")
    return _I32.pack(len(entry))


def encode_master_key(ledger_id: int, key: bytes) -> bytes:
    return _META.pack(MIN_RECORD_BODY + 4 + len(key), ledger_id, METAENTRY_ID_LEDGER_KEY, len(key)) + key


def encode_fence(ledger_id: int) -> bytes:
    return _IDS_LEN.pack(MIN_RECORD_BODY, ledger_id, METAENTRY_ID_FENCE_KEY)


def encode_explicit_lac(ledger_id: int, lac_body: bytes) -> bytes:
    head = _META.pack(
        MIN_RECORD_BODY + 4 + len(lac_body), ledger_id, METAENTRY_ID_LEDGER_EXPLICITLAC, len(lac_body)
    )
    return head + lac_body


def padding_length(position: int, alignment: int, *, vellum: bool = True) -> int:
    """Total bytes of the padding record written at ``position`` (0 when none is needed).

    BookKeeper: none when aligned; otherwise reach the boundary, or the following one when
    fewer than 8 bytes remain. Vellum: always one, with room for its 8-byte checksum body.
    """
    remaining = (-position) % alignment
    if not vellum:
        if remaining == 0:
            return 0
        return remaining if remaining >= _PAD.size else remaining + alignment
    while remaining < _PAD.size + VELLUM_MIN_PAD_LEN:
        remaining += alignment
    return remaining


def encode_padding(position: int, alignment: int, batch_crc: int | None) -> bytes:
    """The padding record that ends, at ``position``, a batch whose CRC32C is ``batch_crc``.

    ``batch_crc`` is ``crc32c`` over the batch's bytes (from the previous padding or the header
    up to ``position``); the stored CRC extends it over the padding's own 8-byte prefix. None
    writes BookKeeper's all-zero padding (no record at all when already aligned).
    """
    total = padding_length(position, alignment, vellum=batch_crc is not None)
    if total == 0:
        return b""
    pad_len = total - _PAD.size
    prefix = _PAD.pack(PADDING_MASK, pad_len)
    if batch_crc is None:
        return prefix + bytes(pad_len)
    crc = crc32c.crc32c(prefix, batch_crc)
    return prefix + BATCH_CRC_MARKER + _U32.pack(crc) + bytes(pad_len - VELLUM_MIN_PAD_LEN)


def batch_crc(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """Extend a running batch CRC32C over ``data`` (the writer may write a batch in pieces)."""
    return crc32c.crc32c(data, crc)


# ------------------------------------------------------------------------------------- scanning


class RecordKind(enum.Enum):
    ENTRY = "entry"
    MASTER_KEY = "master_key"
    FENCE = "fence"
    EXPLICIT_LAC = "explicit_lac"
    #: a negative entry id Vellum does not know (BookKeeper skips these on replay)
    OTHER = "other"


class BatchCheck(enum.Enum):
    #: the record's batch ended with a padding record whose CRC32C matched
    VERIFIED = "verified"
    #: file without batch checksums (BookKeeper-written, or V1-V4): accepted as parsed
    UNCHECKED = "unchecked"


@dataclass(frozen=True, slots=True)
class JournalRecord:
    """One record read from a journal.

    ``data`` depends on ``kind``: ENTRY the whole stored client entry (starting ledgerId entryId),
    MASTER_KEY the key, EXPLICIT_LAC the LAC body, FENCE empty, OTHER the body after the ids.
    """

    offset: int  # of the int32 length prefix in the file
    kind: RecordKind
    ledger_id: int
    entry_id: int
    data: bytes
    length: int  # the record's int32 length field (body size)
    check: BatchCheck

    @property
    def end(self) -> int:
        return self.offset + 4 + self.length


class StopReason(enum.Enum):
    #: end of file, or a zero length at a batch boundary (preallocated space): a clean end
    END = "end"
    #: the file ends inside a record or inside a batch that has no padding yet
    TRUNCATED = "truncated"
    #: zeros (preallocated space) after records whose batch never got its checksum
    UNTERMINATED_BATCH = "unterminated_batch"
    #: a padding record whose batch checksum is missing or does not match
    CHECKSUM_MISMATCH = "checksum_mismatch"
    #: a negative non-padding length, a length below 16, or a negative padding length
    CORRUPT_LENGTH = "corrupt_length"
    #: a special record whose inner length disagrees with the record length
    CORRUPT_RECORD = "corrupt_record"


@dataclass(frozen=True, slots=True)
class ScanStop:
    """Where and why a scan stopped.

    ``valid_end``: the position after the last accepted record or batch (a batch boundary in a
    checksummed file); ``offset``: where the problem (or the clean end) was found.
    """

    reason: StopReason
    offset: int
    valid_end: int
    detail: str

    @property
    def clean(self) -> bool:
        return self.reason is StopReason.END

    def describe(self, where: str = "journal") -> str:
        return f"{where}: {self.detail} at offset {self.offset} (valid data ends at {self.valid_end})"


ReadFn = Callable[[int, int], bytes]


class JournalScanner:
    """Iterate over the records of one journal, read through ``read(offset, n) -> bytes``.

    ``read`` returns fewer than ``n`` bytes only at end of file. The header is decoded by the
    constructor (``UnknownFormatVersionError`` for an unknown version). Iterating yields
    ``JournalRecord`` objects; once exhausted, ``stop`` tells where and why the scan ended.
    ``start`` (default: the end of the header) must be a batch boundary.
    """

    def __init__(
        self,
        read: ReadFn,
        *,
        start: int | None = None,
        where: str = "journal",
        chunk_size: int = 1 << 20,
    ) -> None:
        self._read = read
        self._where = where
        self._chunk = max(chunk_size, 4096)
        self.header = decode_header(read(0, HEADER_SIZE_V5), where=where)
        self.start = self.header.size if start is None else max(start, self.header.size)
        self.stop: ScanStop | None = None
        self._buf = b""
        self._buf_start = 0

    def _get(self, pos: int, n: int) -> bytes | None:
        """Bytes [pos, pos+n), or None when the file ends before pos+n."""
        off = pos - self._buf_start
        if off < 0 or off + n > len(self._buf):
            self._buf = self._read(pos, max(n, self._chunk))
            self._buf_start = pos
            off = 0
            if n > len(self._buf):
                return None
        return self._buf[off : off + n]

    def _rest(self, pos: int) -> bytes:
        """The (fewer than 4) bytes left at ``pos``, right after ``_get(pos, 4)`` failed."""
        return self._read(pos, 4)

    def __iter__(self) -> Iterator[JournalRecord]:
        checksummed = self.header.batch_checksums
        pos = self.start
        batch_start = pos
        pending: list[JournalRecord] = []
        crc = 0
        check = BatchCheck.VERIFIED if checksummed else BatchCheck.UNCHECKED
        get = self._get

        def finish(reason: StopReason, at: int, detail: str) -> None:
            self.stop = ScanStop(reason, at, batch_start if checksummed else pos, detail)

        while True:
            head = get(pos, 4)
            if head is None:
                if pending:
                    finish(StopReason.TRUNCATED, pos, "file ends inside a batch without checksum")
                elif (rest := self._rest(pos)) and rest.count(0) != len(rest):
                    finish(StopReason.TRUNCATED, pos, "file ends inside a record length")
                else:
                    finish(StopReason.END, pos, "end of file")
                return
            (length,) = _I32.unpack(head)
            if length == 0:
                if pending:
                    finish(
                        StopReason.UNTERMINATED_BATCH,
                        pos,
                        f"{len(pending)} record(s) not followed by a batch checksum",
                    )
                else:
                    finish(StopReason.END, pos, "preallocated zeros")
                return
            if length == PADDING_MASK:
                pad_head = get(pos, _PAD.size)
                if pad_head is None:
                    finish(StopReason.TRUNCATED, pos, "file ends inside a padding record")
                    return
                (_mask, pad_len) = _PAD.unpack(pad_head)
                if pad_len < 0:
                    finish(StopReason.CORRUPT_LENGTH, pos, f"negative padding length {pad_len}")
                    return
                body = get(pos + _PAD.size, pad_len)
                if body is None:
                    finish(StopReason.TRUNCATED, pos, f"file ends inside a padding record of {pad_len} bytes")
                    return
                if checksummed:
                    if pad_len < VELLUM_MIN_PAD_LEN or body[:4] != BATCH_CRC_MARKER:
                        finish(StopReason.CHECKSUM_MISMATCH, pos, "padding record without a batch checksum")
                        return
                    (stored,) = _U32.unpack_from(body, 4)
                    actual = crc32c.crc32c(pad_head, crc)
                    if stored != actual:
                        finish(
                            StopReason.CHECKSUM_MISMATCH,
                            pos,
                            f"batch checksum mismatch (stored {stored:08x}, computed {actual:08x})",
                        )
                        return
                    yield from pending
                    pending = []
                    crc = 0
                pos += _PAD.size + pad_len
                batch_start = pos
                continue
            if length < 0:
                finish(StopReason.CORRUPT_LENGTH, pos, f"negative record length {length}")
                return
            if length < MIN_RECORD_BODY:
                finish(
                    StopReason.CORRUPT_LENGTH,
                    pos,
                    f"record length {length} is below the {MIN_RECORD_BODY}-byte minimum",
                )
                return
            body = get(pos + 4, length)
            if body is None:
                finish(StopReason.TRUNCATED, pos, f"file ends inside a record of {length} bytes")
                return
            ledger_id, entry_id = _IDS.unpack_from(body, 0)
            record = self._record(pos, length, ledger_id, entry_id, body, check)
            if isinstance(record, str):
                finish(StopReason.CORRUPT_RECORD, pos, record)
                return
            if checksummed:
                crc = crc32c.crc32c(body, crc32c.crc32c(head, crc))
                pending.append(record)
            else:
                yield record
            pos += 4 + length
            if not checksummed:
                batch_start = pos

    @staticmethod
    def _record(
        pos: int, length: int, ledger_id: int, entry_id: int, body: bytes, check: BatchCheck
    ) -> JournalRecord | str:
        """The typed record, or a description of why its body is inconsistent."""
        if entry_id >= 0:
            return JournalRecord(pos, RecordKind.ENTRY, ledger_id, entry_id, body, length, check)
        if entry_id == METAENTRY_ID_FENCE_KEY:
            if length != MIN_RECORD_BODY:
                return f"fence record of ledger {ledger_id} has length {length}, expected 16"
            return JournalRecord(pos, RecordKind.FENCE, ledger_id, entry_id, b"", length, check)
        if entry_id in (METAENTRY_ID_LEDGER_KEY, METAENTRY_ID_LEDGER_EXPLICITLAC):
            kind = RecordKind.MASTER_KEY if entry_id == METAENTRY_ID_LEDGER_KEY else RecordKind.EXPLICIT_LAC
            if length < MIN_RECORD_BODY + 4:
                return f"{kind.value} record of ledger {ledger_id} is too short ({length} bytes)"
            (inner,) = _I32.unpack_from(body, MIN_RECORD_BODY)
            if inner != length - MIN_RECORD_BODY - 4:
                return (
                    f"{kind.value} record of ledger {ledger_id}: inner length {inner} "
                    f"disagrees with record length {length}"
                )
            return JournalRecord(pos, kind, ledger_id, entry_id, body[MIN_RECORD_BODY + 4 :], length, check)
        return JournalRecord(
            pos, RecordKind.OTHER, ledger_id, entry_id, body[MIN_RECORD_BODY:], length, check
        )


def scan_journal_bytes(
    data: bytes, *, start: int | None = None, where: str = "journal"
) -> tuple[list[JournalRecord], ScanStop]:
    """Scan a whole journal held in memory: (records, stop)."""

    def read(offset: int, n: int) -> bytes:
        return data[offset : offset + n]

    scanner = JournalScanner(read, start=start, where=where)
    records = list(scanner)
    assert scanner.stop is not None
    return records, scanner.stop


def corruption_error(stop: ScanStop, where: str) -> CorruptionError:
    """The error for a scan that stopped early where a clean end was required."""
    return CorruptionError(stop.describe(where))
