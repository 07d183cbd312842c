"""The ``vellum`` command: bookie, standalone, shell, config, bench, spark.

Each area registers its shell commands from its own module (``shell_<area>.py`` exposing
``register(shell)``) so that areas stay independent.
"""

from __future__ import annotations

import importlib
import pkgutil

import click

from vellum.cli.output import emit_kv, emit_table
from vellum.config import ServerConfig, describe, load_server_config
from vellum.errors import VellumError


def _area_modules(prefix: str) -> list[str]:
    """Modules of this package named ``<prefix>*``: each exposes ``register(group)``."""
    import vellum.cli as package

    return sorted(
        f"vellum.cli.{m.name}" for m in pkgutil.iter_modules(package.__path__) if m.name.startswith(prefix)
    )


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


for _name in _area_modules("shell_"):
    importlib.import_module(_name).register(shell)

for _name in _area_modules("cmd_"):
    importlib.import_module(_name).register(cli)


def main() -> None:
    try:
        cli(standalone_mode=True)
    except VellumError as e:
        click.echo(f"error: {e}", err=True)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
