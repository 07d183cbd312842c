"""The network topology script run for real, as BookKeeper's ScriptBasedMapping runs it: bookie
host addresses as arguments in batches of ``networkTopologyScriptNumberArgs``, one location per
argument on stdout, every answer cached per host; a script that fails, prints the wrong number
of answers or outlives ``networkTopologyScriptTimeoutMs`` is logged once with its path and the
error, and its hosts get the policy's default location."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from vellum.client.placement import (
    DEFAULT_RACK,
    RackawarePlacementPolicy,
    ZoneawarePlacementPolicy,
    placement_policy_for,
)
from vellum.client.topology import ScriptResolver, bookie_host, normalize_host
from vellum.config import ClientConfig
from vellum.errors import ConfigError

#: hosts 127.0.0.<n> -> /zone<n % 3>/ud<n>; every run appends its arguments to $CALLS
ZONES = """#!/bin/sh
echo "$@" >> "{calls}"
for host in "$@"; do
  n=${{host##*.}}
  echo "/zone$((n % 3))/ud$n"
done
"""


def _script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(body)
    path.chmod(0o755)
    return path


def _calls(tmp_path: Path) -> list[list[str]]:
    calls = tmp_path / "calls"
    return [line.split() for line in calls.read_text().splitlines()] if calls.exists() else []


def test_the_script_gets_host_addresses_in_batches_and_each_host_is_asked_once(tmp_path: Path) -> None:
    script = _script(tmp_path, "zones.sh", ZONES.format(calls=tmp_path / "calls"))
    resolver = ScriptResolver(script, number_args=2)
    bookies = [f"127.0.0.{n}:{port}" for n in range(1, 6) for port in (3181, 3182)]
    resolver.resolve(bookies)
    # five hosts (two bookies each), two per run: three runs, each host once
    assert _calls(tmp_path) == [["127.0.0.1", "127.0.0.2"], ["127.0.0.3", "127.0.0.4"], ["127.0.0.5"]]
    assert resolver.location("127.0.0.4:3182") == "/zone1/ud4"
    assert resolver.location("127.0.0.3:3181") == "/zone0/ud3"
    resolver.resolve(bookies)
    resolver.location("127.0.0.1:9999")  # another bookie of a known host: cached
    assert len(_calls(tmp_path)) == 3
    resolver.location("127.0.0.7:3181")  # a new host: one more run, for it alone
    assert _calls(tmp_path)[-1] == ["127.0.0.7"]


def test_a_zoneaware_policy_reads_zones_from_the_script(tmp_path: Path) -> None:
    script = _script(tmp_path, "zones.sh", ZONES.format(calls=tmp_path / "calls"))
    config = ClientConfig(ensemble_placement_policy="org.apache.bookkeeper.client.ZoneawareEnsemblePlacementPolicy",
                          network_topology_script_file_name=str(script))
    policy = placement_policy_for(config)
    assert isinstance(policy, ZoneawarePlacementPolicy)
    assert _calls(tmp_path) == [[]]  # BookKeeper's check run, no argument
    bookies = [f"127.0.0.{n}:3181" for n in range(1, 7)]
    policy.learn(bookies)
    ensemble = policy.new_ensemble(6, 3, 2, writable=bookies, read_only=())
    zones = [policy.locate(b)[0] for b in ensemble]
    assert all(len({zones[(s + j) % 6] for j in range(3)}) == 3 for s in range(6))


def test_a_failing_script_is_logged_once_and_its_hosts_get_the_default_location(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    script = _script(tmp_path, "broken.sh", '#!/bin/sh\n[ $# -eq 0 ] && exit 0\necho "no such table" >&2\nexit 3\n')
    policy = placement_policy_for(ClientConfig(ensemble_placement_policy="rackaware",
                                               network_topology_script_file_name=str(script)))
    assert isinstance(policy, RackawarePlacementPolicy)
    with caplog.at_level(logging.WARNING, logger="vellum.client.topology"):
        policy.learn(["10.0.0.1:3181", "10.0.0.2:3181"])
        assert policy.rack("10.0.0.1:3181") == DEFAULT_RACK
        assert policy.rack("10.0.0.2:3181") == DEFAULT_RACK
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    assert str(script) in lines[0] and "exit status 3: no such table" in lines[0]
    assert "10.0.0.1 10.0.0.2" in lines[0] and "default location" in lines[0]


def test_a_script_printing_the_wrong_number_of_locations_is_a_failure(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    script = _script(tmp_path, "short.sh", "#!/bin/sh\necho /only-one\n")
    resolver = ScriptResolver(script)
    with caplog.at_level(logging.WARNING, logger="vellum.client.topology"):
        resolver.resolve(["10.0.0.1:1", "10.0.0.2:1"])
    assert resolver.location("10.0.0.1:1") is None
    assert "printed 1 location(s) for 2 host(s)" in caplog.text
    words = _script(tmp_path, "words.sh", '#!/bin/sh\nfor h in "$@"; do echo rack1; done\n')
    resolver = ScriptResolver(words)
    resolver.resolve(["10.0.0.1:1"])
    assert resolver.location("10.0.0.1:1") is None  # not a /location


def test_a_script_that_sleeps_past_the_timeout_is_killed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    script = _script(tmp_path, "slow.sh", '#!/bin/sh\n[ $# -eq 0 ] && exit 0\nexec sleep 30\n')
    config = ClientConfig(ensemble_placement_policy="zoneaware", network_topology_script_file_name=str(script),
                          network_topology_script_timeout_ms=300, enforce_strict_zoneaware_placement=False)
    policy = placement_policy_for(config)
    assert isinstance(policy, ZoneawarePlacementPolicy)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="vellum.client.topology"):
        policy.learn(["10.0.0.1:3181"])
    assert time.monotonic() - started < 20  # bounded by the timeout, not the script's 30 s
    assert policy.locate("10.0.0.1:3181") == ZoneawarePlacementPolicy.UNKNOWN
    assert f"network topology script {script} failed" in caplog.text and "no answer within 0.3 s" in caplog.text
    script.write_text('#!/bin/sh\nfor h in "$@"; do echo /za/u1; done\n')
    policy.learn(["10.0.0.1:3181"])  # the failure is kept: not asked again at each placement
    assert policy.locate("10.0.0.1:3181") == ZoneawarePlacementPolicy.UNKNOWN
    # a later change of the bookie lists asks again (the script may be fixed by then)
    policy.learn(["10.0.0.1:3181"], retry_failed=True)
    assert policy.locate("10.0.0.1:3181") == ("/za", "/u1")


def test_a_script_that_cannot_run_fails_the_check_with_what_to_do(tmp_path: Path) -> None:
    not_executable = tmp_path / "mapping.txt"
    not_executable.write_text("10.0.0.1:3181 /r1\n")
    for name, path in [("zoneaware", not_executable), ("zoneaware", tmp_path / "missing.sh"),
                       ("regionaware", _script(tmp_path, "fails.sh", "#!/bin/sh\nexit 1\n"))]:
        config = ClientConfig(ensemble_placement_policy=name, network_topology_script_file_name=str(path))
        with pytest.raises(ConfigError, match=r"networkTopologyScriptFileName=.*failed its check run"):
            placement_policy_for(config)
    # rack-aware without enforcement falls back to the default rack, as BookKeeper does
    lenient = placement_policy_for(ClientConfig(ensemble_placement_policy="rackaware",
                                                network_topology_script_file_name=str(not_executable)))
    assert isinstance(lenient, RackawarePlacementPolicy) and lenient.rack("10.0.0.1:3181") == DEFAULT_RACK
    with pytest.raises(ConfigError, match="failed its check run"):
        placement_policy_for(ClientConfig(ensemble_placement_policy="rackaware",
                                          network_topology_script_file_name=str(not_executable),
                                          enforce_min_num_racks_per_write_quorum=True))


def test_hosts_of_bookie_ids() -> None:
    assert bookie_host("10.0.0.1:3181") == "10.0.0.1"
    assert bookie_host("[::1]:3181") == "::1"
    assert bookie_host("bookie-without-port") == "bookie-without-port"
    assert normalize_host("127.0.0.1") == "127.0.0.1"
    assert normalize_host("localhost") == "127.0.0.1"
    assert normalize_host("no-such-host.invalid") == "no-such-host.invalid"
