"""The stored entry: BookKeeper's client entry format, its digests, the LAC body and master keys.

Responsibility: turn (ledger, entry id, LAC, cumulative length, payload) into the exact bytes a
bookie stores and a reader verifies, and back. Pure: no I/O, no clock.

Stored entry layout (big-endian, BookKeeper ``DigestManager``)::

    offset  size  field
    0       8     ledgerId
    8       8     entryId            (>= 0 for data; negative ids are reserved for meta records)
    16      8     lastAddConfirmed   (the writer's LAC when it sent the entry, -1 if none)
    24      8     length             (cumulative ledger length in bytes, including this payload)
    32      D     digest             CRC32 D=8 (BE long, high 4 bytes zero), HMAC-SHA1 D=20,
                                      CRC32C D=4 (BE int), DUMMY D=0
    32+D    n     payload

The digest input is bytes ``[0, 32)`` followed by the payload (never the digest itself).

LAC body layout (explicit LAC, WRITE_LAC / READ_LAC)::

    ledgerId(8) lac(8) digest(D)        the digest covers the first 16 bytes

Keys: ``master_key(password) = SHA1(b"ledger" + password)`` (sent with every add and fencing
read; the bookie stores it and answers EUA on mismatch); the HMAC key is
``SHA1(b"mac" + password)``.

Invariants:
* ``verify(compute(...))`` returns the same fields and payload for every digest type.
* For CRC32, CRC32C and HMAC any change to the header, digest or payload bytes is detected
  (for a single-bit flip: always). DUMMY only checks the ledger id, the entry id and the length.
* ``compute`` copies the payload exactly once (into the returned bytes); ``compute_prefix``
  copies it never, for callers that send ``[prefix, payload]`` as separate buffers.
* A bookie, which knows no password, checks keyless digests only: ``sniff_checksum`` names
  CRC32 or CRC32C for an entry that verifies with it, ``checksum_matches`` re-checks one; an
  HMAC or DUMMY entry is never reported as matching (up to a chance CRC match).
"""

from __future__ import annotations

import hashlib
import hmac
import struct
import zlib
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from itertools import repeat
from operator import add
from typing import TypeAlias, overload

import crc32c

from vellum.errors import CorruptionError, DigestMismatchError, IncorrectParameterError
from vellum.frozen import builder

#: bytes-like values accepted as payloads and stored entries
BytesLike: TypeAlias = bytes | bytearray | memoryview

ENTRY_HEADER_SIZE = 32
LAC_HEADER_SIZE = 16

_HEADER = struct.Struct(">qqqq")
_LAC_HEADER = struct.Struct(">qq")
# CRC32 is an unsigned 32-bit value that Java writes with putLong: 8 bytes, high half zero.
_CRC32_DIGEST = struct.Struct(">Q")
_CRC32C_DIGEST = struct.Struct(">I")

assert _HEADER.size == ENTRY_HEADER_SIZE and _LAC_HEADER.size == LAC_HEADER_SIZE


class DigestType(IntEnum):
    """Digest of a ledger's entries; the values are BookKeeper's metadata enum (``DataFormats``)."""

    CRC32 = 1
    HMAC = 2
    CRC32C = 3
    DUMMY = 4

    @classmethod
    def parse(cls, name: str) -> DigestType:
        """Parse a configured name (``CRC32``, ``CRC32C``, ``HMAC`` or its alias ``MAC``, ``DUMMY``)."""
        key = name.strip().upper()
        found = _DIGEST_NAMES.get(key)
        if found is None:
            raise IncorrectParameterError(
                f"unknown digest type {name!r}: expected one of CRC32, CRC32C, HMAC (alias MAC), DUMMY"
            )
        return found


_DIGEST_NAMES: dict[str, DigestType] = {
    "CRC32": DigestType.CRC32,
    "CRC32C": DigestType.CRC32C,
    "HMAC": DigestType.HMAC,
    "MAC": DigestType.HMAC,  # BookKeeper's client-side DigestType name for HMAC
    "DUMMY": DigestType.DUMMY,
}

_DIGEST_LENGTHS: dict[DigestType, int] = {
    DigestType.CRC32: 8,
    DigestType.HMAC: 20,
    DigestType.CRC32C: 4,
    DigestType.DUMMY: 0,
}


