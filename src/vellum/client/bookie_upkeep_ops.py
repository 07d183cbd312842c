"""The bookie client's upkeep operations: what administration and garbage collection ask of a
bookie (list a ledger's entries, disk space, the advisory LEDGER_CLOSED note, trim, COLLECT),
apart from the data path's adds and reads.

Responsibility: build each request and type its answer. Sending, matching answers by request
id and timeouts are ``BookieClient``'s (``client/bookie_client.py``), which this class is a part
of; wire formats in docs/protocol.md.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from vellum.proto import codec
from vellum.proto import messages as m

if TYPE_CHECKING:
    from vellum.client.bookie_connection import BookieConnection

log = logging.getLogger("vellum.client.bookie_client")

#: default timeout of a request to a bookie, in seconds
DEFAULT_TIMEOUT_S: Final = 5.0


class BookieUpkeepOps:
    """Upkeep requests to bookies, over ``BookieClient``'s connections."""

    if TYPE_CHECKING:  # what BookieClient provides (declared for the type checker only)
        def _connection(self, bookie_id: str) -> BookieConnection: ...

        def _submit_by_id(self, bookie_id: str, op: int, ledger_id: int, entry_id: int,
                          build: Callable[[int], list[m.BytesLike]], timeout_s: float) -> asyncio.Future[Any]: ...

    async def list_entries(
        self, bookie_id: str, ledger_id: int, *, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> tuple[tuple[int, int], ...]:
        """The entry ids the bookie holds for the ledger, as sorted disjoint inclusive ranges."""
        fut = self._submit_by_id(
            bookie_id,
            m.OP_LIST_ENTRIES,
            ledger_id,
            -1,
            lambda rid: codec.encode_parts(m.ListEntriesRequest(rid, ledger_id)),
            timeout_s,
        )
        result: tuple[tuple[int, int], ...] = await fut
        return result

    async def bookie_info(self, bookie_id: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[int, int]:
        """``(total disk capacity, free disk space)`` of the bookie's ledger dirs, in bytes."""
        fut = self._submit_by_id(
            bookie_id, m.OP_GET_BOOKIE_INFO, -1, -1, lambda rid: codec.encode_parts(m.GetBookieInfoRequest(rid)), timeout_s
        )
        result: tuple[int, int] = await fut
        return result

    def ledger_closed(self, bookie_id: str, ledger_id: int) -> None:
        """Advisory LEDGER_CLOSED note: fire and forget (never raises, never waits; the bookie
        never answers it). Dropped if the bookie cannot be reached right now."""
        try:
            conn = self._connection(bookie_id)
            conn.send(codec.encode_parts(m.LedgerClosedNote(conn.new_request_id(), ledger_id)))
        except Exception as exc:
            log.debug("LEDGER_CLOSED %d to bookie %s dropped: %s", ledger_id, bookie_id, exc)

    async def trim(
        self,
        bookie_id: str,
        ledger_id: int,
        end_entry_id: int,
        master_key: bytes,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        """Ask the bookie to drop the ledger's entries below ``end_entry_id``."""
        fut = self._submit_by_id(
            bookie_id,
            m.OP_TRIM,
            ledger_id,
            end_entry_id,
            lambda rid: codec.encode_parts(m.TrimRequest(rid, ledger_id, end_entry_id, master_key)),
            timeout_s,
        )
        await fut

    async def collect(
        self,
        bookie_id: str,
        ledger_id: int,
        end_entry_id: int,
        master_key: bytes,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> tuple[int, int]:
        """COLLECT: the bookie trims the ledger below ``end_entry_id`` (0: nothing), seals the
        active entry logs holding it and runs a garbage collection pass on its ledger dir(s);
        answered when that pass is done with ``(reclaimed bytes, garbage bytes left)``.
        ``NoSuchLedgerError``: the bookie does not hold the ledger (nothing to collect)."""
        fut = self._submit_by_id(
            bookie_id,
            m.OP_COLLECT,
            ledger_id,
            end_entry_id,
            lambda rid: codec.encode_parts(m.CollectRequest(rid, ledger_id, end_entry_id, master_key)),
            timeout_s,
        )
        result: tuple[int, int] = await fut
        return result
