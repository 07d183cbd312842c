"""Lost-disk safety on the bookie: the *limbo* ledgers (rule 12 of docs/correctness.md, BookKeeper's
``dataIntegrityChecking``).

A bookie that may have lost data it acknowledged must never answer "no such entry" or "no such
ledger" for a ledger it may have held: ledger recovery counts such answers as proof that an
entry was never acknowledged, and could truncate the ledger below an acknowledged entry. Such
ledgers are *limbo* until the bookie has copied back every entry it should hold.

When a ledger becomes limbo (``mark``, before the bookie serves anything):
- its master key is set (from the ledger's metadata: recovery adds with that key are accepted),
  it is fenced (the lost data may have included a fence: the old writer must not get an entry
  acknowledged here again; recovery adds still pass) and flagged ``limbo`` in every ledger
  storage that holds it (``LedgerData.limbo`` in the RocksDB ledgers index, so the state
  survives restarts); the caller makes it durable with a checkpoint.

While a ledger is limbo (``Bookie`` asks ``in`` on every read, one set lookup):
- a read of an entry the bookie holds is served as usual;
- a read of an entry it does not hold, a read of the last entry (``-1``), a LAC read (explicit
  LAC, long poll) and LIST_ENTRIES answer ``UnknownLedgerStateError`` (EUNKNOWNLEDGERSTATE,
  never ENOENTRY/ENOLEDGER), whatever the storage would have said;
- normal adds are refused (the ledger is fenced); recovery adds are stored.

``clear`` is called by the integrity check (``admin/integrity_check.py``) only once every entry
the ledger's metadata places on this bookie is back; a ledger GC deletes (gone from the
metadata, so "no such ledger" is then the truth) leaves the set too. The set is rebuilt from
the ledger storages at start: a bookie that crashes midway resumes where it was.

Which starts make ledgers limbo is decided by the cookie check and the composition
(``storage/cookies.py``, ``bookie/assembly.py``, ``service.py``); this module only keeps and
applies the state.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence

from vellum.bookie.routing import LedgerRouter
from vellum.bookie.spanned_ledger import LedgerView
from vellum.errors import (
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnauthorizedAccessError,
    UnknownLedgerStateError,
)
from vellum.ids import LAST_ADD_CONFIRMED
from vellum.storage.ledger_storage import LedgerStorage, Stored

log = logging.getLogger(__name__)

#: a test flag (docs/verification.md, "Regression seeds"): True as shipped; the simulator sets it
#: False to show that a limbo ledger's "unknown" answers are what keeps recovery from closing a
#: ledger below an acknowledged entry (the storage's "no such entry" passes through instead)
_answer_unknown = True


def unknown_state(ledger_id: int, what: str) -> UnknownLedgerStateError:
    """The answer for a question about a limbo ledger that only lost data could have answered."""
    return UnknownLedgerStateError(
        f"ledger {ledger_id} is in limbo on this bookie (it may have lost data of it and is copying "
        f"it back from the other replicas): {what} is unknown, ask another bookie"
    )


class LimboLedgers:
    """The limbo ledgers of one bookie (see the module docstring). Thread-safe."""

    def __init__(self, router: LedgerRouter, storages: Sequence[LedgerStorage]) -> None:
        self._router = router
        self._lock = threading.Lock()
        ids: set[int] = set()
        for storage in storages:
            ids.update(storage.limbo_ledgers())
        # Replaced whole, never mutated: readers test membership without the lock.
        self._ids: frozenset[int] = frozenset(ids)
        if ids:
            log.warning("%d ledger(s) in limbo on this bookie (data may be lost; answered as unknown until "
                        "copied back): %s", len(ids), _preview(ids))

    def __contains__(self, ledger_id: object) -> bool:
        return ledger_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def __bool__(self) -> bool:
        return bool(self._ids)

    def ids(self) -> list[int]:
        return sorted(self._ids)

    # ------------------------------------------------------------------------------ changes
    def mark(self, ledger_id: int, master_key: bytes) -> bool:
        """Make the ledger limbo and fenced in storage (created with ``master_key`` if this
        bookie holds nothing of it). Durable at the next checkpoint. False if the ledger was
        deleted here (its tombstone: the metadata store has no such ledger any more)."""
        homes = self._router.homes(ledger_id)
        if not homes:
            storage = self._router.storage_for_write(ledger_id)
            try:
                storage.set_master_key(ledger_id, master_key)
            except LedgerFencedError:
                log.warning("ledger %d: deleted on this bookie, not marked limbo", ledger_id,
                            extra={"ledger_id": ledger_id})
                return False
            homes = [storage]
        else:
            for home in homes:
                try:
                    home.set_master_key(ledger_id, master_key)  # adopts it if none was set
                except UnauthorizedAccessError:
                    log.warning("ledger %d: the stored master key differs from its metadata's", ledger_id,
                                extra={"ledger_id": ledger_id})
        for home in homes:
            home.set_fenced(ledger_id)
            home.set_limbo(ledger_id, True)
        with self._lock:
            self._ids = self._ids | {ledger_id}
        return True

    def clear(self, ledger_id: int) -> None:
        """The bookie holds again every entry of the ledger it should: answer normally."""
        for home in self._router.homes(ledger_id):
            home.set_limbo(ledger_id, False)
        self.forget(ledger_id)

    def forget(self, ledger_id: int) -> None:
        """Drop the ledger from the set (cleared, or deleted by GC)."""
        if ledger_id in self._ids:
            with self._lock:
                self._ids = self._ids - {ledger_id}

    def holds(self, ledger_id: int, entry_id: int) -> bool:
        """Does this bookie hold the entry (in any of the ledger's storages)?"""
        return any(home.has_entry(ledger_id, entry_id) for home in self._router.homes(ledger_id))

    # -------------------------------------------------------------------------------- reads
    @staticmethod
    def read_entry(view: LedgerView, ledger_id: int, entry_id: int) -> Stored:
        """An entry of a limbo ledger: served if held, else unknown (the last entry: unknown)."""
        if entry_id == LAST_ADD_CONFIRMED and _answer_unknown:
            raise unknown_state(ledger_id, "its last entry")
        try:
            return view.get_entry(ledger_id, entry_id)
        except (NoSuchEntryError, NoSuchLedgerError):
            if not _answer_unknown:
                raise
            raise unknown_state(ledger_id, f"entry {entry_id}") from None


def _preview(ids: Iterable[int], limit: int = 20) -> str:
    ordered = sorted(ids)
    head = ", ".join(str(i) for i in ordered[:limit])
    return head + (f", ... ({len(ordered) - limit} more)" if len(ordered) > limit else "")
