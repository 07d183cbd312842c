"""The reader's ``LedgerEntry`` objects: built slot by slot (``LedgerReader._to_ledger_entries``,
without the frozen dataclass's ``__init__``), they must be what ``LedgerEntry(...)`` makes, and
a reader of an open ledger still learns the LAC its entries carry."""

from __future__ import annotations

import dataclasses

import pytest

from vellum.client.ledger_reader import LedgerEntry, LedgerReader
from vellum.client.ledger_view import LedgerView
from vellum.format.entry import DigestManager, DigestType, Entry
from vellum.meta.api import Versioned
from vellum.meta.model import LedgerMetadata


def _reader(ledger_id: int) -> LedgerReader:
    md = LedgerMetadata(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2,
                        ensembles={0: ("b1:1", "b2:1", "b3:1")})
    view = LedgerView(ledger_id, Versioned(md, 0), DigestManager(ledger_id, DigestType.CRC32C))
    # only what _to_ledger_entries reads (the constructor wants a client context and a loop)
    reader = object.__new__(LedgerReader)
    reader.ledger_id = ledger_id
    reader._view = view
    reader._own_writer = None
    return reader


def test_entries_are_what_the_constructor_makes() -> None:
    reader = _reader(7)
    verified = [Entry(7, i, i - 1, 10 * i, b"p%d" % i) for i in range(4)]
    got = reader._to_ledger_entries(verified)
    expected = [LedgerEntry(7, e.entry_id, e.payload) for e in verified]
    assert got == expected
    names = [f.name for f in dataclasses.fields(LedgerEntry)]
    for g, x in zip(got, expected, strict=True):
        assert type(g) is LedgerEntry
        assert {n: getattr(g, n) for n in names} == {n: getattr(x, n) for n in names}  # every field set
        assert hash(g) == hash(x) and g.length == x.length
    assert reader._view.lac == 2  # the greatest LAC the entries carried


def test_entries_stay_frozen() -> None:
    (entry,) = _reader(1)._to_ledger_entries([Entry(1, 0, -1, 1, b"x")])
    with pytest.raises(dataclasses.FrozenInstanceError):
        entry.payload = b"y"  # type: ignore[misc]  # what the test checks
