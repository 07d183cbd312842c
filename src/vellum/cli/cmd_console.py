"""``vellum console``: the operator console, a web view of the cluster (docs/console.md)."""

from __future__ import annotations

import logging
import os

import click

from vellum.config import DEFAULT_METADATA_URI


def register(cli: click.Group) -> None:
    cli.add_command(console)


@click.command()
@click.option("--metadata", "metadata_uri", default=lambda: os.environ.get("VELLUM_METADATA_URI") or DEFAULT_METADATA_URI,
              show_default="$VELLUM_METADATA_URI or " + DEFAULT_METADATA_URI,
              help="metadataServiceUri of the cluster (zk://..., sqlite:///path)")
@click.option("--port", default=8090, show_default=True, help="HTTP port of the console (0: any free port)")
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on")
@click.option("--admin-token-file", type=click.Path(dir_okay=False, exists=True), default=None,
              help="a token with the admin role (`vellum security issue-token`): enables the actions (GC, "
                   "compaction, re-replication switch, decommission), sent to the bookies' admin HTTP API")
@click.option("--refresh", "refresh_s", default=5.0, show_default=True, help="seconds between page refreshes")
@click.option("--client-conf", type=click.Path(dir_okay=False, exists=True), default=None,
              help="client settings (TLS, token) for reading the bookies (ledger pages)")
@click.option("--http-ca-file", type=click.Path(dir_okay=False, exists=True), default=None,
              help="CA certificate(s), PEM, of bookies whose admin HTTP API is https (httpServerTlsEnable)")
@click.option("-v", "--verbose", is_flag=True)
def console(metadata_uri: str, port: int, host: str, admin_token_file: str | None, refresh_s: float,
            client_conf: str | None, http_ca_file: str | None, verbose: bool) -> None:
    """Serve the operator console until Ctrl-C: cluster, ledgers, named ledgers, storage & GC,
    recovery. Read-only unless --admin-token-file is given."""
    from vellum.config import ClientConfig, load_client_config
    from vellum.console.cluster import ConsoleSettings
    from vellum.console.server import read_admin_token, run_console

    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = ConsoleSettings(
        metadata_uri=metadata_uri, admin_token=read_admin_token(admin_token_file),
        refresh_s=max(1.0, refresh_s), sample_interval_s=max(1.0, min(refresh_s, 5.0)),
        client_config=load_client_config(client_conf) if client_conf else ClientConfig(),
        http_ca_file=http_ca_file or "",
    )
    raise SystemExit(run_console(settings, host=host, port=port))
