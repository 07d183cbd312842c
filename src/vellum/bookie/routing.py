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

A write of a ledger not cached here is routed in three moves: ask (one ``presence`` question
per storage, ``_facts``), decide (``_homes_in``, ``_decide``, ``_choose``: no storage touched),
act (at most one ``continue_ledger``). The decision comes back from the storages' answers into
this module once, and cannot come earlier: which dir is the write home, or the least loaded,
is what the storages hold now (a dir filled or freed, a log rotated), and a copy kept here of
their state would be a second truth to keep in step with theirs.

Invariants: a ledger known to a storage is always read from it, whatever the number of dirs and
whichever is full; no read of a ledger answers "no such entry" while another home of the ledger
holds the entry; with one dir there is nothing to choose. Thread-safe. What a ledger held in
several homes answers (``SpannedLedger``) is ``bookie/spanned_ledger.py``'s.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from vellum.bookie.spanned_ledger import LedgerView, SpannedLedger
from vellum.storage.ledger_storage import LedgerPresence, LedgerStorage

log = logging.getLogger(__name__)


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
            # Decide first, from one answer per storage, then act once (a move is the only act).
            facts = self._facts(ledger_id)
            homes = self._homes.get(ledger_id)
            if homes is None:
                homes = self._homes_in(facts)
                if homes is not None:
                    self._homes[ledger_id] = homes
            target, fresh = self._decide(ledger_id, homes, facts)
            if homes is None or fresh:
                # New, or chosen earlier but never written: the dir with the fewest active logs.
                self._homes[ledger_id] = [target]
            elif target is not homes[-1]:
                if target in homes:  # back to a home that is writable again
                    homes.remove(target)
                else:
                    target.continue_ledger(ledger_id, homes)
                    log.info("ledger %d continues in %s: %s is full", ledger_id, target.ledger_dir,
                             homes[-1].ledger_dir, extra={"ledger_id": ledger_id})
                homes.append(target)
            return target

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
        found = self._homes_in(self._facts(ledger_id))
        if found is None:
            return None
        with self._lock:
            return self._homes.setdefault(ledger_id, found)

    def _facts(self, ledger_id: int) -> dict[int, LedgerPresence]:
        """What each storage holds of the ledger: one ``presence`` question per storage."""
        return {id(s): s.presence(ledger_id) for s in self._storages}

    def _homes_in(self, facts: dict[int, LedgerPresence]) -> list[LedgerStorage] | None:
        """The ledger's homes (write home last) from its ``facts``, or None (known nowhere)."""
        storages = self._storages
        for s in storages:
            if facts[id(s)].deleted:
                # A ledger spanning dirs whose delete reached one dir's GC first is deleted: its
                # tombstone answers (refuses writes), not the dir that still holds its entries.
                return [s]
        live = [s for s in storages if facts[id(s)].live]
        if not live:
            return None
        if len(live) > 1:
            # Continued across dirs: write where it is writable and holds the newest entry.
            live.sort(key=lambda s: (self._writable(s.ledger_dir), facts[id(s)].last_entry_id))
        return live

    def _decide(self, ledger_id: int, homes: list[LedgerStorage] | None,
                facts: dict[int, LedgerPresence]) -> tuple[LedgerStorage, bool]:
        """Where the ledger's next write goes (no storage is asked or changed here): its write
        home while writable (or a tombstone, which refuses the write itself); else a writable
        home; else, for a ledger with data, a new writable home (nowhere writable: the write
        home); else (new, or chosen earlier but never written: ``fresh``, True) the writable dir
        with the fewest active logs."""
        if homes is not None:
            write = homes[-1]
            if self._writable(write.ledger_dir) or facts[id(write)].deleted:
                return write, False
            if facts[id(write)].live:
                for home in homes:
                    if self._writable(home.ledger_dir):
                        return home, False
                others = [s for s in self._storages if s not in homes]
                target = self._choose(ledger_id, others, facts) if others else write
                # nowhere to go: the bookie turns read-only when all are full
                return (target if self._writable(target.ledger_dir) else write), False
        return self._choose(ledger_id, self._storages, facts), True

    def _choose(self, ledger_id: int, among: Sequence[LedgerStorage],
                facts: dict[int, LedgerPresence]) -> LedgerStorage:
        writable = [s for s in among if self._writable(s.ledger_dir)]
        if not writable:
            # Every dir is full: the bookie is read-only and only recovery adds come; they go
            # to the ledger's configured-order default rather than fail.
            return among[ledger_id % len(among)]
        fewest = min(facts[id(s)].active_logs for s in writable)
        ties = [s for s in writable if facts[id(s)].active_logs == fewest]
        return ties[ledger_id % len(ties)]
