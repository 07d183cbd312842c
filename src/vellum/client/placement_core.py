"""What every ensemble placement policy shares (``client/placement.py`` describes the policies):
the ``PlacementPolicy`` interface and the default (random) policy, the candidates of a new
ensemble or a replacement, write-quorum windows and their levels (racks, zones, regions), the
arrangement search and ``TopologyAwarePlacementPolicy``, the base of the rack-, zone- and
region-aware policies (``client/placement_rack.py``, ``placement_zone.py``, ``placement_region.py``).
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from typing import Generic, TypeVar

from vellum.client.topology import TopologyResolver
from vellum.errors import IncorrectParameterError, NotEnoughBookiesError

DEFAULT_RACK = "/default-rack"
DEFAULT_ZONE = "/default-zone"
DEFAULT_UPGRADE_DOMAIN = "/default-upgradedomain"
#: BookKeeper's name of the region of a bookie whose location is unknown
UNKNOWN_REGION = "UnknownRegion"

# Upper bound on search steps of the arrangement search for one target level. Ensembles are
# small (tens of bookies at most); the heuristic order finds an arrangement on the first path
# almost always, the bound only stops a pathological exhaustive search.
_SEARCH_BUDGET = 20_000

L = TypeVar("L", bound=Hashable)


def check_quorums(size: int, write_quorum: int, ack_quorum: int) -> None:
    if not size >= write_quorum >= ack_quorum >= 1:
        raise IncorrectParameterError(
            f"need ensemble size >= write quorum >= ack quorum >= 1, got {size} >= {write_quorum} >= {ack_quorum}"
        )


def _candidates(writable: Collection[str], read_only: Collection[str], exclude: Collection[str]) -> list[str]:
    """Writable bookies that are neither read-only nor excluded, deduplicated, sorted (so that
    a seeded rng gives reproducible choices)."""
    banned = set(read_only) | set(exclude)
    return sorted({b for b in writable if b not in banned})


def _not_enough(
    needed: int, available: int, what: str, read_only: int, excluded: int
) -> NotEnoughBookiesError:
    return NotEnoughBookiesError(
        f"{what}: need {needed} bookie(s), {available} available (writable bookies that are "
        f"neither read-only nor excluded; {read_only} read-only, {excluded} excluded)"
    )


class PlacementPolicy(ABC):
    """Chooses ensembles and replacement bookies (see the module docstring for invariants)."""

    @abstractmethod
    def new_ensemble(
        self,
        size: int,
        write_quorum: int,
        ack_quorum: int,
        *,
        writable: Collection[str],
        read_only: Collection[str],
        exclude: Collection[str] = (),
    ) -> list[str]:
        """``size`` distinct bookies for a new ensemble (position order matters for striping)."""

    @abstractmethod
    def replace_bookie(
        self,
        ensemble: Sequence[str],
        index: int,
        write_quorum: int,
        *,
        writable: Collection[str],
        read_only: Collection[str],
        exclude: Collection[str] = (),
        ack_quorum: int | None = None,
    ) -> str:
        """A bookie to take position ``index`` of ``ensemble``, not already in it. ``ack_quorum``
        (default: ``write_quorum``) matters to the region-aware durability rule only."""

    def adheres(
        self, ensemble: Sequence[str], write_quorum: int, *, bookies: Collection[str], ack_quorum: int | None = None
    ) -> bool:
        """Whether an existing ensemble meets this policy, given the cluster's ``bookies`` (the
        auditor's placement check). Distinct members are all the default policy asks."""
        return len(set(ensemble)) == len(ensemble)

    def learn(self, bookies: Collection[str], *, retry_failed: bool = False) -> None:
        """Learn the network locations of ``bookies`` now (may run the topology script: call it
        off the event loop, e.g. when the bookie lists change); ``retry_failed``: ask again for
        hosts whose earlier script run failed. Nothing to learn by default."""
        return None


