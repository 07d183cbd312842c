"""``vellum console``: the operator console, a web view of the cluster (docs/console.md)."""

from __future__ import annotations

import logging
import os

import click

from vellum.cli.client_options import client_conf_flag, load_client_config_file
from vellum.config import DEFAULT_METADATA_URI


def register(cli: click.Group) -> None:
    cli.add_command(console)


@click.command()
@click.option("--metadata", "metadata_uri", default=lambda: os.environ.get("VELLUM_METADATA_URI") or DEFAULT_METADATA_URI,
              show_default="$VELLUM_METADATA_URI or " + DEFAULT_METADATA_URI,
              help="metadataServiceUri of the cluster (zk://..., sqlite:///path)")
@click.option("--port", default=8090, show_default=True, help="HTTP port of the console (0: any free port)")
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on")
@click.option("--admin-token-file", envvar="VELLUM_ADMIN_TOKEN_FILE", type=click.Path(dir_okay=False, exists=True),
              default=None,
              help="a token with the admin role (`vellum security issue-token`): enables the actions (GC, "
                   "compaction, re-replication switch, decommission), sent to the bookies' admin HTTP API")
@click.option("--refresh", "refresh_s", default=5.0, show_default=True, help="seconds between page refreshes")
@client_conf_flag("for reading the bookies (ledger pages) and the metadata store")
@click.option("--http-ca-file", envvar="VELLUM_HTTP_CA_FILE", type=click.Path(dir_okay=False, exists=True),
              default=None,
              help="CA certificate(s), PEM, of bookies whose admin HTTP API is https (httpServerTlsEnable)")
@click.option("--token-secret-file", type=click.Path(dir_okay=False, exists=True), default=None,
              help="HS256 secret that verifies login tokens (the bookies' tokenSecretKeyFile): every page needs a "
                   "login")
@click.option("--token-public-key-file", type=click.Path(dir_okay=False, exists=True), default=None,
              help="RS256/ES256 public key or certificate that verifies login tokens (the bookies' "
                   "tokenPublicKeyFile): every page needs a login")
@click.option("--public-name", "public_names", multiple=True,
              help="a name (host or host:port) users reach the console by, besides the address it listens on; "
                   "requests naming any other host are refused (DNS rebinding). Repeatable")
@click.option("--tls-cert-file", type=click.Path(dir_okay=False, exists=True), default=None,
              help="serve https with this certificate (PEM; the key in it or in --tls-key-file)")
@click.option("--tls-key-file", type=click.Path(dir_okay=False, exists=True), default=None,
              help="private key (PEM) of --tls-cert-file")
@click.option("--tls-client-ca-file", type=click.Path(dir_okay=False, exists=True), default=None,
              help="with https: a client certificate from this CA with the admin role is a login")
@click.option("--session-hours", default=8.0, show_default=True,
              help="hours a login lasts at most (a token's own expiry ends it sooner)")
@click.option("-v", "--verbose", is_flag=True)
def console(metadata_uri: str, port: int, host: str, admin_token_file: str | None, refresh_s: float,
            client_conf: str | None, http_ca_file: str | None, token_secret_file: str | None,
            token_public_key_file: str | None, public_names: tuple[str, ...], tls_cert_file: str | None,
            tls_key_file: str | None, tls_client_ca_file: str | None, session_hours: float, verbose: bool) -> None:
    """Serve the operator console until Ctrl-C: cluster, ledgers, named ledgers, storage & GC,
    recovery. Read-only unless --admin-token-file is given. With a token key (or a client CA)
    every page needs a login; without one it serves only on a loopback address when it holds an
    admin token (docs/console.md, "Who may use the console")."""
    from vellum.console.cluster import ConsoleSettings
    from vellum.console.server import read_admin_token, run_console
    from vellum.errors import ConfigError

    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = ConsoleSettings(
            metadata_uri=metadata_uri, admin_token=read_admin_token(admin_token_file),
            refresh_s=max(1.0, refresh_s), sample_interval_s=max(1.0, min(refresh_s, 5.0)),
            client_config=load_client_config_file(client_conf),
            http_ca_file=http_ca_file or "",
            token_secret_file=token_secret_file or "", token_public_key_file=token_public_key_file or "",
            public_names=public_names, tls_cert_file=tls_cert_file or "", tls_key_file=tls_key_file or "",
            tls_client_ca_file=tls_client_ca_file or "", session_ttl_s=max(60.0, session_hours * 3600),
        )
        code = run_console(settings, host=host, port=port)
    except ConfigError as e:
        raise click.ClickException(str(e)) from None
    raise SystemExit(code)
