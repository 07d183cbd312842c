"""AutoRecovery shell commands (BookKeeper's names): listunderreplicated, whoisauditor,
triggeraudit, lostbookierecoverydelay, autorecovery (status|enable|disable), recoverbookie
(BookKeeper's ``recover <bookie>``), decommissionbookie, bookieformat, bookiesanity.

Each goes through ``admin/recovery_admin`` (the same use-cases as ``/api/v1/autorecovery/*``);
tables for people, ``--json`` for scripts, progress bars for the long ones.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from vellum.admin import recovery_admin as ra
from vellum.autorecovery.settings import AutoRecoverySettings
from vellum.cli.client_options import open_shell_store, shell_client_config
from vellum.cli.output import emit_json, emit_kv, emit_table
from vellum.config import DEFAULT_METADATA_URI, ServerConfig, load_server_config
from vellum.errors import VellumError
from vellum.ids import BookieId
from vellum.meta import MetadataStore


def _uri_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--uri",
        default=lambda: os.environ.get("VELLUM_METADATA_URI") or DEFAULT_METADATA_URI,
        show_default="$VELLUM_METADATA_URI or " + DEFAULT_METADATA_URI,
        help="metadataServiceUri",
    )(fn)


def _json_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--json", "as_json", is_flag=True, help="machine-readable output")(fn)


def _conf_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--conf", "conf_file", type=click.Path(dir_okay=False, exists=True), default=None,
                        help="bk_server.conf for the AutoRecovery keys (default: BookKeeper's defaults)")(fn)


def _config(conf_file: str | None) -> ServerConfig:
    return load_server_config(conf_file, accepted={})


def _store(uri: str) -> MetadataStore:
    try:
        return open_shell_store(uri)
    except VellumError as e:
        raise click.ClickException(str(e)) from None


def _progress_bar() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                    TimeElapsedColumn())


def register(shell: click.Group) -> None:
    for cmd in (listunderreplicated, whoisauditor, triggeraudit, lostbookierecoverydelay, autorecovery,
                recoverbookie, decommissionbookie, bookieformat, bookiesanity):
        shell.add_command(cmd)


@click.command()
@_uri_option
@click.option("--missingreplica", default=None, help="only ledgers missing this bookie")
@click.option("--excludingmissingreplica", default=None, help="leave out ledgers missing this bookie")
@_json_option
def listunderreplicated(uri: str, missingreplica: str | None, excludingmissingreplica: str | None,
                        as_json: bool) -> None:
    """Ledgers marked under-replicated, with their missing replicas, who works on them and, for
    those a replication worker cannot heal, why (no spare bookie, placement cannot be met)."""
    with _store(uri) as store:
        rows = ra.list_under_replicated(store, missing_replica=missingreplica,
                                        excluding_missing_replica=excludingmissingreplica)
    if as_json:
        emit_json([r.to_json() for r in rows])
        return
    emit_table(["ledger", "missing replicas", "marked (ms since epoch)", "locked by", "cannot heal"],
               [(r.ledger_id, ", ".join(r.missing_replicas), r.ctime_ms, r.locked_by or "",
                 r.cannot_heal.kind if r.cannot_heal else "") for r in rows],
               title=f"{len(rows)} under-replicated ledgers")
    for reason, count in ra.cannot_heal_reasons(rows):
        click.echo(f"{count} ledger{'s' if count > 1 else ''} cannot heal: {reason}")


@click.command()
@_uri_option
@_json_option
def whoisauditor(uri: str, as_json: bool) -> None:
    """The bookie (or autorecovery process) elected auditor."""
    with _store(uri) as store:
        auditor = ra.who_is_auditor(store)
    if as_json:
        emit_json({"auditor": auditor})
    else:
        click.echo(f"auditor: {auditor}" if auditor else "no auditor is elected (no AutoRecovery runs)")


@click.command()
@_uri_option
@_conf_option
def triggeraudit(uri: str, conf_file: str | None) -> None:
    """Make the auditor mark every lost bookie's ledgers now (ignoring the delay once)."""
    with _store(uri) as store:
        delay = ra.trigger_audit(store, _config(conf_file).lost_bookie_recovery_delay_s)
    click.echo(f"audit triggered (lostBookieRecoveryDelay stays {delay} s)")


