"""Choosing bookies: ensemble placement policies (BookKeeper's EnsemblePlacementPolicy).

Responsibility: pick the bookies of a new ensemble and the replacement of a failed ensemble
member, from the writable bookies the metadata store lists. Pure: no I/O except
:func:`load_rack_mapping` reading the file it is given.

Invariants of every policy:
* an ensemble has distinct members; a replacement is never a current member of the ensemble;
* read-only bookies are never chosen (a bookie listed both writable and read-only counts as
  read-only), nor excluded ones (e.g. bookies quarantined after errors);
* when there are not enough candidates the policy raises :class:`NotEnoughBookiesError` saying
  how many were needed and how many were available.

Rack awareness (``RackawarePlacementPolicy``): entry ``e`` is written to the write quorum
``ensemble[(e + i) % E] for i < WQ`` (round-robin striping), so every window of ``WQ``
consecutive ensemble positions, wrapping around, is a write quorum. Each window must span at
least ``k = min(minNumRacksPerWriteQuorum, WQ, racks available)`` racks. The policy searches for
a rack sequence meeting that bound whenever one exists; if none does it raises
(``enforce``) or returns the best spread it can find. Bookies whose rack is unknown belong to
``/default-rack``.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path

from vellum.config import ClientConfig
from vellum.errors import ConfigError, IncorrectParameterError, NotEnoughBookiesError

DEFAULT_RACK = "/default-rack"

# Upper bound on search steps of the rack-aware arrangement search for one spread target.
# Ensembles are small (tens of bookies at most); the heuristic order finds an arrangement on
# the first path almost always, the bound only stops a pathological exhaustive search.
_SEARCH_BUDGET = 20_000


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
    ) -> str:
        """A bookie to take position ``index`` of ``ensemble``, not already in it."""

    def adheres(self, ensemble: Sequence[str], write_quorum: int, *, bookies: Collection[str]) -> bool:
        """Whether an existing ensemble meets this policy, given the cluster's ``bookies`` (the
        auditor's placement check). Distinct members are all the default policy asks."""
        return len(set(ensemble)) == len(ensemble)


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
    return min(len({racks[i] for i in window}) for window in write_quorum_windows(len(racks), write_quorum))


class RackawarePlacementPolicy(PlacementPolicy):
    """BookKeeper's RackawareEnsemblePlacementPolicy: spread each write quorum over racks.

    ``rack_of(bookie_id)`` names a bookie's rack (``/rack`` style); a falsy answer or a
    ``KeyError`` means unknown, i.e. :data:`DEFAULT_RACK`.
    """

    def __init__(
        self,
        rack_of: Callable[[str], str | None],
        *,
        min_racks_per_write_quorum: int = 2,
        enforce: bool = False,
        rng: random.Random | None = None,
    ) -> None:
        if min_racks_per_write_quorum < 1:
            raise IncorrectParameterError(
                f"min_racks_per_write_quorum must be >= 1, got {min_racks_per_write_quorum}"
            )
        self._rack_of = rack_of
        self._min_racks = min_racks_per_write_quorum
        self._enforce = enforce
        self._rng = rng or random.Random()

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
        return cls(
            mapping.get,
            min_racks_per_write_quorum=min_racks_per_write_quorum,
            enforce=enforce,
            rng=rng,
        )

    def adheres(self, ensemble: Sequence[str], write_quorum: int, *, bookies: Collection[str]) -> bool:
        """Every write quorum window spans ``min(minNumRacksPerWriteQuorum, WQ, racks of the
        cluster's bookies)`` racks (the bound ``new_ensemble`` aims for)."""
        if len(set(ensemble)) != len(ensemble):
            return False
        size = len(ensemble)
        racks = [self.rack(b) for b in ensemble]
        need = min(self._min_racks, write_quorum, len({self.rack(b) for b in bookies} | set(racks)))
        return all(len({racks[(start + i) % size] for i in range(write_quorum)}) >= need
                   for start in range(size))

    def rack(self, bookie_id: str) -> str:
        try:
            rack = self._rack_of(bookie_id)
        except KeyError:
            rack = None
        return rack or DEFAULT_RACK

    def _by_rack(self, candidates: Sequence[str]) -> dict[str, list[str]]:
        by_rack: dict[str, list[str]] = {}
        for bookie in candidates:
            by_rack.setdefault(self.rack(bookie), []).append(bookie)
        for bookies in by_rack.values():
            self._rng.shuffle(bookies)
        return by_rack

    # ------------------------------------------------------------------------ new ensemble
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
        by_rack = self._by_rack(candidates)
        target = min(self._min_racks, write_quorum, len(by_rack))
        capacity = {rack: len(bookies) for rack, bookies in by_rack.items()}
        # Try the target spread first, then degrade one rack at a time (k = 1 always succeeds
        # once there are enough bookies).
        for k in range(target, 0, -1):
            racks = _arrange(size, write_quorum, k, capacity, self._rng)
            if racks is not None:
                break
            if self._enforce:
                raise NotEnoughBookiesError(
                    f"new ensemble: cannot spread each write quorum of {write_quorum} (ensemble "
                    f"{size}) over {k} racks with the writable bookies per rack "
                    f"{dict(sorted(capacity.items()))} (enforceMinNumRacksPerWriteQuorum)"
                )
        else:  # pragma: no cover - k = 1 needs only size <= len(candidates), checked above
            raise NotEnoughBookiesError(f"new ensemble: no arrangement of {size} bookies found")
        taken = {rack: 0 for rack in by_rack}
        ensemble = []
        for rack in racks:
            ensemble.append(by_rack[rack][taken[rack]])
            taken[rack] += 1
        return ensemble

    # --------------------------------------------------------------------- replace bookie
    def replace_bookie(
        self,
        ensemble: Sequence[str],
        index: int,
        write_quorum: int,
        *,
        writable: Collection[str],
        read_only: Collection[str],
        exclude: Collection[str] = (),
    ) -> str:
        candidates = _replacement_candidates(ensemble, index, writable, read_only, exclude)
        size = len(ensemble)
        write_quorum = min(write_quorum, size)
        racks = [self.rack(b) for b in ensemble]
        windows = [w for w in write_quorum_windows(size, write_quorum) if index in w]
        others = {rack for i, rack in enumerate(racks) if i != index}
        by_rack = self._by_rack(candidates)
        target = min(self._min_racks, write_quorum, len(others | set(by_rack)))

        def spread(rack: str) -> int:
            # the worst write quorum containing the replaced position, with ``rack`` there
            return min(len({rack if i == index else racks[i] for i in w}) for w in windows)

        scores = {rack: spread(rack) for rack in by_rack}
        best = max(scores.values())
        if best < target and self._enforce:
            raise NotEnoughBookiesError(
                f"replace bookie {ensemble[index]}: no writable bookie keeps every write quorum "
                f"of {write_quorum} on {target} racks (best {best}; candidates per rack "
                f"{ {r: len(b) for r, b in sorted(by_rack.items())} })"
            )
        # Among the best racks prefer the one with the most candidates (spreads load), then random.
        best_racks = [r for r in sorted(by_rack) if scores[r] == best]
        most = max(len(by_rack[r]) for r in best_racks)
        rack = self._rng.choice([r for r in best_racks if len(by_rack[r]) == most])
        return by_rack[rack][0]


