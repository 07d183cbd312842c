"""The blocking client (``vellum.BookKeeper``): the asyncio client on its own event-loop thread.

Responsibility: give scripts, Spark executors and the shell the same API as
``vellum.aio.BookKeeper`` without asyncio: every call is submitted to a private loop (uvloop)
running in a daemon thread and waits for its result.

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
import threading
from collections.abc import AsyncGenerator, Coroutine, Iterator
from typing import Any, TypeVar

from vellum.client.bookkeeper import BookKeeper as AsyncBookKeeper
from vellum.client.ledger import LedgerEntry
from vellum.client.ledger import LedgerHandle as AsyncLedgerHandle
from vellum.client.placement import PlacementPolicy
from vellum.config import ClientConfig
from vellum.errors import ClientClosedError, IllegalOpError
from vellum.format.entry import DigestType
from vellum.meta.api import MetadataStore
from vellum.meta.model import LedgerMetadata

_T = TypeVar("_T")

__all__ = ["BookKeeper", "LedgerEntry", "LedgerHandle"]


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


class _LoopThread:
    """A private event loop running forever in a daemon thread."""

    def __init__(self) -> None:
        self.loop = _new_loop()
        self._ready = threading.Event()
        self.thread = threading.Thread(target=self._run, name="vellum-client-loop", daemon=True)
        self.thread.start()
        self._ready.wait()
        self.stopped = False

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, _T]) -> concurrent.futures.Future[_T]:
        if self.stopped:
            coro.close()
            raise ClientClosedError("the BookKeeper client is closed")
        if threading.current_thread() is self.thread:
            coro.close()
            raise IllegalOpError("blocking Vellum call made from the client's own event-loop thread")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, coro: Coroutine[Any, Any, _T], timeout_s: float | None = None) -> _T:
        cf = self.submit(coro)
        try:
            return cf.result(timeout_s)
        except concurrent.futures.TimeoutError:
            cf.cancel()  # do not leave the coroutine running on after the caller gave up
            raise

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        self.loop.call_soon_threadsafe(self.loop.stop)
        if threading.current_thread() is not self.thread:
            self.thread.join()
            self.loop.close()


class BookKeeper:
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
        self._lt = _LoopThread()
        try:
            self._aio = AsyncBookKeeper(metadata_uri, config=config, store=store, placement=placement)
            self._lt.call(self._aio.start())
        except BaseException:
            self._lt.stop()
            raise

    @property
    def aio(self) -> AsyncBookKeeper:
        """The asyncio client underneath (use only from coroutines given to :meth:`run`)."""
        return self._aio

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

    def _call(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return self._lt.call(coro)

    def create_ledger(
        self,
        *,
        ensemble_size: int | None = None,
        write_quorum_size: int | None = None,
        ack_quorum_size: int | None = None,
        digest_type: str | DigestType | None = None,
        password: bytes = b"",
        custom_metadata: dict[str, bytes] | None = None,
    ) -> LedgerHandle:
        h = self._call(self._aio.create_ledger(
            ensemble_size=ensemble_size, write_quorum_size=write_quorum_size, ack_quorum_size=ack_quorum_size,
            digest_type=digest_type, password=password, custom_metadata=custom_metadata,
        ))
        return LedgerHandle(self._lt, h)

    def open_ledger(self, ledger_id: int, *, password: bytes = b"", recovery: bool = True) -> LedgerHandle:
        h = self._call(self._aio.open_ledger(ledger_id, password=password, recovery=recovery))
        return LedgerHandle(self._lt, h)

    def delete_ledger(self, ledger_id: int) -> None:
        self._call(self._aio.delete_ledger(ledger_id))

    def list_ledgers(self) -> list[int]:
        return self._call(self._aio.list_ledgers())

    def ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        return self._call(self._aio.ledger_metadata(ledger_id))

    def ledger_exists(self, ledger_id: int) -> bool:
        return self._call(self._aio.ledger_exists(ledger_id))

    def close(self) -> None:
        """Close the client and stop its loop thread (idempotent). The timers of every writing
        handle made through this client, named writers included, are stopped first."""
        if self._lt.stopped:
            return
        try:
            self._call(self._aio.close())
        finally:
            self._lt.stop()

    def __enter__(self) -> BookKeeper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LedgerHandle:
    """Blocking wrapper of a :class:`vellum.client.ledger.LedgerHandle`."""

    def __init__(self, lt: _LoopThread, handle: AsyncLedgerHandle) -> None:
        self._lt = lt
        self._h = handle

    # properties are plain attribute reads: safe from any thread
    @property
    def ledger_id(self) -> int:
        return self._h.ledger_id

    @property
    def metadata(self) -> LedgerMetadata:
        return self._h.metadata

    @property
    def last_add_confirmed(self) -> int:
        return self._h.last_add_confirmed

    @property
    def last_add_pushed(self) -> int:
        return self._h.last_add_pushed

    @property
    def length(self) -> int:
        return self._h.length

    @property
    def is_closed(self) -> bool:
        return self._h.is_closed

    @property
    def aio(self) -> AsyncLedgerHandle:
        return self._h

    def __repr__(self) -> str:
        return f"Blocking{self._h!r}"

    def append(self, data: bytes | bytearray | memoryview) -> int:
        return self._lt.call(self._h.append(data))

    def append_async(self, data: bytes | bytearray | memoryview) -> concurrent.futures.Future[int]:
        """Pipelined append; the future completes with the entry id (in entry-id order)."""
        cf: concurrent.futures.Future[int] = concurrent.futures.Future()
        if self._lt.stopped:
            cf.set_exception(ClientClosedError("the BookKeeper client is closed"))
            return cf
        handle = self._h

        def transfer(f: asyncio.Future[int]) -> None:
            if not cf.set_running_or_notify_cancel():
                return
            exc = f.exception()
            if exc is not None:
                cf.set_exception(exc)
            else:
                cf.set_result(f.result())

        def start() -> None:
            handle.append_async(data).add_done_callback(transfer)

        self._lt.loop.call_soon_threadsafe(start)
        return cf

    def read(self, first_entry_id: int, last_entry_id: int) -> list[LedgerEntry]:
        return self._lt.call(self._h.read(first_entry_id, last_entry_id))

    def read_unconfirmed(self, first_entry_id: int, last_entry_id: int) -> list[LedgerEntry]:
        return self._lt.call(self._h.read_unconfirmed(first_entry_id, last_entry_id))

    def batch_read(self, start_entry_id: int, max_count: int, max_size: int = 0) -> list[LedgerEntry]:
        return self._lt.call(self._h.batch_read(start_entry_id, max_count, max_size))

    def read_last_add_confirmed(self) -> int:
        return self._lt.call(self._h.read_last_add_confirmed())

    def try_read_last_add_confirmed(self) -> int:
        return self._lt.call(self._h.try_read_last_add_confirmed())

    def wait_for_lac(self, previous_lac: int, timeout_s: float) -> int:
        return self._lt.call(self._h.wait_for_lac(previous_lac, timeout_s))

    def tail(self, start_entry_id: int = 0, *, poll_timeout_s: float = 1.0) -> Iterator[LedgerEntry]:
        """Every entry from ``start_entry_id`` as it becomes confirmed (see the async ``tail``)."""
        agen = self._h.tail(start_entry_id, poll_timeout_s=poll_timeout_s)
        assert isinstance(agen, AsyncGenerator)

        async def step() -> LedgerEntry:
            return await agen.__anext__()

        try:
            while True:
                try:
                    item = self._lt.call(step())
                except StopAsyncIteration:
                    return
                yield item
        finally:
            if not self._lt.stopped:
                self._lt.call(agen.aclose())

    def force(self) -> int:
        return self._lt.call(self._h.force())

    def close(self) -> None:
        self._lt.call(self._h.close())

    def __enter__(self) -> LedgerHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
