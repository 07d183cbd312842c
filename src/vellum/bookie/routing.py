"""Which ledger storage (ledger dir) holds a ledger (design rule 13).

A bookie with several ledger dirs keeps each ledger in one of them. The dir was once chosen as
``ledger_id % number of dirs``, which stops being true the moment ``allowStorageExpansion`` adds
a dir: an existing ledger would then be looked up in a storage that never held it, which answers
"no such entry", and recovery takes that as a negative answer and can truncate (rule 3).

So the home of a ledger is where its data is: the storage that knows the ledger (its data in
that dir's ``ledgers`` index, live or as a tombstone of a delete). Only a ledger no storage knows
(a new one, or an id never written) goes to ``ledger_id % len(storages)``, and from its first
write on it is known there. Homes found are cached; every storage loads its ledger data at open,
so finding one costs a dict lookup per storage, plus one RocksDB read per storage for tombstones
of ledgers no storage holds live.

Invariants: a ledger known to a storage is always routed to that storage, whatever the number
of dirs; with one dir there is nothing to choose. Thread-safe.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from vellum.storage.ledger_storage import LedgerStorage

log = logging.getLogger(__name__)


class LedgerRouter:
    """Maps a ledger id to the ``LedgerStorage`` that holds it (or will hold it)."""

    def __init__(self, storages: Sequence[LedgerStorage]) -> None:
        if not storages:
            raise ValueError("a bookie needs at least one ledger storage")
        self._storages = list(storages)
        self._single = self._storages[0] if len(self._storages) == 1 else None
        self._home: dict[int, LedgerStorage] = {}
        self._lock = threading.Lock()

    def storage_of(self, ledger_id: int) -> LedgerStorage:
        single = self._single
        if single is not None:
            return single
        home = self._home.get(ledger_id)
        if home is not None:
            return home
        found = self._find(ledger_id)
        if found is None:
            # Not cached: the ledger may be created on another thread right now; the next
            # lookup finds it wherever it was created (always this same default storage).
            return self._storages[ledger_id % len(self._storages)]
        with self._lock:
            return self._home.setdefault(ledger_id, found)

    def forget(self, ledger_id: int) -> None:
        """Drop the cached home (GC deleted the ledger; its tombstone is found again if asked)."""
        with self._lock:
            self._home.pop(ledger_id, None)

    def _find(self, ledger_id: int) -> LedgerStorage | None:
        live = [s for s in self._storages if s.ledger_exists(ledger_id)]
        if live:
            if len(live) > 1:
                log.warning("ledger %d is held in several ledger dirs (%s); serving it from %s",
                            ledger_id, ", ".join(str(s.ledger_dir) for s in live), live[0].ledger_dir)
            return live[0]
        for s in self._storages:
            if s.is_deleted(ledger_id):
                return s
        return None
