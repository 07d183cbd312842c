"""Metadata shell commands: metaformat, listledgers, ledgermetadata, listbookies, deleteledger, clusterinfo,
cookie_get, cookie_delete.

Each command opens the store named by ``--uri`` (default: $VELLUM_METADATA_URI, else
the standalone store ``sqlite:///./data/standalone/metadata.db``), prints a readable table (``--json`` for scripts) and closes
the store, so its session (if any) ends with the command.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable
from typing import Any

import click

from vellum.cli.client_options import metadata_uri_option, open_shell_store
from vellum.cli.output import emit_kv, emit_table
from vellum.errors import CookieError
from vellum.format.cookie import Cookie
from vellum.ids import BookieId, LedgerId
from vellum.meta import MetadataStore

_uri_option = metadata_uri_option("metadataServiceUri (zk://, zk+flat://, zk+hierarchical://, sqlite:///path)")


def _json_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--json", "as_json", is_flag=True, help="machine-readable output")(fn)


def _open(uri: str) -> MetadataStore:
    if uri.startswith("sqlite:///./"):
        os.makedirs(os.path.dirname(uri[len("sqlite:///"):]) or ".", exist_ok=True)
    return open_shell_store(uri)


def register(shell: click.Group) -> None:
    @shell.command("metaformat")
    @_uri_option
    @click.option("--ledger-manager", type=click.Choice(["hierarchical", "longhierarchical", "flat"]), default=None,
                  help="ledger layout (default: the URI's, else hierarchical)")
    @click.option("--force", is_flag=True, help="wipe existing metadata first")
    @_json_option
    def metaformat(uri: str, ledger_manager: str | None, force: bool, as_json: bool) -> None:
        """Initialise a cluster's metadata: paths, layout and a new instance id."""
        with _open(uri) as store:
            instance_id = store.format(ledger_manager, force=force)
            layout = store.layout.read_layout()
            emit_kv({"uri": uri, "instanceId": instance_id,
                     "layout": layout.factory_class if layout else None}, title="formatted", as_json=as_json)

    @shell.command("listledgers")
    @_uri_option
    @click.option("--limit", type=int, default=100, show_default=True, help="at most this many ids (0 = all)")
    @click.option("--start-after", type=int, default=None, help="list ids greater than this")
    @_json_option
    def listledgers(uri: str, limit: int, start_after: int | None, as_json: bool) -> None:
        """List ledger ids in ascending order, a page at a time."""
        with _open(uri) as store:
            ids: list[int] = []
            for lid in store.ledgers.iter_ledger_ids(None if start_after is None else LedgerId(start_after)):
                ids.append(lid)
                if limit and len(ids) >= limit:
                    break
            if as_json:
                emit_kv({"ledgers": ids, "next_start_after": ids[-1] if limit and len(ids) >= limit else None},
                        as_json=True)
            else:
                emit_table(["ledger id"], [(i,) for i in ids], title=f"ledgers ({len(ids)} shown)")

    @shell.command("ledgermetadata")
    @_uri_option
    @click.argument("ledger_id", type=int)
    @_json_option
    def ledgermetadata(uri: str, ledger_id: int, as_json: bool) -> None:
        """Print one ledger's metadata and version."""
        with _open(uri) as store:
            v = store.ledgers.read_ledger(LedgerId(ledger_id))
            md = v.value
            if as_json:
                emit_kv({"ledgerId": ledger_id, "version": v.version, **md.to_json_dict()}, as_json=True)
                return
            rows: dict[str, Any] = {
                "ledger id": ledger_id, "version": v.version, "state": md.state.name,
                "last entry id": md.last_entry_id, "length": md.length,
                "ensemble / write / ack": f"{md.ensemble_size} / {md.write_quorum_size} / {md.ack_quorum_size}",
                "digest": md.digest_type.name, "password (in clear, base64)": base64.b64encode(md.password).decode(),
                "ctime ms": md.ctime_ms, "creator token": md.creator_token,
            }
            for first, ens in md.ensembles.items():
                rows[f"ensemble @ entry {first}"] = ", ".join(ens)
            for k, val in md.custom_metadata.items():
                rows[f"custom {k}"] = val
            emit_kv(rows, title=f"ledger {ledger_id}")

    @shell.command("listbookies")
    @_uri_option
    @click.option("--readonly", is_flag=True, help="list read-only bookies instead of writable ones")
    @_json_option
    def listbookies(uri: str, readonly: bool, as_json: bool) -> None:
        """List registered (live) bookies."""
        with _open(uri) as store:
            ids = sorted(store.registration.list_bookies(read_only=readonly))
            kind = "read-only" if readonly else "writable"
            emit_table(["bookie id", "state"], [(b, kind) for b in ids], title=f"{kind} bookies ({len(ids)})",
                       as_json=as_json)

    @shell.command("deleteledger")
    @_uri_option
    @click.argument("ledger_id", type=int)
    @click.option("--yes", is_flag=True, help="do not ask for confirmation")
    def deleteledger(uri: str, ledger_id: int, yes: bool) -> None:
        """Delete a ledger's metadata (its entries are then garbage collected by the bookies)."""
        if not yes:
            click.confirm(f"delete ledger {ledger_id} from {uri}?", abort=True)
        with _open(uri) as store:
            store.ledgers.delete_ledger(LedgerId(ledger_id))
        click.echo(f"ledger {ledger_id} deleted")

    @shell.command("cookie_get")
    @_uri_option
    @click.argument("bookie_id")
    @_json_option
    def cookie_get(uri: str, bookie_id: str, as_json: bool) -> None:
        """Print the metadata store's copy of a bookie's cookie."""
        with _open(uri) as store:
            stored = store.registration.get_cookie(BookieId(bookie_id))
        if stored is None:
            raise click.ClickException(f"the metadata store {uri} holds no cookie for bookie {bookie_id}")
        try:
            c = Cookie.decode(stored.value, where=f"metadata cookie of {bookie_id}")
        except CookieError as e:
            raise click.ClickException(str(e)) from None
        emit_kv({"bookie_id": c.bookie_id, "journal_dirs": ", ".join(c.journal_dirs),
                 "ledger_dirs": ", ".join(c.ledger_dirs),
                 "index_dirs": ", ".join(c.index_dirs) if c.index_dirs else None,
                 "instance_id": c.instance_id, "layout_version": c.layout_version, "version": stored.version},
                title=f"stored cookie of {bookie_id}", as_json=as_json)

    @shell.command("cookie_delete")
    @_uri_option
    @click.argument("bookie_id")
    @click.option("--yes", is_flag=True, help="do not ask for confirmation")
    def cookie_delete(uri: str, bookie_id: str, yes: bool) -> None:
        """Remove the metadata store's copy of a bookie's cookie (BookKeeper's cookie_delete).

        Only for a bookie id that will rejoin with empty disks and never held data that is not
        elsewhere: with the copy gone, nothing stops a wiped bookie from rejoining."""
        if not yes:
            click.confirm(
                f"remove the stored cookie of {bookie_id} from {uri}? A bookie with wiped disks can "
                "then rejoin under this id", abort=True)
        with _open(uri) as store:
            if store.registration.get_cookie(BookieId(bookie_id)) is None:
                raise click.ClickException(f"the metadata store {uri} holds no cookie for bookie {bookie_id}")
            store.registration.remove_cookie(BookieId(bookie_id))
        click.echo(f"stored cookie of {bookie_id} removed")

    @shell.command("clusterinfo")
    @_uri_option
    @_json_option
    def clusterinfo(uri: str, as_json: bool) -> None:
        """Instance id, layout, bookie counts (down ones too) and the ledger count.

        ``totalBookies`` counts every bookie that joined the cluster (a cookie or a registration)
        and was not decommissioned; ``unavailableBookies`` those of them registered neither as
        writable nor as read-only: down, as ``/api/v1/bookie/cluster_info`` says."""
        with _open(uri) as store:
            info = store.cluster_info()
            emit_kv(
                {
                    "uri": uri,
                    "instanceId": info.instance_id,
                    "layout": info.layout.factory_class if info.layout else "none (not formatted)",
                    "totalBookies": info.total_bookies,
                    "writableBookies": info.writable_bookies,
                    "readOnlyBookies": info.read_only_bookies,
                    "unavailableBookies": info.unavailable_bookies,
                    "ledgers": info.ledger_count,
                    "auditor": store.underreplication.current_auditor() or "none",
                },
                title="cluster",
                as_json=as_json,
            )