def digest_length(digest_type: DigestType) -> int:
    """Bytes of digest after the 32-byte header: CRC32 8, HMAC 20, CRC32C 4, DUMMY 0."""
    return _DIGEST_LENGTHS[DigestType(digest_type)]


def master_key(password: bytes) -> bytes:
    """The ledger's master key, ``SHA1(b"ledger" + password)`` (20 bytes)."""
    return hashlib.sha1(b"ledger" + password).digest()


def mac_key(password: bytes) -> bytes:
    """The HMAC-SHA1 key of an HMAC ledger, ``SHA1(b"mac" + password)`` (20 bytes)."""
    return hashlib.sha1(b"mac" + password).digest()


@dataclass(frozen=True, slots=True)
class Entry:
    """A verified entry: its header fields and its payload."""

    ledger_id: int
    entry_id: int
    lac: int
    length: int
    payload: bytes


#: ``Entry(...)`` taking every field, for ``DigestManager.verify`` (once per entry a client
#: reads): about half the cost of the frozen class's own ``__init__`` (``vellum.frozen``)
_new_entry = builder(Entry)


def parse_entry_header(buf: BytesLike) -> tuple[int, int, int, int]:
    """``(ledger_id, entry_id, lac, length)`` of a stored entry, without verifying its digest."""
    if len(buf) < ENTRY_HEADER_SIZE:
        raise CorruptionError(
            f"entry of {len(buf)} bytes is shorter than its {ENTRY_HEADER_SIZE}-byte header"
        )
    ledger_id, entry_id, lac, length = _HEADER.unpack_from(buf)
    return ledger_id, entry_id, lac, length


# -- checksums a bookie can verify without the ledger's password ------------------------------
#
# A bookie is never told a ledger's digest type, and an HMAC digest needs the password it never
# sees. CRC32 and CRC32C digests are keyless, so a bookie can recognise them on the entries it
# is given (``sniff_checksum``) and then check what it reads back (``checksum_matches``).

_CRC32C_END = ENTRY_HEADER_SIZE + 4
_CRC32_END = ENTRY_HEADER_SIZE + 8
_ZERO4 = b"\x00\x00\x00\x00"
# Bound once: this runs per entry read from disk, where attribute lookups and enum compares
# were a third of its cost (~1.0 us -> ~0.7 us for a 1 KiB entry).
_CRC32C_CODE = int(DigestType.CRC32C)
_CRC32_CODE = int(DigestType.CRC32)
_crc32c_fn = crc32c.crc32c
_crc32_fn = zlib.crc32
_unpack_crc32c = _CRC32C_DIGEST.unpack_from
_unpack_crc32 = _CRC32_DIGEST.unpack_from
#: digest type -> (CRC function, digest unpacker, end of the digest) of the keyless digests
_KEYLESS: dict[int, tuple[Callable[..., int], Callable[..., tuple[int]], int]] = {
    _CRC32C_CODE: (_crc32c_fn, _unpack_crc32c, _CRC32C_END),
    _CRC32_CODE: (_crc32_fn, _unpack_crc32, _CRC32_END),
}
_CRC32C_CHECKED = struct.Struct(">qqq8xI")  # ledger id, entry id, LAC and CRC32C digest of a stored entry
_CRC32C_ENTRY = struct.Struct(">qqqqI")  # a CRC32C entry's header and digest (``DigestManager.verify``)
_CRC32C_TYPE = DigestType.CRC32C


def checksum_matches(entry: BytesLike, digest_type: int) -> bool:
    """Whether a stored entry's CRC32C or CRC32 digest (``digest_type`` 3 or 1) matches its
    header and payload. Other digest types cannot be checked without the password: False.

    Cheap on the read path: one hardware CRC32C (or zlib CRC32) pass over views, no copy.
    """
    keyless = _KEYLESS.get(digest_type)
    if keyless is None:
        return False
    view = entry if type(entry) is memoryview else memoryview(entry)
    return _matches(view, 0, len(view), *keyless)


