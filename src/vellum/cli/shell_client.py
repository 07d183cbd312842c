"""Shell commands that go through the client: simpletest, readledger, recover."""

from __future__ import annotations

import time
from typing import Any

import click
from rich.progress import Progress

from vellum.cli.client_options import metadata_uri_option, open_shell_store, shell_client_config
from vellum.cli.output import emit_json, emit_kv, emit_table

_uri_option = metadata_uri_option()


def register(shell: click.Group) -> None:
    shell.add_command(racks)
    shell.add_command(simpletest)
    shell.add_command(readledger)
    shell.add_command(recover)


@click.command()
@_uri_option
@click.option("-e", "--ensemble", default=3, show_default=True)
@click.option("-w", "--write-quorum", default=2, show_default=True)
@click.option("-a", "--ack-quorum", default=2, show_default=True)
@click.option("-n", "--entries", default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def simpletest(uri: str, ensemble: int, write_quorum: int, ack_quorum: int, entries: int, as_json: bool) -> None:
    """Create a ledger, write N entries, read them back, verify, close. A test refused midway
    (too few writable bookies, read-only bookies, ...) closes and deletes the ledger it made."""
    from vellum.client.blocking import BookKeeper
    from vellum.errors import VellumError

    t0 = time.perf_counter()
    with BookKeeper(uri, config=shell_client_config()) as bk:
        try:
            lh = bk.create_ledger(ensemble_size=ensemble, write_quorum_size=write_quorum,
                                  ack_quorum_size=ack_quorum)
        except VellumError as e:
            raise click.ClickException(f"simpletest refused: cannot create a ledger: {e}") from None
        try:
            payloads = [f"simpletest entry {i} ".encode() * 4 for i in range(entries)]
            futures = [lh.append_async(p) for p in payloads]
            for i, f in enumerate(futures):
                got = f.result()
                if got != i:
                    raise click.ClickException(f"entry {i} was given id {got}")
            written = time.perf_counter() - t0
            back = lh.read(0, entries - 1) if entries else []
            bad = [e.entry_id for e, p in zip(back, payloads) if e.payload != p]
            lh.close()
            md = bk.ledger_metadata(lh.ledger_id)
        except (VellumError, click.ClickException) as e:
            raise click.ClickException(f"simpletest failed on ledger {lh.ledger_id}: {e}; "
                                       + _discard(bk, lh)) from None
    result = {
        "ledgerId": lh.ledger_id,
        "entriesWritten": entries,
        "entriesVerified": len(back) - len(bad),
        "mismatched": bad,
        "ensemble": list(md.last_ensemble),
        "state": md.state.name,
        "writeSeconds": round(written, 3),
    }
    if as_json:
        emit_json(result)
    else:
        emit_kv(result, title="simpletest")
    if bad or len(back) != entries:
        raise click.ClickException(f"{len(bad)} entries read back differ")


def _discard(bk: Any, lh: Any) -> str:
    """Close and delete simpletest's ledger after a failure; what became of it (a sentence)."""
    import logging

    from vellum.errors import VellumError

    log = logging.getLogger(__name__)
    try:
        lh.close()
    except VellumError as e:  # its bookies refused: the delete below still removes it
        log.info("simpletest: closing ledger %d after the failure: %s", lh.ledger_id, e)
    try:
        bk.delete_ledger(lh.ledger_id)
    except VellumError as e:
        log.warning("simpletest: deleting ledger %d after the failure: %s", lh.ledger_id, e)
        return (f"the ledger could not be deleted ({e}): delete it with "
                f"`vellum shell deleteledger {lh.ledger_id}`")
    return "the ledger it created was deleted"


@click.command()
@_uri_option
@click.argument("ledger_id", type=int)
@click.argument("first", type=int, required=False, default=0)
@click.argument("last", type=int, required=False, default=-1)
@click.option("--password", default="", help="ledger password")
@click.option("--show-payload", is_flag=True, help="print payloads (hex beyond printable text)")
@click.option("--json", "as_json", is_flag=True)
def readledger(uri: str, ledger_id: int, first: int, last: int, password: str, show_payload: bool,
               as_json: bool) -> None:
    """Read entries FIRST..LAST (default: all up to the LAC) without recovering the ledger.

    Packed entries (Spark sink, ``vellum.entryFormat=rows-v1``) show their row count, and with
    ``--payload`` their rows separated by `` | ``."""
    from vellum.client.blocking import BookKeeper
    from vellum.format.records import is_packed, unpack

    with BookKeeper(uri, config=shell_client_config()) as bk:
        lh = bk.open_ledger(ledger_id, password=password.encode(), recovery=False)
        packed = is_packed(lh.metadata.custom_metadata)
        lac = lh.last_add_confirmed
        end = lac if last < 0 else min(last, lac)
        rows = []
        with Progress(transient=True, disable=as_json) as progress:
            task = progress.add_task("reading", total=max(0, end - first + 1))
            step = 500
            for start in range(first, end + 1, step):
                for e in lh.read(start, min(end, start + step - 1)):
                    payload = e.payload
                    parts = unpack(payload, where=f"ledger {ledger_id} entry {e.entry_id}") if packed else [payload]
                    shown = " | ".join(p.decode("utf-8", "backslashreplace") for p in parts) if show_payload else ""
                    rows.append((e.entry_id, len(payload), len(parts), shown[:200]))
                progress.advance(task, min(step, end - start + 1))
    if as_json:
        emit_json([{"entryId": r[0], "size": r[1], **({"rows": r[2]} if packed else {}),
                    **({"payload": r[3]} if show_payload else {})} for r in rows])
        return
    cols = ["entry", "size"] + (["rows"] if packed else []) + (["payload"] if show_payload else [])
    table = [(r[0], r[1]) + ((r[2],) if packed else ()) + ((r[3],) if show_payload else ()) for r in rows]
    emit_table(cols, table, title=f"ledger {ledger_id}: entries {first}..{end} (LAC {lac})"
               + (", packed rows-v1" if packed else ""))


@click.command()
@_uri_option
@click.argument("ledger_id", type=int)
@click.option("--password", default="", help="ledger password")
@click.option("--json", "as_json", is_flag=True)
def recover(uri: str, ledger_id: int, password: str, as_json: bool) -> None:
    """Open a ledger with recovery: fence its last ensemble, recover the tail, close it."""
    from vellum.client.blocking import BookKeeper

    with BookKeeper(uri, config=shell_client_config()) as bk:
        lh = bk.open_ledger(ledger_id, password=password.encode(), recovery=True)
        md = bk.ledger_metadata(ledger_id)
    result = {"ledgerId": ledger_id, "state": md.state.name, "lastEntryId": md.last_entry_id, "length": md.length,
              "lastAddConfirmed": lh.last_add_confirmed}
    if as_json:
        emit_json(result)
    else:
        emit_kv(result, title=f"ledger {ledger_id} recovered")


@click.command()
@_uri_option
@click.option("--set", "assignments", multiple=True, metavar="BOOKIE=/LOCATION",
              help="put a bookie at a network location: /rack, /zone/upgradedomain or /region/rack")
@click.option("--file", "mapping_file", type=click.Path(exists=True, dir_okay=False),
              help="replace the whole mapping by a file of 'bookie_id /rack' lines")
@click.option("--json", "as_json", is_flag=True)
def racks(uri: str, assignments: tuple[str, ...], mapping_file: str | None, as_json: bool) -> None:
    """Show or change the bookie -> network location mapping kept in the metadata store (read by
    the rack-, zone- and region-aware policies of clients and bookies when no
    networkTopologyScriptFileName is set; docs/operations.md, "Placement")."""
    from vellum.client.bookkeeper import RACK_MAPPING_KEY
    from vellum.client.placement import load_rack_mapping, parse_rack_mapping
    from vellum.errors import ConfigError, MetadataVersionError
    with open_shell_store(uri) as store:
        for _attempt in range(10):
            record = store.kv.get(RACK_MAPPING_KEY)
            mapping = parse_rack_mapping(record.value.decode(), source=RACK_MAPPING_KEY) if record else {}
            if not assignments and not mapping_file:
                break
            if mapping_file:
                mapping = load_rack_mapping(mapping_file)
            for item in assignments:
                bookie, sep, rack = item.partition("=")
                if not sep or not rack.startswith("/"):
                    raise ConfigError(f"--set expects BOOKIE=/rack, got {item!r}")
                mapping[bookie] = rack
            text = "".join(f"{b} {r}\n" for b, r in sorted(mapping.items())).encode()
            try:
                if record is None:
                    store.kv.create(RACK_MAPPING_KEY, text)
                else:
                    store.kv.cas(RACK_MAPPING_KEY, text, record.version)
                break
            except MetadataVersionError:
                continue  # changed by someone else meanwhile: re-read and apply again
    emit_table(["bookie", "rack"], sorted(mapping.items()), title="bookie racks", as_json=as_json)