def _arrange(
    size: int, write_quorum: int, k: int, capacity: Mapping[str, int], rng: random.Random
) -> list[str] | None:
    """A sequence of ``size`` racks (each used at most ``capacity[rack]`` times) in which every
    write quorum window spans at least ``k`` racks, or None if there is none (or the search
    budget ran out). Depth-first search, most promising rack first."""
    windows = write_quorum_windows(size, write_quorum)
    # windows that end at position p (their last position in placement order)
    closing: dict[int, list[list[int]]] = {}
    for w in windows:
        closing.setdefault(max(w), []).append(w)
    tie = {rack: rng.random() for rack in capacity}
    left = dict(capacity)
    seq: list[str] = []
    budget = [_SEARCH_BUDGET]

    def ok(pos: int) -> bool:
        return all(len({seq[i] for i in w}) >= k for w in closing.get(pos, ()))

    def place(pos: int) -> bool:
        if pos == size:
            return True
        budget[0] -= 1
        if budget[0] < 0:
            return False
        recent = set(seq[max(0, pos - write_quorum + 1) : pos])
        if pos + write_quorum > size:  # wrap-around windows also see the first positions
            recent.update(seq[: pos + write_quorum - size])
        order = sorted(
            (r for r, n in left.items() if n > 0),
            key=lambda r: (r in recent, -left[r], tie[r]),
        )
        for rack in order:
            seq.append(rack)
            left[rack] -= 1
            if ok(pos) and place(pos + 1):
                return True
            seq.pop()
            left[rack] += 1
        return False

    return list(seq) if place(0) else None


# ------------------------------------------------------------------------------------------
# Rack mapping and construction from configuration


def parse_rack_mapping(text: str, *, source: str = "rack mapping") -> dict[str, str]:
    """Parse ``bookie_id /rack`` lines (``#`` comments, blank lines ignored)."""
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
    """Read a rack mapping file: one ``bookie_id /rack`` per line, ``#`` comments."""
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


def placement_policy_for(
    config: ClientConfig, *, rack_mapping: Mapping[str, str] | None = None, rng: random.Random | None = None
) -> PlacementPolicy:
    """The policy ``ensemblePlacementPolicy`` names. For ``rackaware`` the racks come from
    ``rack_mapping`` if given, else from ``networkTopologyScriptFileName`` (a mapping file),
    else every bookie is on ``/default-rack``."""
    if config.ensemble_placement_policy == "default":
        return DefaultPlacementPolicy(rng)
    if rack_mapping is None:
        path = config.network_topology_script_file_name
        rack_mapping = load_rack_mapping(path) if path else {}
    return RackawarePlacementPolicy.from_mapping(
        rack_mapping,
        min_racks_per_write_quorum=config.min_num_racks_per_write_quorum,
        enforce=config.enforce_min_num_racks_per_write_quorum,
        rng=rng,
    )