@click.command()
@_uri_option
@_conf_option
@click.option("--set", "seconds", type=int, default=None, help="set the delay (seconds) for the whole cluster")
@_json_option
def lostbookierecoverydelay(uri: str, conf_file: str | None, seconds: int | None, as_json: bool) -> None:
    """Show or set how long a bookie must be gone before its ledgers are re-replicated."""
    with _store(uri) as store:
        if seconds is not None:
            try:
                ra.set_lost_bookie_recovery_delay(store, seconds)
            except ValueError as e:
                raise click.BadParameter(str(e), param_hint="--set") from None
        delay = ra.get_lost_bookie_recovery_delay(store, _config(conf_file).lost_bookie_recovery_delay_s)
    if as_json:
        emit_json({"delaySeconds": delay})
    else:
        click.echo(f"lostBookieRecoveryDelay: {delay} s")


@click.command()
@_uri_option
@click.argument("action", type=click.Choice(["status", "enable", "disable"]), default="status")
@_json_option
def autorecovery(uri: str, action: str, as_json: bool) -> None:
    """Show, enable or disable re-replication for the whole cluster (the auditor keeps marking)."""
    with _store(uri) as store:
        if action != "status":
            ra.set_enabled(store, action == "enable")
        state = ra.status_report(store)
    if as_json:
        emit_json(state)
    else:
        emit_kv({"re-replication": "enabled" if state["enabled"] else "disabled",
                 "auditor": state["auditorId"] or "none",
                 "under-replicated ledgers": "yes" if state["clusterUnderReplicated"] else "none",
                 "ledgers that cannot heal": state["ledgersThatCannotHeal"]},
                title="autorecovery")
        if state["ledgersThatCannotHeal"]:
            click.echo("`vellum shell listunderreplicated` says why")


