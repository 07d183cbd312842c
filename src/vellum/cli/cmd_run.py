"""``vellum bookie`` and ``vellum standalone``: the long-running processes."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import click

from vellum import logs
from vellum.config import ServerConfig, load_server_config

if TYPE_CHECKING:
    from vellum.console.server import ConsoleThread
    from vellum.standalone import Standalone, StandaloneSecurity


def register(cli: click.Group) -> None:
    cli.add_command(bookie)
    cli.add_command(autorecovery)
    cli.add_command(standalone)


def _logging(verbose: bool, config: ServerConfig | None = None, *, bookie_id: str | None = None) -> None:
    """The process's logging from the log keys of its file (``logFormat``, ``logLevels``,
    ``logFile``..., docs/operations.md, Logs); before the file is read, the defaults on stderr.
    ``bookie_id`` goes on every line (the bookie id filter)."""
    cfg = config or ServerConfig()
    logs.configure(fmt=cfg.log_format, levels=cfg.log_levels, default_level=logging.DEBUG if verbose else logging.INFO,
                   file=cfg.log_file, max_size_mb=cfg.log_file_max_size_mb, backups=cfg.log_file_backups,
                   config_file=cfg.log_config_file, bookie_id=bookie_id)


@click.command()
@click.option("--conf", "conf_file", type=click.Path(dir_okay=False, exists=True), help="bk_server.conf")
@click.option("--metadata-uri", default=None, help="overrides metadataServiceUri")
@click.option("-v", "--verbose", is_flag=True)
def bookie(conf_file: str | None, metadata_uri: str | None, verbose: bool) -> None:
    """Run one bookie until SIGTERM or Ctrl-C (clean shutdown: flush, checkpoint, deregister)."""
    from vellum.service import bookie_id_of, run_bookie

    _logging(verbose)
    accepted: dict[str, str] = {}
    config = load_server_config(conf_file, accepted=accepted)
    _logging(verbose, config, bookie_id=str(bookie_id_of(config, config.bookie_port)))
    _say_accepted(conf_file, accepted)
    raise SystemExit(run_bookie(config, metadata_uri=metadata_uri))


@click.command()
@click.option("--conf", "conf_file", type=click.Path(dir_okay=False, exists=True),
              help="bk_server.conf (AutoRecovery keys, metadataServiceUri)")
@click.option("--metadata-uri", default=None, help="overrides metadataServiceUri")
@click.option("--id", "worker_id", default=None, help="name in the auditor election and the locks "
              "(default: the bookie id of the configuration)")
@click.option("-v", "--verbose", is_flag=True)
def autorecovery(conf_file: str | None, metadata_uri: str | None, worker_id: str | None, verbose: bool) -> None:
    """Run an auditor candidate and a replication worker outside any bookie, until SIGTERM or
    Ctrl-C (BookKeeper's `bookkeeper autorecovery`)."""
    from vellum.service import run_autorecovery

    _logging(verbose)
    accepted: dict[str, str] = {}
    config = load_server_config(conf_file, accepted=accepted)
    _logging(verbose, config)
    _say_accepted(conf_file, accepted)
    raise SystemExit(run_autorecovery(config, metadata_uri=metadata_uri, worker_id=worker_id))


@click.command()
@click.option("--bookies", default=3, show_default=True, help="number of bookie processes")
@click.option("--data-dir", default="data/standalone", show_default=True, type=click.Path(file_okay=False))
@click.option("--port-base", default=3181, show_default=True, help="bookie i listens on port-base + i")
@click.option("--http-port-base", default=8080, show_default=True, help="admin HTTP of bookie i on this + i")
@click.option("--metrics-port-base", default=8000, show_default=True,
              help="metrics port (prometheusStatsHttpPort, loopback) of bookie i on this + i; 0: any free port")
@click.option("--metadata-uri", default=None, help="default: sqlite:///<data-dir>/metadata.db")
@click.option("--tls", is_flag=True, help="secured: mutual TLS, authentication and authorization on the bookie "
              "ports, https and admin tokens on the admin HTTP (certificates made once under <data-dir>/security)")
@click.option("--console-port", default=8090, show_default=True,
              help="port of the operator console (vellum console) started with the bookies; 0: any free port")
@click.option("--no-console", is_flag=True, help="do not start the operator console")
def standalone(bookies: int, data_dir: str, port_base: int, http_port_base: int, metrics_port_base: int,
               metadata_uri: str | None, tls: bool, console_port: int, no_console: bool) -> None:
    """Run N bookies with the embedded metadata store on this machine, until Ctrl-C."""
    from vellum.standalone import Standalone

    _logging(False)
    cluster = Standalone(Path(data_dir), bookies=bookies, port_base=port_base, http_port_base=http_port_base,
                         metrics_port_base=metrics_port_base, metadata_uri=metadata_uri, tls=tls)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    click.echo(f"starting {bookies} bookies in {cluster.data_dir} ...")
    console = None
    try:
        cluster.start()
        if not no_console:
            console = _start_console(cluster, console_port)
        click.echo("")
        click.echo("Vellum standalone is running.")
        click.echo(f"  metadata:  {cluster.metadata_uri}")
        if console is not None:
            click.echo(f"  console:   {console.url}/   (operator console: cluster, ledgers, storage & GC, recovery)")
            if cluster.security is not None:
                click.echo(f"             log in with the token in {cluster.security.admin_token}")
        scheme = "https" if cluster.security else "http"
        for spec in cluster.specs:
            click.echo(f"  bookie {spec.index}:  {spec.bookie_id}   admin {scheme}://127.0.0.1:{spec.http_port}"
                       f"/api/v1/bookie/info   log {spec.base / 'bookie.log'}")
            if spec.metrics_port:
                click.echo(f"             metrics http://127.0.0.1:{spec.metrics_port}/metrics")
        click.echo("")
        e = min(3, bookies)
        create = (f"  lh = bk.create_ledger(ensemble_size={e}, write_quorum_size={min(2, e)}, "
                  f"ack_quorum_size={min(2, e)})")
        if cluster.security is None:
            click.echo("Connect from Python:")
            click.echo("  import vellum")
            click.echo(f"  bk = vellum.BookKeeper({cluster.metadata_uri!r})")
            click.echo(create)
            click.echo("  lh.append(b'hello'); lh.close()")
            click.echo(f"Or try: vellum shell simpletest --uri {cluster.metadata_uri}")
        else:
            _say_how_to_connect_securely(cluster.metadata_uri, cluster.security, cluster.specs[0].http_port, create)
        click.echo("Press Ctrl-C to stop.")
        while not stop.wait(1.0):
            for i, proc in cluster.procs.items():
                if proc.poll() is not None:
                    click.echo(f"bookie {i} exited with code {proc.returncode}; see its log", err=True)
                    stop.set()
    finally:
        if console is not None:
            console.stop()
        click.echo("stopping bookies ...")
        cluster.stop()
        click.echo("stopped.")


def _start_console(cluster: Standalone, port: int) -> ConsoleThread | None:
    """The operator console on ``port`` (docs/console.md), with the admin token and the CA of a
    secured cluster; a console that cannot start is reported, the bookies run on."""
    from vellum.config import ClientConfig, load_client_config
    from vellum.console.cluster import ConsoleSettings
    from vellum.console.server import ConsoleThread, read_admin_token

    sec = cluster.security
    settings = ConsoleSettings(
        cluster.metadata_uri,
        admin_token=read_admin_token(sec.admin_token) if sec is not None else None,
        client_config=load_client_config(sec.client_conf) if sec is not None else ClientConfig(),
        http_ca_file=str(sec.ca) if sec is not None else "",
        # a secured cluster's console asks for a login: the admin token in admin.token is one
        token_secret_file=str(sec.token_secret) if sec is not None else "",
    )
    console = ConsoleThread(settings, port=port)
    try:
        console.start()
    except Exception as e:  # a busy port must not stop the bookies
        console.stop()
        click.echo(f"the operator console did not start on port {port}: {e} (use --console-port)", err=True)
        return None
    return console


def _say_how_to_connect_securely(uri: str, security: StandaloneSecurity, http_port: int, create: str) -> None:
    click.echo(f"Secured: mutual TLS only, clients need a certificate from {security.ca}")
    click.echo("with the role client, bookie or admin (or a token with one: bookieAuthProviderFactoryClass=tls,token).")
    click.echo(f"Client configuration (these keys, also in {security.client_conf}):")
    for key, value in security.client_keys().items():
        click.echo(f"  {key}={value}")
    click.echo("Connect from Python:")
    click.echo("  import vellum")
    click.echo("  from vellum.config import load_client_config")
    click.echo(f"  bk = vellum.BookKeeper({uri!r}, config=load_client_config({str(security.client_conf)!r}))")
    click.echo(create)
    click.echo("  lh.append(b'hello'); lh.close()")
    click.echo(f"Or try: vellum shell --client-conf {security.client_conf} simpletest --uri {uri}")
    click.echo("Spark: .option('bookkeeper.<key>', <value>) for each key above (bookkeeper.tlsTrustStore, ...)")
    click.echo(f"Admin HTTP (https; mutating calls need the admin token in {security.admin_token}, renewed at each "
               "start):")
    # -H @file: curl reads the header from the file, so the token never is in an argv (ps)
    click.echo(f"  curl --cacert {security.ca} -H @{security.admin_header} "
               f"-X PUT https://127.0.0.1:{http_port}/api/v1/bookie/gc")


def _say_accepted(conf_file: str | None, accepted: dict[str, str]) -> None:
    """List once, at start, the BookKeeper keys of the file that Vellum accepts without using."""
    if not accepted:
        return
    by_reason: dict[str, list[str]] = {}
    for key, reason in accepted.items():
        by_reason.setdefault(reason, []).append(key)
    log = logging.getLogger("vellum.config")
    log.info("%s: %d BookKeeper keys accepted, not used:", conf_file, len(accepted))
    for reason, keys in by_reason.items():
        log.info("  accepted, not used: %s (%s)", ", ".join(sorted(keys)), reason)
