"""Cursor lag of named ledgers: how far each reader's cursor is behind its name's end, for the
name page and as Prometheus text (the console's ``/metrics``).

Responsibility: pure: from a name's record and its readable end, the lag of each cursor, and
the exposition text of every name's lags. No I/O: ``cluster.py`` reads records and LACs.

Invariants:
- a lag is never negative and never guessed: only a *position cursor*
  (:class:`~vellum.client.named_record.PositionCursor`, e.g. a Spark stream's ``cursorName``)
  has one in ``/metrics``; an opaque cursor (a sink's batch id, an application's marker) has none;
- the page also reads a cursor holding a plain integer as the id of the last entry read
  (what applications stored before position cursors existed);
- ``end`` is the id after the last readable entry (the open segment's LAC + 1); when the open
  segment's bookies cannot be asked it is unknown (None) and no lag is exported for that name.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from vellum.client.named_record import NamedLedgerRecord, PositionCursor


@dataclass(frozen=True)
class CursorLag:
    cursor: str
    position: int  # the next entry the reader will read
    retain: bool  # a shrink refuses to pass it
    lag: int | None  # entries from the position to the name's end; None when the end is unknown


@dataclass(frozen=True)
class NameLag:
    name: str
    segments: int
    end: int | None  # the id after the last readable entry; None when unknown
    cursors: tuple[CursorLag, ...]


def position_cursors(rec: NamedLedgerRecord) -> dict[str, PositionCursor]:
    """The record's position cursors by key (opaque cursors left out)."""
    out = {}
    for key, value in sorted(rec.cursors.items()):
        pos = PositionCursor.decode(value)
        if pos is not None:
            out[key] = pos
    return out


def name_lag(rec: NamedLedgerRecord, end: int | None) -> NameLag:
    cursors = tuple(CursorLag(k, p.next_entry_id, p.retain, None if end is None else max(0, end - p.next_entry_id))
                    for k, p in position_cursors(rec).items())
    return NameLag(rec.name, len(rec.segments), end, cursors)


def cursor_lag(value: bytes, last_entry_id: int) -> int | None:
    """Entries behind the last entry: a position cursor's, or a plain integer's (the id of the
    last entry read); None for any other cursor."""
    pos = PositionCursor.decode(value)
    if pos is not None:
        return max(0, last_entry_id + 1 - pos.next_entry_id)
    text = value.decode("utf-8", "replace").strip()
    if text.lstrip("-").isdigit():
        return max(0, last_entry_id - int(text))
    return None


class _Families(Collector):
    def __init__(self, families: Sequence[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        yield from self._families


def metrics_text(names: Iterable[NameLag]) -> bytes:
    """Prometheus exposition text of every name's segments, end and cursor lags."""
    segments = GaugeMetricFamily("vellum_named_ledger_segments", "Segments (ledgers) in the named ledger's record",
                                 labels=["name"])
    end = GaugeMetricFamily("vellum_named_ledger_end_entry_id",
                            "The id after the named ledger's last readable entry (LAC + 1 of its open segment)",
                            labels=["name"])
    position = GaugeMetricFamily("vellum_named_ledger_cursor_position",
                                 "The next entry id a position cursor's reader will read", labels=["name", "cursor"])
    lag = GaugeMetricFamily("vellum_named_ledger_cursor_lag_entries",
                            "Entries between a position cursor and the named ledger's end", labels=["name", "cursor"])
    retain = GaugeMetricFamily("vellum_named_ledger_cursor_retain",
                               "1 if a shrink refuses to move the start past this cursor", labels=["name", "cursor"])
    for n in names:
        segments.add_metric([n.name], n.segments)
        if n.end is not None:
            end.add_metric([n.name], n.end)
        for c in n.cursors:
            position.add_metric([n.name, c.cursor], c.position)
            retain.add_metric([n.name, c.cursor], 1 if c.retain else 0)
            if c.lag is not None:
                lag.add_metric([n.name, c.cursor], c.lag)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families([segments, end, position, lag, retain]))
    return generate_latest(registry)
