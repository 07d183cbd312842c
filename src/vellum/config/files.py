"""Configuration from files and key/value maps: ``bk_server.conf``-style files (``key=value``
lines, ``#`` comments, lists comma-separated) and the rules for keys that are not settings of the
class being built. Every other key BookKeeper 4.16-4.18 defines is handled by ``config_keys``
(honoured through an alias, accepted as not used, or refused for values Vellum cannot honour); a
key of the other side (a client key in a bookie's file, or the reverse) is accepted; a key no
BookKeeper release defines is an error with a "did you mean" suggestion. Errors in a file name
the file, the line and the key. The only I/O is reading the file given."""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path
from typing import Any, TypeVar

from vellum import config_keys
from vellum.config.client import ClientConfig
from vellum.config.declare import convert
from vellum.config.server import ServerConfig
from vellum.errors import ConfigError

_T = TypeVar("_T")


def _keys_read_elsewhere(cls: type, reason: str) -> dict[str, str]:
    return {f.metadata["key"]: reason for f in dataclasses.fields(cls)}


#: Keys of the other configuration class, accepted in a file that serves both sides (a client
#: key in a bookie's file, or the reverse), as BookKeeper's files often do.
_OTHER_SIDE: dict[type, dict[str, str]] = {
    ServerConfig: _keys_read_elsewhere(ClientConfig, "client setting: read by Vellum's client, not by a bookie"),
    ClientConfig: _keys_read_elsewhere(ServerConfig, "bookie setting: read by a bookie, not by a client"),
}


def build_config(
    cls: type[_T],
    values: dict[str, Any],
    *,
    source: str = "",
    lines: dict[str, int] | None = None,
    accepted: dict[str, str] | None = None,
) -> _T:
    """Build ``cls`` from camelCase or snake_case keys. BookKeeper keys that are not settings
    are resolved (aliases), refused (``config_keys.REFUSED_WHEN``) or skipped; a skipped key
    goes to ``accepted`` (key -> reason) if given. A key no BookKeeper release defines raises
    with a suggestion. ``lines`` (key -> line number) makes errors name ``source:line``."""
    by_key: dict[str, str] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        by_key[f.name] = f.name
        by_key[f.metadata["key"]] = f.name

    def where(key: str | None = None) -> str:
        if not source:
            return ""
        line = (lines or {}).get(key or "")
        return f" in {source}:{line}" if line else f" in {source}"

    if any(k in values for k in config_keys.ALIASES) and "metadataServiceUri" in by_key:
        values = config_keys.resolve_aliases(values, where=source)
    kwargs: dict[str, Any] = {}
    for key, raw in values.items():
        name = by_key.get(key)
        if name is None:
            reason = config_keys.ACCEPTED.get(key) or _OTHER_SIDE.get(cls, {}).get(key)
            if reason is not None:
                config_keys.check_refused(key, str(raw), where=where(key).removeprefix(" in "))
                if accepted is not None:
                    accepted[key] = reason
                continue
            close = difflib.get_close_matches(key, list(by_key), n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"unknown configuration key {key!r}{where(key)}{hint}")
        try:
            kwargs[name] = convert(cls, name, key, raw)
        except ConfigError as e:
            raise ConfigError(f"{e}{where(key)}") from None
    try:
        return cls(**kwargs)
    except ConfigError as e:
        raise ConfigError(f"{e}{where()}") from None


def parse_conf_file(path: str | Path) -> dict[str, str]:
    """Read a ``bk_server.conf``-style file into raw key -> value strings."""
    return {k: v for k, (v, _line) in parse_conf_lines(path).items()}


def parse_conf_lines(path: str | Path) -> dict[str, tuple[str, int]]:
    """Read a ``bk_server.conf``-style file into key -> (raw value, line number). A key given
    twice, a line without ``=`` and a file that is not UTF-8 are errors naming the file and line."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read configuration file {p}: {e.strerror}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        bad_line = data.count(b"\n", 0, e.start) + 1
        raise ConfigError(
            f"{p}:{bad_line}: byte 0x{data[e.start]:02x} is not UTF-8 (the file is in another encoding); "
            "save it as UTF-8 (key names and values are ASCII in BookKeeper's files)"
        ) from None
    out: dict[str, tuple[str, int]] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#") or s.startswith("!"):
            continue
        if "=" not in s:
            raise ConfigError(f"{p}:{lineno}: expected key=value, got {s!r}")
        k, v = s.split("=", 1)
        k = k.strip()
        if k in out:
            raise ConfigError(
                f"{p}:{lineno}: {k} is given twice (first on line {out[k][1]}): keep one of them"
            )
        out[k] = (v.strip(), lineno)
    return out


def load_server_config(
    path: str | Path | None = None, *, accepted: dict[str, str] | None = None, **overrides: Any
) -> ServerConfig:
    """The server configuration from ``path`` (over the defaults) and ``overrides``; keys that
    BookKeeper defines but Vellum does not use go to ``accepted`` (key -> reason) if given."""
    parsed = parse_conf_lines(path) if path else {}
    values: dict[str, Any] = {k: v for k, (v, _line) in parsed.items()}
    values.update(overrides)
    return build_config(
        ServerConfig, values, source=str(path) if path else "",
        lines={k: line for k, (_v, line) in parsed.items()}, accepted=accepted,
    )


def load_client_config(path: str | Path, **overrides: Any) -> ClientConfig:
    """The client configuration from a ``key=value`` file (BookKeeper's client keys; bookie keys
    in the same file are accepted, as in a shared ``bk_server.conf``) and ``overrides``."""
    parsed = parse_conf_lines(path)
    values: dict[str, Any] = {k: v for k, (v, _line) in parsed.items()}
    values.update(overrides)
    return build_config(ClientConfig, values, source=str(path), lines={k: line for k, (_v, line) in parsed.items()})
