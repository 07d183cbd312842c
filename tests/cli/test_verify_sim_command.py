"""``vellum verify sim``: summary and exit status, a replayed seed's history, clear errors."""

from __future__ import annotations

import json

from click.testing import CliRunner

from vellum.cli.main import cli


def test_a_few_seeds_pass_and_print_a_summary() -> None:
    result = CliRunner().invoke(cli, ["verify", "sim", "--seeds", "3", "--ledgers", "1", "--entries", "10"])
    assert result.exit_code == 0, result.output
    assert "seeds per second" in result.output and "violations" in result.output


def test_json_lists_the_violations_of_a_reverted_fix_and_exits_1() -> None:
    result = CliRunner().invoke(cli, ["verify", "sim", "--scenario", "fence-race", "--seeds", "1", "--start", "143",
                                      "--json", "--regression", "no-fencing-recovery-reads"])
    assert result.exit_code == 1, result.output
    data = json.loads(result.output)
    assert data["seeds"] == 1 and data["violations"]
    v = data["violations"][0]
    assert v["seed"] == 143 and v["kind"] == "ack-after-fence" and v["history"]


def test_one_seed_replays_with_its_history_and_replay_command() -> None:
    result = CliRunner().invoke(cli, ["verify", "sim", "--scenario", "fence-race", "--seed", "143",
                                      "--regression", "no-fencing-recovery-reads"])
    assert result.exit_code == 1
    assert "recover-start" in result.output and "fingerprint" in result.output
    flat = " ".join(result.output.split())  # the console wraps long lines
    assert "--scenario fence-race --regression no-fencing-recovery-reads --seed=143" in flat


def test_an_unknown_fault_kind_is_refused_with_the_choices() -> None:
    result = CliRunner().invoke(cli, ["verify", "sim", "--faults", "drop,meteor"])
    assert result.exit_code == 2
    assert "meteor" in result.output and "partition" in result.output


def test_one_seed_replays_as_json() -> None:
    result = CliRunner().invoke(cli, ["verify", "sim", "--seed=3", "--json", "--ledgers", "1", "--entries", "10"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["seed"] == 3 and data["history"] and data["fingerprint"] and "crash" in data["faults"]
