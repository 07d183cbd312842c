"""Data loss seen by the ``vellum`` source: one description of a lost range, and its rows on disk.

Responsibility: :class:`Loss` names what a read lost (name, ledger, first..last entry, reason) and
gives the one sentence used both in the ``[LEDGER_DATA_LOSS]`` log line (``failOnDataLoss=false``)
and in the error (``true``); :func:`write_losses` appends a task's losses as JSON lines under the
``dataLossLocation`` directory; :func:`read_losses` reads them back for ``vellum spark
loss-report`` (docs/spark.md, "Data loss as rows").

Invariants:
- writers never share a file: every call creates a new file named after the task attempt plus a
  random suffix, written under a hidden name (``.<name>.tmp``) and renamed when complete, so a
  reader sees whole files only (readers skip names starting with ``.`` or ``_``, as Spark does);
- a retried task attempt or a replayed micro-batch may write the same loss again: a row's
  identity is (name, ledgerId, firstEntry, lastEntry, reason, queryId, batchId), and the report
  counts distinct rows;
- ``firstEntry`` / ``lastEntry`` are null where the read cannot know them (a ledger deleted
  before the read saw its bounds), never guessed.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vellum.spark.options import OptionError

#: reasons (the ``reason`` column); docs/spark.md explains each
MISSING = "missing"          # the ledger / name does not exist when the read planned it
DELETED = "deleted"          # deleted while the read (or the stream) was reading it
GAP = "gap"                  # entries inside a ledger that no bookie has
SHRUNK = "shrunk"            # below a name's new start, at a position the stream had reached
BEFORE_START = "beforeStart"  # startingOffsets asks for entries below the first readable one
TRUNCATED = "truncated"      # fewer entries than the stream already read (ledger or name replaced)
REASONS = (MISSING, DELETED, GAP, SHRUNK, BEFORE_START, TRUNCATED)

#: row columns, in file and report order
COLUMNS = ("time", "name", "ledgerId", "firstEntry", "lastEntry", "reason", "detail",
           "queryId", "queryName", "batchId")
_IDENTITY = ("name", "ledgerId", "firstEntry", "lastEntry", "reason", "queryId", "batchId")


@dataclass(frozen=True)
class Loss:
    """Entries ``first..last`` (None: unknown) of a named ledger and/or ledger that a read lost."""

    name: str | None
    ledger_id: int | None
    first: int | None
    last: int | None
    reason: str
    detail: str = ""
    at: float = field(default_factory=time.time, compare=False)

    def describe(self) -> str:
        """The sentence of the log line and of the error: every fact of the row."""
        subject = ", ".join(s for s in (
            f"named ledger {self.name!r}" if self.name is not None else "",
            f"ledger {self.ledger_id}" if self.ledger_id is not None else "") if s)
        if self.first is None:
            span = "all entries"
        elif self.last is None:
            span = f"entries from {self.first} on"
        else:
            span = f"entries {self.first}..{self.last}"
        detail = f": {self.detail}" if self.detail else ""
        return f"{subject}: {span} lost ({self.reason}{detail})"


@dataclass(frozen=True)
class TaskIds:
    """Where a loss was recorded: the streaming query and micro-batch (None in a batch read) and
    the task attempt (for the file name only)."""

    query_id: str | None = None
    query_name: str | None = None
    batch_id: int | None = None
    stage: int = 0
    partition: int = 0
    attempt: int = 0


def task_ids() -> TaskIds:
    """The running task's ids from its ``TaskContext`` (local properties of the query's thread)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return TaskIds()
    query_id = ctx.getLocalProperty("sql.streaming.queryId") or None
    batch = ctx.getLocalProperty("streaming.sql.batchId")
    # A micro-batch's job description is "<query name>\nid = ...\nrunId = ...\nbatch = ..."
    # (the first line is empty for an unnamed query).
    desc = ctx.getLocalProperty("spark.job.description") or ""
    query_name = (desc.split("\n", 1)[0].strip() or None) if query_id and "\nid = " in desc else None
    return TaskIds(query_id, query_name, int(batch) if batch not in (None, "") else None,
                   ctx.stageId(), ctx.partitionId(), ctx.attemptNumber())


def row(loss: Loss, ids: TaskIds) -> dict[str, Any]:
    when = datetime.datetime.fromtimestamp(loss.at, datetime.UTC)
    return {
        "time": when.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "name": loss.name, "ledgerId": loss.ledger_id, "firstEntry": loss.first, "lastEntry": loss.last,
        "reason": loss.reason, "detail": loss.detail,
        "queryId": ids.query_id, "queryName": ids.query_name, "batchId": ids.batch_id,
    }


def check_location(location: str) -> None:
    """Create the directory (planning time, so a bad path fails ``load()``, not a task)."""
    try:
        os.makedirs(location, exist_ok=True)
    except OSError as exc:
        raise OptionError(f"option dataLossLocation: cannot create directory {location!r}: {exc}") from None
    if not os.access(location, os.W_OK | os.X_OK):
        raise OptionError(f"option dataLossLocation: directory {location!r} is not writable")


def write_losses(location: str, losses: Iterable[Loss], ids: TaskIds) -> Path | None:
    """One new file of JSON lines for these losses (None if there are none)."""
    rows = [row(x, ids) for x in losses]
    if not rows:
        return None
    directory = Path(location)
    directory.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S%fZ")
    who = ids.query_id or socket.gethostname()
    name = (f"loss-{stamp}-{who}-b{'' if ids.batch_id is None else ids.batch_id}-s{ids.stage}"
            f"-p{ids.partition}-a{ids.attempt}-{uuid.uuid4().hex[:12]}.jsonl")
    tmp = directory / f".{name}.tmp"
    with open(tmp, "x", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, sort_keys=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
    final = directory / name
    os.replace(tmp, final)
    return final


class LossFileError(ValueError):
    """A file under the location that is not made of loss rows (names the file and line)."""


def read_losses(location: str) -> list[dict[str, Any]]:
    """Distinct rows under ``location``, oldest first (a row seen twice keeps its first time)."""
    directory = Path(location)
    if not directory.is_dir():
        raise FileNotFoundError(f"{location}: no such directory (the dataLossLocation of a read)")
    seen: dict[tuple[Any, ...], dict[str, Any]] = {}
    for path in sorted(directory.rglob("*.jsonl")):
        if any(part.startswith((".", "_")) for part in path.relative_to(directory).parts):
            continue
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    r = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise LossFileError(f"{path}:{lineno}: not a JSON line ({exc})") from None
                if not isinstance(r, dict) or any(c not in r for c in (*_IDENTITY, "time")):
                    raise LossFileError(f"{path}:{lineno}: not a loss row (needs the columns {', '.join(COLUMNS)})")
                key = tuple(r[c] for c in _IDENTITY)
                if key not in seen or r["time"] < seen[key]["time"]:
                    seen[key] = {c: r.get(c) for c in COLUMNS}
    return sorted(seen.values(), key=lambda r: (r["time"], str(r["name"]), r["ledgerId"] or -1,
                                                r["firstEntry"] if r["firstEntry"] is not None else -1))
