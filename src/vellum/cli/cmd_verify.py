"""``vellum verify sim``: the deterministic simulator (``vellum.sim``, docs/verification.md).

``--seeds N`` runs seeds ``start .. start+N-1`` with a progress bar and prints a summary and
every violation with its seed and minimal history; ``--seed S`` replays one seed and prints its
whole history; ``--nightly`` runs 100,000 seeds with every fault kind, streaming a progress line
(with the ``--start`` that resumes it) every 1,000 seeds. The exit status is 1 when a violation
was found (or a run stopped with an error).
"""

from __future__ import annotations

import dataclasses
import sys
import time

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from vellum.cli.client_options import client_conf_flag, load_client_config_file
from vellum.cli.output import emit_json, emit_table
from vellum.sim.campaign import CampaignReport, run_campaign
from vellum.sim.checker import Violation
from vellum.sim.runner import (
    BOOKIE_KINDS,
    FAULT_KINDS,
    FAULT_MODES,
    MODEL_ONLY_FAULTS,
    REGRESSIONS,
    SCENARIOS,
    RunResult,
    SimOptions,
    run_seed,
)

#: seeds a nightly campaign runs (``--nightly``), and how often it prints a progress line
NIGHTLY_SEEDS = 100_000
NIGHTLY_PROGRESS_EVERY = 1_000


def _faults(value: str, scenario: frozenset[str] = frozenset()) -> frozenset[str]:
    """``--faults``: comma-separated kinds and modes; ``all`` is every kind (never a mode),
    ``default`` the scenario's, ``none`` nothing; they combine (``default,lying-fsync``)."""
    kinds: set[str] = set()
    for word in (k.strip() for k in value.split(",")):
        if word == "all":
            kinds |= set(FAULT_KINDS)
        elif word == "default":
            kinds |= scenario
        elif word and word != "none":
            kinds.add(word)
    unknown = sorted(kinds - set(FAULT_KINDS) - set(FAULT_MODES))
    if unknown:
        raise click.BadParameter(f"unknown fault kind(s) {', '.join(unknown)}: choose from {', '.join(FAULT_KINDS)}, "
                                 f"the mode(s) {', '.join(FAULT_MODES)}, 'all', 'default' or 'none'",
                                 param_hint="--faults")
    if "lying-fsync" in kinds and not kinds & {"crash", "torn", "eio", "rack"}:
        raise click.BadParameter("lying-fsync loses acknowledged entries only when a bookie dies: add crash, torn, "
                                 "eio or rack (e.g. 'default,lying-fsync')", param_hint="--faults")
    return frozenset(kinds)


def _fault_rows(report: CampaignReport, faults: frozenset[str]) -> list[tuple[str, str]]:
    """A row per fault kind asked for or hit: the seeds that hit it at least once, their share,
    and the injections."""
    kinds = [k for k in (*FAULT_KINDS, *FAULT_MODES) if k in faults or report.fault_seeds[k]]
    return [(f"faults: {k}", f"{report.fault_seeds[k]} seeds ({report.fault_share(k):.1%}), "
                             f"{report.injections[k]} injections") for k in kinds]


def _violation_json(seed: int, v: Violation) -> dict[str, object]:
    return {"seed": seed, "kind": v.kind, "ledger": v.ledger, "entry": v.entry, "message": v.message,
            "history": [e.describe() for e in v.history]}


def _print_violation(console: Console, seed: int, v: Violation, replay: str) -> None:
    console.print(f"[bold red]violation[/] seed={seed} {v.kind}: {v.message}")
    console.print(f"  replay: {replay}")
    for e in v.history:
        console.print(f"    {e.describe()}", markup=False, highlight=False)


