"""Process logging: structured lines (key=value or JSON) carrying the bookie, ledger and entry
a line is about, per-module levels, a size-rotated file, or an operator's own configuration.

Convention for every log call about a ledger or an entry: pass the ids as ``extra``::

    log.warning("add refused: ledger fenced", extra={"ledger_id": lid, "entry_id": eid})

The formatters print each known context attribute present on a record (``CONTEXT``:
``bookie_id`` -> ``bookie``, ``ledger_id`` -> ``ledger``, ``entry_id`` -> ``entry``,
``peer`` -> ``peer``); ``BookieIdFilter`` puts the process's bookie id on every record that
has none, so each line of a bookie process names its bookie.

Formats (``logFormat``): ``logfmt`` (default)::

    ts=2026-01-02T03:04:05.678Z level=WARNING logger=vellum.bookie.bookie msg="add refused" bookie=127.0.0.1:3181 ledger=7 entry=3

``json``: one object per line with the same keys (``exc`` holds a traceback); ``text``: the
plain format of earlier releases (``<time> <LEVEL> <logger>: <message>``, context appended).

Invariants: ``configure`` replaces the root logger's handlers (calling it twice leaves one set);
a bad level, module spec or configuration file is a ``ConfigError`` naming the key and what to
write instead. Only stdlib and ``vellum.errors``: every layer may log through it.
"""

from __future__ import annotations

import datetime
import json
import logging
import logging.config
import logging.handlers
import sys
from pathlib import Path
from typing import Any, TextIO

from vellum.errors import ConfigError

#: record attribute -> the key it is printed under
CONTEXT: dict[str, str] = {"bookie_id": "bookie", "ledger_id": "ledger", "entry_id": "entry", "peer": "peer"}
FORMATS = ("logfmt", "json", "text")
LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG")


def _timestamp(record: logging.LogRecord) -> str:
    ts = datetime.datetime.fromtimestamp(record.created, tz=datetime.UTC)
    return ts.strftime("%Y-%m-%dT%H:%M:%S.") + f"{int(record.msecs):03d}Z"


def context_of(record: logging.LogRecord) -> dict[str, Any]:
    """The known context attributes present on ``record``, under their printed keys."""
    out: dict[str, Any] = {}
    for attr, key in CONTEXT.items():
        value = getattr(record, attr, None)
        if value is not None:
            out[key] = value if isinstance(value, (int, float)) else str(value)
    return out


def _fields(formatter: logging.Formatter, record: logging.LogRecord) -> dict[str, Any]:
    """What a structured line carries, in order: ``ts``, ``level``, ``logger``, ``msg``, the context
    keys present, and ``exc`` (the traceback) when the record carries one."""
    fields: dict[str, Any] = {"ts": _timestamp(record), "level": record.levelname, "logger": record.name,
                              "msg": record.getMessage(), **context_of(record)}
    if record.exc_info:
        fields["exc"] = formatter.formatException(record.exc_info)
    elif record.exc_text:
        fields["exc"] = record.exc_text
    return fields


def _logfmt_value(value: Any) -> str:
    text = str(value)
    if text and not any(c in text for c in ' ="\\\n\r\t'):
        return text
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return f'"{escaped}"'


class LogfmtFormatter(logging.Formatter):
    """``ts=... level=... logger=... msg="..." bookie=... ledger=... entry=...`` on one line
    (a traceback goes in ``exc``, newlines escaped, so a line is always one record)."""

    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{k}={_logfmt_value(v)}" for k, v in _fields(self, record).items())


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``logger``, ``msg``, the context keys
    present, and ``exc`` (the traceback) when the record carries one."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_fields(self, record), default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """The plain format of earlier releases, with the context keys appended in brackets."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        ctx = context_of(record)
        if not ctx:
            return line
        head, sep, tail = line.partition("\n")
        return head + " [" + " ".join(f"{k}={v}" for k, v in ctx.items()) + "]" + sep + tail


def formatter(fmt: str) -> logging.Formatter:
    if fmt == "logfmt":
        return LogfmtFormatter()
    if fmt == "json":
        return JsonFormatter()
    if fmt == "text":
        return TextFormatter()
    raise ConfigError(f"logFormat={fmt!r} is not one of {', '.join(FORMATS)}")