class DefaultPlacementPolicy(PlacementPolicy):
    """BookKeeper's DefaultEnsemblePlacementPolicy: uniformly random among the candidates."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    def new_ensemble(
        self,
        size: int,
        write_quorum: int,
        ack_quorum: int,
        *,
        writable: Collection[str],
        read_only: Collection[str],
        exclude: Collection[str] = (),
    ) -> list[str]:
        candidates = ensemble_candidates(size, write_quorum, ack_quorum, writable, read_only, exclude)
        return self._rng.sample(candidates, size)

    def replace_bookie(
        self,
        ensemble: Sequence[str],
        index: int,
        write_quorum: int,
        *,
        writable: Collection[str],
        read_only: Collection[str],
        exclude: Collection[str] = (),
        ack_quorum: int | None = None,
    ) -> str:
        candidates = replacement_candidates(ensemble, index, writable, read_only, exclude)
        return self._rng.choice(candidates)


def _check_index(ensemble: Sequence[str], index: int) -> None:
    if not 0 <= index < len(ensemble):
        raise IncorrectParameterError(f"index {index} outside ensemble of {len(ensemble)}")


def write_quorum_windows(size: int, write_quorum: int) -> list[list[int]]:
    """The write quorums of an ensemble of ``size`` under round-robin striping: every window of
    ``write_quorum`` consecutive positions, wrapping (one window when ``size == write_quorum``)."""
    if size == write_quorum:
        return [list(range(size))]
    return [[(start + j) % size for j in range(write_quorum)] for start in range(size)]


def min_racks_per_write_quorum(racks: Sequence[str], write_quorum: int) -> int:
    """The smallest number of distinct racks over the write quorums of an ensemble whose
    position ``i`` is on ``racks[i]``."""
    return min_level(racks, write_quorum, rack_level)


def min_level(locations: Sequence[L], write_quorum: int, level: Callable[[Sequence[L]], int]) -> int:
    """The worst ``level`` over the write quorums of an ensemble whose position ``i`` is at
    ``locations[i]``."""
    return min(level([locations[i] for i in w]) for w in write_quorum_windows(len(locations), write_quorum))


# ------------------------------------------------------------------------------ window levels


def rack_level(racks: Sequence[str]) -> int:
    """Rack-aware: the racks a write quorum spans."""
    return len(set(racks))


def zone_level(locations: Sequence[tuple[str, str]]) -> int:
    """Zone-aware: the zones a write quorum spans, or 0 when two of its bookies in one zone share
    an upgrade domain (BookKeeper: several bookies of one zone must be in >= 2 upgrade domains)."""
    uds: dict[str, set[str]] = {}
    count: Counter[str] = Counter()
    for zone, ud in locations:
        uds.setdefault(zone, set()).add(ud)
        count[zone] += 1
    if any(count[z] > 1 and len(uds[z]) < 2 for z in count):
        return 0
    return len(count)


def durable(regions: Sequence[str], ack_quorum: int, min_regions: int) -> bool:
    """Region durability: no ``min_regions - 1`` regions hold ``ack_quorum`` members of the write
    quorum, i.e. any ``ack_quorum`` of them span ``min_regions`` regions (BookKeeper's
    RackOrRegionDurabilityCoverageSet)."""
    if min_regions <= 1:
        return True
    largest = sorted(Counter(regions).values(), reverse=True)[: min_regions - 1]
    return sum(largest) <= ack_quorum - 1


def region_level(ack_quorum: int, min_regions: int) -> Callable[[Sequence[tuple[str, str]]], int]:
    """Region-aware: the regions a write quorum spans, 0 when it breaks durability."""

    def level(locations: Sequence[tuple[str, str]]) -> int:
        regions = [region for region, _rack in locations]
        return len(set(regions)) if durable(regions, ack_quorum, min_regions) else 0

    return level


# ---------------------------------------------------------------------------- the search


def _arrange(
    size: int,
    write_quorum: int,
    k: int,
    capacity: Mapping[L, int],
    level: Callable[[Sequence[L]], int],
    group: Callable[[L], Hashable],
    rng: random.Random,
) -> list[L] | None:
    """A sequence of ``size`` locations (each used at most ``capacity[loc]`` times) in which
    every write quorum window has ``level >= k``, or None if there is none (or the search budget
    ran out). Depth-first search, most promising location first: one whose ``group`` (rack,
    zone, region) is not in the windows being filled, then one not itself there, then the one
    with most bookies left."""
    windows = write_quorum_windows(size, write_quorum)
    # windows that end at position p (their last position in placement order)
    closing: dict[int, list[list[int]]] = {}
    for w in windows:
        closing.setdefault(max(w), []).append(w)
    tie = {loc: rng.random() for loc in capacity}
    left = dict(capacity)
    seq: list[L] = []
    budget = [_SEARCH_BUDGET]

    def ok(pos: int) -> bool:
        return all(level([seq[i] for i in w]) >= k for w in closing.get(pos, ()))

    def place(pos: int) -> bool:
        if pos == size:
            return True
        budget[0] -= 1
        if budget[0] < 0:
            return False
        recent = set(seq[max(0, pos - write_quorum + 1) : pos])
        if pos + write_quorum > size:  # wrap-around windows also see the first positions
            recent.update(seq[: pos + write_quorum - size])
        recent_groups = {group(r) for r in recent}
        order = sorted(
            (r for r, n in left.items() if n > 0),
            key=lambda r: (group(r) in recent_groups, r in recent, -left[r], tie[r]),
        )
        for loc in order:
            seq.append(loc)
            left[loc] -= 1
            if ok(pos) and place(pos + 1):
                return True
            seq.pop()
            left[loc] += 1
        return False

    return list(seq) if place(0) else None


class Shortfall(Exception):
    """No arrangement or candidate reaches the policy's floor (the policy words the error)."""

    def __init__(self, best: int) -> None:
        super().__init__(best)
        self.best = best


