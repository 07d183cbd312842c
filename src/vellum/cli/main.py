"""The ``vellum`` command: bookie, standalone, shell, config, bench, spark, security, console.

Each area registers its commands from its own module (``shell_<area>.py`` exposing
``register(shell)``, ``cmd_<name>.py`` exposing ``register(cli)``) so that areas stay
independent. The areas are imported and registered by name below, so that readers, linters
and the type checker see every command module: a new area is one import and one call.
"""

from __future__ import annotations

import click

from vellum.cli import (
    cmd_bench,
    cmd_console,
    cmd_run,
    cmd_security,
    cmd_spark,
    cmd_verify,
    shell_bookie,
    shell_client,
    shell_gc,
    shell_journal,
    shell_meta,
    shell_names,
    shell_recovery,
    shell_storage,
)
from vellum.cli.client_options import client_conf_option
from vellum.cli.output import emit_json, emit_table
from vellum.config import ServerConfig, describe, load_server_config, parse_conf_file
from vellum.errors import VellumError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="vellum")
def cli() -> None:
    """Vellum: a distributed, replicated, durable log store (BookKeeper's design)."""


@cli.group()
@client_conf_option
def shell() -> None:
    """Admin and inspection commands."""


@cli.group()
def config() -> None:
    """Configuration."""


@config.command("show")
@click.option("--conf", "conf_file", type=click.Path(dir_okay=False), help="bk_server.conf-style file")
@click.option("--diff", "only_diff", is_flag=True, help="only what the file changes: values off their default, "
              "and the BookKeeper keys Vellum accepts without using")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.option("--markdown", is_flag=True, help="a Markdown table (used for docs/operations.md)")
def config_show(conf_file: str | None, only_diff: bool, as_json: bool, markdown: bool) -> None:
    """Print the effective server configuration and what each key of the file does: honoured
    (Vellum uses it), accepted (a BookKeeper key Vellum does not use, with the reason) or default."""
    accepted: dict[str, str] = {}
    cfg: ServerConfig = load_server_config(conf_file, accepted=accepted)
    raw = parse_conf_file(conf_file) if conf_file else {}
    rows = describe(cfg)
    if markdown:
        click.echo("| key | default | description |\n|---|---|---|")
        for key, _n, _value, default, doc in rows:
            shown = ",".join(default) if isinstance(default, tuple) else default
            click.echo(f"| `{key}` | `{shown}` | {doc} |")
        return
    table: list[tuple[str, str, object, object, str]] = []
    for key, _n, value, default, doc in rows:
        status = "honoured" if value != default or key in raw else "default"
        if only_diff and value == default:
            continue
        table.append((key, status, value, "" if value == default else default, doc))
    for key, reason in sorted(accepted.items()):
        table.append((key, "accepted, not used", raw.get(key, ""), "", reason))
    if as_json:
        emit_json([{"key": k, "status": st, "value": v, "default": d, "description": doc}
                   for k, st, v, d, doc in table])
        return
    emit_table(
        ["key", "status", "value", "default", "description"], table,
        title="effective configuration" + (f" ({conf_file})" if conf_file else " (defaults)")
        + (": differences only" if only_diff else ""),
    )


shell_bookie.register(shell)
shell_client.register(shell)
shell_gc.register(shell)
shell_journal.register(shell)
shell_meta.register(shell)
shell_names.register(shell)
shell_recovery.register(shell)
shell_storage.register(shell)

cmd_bench.register(cli)
cmd_console.register(cli)
cmd_run.register(cli)
cmd_security.register(cli)
cmd_spark.register(cli)
cmd_verify.register(cli)


def main() -> None:
    try:
        cli(standalone_mode=True)
    except VellumError as e:
        click.echo(f"error: {e}", err=True)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
