"""Choosing bookies: ensemble placement policies (BookKeeper's EnsemblePlacementPolicy).

Responsibility: pick the bookies of a new ensemble and the replacement of a failed ensemble
member, from the writable bookies the metadata store lists, and tell whether an existing
ensemble meets the policy (the auditor's placement check). Pure except for the network
locations, which come from a :mod:`vellum.client.topology` resolver (a script BookKeeper-style,
or a mapping) and :func:`load_rack_mapping` reading the file it is given.

Invariants of every policy:
* an ensemble has distinct members; a replacement is never a current member of the ensemble;
* read-only bookies are never chosen (a bookie listed both writable and read-only counts as
  read-only), nor excluded ones (e.g. bookies quarantined after errors);
* when there are not enough candidates the policy raises :class:`NotEnoughBookiesError` saying
  how many were needed and how many were available.

Write quorums: entry ``e`` is written to ``ensemble[(e + i) % E] for i < WQ`` (round-robin
striping), so every window of ``WQ`` consecutive ensemble positions, wrapping around, is a write
quorum (one window when ``E == WQ``). The topology-aware policies rate each window with a
*level* (racks, zones or regions it spans, 0 when it breaks a hard rule) and search for an
arrangement of network locations in which every window reaches a target level; when none exists
they degrade one level at a time down to their floor, below which they raise:

* **rack-aware** (``RackawarePlacementPolicy``): level = racks in the window; target
  ``min(minNumRacksPerWriteQuorum, WQ, racks available)``; floor = the target with
  ``enforceMinNumRacksPerWriteQuorum``, else 1. Unknown bookies are on ``/default-rack``.
* **zone-aware** (``ZoneawarePlacementPolicy``): locations ``/zone/upgradedomain``; level = zones
  in the window, or 0 when two bookies of one zone in the window share an upgrade domain;
  target ``min(desiredNumZonesPerWriteQuorum, WQ, zones available)``; with
  ``enforceStrictZoneawarePlacement`` the floor is ``minNumZonesPerWriteQuorum``, bookies whose
  location is unknown are never chosen, and ``E`` must be a multiple of ``WQ`` with
  ``WQ > minNumZonesPerWriteQuorum`` (BookKeeper's rules); without it, best effort (floor 0).
* **region-aware** (``RegionawarePlacementPolicy``): locations ``/region/rack``; level = regions
  in the window. With ``reppRegionsToWrite`` set, durability is enforced: no
  ``reppMinimumRegionsForDurability - 1`` regions may hold ``AQ`` members of a write quorum
  (so every acknowledged entry is in that many regions), level 0 otherwise, floor 1. A
  replacement comes from the replaced bookie's rack, else its region (which keeps every
  region's share), else any region that keeps durability
  (``reppEnableDurabilityEnforcementInReplace``). Racks inside a region are only preferred apart
  (the search order), ``minNumRacksPerWriteQuorum`` is not applied per region.

A replacement is the candidate whose location gives the worst write quorum containing the
replaced position the best level, the same rating as new ensembles (ties: the location with
most candidates, then random).
"""

from __future__ import annotations

import logging
import random
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from pathlib import Path
from typing import Generic, TypeVar

from vellum.client.topology import MappingResolver, ScriptError, ScriptResolver, TopologyResolver
from vellum.config import ClientConfig, placement_policy_name
from vellum.errors import ConfigError, IncorrectParameterError, NotEnoughBookiesError

log = logging.getLogger(__name__)

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


def _check_quorums(size: int, write_quorum: int, ack_quorum: int) -> None:
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
        candidates = _ensemble_candidates(size, write_quorum, ack_quorum, writable, read_only, exclude)
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
        candidates = _replacement_candidates(ensemble, index, writable, read_only, exclude)
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


