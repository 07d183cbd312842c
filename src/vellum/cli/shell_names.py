"""Shell commands for named ledgers (requirement R3 of docs/correctness.md): names, name, readname, shrink, cursor.

Each command opens the blocking client on ``--uri`` (default ``$VELLUM_METADATA_URI`` or
``vellum.config.DEFAULT_METADATA_URI``), prints a table (or JSON with ``--json``) and closes it.
Only ``shrink`` and ``cursor --delete`` change state; ``name`` and ``readname`` never fence a writer.
"""

from __future__ import annotations

from typing import Any

import click

from vellum.cli.client_options import metadata_uri_option, shell_client_config
from vellum.cli.output import emit_json, emit_kv, emit_table

_uri_option = metadata_uri_option()


def _password_option(fn):  # type: ignore[no-untyped-def]
    return click.option("--password", default="", help="the named ledger's password")(fn)


def register(shell: click.Group) -> None:
    shell.add_command(names_cmd)
    shell.add_command(name_cmd)
    shell.add_command(readname)
    shell.add_command(shrink_cmd)
    shell.add_command(cursor_cmd)


@click.command("names")
@_uri_option
@click.argument("prefix", required=False, default="")
@click.option("--json", "as_json", is_flag=True)
def names_cmd(uri: str, prefix: str, as_json: bool) -> None:
    """List named ledgers whose name starts with PREFIX."""
    from vellum.client.blocking import BookKeeper
    from vellum.client.named_blocking import NamedLedgers

    with BookKeeper(uri, config=shell_client_config()) as bk:
        found = NamedLedgers(bk).list(prefix)
    if as_json:
        emit_json(found)
        return
    emit_table(["name"], [(n,) for n in found], title=f"named ledgers ({prefix or 'all'}): {len(found)}")


@click.command("name")
@_uri_option
@click.argument("name")
@click.option("--json", "as_json", is_flag=True)
def name_cmd(uri: str, name: str, as_json: bool) -> None:
    """Show a named ledger: state, writer session, start, last entry, size, segments, cursors."""
    from vellum.client.blocking import BookKeeper
    from vellum.client.named_blocking import NamedLedgers

    with BookKeeper(uri, config=shell_client_config()) as bk:
        info = NamedLedgers(bk).info(name)
    rec = info.record
    segments: list[dict[str, Any]] = [
        {"ledgerId": s.ledger_id, "state": "OPEN" if s.is_open else "CLOSED", "firstEntryId": s.first_entry_id,
         "lastEntryId": s.last_entry_id, "length": s.length if not s.is_open else None, "writerEpoch": s.epoch}
        for s in rec.segments
    ]
    summary: dict[str, Any] = {
        "name": rec.name,
        "state": rec.state,
        "writerEpoch": rec.writer_epoch,
        "writer": rec.writer,
        "startEntryId": rec.start_entry_id,
        "lastEntryId": info.last_entry_id,
        "entries": max(0, info.last_entry_id - rec.start_entry_id + 1),
        "sizeBytes": info.size,
        "trimmedTo": rec.trimmed_to,
        "digestType": rec.digest_type.name,
        "quorum": f"{rec.ensemble_size}/{rec.write_quorum_size}/{rec.ack_quorum_size}",
        "segments": len(rec.segments),
        "cursors": ", ".join(sorted(rec.cursors)),
        "version": info.version,
    }
    if as_json:
        emit_json({**summary, "segments": segments,
                   "cursors": {k: v.decode("utf-8", "backslashreplace") for k, v in rec.cursors.items()}})
        return
    emit_kv(summary, title=f"named ledger {name}")
    emit_table(["ledger", "state", "first", "last", "bytes", "epoch"],
               [tuple(s.values()) for s in segments], title="segments")


@click.command("readname")
@_uri_option
@_password_option
@click.argument("name")
@click.argument("first", type=int, required=False, default=None)
@click.argument("last", type=int, required=False, default=-1)
@click.option("--show-payload", is_flag=True, help="print payloads (escaped beyond printable text)")
@click.option("--json", "as_json", is_flag=True)
def readname(uri: str, password: str, name: str, first: int | None, last: int, show_payload: bool,
             as_json: bool) -> None:
    """Read entries FIRST..LAST (global ids; default: start..last confirmed) without fencing."""
    from vellum.client.blocking import BookKeeper
    from vellum.client.named_blocking import NamedLedgers, OpenMode

    with BookKeeper(uri, config=shell_client_config()) as bk:
        h = NamedLedgers(bk).open(name, OpenMode.READ_ONLY, password=password.encode())
        lac = h.read_last_add_confirmed()
        lo = h.start_entry_id if first is None else first
        hi = lac if last < 0 else min(last, lac)
        entries = h.read(lo, hi) if hi >= lo else []
    rows = [(e.entry_id, e.ledger_id, e.ledger_entry_id, len(e.payload),
             e.payload.decode("utf-8", "backslashreplace")[:200] if show_payload else "") for e in entries]
    if as_json:
        emit_json([{"entryId": r[0], "ledgerId": r[1], "ledgerEntryId": r[2], "size": r[3],
                    **({"payload": r[4]} if show_payload else {})} for r in rows])
        return
    cols = ["entry", "ledger", "ledger entry", "size"] + (["payload"] if show_payload else [])
    emit_table(cols, [r if show_payload else r[:4] for r in rows],
               title=f"{name}: entries {lo}..{hi} (last confirmed {lac})")


