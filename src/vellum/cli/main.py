"""The ``vellum`` command: bookie, standalone, shell, config, bench, spark.

Each area registers its commands from its own module (``shell_<area>.py`` exposing
``register(shell)``, ``cmd_<name>.py`` exposing ``register(cli)``) so that areas stay
independent. The areas are imported and registered by name below, so that readers, linters
and the type checker see every command module: a new area is one import and one call.
"""

from __future__ import annotations

import click

from vellum.cli import (
    cmd_bench,
    cmd_run,
    cmd_spark,
    shell_bookie,
    shell_client,
    shell_gc,
    shell_journal,
    shell_meta,
    shell_names,
    shell_storage,
)
from vellum.cli.output import emit_kv, emit_table
from vellum.config import ServerConfig, describe, load_server_config
from vellum.errors import VellumError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="vellum")
def cli() -> None:
    """Vellum: a distributed, replicated, durable log store (BookKeeper's design)."""


@cli.group()
def shell() -> None:
    """Admin and inspection commands."""


@cli.group()
def config() -> None:
    """Configuration."""


@config.command("show")
@click.option("--conf", "conf_file", type=click.Path(dir_okay=False), help="bk_server.conf-style file")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.option("--markdown", is_flag=True, help="a Markdown table (used for docs/operations.md)")
def config_show(conf_file: str | None, as_json: bool, markdown: bool) -> None:
    """Print the effective server configuration (file values over defaults)."""
    cfg: ServerConfig = load_server_config(conf_file)
    rows = describe(cfg)
    if markdown:
        click.echo("| key | default | description |\n|---|---|---|")
        for key, _n, _value, default, doc in rows:
            shown = ",".join(default) if isinstance(default, tuple) else default
            click.echo(f"| `{key}` | `{shown}` | {doc} |")
        return
    if as_json:
        emit_kv({key: value for key, _name, value, _default, _doc in rows}, as_json=True)
        return
    emit_table(
        ["key", "value", "default", "description"],
        [(key, value, "" if value == default else default, doc) for key, _n, value, default, doc in rows],
        title="effective configuration" + (f" ({conf_file})" if conf_file else " (defaults)"),
    )


shell_bookie.register(shell)
shell_client.register(shell)
shell_gc.register(shell)
shell_journal.register(shell)
shell_meta.register(shell)
shell_names.register(shell)
shell_storage.register(shell)

cmd_bench.register(cli)
cmd_run.register(cli)
cmd_spark.register(cli)


def main() -> None:
    try:
        cli(standalone_mode=True)
    except VellumError as e:
        click.echo(f"error: {e}", err=True)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
