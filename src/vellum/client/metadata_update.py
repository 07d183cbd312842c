"""The metadata writes of a ledger writer: a new segment (ensemble change) and the close, each a
compare-and-set with BookKeeper's conflict rules (its ``MetadataUpdateLoop`` for one handle).

Responsibility: turn "the open segment gets this ensemble from entry ``f``" and "the ledger is
CLOSED at entry ``l`` with length ``n``" into versioned writes of the ledger's metadata, decide
on a conflict whether to rebase on the newer version or give up, and keep the handle's
``LedgerView`` on the version written. The writer (``ledger_writer.py``) decides *when*.

Invariants:
- a write is always a CAS over the version the view holds; on a conflict the metadata is
  re-read and the write is retried on top of it only while the ledger is still in the state this
  writer writes in (OPEN for the writer, IN_RECOVERY for a recovery writer) and its open segment
  (first entry and ensemble) is still the one the writer knows: someone else changed only earlier,
  closed segments (re-replication). Otherwise the writer was fenced (``LedgerFencedError``, or
  ``LedgerRecoveryError`` for a recovery writer); a deleted ledger raises ``NoSuchLedgerError``;
- a close never overwrites anyone else's close (rule 10 of docs/correctness.md): a CLOSED ledger is accepted
  only at the same last entry, or by a recovery writer (another recoverer won);
- ``on_ensemble_change`` runs before every CAS of a new segment (a named ledger writes the new
  bookies into its record first); raising refuses the change;
- a recovery writer's ensemble changes are not written when they happen: they are kept with the
  handle and written with the close, in the same compare-and-set (BookKeeper's "recovery uses
  immutable metadata"). A recovery that fails half way therefore leaves the metadata naming the
  ensembles the old writer wrote to, and the next recovery reads the old writer's entries there:
  a segment a failed recovery had persisted would send it to a replacement bookie that never
  had them, whose "no such entry" then counts towards quorum coverage and truncates an
  acknowledged entry (found by the simulator, docs/verification.md);
- ``metadata_writes=False``: nothing is ever written (a probe whose metadata came from a name
  record, with no store version): every write raises ``LedgerRecoveryError``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from vellum.client.ledger_view import LedgerView
from vellum.errors import (
    LedgerFencedError,
    LedgerRecoveryError,
    MetadataVersionError,
    NoSuchLedgerError,
    VellumError,
)
from vellum.ids import BookieId
from vellum.meta.api import Versioned
from vellum.meta.model import LedgerMetadata, LedgerState

if TYPE_CHECKING:
    from vellum.client.context import ClientContext

#: what a writer calls before the compare-and-set of an ensemble change (see the module docstring)
EnsembleChangeHook = Callable[[LedgerMetadata], Awaitable[None]]

#: CAS conflicts an ensemble change rebases over before giving up
_MAX_REBASES = 100

#: A recovery writer keeps its ensemble changes until the close (see the module docstring). A
#: test flag, for the simulator's regression seeds only (docs/verification.md): they turn it off
#: to show the defect it fixes is found again. Never change it in production.
_defer_recovery_segments = True


class LedgerMetadataUpdater:
    """See the module docstring. One per writer; ``recovery`` selects the recovery writer's rules."""

    def __init__(
        self,
        ctx: ClientContext,
        view: LedgerView,
        *,
        recovery: bool,
        on_ensemble_change: EnsembleChangeHook | None = None,
        metadata_writes: bool = True,
    ) -> None:
        self._ctx = ctx
        self._view = view
        self.ledger_id = view.ledger_id
        self._recovery = recovery
        # the state this writer writes in, and what it raises once someone else moved the ledger on
        self._expected_state = LedgerState.IN_RECOVERY if recovery else LedgerState.OPEN
        self._fenced_cls: type[VellumError] = LedgerRecoveryError if recovery else LedgerFencedError
        self._on_ensemble_change = on_ensemble_change
        self._metadata_writes = metadata_writes
        #: a recovery writer's segments not written yet (first entry -> ensemble), in order
        self._deferred: dict[int, tuple[BookieId, ...]] = {}
        #: the open segment as the store holds it, while segments are deferred
        self._stored: LedgerMetadata | None = None

    async def _write(self, md: LedgerMetadata) -> int:
        """CAS ``md`` over the version the view holds; returns the new version."""
        if not self._metadata_writes:
            raise LedgerRecoveryError(
                f"ledger {self.ledger_id}: this handle's metadata did not come from the metadata store "
                "(a fast-recovery probe): it cannot change the metadata"
            )
        return await self._ctx.write_metadata(self.ledger_id, md, self._view.metadata_version)

    async def add_segment(self, first_entry_id: int, new_ensemble: list[str]) -> None:
        """Persist the segment ``{first_entry_id -> new_ensemble}`` (after ``on_ensemble_change``);
        on a conflict re-read and retry on top of it while the ledger is still in the state this
        writer writes in and its open segment is ours. The view adopts the new metadata (and so
        the new ensemble)."""
        view = self._view
        if self._recovery and self._metadata_writes and _defer_recovery_segments:
            md = view.metadata.with_ensemble(first_entry_id, [BookieId(b) for b in new_ensemble])
            if self._on_ensemble_change is not None:
                await self._on_ensemble_change(md)
            if self._stored is None:
                self._stored = view.metadata
            self._deferred[first_entry_id] = tuple(BookieId(b) for b in new_ensemble)
            view.adopt(Versioned(md, view.metadata_version))  # the store's version: nothing written
            return
        for _ in range(_MAX_REBASES):
            md = view.metadata.with_ensemble(first_entry_id, [BookieId(b) for b in new_ensemble])
            try:
                if self._on_ensemble_change is not None:
                    await self._on_ensemble_change(md)
                version = await self._write(md)
            except MetadataVersionError:
                current = await self._ctx.read_metadata(self.ledger_id)
                cur = current.value
                if cur.state is not self._expected_state:
                    raise self._fenced_cls(
                        f"ledger {self.ledger_id} is {cur.state.name} in the metadata: fenced by another client"
                    ) from None
                if not _same_open_segment(cur, view.metadata):
                    raise self._fenced_cls(
                        f"ledger {self.ledger_id}: another client changed the ensemble of the open segment"
                    ) from None
                # Someone changed an earlier (closed) segment, e.g. re-replication: rebase.
                view.adopt(current)
                continue
            except NoSuchLedgerError:
                raise NoSuchLedgerError(f"ledger {self.ledger_id} was deleted") from None
            view.adopt(Versioned(md, version))
            return
        raise MetadataVersionError(f"ledger {self.ledger_id}: ensemble change lost too many CAS races")

    async def close(self, last_entry_id: int, length: int) -> Versioned[LedgerMetadata]:
        """CAS the metadata to CLOSED(last_entry_id, length) (rule 10 of docs/correctness.md); the view adopts
        the closed metadata, which is returned.

        Conflict: re-read. CLOSED with the same last entry -> done (someone closed it the same
        way); CLOSED otherwise -> a writer gets LedgerFencedError, a recovery writer accepts it
        (another recoverer won and its result is the ledger's). Left the expected state -> fenced;
        same state but changed -> rebase on it only if the open segment is unchanged.
        """
        view = self._view
        while True:
            md = view.metadata.closed(last_entry_id, length)
            try:
                version = await self._write(md)
            except MetadataVersionError:
                current = await self._ctx.read_metadata(self.ledger_id)
                cur = current.value
                if cur.is_closed:
                    if cur.last_entry_id == last_entry_id or self._recovery:
                        view.adopt(current)
                        return current
                    raise LedgerFencedError(
                        f"ledger {self.ledger_id} was closed by another client at entry {cur.last_entry_id}; "
                        f"this writer's LAC is {last_entry_id}"
                    ) from None
                known = self._stored if self._stored is not None else view.metadata
                if cur.state is not self._expected_state or not _same_open_segment(cur, known):
                    raise self._fenced_cls(
                        f"ledger {self.ledger_id} is {cur.state.name} in the metadata and was changed by "
                        "another client: not closing over it"
                    ) from None
                if self._deferred:  # rebase: the deferred segments go on top of what the store holds
                    self._stored = cur
                    for first, ensemble in self._deferred.items():
                        cur = cur.with_ensemble(first, ensemble)
                    current = Versioned(cur, current.version)
                view.adopt(current)
                continue
            current = Versioned(md, version)
            view.adopt(current)
            self._deferred, self._stored = {}, None
            return current


def _same_open_segment(a: LedgerMetadata, b: LedgerMetadata) -> bool:
    """Do ``a`` and ``b`` agree on the open (last) segment: its first entry and its ensemble?"""
    return max(a.ensembles) == max(b.ensembles) and a.last_ensemble == b.last_ensemble