@click.command()
@_uri_option
@_conf_option
@click.argument("bookies", nargs=-1, required=True)
@_json_option
def recoverbookie(uri: str, conf_file: str | None, bookies: tuple[str, ...], as_json: bool) -> None:
    """Re-replicate every ledger with a fragment on BOOKIES from this process (BookKeeper's
    `recover <bookie>`); open ledgers are fenced and closed first."""
    from vellum.client.bookkeeper import BookKeeper

    settings = AutoRecoverySettings.from_config(_config(conf_file))

    async def main(progress: Progress) -> dict[int, str]:
        task = progress.add_task("recovering ledgers", total=None)

        def say(_what: str, done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        async with BookKeeper(uri, config=shell_client_config()) as bk:
            return await ra.recover(bk, set(bookies), settings, progress=say)

    with _progress_bar() as progress:
        results = asyncio.run(main(progress))
    failed = {k: v for k, v in results.items() if v.startswith("failed")}
    if as_json:
        emit_json({"ledgers": {str(k): v for k, v in results.items()}})
    else:
        emit_table(["ledger", "outcome"], sorted(results.items()),
                   title=f"{len(results)} ledgers on {', '.join(bookies)}")
    if failed:
        raise click.ClickException(f"{len(failed)} ledgers could not be re-replicated; run the command again")


@click.command()
@_uri_option
@click.option("--bookieid", "bookie", required=True, help="the bookie to retire (shut it down first)")
@click.option("--timeout", type=float, default=3600.0, show_default=True, help="seconds to wait at most")
def decommissionbookie(uri: str, bookie: str, timeout: float) -> None:
    """Move every ledger off a bookie that was shut down, then delete its cookie. Replication
    workers (autoRecoveryDaemonEnabled or `vellum autorecovery`) do the copying."""
    from vellum.client.bookkeeper import BookKeeper

    async def main(progress: Progress) -> int:
        task = progress.add_task(f"moving ledgers off {bookie}", total=None)

        def say(_what: str, done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        async with BookKeeper(uri, config=shell_client_config()) as bk:
            return await ra.decommission(bk, bookie, timeout_s=timeout, progress=say)

    try:
        with _progress_bar() as progress:
            moved = asyncio.run(main(progress))
    except (VellumError, TimeoutError) as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"bookie {bookie} decommissioned: {moved} ledgers moved, cookie deleted")


@click.command()
@click.option("--conf", "conf_file", type=click.Path(dir_okay=False, exists=True), required=True,
              help="the bookie's bk_server.conf (its directories, id and metadataServiceUri)")
@click.option("--uri", default=None, help="metadataServiceUri (default: the one of --conf, as the bookie uses)")
@click.option("--delete-cookie", is_flag=True, help="also delete the bookie's cookie from the metadata store")
@click.option("--force", is_flag=True, help="do not ask")
def bookieformat(conf_file: str, uri: str | None, delete_cookie: bool, force: bool) -> None:
    """Wipe a stopped bookie's journal, ledger and index dirs (BookKeeper's bookieformat: each
    dir is emptied, a missing one created). Refused while the bookie runs (registered, or a
    process holds its directories' lock). The metadata store keeps its cookie, so the bookie
    is refused at its next start (its disks lost their data) until `--delete-cookie`, after
    which it starts as a new, empty bookie under its id: heal its ledgers first
    (decommissionbookie / recoverbookie), or start it with dataIntegrityChecking."""
    from vellum.client.metadata_security import open_configured_store
    from vellum.service import bookie_client_config, bookie_id_of, default_metadata_uri
    from vellum.storage.dirs import current_dir
    from vellum.storage.markers import LOCK_FILENAME, acquire_dir_locks

    cfg = _config(conf_file)
    bookie = bookie_id_of(cfg, cfg.bookie_port)
    uri = uri or default_metadata_uri(cfg)
    dirs = list(dict.fromkeys(Path(d) for d in (*cfg.journal_directories, *cfg.ledger_directories,
                                                 *cfg.effective_index_directories)))
    if not force:
        click.confirm(f"delete everything in {', '.join(map(str, dirs))} of bookie {bookie}?", abort=True)
    try:
        store = open_configured_store(uri, bookie_client_config(cfg, "bookieformat"))
    except VellumError as e:
        raise click.ClickException(f"cannot open the metadata store {uri}: {e}") from None
    with store:
        reg = store.registration
        if bookie in (reg.list_bookies() | reg.list_bookies(read_only=True)):
            raise click.ClickException(f"bookie {bookie} is running (registered in {uri}): stop it first")
        try:
            for d in dirs:  # a missing dir is created, as BookKeeper's format does
                d.mkdir(parents=True, exist_ok=True)
            locks = acquire_dir_locks(dirs)
        except OSError as e:
            raise click.ClickException(f"cannot create {e.filename}: {e.strerror}") from None
        except VellumError as e:
            raise click.ClickException(f"bookie {bookie} is running: {e}") from None
        try:
            for d in dirs:
                lock_file = current_dir(d) / LOCK_FILENAME  # held by us until the end: kept
                for child in d.iterdir():
                    if child == current_dir(d):
                        for inner in child.iterdir():
                            if inner != lock_file:
                                _remove(inner)
                    else:
                        _remove(child)
        finally:
            for lock in locks:
                lock.release()
        if delete_cookie and reg.get_cookie(BookieId(bookie)) is not None:
            reg.remove_cookie(BookieId(bookie))
    click.echo(f"bookie {bookie} formatted" + (" and its stored cookie deleted" if delete_cookie else
                                                "; its cookie stays in the metadata store (--delete-cookie)"))


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


@click.command()
@_uri_option
@click.option("--bookieid", "bookie", required=True, help="the bookie to test")
@click.option("-n", "--entries", default=10, show_default=True)
@_json_option
def bookiesanity(uri: str, bookie: str, entries: int, as_json: bool) -> None:
    """Write entries to a ledger on one bookie only, read them back, delete the ledger."""

    async def main() -> None:
        await ra.bookie_sanity(uri, bookie, entries, config=shell_client_config())

    try:
        asyncio.run(main())
    except VellumError as e:
        if as_json:
            emit_json({"bookie": bookie, "passed": False, "error": str(e)})
            raise SystemExit(1) from None
        raise click.ClickException(f"bookie {bookie} failed the sanity check: {e}") from None
    if as_json:
        emit_json({"bookie": bookie, "passed": True})
    else:
        click.echo(f"bookie {bookie} passed the sanity check ({entries} entries written and read back)")
