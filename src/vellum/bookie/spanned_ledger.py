"""A ledger read and changed across its homes: ``LedgerView``, what the bookie asks of the
storage(s) of one ledger, and ``SpannedLedger``, the view of a ledger held in several ledger dirs
(continued after its dir filled, requirement R1 of docs/correctness.md). ``bookie/routing.py``
decides which homes a ledger has and hands out a view; this module only answers over them.

Invariants: a read looks in every home, newest first, and answers "no such entry" only when no
home holds the entry (rule 3 of docs/correctness.md); a change of the ledger's state (fence,
explicit LAC, trim, delete) reaches every home.
"""

from __future__ import annotations

from typing import Protocol

from vellum.errors import NoSuchEntryError
from vellum.ids import INVALID_ENTRY_ID, LAST_ADD_CONFIRMED
from vellum.proto.messages import PackedEntries
from vellum.storage.ledger_storage import LedgerStorage, Stored


class LedgerView(Protocol):
    """What the bookie asks of the storage(s) of one ledger (a ``LedgerStorage`` is one)."""

    def get_entry(self, ledger_id: int, entry_id: int, *, read_ahead: bool = True,
                  report_corrupt: bool = True) -> Stored: ...
    def get_entries(self, ledger_id: int, first: int, max_count: int, max_bytes: int) -> PackedEntries: ...
    def get_strided(self, ledger_id: int, first: int, stride: int, max_count: int,
                    max_bytes: int) -> PackedEntries: ...
    def get_cached_entry(self, ledger_id: int, entry_id: int) -> Stored | None: ...
    def get_last_entry_id(self, ledger_id: int) -> int: ...
    def entry_ids(self, ledger_id: int) -> list[int]: ...
    def ledger_exists(self, ledger_id: int) -> bool: ...
    def is_deleted(self, ledger_id: int) -> bool: ...
    def get_master_key(self, ledger_id: int) -> bytes | None: ...
    def is_fenced(self, ledger_id: int) -> bool: ...
    def set_fenced(self, ledger_id: int) -> bool: ...
    def get_explicit_lac(self, ledger_id: int) -> bytes | None: ...
    def set_explicit_lac(self, ledger_id: int, body: bytes) -> None: ...
    def trim(self, ledger_id: int, end_entry_id: int) -> None: ...
    def note_ledger_closed(self, ledger_id: int) -> None: ...
    def delete_ledger(self, ledger_id: int) -> None: ...



class SpannedLedger:
    """A ledger held in several storages (continued after a dir filled): reads look in every
    home, changes of its state go to every home. Write home last in ``homes``."""

    def __init__(self, homes: list[LedgerStorage]) -> None:
        self._homes = homes
        self._newest_first = homes[::-1]

    def get_entry(self, ledger_id: int, entry_id: int, *, read_ahead: bool = True,
                  report_corrupt: bool = True) -> Stored:
        if entry_id == LAST_ADD_CONFIRMED:
            entry_id = self.get_last_entry_id(ledger_id)
            if entry_id == INVALID_ENTRY_ID:
                raise NoSuchEntryError(f"ledger {ledger_id} has no entry in any of its ledger dirs")
        missing: NoSuchEntryError | None = None
        for home in self._newest_first:
            try:
                return home.get_entry(ledger_id, entry_id, read_ahead=read_ahead,
                                      report_corrupt=report_corrupt)
            except NoSuchEntryError as exc:
                missing = exc
        assert missing is not None
        raise missing

    def get_entries(self, ledger_id: int, first: int, max_count: int, max_bytes: int) -> PackedEntries:
        return self.get_strided(ledger_id, first, 1, max_count, max_bytes)

    def get_strided(self, ledger_id: int, first: int, stride: int, max_count: int,
                    max_bytes: int) -> PackedEntries:
        """Runs from each home in turn, each continuing where the previous one stopped."""
        out = PackedEntries()
        nxt = first
        while max_count <= 0 or len(out) < max_count:
            left = max_count - len(out) if max_count > 0 else 0
            budget = max_bytes - out.entry_bytes if max_bytes > 0 else 0
            if max_bytes > 0 and out and budget <= 0:
                break
            best = PackedEntries()
            for home in self._newest_first:
                try:
                    got = home.get_strided(ledger_id, nxt, stride, left, budget)
                except NoSuchEntryError:
                    continue
                if len(got) > len(best):
                    best = got
            if not best:
                if not out:
                    self.get_entry(ledger_id, first)  # raises what no home holds
                break
            if out and max_bytes > 0 and out.entry_bytes + len(best[0]) > max_bytes:
                break
            out.extend(best)
            nxt += stride * len(best)
        return out

    def get_cached_entry(self, ledger_id: int, entry_id: int) -> Stored | None:
        for home in self._newest_first:
            found = home.get_cached_entry(ledger_id, entry_id)
            if found is not None:
                return found
        return None

    def get_last_entry_id(self, ledger_id: int) -> int:
        return max(h.get_last_entry_id(ledger_id) for h in self._homes)

    def entry_ids(self, ledger_id: int) -> list[int]:
        ids: set[int] = set()
        for home in self._homes:
            ids.update(home.entry_ids(ledger_id))
        return sorted(ids)

    def ledger_exists(self, ledger_id: int) -> bool:
        return any(h.ledger_exists(ledger_id) for h in self._homes)

    def is_deleted(self, ledger_id: int) -> bool:
        return any(h.is_deleted(ledger_id) for h in self._homes)

    def get_master_key(self, ledger_id: int) -> bytes | None:
        for home in self._homes:
            key = home.get_master_key(ledger_id)
            if key is not None:
                return key
        return None

    def is_fenced(self, ledger_id: int) -> bool:
        return any(h.is_fenced(ledger_id) for h in self._homes)

    def set_fenced(self, ledger_id: int) -> bool:
        changed = [h.set_fenced(ledger_id) for h in self._homes]
        return any(changed)

    def get_explicit_lac(self, ledger_id: int) -> bytes | None:
        for home in self._newest_first:
            lac = home.get_explicit_lac(ledger_id)
            if lac is not None:
                return lac
        return None

    def set_explicit_lac(self, ledger_id: int, body: bytes) -> None:
        self._homes[-1].set_explicit_lac(ledger_id, body)

    def trim(self, ledger_id: int, end_entry_id: int) -> None:
        for home in self._homes:
            home.trim(ledger_id, end_entry_id)

    def note_ledger_closed(self, ledger_id: int) -> None:
        for home in self._homes:
            home.note_ledger_closed(ledger_id)

    def delete_ledger(self, ledger_id: int) -> None:
        for home in self._homes:
            home.delete_ledger(ledger_id)
