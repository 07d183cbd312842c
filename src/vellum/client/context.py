"""What the ledger handles of one client share (BookKeeper's ``ClientContext``).

Responsibility: one object per ``BookKeeper`` client carrying the metadata store, the bookie
client, the placement policy, the configuration and the live bookie lists, plus the registry of
writing handles that closing the client stops. Handles receive it by constructor injection.

Invariants: ``writable_bookies`` / ``read_only_bookies`` are replaced whole (frozensets) by the
client's registration watches, never mutated, so a handle may read them at any time;
``writers`` holds handles weakly (an abandoned handle leaves with its last reference).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from vellum.config import ClientConfig
from vellum.errors import IncorrectParameterError
from vellum.ids import LedgerId
from vellum.meta.api import MetadataStore, Versioned
from vellum.meta.model import LedgerMetadata

if TYPE_CHECKING:
    from vellum.client.bookie_client import BookieClient
    from vellum.client.ledger import LedgerHandle
    from vellum.client.placement import PlacementPolicy

_T = TypeVar("_T")

#: default bound of a handle's adds in flight (sent, not yet acknowledged); later appends queue
DEFAULT_MAX_ADDS_IN_FLIGHT = 4096


class ClientContext:
    """What handles share with their ``BookKeeper``: metadata store, bookie client, placement,
    configuration and the live bookie lists (kept current by the client's registration watches).

    ``writers``: every writing handle (writer or recovery) made on this context registers itself
    here, so that closing the client can stop their timers. ``max_adds_in_flight``: the bound of
    each handle's adds in flight (appends beyond it are queued, not sent).
    """

    def __init__(
        self,
        store: MetadataStore,
        bookie_client: BookieClient,
        placement: PlacementPolicy,
        config: ClientConfig,
        *,
        max_adds_in_flight: int = DEFAULT_MAX_ADDS_IN_FLIGHT,
    ) -> None:
        if max_adds_in_flight < 1:
            raise IncorrectParameterError(f"max_adds_in_flight must be >= 1, got {max_adds_in_flight}")
        self.store = store
        self.bookie_client = bookie_client
        self.placement = placement
        self.config = config
        self.max_adds_in_flight = max_adds_in_flight
        self.writers: weakref.WeakSet[LedgerHandle] = weakref.WeakSet()
        self.writable_bookies: frozenset[str] = frozenset()
        self.read_only_bookies: frozenset[str] = frozenset()

    async def meta(self, fn: Callable[..., _T], *args: Any) -> _T:
        """Run a blocking metadata-store call off the loop."""
        return await asyncio.to_thread(fn, *args)

    async def read_metadata(self, ledger_id: int) -> Versioned[LedgerMetadata]:
        return await self.meta(self.store.ledgers.read_ledger, LedgerId(ledger_id))

    async def write_metadata(self, ledger_id: int, md: LedgerMetadata, expected_version: int) -> int:
        return await self.meta(self.store.ledgers.write_ledger, LedgerId(ledger_id), md, expected_version)