class _Shortfall(Exception):
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
        level down to ``floor``; :class:`_Shortfall` below it."""
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
        raise _Shortfall(floor - 1)

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


# ------------------------------------------------------------------------------- rack-aware


class RackawarePlacementPolicy(TopologyAwarePlacementPolicy[str]):
    """BookKeeper's RackawareEnsemblePlacementPolicy: spread each write quorum over racks.

    ``rack_of`` is a resolver, or a callable ``bookie_id -> rack`` (``/rack`` style) where a
    falsy answer or a ``KeyError`` means unknown, i.e. :data:`DEFAULT_RACK`.
    """

    def __init__(
        self,
        rack_of: Callable[[str], str | None] | TopologyResolver,
        *,
        min_racks_per_write_quorum: int = 2,
        enforce: bool = False,
        rng: random.Random | None = None,
    ) -> None:
        if min_racks_per_write_quorum < 1:
            raise IncorrectParameterError(
                f"min_racks_per_write_quorum must be >= 1, got {min_racks_per_write_quorum}"
            )
        resolver = rack_of if hasattr(rack_of, "location") else MappingResolver(rack_of)  # type: ignore[arg-type]
        super().__init__(resolver, rng)  # type: ignore[arg-type]
        self._min_racks = min_racks_per_write_quorum
        self._enforce = enforce

    @classmethod
    def from_mapping(
        cls,
        mapping: Mapping[str, str],
        *,
        min_racks_per_write_quorum: int = 2,
        enforce: bool = False,
        rng: random.Random | None = None,
    ) -> RackawarePlacementPolicy:
        """A policy whose racks come from a ``bookie id -> /rack`` mapping (e.g. the contents
        of :func:`load_rack_mapping`, or a mapping kept in the metadata store). The mapping is
        read at each placement, so a mutable mapping may be updated in place."""
        return cls(MappingResolver(mapping), min_racks_per_write_quorum=min_racks_per_write_quorum,
                   enforce=enforce, rng=rng)

    def rack(self, bookie_id: str) -> str:
        return self.network_location(bookie_id) or DEFAULT_RACK

    locate = rack

    @staticmethod
    def _group(loc: str) -> Hashable:
        return loc

    def adheres(
        self, ensemble: Sequence[str], write_quorum: int, *, bookies: Collection[str], ack_quorum: int | None = None
    ) -> bool:
        """Every write quorum window spans ``min(minNumRacksPerWriteQuorum, WQ, racks of the
        cluster's bookies)`` racks (the bound ``new_ensemble`` aims for)."""
        if len(set(ensemble)) != len(ensemble):
            return False
        racks = [self.rack(b) for b in ensemble]
        need = min(self._min_racks, write_quorum, len({self.rack(b) for b in bookies} | set(racks)))
        return min_racks_per_write_quorum(racks, min(write_quorum, len(racks))) >= need

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
        candidates = _ensemble_candidates(size, write_quorum, ack_quorum, writable, read_only, exclude)
        by_rack = self._by_location(candidates)
        target = min(self._min_racks, write_quorum, len(by_rack))
        try:
            return self._search(size, write_quorum, by_rack, rack_level, target, target if self._enforce else 1)
        except _Shortfall:
            raise NotEnoughBookiesError(
                f"new ensemble: cannot spread each write quorum of {write_quorum} (ensemble "
                f"{size}) over {target} racks with the writable bookies per rack "
                f"{ {r: len(b) for r, b in sorted(by_rack.items())} } (enforceMinNumRacksPerWriteQuorum)"
            ) from None

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
        candidates = _replacement_candidates(ensemble, index, writable, read_only, exclude)
        by_rack = self._by_location(candidates)
        others = {self.rack(b) for i, b in enumerate(ensemble) if i != index}
        target = min(self._min_racks, write_quorum, len(ensemble), len(others | set(by_rack)))
        scores = self._rate_replacements(ensemble, index, write_quorum, by_rack, rack_level)
        best = max(scores.values())
        if best < target and self._enforce:
            raise NotEnoughBookiesError(
                f"replace bookie {ensemble[index]}: no writable bookie keeps every write quorum "
                f"of {write_quorum} on {target} racks (best {best}; candidates per rack "
                f"{ {r: len(b) for r, b in sorted(by_rack.items())} }; enforceMinNumRacksPerWriteQuorum)"
            )
        return self._pick(by_rack, scores)


# ------------------------------------------------------------------------------- zone-aware


def parse_zone_location(location: str | None) -> tuple[str, str] | None:
    """``/zone/upgradedomain`` -> (``/zone``, ``/upgradedomain``); anything else None (unknown)."""
    if not location:
        return None
    parts = [p for p in location.strip().split("/") if p]
    if len(parts) != 2 or not location.strip().startswith("/"):
        return None
    return f"/{parts[0]}", f"/{parts[1]}"


class ZoneawarePlacementPolicy(TopologyAwarePlacementPolicy[tuple[str, str]]):
    """BookKeeper's ZoneawareEnsemblePlacementPolicy: each write quorum over
    ``desiredNumZonesPerWriteQuorum`` zones, at least ``minNumZonesPerWriteQuorum`` with strict
    placement, and bookies of one zone in one write quorum in different upgrade domains."""

    UNKNOWN = (DEFAULT_ZONE, DEFAULT_UPGRADE_DOMAIN)

    def __init__(
        self,
        resolver: TopologyResolver | Mapping[str, str],
        *,
        min_zones: int = 2,
        desired_zones: int = 3,
        strict: bool = True,
        rng: random.Random | None = None,
    ) -> None:
        if min_zones < 1:
            raise ConfigError(f"minNumZonesPerWriteQuorum must be >= 1, got {min_zones}")
        if min_zones > desired_zones:
            raise ConfigError(
                f"minNumZonesPerWriteQuorum={min_zones} cannot be greater than desiredNumZonesPerWriteQuorum="
                f"{desired_zones} (zone-aware placement)"
            )
        super().__init__(MappingResolver(resolver) if isinstance(resolver, Mapping) else resolver, rng)
        self._min_zones = min_zones
        self._desired = desired_zones
        self._strict = strict

    def locate(self, bookie_id: str) -> tuple[str, str]:
        return parse_zone_location(self.network_location(bookie_id)) or self.UNKNOWN

    @staticmethod
    def _group(loc: tuple[str, str]) -> Hashable:
        return loc[0]

    def _eligible(self, bookie_id: str) -> bool:
        return not self._strict or self.locate(bookie_id) != self.UNKNOWN

    def _check_strict(self, size: int, write_quorum: int) -> None:
        if not self._strict:
            return
        if size % write_quorum:
            raise IncorrectParameterError(
                f"enforceStrictZoneawarePlacement=true needs the ensemble size to be a multiple of the write "
                f"quorum (got {size} and {write_quorum}): a wrapped write quorum would span fewer zones"
            )
        if write_quorum <= self._min_zones:
            raise IncorrectParameterError(
                f"enforceStrictZoneawarePlacement=true needs a write quorum greater than "
                f"minNumZonesPerWriteQuorum={self._min_zones} (got {write_quorum}): otherwise a lost zone "
                "leaves no zone to replace its bookies from"
            )

    def _zones_message(self, what: str, write_quorum: int, by_loc: Mapping[tuple[str, str], list[str]],
                       unknown: int) -> str:
        zones: Counter[str] = Counter()
        for (zone, _ud), bookies in by_loc.items():
            zones[zone] += len(bookies)
        return (
            f"{what}: cannot place each write quorum of {write_quorum} in {self._min_zones} zones or more "
            f"(minNumZonesPerWriteQuorum={self._min_zones}, desiredNumZonesPerWriteQuorum={self._desired}, "
            f"enforceStrictZoneawarePlacement=true); writable bookies per zone: {dict(sorted(zones.items()))}"
            + (f", {unknown} with no /zone/upgradedomain location (not used)" if unknown else "")
        )

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
        _check_quorums(size, write_quorum, ack_quorum)
        self._check_strict(size, write_quorum)
        candidates = _ensemble_candidates(size, write_quorum, ack_quorum, writable, read_only, exclude)
        eligible = [b for b in candidates if self._eligible(b)]
        by_loc = self._by_location(eligible)
        if len(eligible) < size:
            raise NotEnoughBookiesError(self._zones_message("new ensemble", write_quorum, by_loc,
                                                            len(candidates) - len(eligible)))
        zones = {zone for zone, _ud in by_loc}
        target = min(self._desired, write_quorum, len(zones))
        floor = self._min_zones if self._strict else 0
        try:
            return self._search(size, write_quorum, by_loc, zone_level, max(target, floor), floor)
        except _Shortfall:
            raise NotEnoughBookiesError(self._zones_message(
                "new ensemble", write_quorum, by_loc, len(candidates) - len(eligible))) from None

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
        candidates = _replacement_candidates(ensemble, index, writable, read_only, exclude)
        eligible = [b for b in candidates if self._eligible(b)]
        by_loc = self._by_location(eligible)
        what = f"replace bookie {ensemble[index]}"
        if not eligible:
            raise NotEnoughBookiesError(self._zones_message(what, write_quorum, by_loc, len(candidates)))
        target = min(self._desired, write_quorum, len(ensemble))
        scores = self._rate_replacements(ensemble, index, write_quorum, by_loc, zone_level)
        if self._strict and max(scores.values()) < min(self._min_zones, target):
            raise NotEnoughBookiesError(self._zones_message(what, write_quorum, by_loc,
                                                            len(candidates) - len(eligible)))
        return self._pick(by_loc, scores)

    def adheres(
        self, ensemble: Sequence[str], write_quorum: int, *, bookies: Collection[str], ack_quorum: int | None = None
    ) -> bool:
        """BookKeeper's isEnsembleAdheringToPlacementPolicy is not FAIL: ``E`` a multiple of
        ``WQ``, ``WQ > minNumZonesPerWriteQuorum``, every member's location known, every write
        quorum on ``minNumZonesPerWriteQuorum`` zones or more with the upgrade-domain rule."""
        if not ensemble or len(set(ensemble)) != len(ensemble):
            return False
        if len(ensemble) % write_quorum or write_quorum <= self._min_zones:
            return False
        locs = [self.locate(b) for b in ensemble]
        if self.UNKNOWN in locs:
            return False
        return min_level(locs, write_quorum, zone_level) >= self._min_zones


# ----------------------------------------------------------------------------- region-aware


def parse_region_location(location: str | None) -> tuple[str, str]:
    """``/region/rack`` -> (``region``, ``/region/rack``), BookKeeper's parsing: the region is
    the first path element; unknown (no location, ``/default-region/default-rack``, a single
    element) is :data:`UNKNOWN_REGION`."""
    if not location or location == "/default-region/default-rack":
        return UNKNOWN_REGION, "/default-region/default-rack"
    parts = location.split("/")
    if len(parts) <= 1 or not parts[1]:
        return UNKNOWN_REGION, location
    return parts[1], location


class RegionawarePlacementPolicy(TopologyAwarePlacementPolicy[tuple[str, str]]):
    """BookKeeper's RegionAwareEnsemblePlacementPolicy: ensembles spread over regions; with
    ``reppRegionsToWrite``, each acknowledged entry in ``reppMinimumRegionsForDurability``
    regions."""

    def __init__(
        self,
        resolver: TopologyResolver | Mapping[str, str],
        *,
        regions_to_write: Sequence[str] = (),
        min_regions_for_durability: int = 2,
        durability_in_replace: bool = True,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(MappingResolver(resolver) if isinstance(resolver, Mapping) else resolver, rng)
        self.regions_to_write = tuple(regions_to_write)
        # BookKeeper reads the durability settings only with reppRegionsToWrite
        self._min_regions = min_regions_for_durability if self.regions_to_write else 0
        if self.regions_to_write and len(self.regions_to_write) < self._min_regions:
            raise ConfigError(
                f"reppRegionsToWrite={';'.join(self.regions_to_write)} names {len(self.regions_to_write)} "
                f"region(s), fewer than reppMinimumRegionsForDurability={self._min_regions}: list more regions "
                "or lower the minimum"
            )
        self._durability_in_replace = durability_in_replace and self._min_regions > 0

    def locate(self, bookie_id: str) -> tuple[str, str]:
        return parse_region_location(self.network_location(bookie_id))

    @staticmethod
    def _group(loc: tuple[str, str]) -> Hashable:
        return loc[0]

    def region(self, bookie_id: str) -> str:
        return self.locate(bookie_id)[0]

    def _check_durability_quorums(self, write_quorum: int, ack_quorum: int) -> None:
        m = self._min_regions
        if m <= 0:
            return
        if ack_quorum < m:
            raise IncorrectParameterError(
                f"ack quorum {ack_quorum} is smaller than reppMinimumRegionsForDurability={m}: an entry "
                "could be acknowledged from fewer regions"
            )
        if ack_quorum <= write_quorum - write_quorum // m:
            raise IncorrectParameterError(
                f"ack quorum {ack_quorum} with write quorum {write_quorum} cannot keep "
                f"reppMinimumRegionsForDurability={m} when a region is down (BookKeeper's rule: ack quorum > "
                f"write quorum - write quorum / {m})"
            )

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
        _check_quorums(size, write_quorum, ack_quorum)
        self._check_durability_quorums(write_quorum, ack_quorum)
        candidates = _ensemble_candidates(size, write_quorum, ack_quorum, writable, read_only, exclude)
        by_loc = self._by_location(candidates)
        regions: Counter[str] = Counter()
        for (region, _rack), bookies in by_loc.items():
            regions[region] += len(bookies)
        target = min(write_quorum, len(regions))
        try:
            return self._search(size, write_quorum, by_loc, region_level(ack_quorum, self._min_regions), target, 1)
        except _Shortfall:
            raise NotEnoughBookiesError(
                f"new ensemble: cannot place write quorums of {write_quorum} (ack quorum {ack_quorum}) so that "
                f"every acknowledged entry is in {self._min_regions} regions (reppMinimumRegionsForDurability, "
                f"reppRegionsToWrite={';'.join(self.regions_to_write)}); writable bookies per region: "
                f"{dict(sorted(regions.items()))}"
            ) from None

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
        candidates = _replacement_candidates(ensemble, index, writable, read_only, exclude)
        aq = write_quorum if ack_quorum is None else ack_quorum
        region, rack = self.locate(ensemble[index])
        by_loc = self._by_location(candidates)
        # the replaced bookie's rack, else its region: every region keeps its share
        same_rack = by_loc.get((region, rack))
        if same_rack:
            return same_rack[0]
        same_region = sorted(b for (r, _rack), bs in by_loc.items() if r == region for b in bs)
        if same_region:
            return self._rng.choice(same_region)
        enforce = self._durability_in_replace
        if enforce and not self.adheres(ensemble, write_quorum, bookies=(), ack_quorum=aq):
            log.warning("replace bookie %s: the ensemble %s already breaks region durability; the replacement "
                        "is not held to it", ensemble[index], list(ensemble))
            enforce = False
        level = region_level(aq, self._min_regions if enforce else 0)
        scores = self._rate_replacements(ensemble, index, write_quorum, by_loc, level)
        if enforce and max(scores.values()) < 1:
            raise NotEnoughBookiesError(
                f"replace bookie {ensemble[index]}: no writable bookie outside region {region} keeps every "
                f"acknowledged entry in {self._min_regions} regions (reppMinimumRegionsForDurability, "
                "reppEnableDurabilityEnforcementInReplace)"
            )
        return self._pick(by_loc, scores)

    def adheres(
        self, ensemble: Sequence[str], write_quorum: int, *, bookies: Collection[str], ack_quorum: int | None = None
    ) -> bool:
        """Distinct members and, with durability on, every write quorum durable. (BookKeeper's
        region-aware policy answers "adheres" for every ensemble; Vellum checks its own rule.)"""
        if len(set(ensemble)) != len(ensemble):
            return False
        if self._min_regions <= 0 or not ensemble:
            return True
        aq = write_quorum if ack_quorum is None else ack_quorum
        regions = [self.region(b) for b in ensemble]
        return min_level(regions, min(write_quorum, len(regions)),
                         lambda w: int(durable(w, aq, self._min_regions))) >= 1


# ------------------------------------------------------------------------------------------
# Rack mapping and construction from configuration


def parse_rack_mapping(text: str, *, source: str = "rack mapping") -> dict[str, str]:
    """Parse ``bookie_id /location`` lines (``#`` comments, blank lines ignored)."""
    mapping: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        if len(fields) != 2 or not fields[1].startswith("/"):
            raise ConfigError(f"{source}:{lineno}: expected 'bookie_id /rack', got {raw.strip()!r}")
        mapping[fields[0]] = fields[1]
    return mapping


def load_rack_mapping(path: str | Path) -> dict[str, str]:
    """Read a rack mapping file: one ``bookie_id /location`` per line, ``#`` comments."""
    p = Path(path)
    return parse_rack_mapping(p.read_text(encoding="utf-8"), source=str(p))


def _ensemble_candidates(
    size: int, write_quorum: int, ack_quorum: int, writable: Collection[str], read_only: Collection[str],
    exclude: Collection[str],
) -> list[str]:
    """Writable bookies a new ensemble may use (not read-only, not excluded), after checking the
    quorums; NotEnoughBookiesError when there are fewer than ``size``."""
    _check_quorums(size, write_quorum, ack_quorum)
    candidates = _candidates(writable, read_only, exclude)
    if len(candidates) < size:
        raise _not_enough(size, len(candidates), "new ensemble", len(set(read_only)), len(set(exclude)))
    return candidates


def _replacement_candidates(
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


#: ``reppDnsResolverClass`` values Vellum honours: BookKeeper's script-based mapping
SCRIPT_BASED_MAPPING = "org.apache.bookkeeper.net.ScriptBasedMapping"


def topology_resolver_for(config: ClientConfig, *, mapping: Mapping[str, str] | None = None) -> TopologyResolver | None:
    """The resolver of the topology-aware policies: the script ``networkTopologyScriptFileName``
    when set (checked by one run with no argument, as BookKeeper does), else ``mapping`` (e.g.
    the one ``vellum shell racks`` keeps in the metadata store); ``None`` when there is neither
    (every bookie in the default location). A failed check raises :class:`ConfigError`."""
    resolver_class = config.repp_dns_resolver_class.strip()
    if resolver_class and resolver_class.rsplit(".", 1)[-1] != SCRIPT_BASED_MAPPING.rsplit(".", 1)[-1]:
        raise ConfigError(
            f"reppDnsResolverClass={resolver_class} is refused with ensemblePlacementPolicy="
            f"{config.ensemble_placement_policy}: Vellum learns network locations from the script "
            f"networkTopologyScriptFileName ({SCRIPT_BASED_MAPPING}) or from the mapping `vellum shell racks` "
            "keeps in the metadata store; remove the key or set it to ScriptBasedMapping"
        )
    script = config.network_topology_script_file_name
    if script:
        resolver = ScriptResolver(script, number_args=config.network_topology_script_number_args,
                                  timeout_s=config.network_topology_script_timeout_ms / 1000.0)
        try:
            resolver.check()
        except ScriptError as e:
            raise ConfigError(
                f"networkTopologyScriptFileName={script}: the topology script failed its check run (no "
                f"argument): {e}. It must be executable, take bookie host addresses as arguments and print "
                "one network location per argument (/rack, /region/rack or /zone/upgradedomain)"
            ) from None
        return resolver
    if mapping is not None:
        return MappingResolver(mapping)
    return None


def placement_policy_for(
    config: ClientConfig, *, rack_mapping: Mapping[str, str] | None = None, rng: random.Random | None = None
) -> PlacementPolicy:
    """The policy ``ensemblePlacementPolicy`` names (Vellum's short names or BookKeeper's class
    names), its locations from :func:`topology_resolver_for`. May run the topology script once:
    call it off the event loop."""
    name = placement_policy_name(config.ensemble_placement_policy)
    if name == "default":
        return DefaultPlacementPolicy(rng)
    try:
        resolver = topology_resolver_for(config, mapping=rack_mapping)
    except ConfigError as e:
        if name == "rackaware" and not config.enforce_min_num_racks_per_write_quorum:
            # BookKeeper's rack-aware policy falls back to the default rack unless enforced
            log.warning("%s; every bookie is on %s (set enforceMinNumRacksPerWriteQuorum=true to fail instead)",
                        e, DEFAULT_RACK)
            resolver = None
        else:
            raise
    resolver = resolver or MappingResolver({})
    if name == "rackaware":
        return RackawarePlacementPolicy(
            resolver,
            min_racks_per_write_quorum=config.min_num_racks_per_write_quorum,
            enforce=config.enforce_min_num_racks_per_write_quorum,
            rng=rng,
        )
    if name == "zoneaware":
        return ZoneawarePlacementPolicy(
            resolver,
            min_zones=config.min_num_zones_per_write_quorum,
            desired_zones=config.desired_num_zones_per_write_quorum,
            strict=config.enforce_strict_zoneaware_placement,
            rng=rng,
        )
    regions = [r.strip() for r in config.repp_regions_to_write.split(";") if r.strip()]
    return RegionawarePlacementPolicy(
        resolver,
        regions_to_write=regions,
        min_regions_for_durability=config.repp_minimum_regions_for_durability,
        durability_in_replace=config.repp_enable_durability_enforcement_in_replace,
        rng=rng,
    )


__all__ = [
    "DEFAULT_RACK", "DefaultPlacementPolicy", "PlacementPolicy", "RackawarePlacementPolicy",
    "RegionawarePlacementPolicy", "TopologyAwarePlacementPolicy", "ZoneawarePlacementPolicy", "load_rack_mapping",
    "min_racks_per_write_quorum", "parse_rack_mapping", "placement_policy_for", "write_quorum_windows",
]
