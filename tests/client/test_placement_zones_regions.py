"""Zone- and region-aware placement: properties checked with hypothesis against brute force.

Invariants (client/placement.py):

* zone-aware, strict (``enforceStrictZoneawarePlacement``): ``E % WQ != 0`` or
  ``WQ <= minNumZonesPerWriteQuorum`` is refused; bookies with no ``/zone/upgradedomain``
  location are never chosen; when some arrangement of the candidates gives every write quorum
  ``minNumZonesPerWriteQuorum`` zones (with the upgrade-domain rule), the ensemble reaches
  ``min(desiredNumZonesPerWriteQuorum, WQ, zones)`` or the best level there is, and otherwise the
  ledger is refused with an error naming the keys and the zones available;
* zone-aware, best effort: the same target, never refused for lack of zones;
* a replacement gives the write quorums around its position the best level any candidate gives
  (strict: refused below ``minNumZonesPerWriteQuorum``);
* region-aware with durability: every write quorum keeps ``AQ`` members out of any
  ``reppMinimumRegionsForDurability - 1`` regions whenever an arrangement can, and the ledger is
  refused otherwise; a replacement stays in the replaced bookie's rack, else region, else keeps
  durability (or is refused).

The oracle enumerates every sequence of locations the candidates allow.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vellum.client.placement import (
    RegionawarePlacementPolicy,
    ZoneawarePlacementPolicy,
    parse_zone_location,
    placement_policy_for,
    write_quorum_windows,
)
from vellum.config import ClientConfig, build_config
from vellum.errors import ConfigError, IncorrectParameterError, NotEnoughBookiesError

# ---------------------------------------------------------------- oracles, written independently


def zone_level(window: Sequence[tuple[str, str]]) -> int:
    """Zones in the window; 0 if two members of one zone share an upgrade domain."""
    for (z1, _u1), (z2, _u2) in itertools.combinations(window, 2):
        if z1 == z2 and len({u for z, u in window if z == z1}) < 2:
            return 0
    return len({z for z, _u in window})


def durable(regions: Sequence[str], aq: int, m: int) -> bool:
    """No choice of m - 1 regions holds aq members of the window."""
    if m <= 1:
        return True
    names = sorted(set(regions))
    return all(sum(1 for r in regions if r in chosen) < aq
               for chosen in itertools.combinations(names, min(m - 1, len(names))))


def region_level(aq: int, m: int) -> Callable[[Sequence[tuple[str, str]]], int]:
    def level(window: Sequence[tuple[str, str]]) -> int:
        regions = [r for r, _rack in window]
        return len(set(regions)) if durable(regions, aq, m) else 0
    return level


def min_level(locations: Sequence[Any], wq: int, level: Callable[[Sequence[Any]], int]) -> int:
    size = len(locations)
    starts = [0] if size == wq else range(size)
    return min(level([locations[(s + j) % size] for j in range(wq)]) for s in starts)


def _best(size: int, wq: int, capacity: Counter[Any], level: Callable[[Sequence[Any]], int]) -> int:
    """Oracle: the best worst-window level over every location sequence the capacity allows
    (-1 when there are too few bookies)."""
    best = -1
    seq: list[Hashable] = []
    left = Counter(capacity)

    def walk() -> None:
        nonlocal best
        if len(seq) == size:
            best = max(best, min_level(seq, wq, level))
            return
        for loc in sorted(left, key=repr):
            if left[loc] > 0:
                left[loc] -= 1
                seq.append(loc)
                walk()
                seq.pop()
                left[loc] += 1

    walk()
    return best


@st.composite
def zone_clusters(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(1, 7))
    bookies = [f"10.0.{i}.1:3181" for i in range(n)]
    where = {b: draw(st.sampled_from(["/z1/u1", "/z1/u2", "/z2/u1", "/z2/u2", "/z3/u1", "bad", None]))
             for b in bookies}
    size = draw(st.integers(1, 6))
    wq = draw(st.integers(1, size))
    return {
        "bookies": bookies,
        "where": {b: loc for b, loc in where.items() if loc is not None},
        "read_only": draw(st.sets(st.sampled_from(bookies))),
        "size": size, "wq": wq, "aq": draw(st.integers(1, wq)),
        "min_zones": draw(st.integers(1, 3)), "extra": draw(st.integers(0, 2)),
        "strict": draw(st.booleans()), "seed": draw(st.integers(0, 2**32)),
    }


def _zone_policy(c: dict[str, Any]) -> ZoneawarePlacementPolicy:
    return ZoneawarePlacementPolicy(c["where"], min_zones=c["min_zones"], desired_zones=c["min_zones"] + c["extra"],
                                    strict=c["strict"], rng=random.Random(c["seed"]))


@settings(max_examples=250, deadline=None)
@given(zone_clusters())
def test_zoneaware_new_ensemble_against_brute_force(c: dict[str, Any]) -> None:
    policy = _zone_policy(c)
    size, wq, aq, strict, min_zones = c["size"], c["wq"], c["aq"], c["strict"], c["min_zones"]
    candidates = [b for b in c["bookies"] if b not in c["read_only"]]
    new = lambda: policy.new_ensemble(size, wq, aq, writable=c["bookies"], read_only=c["read_only"])  # noqa: E731
    if strict and (size % wq or wq <= min_zones):
        with pytest.raises(IncorrectParameterError, match="enforceStrictZoneawarePlacement"):
            new()
        return
    if len(candidates) < size:
        with pytest.raises(NotEnoughBookiesError):
            new()
        return
    known = {b: parse_zone_location(c["where"].get(b)) for b in candidates}
    eligible = [b for b in candidates if known[b] is not None or not strict]
    loc = {b: known[b] or policy.UNKNOWN for b in eligible}
    capacity = Counter(loc.values())
    best = _best(size, wq, capacity, zone_level)
    zones = {z for z, _ud in capacity}
    target = min(c["min_zones"] + c["extra"], wq, len(zones))
    if strict and best < min_zones:  # includes too few eligible bookies (best == -1)
        with pytest.raises(NotEnoughBookiesError, match=r"minNumZonesPerWriteQuorum=.*desiredNumZonesPerWriteQuorum"
                                                        r"=.*enforceStrictZoneawarePlacement.*per zone"):
            new()
        return
    ensemble = new()
    assert len(set(ensemble)) == size and set(ensemble) <= set(eligible)
    got = min_level([loc[b] for b in ensemble], wq, zone_level)
    assert got >= min(max(target, min_zones if strict else 0), best)
    if best < target:
        assert got == best


@settings(max_examples=250, deadline=None)
@given(zone_clusters(), st.data())
def test_zoneaware_replacement_is_the_best_candidate(c: dict[str, Any], data: st.DataObject) -> None:
    bookies: list[str] = c["bookies"]
    size, wq = c["size"], c["wq"]
    if len(bookies) < size:
        return
    policy = _zone_policy(c)
    ensemble = data.draw(st.permutations(bookies).map(lambda p: p[:size]))
    index = data.draw(st.integers(0, size - 1))
    candidates = [b for b in bookies if b not in c["read_only"] and b not in ensemble]
    if c["strict"]:
        candidates = [b for b in candidates if parse_zone_location(c["where"].get(b))]

    def rate(b: str) -> int:
        locs = [policy.locate(x) for x in ensemble]
        locs[index] = policy.locate(b)
        return min(zone_level([locs[i] for i in w]) for w in write_quorum_windows(size, wq) if index in w)

    replace = lambda: policy.replace_bookie(ensemble, index, wq, writable=bookies, read_only=c["read_only"])  # noqa: E731
    if not candidates or (c["strict"] and max(map(rate, candidates)) < min(c["min_zones"],
                                                                          c["min_zones"] + c["extra"], wq)):
        with pytest.raises(NotEnoughBookiesError):
            replace()
        return
    chosen = replace()
    assert chosen in candidates
    assert rate(chosen) == max(rate(b) for b in candidates)


def test_zoneaware_six_bookies_three_zones_every_write_quorum_spans_three_zones() -> None:
    where = {f"b{z}{i}:3181": f"/zone{z}/ud{i}" for z in range(3) for i in range(2)}
    policy = ZoneawarePlacementPolicy(where, min_zones=2, desired_zones=3, rng=random.Random(3))
    for _ in range(30):
        ensemble = policy.new_ensemble(6, 3, 2, writable=list(where), read_only=())
        zones = [where[b].split("/")[1] for b in ensemble]
        assert all(len({zones[i] for i in w}) == 3 for w in write_quorum_windows(6, 3)), ensemble
        assert policy.adheres(ensemble, 3, bookies=where)


def test_strict_zoneaware_with_too_few_zones_names_the_keys_and_the_zones() -> None:
    where = {"a:1": "/z1/u1", "b:1": "/z1/u2", "c:1": "/z1/u3", "d:1": "/z1/u4", "x:1": "/z1"}
    policy = ZoneawarePlacementPolicy(where, min_zones=2, desired_zones=3)
    with pytest.raises(NotEnoughBookiesError) as info:
        policy.new_ensemble(3, 3, 2, writable=where, read_only=())
    text = str(info.value)
    assert "minNumZonesPerWriteQuorum=2" in text and "desiredNumZonesPerWriteQuorum=3" in text
    assert "enforceStrictZoneawarePlacement=true" in text and "{'/z1': 4}" in text
    assert "1 with no /zone/upgradedomain location" in text
    lenient = ZoneawarePlacementPolicy(where, min_zones=2, desired_zones=3, strict=False)
    assert len(lenient.new_ensemble(3, 3, 2, writable=where, read_only=())) == 3


def test_zoneaware_adheres_is_bookkeepers_check() -> None:
    where = {"a:1": "/z1/u1", "b:1": "/z2/u1", "c:1": "/z3/u1", "d:1": "/z1/u2", "e:1": "/z1/u1",
             "f:1": "/z2/u2", "u:1": "nowhere"}
    policy = ZoneawarePlacementPolicy(where, min_zones=2, desired_zones=3)
    assert policy.adheres(["a:1", "b:1", "c:1"], 3, bookies=where)
    assert policy.adheres(["a:1", "d:1", "b:1"], 3, bookies=where)      # z1 twice, two upgrade domains
    assert not policy.adheres(["a:1", "e:1", "b:1"], 3, bookies=where)  # z1 twice, one upgrade domain
    assert not policy.adheres(["a:1", "b:1", "u:1"], 3, bookies=where)  # a location unknown
    assert not policy.adheres(["a:1", "b:1", "c:1", "f:1"], 3, bookies=where)  # E not a multiple of WQ
    assert not policy.adheres(["a:1", "b:1"], 2, bookies=where)          # WQ <= minNumZonesPerWriteQuorum
    with pytest.raises(ConfigError, match="minNumZonesPerWriteQuorum=3 cannot be greater than "
                                          "desiredNumZonesPerWriteQuorum=2"):
        ZoneawarePlacementPolicy(where, min_zones=3, desired_zones=2)


# ------------------------------------------------------------------------------ region-aware


@st.composite
def region_clusters(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(1, 7))
    bookies = [f"10.1.{i}.1:3181" for i in range(n)]
    where = {b: draw(st.sampled_from(["/east/r1", "/east/r2", "/west/r1", "/north/r1", None])) for b in bookies}
    size = draw(st.integers(1, 6))
    wq = draw(st.integers(1, size))
    return {
        "bookies": bookies, "where": {b: w for b, w in where.items() if w},
        "size": size, "wq": wq, "aq": draw(st.integers(1, wq)), "min_regions": draw(st.integers(0, 3)),
        "durability": draw(st.booleans()), "seed": draw(st.integers(0, 2**32)),
    }


def _region_policy(c: dict[str, Any]) -> RegionawarePlacementPolicy:
    return RegionawarePlacementPolicy(
        c["where"], regions_to_write=("east", "west", "north") if c["durability"] else (),
        min_regions_for_durability=c["min_regions"], rng=random.Random(c["seed"]))


@settings(max_examples=250, deadline=None)
@given(region_clusters())
def test_regionaware_new_ensemble_against_brute_force(c: dict[str, Any]) -> None:
    policy = _region_policy(c)
    size, wq, aq = c["size"], c["wq"], c["aq"]
    m = c["min_regions"] if c["durability"] else 0
    new = lambda: policy.new_ensemble(size, wq, aq, writable=c["bookies"], read_only=())  # noqa: E731
    if m > 0 and (aq < m or aq <= wq - wq // m):
        with pytest.raises(IncorrectParameterError, match="reppMinimumRegionsForDurability"):
            new()
        return
    if len(c["bookies"]) < size:
        with pytest.raises(NotEnoughBookiesError):
            new()
        return
    loc = {b: policy.locate(b) for b in c["bookies"]}
    level = region_level(aq, m)
    best = _best(size, wq, Counter(loc.values()), level)
    if best < 1:
        with pytest.raises(NotEnoughBookiesError, match=r"reppMinimumRegionsForDurability.*per region"):
            new()
        return
    ensemble = new()
    assert len(set(ensemble)) == size
    regions = [loc[b][0] for b in ensemble]
    assert all(durable([regions[i] for i in w], aq, m) for w in write_quorum_windows(size, wq))
    target = min(wq, len({r for r, _ in loc.values()}))
    assert min_level([loc[b] for b in ensemble], wq, level) >= min(target, best)
    assert policy.adheres(ensemble, wq, bookies=c["bookies"], ack_quorum=aq)


@settings(max_examples=250, deadline=None)
@given(region_clusters(), st.data())
def test_regionaware_replacement_keeps_the_region_or_durability(c: dict[str, Any], data: st.DataObject) -> None:
    bookies: list[str] = c["bookies"]
    size, wq, aq = c["size"], c["wq"], c["aq"]
    if len(bookies) < size:
        return
    policy = _region_policy(c)
    m = c["min_regions"] if c["durability"] else 0
    ensemble = data.draw(st.permutations(bookies).map(lambda p: p[:size]))
    index = data.draw(st.integers(0, size - 1))
    candidates = [b for b in bookies if b not in ensemble]
    replace = lambda: policy.replace_bookie(ensemble, index, wq, writable=bookies, read_only=(), ack_quorum=aq)  # noqa: E731
    if not candidates:
        with pytest.raises(NotEnoughBookiesError):
            replace()
        return
    region, rack = policy.locate(ensemble[index])
    same_rack = [b for b in candidates if policy.locate(b) == (region, rack)]
    same_region = [b for b in candidates if policy.locate(b)[0] == region]

    def keeps_durability(b: str) -> bool:
        regions = [policy.region(x) for x in ensemble]
        regions[index] = policy.region(b)
        return all(durable([regions[i] for i in w], aq, m) for w in write_quorum_windows(size, wq) if index in w)

    enforced = m > 0 and policy.adheres(ensemble, wq, bookies=bookies, ack_quorum=aq)
    if not same_region and enforced and not any(map(keeps_durability, candidates)):
        with pytest.raises(NotEnoughBookiesError, match="reppEnableDurabilityEnforcementInReplace"):
            replace()
        return
    chosen = replace()
    assert chosen in candidates
    if same_rack:
        assert chosen in same_rack
    elif same_region:
        assert chosen in same_region
    elif enforced:
        assert keeps_durability(chosen)


def test_regionaware_keys_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"reppRegionsToWrite=east names 1 region.*reppMinimumRegionsForDurability=2"):
        RegionawarePlacementPolicy({}, regions_to_write=("east",))
    where = {"e1:1": "/east/r1", "e2:1": "/east/r2", "w1:1": "/west/r1", "w2:1": "/west/r2"}
    policy = RegionawarePlacementPolicy(where, regions_to_write=("east", "west"), rng=random.Random(1))
    with pytest.raises(IncorrectParameterError, match="ack quorum 1 is smaller than reppMinimumRegionsForDurability=2"):
        policy.new_ensemble(2, 2, 1, writable=where, read_only=())
    ensemble = policy.new_ensemble(4, 3, 3, writable=where, read_only=())
    assert policy.adheres(ensemble, 3, bookies=where, ack_quorum=3)
    # one region left: an entry cannot be in two regions
    east = {b: r for b, r in where.items() if r.startswith("/east")}
    with pytest.raises(NotEnoughBookiesError, match=r"\{'east': 2\}"):
        policy.new_ensemble(2, 2, 2, writable=east, read_only=())


@pytest.mark.parametrize(("value", "name"), [
    ("default", "default"), ("rackaware", "rackaware"), ("zoneaware", "zoneaware"), ("regionaware", "regionaware"),
    ("org.apache.bookkeeper.client.DefaultEnsemblePlacementPolicy", "default"),
    ("org.apache.bookkeeper.client.RackawareEnsemblePlacementPolicy", "rackaware"),
    ("org.apache.bookkeeper.client.ZoneawareEnsemblePlacementPolicy", "zoneaware"),
    ("org.apache.bookkeeper.client.RegionAwareEnsemblePlacementPolicy", "regionaware"),
    ("RackawareEnsemblePlacementPolicy", "rackaware"), ("ZoneawareEnsemblePlacementPolicy", "zoneaware"),
])
def test_bookkeepers_class_names_pick_the_policy(value: str, name: str) -> None:
    config = build_config(ClientConfig, {"ensemblePlacementPolicy": value})
    policy = placement_policy_for(config)
    assert type(policy).__name__.lower().startswith(name), (value, type(policy))


def test_unknown_policies_and_resolvers_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"ensemblePlacementPolicy='org\.example\.MyPolicy' is not one of default"):
        build_config(ClientConfig, {"ensemblePlacementPolicy": "org.example.MyPolicy"})
    pulsar = build_config(ClientConfig, {"ensemblePlacementPolicy": "zoneaware",
                                         "reppDnsResolverClass": "org.apache.pulsar.zookeeper.ZkBookieRackAffinityMapping"})
    with pytest.raises(ConfigError, match=r"reppDnsResolverClass=org\.apache\.pulsar.*is refused with "
                                          "ensemblePlacementPolicy=zoneaware"):
        placement_policy_for(pulsar)
    # the default policy needs no locations: the resolver key is not used
    placement_policy_for(build_config(ClientConfig, {"reppDnsResolverClass": "com.example.Other"}))


def test_placement_keys_of_a_bookies_file_reach_its_autorecovery_client(tmp_path: Path) -> None:
    """BookKeeper's placement keys in bk_server.conf: honoured ones reach the client AutoRecovery
    picks replacements with; the ones Vellum does not use are listed as accepted, with the reason."""
    from vellum.config import load_server_config
    from vellum.service import bookie_client_config

    conf = tmp_path / "bk_server.conf"
    conf.write_text(
        "ensemblePlacementPolicy=org.apache.bookkeeper.client.RegionAwareEnsemblePlacementPolicy\n"
        "reppRegionsToWrite=east;west;north\nreppMinimumRegionsForDurability=3\n"
        "reppEnableDurabilityEnforcementInReplace=false\nreppEnableValidation=true\n"
        "minNumZonesPerWriteQuorum=1\ndesiredNumZonesPerWriteQuorum=2\nenforceStrictZoneawarePlacement=false\n"
        "networkTopologyScriptNumberArgs=7\nnetworkTopologyStabilizePeriodSeconds=10\n"
    )
    accepted: dict[str, str] = {}
    server = load_server_config(conf, accepted=accepted)
    client = bookie_client_config(server, "test")
    assert (client.repp_regions_to_write, client.repp_minimum_regions_for_durability) == ("east;west;north", 3)
    assert not client.repp_enable_durability_enforcement_in_replace
    assert (client.min_num_zones_per_write_quorum, client.desired_num_zones_per_write_quorum) == (1, 2)
    assert not client.enforce_strict_zoneaware_placement and client.network_topology_script_number_args == 7
    assert set(accepted) == {"reppEnableValidation", "networkTopologyStabilizePeriodSeconds"}
    assert "cannot fail" in accepted["reppEnableValidation"]
    policy = placement_policy_for(client)
    assert isinstance(policy, RegionawarePlacementPolicy) and policy.regions_to_write == ("east", "west", "north")
