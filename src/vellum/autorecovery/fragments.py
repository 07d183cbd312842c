"""Fragments: the entries of one ledger segment that one ensemble position stores (pure).

A ledger's metadata is a list of segments ``{first entry: ensemble}``. Position ``i`` of a
segment stores every entry ``e`` of the segment whose write set (round-robin striping,
``distribution.write_set``) contains ``i``. A *fragment* is that: (segment, position). It is the
unit the auditor marks and a replication worker replaces, as BookKeeper's ``LedgerFragment``.

The end of a segment is the entry before the next segment's first entry; the last segment ends
at the ledger's last entry when it is closed, and is open-ended (``last_entry is None``) while
the ledger is open or in recovery: a writer may still be adding to it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterator
from dataclasses import dataclass

from vellum.client.distribution import write_set
from vellum.ids import BookieId
from vellum.meta.model import LedgerMetadata


@dataclass(frozen=True)
class Fragment:
    """Position ``index`` of the segment starting at ``first_entry``."""

    ledger_id: int
    first_entry: int
    last_entry: int | None  # inclusive; None: the open segment of an unclosed ledger
    ensemble: tuple[str, ...]
    index: int

    @property
    def bookie(self) -> str:
        return self.ensemble[self.index]

    @property
    def is_open(self) -> bool:
        return self.last_entry is None

    def entries(self, write_quorum_size: int, last_entry: int | None = None) -> list[int]:
        """The entries this position stores, up to ``last_entry`` for an open fragment."""
        last = self.last_entry if self.last_entry is not None else last_entry
        if last is None:
            raise ValueError(f"ledger {self.ledger_id}: the open fragment at {self.first_entry} has no end")
        size = len(self.ensemble)
        return [e for e in range(self.first_entry, last + 1)
                if self.index in write_set(e, size, write_quorum_size)]

    def sources(self, entry_id: int, write_quorum_size: int) -> list[str]:
        """The other bookies of the segment that store ``entry_id`` (where to copy it from)."""
        return [self.ensemble[i] for i in write_set(entry_id, len(self.ensemble), write_quorum_size)
                if i != self.index]


def fragments(ledger_id: int, md: LedgerMetadata) -> Iterator[Fragment]:
    """Every fragment of the ledger, in segment and position order."""
    firsts = sorted(md.ensembles)
    for n, first in enumerate(firsts):
        if n + 1 < len(firsts):
            last: int | None = firsts[n + 1] - 1
        else:
            last = md.last_entry_id if md.is_closed else None
        ensemble = tuple(str(b) for b in md.ensembles[first])
        for index in range(len(ensemble)):
            yield Fragment(ledger_id, first, last, ensemble, index)


def fragments_on(ledger_id: int, md: LedgerMetadata, bookies: Collection[str]) -> list[Fragment]:
    """The fragments stored by any of ``bookies``."""
    return [f for f in fragments(ledger_id, md) if f.bookie in bookies]


def bookies_of(md: LedgerMetadata) -> set[str]:
    """Every bookie named by any segment of the ledger."""
    return {str(b) for ensemble in md.ensembles.values() for b in ensemble}


def replace_bookie(md: LedgerMetadata, first_entry: int, index: int, new_bookie: str) -> LedgerMetadata:
    """The metadata with position ``index`` of the segment at ``first_entry`` replaced."""
    ensemble = list(md.ensembles[first_entry])
    ensemble[index] = BookieId(new_bookie)
    ensembles = dict(md.ensembles)
    ensembles[first_entry] = tuple(ensemble)
    return dataclasses.replace(md, ensembles=ensembles)
