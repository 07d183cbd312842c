"""The blocking client (``vellum.BookKeeper``): the asyncio client on its own event-loop thread.

Responsibility: give scripts, Spark executors and the shell the same API as
``vellum.aio.BookKeeper`` without asyncio: every call is submitted to a private loop (uvloop)
running in a daemon thread and waits for its result.

Each class is a :class:`~vellum.client.loop_thread.BlockingFacade`: its forwarded methods and
attributes are declared once, typed from the asyncio ones (``client/loop_thread.py``).

Invariants:
- every asyncio object (client, handles, futures) lives on the private loop and is touched only
  there; callers only see plain values and ``concurrent.futures.Future``;
- ``append_async`` calls made from one thread reach the loop in call order
  (``call_soon_threadsafe`` is FIFO), so entry ids follow call order as in the async API;
- calling a blocking method from the loop thread itself (e.g. inside a callback) raises instead
  of deadlocking;
- ``close()`` closes the async client, then stops and joins the thread; it is idempotent.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

from vellum.client.bookkeeper import BookKeeper as AsyncBookKeeper
from vellum.client.ledger import LedgerEntry
from vellum.client.ledger import LedgerHandle as AsyncLedgerHandle
from vellum.client.loop_thread import BlockingFacade, LoopThread, blocking, mirrored, pipelined
from vellum.client.placement import PlacementPolicy
from vellum.config import ClientConfig
from vellum.meta.api import MetadataStore

_T = TypeVar("_T")

__all__ = ["BookKeeper", "LedgerEntry", "LedgerHandle"]


class LedgerHandle(BlockingFacade[AsyncLedgerHandle]):
    """Blocking wrapper of a :class:`vellum.client.ledger.LedgerHandle`."""

    @property
    def ledger_id(self) -> int:
        return self._aio.ledger_id

    metadata = mirrored(AsyncLedgerHandle.metadata)
    last_add_confirmed = mirrored(AsyncLedgerHandle.last_add_confirmed)
    last_add_pushed = mirrored(AsyncLedgerHandle.last_add_pushed)
    length = mirrored(AsyncLedgerHandle.length)
    is_closed = mirrored(AsyncLedgerHandle.is_closed)

    append = blocking(AsyncLedgerHandle.append)
    append_async = pipelined(AsyncLedgerHandle.append_async)
    read = blocking(AsyncLedgerHandle.read)
    read_unconfirmed = blocking(AsyncLedgerHandle.read_unconfirmed)
    batch_read = blocking(AsyncLedgerHandle.batch_read)
    read_last_add_confirmed = blocking(AsyncLedgerHandle.read_last_add_confirmed)
    try_read_last_add_confirmed = blocking(AsyncLedgerHandle.try_read_last_add_confirmed)
    wait_for_lac = blocking(AsyncLedgerHandle.wait_for_lac)
    force = blocking(AsyncLedgerHandle.force)
    close = blocking(AsyncLedgerHandle.close)

    def tail(self, start_entry_id: int = 0, *, poll_timeout_s: float = 1.0) -> Iterator[LedgerEntry]:
        """Every entry from ``start_entry_id`` as it becomes confirmed (see the async ``tail``)."""
        return self._lt.iterate(self._aio.tail(start_entry_id, poll_timeout_s=poll_timeout_s))

    def __enter__(self) -> LedgerHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class BookKeeper(BlockingFacade[AsyncBookKeeper]):
    """Blocking BookKeeper client; same methods as ``vellum.aio.BookKeeper``, synchronous.

    ``with vellum.BookKeeper("sqlite:///path/metadata.db") as bk: lh = bk.create_ledger(...)``.
    """

    def __init__(
        self,
        metadata_uri: str | None = None,
        *,
        config: ClientConfig | None = None,
        store: MetadataStore | None = None,
        placement: PlacementPolicy | None = None,
    ) -> None:
        lt = LoopThread()
        try:
            aio = AsyncBookKeeper(metadata_uri, config=config, store=store, placement=placement)
            lt.call(aio.start())
        except BaseException:
            lt.stop()
            raise
        super().__init__(lt, aio)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The client's private event loop. Touch it only through ``call_soon_threadsafe``
        (callbacks that must run there); run coroutines with :meth:`run`."""
        return self._lt.loop

    @property
    def is_closed(self) -> bool:
        """True once :meth:`close` was called (the loop thread is stopped or stopping)."""
        return self._lt.stopped

    def submit(self, coro: Coroutine[Any, Any, _T]) -> concurrent.futures.Future[_T]:
        """Start ``coro`` on the client's loop thread and return at once with its future (for
        overlapping work, e.g. reading the next range while the caller processes this one).
        Same refusals as :meth:`run`, raised here."""
        return self._lt.submit(coro)

    def run(self, coro: Coroutine[Any, Any, _T], *, timeout_s: float | None = None) -> _T:
        """Run ``coro`` (a coroutine of the asyncio client :attr:`aio`, or of anything built on
        it) on the client's loop thread and wait for its result, like every blocking method.

        Raises ``IllegalOpError`` when called from the loop thread itself (it would deadlock),
        ``ClientClosedError`` once the client is closed, ``TimeoutError`` after ``timeout_s``
        (the coroutine is then cancelled). The coroutine is closed unrun when refused.
        """
        return self._lt.call(coro, timeout_s)

    @property
    def config(self) -> ClientConfig:
        return self._aio.config

    create_ledger = blocking(AsyncBookKeeper.create_ledger, returns=LedgerHandle)
    open_ledger = blocking(AsyncBookKeeper.open_ledger, returns=LedgerHandle)
    delete_ledger = blocking(AsyncBookKeeper.delete_ledger)
    list_ledgers = blocking(AsyncBookKeeper.list_ledgers)
    ledger_metadata = blocking(AsyncBookKeeper.ledger_metadata)
    ledger_exists = blocking(AsyncBookKeeper.ledger_exists)

    def close(self) -> None:
        """Close the client and stop its loop thread (idempotent). The timers of every writing
        handle made through this client, named writers included, are stopped first."""
        if self._lt.stopped:
            return
        try:
            self._lt.call(self._aio.close())
        finally:
            self._lt.stop()

    def __enter__(self) -> BookKeeper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
