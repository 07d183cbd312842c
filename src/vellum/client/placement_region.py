"""The region-aware policy (BookKeeper's RegionAwareEnsemblePlacementPolicy) and ``/region/rack``
locations; ``client/placement.py`` describes the rules."""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Collection, Hashable, Mapping, Sequence

from vellum.client.placement_core import (
    UNKNOWN_REGION,
    Shortfall,
    TopologyAwarePlacementPolicy,
    check_quorums,
    durable,
    ensemble_candidates,
    min_level,
    region_level,
    replacement_candidates,
)
from vellum.client.topology import MappingResolver, TopologyResolver
from vellum.errors import ConfigError, IncorrectParameterError, NotEnoughBookiesError

log = logging.getLogger(__name__)


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
        check_quorums(size, write_quorum, ack_quorum)
        self._check_durability_quorums(write_quorum, ack_quorum)
        candidates = ensemble_candidates(size, write_quorum, ack_quorum, writable, read_only, exclude)
        by_loc = self._by_location(candidates)
        regions: Counter[str] = Counter()
        for (region, _rack), bookies in by_loc.items():
            regions[region] += len(bookies)
        target = min(write_quorum, len(regions))
        try:
            return self._search(size, write_quorum, by_loc, region_level(ack_quorum, self._min_regions), target, 1)
        except Shortfall:
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
        candidates = replacement_candidates(ensemble, index, writable, read_only, exclude)
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
