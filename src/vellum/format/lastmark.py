"""The journal log mark and its 16-byte ``lastMark`` file body.

Byte layout (big-endian): ``int64 journal_id`` then ``int64 offset``: the journal file id and the
byte position in that file up to which everything has been persisted by ledger storage.
Marks order by (journal_id, offset); a bookie replays journals from the greatest mark found in
any ledger dir. Pure: encoding and decoding only.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from vellum.errors import CorruptionError

_MARK = struct.Struct(">qq")
LAST_MARK_SIZE = _MARK.size  # 16


@dataclass(frozen=True, order=True, slots=True)
class LogMark:
    """A position in the journal: everything before it is durable in ledger storage."""

    journal_id: int
    offset: int

    def encode(self) -> bytes:
        return _MARK.pack(self.journal_id, self.offset)

    @classmethod
    def decode(cls, data: bytes, *, where: str = "lastMark") -> LogMark:
        if len(data) != LAST_MARK_SIZE:
            raise CorruptionError(f"{where}: expected {LAST_MARK_SIZE} bytes, found {len(data)}")
        journal_id, offset = _MARK.unpack(data)
        if journal_id < 0 or offset < 0:
            raise CorruptionError(f"{where}: negative journal id or offset ({journal_id}, {offset})")
        return cls(journal_id, offset)


#: The mark of a bookie that has never checkpointed: replay every journal from the start.
ZERO_MARK = LogMark(0, 0)


def last_mark_file_name(journal_index: int, journal_count: int) -> str:
    """``lastMark`` with one journal, ``lastMark.<index>`` with several (BookKeeper's naming)."""
    return "lastMark" if journal_count <= 1 else f"lastMark.{journal_index}"
