"""Client layer (L4): the asyncio BookKeeper client and its blocking facade.

``BookKeeper`` (asyncio, also ``vellum.aio.BookKeeper``) creates, opens, deletes and lists
ledgers; ``LedgerHandle`` appends, reads, tails and closes one ledger; ``LedgerEntry`` is what
reads return. The blocking facade is ``vellum.client.blocking.BookKeeper`` (``vellum.BookKeeper``).
Never imports ``vellum.server``.
"""

from vellum.client.bookkeeper import BookKeeper
from vellum.client.ledger import LedgerEntry, LedgerHandle

__all__ = ["BookKeeper", "LedgerEntry", "LedgerHandle"]
