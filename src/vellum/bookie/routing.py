"""Which ledger storage (ledger dir) holds a ledger, and where its next entry goes (rule 13 and requirement R1 of docs/correctness.md).

A bookie with several ledger dirs runs one ``LedgerStorage`` per dir. Each ledger has one or
more *homes*: the storages whose ``ledgers`` index knows it (live, or as the tombstone of a
delete). The last home is its *write home*, where new entries go; every home is read.

- A ledger no storage knows (a new one) gets the writable dir with the fewest active entry logs
  (requirement R1 of docs/correctness.md; in the shared-log mode every dir has one, and ties are spread by ledger id). It was
  once ``ledger_id % number of dirs``, which stops being true the moment
  ``allowStorageExpansion`` adds a dir: an existing ledger would then be looked up in a storage
  that never held it, which answers "no such entry", and recovery takes that as a negative
  answer and can truncate (rule 3 of docs/correctness.md). A ledger's homes are therefore found where its data is,
  never computed.
- When the write home's dir is full and another dir is writable, the ledger continues there
  (requirement R1 of docs/correctness.md: "its ledgers move to other writable dirs"): the new home first receives the
  ledger's master key, fence and explicit LAC, then the entries. A dir that becomes writable
  again is eligible again. Entries of one ledger may then span dirs; ``view`` reads across them.
- After a restart the homes are found again from the indexes; the write home is the writable
  home holding the highest entry.

Invariants: a ledger known to a storage is always read from it, whatever the number of dirs and
whichever is full; no read of a ledger answers "no such entry" while another home of the ledger
holds the entry; with one dir there is nothing to choose. Thread-safe.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from vellum.errors import NoSuchEntryError
from vellum.ids import INVALID_ENTRY_ID, LAST_ADD_CONFIRMED
from vellum.storage.ledger_storage import LedgerStorage, Stored

log = logging.getLogger(__name__)


class LedgerView(Protocol):
    """What the bookie asks of the storage(s) of one ledger (a ``LedgerStorage`` is one)."""

    def get_entry(self, ledger_id: int, entry_id: int, *, read_ahead: bool = True,
                  report_corrupt: bool = True) -> Stored: ...
    def get_entries(self, ledger_id: int, first: int, max_count: int, max_bytes: int) -> list[Stored]: ...
    def get_strided(self, ledger_id: int, first: int, stride: int, max_count: int,
                    max_bytes: int) -> list[Stored]: ...
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


class LedgerRouter:
    """Maps a ledger id to its homes (see the module docstring)."""

    def __init__(self, storages: Sequence[LedgerStorage],
                 is_writable: Callable[[Path], bool] | None = None) -> None:
        if not storages:
            raise ValueError("a bookie needs at least one ledger storage")
        self._storages = list(storages)
        self._single = self._storages[0] if len(self._storages) == 1 else None
        self._writable = is_writable if is_writable is not None else (lambda _d: True)
        self._homes: dict[int, list[LedgerStorage]] = {}  # write home last
        self._lock = threading.Lock()

    @property
    def single(self) -> LedgerStorage | None:
        """The one storage when there is only one (every ledger lives there), else None."""
        return self._single

    # ------------------------------------------------------------------------------- reads
    def view(self, ledger_id: int) -> LedgerView:
        """The ledger's data for reads, fencing and deletes: its one storage, or every home."""
        single = self._single
        if single is not None:
            return single
        homes = self._homes_of(ledger_id)
        if homes is None:
            # Known nowhere: any storage answers "no such ledger" (no write is routed here).
            return self._storages[ledger_id % len(self._storages)]
        return homes[0] if len(homes) == 1 else SpannedLedger(list(homes))

    def homes(self, ledger_id: int) -> list[LedgerStorage]:
        """Every storage that knows the ledger, write home last (empty when none does)."""
        if self._single is not None:
            return [self._single] if self._single.ledger_exists(ledger_id) else []
        return list(self._homes_of(ledger_id) or [])

    # ------------------------------------------------------------------------------ writes
    def storage_for_write(self, ledger_id: int) -> LedgerStorage:
        """The storage the ledger's next entry (or master key) goes to (may pick a new home)."""
        single = self._single
        if single is not None:
            return single
        homes = self._homes.get(ledger_id)
        if homes is not None:
            write = homes[-1]
            if self._writable(write.ledger_dir):
                return write
        with self._lock:
            homes = self._homes.get(ledger_id)
            if homes is None:
                homes = self._find(ledger_id)
                if homes is not None:
                    self._homes[ledger_id] = homes
            if homes is not None:
                write = homes[-1]
                if self._writable(write.ledger_dir) or write.is_deleted(ledger_id):
                    return write  # (a tombstone refuses the write itself)
                if write.ledger_exists(ledger_id):
                    return self._move(ledger_id, homes)
            # New, or chosen earlier but never written: the dir with the fewest active logs.
            home = self._choose(ledger_id, self._storages)
            self._homes[ledger_id] = [home]
            return home

    def storage_of(self, ledger_id: int) -> LedgerStorage:
        """The write home if the ledger is known, else where it would be created (journal
        replay: the same answer as ``storage_for_write`` for a known ledger)."""
        return self.storage_for_write(ledger_id)

    def forget(self, ledger_id: int) -> None:
        """Drop the cached homes (GC deleted the ledger; its tombstone is found again if asked)."""
        with self._lock:
            self._homes.pop(ledger_id, None)

    # ----------------------------------------------------------------------------- internal
    def _homes_of(self, ledger_id: int) -> list[LedgerStorage] | None:
        homes = self._homes.get(ledger_id)
        if homes is not None:
            return homes
        found = self._find(ledger_id)
        if found is None:
            return None
        with self._lock:
            return self._homes.setdefault(ledger_id, found)

    def _find(self, ledger_id: int) -> list[LedgerStorage] | None:
        live = [s for s in self._storages if s.ledger_exists(ledger_id)]
        if live and len(live) < len(self._storages):
            # A ledger spanning dirs whose delete reached one dir's GC first is deleted: its
            # tombstone answers (refuses writes), not the dir that still holds its entries.
            for s in self._storages:
                if s not in live and s.is_deleted(ledger_id):
                    return [s]
        if live:
            if len(live) > 1:
                # Continued across dirs: write where it is writable and holds the newest entry.
                live.sort(key=lambda s: (self._writable(s.ledger_dir), s.get_last_entry_id(ledger_id)))
            return live
        for s in self._storages:
            if s.is_deleted(ledger_id):
                return [s]
        return None

    def _choose(self, ledger_id: int, among: Sequence[LedgerStorage]) -> LedgerStorage:
        writable = [s for s in among if self._writable(s.ledger_dir)]
        if not writable:
            # Every dir is full: the bookie is read-only and only recovery adds come; they go
            # to the ledger's configured-order default rather than fail.
            return among[ledger_id % len(among)]
        counts = [(s.active_log_count(), s) for s in writable]
        fewest = min(c for c, _s in counts)
        ties = [s for c, s in counts if c == fewest]
        return ties[ledger_id % len(ties)]

    def _move(self, ledger_id: int, homes: list[LedgerStorage]) -> LedgerStorage:
        """The write home's dir is full: continue in a writable home, or a new one."""
        for i, home in enumerate(homes):
            if self._writable(home.ledger_dir):
                homes.append(homes.pop(i))
                return home
        others = [s for s in self._storages if s not in homes]
        target = self._choose(ledger_id, others) if others else homes[-1]
        if target in homes or not self._writable(target.ledger_dir):
            return homes[-1]  # nowhere to go: the bookie turns read-only when all are full
        old = homes[-1]
        key = old.get_master_key(ledger_id)
        if key is not None:  # (a ledger known by entries alone is made known by its next one)
            target.set_master_key(ledger_id, key)
        fenced = any(h.ledger_exists(ledger_id) and h.is_fenced(ledger_id) for h in homes)
        if fenced and target.ledger_exists(ledger_id):
            target.set_fenced(ledger_id)
        lac = old.get_explicit_lac(ledger_id)
        if lac is not None and target.ledger_exists(ledger_id):
            target.set_explicit_lac(ledger_id, lac)
        homes.append(target)
        log.info("ledger %d continues in %s: %s is full", ledger_id, target.ledger_dir, old.ledger_dir,
                 extra={"ledger_id": ledger_id})
        return target


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

    def get_entries(self, ledger_id: int, first: int, max_count: int, max_bytes: int) -> list[Stored]:
        return self.get_strided(ledger_id, first, 1, max_count, max_bytes)

    def get_strided(self, ledger_id: int, first: int, stride: int, max_count: int,
                    max_bytes: int) -> list[Stored]:
        """Runs from each home in turn, each continuing where the previous one stopped."""
        out: list[Stored] = []
        size = 0
        nxt = first
        while max_count <= 0 or len(out) < max_count:
            left = max_count - len(out) if max_count > 0 else 0
            budget = max_bytes - size if max_bytes > 0 else 0
            if max_bytes > 0 and out and budget <= 0:
                break
            best: list[Stored] = []
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
            if out and max_bytes > 0 and size + len(best[0]) > max_bytes:
                break
            out.extend(best)
            size += sum(len(e) for e in best)
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
