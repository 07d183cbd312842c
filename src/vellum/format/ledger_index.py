"""Key and value layouts of DbLedgerStorage's RocksDB indexes (BookKeeper's exact bytes).

``locations`` database (BookKeeper's ``EntryLocationIndex``)::

    key   16 bytes  int64 ledgerId || int64 entryId      (big-endian)
    value  8 bytes  int64 location = logId << 32 | offset of the entry body

``ledgers`` database (BookKeeper's ``LedgerMetadataIndex``)::

    key    8 bytes  int64 ledgerId
    value  protobuf (proto2) LedgerData:
             1 exists      bool   (required)   tag 0x08
             2 fenced      bool   (required)   tag 0x10
             3 masterKey   bytes  (required)   tag 0x1a
             4 explicitLac bytes  (optional)   tag 0x22
             5 limbo       bool   (optional)   tag 0x28
           100 vellumDigestType uint32 (optional) tag 0xa0 0x06   Vellum's own, see below
    special key int64 -0xeefd (``ffffffffffff1103``): 8-byte int64 storage flags,
             bit 0x1 = NEEDS_INTEGRITY_CHECK

``vellumDigestType`` is the keyless digest the bookie learnt from the ledger's entries as they
were added, so that it can verify what it reads back from its entry logs: 1 = CRC32,
3 = CRC32C (BookKeeper's ``DigestType`` numbers), 0 = neither verified (an HMAC or DUMMY
ledger: its entries are never checked); absent = not learnt (a ledger from before the field,
or rebuilt from entry logs: not checked either). A field number far above BookKeeper's keeps
clear of fields it may add; BookKeeper's readers skip it as an unknown field.

Invariants: RocksDB uses its default bytewise comparator, so keys of negative ids sort after
every non-negative one; only non-negative ledger ids are real ledgers, and the flags key sorts
last. The protobuf codec is hand-written: varints and length-delimited fields, unknown fields
skipped, missing required fields reported as corruption. Pure: no I/O.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import repeat

from vellum.errors import CorruptionError
from vellum.ids import INT64_MAX

_LOC_KEY = struct.Struct(">qq")
_LONG = struct.Struct(">q")

LOCATION_KEY_SIZE = 16
LOCATION_VALUE_SIZE = 8
LEDGER_KEY_SIZE = 8
STORAGE_FLAGS_LEDGER_ID = -0xEEFD
NEEDS_INTEGRITY_CHECK = 0x1
#: ``LedgerData.digest_type`` of a ledger whose entries verify with no keyless digest
DIGEST_NOT_CHECKABLE = 0
_DIGEST_TYPE_FIELD = 100


def location_key(ledger_id: int, entry_id: int) -> bytes:
    return _LOC_KEY.pack(ledger_id, entry_id)


def location_keys(ledger_id: int, entry_ids: Iterable[int]) -> Iterator[bytes]:
    """``location_key(ledger_id, e)`` for each ``e`` of ``entry_ids`` (a run of one ledger),
    without a Python call per entry."""
    return map(_LOC_KEY.pack, repeat(ledger_id), entry_ids)


def encode_locations(locations: Iterable[int]) -> Iterator[bytes]:
    """``encode_location`` of each location, without a Python call per location."""
    return map(_LONG.pack, locations)


def decode_location_key(key: bytes) -> tuple[int, int]:
    if len(key) != LOCATION_KEY_SIZE:
        raise CorruptionError(f"locations key of {len(key)} bytes, expected {LOCATION_KEY_SIZE}")
    lid, eid = _LOC_KEY.unpack(key)
    return lid, eid


def ledger_upper_key(ledger_id: int) -> bytes:
    """The greatest key of a ledger's data entries: (ledgerId, Long.MAX_VALUE)."""
    return _LOC_KEY.pack(ledger_id, INT64_MAX)


def encode_location(location: int) -> bytes:
    return _LONG.pack(location)


def decode_location(value: bytes) -> int:
    if len(value) != LOCATION_VALUE_SIZE:
        raise CorruptionError(f"location value of {len(value)} bytes, expected {LOCATION_VALUE_SIZE}")
    return int(_LONG.unpack(value)[0])


def ledger_key(ledger_id: int) -> bytes:
    return _LONG.pack(ledger_id)


def decode_ledger_key(key: bytes) -> int:
    if len(key) != LEDGER_KEY_SIZE:
        raise CorruptionError(f"ledgers key of {len(key)} bytes, expected {LEDGER_KEY_SIZE}")
    return int(_LONG.unpack(key)[0])


