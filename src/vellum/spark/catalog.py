"""What a read selects and where its entries live: ledgers or named ledgers, bounds and spans.

Responsibility: on the driver (planner workers and the streaming source runner), resolve the
selection of a read (ledger ids, a name, names or a name pattern) into *keys* (a ledger id as a
string, or a name), the readable bounds of each key, and the *spans* that cover an entry range
of a key: pieces of one ledger each, so that an executor reads plain ledgers.

Invariants:
- nothing here fences: ledgers are opened with ``recovery=False`` (a reader never disturbs a
  live writer); the readable end of an open ledger is its LAC + 1, of a closed one its last
  entry + 1;
- entry ids of a named ledger are its global ids (continuous across segments and writers);
  a span maps them back to the segment's ledger with ``local = global - base``;
- a key that vanished (deleted ledger or name) yields ``None`` bounds: callers decide between
  failing (``failOnDataLoss``) and skipping, always with a ``[LEDGER_DATA_LOSS]`` message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from vellum.client.blocking import BookKeeper, LedgerHandle
from vellum.errors import NoSuchLedgerError
from vellum.spark.loss import DELETED, SHRUNK, Loss
from vellum.spark.options import ReadOptions


class DataLossError(RuntimeError):
    """Entries a query needs are gone; the message starts with ``[LEDGER_DATA_LOSS]`` and names
    every fact of :attr:`loss` (the row ``failOnDataLoss=false`` would record)."""

    def __init__(self, loss: Loss) -> None:
        self.loss = loss
        super().__init__(
            f"[LEDGER_DATA_LOSS] {loss.describe()}. Set the option failOnDataLoss=false to skip lost data "
            "with a warning instead of failing (and dataLossLocation to record each lost range as a row)."
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (DataLossError, (self.loss,))  # rebuilt from the loss, not from the message


@dataclass(frozen=True)
class Bounds:
    """Readable entries of a key: ``[first, end)``; ``avg_entry_bytes`` estimates payload sizes."""

    first: int
    end: int
    avg_entry_bytes: int = 1024


@dataclass(frozen=True)
class Span:
    """Global entries ``[first, last]`` of a key stored in one ledger at ``local = global - base``."""

    ledger_id: int
    base: int
    first: int
    last: int
    password: bytes = field(repr=False)  # never in a log line or error message


def _avg(length: int, entries: int) -> int:
    return max(1, length // entries) if entries > 0 and length > 0 else 1024


class LedgerCatalog:
    """Ledger mode: keys are the ids given in ``ledgers``; bounds from metadata and the LAC."""

    def __init__(self, opts: ReadOptions, bk: BookKeeper) -> None:
        assert opts.ledger_ids is not None
        self._opts = opts
        self._bk = bk
        # Reader handles are kept so later LAC refreshes are one quorum read, not an open.
        self._handles: dict[int, LedgerHandle] = {}

    def list_keys(self) -> list[str]:
        assert self._opts.ledger_ids is not None
        return [str(i) for i in self._opts.ledger_ids]

    def bounds(self, key: str, *, refresh: bool = True) -> Bounds | None:
        lid = int(key)
        try:
            h = self._handles.get(lid)
            if h is None:
                md = self._bk.ledger_metadata(lid)
                if md.is_closed:
                    return Bounds(0, md.last_entry_id + 1, _avg(md.length, md.last_entry_id + 1))
                h = self._bk.open_ledger(lid, password=self._opts.password, recovery=False)
                self._handles[lid] = h
            elif refresh and not h.is_closed:
                h.read_last_add_confirmed()
                if not self._bk.ledger_exists(lid):
                    raise NoSuchLedgerError(f"ledger {lid} was deleted")
        except NoSuchLedgerError:
            self._handles.pop(lid, None)
            return None
        lac = h.last_add_confirmed
        return Bounds(0, lac + 1, _avg(h.length, lac + 1))

    def spans(self, key: str, first: int, end: int) -> list[Span]:
        if end <= first:
            return []
        return [Span(int(key), 0, first, end - 1, self._opts.password)]

    def custom_metadata(self, key: str) -> dict[str, bytes]:
        return dict(self._bk.ledger_metadata(int(key)).custom_metadata)


class NamedCatalog:
    """Named-ledger mode: keys are names; spans follow the name record's segments."""

    def __init__(self, opts: ReadOptions, bk: BookKeeper) -> None:
        from vellum.spark import names  # only named mode needs the named-ledger client

        self._opts = opts
        self._bk = bk
        self._names = names.NameReader(bk)
        self._pattern = re.compile(opts.name_pattern) if opts.name_pattern else None

    def list_keys(self) -> list[str]:
        if self._pattern is None:
            assert self._opts.names is not None
            return list(self._opts.names)
        return [n for n in self._names.list_names() if self._pattern.fullmatch(n)]

    def bounds(self, key: str, *, refresh: bool = True) -> Bounds | None:
        view = self._names.view(key)
        if view is None:
            return None
        return Bounds(view.start_entry_id, view.end, view.avg_entry_bytes)

    def spans(self, key: str, first: int, end: int) -> list[Span]:
        if end <= first:
            return []
        view = self._names.view(key)
        if view is None:
            raise DataLossError(Loss(key, None, first, end - 1, DELETED, "the named ledger was deleted"))
        if first < view.start_entry_id:
            # Below the start the entries are invisible (shrunk), even while a segment still holds them.
            raise DataLossError(Loss(key, None, first, min(end, view.start_entry_id) - 1, SHRUNK,
                                     f"the first readable entry is now {view.start_entry_id}"))
        out: list[Span] = []
        for seg in view.segments:
            lo = max(first, seg.first_entry_id)
            hi = min(end - 1, seg.last_readable)
            if lo <= hi:
                out.append(Span(seg.ledger_id, seg.first_entry_id, lo, hi, view.password))
        covered = sum(s.last - s.first + 1 for s in out)
        if covered != end - first:
            raise DataLossError(Loss(key, None, first, end - 1, DELETED,
                                     f"not all in the named ledger's segments (found {covered} of {end - first})"))
        return out

    def custom_metadata(self, key: str) -> dict[str, bytes]:
        view = self._names.view(key)
        return dict(view.custom_metadata) if view is not None else {}


Catalog = LedgerCatalog | NamedCatalog


def catalog_for(opts: ReadOptions, bk: BookKeeper) -> Catalog:
    return LedgerCatalog(opts, bk) if opts.ledger_ids is not None else NamedCatalog(opts, bk)


def resolve_offset(value: Any, bounds: Bounds) -> int:
    """-2 / 'earliest' -> first readable, -1 / 'latest' -> end, else the entry id itself."""
    if value in (-2, "earliest"):
        return bounds.first
    if value in (-1, "latest"):
        return bounds.end
    return int(value)
