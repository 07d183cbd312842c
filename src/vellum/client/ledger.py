"""A ledger handle: the one object a caller holds for an open ledger (BookKeeper's ``LedgerHandle``
and ``ReadOnlyLedgerHandle``), composed of one object per role.

Responsibility: make and wire the roles of one handle, and answer for the handle as a whole
(its mode, state, close, abandon). The work is done by the roles, each in its own module:

| module | role |
|---|---|
| ``ledger_view.py`` | ``LedgerView``: what the handle knows of the ledger (metadata, LAC, ensemble) |
| ``ledger_writer.py`` | ``LedgerWriter``: appends, in-flight window, back-pressure, ensemble change, close |
| ``ledger_reader.py`` | ``LedgerReader``: verified reads, LAC reads, long poll, tail |
| ``distribution.py`` | pure: write sets, quorum coverage, read plans |
| ``replica_read.py`` | one entry or batch from the replicas of a write set |
| ``context.py`` | ``ClientContext``: what the handles of one client share |

A handle's :class:`HandleMode` is fixed when it is made:

- ``WRITER``: the creator of the ledger: a writer (appends, explicit LAC, close in the metadata)
  and a reader of its own entries, whose LAC is the one the writer confirms;
- ``RECOVERY``: the recovery writer of ``recovery.py`` (write-backs with the RECOVERY_ADD flag
  against the IN_RECOVERY metadata, no appends), reachable as :attr:`LedgerHandle.writer`;
- ``READER``: an opened ledger, read only; its LAC is learnt from the bookies.

Invariants: a handle has a writer exactly when its mode is WRITER or RECOVERY, and then it is in
its client's ``ClientContext.writers`` until it is closed or abandoned (closing the client stops
its timers); the roles share one ``LedgerView``, so a read on a writing handle sees the writer's
LAC at once.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import AsyncGenerator, Sequence

from vellum.client.backpressure import backoff_delay
from vellum.client.context import DEFAULT_MAX_ADDS_IN_FLIGHT, ClientContext
from vellum.client.distribution import ensemble_coverage, has_quorum_coverage, write_set
from vellum.client.ledger_reader import (
    BATCH_CHUNK_BYTES,
    BATCH_CHUNK_ENTRIES,
    BATCH_WINDOW,
    READ_WINDOW,
    LedgerEntry,
    LedgerReader,
)
from vellum.client.ledger_view import LedgerView
from vellum.client.ledger_writer import LedgerWriter, copy_error
from vellum.client.metadata_update import EnsembleChangeHook
from vellum.client.replica_read import read_failure
from vellum.errors import IllegalOpError, IncorrectParameterError, LedgerClosedError
from vellum.format.entry import DigestManager, DigestType, PayloadSpans
from vellum.meta.api import Versioned
from vellum.meta.model import LedgerMetadata

# The names other modules have always imported from here (the roles moved out; see above).
__all__ = [
    "BATCH_CHUNK_BYTES",
    "BATCH_CHUNK_ENTRIES",
    "BATCH_WINDOW",
    "DEFAULT_MAX_ADDS_IN_FLIGHT",
    "READER",
    "READ_WINDOW",
    "RECOVERY",
    "WRITER",
    "ClientContext",
    "EnsembleChangeHook",
    "HandleMode",
    "LedgerEntry",
    "LedgerHandle",
    "backoff_delay",
    "copy_error",
    "ensemble_coverage",
    "has_quorum_coverage",
    "read_failure",
    "write_set",
]


class HandleMode(enum.Enum):
    """What a handle was made for (see the module docstring)."""

    WRITER = "writer"
    RECOVERY = "recovery"
    READER = "reader"


WRITER, RECOVERY, READER = HandleMode.WRITER, HandleMode.RECOVERY, HandleMode.READER


class LedgerHandle:
    """An open ledger (see the module docstring). Create through ``BookKeeper``, not directly;
    ``recovery.py`` and named ledgers make RECOVERY and segment-writer handles themselves.

    ``on_ensemble_change`` (writing handles): awaited with the new metadata before the
    compare-and-set of every ensemble change; raising refuses the change (the writer then fails).
    ``metadata_writes=False``: the metadata given did not come from the metadata store (a
    fast-recovery probe built from a name record): the handle never writes it.
    """

    def __init__(
        self,
        ctx: ClientContext,
        ledger_id: int,
        metadata: Versioned[LedgerMetadata],
        password: bytes,
        *,
        mode: HandleMode = READER,
        on_ensemble_change: EnsembleChangeHook | None = None,
        metadata_writes: bool = True,
    ) -> None:
        self._ctx = ctx
        self._loop = asyncio.get_running_loop()
        self.ledger_id = ledger_id
        self._mode = mode = HandleMode(mode)
        digest = DigestManager(ledger_id, DigestType(int(metadata.value.digest_type)), password)
        self._view = view = LedgerView(ledger_id, metadata, digest)
        self._writer: LedgerWriter | None = None
        if mode is not READER:
            self._writer = LedgerWriter(ctx, view, password, recovery=mode is RECOVERY,
                                        on_ensemble_change=on_ensemble_change, metadata_writes=metadata_writes)
            ctx.writers.add(self)
        self._reader = LedgerReader(ctx, view, own_writer=self._writer)
        # A read-only handle pushes nothing: its last add pushed stays the LAC it was opened with.
        self._pushed_at_open = view.lac
        self._max_in_flight = ctx.max_adds_in_flight  # a read-only handle's (unused) bound

    # ---------------------------------------------------------------------------- properties
    @property
    def mode(self) -> HandleMode:
        return self._mode

    @property
    def writer(self) -> LedgerWriter | None:
        """The writer role (WRITER and RECOVERY handles); None on a read-only handle."""
        return self._writer

    @property
    def metadata(self) -> LedgerMetadata:
        return self._view.metadata

    @property
    def metadata_version(self) -> int:
        return self._view.metadata_version

    @property
    def last_add_confirmed(self) -> int:
        return self._view.lac

    @property
    def last_add_pushed(self) -> int:
        return self._writer.last_add_pushed if self._writer is not None else self._pushed_at_open

    @property
    def length(self) -> int:
        """Bytes of payload up to the LAC (for a closed ledger: the length in its metadata).

        A reader of an open ledger only knows it where it learnt the LAC from an entry header.
        """
        return self._view.lac_length

    @property
    def is_closed(self) -> bool:
        """True once the ledger is closed in the metadata (or this handle was closed)."""
        return self._view.closed or self._view.metadata.is_closed

    @property
    def is_writable(self) -> bool:
        return self._writer is not None and self._writer.is_writable

    @property
    def digest_manager(self) -> DigestManager:
        return self._view.digest

    @property
    def max_adds_in_flight(self) -> int:
        """Adds this handle keeps in flight at most; appends beyond it wait in a queue."""
        return self._writer.max_adds_in_flight if self._writer is not None else self._max_in_flight

    @max_adds_in_flight.setter
    def max_adds_in_flight(self, value: int) -> None:
        if value < 1:
            raise IncorrectParameterError(f"max_adds_in_flight must be >= 1, got {value}")
        if self._writer is not None:
            self._writer.max_adds_in_flight = value
        self._max_in_flight = value

    @property
    def adds_in_flight(self) -> int:
        """Adds sent and not yet acknowledged (queued appends not included)."""
        return self._writer.adds_in_flight if self._writer is not None else 0

    @property
    def ensemble(self) -> tuple[str, ...]:
        """The current (last) ensemble."""
        return tuple(self._view.ensemble)

    def __repr__(self) -> str:
        return (
            f"LedgerHandle(ledger_id={self.ledger_id}, mode={self._mode.value}, lac={self._view.lac}, "
            f"state={self._view.metadata.state.name})"
        )

    # ================================================================================= writes
    def append_async(self, data: bytes | bytearray | memoryview) -> asyncio.Future[int]:
        """Append one entry; the future completes with its entry id once it is acknowledged.

        Call it many times without awaiting to pipeline; futures complete in entry-id order.
        """
        writer = self._writer
        if writer is not None:
            return writer.append_async(data)
        fut: asyncio.Future[int] = self._loop.create_future()
        fut.set_exception(
            LedgerClosedError(f"ledger {self.ledger_id} is closed")
            if self.is_closed
            else IllegalOpError(f"ledger {self.ledger_id} was opened read-only: appends are not allowed")
        )
        return fut

    def append_batch_async(self, entries: Sequence[bytes | bytearray | memoryview]) -> asyncio.Future[int]:
        """Append ``entries`` in order with one future, completed with the last entry's id once
        every one of them is acknowledged (``LedgerWriter.append_batch_async``)."""
        writer = self._writer
        if writer is not None:
            return writer.append_batch_async(entries)
        return self.append_async(b"")  # refused: the same error as a single append

    async def append(self, data: bytes | bytearray | memoryview) -> int:
        """Append one entry and wait for its acknowledgement; returns its entry id."""
        return await self.append_async(data)

    async def force(self) -> int:
        """Wait for every pending add, then ask the current ensemble to force the ledger to disk.

        Entries are fsynced before they are acknowledged, so this is a barrier; it returns the LAC.
        """
        if self._writer is None:
            return self._view.lac
        return await self._writer.force()

    # ================================================================================== reads
    async def read(self, first_entry_id: int, last_entry_id: int) -> list[LedgerEntry]:
        """Entries ``first..last`` (inclusive), all at or below the LAC."""
        return await self._reader.read(first_entry_id, last_entry_id)

    async def read_unconfirmed(self, first_entry_id: int, last_entry_id: int) -> list[LedgerEntry]:
        """Entries ``first..last`` even beyond the LAC: no guarantee they stay (BookKeeper's
        ``readUnconfirmed``); an entry no bookie has raises NoSuchEntryError."""
        return await self._reader.read_unconfirmed(first_entry_id, last_entry_id)

    async def read_payloads(self, first_entry_id: int, last_entry_id: int) -> PayloadSpans:
        """The verified payloads of ``first..last`` in order, no object per entry (bulk readers;
        reads beyond the LAC like ``read_unconfirmed``; see ``LedgerReader.read_payloads``)."""
        return await self._reader.read_payloads(first_entry_id, last_entry_id)

    async def batch_read(self, start_entry_id: int, max_count: int, max_size: int = 0) -> list[LedgerEntry]:
        """Up to ``max_count`` entries (about ``max_size`` bytes, 0 = no limit) from
        ``start_entry_id``, at or below the LAC (see ``LedgerReader.batch_read``)."""
        return await self._reader.batch_read(start_entry_id, max_count, max_size)

    async def read_last_add_confirmed(self) -> int:
        """The LAC at quorum coverage of the last ensemble (a writing handle knows its own)."""
        return await self._reader.read_last_add_confirmed()

    async def try_read_last_add_confirmed(self) -> int:
        """Best effort: the LAC from the first bookie that answers."""
        return await self._reader.try_read_last_add_confirmed()

    async def wait_for_lac(self, previous_lac: int, timeout_s: float) -> int:
        """Long poll: return once the LAC passes ``previous_lac`` or ``timeout_s`` elapse."""
        return await self._reader.wait_for_lac(previous_lac, timeout_s)

    async def refresh_metadata(self) -> LedgerMetadata:
        """Re-read the metadata (a reader notices CLOSED and ensemble changes)."""
        return await self._reader.refresh_metadata()

    def tail(
        self, start_entry_id: int = 0, *, poll_timeout_s: float = 1.0, batch_size: int = 64
    ) -> AsyncGenerator[LedgerEntry, None]:
        """Yield every entry from ``start_entry_id`` in order as it becomes confirmed; ends once
        the ledger is closed and its last entry was yielded."""
        return self._reader.tail(start_entry_id, poll_timeout_s=poll_timeout_s, batch_size=batch_size)

    # ============================================================================ life cycle
    def stop_timers(self) -> None:
        """Cancel this handle's timers (explicit LAC, ensemble-change retry). Idempotent; the
        handle stays usable otherwise. ``BookKeeper.close()`` calls it on every writing handle."""
        if self._writer is not None:
            self._writer.stop_timers()

    def abandon(self) -> None:
        """Give the handle up without touching the ledger's metadata (no close).

        For a writer that lost its ledger (fenced, no bookies) or a recovery probe whose result
        lives elsewhere: stops the timers and background work; adds not yet acknowledged and
        every later one fail with ``LedgerClosedError``; the ledger itself stays as it is in the
        metadata (the next opener's recovery decides its end). Idempotent.
        """
        if self._writer is not None:
            self._writer.abandon()
        else:
            self._view.closed = True
            self._view.wake()
        self._ctx.writers.discard(self)

    async def close(self) -> None:
        """Close the handle; a writer closes the ledger in the metadata (rule 10 of docs/correctness.md, see
        ``ledger_writer.py``). Idempotent: a second close waits for the first one's outcome."""
        try:
            if self._writer is not None:
                await self._writer.close()
        finally:
            self._view.closed = True
            self._view.wake()
            self._ctx.writers.discard(self)
