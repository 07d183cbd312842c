"""How a configuration key is declared, checked and read: the machinery every key group and
configuration class of ``vellum.config`` shares.

A key is a dataclass field made by ``opt`` (BookKeeper's camelCase name, default, description,
range or choices, secret or not); ``validate_ranges`` checks every field against its declaration,
``convert`` turns a file's text into the field's type with an error naming the key, and
``describe`` lists the keys for ``vellum config show``. No I/O.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import field
from typing import Any, get_type_hints

from vellum.errors import ConfigError


def opt(
    key: str,
    default: Any,
    doc: str,
    *,
    lo: float | None = None,
    hi: float | None = None,
    choices: tuple[str, ...] | None = None,
    secret: bool = False,
) -> Any:
    """A setting; a ``secret`` one (a password, a token) is never shown: not in ``repr`` nor
    by ``describe`` (``vellum config show``)."""
    meta = {"key": key, "doc": doc, "lo": lo, "hi": hi, "choices": choices, "secret": secret}
    if isinstance(default, list):
        default = tuple(default)
    return field(default=default, metadata=meta, repr=not secret)


def validate_ranges(obj: Any) -> None:
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        lo, hi, choices = f.metadata.get("lo"), f.metadata.get("hi"), f.metadata.get("choices")
        key = f.metadata.get("key", f.name)
        if lo is not None and value < lo:
            raise ConfigError(f"{key}={value} is below its minimum {lo}")
        if hi is not None and value > hi:
            raise ConfigError(f"{key}={value} is above its maximum {hi}")
        if choices is not None and value not in choices:
            raise ConfigError(f"{key}={value!r} is not one of {', '.join(choices)}")


_UNIT = re.compile(r"^\s*-?[0-9][0-9_.,]*\s*[A-Za-z%]+\s*$")


def convert(cls: type, name: str, key: str, raw: Any) -> Any:
    hint = get_type_hints(cls)[name]
    if not isinstance(raw, str):
        if hint is tuple[str, ...] and isinstance(raw, (list, tuple)):
            return tuple(str(x) for x in raw)
        return raw
    text = raw.strip()
    try:
        if hint is bool:
            low = text.lower()
            if low in ("true", "yes", "1", "on"):
                return True
            if low in ("false", "no", "0", "off"):
                return False
            raise ValueError(text)
        if hint is int:
            return int(float(text)) if "e" in text.lower() else int(text)
        if hint is float:
            return float(text)
        if hint == tuple[str, ...]:
            return tuple(p.strip() for p in text.split(",") if p.strip())
    except ValueError:
        kind = getattr(hint, "__name__", hint)
        if hint in (int, float) and _UNIT.match(text):
            raise ConfigError(
                f"{key}={raw!r} is not a valid {kind}: write a plain number, without a unit or "
                "separators (the unit is part of the key's name, e.g. journalMaxSizeMB, flushInterval in ms)"
            ) from None
        raise ConfigError(f"{key}={raw!r} is not a valid {kind}") from None
    return text


def describe(config: Any) -> list[tuple[str, str, Any, Any, str]]:
    """Rows (key, field name, value, default, doc) for ``vellum config show``."""
    rows = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.metadata.get("secret") and value:
            value = "(set, not shown)"
        rows.append((f.metadata["key"], f.name, value, f.default, f.metadata["doc"]))
    return rows
