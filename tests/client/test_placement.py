"""Placement policies: properties checked with hypothesis against brute-force oracles.

For every policy: members distinct, never read-only, never excluded, only writable bookies,
NotEnoughBookiesError with the numbers when short. For the rack-aware policy: the rack spread
of every write quorum reaches min(minRacks, WQ, racks available) whenever some arrangement of
the candidates can (oracle: enumerate every rack sequence), and otherwise the best spread that
exists (or an error when enforced).
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vellum.client.placement import (
    DEFAULT_RACK,
    DefaultPlacementPolicy,
    PlacementPolicy,
    RackawarePlacementPolicy,
    load_rack_mapping,
    min_racks_per_write_quorum,
    placement_policy_for,
    write_quorum_windows,
)
from vellum.config import ClientConfig
from vellum.errors import ConfigError, IncorrectParameterError, NotEnoughBookiesError

RACKS = ["/r1", "/r2", "/r3", "/r4"]


@st.composite
def clusters(draw: st.DrawFn, max_bookies: int = 10) -> dict[str, object]:
    """Bookies with racks (some unknown), read-only and excluded subsets, and quorum sizes."""
    n = draw(st.integers(1, max_bookies))
    bookies = [f"10.0.0.{i}:3181" for i in range(n)]
    racks = {b: draw(st.sampled_from([*RACKS, None])) for b in bookies}
    read_only = draw(st.sets(st.sampled_from(bookies))) if n else set()
    exclude = draw(st.sets(st.sampled_from(bookies))) if n else set()
    size = draw(st.integers(1, 6))
    wq = draw(st.integers(1, size))
    aq = draw(st.integers(1, wq))
    return {
        "bookies": bookies,
        "racks": {b: r for b, r in racks.items() if r is not None},
        "read_only": read_only,
        "exclude": exclude,
        "size": size,
        "wq": wq,
        "aq": aq,
        "min_racks": draw(st.integers(1, 4)),
        "seed": draw(st.integers(0, 2**32)),
    }


def _policies(c: dict[str, object], enforce: bool = False) -> list[PlacementPolicy]:
    seed = c["seed"]
    assert isinstance(seed, int)
    racks = c["racks"]
    assert isinstance(racks, dict)
    min_racks = c["min_racks"]
    assert isinstance(min_racks, int)
    return [
        DefaultPlacementPolicy(random.Random(seed)),
        RackawarePlacementPolicy.from_mapping(
            racks, min_racks_per_write_quorum=min_racks, enforce=enforce, rng=random.Random(seed)
        ),
    ]


def _candidates(c: dict[str, object]) -> list[str]:
    banned = set(c["read_only"]) | set(c["exclude"])  # type: ignore[call-overload]
    return [b for b in c["bookies"] if b not in banned]  # type: ignore[attr-defined]


def _best_spread(size: int, wq: int, capacity: Counter[str]) -> int:
    """Oracle: the best min-racks-per-write-quorum over every rack sequence the capacity allows."""
    best = 0
    for seq in itertools.product(sorted(capacity), repeat=size):
        if any(n > capacity[r] for r, n in Counter(seq).items()):
            continue
        best = max(best, min_racks_per_write_quorum(seq, wq))
    return best


@settings(max_examples=300, deadline=None)
@given(clusters())
def test_new_ensemble_invariants(c: dict[str, object]) -> None:
    size, wq, aq = c["size"], c["wq"], c["aq"]
    assert isinstance(size, int) and isinstance(wq, int) and isinstance(aq, int)
    candidates = _candidates(c)
    for policy in _policies(c):
        kw = {"writable": c["bookies"], "read_only": c["read_only"], "exclude": c["exclude"]}
        if len(candidates) < size:
            with pytest.raises(NotEnoughBookiesError) as info:
                policy.new_ensemble(size, wq, aq, **kw)  # type: ignore[arg-type]
            assert f"need {size}" in str(info.value) and f"{len(candidates)} available" in str(info.value)
            continue
        ensemble = policy.new_ensemble(size, wq, aq, **kw)  # type: ignore[arg-type]
        assert len(ensemble) == size
        assert len(set(ensemble)) == size
        assert set(ensemble) <= set(candidates)


@settings(max_examples=300, deadline=None)
@given(clusters(max_bookies=8), st.booleans())
def test_rackaware_spread_reached_whenever_possible(c: dict[str, object], enforce: bool) -> None:
    size, wq, aq, min_racks = c["size"], c["wq"], c["aq"], c["min_racks"]
    assert isinstance(size, int) and isinstance(wq, int) and isinstance(aq, int)
    assert isinstance(min_racks, int)
    candidates = _candidates(c)
    if len(candidates) < size:
        return
    racks: dict[str, str] = c["racks"]  # type: ignore[assignment]
    rack_of = {b: racks.get(b, DEFAULT_RACK) for b in candidates}
    capacity = Counter(rack_of.values())
    target = min(min_racks, wq, len(capacity))
    best = _best_spread(size, wq, capacity)
    policy = _policies(c, enforce)[1]
    kw = {"writable": c["bookies"], "read_only": c["read_only"], "exclude": c["exclude"]}
    if best < target and enforce:
        with pytest.raises(NotEnoughBookiesError):
            policy.new_ensemble(size, wq, aq, **kw)  # type: ignore[arg-type]
        return
    ensemble = policy.new_ensemble(size, wq, aq, **kw)  # type: ignore[arg-type]
    assert len(set(ensemble)) == size and set(ensemble) <= set(candidates)
    spread = min_racks_per_write_quorum([rack_of[b] for b in ensemble], wq)
    # the target whenever possible; otherwise the best arrangement there is
    assert spread >= min(target, best)
    if best < target:
        assert spread == best


@settings(max_examples=300, deadline=None)
@given(clusters(max_bookies=10), st.data())
def test_replace_bookie_invariants(c: dict[str, object], data: st.DataObject) -> None:
    size, wq = c["size"], c["wq"]
    assert isinstance(size, int) and isinstance(wq, int)
    bookies: list[str] = c["bookies"]  # type: ignore[assignment]
    if len(bookies) < size:
        return
    ensemble = data.draw(st.permutations(bookies).map(lambda p: p[:size]))
    index = data.draw(st.integers(0, size - 1))
    banned = set(c["read_only"]) | set(c["exclude"]) | set(ensemble)  # type: ignore[call-overload]
    candidates = [b for b in bookies if b not in banned]
    kw = {"writable": bookies, "read_only": c["read_only"], "exclude": c["exclude"]}
    for policy in _policies(c):
        if not candidates:
            with pytest.raises(NotEnoughBookiesError):
                policy.replace_bookie(ensemble, index, wq, **kw)  # type: ignore[arg-type]
            continue
        chosen = policy.replace_bookie(ensemble, index, wq, **kw)  # type: ignore[arg-type]
        assert chosen in candidates
        if isinstance(policy, RackawarePlacementPolicy):
            # no candidate would give the write quorums around the position a better spread
            def spread_with(bookie: str, policy: RackawarePlacementPolicy = policy) -> int:
                racks = [policy.rack(b) for b in ensemble]
                racks[index] = policy.rack(bookie)
                return min(len({racks[i] for i in w}) for w in write_quorum_windows(size, wq) if index in w)

            assert spread_with(chosen) == max(spread_with(b) for b in candidates)


def test_rackaware_enforced_replace_raises_when_no_rack_fits() -> None:
    racks = {"a1": "/a", "b1": "/b", "a2": "/a", "b2": "/b", "a3": "/a"}
    ensemble = ["a1", "b1", "a2", "b2"]
    policy = RackawarePlacementPolicy.from_mapping(racks, enforce=True, rng=random.Random(1))
    # replacing b1 (WQ 2): its quorums are (a1, X) and (X, a2); the only candidate, a3, is on /a
    with pytest.raises(NotEnoughBookiesError, match="replace bookie b1"):
        policy.replace_bookie(ensemble, 1, 2, writable=racks, read_only=())
    lenient = RackawarePlacementPolicy.from_mapping(racks, rng=random.Random(1))
    assert lenient.replace_bookie(ensemble, 1, 2, writable=racks, read_only=()) == "a3"
    # with a /b bookie writable again, it is the one chosen
    racks["b3"] = "/b"
    assert policy.replace_bookie(ensemble, 1, 2, writable=racks, read_only=()) == "b3"


def test_rackaware_spreads_a_typical_cluster() -> None:
    racks = {f"b{r}{i}:3181": f"/rack{r}" for r in range(3) for i in range(4)}
    policy = RackawarePlacementPolicy(racks.get, min_racks_per_write_quorum=3, rng=random.Random(7))
    for _ in range(50):
        ensemble = policy.new_ensemble(6, 3, 2, writable=list(racks), read_only=())
        assert min_racks_per_write_quorum([racks[b] for b in ensemble], 3) == 3


def test_read_only_and_quorum_checks() -> None:
    policy = DefaultPlacementPolicy(random.Random(0))
    with pytest.raises(NotEnoughBookiesError, match="need 2 bookie"):
        policy.new_ensemble(2, 2, 2, writable=["a", "b"], read_only=["b"])
    with pytest.raises(IncorrectParameterError):
        policy.new_ensemble(2, 3, 2, writable=["a", "b", "c"], read_only=())
    with pytest.raises(IncorrectParameterError):
        policy.replace_bookie(["a"], 1, 1, writable=["a", "b"], read_only=())


def test_rack_mapping_file_and_config(tmp_path: Path) -> None:
    path = tmp_path / "racks.txt"
    path.write_text("# bookie -> rack\n10.0.0.1:3181 /dc1/rack1\n\n10.0.0.2:3181   /dc1/rack2  # two\n")
    mapping = load_rack_mapping(path)
    assert mapping == {"10.0.0.1:3181": "/dc1/rack1", "10.0.0.2:3181": "/dc1/rack2"}
    policy = RackawarePlacementPolicy.from_mapping(mapping)
    assert policy.rack("10.0.0.1:3181") == "/dc1/rack1"
    assert policy.rack("unknown:3181") == DEFAULT_RACK

    path.write_text("10.0.0.1:3181 rack-without-slash\n")
    with pytest.raises(ConfigError, match=":1:"):
        load_rack_mapping(path)

    assert isinstance(placement_policy_for(ClientConfig()), DefaultPlacementPolicy)
    # networkTopologyScriptFileName is a script, run as BookKeeper runs it (tests/client/test_topology.py)
    script = tmp_path / "topology.sh"
    script.write_text("#!/bin/sh\nfor h in \"$@\"; do echo /r1; done\n")
    script.chmod(0o755)
    config = ClientConfig(
        ensemble_placement_policy="rackaware",
        network_topology_script_file_name=str(script),
        enforce_min_num_racks_per_write_quorum=True,
    )
    rackaware = placement_policy_for(config)
    assert isinstance(rackaware, RackawarePlacementPolicy)
    assert rackaware.rack("10.0.0.1:3181") == "/r1"
    no_script = ClientConfig(ensemble_placement_policy="rackaware")
    from_store = placement_policy_for(no_script, rack_mapping={"x:1": "/z"})
    assert isinstance(from_store, RackawarePlacementPolicy) and from_store.rack("x:1") == "/z"
    # a mapping file given as the script (what Vellum used to read) is refused with what to do
    with pytest.raises(ConfigError, match=r"networkTopologyScriptFileName=.*racks.txt: the topology script failed "
                                          r"its check run .*Permission denied.* one network location per argument"):
        placement_policy_for(dataclasses.replace(config, network_topology_script_file_name=str(path)))


def test_rack_mapping_from_the_metadata_store(tmp_path: Path) -> None:
    """`vellum shell racks --set` stores the mapping; a rack-aware client reads it from there."""
    import json

    from click.testing import CliRunner

    from vellum.cli.main import cli
    from vellum.client.bookkeeper import _placement_from_config
    from vellum.config import ClientConfig
    from vellum.meta import open_metadata_store

    uri = f"sqlite:///{tmp_path}/m.db"
    with open_metadata_store(uri) as store:
        store.format()
    r = CliRunner().invoke(cli, ["shell", "racks", "--uri", uri, "--set", "a:1=/r1", "--set", "b:1=/r2",
                                 "--set", "c:1=/r1", "--json"])
    assert r.exit_code == 0, r.output
    assert {row["bookie"]: row["rack"] for row in json.loads(r.output)} == {"a:1": "/r1", "b:1": "/r2", "c:1": "/r1"}
    bad = CliRunner().invoke(cli, ["shell", "racks", "--uri", uri, "--set", "a:1=r1"])
    assert bad.exit_code != 0 and "BOOKIE=/rack" in (bad.output + str(bad.exception))
    with open_metadata_store(uri) as store:
        policy = _placement_from_config(ClientConfig(ensemble_placement_policy="rackaware"), store)
        ensemble = policy.new_ensemble(2, 2, 2, writable=["a:1", "b:1", "c:1"], read_only=[])
    assert {"/r1", "/r2"} == {"/r1" if b in ("a:1", "c:1") else "/r2" for b in ensemble}


def test_adheres_tells_the_auditor_which_existing_ensembles_the_policy_would_not_choose() -> None:
    """The auditor's placement check: a write quorum on one rack while two racks exist does not
    adhere; the default policy only asks for distinct members."""
    mapping = {"a:1": "/r1", "b:1": "/r1", "c:1": "/r2", "d:1": "/r2"}
    policy = RackawarePlacementPolicy.from_mapping(mapping)
    bookies = list(mapping)
    assert policy.adheres(["a:1", "c:1", "b:1", "d:1"], 2, bookies=bookies)      # every window: 2 racks
    assert not policy.adheres(["a:1", "b:1", "c:1", "d:1"], 2, bookies=bookies)  # window a, b: one rack
    assert policy.adheres(["a:1", "b:1"], 2, bookies=["a:1", "b:1"])              # one rack is all there is
    assert not policy.adheres(["a:1", "a:1"], 2, bookies=bookies)
    assert DefaultPlacementPolicy().adheres(["a:1", "b:1"], 2, bookies=bookies)
    for _ in range(20):  # what the policy itself picks always adheres
        ensemble = policy.new_ensemble(4, 2, 2, writable=bookies, read_only=())
        assert policy.adheres(ensemble, 2, bookies=bookies)