class BookieIdFilter(logging.Filter):
    """Puts ``bookie_id`` on every record that has none (a handler filter, so records of every
    logger passing the handler get it; an operator's ``logConfigFile`` may name it as
    ``{"()": "vellum.logs.BookieIdFilter"}`` and it then takes the id set by ``configure``)."""

    #: the id of this process's bookie, set by ``configure``
    process_bookie_id: str | None = None

    def __init__(self, bookie_id: str | None = None) -> None:
        super().__init__()
        self._bookie_id = bookie_id

    def filter(self, record: logging.LogRecord) -> bool:
        bookie_id = self._bookie_id or BookieIdFilter.process_bookie_id
        if bookie_id and getattr(record, "bookie_id", None) is None:
            record.bookie_id = bookie_id
        return True


def parse_levels(spec: str, *, key: str = "logLevels") -> dict[str, int]:
    """``"INFO,vellum.storage=DEBUG,vellum.client=WARNING"`` -> ``{"": INFO, "vellum.storage": DEBUG,
    ...}``; a bare level is the root's. A bad entry raises ``ConfigError`` naming it."""
    out: dict[str, int] = {}
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        name, sep, level = part.rpartition("=")
        name = name.strip() if sep else ""
        level = level.strip().upper()
        if level == "WARN":
            level = "WARNING"
        if level not in LEVELS:
            raise ConfigError(
                f"{key}: {part!r} has level {level or '(none)'!r}; write module=LEVEL entries separated by commas "
                f"(e.g. {key}=vellum.storage=DEBUG,vellum.client=WARNING), LEVEL one of {', '.join(LEVELS)}"
            )
        if sep and not name:
            raise ConfigError(f"{key}: {part!r} names no module before '='; write module=LEVEL, or LEVEL alone "
                              "for every module")
        out[name] = getattr(logging, level)
    return out


def load_config_file(path: str, *, key: str = "logConfigFile") -> dict[str, Any]:
    """The ``logging.config.dictConfig`` dictionary of a JSON file, checked to be one."""
    p = Path(path)
    if p.suffix.lower() != ".json":
        raise ConfigError(f"{key}={path}: Vellum reads a logging.config.dictConfig dictionary from a .json file; "
                          "write the configuration as JSON (docs/operations.md, Logs)")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"{key}={path}: cannot read it: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{key}={path}:{e.lineno}: not valid JSON: {e.msg}") from None
    if not isinstance(data, dict) or data.get("version") != 1:
        raise ConfigError(f'{key}={path}: expected a dictConfig object with "version": 1')
    return data


def configure(
    *,
    fmt: str = "logfmt",
    levels: str = "",
    default_level: int = logging.INFO,
    file: str = "",
    max_size_mb: int = 100,
    backups: int = 10,
    config_file: str = "",
    bookie_id: str | None = None,
    stream: TextIO | None = None,
) -> None:
    """Set up the process's logging: ``config_file`` (a dictConfig JSON) if given, else one
    handler (``file`` rotated at ``max_size_mb`` keeping ``backups`` old files, or ``stream`` /
    stderr) with the ``fmt`` formatter; then the ``levels`` over ``default_level``; then the
    bookie id filter on every root handler."""
    BookieIdFilter.process_bookie_id = bookie_id
    parsed = parse_levels(levels)
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
        h.close()
    if config_file:
        data = load_config_file(config_file)
        # dictConfig's own default would silence every logger imported before it (all of
        # Vellum's): keep them unless the file says otherwise.
        data.setdefault("disable_existing_loggers", False)
        try:
            logging.config.dictConfig(data)
        except (ValueError, TypeError, AttributeError, ImportError) as e:
            raise ConfigError(f"logConfigFile={config_file}: logging.config.dictConfig refused it: {e}") from None
    else:
        handler: logging.Handler
        if file:
            Path(file).parent.mkdir(parents=True, exist_ok=True)
            handler = logging.handlers.RotatingFileHandler(
                file, maxBytes=max_size_mb * 1024 * 1024, backupCount=backups, encoding="utf-8")
        else:
            handler = logging.StreamHandler(stream or sys.stderr)
        handler.setFormatter(formatter(fmt))
        root.addHandler(handler)
        root.setLevel(default_level)
    for name, level in parsed.items():
        logging.getLogger(name or None).setLevel(level)
    for h in root.handlers:
        if not any(isinstance(f, BookieIdFilter) for f in h.filters):
            h.addFilter(BookieIdFilter())

