"""cli/main.py imports every command area by name (no loading by name at run time): each
``shell_*`` / ``cmd_*`` module of the package is imported plainly and registered."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import click

import vellum.cli
from vellum.cli import main

AREAS = sorted(m.name for m in pkgutil.iter_modules(vellum.cli.__path__) if m.name.startswith(("shell_", "cmd_")))


def test_every_area_module_is_registered() -> None:
    assert AREAS, "the cli package has command areas"
    for name in AREAS:
        module = importlib.import_module(f"vellum.cli.{name}")
        probe = click.Group()
        module.register(probe)
        registered = main.shell if name.startswith("shell_") else main.cli
        assert probe.commands, name
        for command_name in probe.commands:
            assert command_name in registered.commands, f"{name}: {command_name} not registered"


def test_areas_are_imported_plainly() -> None:
    source = Path(main.__file__).read_text()
    tree = ast.parse(source)
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and node.module == "vellum.cli" for alias in node.names}
    assert set(AREAS) <= imported
    assert "importlib" not in source and "pkgutil" not in source
