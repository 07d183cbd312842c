"""``vellum spark ...``: offline analyses of bookie storage run as Spark jobs.

Commands: ``gc-report`` (per entry log: total / live bytes, usage, age, pinning ledgers),
``replica-check`` (ledgers whose bookies miss entries or hold diverging copies) and
``staging-gc`` (staging ledgers of Spark writes whose driver died before commit; never a ledger
that a named ledger's segments reference) and ``loss-report`` (the lost ranges that reads with
``failOnDataLoss=false`` recorded under their ``dataLossLocation``; no Spark session needed).
Output: a readable table, ``--json``, or ``--parquet PATH`` for further Spark work.
Client settings (TLS, token, ZooKeeper identity): ``vellum spark --client-conf FILE <job>`` or
``$VELLUM_CLIENT_CONF``, the same option as ``vellum shell`` (``client_options.py``); the jobs
use them on the driver and ship them to their tasks.

pyspark is imported only when a command runs, so ``vellum`` itself starts fast and works
without the ``[spark]`` extra.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import click

from vellum.cli.client_options import admin_http_options, client_conf_option, shell_client_config
from vellum.cli.output import emit_json, emit_table
from vellum.security.admin_http_client import AdminHttpAccess, AdminHttpCallError


def _session(master: str) -> Any:
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise click.ClickException("pyspark is not installed: pip install 'vellum[spark]'") from None
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (SparkSession.builder.master(master).appName("vellum-spark-job")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "4")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _emit(spark: Any, rows: list[dict[str, Any]], columns: list[str], *, title: str, as_json: bool,
          parquet: str | None) -> None:
    if parquet:
        if rows:
            spark.createDataFrame([{c: r[c] for c in columns} for r in rows]).write.mode("overwrite").parquet(parquet)
        click.echo(f"{len(rows)} rows written to {parquet}", err=True)
    if as_json:
        emit_json(rows)
    elif not parquet:
        emit_table(columns, ([_cell(r[c]) for c in columns] for r in rows), title=title)


def _cell(v: Any) -> Any:
    if isinstance(v, list):
        shown = ",".join(map(str, v[:8]))
        return shown + (f",... ({len(v)})" if len(v) > 8 else "")
    return v


def register(cli: click.Group) -> None:
    @cli.group()
    @client_conf_option
    def spark() -> None:
        """Offline analyses of bookie storage, run on Spark."""

    common = [
        click.option("--metadata-uri", required=True, help="metadata service URI of the cluster"),
        click.option("--master", default="local[2]", show_default=True, help="Spark master"),
        click.option("--json", "as_json", is_flag=True, help="machine-readable output"),
        click.option("--parquet", type=click.Path(), help="write the result rows as Parquet here"),
    ]

    def with_common(fn: Any) -> Any:
        for opt in reversed(common):
            fn = opt(fn)
        return fn

    @spark.command("gc-report")
    @with_common
    @click.option("--dir", "dirs", multiple=True, type=click.Path(exists=True, file_okay=False),
                  help="a directory of (copied) bookie data: every ledger dir below is scanned, read-only")
    @click.option("--http", "http_urls", multiple=True,
                  help="admin HTTP base URL of a running bookie (e.g. http://127.0.0.1:8000); repeatable. "
                       "Without --dir and --http: every registered bookie that publishes its HTTP address")
    @click.option("--min-age", default=0.0, show_default=True, help="only logs at least this many seconds old")
    @admin_http_options
    def gc_report(metadata_uri: str, master: str, as_json: bool, parquet: str | None, dirs: tuple[str, ...],
                  http_urls: tuple[str, ...], min_age: float, access: AdminHttpAccess) -> None:
        """Per entry log: total and live bytes, usage, age, and the ledgers that pin it."""
        from vellum.spark.jobs import discover_http_urls
        from vellum.spark.jobs import gc_report as run

        if not dirs and not http_urls:
            found = discover_http_urls(metadata_uri, shell_client_config())
            if not found:
                raise click.UsageError("no registered bookie publishes an admin HTTP address: give --dir "
                                       "(copied bookie data) and/or --http (running bookies' admin URLs)")
            http_urls = tuple(found.values())
            if not as_json:
                click.echo(f"running bookies: {', '.join(f'{b} ({u})' for b, u in found.items())}", err=True)
        s = _session(master)
        try:
            rows = run(s, metadata_uri=metadata_uri, dirs=list(dirs), http_urls=list(http_urls), access=access,
                       client_config=shell_client_config())
        except AdminHttpCallError as e:
            raise click.ClickException(str(e)) from None
        rows = [r for r in rows if r["ageSeconds"] is None or r["ageSeconds"] >= min_age]
        cols = ["bookie", "logId", "totalBytes", "liveBytes", "usage", "ageSeconds", "ledgers", "deadLedgers",
                "pinnedBy", "partlyShrunk", "source"]
        _emit(s, rows, cols if not (as_json or parquet) else [*cols, "file"], title="entry logs (oldest first)",
              as_json=as_json, parquet=parquet)

    @spark.command("replica-check")
    @with_common
    @click.option("--ledger", "ledgers", multiple=True, type=int, help="check only these ledgers (repeatable)")
    @click.option("--digests", is_flag=True, help="also compare the stored bytes of every entry across replicas")
    @click.option("--all-rows", is_flag=True, help="show every (ledger, segment, bookie), not only problems")
    def replica_check(metadata_uri: str, master: str, as_json: bool, parquet: str | None, ledgers: tuple[int, ...],
                      digests: bool, all_rows: bool) -> None:
        """Ledgers whose bookies do not hold the entries the ensemble striping gives them."""
        from vellum.spark.jobs import replica_check as run
        from vellum.spark.jobs import summarize_replicas

        s = _session(master)
        rows = run(s, metadata_uri=metadata_uri, ledger_ids=list(ledgers) or None, digests=digests,
                   client_config=shell_client_config())
        if all_rows or parquet:
            cols = ["ledgerId", "segmentFirst", "segmentLast", "bookie", "expected", "present", "missing",
                    "extra", "digestMismatches", "firstMissing", "reachable", "error"]
            _emit(s, rows, cols, title="replicas", as_json=as_json, parquet=parquet)
            return
        problems = summarize_replicas(rows)
        checked = len({r["ledgerId"] for r in rows})
        if as_json:
            emit_json({"ledgersChecked": checked, "problems": problems})
            return
        emit_table(["ledgerId", "status", "missingCopies", "digestMismatches", "bookies", "unreachable"],
                   ([*(_cell(p[c]) for c in ("ledgerId", "status", "missingCopies", "digestMismatches", "bookies")),
                     "; ".join(f"{b} ({err})" for b, err in p["unreachable"].items())]
                    for p in problems),
                   title=f"{checked} ledgers checked, {len(problems)} with problems")
        unreachable = sorted({b for p in problems for b in p["unreachable"]})
        if unreachable:
            click.echo(f"could not ask {', '.join(unreachable)}: their copies are unknown, not missing "
                       "(a secured cluster needs --client-conf or $VELLUM_CLIENT_CONF)", err=True)

    @spark.command("loss-report")
    @click.option("--location", required=True, type=click.Path(file_okay=False),
                  help="the dataLossLocation option of the reads (a directory of JSON-lines files)")
    @click.option("--json", "as_json", is_flag=True, help="machine-readable output")
    def loss_report(location: str, as_json: bool) -> None:
        """Ranges that reads with failOnDataLoss=false lost, counted and listed (oldest first).

        A range recorded twice (a retried task, a replayed micro-batch) counts once.
        """
        from vellum.spark.loss import LossFileError, read_losses

        try:
            rows = read_losses(location)
        except (OSError, LossFileError) as e:
            raise click.ClickException(str(e)) from None
        known = sum(r["lastEntry"] - r["firstEntry"] + 1 for r in rows
                    if r["firstEntry"] is not None and r["lastEntry"] is not None)
        unknown = sum(1 for r in rows if r["firstEntry"] is None or r["lastEntry"] is None)
        if as_json:
            emit_json({"lostRanges": len(rows), "lostEntries": known, "rangesOfUnknownSize": unknown, "rows": rows})
            return

        def entries(r: dict[str, Any]) -> str:
            if r["firstEntry"] is None:
                return "all"
            return f"{r['firstEntry']}..{'' if r['lastEntry'] is None else r['lastEntry']}"

        # The detail sentence of each row is in --json (and in the [LEDGER_DATA_LOSS] log lines).
        emit_table(["time", "name", "ledgerId", "entries", "reason", "query", "batchId"],
                   ([r["time"], r["name"], r["ledgerId"], entries(r), r["reason"], r["queryName"] or r["queryId"],
                     r["batchId"]] for r in rows),
                   title=f"{len(rows)} lost ranges: {known} entries"
                         + (f", and {unknown} ranges of unknown size" if unknown else ""))

    @spark.command("staging-gc")
    @click.option("--metadata-uri", required=True, help="metadata service URI of the cluster")
    @click.option("--older-than", default=3600.0, show_default=True,
                  help="only jobs whose newest staging registration is at least this many seconds old; "
                       "must exceed the longest running Spark write (see docs/spark.md)")
    @click.option("--dry-run", is_flag=True, help="list, delete nothing")
    def staging_gc(metadata_uri: str, older_than: float, dry_run: bool) -> None:
        """Delete staging ledgers of Spark writes that never committed (driver crashed).

        A staging ledger that some named ledger's segments reference (its commit published it
        before the driver died) is never deleted: only its registration is dropped.
        """
        from vellum.client.blocking import BookKeeper
        from vellum.spark.names import NameScanError, referenced_ledgers
        from vellum.spark.writer import cleanup_staging, list_staging_jobs, sweep_finished_markers

        now_ms = time.time() * 1000
        rows: list[tuple[str, int, float, int | str, int | str]] = []
        with BookKeeper(metadata_uri, config=shell_client_config()) as bk:
            jobs = list_staging_jobs(bk)
            stopped = "staging-gc --dry-run stopped"
            try:
                # A dry run reports what a real run would keep (from one scan of the name records).
                referenced = referenced_ledgers(bk) if dry_run and jobs else frozenset()
                for job, items in sorted(jobs.items()):
                    stopped = f"staging-gc stopped at job {job} and deleted nothing of it"
                    newest = max(c for _k, _l, c in items)
                    age = round((now_ms - newest) / 1000, 1)
                    if now_ms - newest < older_than * 1000:
                        rows.append((job, len(items), age, "-", "-"))  # young: its driver may be running
                    elif dry_run:
                        kept = sum(1 for _k, lid, _c in items if lid in referenced)
                        rows.append((job, len(items), age, 0, kept))
                    else:
                        done = cleanup_staging(bk, job, set())
                        rows.append((job, len(items), age, done.deleted, done.published))
            except NameScanError as exc:
                raise click.ClickException(
                    f"{stopped}: {exc}. A staging ledger is "
                    "deleted only after every named-ledger record was read (a ledger a name references "
                    "must survive); make the metadata store or the record readable and run staging-gc again"
                ) from None
            if not dry_run:
                sweep_finished_markers(bk, older_than * 1000)
        emit_table(["job", "stagingLedgers", "ageSeconds", "deleted", "keptPublished"], rows,
                   title="Spark staging ledgers (keptPublished: already segments of a named ledger, "
                         "only the registration dropped)")