class TopologyAwarePlacementPolicy(PlacementPolicy, Generic[L]):
    """What the rack-, zone- and region-aware policies share: network locations from a
    resolver, the arrangement search for new ensembles and the rating of replacements. A
    subclass says how a network location string becomes a location ``L``, how a write quorum of
    locations is rated (``level``), the target and the floor."""

    def __init__(self, resolver: TopologyResolver, rng: random.Random | None) -> None:
        self.resolver = resolver
        self._rng = rng or random.Random()

    def learn(self, bookies: Collection[str], *, retry_failed: bool = False) -> None:
        forget = getattr(self.resolver, "forget_failures", None)
        if retry_failed and forget is not None:
            forget()
        self.resolver.resolve(bookies)

    def network_location(self, bookie_id: str) -> str | None:
        """What the resolver says (``None``: unknown)."""
        return self.resolver.location(bookie_id)

    @abstractmethod
    def locate(self, bookie_id: str) -> L: ...

    @staticmethod
    @abstractmethod
    def _group(loc: L) -> Hashable: ...

    def _eligible(self, bookie_id: str) -> bool:
        """May this bookie be chosen at all (strict zone-aware placement refuses unknown ones)."""
        return True

    def _by_location(self, candidates: Sequence[str]) -> dict[L, list[str]]:
        by_loc: dict[L, list[str]] = {}
        for bookie in candidates:
            by_loc.setdefault(self.locate(bookie), []).append(bookie)
        for bookies in by_loc.values():
            self._rng.shuffle(bookies)
        return by_loc

    def _search(
        self, size: int, write_quorum: int, by_loc: Mapping[L, list[str]], level: Callable[[Sequence[L]], int],
        target: int, floor: int,
    ) -> list[str]:
        """An ensemble from ``by_loc`` whose write quorums all reach ``target``, else the best
        level down to ``floor``; :class:`Shortfall` below it."""
        capacity = {loc: len(b) for loc, b in by_loc.items()}
        for k in range(target, floor - 1, -1):
            locs = _arrange(size, write_quorum, k, capacity, level, self._group, self._rng)
            if locs is not None:
                taken: Counter[L] = Counter()
                ensemble = []
                for loc in locs:
                    ensemble.append(by_loc[loc][taken[loc]])
                    taken[loc] += 1
                return ensemble
        raise Shortfall(floor - 1)

    def _rate_replacements(
        self, ensemble: Sequence[str], index: int, write_quorum: int, by_loc: Mapping[L, list[str]],
        level: Callable[[Sequence[L]], int],
    ) -> dict[L, int]:
        """For each candidate location: the worst level of the write quorums containing
        ``index`` with a bookie of that location there."""
        size = len(ensemble)
        locs = [self.locate(b) for b in ensemble]
        windows = [w for w in write_quorum_windows(size, min(write_quorum, size)) if index in w]

        def rate(loc: L) -> int:
            return min(level([loc if i == index else locs[i] for i in w]) for w in windows)

        return {loc: rate(loc) for loc in by_loc}

    def _pick(self, by_loc: Mapping[L, list[str]], scores: Mapping[L, int]) -> str:
        """A bookie of a best-rated location; among those, of the location with most candidates
        (spreads load), then random."""
        best = max(scores.values())
        best_locs = [loc for loc in by_loc if scores[loc] == best]
        most = max(len(by_loc[loc]) for loc in best_locs)
        choices = sorted((loc for loc in best_locs if len(by_loc[loc]) == most), key=repr)
        return by_loc[self._rng.choice(choices)][0]


def ensemble_candidates(
    size: int, write_quorum: int, ack_quorum: int, writable: Collection[str], read_only: Collection[str],
    exclude: Collection[str],
) -> list[str]:
    """Writable bookies a new ensemble may use (not read-only, not excluded), after checking the
    quorums; NotEnoughBookiesError when there are fewer than ``size``."""
    check_quorums(size, write_quorum, ack_quorum)
    candidates = _candidates(writable, read_only, exclude)
    if len(candidates) < size:
        raise _not_enough(size, len(candidates), "new ensemble", len(set(read_only)), len(set(exclude)))
    return candidates


def replacement_candidates(
    ensemble: Sequence[str], index: int, writable: Collection[str], read_only: Collection[str],
    exclude: Collection[str],
) -> list[str]:
    """Writable bookies that may replace ``ensemble[index]`` (not read-only, not excluded, not
    already in the ensemble); NotEnoughBookiesError when there is none."""
    _check_index(ensemble, index)
    candidates = _candidates(writable, read_only, [*exclude, *ensemble])
    if not candidates:
        raise _not_enough(1, 0, f"replace bookie {ensemble[index]}", len(set(read_only)), len(set(exclude)))
    return candidates