def register(cli: click.Group) -> None:
    @cli.group()
    def verify() -> None:
        """Check the protocol's promises (docs/verification.md)."""

    @verify.command("sim")
    @click.option("--seeds", "count", type=int, default=None,
                  help=f"how many seeds to run  [default: 200; {NIGHTLY_SEEDS:,} with --nightly]")
    @click.option("--start", default=0, show_default=True, help="the first seed of --seeds")
    @click.option("--seed", "one", type=int, default=None, help="replay this one seed and print its history")
    @click.option("--faults", default=None,
                  help=f"comma-separated subset of {','.join(FAULT_KINDS)}, or 'all' (every one of them) / 'default' "
                       "(the scenario's) / 'none'; and the mode lying-fsync (never in 'all': every disk acknowledges "
                       "fsync without persisting, so crashes lose acknowledged entries and the check must fail; e.g. "
                       "'default,lying-fsync'); and wipe (real bookie only: a crashed bookie restarts on empty disks, "
                       "once a run)  [default: the scenario's; 'all' with --nightly]")
    @click.option("--scenario", default="default", show_default=True, type=click.Choice(sorted(SCENARIOS)),
                  help="the workload and fault mix (fence-race: the old writer against fencing)")
    @click.option("--ledgers", type=int, default=None, help="ledgers the writer makes per seed (default: the scenario's)")
    @click.option("--entries", type=int, default=None,
                  help="about this many entries per ledger (default: the scenario's)")
    @click.option("--regression", "regressions", multiple=True, type=click.Choice(sorted(REGRESSIONS)),
                  help="revert a known fix behind its test flag (the seed should then fail)")
    @click.option("--autorecovery/--no-autorecovery", "autorecovery", default=None,
                  help="run the real AutoRecovery daemons and judge under-replicated (default: the scenario's)")
    @click.option("--bookie", "bookie_kind", default="model", show_default=True, type=click.Choice(BOOKIE_KINDS),
                  help="below the request path: the model bookie, or the real bookie and its storage on files "
                       "(slower; docs/verification.md)")
    @click.option("--power-loss", type=float, default=0.0, show_default=True,
                  help="with --bookie real: the share of crashes that are power losses (0 to 1)")
    @click.option("--named", is_flag=True,
                  help="also run the named-ledger actor: appends, rollovers and shrinks of a few names under the "
                       "faults, judged by named-lost and named-order (docs/verification.md)")
    @click.option("--stop-at-first", is_flag=True, help="stop at the first seed with a violation")
    @click.option("--jobs", type=int, default=1, show_default=True,
                  help="worker processes that run the seeds (0: one per core); the report, the progress and the "
                       "resume point are the same as with one")
    @click.option("--nightly", is_flag=True,
                  help=f"the nightly campaign: {NIGHTLY_SEEDS:,} seeds (unless --seeds), every fault kind (unless "
                       f"--faults), a progress line every {NIGHTLY_PROGRESS_EVERY:,} seeds naming the --start that "
                       "resumes it (also printed when interrupted)")
    @click.option("--json", "as_json", is_flag=True, help="machine-readable output")
    def sim(count: int | None, start: int, one: int | None, scenario: str, faults: str | None, ledgers: int | None,
            entries: int | None,
            regressions: tuple[str, ...], autorecovery: bool | None, bookie_kind: str, power_loss: float,
            named: bool, stop_at_first: bool, jobs: int, nightly: bool,
            as_json: bool) -> None:
        """Run the deterministic simulation over many seeds (or replay one)."""
        if count is None:
            count = NIGHTLY_SEEDS if nightly else 200
        if nightly and faults is None:
            faults = "all"
        if count < 1:
            raise click.BadParameter("must be at least 1", param_hint="--seeds")
        if jobs < 0:
            raise click.BadParameter(f"{jobs} worker processes: give 1 or more, or 0 for one per core",
                                     param_hint="--jobs")
        base = SCENARIOS[scenario]
        shape = base.shape
        if ledgers is not None:
            if ledgers < 1:
                raise click.BadParameter("must be at least 1", param_hint="--ledgers")
            shape = dataclasses.replace(shape, ledgers=ledgers)
        if entries is not None:
            if entries < 1:
                raise click.BadParameter("must be at least 1", param_hint="--entries")
            shape = dataclasses.replace(shape, entries=(max(1, entries // 2), max(1, entries + entries // 2)))
        chosen = base.faults if faults is None else _faults(faults, base.faults)
        if bookie_kind == "real" and faults is not None and "all" in faults.split(","):
            chosen -= MODEL_ONLY_FAULTS  # 'all' of what the real bookie takes
        options = dataclasses.replace(base, faults=chosen, shape=shape, flags=frozenset(regressions),
                                      autorecovery=base.autorecovery if autorecovery is None else autorecovery,
                                      bookie=bookie_kind, power_loss=power_loss, named=base.named or named)
        if not 0.0 <= power_loss <= 1.0:
            raise click.BadParameter(f"{power_loss} is not a share between 0 and 1", param_hint="--power-loss")
        if power_loss and bookie_kind != "real":
            raise click.BadParameter("a power loss is simulated with the real bookie only: add --bookie real",
                                     param_hint="--power-loss")
        for mode in sorted(options.faults & {"wipe", "limbo"}):
            if bookie_kind != "real":
                raise click.BadParameter(f"the fault {mode} empties a real bookie's disks: add --bookie real",
                                         param_hint="--faults")
        if bookie_kind == "real" and "lying-fsync" in options.faults and not (
                "rack" in options.faults or (power_loss and "crash" in options.faults)):
            raise click.BadParameter("a lying fsync loses what it acknowledged only at a power loss: add rack to "
                                     "--faults, or --power-loss with crash", param_hint="--faults")
        if bookie_kind == "real" and options.faults & MODEL_ONLY_FAULTS:
            raise click.BadParameter(f"the real bookie does not take {', '.join(sorted(options.faults & MODEL_ONLY_FAULTS))} "
                                     "(they act on the model's disk; the real bookie's torn and lost writes come from "
                                     "--power-loss): name the other kinds, e.g. --faults delay,drop,dup,reorder,"
                                     "partition,crash,slow,meta,expiry,clock", param_hint="--faults")
        replay_base = "vellum verify sim" + (f" --scenario {scenario}" if scenario != "default" else "") \
            + (f" --faults {faults}" if faults is not None else "") \
            + (f" --ledgers {ledgers}" if ledgers is not None else "") \
            + (f" --entries {entries}" if entries is not None else "") \
            + "".join(f" --regression {r}" for r in regressions) \
            + ("" if autorecovery is None else " --autorecovery" if autorecovery else " --no-autorecovery") \
            + (f" --bookie {bookie_kind}" if bookie_kind != "model" else "") \
            + (f" --power-loss {power_loss:g}" if power_loss else "") \
            + (" --named" if named else "")
        err = Console(stderr=True)
        if one is not None:
            _replay(one, options, as_json, f"{replay_base} --seed={one}")
            return
        seeds = range(start, start + count)
        with Progress(TextColumn("seeds"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
                      TextColumn("{task.fields[bad]}"), TimeElapsedColumn(), console=err,
                      disable=as_json or not err.is_terminal) as progress:
            task = progress.add_task("sim", total=count, rate="", bad="")
            state = {"n": 0, "bad": 0}
            report_box: list[CampaignReport] = []

            plain = not as_json and not err.is_terminal  # a log, not a terminal: a line per tenth
            every = NIGHTLY_PROGRESS_EVERY if nightly else max(1, count // 10)
            started = time.perf_counter()

            def on_result(r: RunResult) -> None:
                state["n"] += 1
                state["bad"] += 1 if (r.violations or r.error) else 0
                elapsed = time.perf_counter() - started
                rate = f"{state['n'] / elapsed:.1f} seeds per s" if elapsed > 0 else ""
                progress.update(task, advance=1, rate=rate, bad=f"{state['bad']} failing" if state["bad"] else "")
                if (plain or nightly) and (state["n"] == count or state["n"] % every == 0):
                    # a nightly run streams its progress even under --json (on stderr) and names
                    # where to resume it
                    resume = f", resume with --start {r.seed + 1}" if nightly and state["n"] < count else ""
                    click.echo(f"seeds {state['n']}/{count} (last {r.seed}), {rate}, {state['bad']} failing{resume}",
                               err=True)

            report = run_campaign(seeds, options, on_result=on_result, stop_at_first=stop_at_first, jobs=jobs)
            report_box.append(report)
        if report.interrupted:
            after = report.last_seed + 1 if report.last_seed is not None else start
            click.echo(f"interrupted after {report.seeds} seeds: resume with --start {after} "
                       f"--seeds {start + count - after}", err=True)
        rows = [
            ("seeds", report.seeds),
            ("seeds per second (wall)", f"{report.seeds_per_s:.1f}"),
            ("seeds per minute (wall)", f"{report.seeds_per_s * 60:.0f}"),
            ("seeds per minute (CPU of one core)", f"{report.seeds_per_cpu_s * 60:.0f}"),
            ("client operations per seed", f"{report.operations / max(1, report.seeds):.0f}"),
            ("client operations", report.operations),
            ("acknowledged adds", report.acks),
            ("virtual seconds", f"{report.virtual_s:.1f}"),
            ("violations", len(report.violations)),
            ("runs stopped by an error", len(report.errors)),
            ("failing seeds", " ".join(map(str, report.failed_seeds[:20])) or "-"),
        ] + _fault_rows(report, options.faults) \
          + [(f"violations: {k}", n) for k, n in sorted(report.kinds.items())] \
          + [(f"network: {k}", n) for k, n in sorted(report.network.items())]
        if as_json:
            emit_json({
                "seeds": report.seeds, "seeds_per_s": report.seeds_per_s, "seeds_per_cpu_s": report.seeds_per_cpu_s,
                "scenario": scenario, "bookie": bookie_kind, "operations": report.operations, "acks": report.acks,
                "virtual_s": report.virtual_s, "faults": sorted(options.faults), "regressions": list(regressions),
                "violations": [_violation_json(s, v) for s, v in report.violations],
                "errors": [{"seed": s, "error": e} for s, e in report.errors],
                "network": dict(report.network),
                "fault_seeds": dict(report.fault_seeds), "injections": dict(report.injections),
                "fault_share": {k: report.fault_share(k) for k in sorted(report.fault_seeds)},
                "last_seed": report.last_seed, "interrupted": report.interrupted,
            })
        else:
            emit_table(("", "value"), rows, title="vellum verify sim")
            out = Console()
            for seed, v in report.violations:
                _print_violation(out, seed, v, f"{replay_base} --seed={seed}")
            for seed, e in report.errors:
                out.print(f"[bold yellow]run stopped[/] seed={seed}: {e}  (replay: {replay_base} --seed={seed})")
        if report.violations or report.errors:
            sys.exit(1)
        if report.interrupted:
            sys.exit(130)


    @verify.command("cluster")
    @click.option("--metadata", "metadata_uri", required=True, help="metadataServiceUri of the cluster to check")
    @click.option("--duration", "duration_s", default=60.0, show_default=True, help="seconds to run, in all")
    @click.option("--round", "round_s", default=15.0, show_default=True,
                  help="seconds of client work per round; each round ends by recovering and reading back its ledgers")
    @click.option("--nemesis", default=None,
                  help="a command of yours, run as `CMD inject` at random moments (kill or pause your processes) "
                       "and `CMD heal` a while later and before each round's read-back")
    @click.option("--ledgers", default=4, show_default=True, help="ledgers the writer makes per round")
    @click.option("--entries", default=120, show_default=True, help="about this many entries per ledger")
    @click.option("--keep-ledgers", is_flag=True, help="keep the ledgers the check made (deleted by default)")
    @click.option("--seed", type=int, default=None, help="seed of the workload's choices (real time decides the rest)")
    @client_conf_flag("for the check's clients (a secured cluster needs its TLS or token keys)")
    @click.option("--json", "as_json", is_flag=True, help="machine-readable output")
    def cluster(metadata_uri: str, duration_s: float, round_s: float, nemesis: str | None, ledgers: int, entries: int,
                keep_ledgers: bool, seed: int | None, client_conf: str | None, as_json: bool) -> None:
        """Run writers, tailing readers, racing recoveries and deletes against a running cluster
        for a bounded time and check the same promises as the simulator (docs/verification.md)."""
        import asyncio

        from vellum.errors import VellumError
        from vellum.sim.cluster import ClusterCheckOptions, ClusterCheckReport, run_cluster_check
        from vellum.sim.workload import WorkloadShape

        for value, hint in ((duration_s, "--duration"), (round_s, "--round")):
            if value <= 0:
                raise click.BadParameter("must be more than 0 seconds", param_hint=hint)
        for count, hint in ((ledgers, "--ledgers"), (entries, "--entries")):
            if count < 1:
                raise click.BadParameter("must be at least 1", param_hint=hint)
        options = ClusterCheckOptions(
            metadata_uri, duration_s=duration_s, round_s=round_s, nemesis=nemesis, keep_ledgers=keep_ledgers,
            seed=seed, shape=WorkloadShape(ledgers=ledgers, entries=(max(1, entries // 2), entries + entries // 2)))
        try:
            config = load_client_config_file(client_conf)
        except VellumError as e:
            raise click.ClickException(str(e)) from None
        err = Console(stderr=True)

        async def main(progress: Progress) -> ClusterCheckReport:
            task = progress.add_task("check", total=duration_s, what="starting")

            def on_round(r: ClusterCheckReport) -> None:
                progress.update(task, what=f"round {r.rounds}: {r.acks} acknowledged adds, {r.ledgers} ledgers, "
                                           f"{sum(r.nemesis.values())} nemesis runs")
                if not as_json and not err.is_terminal:
                    click.echo(f"round {r.rounds} done: {r.elapsed_s:.0f}/{duration_s:g} s, {r.acks} acknowledged "
                               "adds", err=True)

            async def tick() -> None:
                started = time.monotonic()
                while True:
                    progress.update(task, completed=min(duration_s, time.monotonic() - started))
                    await asyncio.sleep(0.5)

            ticker = asyncio.ensure_future(tick())
            try:
                return await run_cluster_check(options, config, progress=on_round)
            finally:
                ticker.cancel()

        with Progress(TextColumn("verify cluster"), BarColumn(), TimeElapsedColumn(), TextColumn("{task.fields[what]}"),
                      console=err, disable=as_json or not err.is_terminal) as progress:
            try:
                report = asyncio.run(main(progress))
            except VellumError as e:
                raise click.ClickException(f"vellum verify cluster against {metadata_uri}: {e}") from None
        counts = report.counts
        if as_json:
            emit_json({"metadata": metadata_uri, "seed": report.seed, "rounds": report.rounds,
                       "elapsed_s": report.elapsed_s, "ledgers": report.ledgers, "deleted": report.deleted,
                       "acks": report.acks, "reads": counts["read"] + counts["final-read"],
                       "recoveries": counts["recovered"], "events": dict(counts), "nemesis": dict(report.nemesis),
                       "violations": [_violation_json(report.seed, v) for v in report.violations]})
        else:
            rows = [("rounds", report.rounds), ("seconds", f"{report.elapsed_s:.1f}"), ("ledgers", report.ledgers),
                    ("acknowledged adds", report.acks), ("failed adds", counts["add-failed"]),
                    ("entries read", counts["read"] + counts["final-read"]),
                    ("recoveries", counts["recovered"]), ("failed recoveries", counts["recover-failed"]),
                    ("deletes", report.deleted),
                    *[(f"nemesis: {k}", n) for k, n in sorted(report.nemesis.items())],
                    ("violations", len(report.violations)), ("workload seed", report.seed)]
            emit_table(("", "value"), rows, title=f"vellum verify cluster: {metadata_uri}")
            out = Console()
            for v in report.violations:
                _print_violation(out, report.seed, v, "a real cluster does not replay: the history above is the record")
        if report.violations:
            sys.exit(1)


def _replay(seed: int, options: SimOptions, as_json: bool, replay: str) -> None:
    result = run_seed(seed, dataclasses.replace(options, trace=True))
    history = result.history
    events = [e.describe() for e in history.events] if history is not None else []
    if as_json:
        emit_json({"seed": seed, "fingerprint": result.fingerprint, "operations": result.operations,
                   "virtual_s": result.virtual_s, "error": result.error,
                   "violations": [_violation_json(seed, v) for v in result.violations], "history": events,
                   "injected": result.injected,
                   "faults": sorted(options.faults), "regressions": sorted(options.flags),
                   "workload": dataclasses.asdict(options.shape)})
    else:
        out = Console()
        for line in events:
            out.print(line, markup=False, highlight=False)
        out.print(f"seed {seed}: {result.operations} operations, {result.virtual_s:.2f} virtual s, "
                  f"fingerprint {result.fingerprint}, {len(result.violations)} violation(s)")
        if result.error:
            out.print(f"[bold yellow]run stopped[/]: {result.error}")
        for v in result.violations:
            _print_violation(out, seed, v, replay)
    if result.violations or result.error:
        sys.exit(1)
