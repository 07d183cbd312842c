"""Output helpers shared by every CLI command: readable tables by default, JSON for scripts."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table


def _jsonable(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_jsonable(v) for v in value]
    return value


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(_jsonable(data), indent=2, sort_keys=False) + "\n")


def emit_table(
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    title: str | None = None,
    as_json: bool = False,
) -> None:
    """Print rows as a table, or as a JSON list of objects keyed by column name."""
    rows = list(rows)
    if as_json:
        emit_json([dict(zip(columns, row)) for row in rows])
        return
    table = Table(title=title, show_lines=False)
    for col in columns:
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(*("" if v is None else str(v) for v in row))
    Console(width=max(100, Console().width)).print(table)


def emit_kv(data: dict[str, Any], *, title: str | None = None, as_json: bool = False) -> None:
    """Print one record as a two-column table, or as a JSON object."""
    if as_json:
        emit_json(data)
        return
    emit_table(["field", "value"], data.items(), title=title)
