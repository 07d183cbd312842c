"""Where a ledger's entries live and which answers are enough: write sets, quorum coverage and the
plans of batched and strided range reads (BookKeeper's ``RoundRobinDistributionSchedule``).

Responsibility: the arithmetic of round-robin striping, shared by the writer, the reader and
recovery. Pure: no I/O, no asyncio, no clock; every function answers from its arguments alone,
so it is tested like the codec (tests/client/test_distribution.py).

Vocabulary: ``E`` ensemble size, ``WQ`` write quorum, ``AQ`` ack quorum (``E >= WQ >= AQ >= 1``);
an *index* is a position in an ensemble; a *segment* is the run of entries from one first entry
id of the ledger's ensembles (``LedgerMetadata.ensembles``) to the next one's predecessor.

Invariants:
- entry ``e`` is stored on its write set ``{(e + i) % E : i < WQ}`` of its segment's ensemble
  (round-robin striping), in that order: the first index is the write set's head;
- quorum coverage: once every write set has ``(WQ - AQ) + 1`` answering members, no write set
  can hold ``AQ`` silent bookies, so no entry the answers do not show was acknowledged;
  ensemble coverage ``(E - AQ) + 1`` answers leave fewer than ``AQ`` bookies unanswered;
- read plans cover ``first..last`` exactly once, in entry-id order, and no chunk crosses a
  segment boundary (one chunk, one write set).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

__all__ = [
    "RoundRobinSchedule",
    "chunk_entries",
    "ensemble_coverage",
    "has_quorum_coverage",
    "plan_batched_chunks",
    "plan_strided_chunks",
    "segment_last",
    "size_cut",
    "strided_ids",
    "write_set",
]


def write_set(entry_id: int, ensemble_size: int, write_quorum_size: int) -> list[int]:
    """Ensemble indexes storing ``entry_id``: round-robin striping (BookKeeper's
    ``RoundRobinDistributionSchedule``)."""
    return [(entry_id + i) % ensemble_size for i in range(write_quorum_size)]


def has_quorum_coverage(responded: Collection[int], ensemble_size: int, write_quorum_size: int,
                        ack_quorum_size: int) -> bool:
    """True once every possible write set has ``(WQ - AQ) + 1`` members that answered.

    Then no write set can hold ``AQ`` bookies that did not answer, so no entry the answers do not
    show can have been acknowledged (BookKeeper's ``RRQuorumCoverageSet``).
    """
    need = write_quorum_size - ack_quorum_size + 1
    return all(sum(1 for idx in write_set(start, ensemble_size, write_quorum_size) if idx in responded) >= need
               for start in range(ensemble_size))


def ensemble_coverage(ensemble_size: int, ack_quorum_size: int) -> int:
    """Answers needed so that fewer than ``AQ`` bookies of the ensemble remain unfenced: ``(E - AQ) + 1``."""
    return ensemble_size - ack_quorum_size + 1


class RoundRobinSchedule:
    """The write sets of one ledger's quorum sizes, computed once: entry ``e``'s write set is
    ``write_sets[e % E]`` (there are only ``E`` distinct ones), so the append path indexes a table
    instead of computing ``WQ`` remainders per entry."""

    __slots__ = ("_member_sets", "ack_quorum_size", "ensemble_size", "write_quorum_size", "write_sets")

    def __init__(self, ensemble_size: int, write_quorum_size: int, ack_quorum_size: int) -> None:
        self.ensemble_size = ensemble_size
        self.write_quorum_size = write_quorum_size
        self.ack_quorum_size = ack_quorum_size
        #: ``write_sets[r]``: the write set (ensemble indexes, head first) of every entry ``e`` with ``e % E == r``
        self.write_sets: tuple[tuple[int, ...], ...] = tuple(
            tuple(write_set(r, ensemble_size, write_quorum_size)) for r in range(ensemble_size)
        )
        # the same write sets as sets: coverage is asked at every answer of a LAC read, and a
        # set intersection counts a write set's answered members in C
        self._member_sets = tuple(frozenset(ws) for ws in self.write_sets)

    def write_set(self, entry_id: int) -> tuple[int, ...]:
        """Ensemble indexes storing ``entry_id``, head first."""
        return self.write_sets[entry_id % self.ensemble_size]

    def replicas(self, ensemble: Sequence[str], entry_id: int, rotation: int = 0) -> list[str]:
        """The bookies of ``ensemble`` storing ``entry_id``, in write-set order starting at its
        ``rotation``-th member (reads spread over the replicas by rotating)."""
        ws = self.write_sets[entry_id % self.ensemble_size]
        r = rotation % len(ws)
        if r:
            ws = ws[r:] + ws[:r]
        return list(map(ensemble.__getitem__, ws))

    def has_quorum_coverage(self, responded: Collection[int]) -> bool:
        """See :func:`has_quorum_coverage` (the same answer, from the write sets made once)."""
        need = self.write_quorum_size - self.ack_quorum_size + 1
        return all(len(members.intersection(responded)) >= need for members in self._member_sets)

    @property
    def ensemble_coverage(self) -> int:
        """See :func:`ensemble_coverage`."""
        return ensemble_coverage(self.ensemble_size, self.ack_quorum_size)

    @property
    def write_set_coverage(self) -> int:
        """Explicit negatives from one write set that prove its entry was never acknowledged:
        ``(WQ - AQ) + 1`` (then fewer than ``AQ`` members can hold it)."""
        return self.write_quorum_size - self.ack_quorum_size + 1

    def ack_quorum_possible(self, failed: Collection[int]) -> bool:
        """Can every write set still reach ``AQ`` without the ensemble indexes in ``failed``?"""
        aq = self.ack_quorum_size
        return all(sum(1 for idx in ws if idx not in failed) >= aq for ws in self.write_sets)


# ------------------------------------------------------------------------------- read plans


def segment_last(start: int, last: int, segment_firsts: Iterable[int]) -> int:
    """The last entry id ``<= last`` in the segment holding ``start`` (a read that starts at
    ``start`` must stop there: the next segment has another ensemble)."""
    for first in sorted(segment_firsts):
        if start < first <= last:
            return first - 1
    return last


def plan_batched_chunks(first: int, last: int, segment_firsts: Iterable[int], per_chunk: int) -> list[tuple[int, int]]:
    """``first..last`` as ``(lo, hi)`` chunks of at most ``per_chunk`` entries (BATCH_READ on an
    unstriped ledger), none crossing a segment boundary; in entry-id order."""
    bounds = sorted(segment_firsts)
    chunks: list[tuple[int, int]] = []
    lo = first
    while lo <= last:
        hi = segment_last(lo, min(last, lo + per_chunk - 1), bounds)
        chunks.append((lo, hi))
        lo = hi + 1
    return chunks


def plan_strided_chunks(
    first: int, last: int, segment_firsts: Iterable[int], ensemble_size: int, per_chunk: int
) -> list[tuple[int, int]]:
    """``first..last`` of a striped ledger as READ_STRIDED chunks ``(start, count)``: entries
    ``start, start + E, ...`` (``count`` of them, at most ``per_chunk``), all in one segment and
    all headed by one bookie (the one at index ``start % E``). Sorted by ``start``, so that the
    chunks of every bookie interleave in entry order."""
    E = ensemble_size
    starts = sorted(segment_firsts)
    chunks: list[tuple[int, int]] = []
    for k, seg_first in enumerate(starts):
        lo = max(first, seg_first)
        hi = min(last, starts[k + 1] - 1) if k + 1 < len(starts) else last
        for r in range(E):
            e = lo + (r - lo) % E
            while e <= hi:
                count = min(per_chunk, (hi - e) // E + 1)
                chunks.append((e, count))
                e += count * E
    chunks.sort()
    return chunks


def strided_ids(start: int, count: int, ensemble_size: int) -> list[int]:
    """The entry ids of the strided chunk ``(start, count)``."""
    return [start + i * ensemble_size for i in range(count)]


def chunk_entries(lac: int, lac_length: int, per_entry_overhead: int, max_entries: int, max_bytes: int) -> int:
    """Entries per read chunk: about ``max_bytes`` of stored entries (payload at the ledger's
    average size so far, plus ``per_entry_overhead`` > 0 of header and digest, which the bookie's
    size cap counts too), at least one, at most ``max_entries``; ``max_entries`` while the average
    is unknown (nothing confirmed, or no length learnt)."""
    if lac >= 0 and lac_length > 0:
        avg = lac_length // (lac + 1) + per_entry_overhead
        return max(1, min(max_entries, max_bytes // avg))
    return max_entries


def size_cut(sizes: Iterable[int], max_size: int) -> int:
    """How many leading entries of ``sizes`` a batch of at most ``max_size`` bytes holds: at least
    one (a batch always returns its first entry), all of them when ``max_size <= 0``."""
    n = 0
    total = 0
    for i, size in enumerate(sizes):
        total += size
        if max_size > 0 and total > max_size and i > 0:
            return i
        n = i + 1
    return n