STORAGE_FLAGS_KEY = ledger_key(STORAGE_FLAGS_LEDGER_ID)


def encode_storage_flags(flags: int) -> bytes:
    return _LONG.pack(flags)


def decode_storage_flags(value: bytes) -> int:
    if len(value) != 8:
        raise CorruptionError(f"storage flags value of {len(value)} bytes, expected 8")
    return int(_LONG.unpack(value)[0])


# ---------------------------------------------------------------------------------------------
# Minimal protobuf wire format

_VARINT, _I64, _LEN, _SGROUP, _EGROUP, _I32 = 0, 1, 2, 3, 4, 5


def _put_varint(out: bytearray, value: int) -> None:
    value &= (1 << 64) - 1  # negative int64 are ten-byte varints, as protobuf encodes them
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return


def _get_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(data):
            raise CorruptionError(f"LedgerData: truncated varint at byte {pos}")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result & ((1 << 64) - 1), pos
        shift += 7
        if shift >= 70:
            raise CorruptionError(f"LedgerData: varint longer than 10 bytes at byte {pos}")


@dataclass(frozen=True, slots=True)
class LedgerData:
    """BookKeeper's ``DbLedgerStorageDataFormats.LedgerData``."""

    exists: bool = True
    fenced: bool = False
    master_key: bytes = field(default=b"", repr=False)
    explicit_lac: bytes | None = None
    limbo: bool | None = None
    #: Vellum's ``vellumDigestType`` (field 100): see the module docstring
    digest_type: int | None = None

    def encode(self) -> bytes:
        out = bytearray()
        out.append(0x08)
        _put_varint(out, int(self.exists))
        out.append(0x10)
        _put_varint(out, int(self.fenced))
        out.append(0x1A)
        _put_varint(out, len(self.master_key))
        out += self.master_key
        if self.explicit_lac is not None:
            out.append(0x22)
            _put_varint(out, len(self.explicit_lac))
            out += self.explicit_lac
        if self.limbo is not None:
            out.append(0x28)
            _put_varint(out, int(self.limbo))
        if self.digest_type is not None:
            _put_varint(out, _DIGEST_TYPE_FIELD << 3 | _VARINT)
            _put_varint(out, self.digest_type)
        return bytes(out)

    @classmethod
    def decode(cls, data: bytes, *, where: str = "LedgerData") -> LedgerData:
        pos = 0
        fields: dict[int, object] = {}
        try:
            while pos < len(data):
                tag, pos = _get_varint(data, pos)
                number, wire = tag >> 3, tag & 7
                if number == 0:
                    raise CorruptionError(f"{where}: field number 0 at byte {pos}")
                if wire == _VARINT:
                    value, pos = _get_varint(data, pos)
                    if number in (1, 2, 5):
                        fields[number] = value != 0
                    elif number == _DIGEST_TYPE_FIELD:
                        fields[number] = value
                elif wire == _LEN:
                    length, pos = _get_varint(data, pos)
                    if pos + length > len(data):
                        raise CorruptionError(f"{where}: field {number} of {length} bytes runs past the end")
                    if number in (3, 4):
                        fields[number] = bytes(data[pos : pos + length])
                    pos += length
                elif wire == _I64:
                    pos += 8
                elif wire == _I32:
                    pos += 4
                else:
                    raise CorruptionError(f"{where}: unsupported wire type {wire} for field {number}")
                if pos > len(data):
                    raise CorruptionError(f"{where}: field {number} runs past the end")
        except CorruptionError as e:
            if str(e).startswith(where):
                raise
            raise CorruptionError(f"{where}: {e}") from None
        for required, name in ((1, "exists"), (2, "fenced"), (3, "masterKey")):
            if required not in fields:
                raise CorruptionError(f"{where}: required field {name} is missing")
        lac = fields.get(4)
        limbo = fields.get(5)
        digest_type = fields.get(_DIGEST_TYPE_FIELD)
        return cls(
            exists=bool(fields[1]),
            fenced=bool(fields[2]),
            master_key=bytes(fields[3]),  # type: ignore[call-overload]
            explicit_lac=None if lac is None else bytes(lac),  # type: ignore[call-overload]
            limbo=None if limbo is None else bool(limbo),
            digest_type=None if digest_type is None else int(digest_type),  # type: ignore[call-overload]
        )