def checksums_match(buf: memoryview, starts: Sequence[int], ends: Sequence[int], digest_type: int) -> int:
    """How many of the stored entries ``buf[starts[i]:ends[i]]``, from the first, match their
    CRC32C or CRC32 digest: ``checksum_matches`` of each, in one pass over one buffer (a run
    read from an entry log is checked without an object per entry). 0 for other digest types.
    """
    keyless = _KEYLESS.get(digest_type)
    if keyless is None:
        return 0
    crc, unpack, digest_end = keyless
    # ``_matches`` of each, written out: a Python call per entry was an eighth of this loop.
    hsize = ENTRY_HEADER_SIZE
    good = 0
    for start, end in zip(starts, ends):
        if (end - start < digest_end
                or unpack(buf, start + hsize)[0] != crc(buf[start + digest_end:end], crc(buf[start:start + hsize]))):
            break
        good += 1
    return good


def _matches(buf: memoryview, start: int, end: int, crc: Callable[..., int],
             unpack: Callable[..., tuple[int]], digest_end: int) -> bool:
    """The keyless check of the entry ``buf[start:end]``: the digest stored after the 32-byte
    header equals the CRC of the header and the payload after the digest. (For CRC32 the stored
    8-byte BE long must have its high half zero: comparing all 8 bytes checks that too.)"""
    return (end - start >= digest_end
            and unpack(buf, start + ENTRY_HEADER_SIZE)[0]
            == crc(buf[start + digest_end:end], crc(buf[start:start + ENTRY_HEADER_SIZE])))


def sniff_checksum(entry: BytesLike) -> DigestType | None:
    """The keyless digest a stored entry verifies with: CRC32C or CRC32, else None (an HMAC or
    DUMMY entry, or a damaged one).

    A chance match has probability 2**-32 for CRC32C (2**-64 for CRC32, whose digest starts
    with four zero bytes), so a caller learning a ledger's type keeps checking a few entries and
    gives up on the ledger at the first disagreement.
    """
    # A CRC32 digest's high half is zero; a CRC32C digest is zero only by a 2**-32 chance.
    if (len(entry) >= _CRC32_END and bytes(memoryview(entry)[ENTRY_HEADER_SIZE:_CRC32C_END]) == _ZERO4
            and checksum_matches(entry, DigestType.CRC32)):
        return DigestType.CRC32
    if checksum_matches(entry, DigestType.CRC32C):
        return DigestType.CRC32C
    return None


# A digest function takes the digest input in two pieces (header, rest) so the payload is
# never concatenated just to be checksummed.
_DigestFn: TypeAlias = Callable[[BytesLike, BytesLike], bytes]


def _crc32_digest(head: BytesLike, rest: BytesLike) -> bytes:
    return _CRC32_DIGEST.pack(zlib.crc32(rest, zlib.crc32(head)))


def _crc32c_digest(head: BytesLike, rest: BytesLike) -> bytes:
    return _CRC32C_DIGEST.pack(crc32c.crc32c(rest, crc32c.crc32c(head)))


def _dummy_digest(head: BytesLike, rest: BytesLike) -> bytes:
    return b""


def _hmac_digest_fn(password: bytes) -> _DigestFn:
    # Keying HMAC hashes the key twice; copying a keyed template is cheaper per entry.
    template = hmac.new(mac_key(password), digestmod=hashlib.sha1)

    def digest(head: BytesLike, rest: BytesLike) -> bytes:
        mac = template.copy()
        mac.update(head)
        mac.update(rest)
        return mac.digest()

    return digest


