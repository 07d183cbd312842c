"""Ledger use-cases of the admin API (BookKeeper's ``/api/v1/ledger/*``): list the cluster's
ledgers (optionally with their metadata, page by page), read a ledger's entries, delete a
ledger, and render one ledger's metadata. Shared by the HTTP API and other front ends.

Invariants:
- no answer carries a ledger's password (``ledger_metadata_json`` says whether there is one);
- reads never recover or fence a ledger (a look, like BookKeeper's ``openLedgerNoRecovery``)
  and never go past the last add confirmed: entries beyond it are not acknowledged data;
- one read answers at most ``ENTRIES_PER_PAGE`` entries and ``MAX_READ_BYTES`` of payload, so
  an admin call cannot make the bookie hold a whole ledger in memory; a larger range is refused
  with the parameters that page through it;
- deleting removes the ledger's metadata (the bookies reclaim its entries by GC); an unknown
  ledger is ``NoSuchLedgerError``, not a silent success.
"""

from __future__ import annotations

import logging
from typing import Any

from vellum.client.bookkeeper import BookKeeper
from vellum.config import ClientConfig
from vellum.errors import IncorrectParameterError, NoSuchLedgerError
from vellum.ids import LedgerId
from vellum.meta.api import MetadataStore
from vellum.meta.model import LedgerMetadata
from vellum.security.redaction import REDACTED

log = logging.getLogger(__name__)

#: ledgers per page of ``ledger/list?print_metadata=true&page=N`` (BookKeeper's batch size)
LEDGERS_PER_PAGE = 100
#: entries per page of ``ledger/read?page=N`` (BookKeeper's), and the most one read answers
ENTRIES_PER_PAGE = 1000
#: the most payload bytes one read answers
MAX_READ_BYTES = 32 * 1024 * 1024
_READ_BATCH = 100


def ledger_metadata_json(metadata: LedgerMetadata) -> dict[str, Any]:
    """A ledger's metadata as JSON. The password (the master key's source) is a secret: whoever
    holds it may write and fence the ledger. Say whether there is one, never what it is."""
    shown = metadata.to_json_dict()
    shown["password"] = REDACTED if metadata.password else ""
    return shown


class LedgerAdmin:
    """The ledger use-cases over one metadata store; ``client_config`` is the client reads go
    through (the bookie's own identity on a secured cluster)."""

    def __init__(self, *, store: MetadataStore, client_config: ClientConfig) -> None:
        self._store = store
        self._client_config = client_config

    def ledger_metadata(self, ledger_id: int) -> dict[str, Any]:
        return ledger_metadata_json(self._store.ledgers.read_ledger(LedgerId(ledger_id)).value)

    def list_ledgers(self, *, print_metadata: bool = False, page: int | None = None) -> dict[str, Any]:
        """``{"<ledger id>": null}`` for every ledger; with ``print_metadata`` the values are the
        metadata, of page ``page`` only (1-based, ``LEDGERS_PER_PAGE`` each) when given. Blocking."""
        if page is not None and page < 1:
            raise IncorrectParameterError(f"page={page}: pages start at 1")
        out: dict[str, Any] = {}
        if not print_metadata:
            for lid in self._store.ledgers.iter_ledger_ids():
                out[str(int(lid))] = None
            return out
        first = (page - 1) * LEDGERS_PER_PAGE if page is not None else 0
        last = first + LEDGERS_PER_PAGE - 1 if page is not None else None
        for index, lid in enumerate(self._store.ledgers.iter_ledger_ids()):
            if index < first:
                continue
            if last is not None and index > last:
                break
            try:
                out[str(int(lid))] = self.ledger_metadata(int(lid))
            except NoSuchLedgerError:
                continue  # deleted since it was listed
        return out

    async def read_entries(self, ledger_id: int, *, start_entry_id: int = 0, end_entry_id: int = -1,
                           page: int | None = None) -> dict[str, str]:
        """``{"<entry id>": "<payload as US-ASCII, other bytes as U+FFFD>"}`` for the entries
        ``start_entry_id``..``end_entry_id`` (-1: up to the last add confirmed), or of page
        ``page`` (``ENTRIES_PER_PAGE`` each; then also ``"Entries for page: ": "<page>"``), as
        BookKeeper's ``ledger/read``."""
        if start_entry_id < 0 or end_entry_id < -1:
            raise IncorrectParameterError(f"start_entry_id={start_entry_id}, end_entry_id={end_entry_id}: entry ids "
                                          "are >= 0 (end_entry_id=-1: up to the last add confirmed)")
        out: dict[str, str] = {}
        if page is not None:
            if page < 1:
                raise IncorrectParameterError(f"page={page}: pages start at 1")
            page_first = (page - 1) * ENTRIES_PER_PAGE
            page_last = page_first + ENTRIES_PER_PAGE - 1
            if start_entry_id == 0 or start_entry_id < page_first:
                start_entry_id = page_first
            if end_entry_id == -1 or end_entry_id > page_last:
                end_entry_id = page_last
            out["Entries for page: "] = str(page)
        if end_entry_id != -1 and start_entry_id > end_entry_id:
            raise IncorrectParameterError(f"start_entry_id={start_entry_id} is after end_entry_id={end_entry_id}"
                                          + (f" (page={page})" if page is not None else ""))
        async with BookKeeper(config=self._client_config, store=self._store) as bk:
            metadata = await bk.ledger_metadata(ledger_id)
            lh = await bk.open_ledger(ledger_id, password=metadata.password, recovery=False)
            lac = lh.last_add_confirmed
            last = lac if end_entry_id == -1 else min(end_entry_id, lac)
            if last - start_entry_id + 1 > ENTRIES_PER_PAGE:
                raise IncorrectParameterError(
                    f"ledger {ledger_id}: entries {start_entry_id}..{last} are more than {ENTRIES_PER_PAGE} "
                    f"entries, the most one read answers: page through them with page=1, 2, ... or narrow "
                    "start_entry_id / end_entry_id")
            size = 0
            for first in range(start_entry_id, last + 1, _READ_BATCH):
                for entry in await lh.read(first, min(last, first + _READ_BATCH - 1)):
                    size += len(entry.payload)
                    if size > MAX_READ_BYTES:
                        raise IncorrectParameterError(
                            f"ledger {ledger_id}: entries {start_entry_id}..{entry.entry_id} hold more than "
                            f"{MAX_READ_BYTES} bytes, the most one read answers: narrow start_entry_id / "
                            "end_entry_id")
                    out[str(entry.entry_id)] = bytes(entry.payload).decode("ascii", "replace")
        return out

    def delete_ledger(self, ledger_id: int) -> str:
        """Delete the ledger's metadata; BookKeeper's answer ``"Deleted ledger: <id>"``. Blocking."""
        ledgers = self._store.ledgers
        if not ledgers.ledger_exists(LedgerId(ledger_id)):
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist")
        ledgers.delete_ledger(LedgerId(ledger_id))
        log.info("ledger %d deleted through the admin API", ledger_id)
        return f"Deleted ledger: {ledger_id}"
