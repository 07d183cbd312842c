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

A write of a ledger not cached here (or whose write home's dir is full) is routed in one pass,
``_route``: ask (one ``presence`` question per storage, ``_survey``, which also finds the
homes in the answers), decide from those answers without asking any storage again, act at most
once (the homes cached; ``continue_ledger`` when the ledger continues in a new dir). Nothing is
decided before the answers: which dir is the write home, or the least loaded, is what the
storages hold now (a dir filled or freed, a log rotated), and a copy kept here of their state
would be a second truth to keep in step with theirs.

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
            return self._route(ledger_id)

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
        _facts, found = self._survey(ledger_id)
        if found is None:
            return None
        with self._lock:
            return self._homes.setdefault(ledger_id, found)

    def _survey(self, ledger_id: int) -> tuple[dict[int, LedgerPresence], list[LedgerStorage] | None]:
        """Ask each dir its one question about the ledger (``presence``), and find its homes
        in the answers (write home last; None: known nowhere): a tombstone anywhere is the
        home (a ledger spanning dirs whose delete reached one dir's GC first is deleted: its
        tombstone answers, and refuses writes, not the dir that still holds its entries);
        else every dir holding it live, the writable one with the newest entry last."""
        storages = self._storages
        facts = {id(s): s.presence(ledger_id) for s in storages}
        for s in storages:
            if facts[id(s)].deleted:
                return facts, [s]
        live = [s for s in storages if facts[id(s)].live]
        if not live:
            return facts, None
        if len(live) > 1:
            writable = self._writable
            live.sort(key=lambda s: (writable(s.ledger_dir), facts[id(s)].last_entry_id))
        return facts, live

    def _route(self, ledger_id: int) -> LedgerStorage:
        """Under the lock, a write whose write home is not cached or not writable: ask, decide,
        act, each once and in that order. Ask: every dir answers one question (``_survey``).
        Decide, from the answers alone (no dir is asked again): the write home while writable
        (or a tombstone, which refuses the write itself); else a home writable again; else,
        for a ledger with data, the least loaded writable dir it is not in yet (none: the
        write home; the bookie turns read-only when all are full); else (new, or chosen
        earlier but never written) the least loaded writable dir (none: every dir is full,
        only recovery adds come, and they go to the configured-order default). Least loaded =
        fewest active entry logs, ties spread by ledger id. Act: the homes cached, and a
        ledger continuing in a new dir takes its state there (``continue_ledger``)."""
        writable = self._writable
        facts, found = self._survey(ledger_id)
        homes = self._homes.get(ledger_id)
        if homes is None and found is not None:
            homes = self._homes[ledger_id] = found
        continuing: list[LedgerStorage] | None = None  # the homes of a ledger with data, to continue
        if homes is not None:
            write = homes[-1]
            if writable(write.ledger_dir) or facts[id(write)].deleted:
                return write
            if facts[id(write)].live:
                for home in homes:
                    if writable(home.ledger_dir):  # back to a home that is writable again
                        homes.remove(home)
                        homes.append(home)
                        return home
                continuing = homes
        among = self._storages if continuing is None else [s for s in self._storages if s not in continuing]
        candidates = [s for s in among if writable(s.ledger_dir)]
        if candidates:
            fewest = min(facts[id(s)].active_logs for s in candidates)
            ties = [s for s in candidates if facts[id(s)].active_logs == fewest]
            target = ties[ledger_id % len(ties)]
        elif continuing is None:
            target = among[ledger_id % len(among)]
        else:
            return continuing[-1]
        if continuing is None:  # new, or chosen earlier but never written
            self._homes[ledger_id] = [target]
            return target
        target.continue_ledger(ledger_id, continuing)
        log.info("ledger %d continues in %s: %s is full", ledger_id, target.ledger_dir, continuing[-1].ledger_dir,
                 extra={"ledger_id": ledger_id})
        continuing.append(target)
        return target