@click.command("shrink")
@_uri_option
@click.argument("name")
@click.argument("entry", type=int)
@click.option("--force", is_flag=True,
              help="also delete whole segments below ENTRY and have the bookies collect the space now "
                   "(trim, then a garbage collection pass); waits until every bookie is done")
@click.option("--json", "as_json", is_flag=True)
def shrink_cmd(uri: str, name: str, entry: int, force: bool, as_json: bool) -> None:
    """Move NAME's start to ENTRY: entries below it become invisible (with --force, reclaimed).

    ENTRY below the current start is an error. With --force the command returns when every
    bookie holding the range has run its garbage collection pass, and lists what each
    reclaimed; a bookie that could not collect is listed with its error and the exit status
    is 1 (its space comes back at its next GC pass; running the command again retries).
    """
    from vellum.client.blocking import BookKeeper
    from vellum.client.named_blocking import NamedLedgers

    with BookKeeper(uri, config=shell_client_config()) as bk:
        named = NamedLedgers(bk)
        result = named.shrink(name, entry, force=force)
        rec = named.record(name).value
    summary: dict[str, Any] = {"name": name, "startEntryId": result.start_entry_id, "force": force,
                               "segments": len(rec.segments), "trimmedTo": rec.trimmed_to,
                               "droppedLedgers": list(result.dropped_ledgers)}
    rows = [{"bookie": c.bookie, "ledgerId": c.ledger_id, "trimmedBelow": c.end_entry_id, "held": c.held,
             "reclaimedBytes": c.reclaimed_bytes, "garbageBytesLeft": c.garbage_bytes, "error": c.error}
            for c in result.collections]
    if as_json:
        emit_json({**summary, "collected": result.collected, "collections": rows})
    else:
        emit_kv(summary, title=f"{name} shrunk")
        if rows:
            emit_table(list(rows[0]), (list(r.values()) for r in rows),
                       title="garbage collection on the bookies (done)" if result.collected
                       else "garbage collection on the bookies: NOT done everywhere")
    if not result.collected:
        failed = sorted({c.bookie for c in result.collections if not c.ok})
        raise click.ClickException(
            f"the start moved to {result.start_entry_id}, but {', '.join(failed)} could not collect: their "
            "space comes back at their next GC pass; run the shrink with --force again to retry")


@click.command("cursor")
@_uri_option
@click.argument("name")
@click.argument("key")
@click.option("--delete", is_flag=True, help="remove the cursor (e.g. a retaining cursor of a query that is gone)")
@click.option("--json", "as_json", is_flag=True)
def cursor_cmd(uri: str, name: str, key: str, delete: bool, as_json: bool) -> None:
    """Show cursor KEY of NAME: its value and, for a position cursor, the next entry it reads,
    whether it holds back a shrink (retain) and its lag; or remove it with --delete."""
    from vellum.client.blocking import BookKeeper
    from vellum.client.named_blocking import NamedLedgers
    from vellum.client.named_record import CAS_RETRIES, PositionCursor
    from vellum.errors import MetadataVersionError

    with BookKeeper(uri, config=shell_client_config()) as bk:
        named = NamedLedgers(bk)
        info = named.info(name)
        value = info.record.cursors.get(key)
        if value is None:
            raise click.ClickException(f"named ledger {name!r} has no cursor {key!r} "
                                       f"(its cursors: {', '.join(sorted(info.record.cursors)) or 'none'})")
        if delete:
            for _ in range(CAS_RETRIES):
                try:
                    named.set_cursor(name, key, None, named.record(name).version)
                    break
                except MetadataVersionError:
                    continue  # another change to the record won: read it again
            else:
                raise click.ClickException(f"named ledger {name!r}: the record kept changing; try again")
    pos = PositionCursor.decode(value)
    out: dict[str, Any] = {"name": name, "cursor": key, "value": value.decode("utf-8", "backslashreplace"),
                           "position": None if pos is None else pos.next_entry_id,
                           "retain": bool(pos is not None and pos.retain),
                           "lag": None if pos is None else max(0, info.last_entry_id + 1 - pos.next_entry_id),
                           "deleted": delete}
    if as_json:
        emit_json(out)
    else:
        emit_kv(out, title=f"{name}: cursor {key}" + (" (deleted)" if delete else ""))
