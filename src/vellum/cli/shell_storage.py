"""Shell commands over a ledger directory's entry logs and index: readlog, entrylogs, rebuild-index.

``readlog`` and ``entrylogs`` only read files and are safe on a running bookie (they may see the
active log's tail mid-write and report it as truncated). ``rebuild-index`` needs the bookie
stopped: it opens the RocksDB ``ledgers`` database first, whose LOCK file makes it fail with
"in use" while a bookie holds it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from vellum.cli.output import emit_json, emit_kv, emit_table
from vellum.errors import VellumError
from vellum.format import entrylog as fmt
from vellum.storage.entry_logger import EntryLogger, log_file_name
from vellum.storage.rebuild import rebuild_index

_PAYLOAD_PREVIEW = 32


def _resolve_log(log: str, ledger_dir: str | None) -> Path:
    path = Path(log)
    if path.is_file():
        return path
    try:
        log_id = int(log.removesuffix(".log"), 16)
    except ValueError:
        raise click.BadParameter(
            f"{log!r} is neither a file nor a hex entry log id", param_hint="LOG"
        ) from None
    if ledger_dir is None:
        raise click.BadParameter("give --dir LEDGER_DIR with a log id", param_hint="--dir")
    path = Path(ledger_dir) / "current" / log_file_name(log_id)
    if not path.is_file():
        raise click.BadParameter(f"{path} does not exist", param_hint="LOG")
    return path


def _ledger_dir(value: str) -> Path:
    path = Path(value)
    if not (path / "current").is_dir():
        raise click.BadParameter(f"{path} has no current/ directory", param_hint="--dir")
    return path


def register(shell: click.Group) -> None:
    shell.add_command(readlog)
    shell.add_command(entrylogs)
    shell.add_command(rebuild_index_cmd)


@click.command("readlog")
@click.argument("log")
@click.option(
    "--dir", "ledger_dir", type=click.Path(file_okay=False), help="ledger directory (with a log id)"
)
@click.option("--ledger", "ledger_id", type=int, default=None, help="only records of this ledger")
@click.option("--limit", type=int, default=None, help="print at most N records")
@click.option("--show-payload", is_flag=True, help="show the entry bytes after the ids (hex)")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def readlog(
    log: str,
    ledger_dir: str | None,
    ledger_id: int | None,
    limit: int | None,
    show_payload: bool,
    as_json: bool,
) -> None:
    """Print the records of an entry log (file path, or hex id with --dir), its ledgers map and
    where the scan stopped."""
    path = _resolve_log(log, ledger_dir)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        raise click.ClickException(f"{path}: {e.strerror}") from None
    try:
        size = os.fstat(fd).st_size

        def read(offset: int, n: int) -> bytes:
            return os.pread(fd, n, offset)

        try:
            header = fmt.decode_header(read(0, fmt.HEADER_SIZE), where=str(path))
            ledgers_map = fmt.read_ledgers_map(read, size, where=str(path))
        except VellumError as e:
            raise click.ClickException(str(e)) from None
        log_id = _log_id_of(path)
        scanner = fmt.EntryLogScanner(read, end=size, where=str(path))
        rows: list[dict[str, Any]] = []
        for rec in scanner:
            if ledger_id is not None and rec.ledger_id != ledger_id:
                continue
            if limit is not None and len(rows) >= limit:
                continue  # keep scanning so the stop report covers the whole log
            row: dict[str, Any] = {
                "offset": rec.offset,
                "location": None if log_id is None else (log_id << 32) | rec.offset,
                "ledger": rec.ledger_id,
                "entry": rec.entry_id,
                "size": rec.size,
            }
            if show_payload:
                row["payload"] = rec.entry[16:].hex()
            rows.append(row)
        report = scanner.report
    finally:
        os.close(fd)
    stop = {
        "stop": report.stop.value,
        "offset": report.offset,
        "reason": report.reason,
        "records": report.records,
        "padding_bytes": report.padding_bytes,
    }
    map_rows = sorted(ledgers_map.items()) if ledgers_map is not None else []
    if as_json:
        emit_json(
            {
                "file": str(path),
                "size": size,
                "header": {
                    "version": header.version,
                    "ledgers_map_offset": header.ledgers_map_offset,
                    "ledgers_count": header.ledgers_count,
                },
                "records": rows,
                "ledgers_map": None
                if ledgers_map is None
                else [{"ledger": k, "size": v} for k, v in map_rows],
                "scan": stop,
            }
        )
        return
    emit_kv(
        {
            "file": str(path),
            "size": size,
            "version": header.version,
            "ledgers map offset": header.ledgers_map_offset,
            "ledgers count": header.ledgers_count,
        },
        title="entry log header",
    )
    columns = ["offset", "location", "ledger", "entry", "size"] + (["payload"] if show_payload else [])
    table_rows = []
    for r in rows:
        values = [r["offset"], r["location"], r["ledger"], r["entry"], r["size"]]
        if show_payload:
            p = r["payload"]
            values.append(p[: 2 * _PAYLOAD_PREVIEW] + ("..." if len(p) > 2 * _PAYLOAD_PREVIEW else ""))
        table_rows.append(values)
    emit_table(columns, table_rows, title="records")
    if ledgers_map is None:
        click.echo("ledgers map: absent or inconsistent (the log is unsealed or damaged)")
    else:
        emit_table(["ledger", "size"], map_rows, title="ledgers map")
    emit_kv(stop, title="scan")


def _log_id_of(path: Path) -> int | None:
    try:
        return int(path.name.removesuffix(".log"), 16) if path.name.endswith(".log") else None
    except ValueError:
        return None


@click.command("entrylogs")
@click.option("--dir", "ledger_dir", required=True, type=click.Path(file_okay=False), help="ledger directory")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def entrylogs(ledger_dir: str, as_json: bool) -> None:
    """List the entry logs of a ledger directory: id, size, ledgers (from the map or a scan)."""
    directory = _ledger_dir(ledger_dir)
    logger = EntryLogger(directory, log_size_limit=(1 << 32) - 1, preallocate=False)
    rows: list[tuple[Any, ...]] = []
    try:
        for log_id in logger.log_ids():
            try:
                info = logger.log_info(log_id)
            except VellumError as e:
                rows.append((f"{log_id:x}", None, None, None, f"error: {e}"))
                continue
            rows.append(
                (
                    f"{log_id:x}",
                    info.size,
                    len(info.ledgers),
                    sum(info.ledgers.values()),
                    "map" if info.from_map else "scan",
                )
            )
    finally:
        logger.close()
    emit_table(
        ["log", "size", "ledgers", "ledger_bytes", "source"],
        rows,
        title=f"entry logs of {directory}",
        as_json=as_json,
    )


@click.command("rebuild-index")
@click.option("--dir", "ledger_dir", required=True, type=click.Path(file_okay=False), help="ledger directory")
@click.option(
    "--index-dir", type=click.Path(file_okay=False), default=None, help="index directory (default: --dir)"
)
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def rebuild_index_cmd(ledger_dir: str, index_dir: str | None, as_json: bool) -> None:
    """Rebuild the RocksDB location index by scanning every entry log. Stop the bookie first
    (refused while a bookie holds the index: RocksDB's LOCK)."""
    directory = _ledger_dir(ledger_dir)
    try:
        if as_json:
            report = rebuild_index(directory, Path(index_dir) if index_dir else None)
        else:
            with Progress(
                TextColumn("rebuilding index"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[entries]} entries"),
            ) as bar:
                task = bar.add_task("logs", total=None, entries=0)

                def progress(done: int, total: int, entries: int) -> None:
                    bar.update(task, completed=done, total=total, entries=entries)

                report = rebuild_index(directory, Path(index_dir) if index_dir else None, progress=progress)
    except VellumError as e:
        raise click.ClickException(str(e)) from None
    emit_kv(
        {
            "logs": report.logs,
            "entries": report.entries,
            "ledgers": len(report.ledgers),
            "skipped_entries": report.skipped_entries,
            "only_known_ledgers": report.only_known_ledgers,
            "problems": report.problems,
        },
        title="rebuild-index",
        as_json=as_json,
    )
