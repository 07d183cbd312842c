"""Where a ledger's entries live, pure: its segments and, per bookie of a segment, how many of
the segment's entries the round-robin striping gives it and how many of those it holds.

A segment is the entry range ``[first, last]`` written to one ensemble; entry ``e`` goes to the
ensemble indexes ``(e + k) % E`` for ``k < WQ`` (BookKeeper's ``RoundRobinDistributionSchedule``).
``held`` are the sorted disjoint inclusive ranges a bookie answers to LIST_ENTRIES. No I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Segment:
    first: int
    last: int  # -1 below ``first``: an empty segment (or an open ledger with nothing confirmed)
    ensemble: tuple[str, ...]

    @property
    def entries(self) -> int:
        return max(0, self.last - self.first + 1)


def segments(ensembles: Mapping[int, Sequence[str]], last_entry: int) -> list[Segment]:
    """The segments of a ledger whose last entry (closed: its last entry id; open: its LAC) is
    ``last_entry``."""
    firsts = sorted(ensembles)
    out = []
    for k, first in enumerate(firsts):
        last = firsts[k + 1] - 1 if k + 1 < len(firsts) else last_entry
        out.append(Segment(first, min(last, last_entry) if k + 1 == len(firsts) else last,
                           tuple(str(b) for b in ensembles[first])))
    return out


def expected_in(a: int, b: int, index: int, ensemble_size: int, write_quorum: int) -> int:
    """How many entry ids in ``[a, b]`` have ensemble index ``index`` in their write set."""
    if b < a:
        return 0
    e = ensemble_size
    count = 0
    for r in range(e):
        if (index - r) % e < write_quorum:  # the entries with id % E == r are striped onto index
            first = a + ((r - a) % e)
            if first <= b:
                count += (b - first) // e + 1
    return count


def intersect(ranges: Iterable[tuple[int, int]], a: int, b: int) -> list[tuple[int, int]]:
    return [(max(a, x), min(b, y)) for x, y in ranges if max(a, x) <= min(b, y)]


@dataclass(frozen=True)
class ReplicaState:
    bookie: str
    index: int
    expected: int
    held: int  # of the expected entries
    first_missing: tuple[int, ...]

    @property
    def missing(self) -> int:
        return self.expected - self.held

    @property
    def complete(self) -> bool:
        return self.missing == 0


def replica_state(segment: Segment, index: int, held: Sequence[tuple[int, int]], ensemble_size: int,
                  write_quorum: int, *, examples: int = 5) -> ReplicaState:
    """What bookie ``segment.ensemble[index]`` holds of the entries striped onto it."""
    a, b = segment.first, segment.last
    expected = expected_in(a, b, index, ensemble_size, write_quorum)
    inside = intersect(held, a, b)
    have = sum(expected_in(x, y, index, ensemble_size, write_quorum) for x, y in inside)
    missing: list[int] = []
    if have < expected:
        eid, budget = a, 100_000  # examples only: bounded work
        while eid <= b and len(missing) < examples and budget > 0:
            if (index - eid) % ensemble_size < write_quorum and not any(x <= eid <= y for x, y in inside):
                missing.append(eid)
            eid += 1
            budget -= 1
    return ReplicaState(segment.ensemble[index], index, expected, have, tuple(missing))
