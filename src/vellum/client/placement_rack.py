"""The rack-aware policy (BookKeeper's RackawareEnsemblePlacementPolicy); ``client/placement.py``
describes the rule."""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence

from vellum.client.placement_core import (
    DEFAULT_RACK,
    Shortfall,
    TopologyAwarePlacementPolicy,
    ensemble_candidates,
    min_racks_per_write_quorum,
    rack_level,
    replacement_candidates,
)
from vellum.client.topology import MappingResolver, TopologyResolver
from vellum.errors import IncorrectParameterError, NotEnoughBookiesError


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
        candidates = ensemble_candidates(size, write_quorum, ack_quorum, writable, read_only, exclude)
        by_rack = self._by_location(candidates)
        target = min(self._min_racks, write_quorum, len(by_rack))
        try:
            return self._search(size, write_quorum, by_rack, rack_level, target, target if self._enforce else 1)
        except Shortfall:
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
        candidates = replacement_candidates(ensemble, index, writable, read_only, exclude)
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
