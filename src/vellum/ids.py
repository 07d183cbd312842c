"""Identifier types and the reserved id values shared by every layer.

Invariants: ledger and entry ids are signed 64-bit; entry ids >= 0 are data, negative entry ids
are reserved for meta records (journal special records, entry-log ledgers maps, "last entry"
queries). A location is ``log_id << 32 | offset_of_entry_body`` (BookKeeper's encoding).
No I/O here.
"""

from __future__ import annotations

from typing import NewType

LedgerId = NewType("LedgerId", int)
EntryId = NewType("EntryId", int)
BookieId = NewType("BookieId", str)

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1

#: "no entry" / empty ledger LAC
INVALID_ENTRY_ID = -1
#: READ with this entry id means "the last entry this bookie has" (a LAC read)
LAST_ADD_CONFIRMED = -1
#: ledger id used by entry-log ledgers-map batches
INVALID_LEDGER_ID = -1
#: entry id of an entry-log ledgers-map batch
LEDGERS_MAP_ENTRY_ID = -2

# Journal special records (entry id values), BookKeeper's numbers.
METAENTRY_ID_LEDGER_KEY = -0x1000
METAENTRY_ID_FENCE_KEY = -0x2000
METAENTRY_ID_FORCE_LEDGER = -0x4000
METAENTRY_ID_LEDGER_EXPLICITLAC = -0x8000

MAX_LOG_ID = (1 << 31) - 1


def make_location(log_id: int, offset: int) -> int:
    """Encode an entry location: the log id in the high 32 bits, the body offset in the low 32."""
    if not 0 <= log_id <= MAX_LOG_ID:
        raise ValueError(f"entry log id {log_id} out of range 0..{MAX_LOG_ID}")
    if not 0 <= offset < (1 << 32):
        raise ValueError(f"entry log offset {offset} out of range")
    return (log_id << 32) | offset


def location_log_id(location: int) -> int:
    return location >> 32


def location_offset(location: int) -> int:
    return location & 0xFFFFFFFF


def bookie_id_for(host: str, port: int) -> BookieId:
    """BookKeeper's default bookie id: ``host:port``."""
    return BookieId(f"{host}:{port}")
