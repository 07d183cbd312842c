"""The asyncio client API: ``vellum.aio.BookKeeper``, ``LedgerHandle``, ``LedgerEntry``.

A thin re-export of :mod:`vellum.client` so user code reads ``from vellum.aio import BookKeeper``;
``vellum.BookKeeper`` is the blocking facade over the same client.
"""

from vellum.client.bookkeeper import BookKeeper
from vellum.client.ledger import LedgerEntry, LedgerHandle

__all__ = ["BookKeeper", "LedgerEntry", "LedgerHandle"]
