"""Which entry log receives a ledger's next entry: one shared log, or one log per ledger.

``ActiveLogPolicy`` is the one decision the entry logger delegates (``log_for``), with what
follows from it: the set of active logs, which of them one ledger or an idle spell closes, and
which sealed logs GC may take. Two strategies, chosen by ``entryLogPerLedgerEnabled``:

- ``SharedActiveLog``: every ledger appends to the one active log (BookKeeper's default).
- ``PerLedgerActiveLogs`` (requirement R1 of docs/correctness.md): a ledger without an active log gets a freshly allocated
  one; at most ``max_active_logs`` (``maximumNumberOfActiveEntryLogs``) are open, the least
  recently used is sealed to make room; logs not written for ``access_expiry_s``
  (``entrylogMapAccessExpiryTimeInSeconds``) are idle.

Invariants:
- A policy never creates or seals a file itself: it asks the ``allocate`` and ``seal``
  callables it was built with (the entry logger's), and a sealed log leaves it through
  ``forget``. So the file format, and every rule about allocation and sealing, is the same in
  both modes, and the flag can change between restarts.
- ``flushed`` (GC-safe logs): in the shared mode BookKeeper's "id < leastUnflushedLogId"; in
  the per-ledger mode every log that is not busy (BookKeeper's ``getFlushedLogIds``), since
  one long-lived ledger would otherwise pin every newer log (BookKeeper issue #2728).

Threads: every method runs under the entry logger's lock.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Iterable

from vellum.storage.entry_log_allocator import ActiveLog

AllocateFn = Callable[[], ActiveLog]
SealFn = Callable[[ActiveLog], None]


class ActiveLogPolicy(ABC):
    """Chooses the active log of each ledger (see the module docstring)."""

    #: whether each ledger has a log of its own (``entryLogPerLedgerEnabled``)
    per_ledger: bool

    @abstractmethod
    def log_for(self, ledger_id: int) -> ActiveLog:
        """THE decision "which log receives this ledger's next entry" (allocating if needed)."""

    @abstractmethod
    def logs(self) -> list[ActiveLog]:
        """The active logs."""

    @abstractmethod
    def forget(self, log: ActiveLog) -> None:
        """``log`` was sealed or abandoned: it receives no more entries."""

    def log_of(self, ledger_id: int) -> ActiveLog | None:
        """The log this ledger alone writes to, if any (sealed when the ledger closes)."""
        del ledger_id
        return None

    def idle_logs(self) -> list[ActiveLog]:
        """Logs not written for the access expiry (sealed by ``rotate_idle``)."""
        return []

    def ledgers(self) -> dict[int, int]:
        """``{ledger_id: active log id}`` of the ledgers with a log of their own."""
        return {}

    @abstractmethod
    def flushed(self, log_ids: Iterable[int], busy: set[int], next_id: int) -> list[int]:
        """Of ``log_ids`` (existing logs), those GC may read and delete. ``busy``: active,
        preallocated and reserved ids; ``next_id``: the id after the last allocated one."""


class SharedActiveLog(ActiveLogPolicy):
    """Every ledger appends to one active log."""

    per_ledger = False

    def __init__(self, allocate: AllocateFn) -> None:
        self._allocate = allocate
        self._log: ActiveLog | None = None

    def log_for(self, ledger_id: int) -> ActiveLog:
        log = self._log
        if log is None:
            log = self._log = self._allocate()
        return log

    def logs(self) -> list[ActiveLog]:
        return [self._log] if self._log is not None else []

    def forget(self, log: ActiveLog) -> None:
        if self._log is log:
            self._log = None

    def flushed(self, log_ids: Iterable[int], busy: set[int], next_id: int) -> list[int]:
        # BookKeeper's rule: below the least unflushed id (identical to "not busy" here, since
        # every log below the active one is sealed, but stated as BookKeeper states it).
        least = min(busy, default=next_id)
        return [i for i in log_ids if i not in busy and i < least]


class PerLedgerActiveLogs(ActiveLogPolicy):
    """Each ledger appends to a log of its own (requirement R1 of docs/correctness.md)."""

    per_ledger = True

    def __init__(
        self,
        allocate: AllocateFn,
        seal: SealFn,
        *,
        max_active_logs: int,
        access_expiry_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_active_logs < 1:
            raise ValueError(f"max_active_logs {max_active_logs} must be at least 1")
        self._allocate = allocate
        self._seal = seal
        self.max_active_logs = max_active_logs
        self.access_expiry_s = access_expiry_s
        self._clock = clock
        # ledger -> its active log, least recently used first
        self._by_ledger: OrderedDict[int, ActiveLog] = OrderedDict()
        self._last_access: dict[int, float] = {}

    def log_for(self, ledger_id: int) -> ActiveLog:
        log = self._by_ledger.get(ledger_id)
        if log is None:
            while len(self._by_ledger) >= self.max_active_logs:
                victim = next(iter(self._by_ledger.values()))
                self._seal(victim)  # leaves the map through forget()
            log = self._allocate()
            self._by_ledger[ledger_id] = log
        else:
            self._by_ledger.move_to_end(ledger_id)
        self._last_access[ledger_id] = self._clock()
        return log

    def logs(self) -> list[ActiveLog]:
        return list(self._by_ledger.values())

    def forget(self, log: ActiveLog) -> None:
        for lid in [lid for lid, active in self._by_ledger.items() if active is log]:
            del self._by_ledger[lid]
            self._last_access.pop(lid, None)

    def log_of(self, ledger_id: int) -> ActiveLog | None:
        return self._by_ledger.get(ledger_id)

    def idle_logs(self) -> list[ActiveLog]:
        cutoff = self._clock() - self.access_expiry_s
        idle = {
            id(log): log
            for lid, log in self._by_ledger.items()
            if self._last_access.get(lid, 0.0) <= cutoff
        }
        return list(idle.values())

    def ledgers(self) -> dict[int, int]:
        return {lid: log.log_id for lid, log in self._by_ledger.items()}

    def flushed(self, log_ids: Iterable[int], busy: set[int], next_id: int) -> list[int]:
        del next_id
        return [i for i in log_ids if i not in busy]
