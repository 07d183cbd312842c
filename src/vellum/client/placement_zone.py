"""The zone-aware policy (BookKeeper's ZoneawareEnsemblePlacementPolicy) and ``/zone/upgradedomain``
locations; ``client/placement.py`` describes the rules."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Collection, Hashable, Mapping, Sequence

from vellum.client.placement_core import (
    DEFAULT_UPGRADE_DOMAIN,
    DEFAULT_ZONE,
    Shortfall,
    TopologyAwarePlacementPolicy,
    check_quorums,
    ensemble_candidates,
    min_level,
    replacement_candidates,
    zone_level,
)
from vellum.client.topology import MappingResolver, TopologyResolver
from vellum.errors import ConfigError, IncorrectParameterError, NotEnoughBookiesError


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
        check_quorums(size, write_quorum, ack_quorum)
        self._check_strict(size, write_quorum)
        candidates = ensemble_candidates(size, write_quorum, ack_quorum, writable, read_only, exclude)
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
        except Shortfall:
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
        candidates = replacement_candidates(ensemble, index, writable, read_only, exclude)
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
