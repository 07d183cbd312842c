"""A campaign in worker processes (``jobs``, ``vellum verify sim --jobs``) reports what one
process reports: the same seeds in the same order, the same counts and violations, the same
resume point (docs/verification.md, "Many seeds")."""

from __future__ import annotations

import json
from dataclasses import replace

from click.testing import CliRunner

from vellum.cli.main import cli
from vellum.sim.campaign import run_campaign
from vellum.sim.runner import SCENARIOS, SimOptions
from vellum.sim.workload import WorkloadShape

SMALL = WorkloadShape(ledgers=2, entries=(10, 30), reader_polls=15)
#: fence-race with recovery reads that do not fence: some seeds from 143 on fail
#: (tests/sim/test_sim_seeds.py), so a campaign over them carries violations back from the workers
BROKEN = replace(SCENARIOS["fence-race"], flags=frozenset({"no-fencing-recovery-reads"}))


def _summary(report):  # type: ignore[no-untyped-def]
    return (report.seeds, report.operations, report.acks, report.virtual_s, dict(report.network),
            dict(report.fault_seeds), dict(report.injections), report.last_seed,
            [(seed, v.kind, v.ledger, v.entry, v.message, len(v.history)) for seed, v in report.violations],
            report.errors, report.interrupted)


def test_workers_report_what_one_process_reports_in_seed_order() -> None:
    seen: list[int] = []
    options = SimOptions(shape=SMALL)
    parallel = run_campaign(range(70), options, jobs=2, on_result=lambda r: seen.append(r.seed))
    alone = run_campaign(range(70), options)
    assert seen == list(range(70))
    assert _summary(parallel) == _summary(alone)
    assert parallel.cpu_s > 0


def test_violations_come_back_from_the_workers_with_their_history() -> None:
    seeds = range(130, 160)
    parallel = run_campaign(seeds, BROKEN, jobs=2)
    alone = run_campaign(seeds, BROKEN)
    assert parallel.violations, "the reverted fix should fail some of these seeds"
    assert _summary(parallel) == _summary(alone)
    assert all(v.history for _seed, v in parallel.violations)


def test_stop_at_first_stops_at_the_same_seed_in_workers() -> None:
    seeds = range(100, 200)
    parallel = run_campaign(seeds, BROKEN, jobs=2, stop_at_first=True)
    alone = run_campaign(seeds, BROKEN, stop_at_first=True)
    assert alone.violations and alone.last_seed is not None and alone.last_seed < 199
    assert _summary(parallel) == _summary(alone)


def test_the_cli_takes_jobs_and_refuses_a_negative_count() -> None:
    args = ["verify", "sim", "--seeds", "20", "--ledgers", "1", "--entries", "10", "--json"]
    one = CliRunner().invoke(cli, args)
    two = CliRunner().invoke(cli, [*args, "--jobs", "2"])
    assert one.exit_code == 0 and two.exit_code == 0, (one.output, two.output)
    keep = ("seeds", "operations", "acks", "violations", "errors", "network", "fault_seeds", "last_seed")
    a, b = json.loads(one.output), json.loads(two.output)
    assert {k: a[k] for k in keep} == {k: b[k] for k in keep}
    bad = CliRunner().invoke(cli, [*args, "--jobs", "-1"])
    assert bad.exit_code == 2 and "--jobs" in bad.output and "0 for one per core" in bad.output
