"""BookKeeper's entry log file: header, records, ledgers map, and a pure scanner.

Byte layout (all integers big-endian, BookKeeper's ``DefaultEntryLogger`` format)::

    offset 0     4  "BKLO" fingerprint
           4     4  int32 header version (0 = no ledgers map, 1 = current)
           8     8  int64 ledgersMapOffset (0 until the log is sealed with its map)
          16     4  int32 ledgersCount (distinct ledgers in the map)
          20  1004  zeros
    offset 1024...  records: [int32 size][size bytes of entry]
                    an entry starts with int64 ledgerId, int64 entryId (the stored client entry)

A location is ``log_id << 32 | pos`` where ``pos`` is the offset of the entry body, i.e. just
after its size field. A sealed log ends with its ledgers map: one or more batches, each a record
whose body is ``int64 -1 (ledgerId), int64 -2 (entryId), int32 n, n x (int64 ledgerId,
int64 size)`` with at most 10,000 ledgers per batch, where ``size`` is the sum of ``4 + len(entry)``
over that ledger's records in the log. After the map is durable the header fields at offsets 8 and
16 are rewritten with the offset of the first batch's size field and the total ledger count.

Scanner rules (BookKeeper's ``scanEntryLog``): start at 1024; a size <= 0 is padding and the
scan advances one byte; a record whose ledger id is -1 is a ledgers-map batch and is skipped; a
data record must have ``size >= 16`` and fit before the end. Vellum adds: ledger and entry ids
of data records must be non-negative, and an optional ``verify(entry)`` (the digest check) must
accept the entry. The scan stops at the first violation and reports where and why; everything it
yielded before is a prefix of what was written.

Skipping (``skip_corrupt=True``, what GC and compaction use to work out which ledgers a log holds
and which records to move): a record that cannot be read (a size below 16, negative ids, a failed
``verify``, or a size that runs past the end while more data follows) does not end the scan. The
scan resumes at the next offset where a record *plausibly* starts (``_resync``): first right
after the bad record if its size field leads to a sane record, else the first later offset whose
record is sane and is followed by a sane record, padding or the end, looking at most
``RESYNC_MAX_BYTES`` ahead. Each skipped span is in ``report.skipped``. If nothing plausible
follows, the scan stops there as it would without skipping (a torn tail is ``TRUNCATED``). A resync may be fooled by payload bytes that look like a
record, so what a skipping scan yields is a hint, never proof: callers accept a record only if
the location index points at exactly that record, and never treat a log whose scan skipped
anything as fully read (``ScanReport.complete``). Pure: no I/O, reads go through a callable.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum

from vellum.errors import CorruptionError, UnknownFormatVersionError
from vellum.ids import INVALID_LEDGER_ID, LEDGERS_MAP_ENTRY_ID

HEADER_SIZE = 1024
FINGERPRINT = b"BKLO"
HEADER_VERSION_V0 = 0
HEADER_VERSION_V1 = 1
CURRENT_HEADER_VERSION = HEADER_VERSION_V1
#: offset of the (ledgersMapOffset, ledgersCount) pair rewritten when a log is sealed
HEADER_MAP_FIELDS_OFFSET = 8
#: BookKeeper's MIN_SANE_ENTRY_SIZE: ledgerId + entryId
MIN_SANE_ENTRY_SIZE = 16
#: ledgers per ledgers-map batch (BookKeeper's LEDGERS_MAP_MAX_BATCH_SIZE)
LEDGERS_MAP_MAX_BATCH = 10_000
SIZE_FIELD = 4
#: how far a skipping scan looks for the next plausible record before giving up on the log's rest
RESYNC_MAX_BYTES = 8 << 20

_HEADER_FIXED = struct.Struct(">4siqi")
_MAP_FIELDS = struct.Struct(">qi")
_SIZE = struct.Struct(">i")
_IDS = struct.Struct(">qq")
_MAP_BATCH_HEAD = struct.Struct(">iqqi")  # size, -1, -2, n
_MAP_PAIR = struct.Struct(">qq")
_MAP_BATCH_FIXED = 8 + 8 + 4  # body bytes before the pairs

#: ``read(offset, n)`` returns up to ``n`` bytes at ``offset`` (fewer only at the end).
ReadFn = Callable[[int, int], bytes]
VerifyFn = Callable[[bytes], bool]


@dataclass(frozen=True, slots=True)
class EntryLogHeader:
    version: int
    ledgers_map_offset: int
    ledgers_count: int

    @property
    def has_ledgers_map(self) -> bool:
        return self.version >= HEADER_VERSION_V1 and self.ledgers_map_offset > 0


def encode_header(
    ledgers_map_offset: int = 0, ledgers_count: int = 0, *, version: int = CURRENT_HEADER_VERSION
) -> bytes:
    """The 1024-byte header of a new (or sealed) log."""
    fixed = _HEADER_FIXED.pack(FINGERPRINT, version, ledgers_map_offset, ledgers_count)
    return fixed + bytes(HEADER_SIZE - len(fixed))


def encode_header_map_fields(ledgers_map_offset: int, ledgers_count: int) -> bytes:
    """The 12 bytes written at ``HEADER_MAP_FIELDS_OFFSET`` when a log is sealed."""
    return _MAP_FIELDS.pack(ledgers_map_offset, ledgers_count)


def decode_header(data: bytes, *, where: str = "entry log") -> EntryLogHeader:
    """Parse a header; a wrong fingerprint or short header is corruption, a newer version unknown."""
    if len(data) < _HEADER_FIXED.size:
        raise CorruptionError(f"{where}: header is {len(data)} bytes, need {HEADER_SIZE}")
    fingerprint, version, map_offset, count = _HEADER_FIXED.unpack_from(data, 0)
    if fingerprint != FINGERPRINT:
        raise CorruptionError(f"{where} offset 0: fingerprint {fingerprint!r} is not {FINGERPRINT!r}")
    if version not in (HEADER_VERSION_V0, HEADER_VERSION_V1):
        raise UnknownFormatVersionError(f"{where} offset 4: unknown entry log header version {version}")
    return EntryLogHeader(version, map_offset, count)


#: ``int32 size`` of a record: what precedes each entry (``encode_size(len(entry))``)
encode_size = _SIZE.pack


def encode_record(entry: bytes) -> bytes:
    """``[int32 size][entry]``; the body offset is the record offset + 4."""
    if len(entry) < MIN_SANE_ENTRY_SIZE:
        raise ValueError(f"entry of {len(entry)} bytes is shorter than {MIN_SANE_ENTRY_SIZE}")
    return _SIZE.pack(len(entry)) + entry


def entry_ids(entry: bytes | memoryview) -> tuple[int, int]:
    """(ledger_id, entry_id) from the first 16 bytes of a stored entry."""
    if len(entry) < MIN_SANE_ENTRY_SIZE:
        raise ValueError(f"entry of {len(entry)} bytes has no ledger/entry id header")
    lid, eid = _IDS.unpack_from(entry, 0)
    return lid, eid


def decode_size(data: bytes | memoryview, offset: int = 0) -> int:
    return int(_SIZE.unpack_from(data, offset)[0])


# ---------------------------------------------------------------------------------------------
# Ledgers map


def encode_ledgers_map(sizes: Mapping[int, int]) -> bytes:
    """The ledgers-map batches (each a full record with its size field) for ``{ledger: bytes}``.

    Ledgers are written in ascending id order so the map of a log is deterministic.
    """
    items = sorted(sizes.items())
    out = bytearray()
    for start in range(0, len(items), LEDGERS_MAP_MAX_BATCH):
        batch = items[start : start + LEDGERS_MAP_MAX_BATCH]
        body_len = _MAP_BATCH_FIXED + _MAP_PAIR.size * len(batch)
        out += _MAP_BATCH_HEAD.pack(body_len, INVALID_LEDGER_ID, LEDGERS_MAP_ENTRY_ID, len(batch))
        for lid, size in batch:
            out += _MAP_PAIR.pack(lid, size)
    return bytes(out)


def is_ledgers_map_body(body: bytes | memoryview) -> bool:
    return len(body) >= MIN_SANE_ENTRY_SIZE and _IDS.unpack_from(body, 0)[0] == INVALID_LEDGER_ID


def decode_ledgers_map_batch(
    body: bytes | memoryview, *, where: str = "ledgers map"
) -> list[tuple[int, int]]:
    """The (ledger_id, size) pairs of one batch body (without its size field)."""
    if len(body) < _MAP_BATCH_FIXED:
        raise CorruptionError(f"{where}: batch of {len(body)} bytes is too short")
    lid, eid = _IDS.unpack_from(body, 0)
    (n,) = _SIZE.unpack_from(body, 16)
    if lid != INVALID_LEDGER_ID or eid != LEDGERS_MAP_ENTRY_ID:
        raise CorruptionError(f"{where}: batch ids ({lid}, {eid}) are not (-1, -2)")
    if n < 0 or len(body) != _MAP_BATCH_FIXED + _MAP_PAIR.size * n:
        raise CorruptionError(f"{where}: batch of {len(body)} bytes does not hold {n} ledgers")
    return [_MAP_PAIR.unpack_from(body, _MAP_BATCH_FIXED + i * _MAP_PAIR.size) for i in range(n)]


def read_ledgers_map(read: ReadFn, end: int, *, where: str = "entry log") -> dict[int, int] | None:
    """Read the ledgers map a sealed log names in its header, or None when it is absent/inconsistent.

    ``None`` means "fall back to a full scan" (BookKeeper's rule): an old or unsealed log, an offset
    outside the file, a malformed batch, or a ledger count different from the header's.
    Corruption of the header itself (fingerprint, version) is raised.
    """
    header = decode_header(read(0, HEADER_SIZE), where=where)
    if not header.has_ledgers_map or header.ledgers_map_offset < HEADER_SIZE:
        return None
    pos = header.ledgers_map_offset
    sizes: dict[int, int] = {}
    pairs = 0
    while pairs < header.ledgers_count:
        if pos + SIZE_FIELD > end:
            return None
        head = read(pos, SIZE_FIELD)
        if len(head) < SIZE_FIELD:
            return None
        size = decode_size(head)
        if size < _MAP_BATCH_FIXED or pos + SIZE_FIELD + size > end:
            return None
        body = read(pos + SIZE_FIELD, size)
        try:
            batch = decode_ledgers_map_batch(body, where=f"{where} offset {pos}")
        except CorruptionError:
            return None
        if not batch:
            return None
        for lid, lsize in batch:
            sizes[lid] = sizes.get(lid, 0) + lsize
        pairs += len(batch)
        pos += SIZE_FIELD + size
    if pairs != header.ledgers_count:
        return None
    return sizes


# ---------------------------------------------------------------------------------------------
# Scanner


class ScanStop(Enum):
    """Why a scan ended."""

    END = "end"  # clean end of the data
    TRUNCATED = "truncated"  # a record (or its size field) runs past the end
    CORRUPT = "corrupt"  # a record is not sane or fails verification


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One data record: ``offset`` is the entry body's offset (the location's low 32 bits)."""

    offset: int
    ledger_id: int
    entry_id: int
    entry: bytes

    @property
    def size(self) -> int:
        return len(self.entry)


@dataclass(frozen=True, slots=True)
class SkippedSpan:
    """Bytes a skipping scan could not read: ``[offset, resume)``, and why."""

    offset: int
    resume: int
    reason: str

    @property
    def size(self) -> int:
        return self.resume - self.offset


@dataclass(slots=True)
class ScanReport:
    stop: ScanStop = ScanStop.END
    offset: int = HEADER_SIZE  # where the scan stopped (start of the offending record)
    reason: str = ""
    records: int = 0
    padding_bytes: int = 0
    #: ledgers-map batches seen (offset of the size field, pairs)
    map_batches: list[tuple[int, list[tuple[int, int]]]] = field(default_factory=list)
    #: spans a skipping scan (``skip_corrupt``) passed over, in file order
    skipped: list[SkippedSpan] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Whether the scan read every record: it reached the clean end and skipped nothing."""
        return self.stop is ScanStop.END and not self.skipped


class EntryLogScanner:
    """Iterate over the data records of an entry log; ``report`` says where and why it stopped.

    ``source`` is the whole log as bytes, or ``read(offset, n)`` with ``end`` = the file size.
    The header is not checked here (use ``decode_header``): scanning starts at ``start``.
    """

    CHUNK = 1 << 20

    def __init__(
        self,
        source: bytes | bytearray | memoryview | ReadFn,
        *,
        end: int | None = None,
        start: int = HEADER_SIZE,
        verify: VerifyFn | None = None,
        where: str = "entry log",
        skip_corrupt: bool = False,
    ) -> None:
        if isinstance(source, (bytes, bytearray, memoryview)):
            data = bytes(source)
            self._read: ReadFn = lambda off, n: data[off : off + n]
            self._end = len(data) if end is None else min(end, len(data))
        else:
            if end is None:
                raise ValueError("end is required when scanning through a read callable")
            self._read = source
            self._end = end
        self._start = start
        self._verify = verify
        self._where = where
        self._skip = skip_corrupt
        self.report = ScanReport(offset=start)
        # read window: bytes [self._base, self._base + len(self._buf))
        self._base = start
        self._buf = b""

    def _window(self, pos: int, n: int) -> bytes:
        """Up to ``n`` bytes at ``pos`` (fewer only at the end), through a chunked window."""
        if not (self._base <= pos and pos + n <= self._base + len(self._buf)):
            want = max(n, self.CHUNK)
            want = min(want, max(0, self._end - pos))
            self._buf = bytes(self._read(pos, want)) if want > 0 else b""
            self._base = pos
        rel = pos - self._base
        return self._buf[rel : rel + n]

    def _stop(self, kind: ScanStop, pos: int, reason: str) -> None:
        self.report.stop = kind
        self.report.offset = pos
        self.report.reason = reason

    def _sane_at(self, pos: int) -> int | None:
        """The size of the record at ``pos`` if its header is sane (size, fits, ids, map batch
        or ``verify``), else None."""
        end = self._end
        if pos + SIZE_FIELD + MIN_SANE_ENTRY_SIZE > end:
            return None
        size = decode_size(self._window(pos, SIZE_FIELD))
        if size < MIN_SANE_ENTRY_SIZE or pos + SIZE_FIELD + size > end:
            return None
        lid, eid = _IDS.unpack_from(self._window(pos + SIZE_FIELD, MIN_SANE_ENTRY_SIZE), 0)
        if lid == INVALID_LEDGER_ID:
            if eid != LEDGERS_MAP_ENTRY_ID:
                return None
            try:
                decode_ledgers_map_batch(self._window(pos + SIZE_FIELD, size))
            except CorruptionError:
                return None
            return size
        if lid < 0 or eid < 0:
            return None
        if self._verify is not None and not self._verify(self._window(pos + SIZE_FIELD, size)):
            return None
        return size

    def _plausible_at(self, pos: int) -> bool:
        """A sane record at ``pos`` followed by the end, padding or another sane record."""
        size = self._sane_at(pos)
        if size is None:
            return False
        after = pos + SIZE_FIELD + size
        if after + SIZE_FIELD > self._end:
            return True
        if decode_size(self._window(after, SIZE_FIELD)) <= 0:
            return True  # padding (zero fill at the tail, 0xF0 alignment fill)
        return self._sane_at(after) is not None

    def _resync(self, pos: int, size: int) -> int | None:
        """Where scanning resumes after the unreadable record at ``pos`` (module docstring),
        or None if nothing plausible follows (a torn tail)."""
        end = self._end
        after = pos + SIZE_FIELD + size
        if size >= MIN_SANE_ENTRY_SIZE and after <= end and (
            after + SIZE_FIELD > end or self._plausible_at(after)
        ):
            return after  # the size field was right: only this record is bad
        # A byte-by-byte walk; bounded so a log of garbage cannot hold a GC pass for hours.
        for cand in range(pos + 1, min(end - SIZE_FIELD - MIN_SANE_ENTRY_SIZE + 1, pos + RESYNC_MAX_BYTES)):
            if self._plausible_at(cand):
                return cand
        return None

    def _skip_or_stop(self, kind: ScanStop, pos: int, size: int, reason: str) -> int | None:
        """In a skipping scan, record the unreadable span and return where to resume; else (or
        when nothing plausible follows) stop the scan and return None."""
        if self._skip:
            resume = self._resync(pos, size)
            if resume is not None:
                self.report.skipped.append(SkippedSpan(pos, resume, reason))
                return resume
        self._stop(kind, pos, reason)
        return None

    def __iter__(self) -> Iterator[LogRecord]:
        pos = self._start
        end = self._end
        report = self.report
        while True:
            if pos >= end:
                self._stop(ScanStop.END, end, "end of log")
                return
            if pos + SIZE_FIELD > end:
                if not self._window(pos, end - pos).strip(b"\x00"):
                    report.padding_bytes += end - pos  # zero fill up to the end
                    self._stop(ScanStop.END, end, "end of log")
                else:
                    self._stop(
                        ScanStop.TRUNCATED, pos, f"{end - pos} trailing bytes, no room for a size field"
                    )
                return
            head = self._window(pos, SIZE_FIELD)
            if len(head) < SIZE_FIELD:
                self._stop(ScanStop.TRUNCATED, pos, "short read of a size field")
                return
            size = decode_size(head)
            if size <= 0:
                # Padding (preallocated zeros, 0xF0 alignment fill): advance one byte, as BookKeeper
                # does. Skip a run of zero bytes at once: every window inside it reads 0.
                step = 1
                if size == 0:
                    window = self._window(pos, 1 << 16)
                    stripped = len(window) - len(window.lstrip(b"\x00"))
                    step = max(1, stripped - (SIZE_FIELD - 1)) if stripped < len(window) else max(1, stripped)
                report.padding_bytes += step
                pos += step
                continue
            body_pos = pos + SIZE_FIELD
            resume: int | None
            if size < MIN_SANE_ENTRY_SIZE:
                resume = self._skip_or_stop(
                    ScanStop.CORRUPT, pos, size, f"record size {size} < {MIN_SANE_ENTRY_SIZE}"
                )
                if resume is None:
                    return
                pos = resume
                continue
            if body_pos + size > end:
                resume = self._skip_or_stop(
                    ScanStop.TRUNCATED, pos, size, f"record of {size} bytes runs past the end of the log ({end})"
                )
                if resume is None:
                    return
                pos = resume
                continue
            body = self._window(body_pos, size)
            if len(body) < size:
                self._stop(ScanStop.TRUNCATED, pos, f"short read: {len(body)} of {size} bytes")
                return
            lid, eid = _IDS.unpack_from(body, 0)
            if lid == INVALID_LEDGER_ID:
                try:
                    report.map_batches.append((pos, decode_ledgers_map_batch(body, where=self._where)))
                except CorruptionError:
                    pass  # BookKeeper skips any -1 record; the map is advisory
                pos = body_pos + size
                continue
            bad = ""
            if lid < 0 or eid < 0:
                bad = f"record has negative ids (ledger {lid}, entry {eid})"
            elif self._verify is not None and not self._verify(body):
                bad = f"entry (ledger {lid}, entry {eid}) fails verification"
            if bad:
                resume = self._skip_or_stop(ScanStop.CORRUPT, pos, size, bad)
                if resume is None:
                    return
                pos = resume
                continue
            report.records += 1
            yield LogRecord(body_pos, lid, eid, body)
            pos = body_pos + size

    def describe_stop(self) -> str:
        r = self.report
        return f"{self._where} offset {r.offset}: {r.stop.value}: {r.reason}"


def scan_entry_log(
    source: bytes | bytearray | memoryview | ReadFn,
    *,
    end: int | None = None,
    start: int = HEADER_SIZE,
    verify: VerifyFn | None = None,
    where: str = "entry log",
    skip_corrupt: bool = False,
) -> tuple[list[LogRecord], ScanReport]:
    """Scan a whole log into memory: convenient for tests and small logs."""
    scanner = EntryLogScanner(source, end=end, start=start, verify=verify, where=where, skip_corrupt=skip_corrupt)
    records = list(scanner)
    return records, scanner.report


def ledger_sizes(records: list[LogRecord]) -> dict[int, int]:
    """The ledgers map a log with these records should carry: Σ(4 + entry length) per ledger."""
    sizes: dict[int, int] = {}
    for rec in records:
        sizes[rec.ledger_id] = sizes.get(rec.ledger_id, 0) + SIZE_FIELD + rec.size
    return sizes
