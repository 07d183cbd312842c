"""The ``vellum`` command: bookie, standalone, shell, config, bench, spark.

Each area registers its shell commands from its own module (``shell_<area>.py`` exposing
``register(shell)``) so that areas stay independent.
"""

from __future__ import annotations

import importlib

import click

from vellum.cli.output import emit_kv, emit_table
from vellum.config import ServerConfig, describe, load_server_config
from vellum.errors import VellumError

# Modules that add commands to the ``shell`` group (and optionally top-level commands).
_SHELL_MODULES = (
    "vellum.cli.shell_storage",
    "vellum.cli.shell_meta",
)
_TOP_MODULES = (
    "vellum.cli.run_commands",
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
def config_show(conf_file: str | None, as_json: bool) -> None:
    """Print the effective server configuration (file values over defaults)."""
    cfg: ServerConfig = load_server_config(conf_file)
    rows = describe(cfg)
    if as_json:
        emit_kv({key: value for key, _name, value, _default, _doc in rows}, as_json=True)
        return
    emit_table(
        ["key", "value", "default", "description"],
        [(key, value, "" if value == default else default, doc) for key, _n, value, default, doc in rows],
        title="effective configuration" + (f" ({conf_file})" if conf_file else " (defaults)"),
    )


for _name in _SHELL_MODULES:
    try:
        _mod = importlib.import_module(_name)
    except ModuleNotFoundError as _e:
        if _e.name != _name:
            raise
        continue
    _mod.register(shell)

for _name in _TOP_MODULES:
    try:
        _mod = importlib.import_module(_name)
    except ModuleNotFoundError as _e:
        if _e.name != _name:
            raise
        continue
    _mod.register(cli)


def main() -> None:
    try:
        cli(standalone_mode=True)
    except VellumError as e:
        click.echo(f"error: {e}", err=True)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