class PayloadSpans(Sequence[BytesLike]):
    """A run of byte strings (entries, or their payloads) as spans of a few buffers: item i is
    ``buffers[buf[i]][starts[i]:ends[i]]``. A bulk read's entries stay where they arrived (one
    buffer per bookie answer) and are checked and decoded from these offsets, with no object
    per entry; everyone else uses it as the sequence it is (an item is a view)."""

    __slots__ = ("buf", "buffers", "ends", "starts")

    def __init__(self, buffers: list[memoryview], buf: array[int], starts: array[int], ends: array[int]) -> None:
        if not len(buf) == len(starts) == len(ends):
            raise ValueError(f"PayloadSpans: {len(buf)} buffer indexes, {len(starts)} starts, {len(ends)} ends")
        self.buffers = buffers
        self.buf = buf
        self.starts = starts
        self.ends = ends

    @classmethod
    def of(cls, items: Sequence[BytesLike]) -> PayloadSpans:
        """Each item a buffer of its own."""
        if isinstance(items, PayloadSpans):
            return items
        views = [x if type(x) is memoryview else memoryview(x) for x in items]
        return cls(views, array("I", range(len(views))), array("q", bytes(8 * len(views))),
                   array("q", map(len, views)))

    @classmethod
    def in_one(cls, body: memoryview, starts: array[int], ends: array[int]) -> PayloadSpans:
        """Spans of one buffer."""
        return cls([body], array("I", bytes(4 * len(starts))), starts, ends)

    @classmethod
    def concat(cls, parts: Sequence[PayloadSpans]) -> PayloadSpans:
        """The items of ``parts`` one after another."""
        if len(parts) == 1:
            return parts[0]
        buffers: list[memoryview] = []
        buf, starts, ends = array("I"), array("q"), array("q")
        for part in parts:
            base = len(buffers)
            buffers.extend(part.buffers)
            buf.extend(part.buf if base == 0 else array("I", map(add, part.buf, repeat(base))))
            starts.extend(part.starts)
            ends.extend(part.ends)
        return cls(buffers, buf, starts, ends)

    @classmethod
    def interleave(cls, n: int, parts: Sequence[tuple[int, int, PayloadSpans]]) -> PayloadSpans:
        """``n`` items, part ``(at, step, spans)`` giving items ``at, at + step, ...``; every
        position must be given by exactly one part."""
        buffers: list[memoryview] = []
        buf, starts, ends = array("I", bytes(4 * n)), array("q", bytes(8 * n)), array("q", bytes(8 * n))
        given = 0
        for at, step, part in parts:
            k = len(part)
            if not k:
                continue
            base = len(buffers)
            buffers.extend(part.buffers)
            where = slice(at, at + (k - 1) * step + 1, step)
            buf[where] = part.buf if base == 0 else array("I", map(add, part.buf, repeat(base)))
            starts[where] = part.starts
            ends[where] = part.ends
            given += k
        if given != n:
            raise ValueError(f"PayloadSpans.interleave: {given} items given for {n} positions")
        return cls(buffers, buf, starts, ends)

    def __len__(self) -> int:
        return len(self.starts)

    @overload
    def __getitem__(self, i: int) -> BytesLike: ...
    @overload
    def __getitem__(self, i: slice) -> PayloadSpans: ...
    def __getitem__(self, i: int | slice) -> BytesLike | PayloadSpans:
        if isinstance(i, slice):
            return PayloadSpans(self.buffers, self.buf[i], self.starts[i], self.ends[i])
        return self.buffers[self.buf[i]][self.starts[i]:self.ends[i]]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (bytes, bytearray, memoryview, str)):
            return NotImplemented
        return len(self) == len(other) and all(bytes(a) == bytes(b) for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PayloadSpans({len(self)} items in {len(self.buffers)} buffers)"


class DigestManager:
    """Computes and verifies the stored entries and LAC bodies of one ledger.

    ``password`` only matters for HMAC (it keys the MAC); the master key a bookie checks is
    derived separately by :func:`master_key`.
    """

    __slots__ = ("_checksum", "_digest", "digest_length", "digest_type", "ledger_id")

    def __init__(self, ledger_id: int, digest_type: DigestType, password: bytes = b"") -> None:
        self.ledger_id = ledger_id
        self.digest_type = DigestType(digest_type)
        self.digest_length = _DIGEST_LENGTHS[self.digest_type]
        fn: _DigestFn
        # the checksum a run of entries maps over (``compute_run``): CRC digests only
        self._checksum: tuple[Callable[..., int], struct.Struct] | None = None
        if self.digest_type is DigestType.CRC32:
            fn = _crc32_digest
            self._checksum = (zlib.crc32, _CRC32_DIGEST)
        elif self.digest_type is DigestType.CRC32C:
            fn = _crc32c_digest
            self._checksum = (crc32c.crc32c, _CRC32C_DIGEST)
        elif self.digest_type is DigestType.HMAC:
            fn = _hmac_digest_fn(password)
        else:
            fn = _dummy_digest
        self._digest = fn

    def __repr__(self) -> str:
        return f"DigestManager(ledger_id={self.ledger_id}, digest_type={self.digest_type.name})"

    # -- entries ---------------------------------------------------------------------------

    def compute_prefix(self, entry_id: int, lac: int, length: int, payload: BytesLike) -> bytes:
        """The stored entry minus its payload (header + digest); ``prefix + payload`` is the entry.

        For senders that write ``[prefix, payload]`` as two buffers and never copy the payload.
        """
        header = _HEADER.pack(self.ledger_id, entry_id, lac, length)
        return header + self._digest(header, payload)

    def compute(self, entry_id: int, lac: int, length: int, payload: BytesLike) -> bytes:
        """The full stored entry ``ledgerId entryId lac length digest payload``.

        ``length`` is the cumulative ledger length including this payload. The payload is
        copied once, into the result.
        """
        header = _HEADER.pack(self.ledger_id, entry_id, lac, length)
        # bytes + buffer accepts memoryview/bytearray payloads without an intermediate copy.
        return header + self._digest(header, payload) + payload

    def compute_run(self, first_entry_id: int, lac: int, lengths: Sequence[int],
                    payloads: Sequence[BytesLike]) -> list[bytes]:
        """``compute`` of consecutive entries ``first_entry_id, first_entry_id + 1, ...`` that
        carry the same ``lac``; ``lengths[k]`` is the cumulative ledger length including
        ``payloads[k]``. The same bytes as one ``compute`` per entry; for CRC digests the
        headers, checksums and entries are made by ``map`` (no Python call per entry)."""
        n = len(payloads)
        if len(lengths) != n:
            raise ValueError(f"ledger {self.ledger_id}: {len(lengths)} lengths for {n} payloads")
        headers = list(map(_HEADER.pack, repeat(self.ledger_id, n),
                           range(first_entry_id, first_entry_id + n), repeat(lac, n), lengths))
        if self._checksum is None:
            digest = self._digest
            return [header + digest(header, payload) + payload for header, payload in zip(headers, payloads)]
        checksum, packer = self._checksum
        digests = map(packer.pack, map(checksum, payloads, map(checksum, headers)))
        return list(map(add, map(add, headers, digests), payloads))

    def verify(self, entry: BytesLike, expected_entry_id: int | None = None) -> Entry:
        """Check a stored entry's size, ledger id, entry id (if given) and digest; return it.

        Raises :class:`DigestMismatchError` naming the ledger, the entry and what mismatched.
        """
        if self.digest_type is _CRC32C_TYPE and len(entry) >= _CRC32C_END:
            # CRC32C (the default digest), once per entry a client reads: the header and the
            # digest in one unpack, the CRC compared as the int it is (a CRC is no secret: no
            # constant-time compare), no call of the digest function. Whatever does not match
            # falls through to the checks below, which name it.
            ledger_id, entry_id, lac, length, stored = _CRC32C_ENTRY.unpack_from(entry)
            if ledger_id == self.ledger_id and (expected_entry_id is None or entry_id == expected_entry_id):
                view = memoryview(entry)
                payload = view[_CRC32C_END:]
                if stored == _crc32c_fn(payload, _crc32c_fn(view[:ENTRY_HEADER_SIZE])):
                    return _new_entry(ledger_id, entry_id, lac, length, bytes(payload))
        size = len(entry)
        dlen = self.digest_length
        if size < ENTRY_HEADER_SIZE + dlen:
            where = f"ledger {self.ledger_id}" + (
                f" entry {expected_entry_id}" if expected_entry_id is not None else ""
            )
            raise DigestMismatchError(
                f"{where}: entry of {size} bytes is shorter than the {ENTRY_HEADER_SIZE + dlen}-byte "
                f"header and {self.digest_type.name} digest"
            )
        ledger_id, entry_id, lac, length = _HEADER.unpack_from(entry)
        if ledger_id != self.ledger_id:
            raise DigestMismatchError(
                f"ledger {self.ledger_id}: entry {entry_id} carries ledger id {ledger_id}"
            )
        if expected_entry_id is not None and entry_id != expected_entry_id:
            raise DigestMismatchError(
                f"ledger {self.ledger_id}: expected entry {expected_entry_id}, found entry {entry_id}"
            )
        view = memoryview(entry)
        payload = view[ENTRY_HEADER_SIZE + dlen :]
        if dlen:
            stored = view[ENTRY_HEADER_SIZE : ENTRY_HEADER_SIZE + dlen]
            computed = self._digest(view[:ENTRY_HEADER_SIZE], payload)
            # compare_digest: constant time, so an HMAC cannot be guessed byte by byte.
            if not hmac.compare_digest(computed, stored):
                raise DigestMismatchError(
                    f"ledger {ledger_id} entry {entry_id}: {self.digest_type.name} digest mismatch "
                    f"(stored {bytes(stored).hex()}, computed {computed.hex()} over {size} bytes)"
                )
        return _new_entry(ledger_id, entry_id, lac, length, bytes(payload))

    def verify_payloads(self, entries: Sequence[BytesLike], first_entry_id: int,
                        stride: int = 1) -> tuple[PayloadSpans, int]:
        """:meth:`verify_spans` of entries given one by one (each its own buffer)."""
        return self.verify_spans(PayloadSpans.of(entries), first_entry_id, stride)

    def verify_spans(self, entries: PayloadSpans, first_entry_id: int,
                     stride: int = 1) -> tuple[PayloadSpans, int]:
        """Check stored entries ``first_entry_id, first_entry_id + stride, ...`` as
        :meth:`verify` does each (size, ledger id, entry id, digest) and return their payloads
        (spans of the same buffers, not copies) and the greatest LAC they carry (-1 if none).

        For bulk readers: no object per entry; the entries are read where they lie in the
        buffers they arrived in (a bulk read's answer). CRC32C (the default digest) is checked
        inline; every other type entry by entry through :meth:`verify`, whose errors this
        raises too (the first entry that fails raises; nothing is returned).
        """
        bufs, which, starts, ends = entries.buffers, entries.buf, entries.starts, entries.ends
        payload_starts = array("q")
        add = payload_starts.append
        lac_max = -1
        eid = first_entry_id
        if self.digest_type is not DigestType.CRC32C:
            skip = ENTRY_HEADER_SIZE + self.digest_length
            for i, s in enumerate(starts):
                got = self.verify(bufs[which[i]][s:ends[i]], eid)
                add(s + skip)
                if got.lac > lac_max:
                    lac_max = got.lac
                eid += stride
            return PayloadSpans(bufs, which, payload_starts, ends), lac_max
        head = _CRC32C_CHECKED.unpack_from
        crc = _crc32c_fn
        lid = self.ledger_id
        hsize = ENTRY_HEADER_SIZE
        skip = _CRC32C_END
        # one answer (the usual case): no buffer lookup per entry
        sources = repeat(bufs[0]) if len(bufs) == 1 else map(bufs.__getitem__, which)
        for src, s, e in zip(sources, starts, ends):
            p = s + skip
            if p > e:
                self.verify(src[s:e], eid)  # raises, naming what is wrong
            ledger_id, entry_id, lac, stored = head(src, s)
            if (ledger_id != lid or entry_id != eid
                    or stored != crc(src[p:e], crc(src[s:s + hsize]))):
                self.verify(src[s:e], eid)  # raises, naming what is wrong
            add(p)
            if lac > lac_max:
                lac_max = lac
            eid += stride
        return PayloadSpans(bufs, which, payload_starts, ends), lac_max

    # -- explicit LAC ----------------------------------------------------------------------

    def compute_lac(self, lac: int) -> bytes:
        """The LAC body ``ledgerId(8) lac(8) digest`` (digest over the first 16 bytes)."""
        header = _LAC_HEADER.pack(self.ledger_id, lac)
        return header + self._digest(header, b"")

    def verify_lac(self, buf: BytesLike) -> int:
        """Check a LAC body and return its LAC; raises :class:`DigestMismatchError`."""
        expected = LAC_HEADER_SIZE + self.digest_length
        if len(buf) != expected:
            raise DigestMismatchError(
                f"ledger {self.ledger_id}: LAC body of {len(buf)} bytes, expected {expected} "
                f"for {self.digest_type.name}"
            )
        ledger_id, lac = _LAC_HEADER.unpack_from(buf)
        if ledger_id != self.ledger_id:
            raise DigestMismatchError(f"ledger {self.ledger_id}: LAC body carries ledger id {ledger_id}")
        if self.digest_length:
            view = memoryview(buf)
            stored = view[LAC_HEADER_SIZE:]
            computed = self._digest(view[:LAC_HEADER_SIZE], b"")
            if not hmac.compare_digest(computed, stored):
                raise DigestMismatchError(
                    f"ledger {ledger_id}: LAC body (lac {lac}) {self.digest_type.name} digest mismatch "
                    f"(stored {bytes(stored).hex()}, computed {computed.hex()})"
                )
        return lac
