"""What one open ledger handle knows of its ledger, shared by its writer and reader roles.

Responsibility: the handle's copy of the ledger's metadata (with its store version and the last
ensemble as bookie ids), its digest manager and write-set schedule, the LAC with the cumulative
length at it, whether the handle is closed, and waking the handle's own LAC waiters (``tail`` on
a writing handle). No I/O: the roles that own the I/O update it.

Invariants:
- ``ensemble`` is always the last ensemble of ``metadata`` (replaced together, by :meth:`adopt`);
- the LAC only moves forward (:meth:`set_lac`), except that adopting a CLOSED metadata sets it to
  the ledger's last entry (rule 10 of docs/correctness.md: the last entry of a closed ledger is final);
- every LAC change and every adopted close wakes the waiters.
"""

from __future__ import annotations

import asyncio

from vellum.client.distribution import RoundRobinSchedule
from vellum.format.entry import DigestManager
from vellum.meta.api import Versioned
from vellum.meta.model import LedgerMetadata


class LedgerView:
    """See the module docstring. Attributes are read directly (the append path reads ``lac`` and
    ``ensemble`` per entry); only the methods below change them together."""

    __slots__ = ("_lac_event", "closed", "digest", "ensemble", "lac", "lac_length", "ledger_id", "metadata",
                 "metadata_version", "schedule")

    def __init__(self, ledger_id: int, metadata: Versioned[LedgerMetadata], digest: DigestManager) -> None:
        md = metadata.value
        self.ledger_id = ledger_id
        self.digest = digest
        self.schedule = RoundRobinSchedule(md.ensemble_size, md.write_quorum_size, md.ack_quorum_size)
        self.metadata = md
        self.metadata_version = metadata.version
        self.ensemble: list[str] = list(md.last_ensemble)
        # LAC and the cumulative length at the LAC
        if md.is_closed:
            self.lac = md.last_entry_id
            self.lac_length = md.length
        else:
            self.lac = -1
            self.lac_length = 0
        self.closed = md.is_closed  # the handle (not necessarily the ledger) is closed
        self._lac_event: asyncio.Event | None = None

    def adopt(self, current: Versioned[LedgerMetadata]) -> None:
        """Take ``current`` as the handle's metadata; a CLOSED one fixes the LAC at its last entry."""
        md = current.value
        self.metadata, self.metadata_version = md, current.version
        self.ensemble = list(md.last_ensemble)
        if md.is_closed:
            self.lac = md.last_entry_id
            self.lac_length = md.length
            self.wake()

    def set_lac(self, lac: int, length: int | None) -> None:
        """Advance the LAC to ``lac`` (and the length at it, when known); never moves it back."""
        if lac > self.lac:
            self.lac = lac
            if length is not None:
                self.lac_length = length
            self.wake()

    def wake(self) -> None:
        """Wake the LAC waiters (the LAC moved, or it never will again)."""
        if self._lac_event is not None:
            self._lac_event.set()

    async def wait_for_lac(self, previous_lac: int, timeout_s: float) -> None:
        """Wait until the LAC passes ``previous_lac``, the handle closes, a wake-up, or ``timeout_s``."""
        event = self._lac_event
        if event is None:
            event = self._lac_event = asyncio.Event()
        event.clear()
        if self.lac <= previous_lac and not self.closed:
            try:
                await asyncio.wait_for(event.wait(), timeout_s)
            except TimeoutError:
                pass
