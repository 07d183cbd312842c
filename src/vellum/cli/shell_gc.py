"""Shell commands driving a running bookie's GC over its admin HTTP API (docs/gc.md).

- ``gc --http URL [--major] [--minor] [--wait]``: force a GC pass (``PUT /api/v1/bookie/gc``);
  with ``--wait`` a progress bar follows ``gc_details`` until ``GET /api/v1/bookie/gc`` says the
  forced pass is over;
- ``gc-status --http URL [--json]``: ``gc_details``, one row per GC thread (ledger dir);
- ``entrylogs-usage --http URL [--json]``: per entry log size, live bytes, usage and ledgers as
  the last GC pass saw them (``entrylogs --dir`` reads an offline ledger dir instead).

A secured bookie (https, tokens): ``--http https://...``, ``--http-ca-file`` with the cluster's
CA and ``--admin-token-file`` with an admin token (``client_options.admin_http_options``).
"""

from __future__ import annotations

import time
from typing import Any

import click
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from vellum.cli.client_options import admin_http_options
from vellum.cli.output import emit_json, emit_table
from vellum.security.admin_http_client import AdminHttpAccess, AdminHttpCallError


def _call(access: AdminHttpAccess, url: str, path: str, method: str = "GET", body: dict[str, Any] | None = None) -> Any:
    try:
        return access.call(url, path, method, body)
    except AdminHttpCallError as e:
        raise click.ClickException(str(e)) from None


def register(shell: click.Group) -> None:
    shell.add_command(gc_cmd)
    shell.add_command(gc_status)
    shell.add_command(entrylogs_usage)


@click.command("gc")
@click.option("--http", "url", required=True, help="bookie admin URL, e.g. http://127.0.0.1:8080 (https:// for httpServerTlsEnable)")
@click.option("--major/--no-major", default=None, help="allow major compaction (default: unless suspended)")
@click.option("--minor/--no-minor", default=None, help="allow minor compaction (default: unless suspended)")
@click.option("--wait", is_flag=True, help="wait for the forced pass to finish, with a progress bar")
@click.option("--timeout", type=float, default=3600.0, show_default=True, help="seconds to wait at most")
@admin_http_options
def gc_cmd(url: str, major: bool | None, minor: bool | None, wait: bool, timeout: float, access: AdminHttpAccess) -> None:
    """Force a garbage collection pass on a running bookie."""
    body: dict[str, Any] = {}
    if major is not None:
        body["forceMajor"] = major
    if minor is not None:
        body["forceMinor"] = minor
    before = _call(access, url, "/api/v1/bookie/gc_details")
    counters = [d.get("gcCounter", 0) for d in before]
    click.echo(_call(access, url, "/api/v1/bookie/gc", "PUT", body))
    if not wait:
        return
    deadline = time.monotonic() + timeout
    with Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[detail]}"), TimeElapsedColumn()
    ) as bar:
        task = bar.add_task("gc", total=None, detail="")
        while True:
            details = _call(access, url, "/api/v1/bookie/gc_details")
            done = all(d.get("gcCounter", 0) > c for d, c in zip(details, counters))
            busy = _call(access, url, "/api/v1/bookie/gc").get("is_in_force_gc") == "true"
            running = [d for d in details if d.get("gcRunning")]
            if running:
                p = running[0].get("progress", {})
                total, logs_done = p.get("bytesTotal", 0), p.get("bytesDone", 0)
                bar.update(
                    task, description=f"gc: {p.get('phase', '?')}", total=total or None, completed=logs_done,
                    detail=f"{p.get('logsDone', 0)}/{p.get('logsTotal', 0)} logs",
                )
            if done and not busy:
                bar.update(task, description="gc: done", total=1, completed=1, detail="")
                break
            if time.monotonic() > deadline:
                raise click.ClickException(f"GC still running after {timeout}s")
            time.sleep(0.2)
    _print_details(_call(access, url, "/api/v1/bookie/gc_details"), as_json=False)


def _print_details(details: list[dict[str, Any]], *, as_json: bool) -> None:
    if as_json:
        emit_json(details)
        return
    cols = ["ledgerDir", "forceCompacting", "majorCompacting", "minorCompacting", "majorCompactionCounter",
            "minorCompactionCounter", "lastMajorCompactionTime", "lastMinorCompactionTime", "reclaimedBytes",
            "compactedBytes", "deletedLedgers", "entryLogs", "isMajorGcSuspended", "isMinorGcSuspended"]
    rows = []
    for d in details:
        row = dict(d)
        for key in ("lastMajorCompactionTime", "lastMinorCompactionTime"):
            ms = row.get(key) or 0
            row[key] = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) if ms else "never"
        rows.append([row.get(c) for c in cols])
    emit_table(cols, rows, title="GC threads")


@click.command("gc-status")
@click.option("--http", "url", required=True, help="bookie admin URL")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@admin_http_options
def gc_status(url: str, as_json: bool, access: AdminHttpAccess) -> None:
    """Show each GC thread's state (BookKeeper's gc_details)."""
    _print_details(_call(access, url, "/api/v1/bookie/gc_details"), as_json=as_json)


@click.command("entrylogs-usage")
@click.option("--http", "url", required=True, help="bookie admin URL")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@admin_http_options
def entrylogs_usage(url: str, as_json: bool, access: AdminHttpAccess) -> None:
    """Per entry log of a running bookie: size, live bytes, usage, ledgers (last GC pass; the
    active logs, which GC never examines, show as ``active``)."""
    rows = _call(access, url, "/api/v1/bookie/entrylogs")
    if as_json:
        emit_json(rows)
        return
    emit_table(
        ["dir", "log", "size", "live bytes", "usage", "ledgers", "source"],
        [(r["ledgerDir"], r["logId"], r["size"], "-" if r["liveBytes"] is None else r["liveBytes"],
          "active" if r["usage"] is None else f"{r['usage']:.2%}",
          ",".join(str(x) for x in r["ledgers"][:20]) + ("..." if len(r["ledgers"]) > 20 else ""), r["source"])
         for r in rows],
        title="entry logs",
    )
