"""The master keys and fence flags of the ledgers a bookie knows (rules 1 and 3 of
docs/correctness.md): ``LedgerKeys``, the one role of "whose is this ledger, and is it fenced".

The master key of a ledger is fixed by its first add, fence or explicit LAC; a different key is
refused (compared in constant time). With a ``master_key_check`` (the composition root's view
of the ledger metadata) a ledger this bookie has not seen gets a key only if its metadata
exists and its password gives that key: a client cannot claim a ledger id before its owner. A
refused key is never stored; a check that cannot be made (metadata store unreachable) refuses
that request with a retryable error (back-pressure) and stores nothing. The check runs once per
ledger per bookie process (a metadata read); afterwards the key is known (cached here, and
persisted by ledger storage and the journal).

A ledger new here is decided before anything is stored: its storage is asked what it holds of
the ledger (its stored key, or a tombstone's ``LedgerFencedError``); only a ledger without a stored key is checked against its
metadata (outside the lock: other ledgers' first requests do not wait for it), and then created
once: the key set in its home storage and journaled, queued before anything else of the ledger
so that replay always meets the key first. The state is cached only once the storage and the
journal have it.

Why storage, then metadata, then storage again and create (and not one question each): the
storage's answer comes first because it is the ledger's own record: a key stored before a
restart is the key (no metadata read, none at all without a ``master_key_check``), and a
tombstone must refuse as deleted (``LedgerFencedError``), not as a key the metadata no longer
gives. The metadata read comes only for a ledger with no stored key, and outside ``lock``: it is
a network round trip, and the lock is the bookie's, so holding it there would make every other
ledger's first request wait on one ledger's metadata. Letting go of the lock is what forces the
second look: meanwhile another first request of the same ledger may have made it known (the
cached state and the storage are read again under the lock, and the first key stored wins), and
nothing may be stored before the check has passed (a refused key is never stored). Asking the
metadata first would cost a read per ledger already stored here; holding the lock across it
would serialize new ledgers; so the order stays.
"""

from __future__ import annotations

import hmac
import logging
import threading
import time
from collections.abc import Callable

from vellum.bookie.routing import LedgerRouter
from vellum.errors import OperationRejectedError, UnauthorizedAccessError
from vellum.storage.journal import Journal

log = logging.getLogger(__name__)

#: ``check(ledger_id, master_key)``: does the ledger's metadata exist and give this master key?
#: Raises when it cannot tell (metadata store unreachable). Injected: the bookie never imports meta/.
MasterKeyCheck = Callable[[int, bytes], bool]
#: at most one "cannot check a master key" warning per this many seconds
_CHECK_WARN_INTERVAL_S = 10.0


class LedgerState:
    """What every add checks, cached so the hot path does one dict lookup: the master key and
    the fenced flag (both also persisted by ledger storage and the journal)."""

    __slots__ = ("fenced", "master_key")

    def __init__(self, master_key: bytes, fenced: bool) -> None:
        self.master_key = master_key
        self.fenced = fenced


class LedgerKeys:
    """The cached ``LedgerState`` of each ledger this bookie knows, and the one way a ledger
    becomes known (see the module docstring). ``states`` is read without the lock by the ADD
    path's fast check; it is written only under ``lock``."""

    def __init__(self, router: LedgerRouter, journal_for: Callable[[int], Journal],
                 master_key_check: MasterKeyCheck | None) -> None:
        self._router = router
        self._journal_for = journal_for
        self._check = master_key_check
        self._warned_at = float("-inf")
        self.lock = threading.Lock()
        self.states: dict[int, LedgerState] = {}

    def state(self, ledger_id: int, master_key: bytes) -> LedgerState:
        """The ledger's state after checking ``master_key`` against it; a ledger this bookie
        has not seen is made known with that key (see the module docstring). Raises
        UnauthorizedAccessError for a wrong key, LedgerFencedError for a deleted ledger,
        OperationRejectedError when its metadata cannot be read now."""
        state = self.states.get(ledger_id)
        if state is None:
            state = self._load(ledger_id, master_key)
        if not hmac.compare_digest(state.master_key, master_key):
            raise UnauthorizedAccessError(f"wrong master key for ledger {ledger_id}")
        return state

    def needs_check(self, ledger_id: int) -> bool:
        """Could a request for this ledger cost a metadata read (``master_key_check`` of a
        ledger not known in memory)?"""
        return self._check is not None and ledger_id not in self.states

    def forget(self, ledger_id: int) -> None:
        with self.lock:
            self.states.pop(ledger_id, None)

    def _load(self, ledger_id: int, master_key: bytes) -> LedgerState:
        """Decide, then create once: what the storage holds of the ledger; if it holds no key,
        the metadata check (outside the lock); then, under the lock, the ledger made known."""
        checked = False
        while True:  # at most twice: the first look finds no key stored, the check runs, look again
            if checked:
                self._check_new_key(ledger_id, master_key)
            with self.lock:
                state = self.states.get(ledger_id)
                if state is not None:  # known, or made known meanwhile by another first request
                    return state
                stored = self._router.view(ledger_id).get_master_key(ledger_id)
                if stored is not None or self._check is None or checked:
                    return self._remember(ledger_id, master_key, stored)
            checked = True

    def _remember(self, ledger_id: int, master_key: bytes, stored: bytes | None) -> LedgerState:
        """Under ``lock``: cache the ledger's state: its stored key, or (none stored) a new
        ledger with ``master_key``, set in its home storage and journaled first; with the fence
        flag its storage holds."""
        router = self._router
        if stored is None:
            router.storage_for_write(ledger_id).set_master_key(ledger_id, master_key)
        state = LedgerState(stored if stored is not None else master_key,
                            fenced=router.view(ledger_id).is_fenced(ledger_id))
        if stored is None:
            self._journal_for(ledger_id).log_master_key(ledger_id, master_key, _ignore_ok)
        self.states[ledger_id] = state
        return state

    def _check_new_key(self, ledger_id: int, master_key: bytes) -> None:
        """Raise unless ``master_key_check`` says the ledger's metadata gives ``master_key``."""
        assert self._check is not None
        try:
            accepted = self._check(ledger_id, master_key)
        except Exception as e:
            now = time.monotonic()
            if now - self._warned_at >= _CHECK_WARN_INTERVAL_S:
                self._warned_at = now
                log.warning("cannot check the master key of ledger %d against its metadata (%s): its first "
                            "requests here are refused as retryable until the metadata store answers", ledger_id, e,
                            extra={"ledger_id": ledger_id})
            raise OperationRejectedError(
                f"cannot check the master key of ledger {ledger_id} against its metadata now ({type(e).__name__}); "
                "retry"
            ) from None
        if not accepted:
            raise UnauthorizedAccessError(
                f"master key refused for ledger {ledger_id}: its metadata does not exist or its password does not "
                "give this key (ledgerMasterKeyCheck)"
            )


def _ignore_ok(exc: BaseException | None) -> None:
    if exc is not None:
        log.error("journal write of a ledger master key failed: %s", exc)
