"""``vellum shell readjournal``: print the records of one journal file and where its scan stopped.

Reads the file directly (the bookie should be down, or the file no longer written); never
modifies it. Records of a checksummed batch are shown only once the batch's checksum matched,
exactly what replay would accept.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

import click

from vellum.cli.output import emit_json, emit_table
from vellum.errors import VellumError
from vellum.format.journal import JournalRecord, JournalScanner
from vellum.storage.journal import JournalFile, journal_file_name


def _resolve(target: str, journal_dir: str | None) -> Path:
    path = Path(target)
    if path.is_file():
        return path
    if not re.fullmatch(r"[0-9a-fA-F]+(\.txn)?", target):
        raise click.BadParameter(f"{target!r} is neither a journal file nor a hex journal id")
    if journal_dir is None:
        raise click.BadParameter("a journal id needs --dir JOURNAL_DIR")
    name = journal_file_name(int(target.removesuffix(".txn"), 16))
    for candidate in (Path(journal_dir) / "current" / name, Path(journal_dir) / name):
        if candidate.is_file():
            return candidate
    raise click.BadParameter(f"no journal {name} in {journal_dir}/current")


def _row(r: JournalRecord) -> dict[str, Any]:
    return {
        "offset": r.offset,
        "type": r.kind.value,
        "ledger": r.ledger_id,
        "entry": r.entry_id,
        "length": r.length,
        "batch": r.check.value,
    }


def register(shell: click.Group) -> None:
    @shell.command("readjournal")
    @click.argument("journal")
    @click.option("--dir", "journal_dir", type=click.Path(file_okay=False), help="journal directory")
    @click.option("--json", "as_json", is_flag=True, help="machine-readable output")
    @click.option("--limit", type=click.IntRange(min=0), default=None, help="print at most N records")
    def readjournal(journal: str, journal_dir: str | None, as_json: bool, limit: int | None) -> None:
        """Print the records of JOURNAL (a .txn file, or a hex journal id with --dir)."""
        path = _resolve(journal, journal_dir)
        try:
            with JournalFile(path) as jf:
                scanner: JournalScanner = jf.scanner()
                rows = [_row(r) for r in itertools.islice(scanner, limit)]
                stop = scanner.stop
        except VellumError as e:
            raise click.ClickException(str(e)) from None
        header = scanner.header
        if stop is None:
            stopped: dict[str, Any] = {"reason": "limit", "detail": f"stopped after {limit} record(s)"}
        else:
            stopped = {
                "reason": stop.reason.value,
                "offset": stop.offset,
                "valid_end": stop.valid_end,
                "detail": stop.detail,
            }
        if as_json:
            emit_json(
                {
                    "file": str(path),
                    "version": header.version,
                    "batch_checksums": header.batch_checksums,
                    "records": rows,
                    "stop": stopped,
                }
            )
            return
        emit_table(
            ["offset", "type", "ledger", "entry", "length", "batch"],
            [tuple(r.values()) for r in rows],
            title=f"{path} (format v{header.version}, "
            f"{'batch checksums' if header.batch_checksums else 'no batch checksums'})",
        )
        if stop is None:
            click.echo(f"stopped after {limit} record(s) (--limit)")
        else:
            click.echo(f"scan stopped: {stop.reason.value}: {stop.describe(str(path))}")
