"""``vellum verify sim``: the nightly mode, the disk and clock fault kinds on ``--faults`` and
the summary's share of seeds that hit each fault kind."""

from __future__ import annotations

import json

from click.testing import CliRunner

from vellum.cli.main import cli
from vellum.sim.runner import FAULT_KINDS


def test_nightly_runs_every_fault_kind_streams_its_progress_and_reports_each_kinds_share() -> None:
    result = CliRunner().invoke(cli, ["verify", "sim", "--nightly", "--seeds", "4", "--start", "30", "--json",
                                      "--ledgers", "1", "--entries", "20"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["faults"] == sorted(FAULT_KINDS) and "lying-fsync" not in data["faults"]
    assert data["seeds"] == 4 and data["last_seed"] == 33 and not data["interrupted"]
    assert data["fault_seeds"]["delay"] == 4 and data["fault_share"]["delay"] == 1.0
    assert set(data["fault_seeds"]) <= set(FAULT_KINDS)
    assert all(0 < n <= 4 for n in data["fault_seeds"].values())
    assert "seeds 4/4 (last 33)" in result.stderr  # streamed even with --json, on stderr


def test_the_summary_has_a_row_per_fault_kind_with_its_share_of_seeds() -> None:
    result = CliRunner().invoke(cli, ["verify", "sim", "--seeds", "3", "--ledgers", "1", "--entries", "10",
                                      "--faults", "delay,torn,eio,full,clock"])
    assert result.exit_code == 0, result.output
    for kind in ("delay", "torn", "eio", "full", "clock"):
        assert f"faults: {kind}" in result.stdout
    assert "3 seeds (100.0%)" in result.stdout  # delay: every write of every seed
    assert "faults: crash" not in result.stdout  # not asked for, not hit


def test_lying_fsync_is_a_mode_added_to_the_scenarios_faults_never_part_of_all() -> None:
    result = CliRunner().invoke(cli, ["verify", "sim", "--seed", "3", "--json", "--ledgers", "1", "--entries", "10",
                                      "--faults", "default,lying-fsync"])
    data = json.loads(result.stdout)
    assert "lying-fsync" in data["faults"] and "crash" in data["faults"] and "meta" not in data["faults"]
    assert data["injected"]["delay"] == 1
    refused = CliRunner().invoke(cli, ["verify", "sim", "--faults", "all,lying-fsnc"])
    assert refused.exit_code == 2
    assert "lying-fsnc" in refused.output and "lying-fsync" in refused.output
    pointless = CliRunner().invoke(cli, ["verify", "sim", "--faults", "delay,lying-fsync"])
    assert pointless.exit_code == 2 and "add crash, torn, eio or rack" in " ".join(pointless.output.split())
