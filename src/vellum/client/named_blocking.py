"""Blocking named ledgers: :mod:`vellum.client.named` for the blocking client (``vellum.BookKeeper``).

Responsibility: the same API as :class:`vellum.client.named.NamedLedgers` and
:class:`~vellum.client.named.NamedLedgerHandle`, synchronous, for scripts, Spark executors and
the shell.

Invariants (those of ``client/blocking.py``):
- every asyncio object (the async ``NamedLedgers``, handles, futures) lives on the blocking
  client's private loop and is touched only there; callers see plain values and
  ``concurrent.futures.Future``;
- ``append_async`` calls from one thread reach the loop in call order (``call_soon_threadsafe``
  is FIFO), so global entry ids follow call order;
- a blocking call made from the loop thread itself raises instead of deadlocking.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import AsyncGenerator, Coroutine, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from vellum.client.blocking import BookKeeper
from vellum.client.named import (
    NamedLedgerEntry,
    NamedLedgerInfo,
    NamedLedgerRecord,
    OpenMode,
)
from vellum.client.named import NamedLedgerHandle as AsyncNamedLedgerHandle
from vellum.client.named import (
    NamedLedgers as AsyncNamedLedgers,
)
from vellum.errors import ClientClosedError
from vellum.format.entry import DigestType
from vellum.meta.api import Versioned

_T = TypeVar("_T")

__all__ = ["NamedLedgerHandle", "NamedLedgers", "OpenMode"]


class _Runner:
    """Runs coroutines on the blocking client's loop thread (``BookKeeper.run``) and waits."""

    def __init__(self, bk: BookKeeper) -> None:
        self.bk = bk
        self.loop = bk.loop

    def call(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return self.bk.run(coro)

    @property
    def usable(self) -> bool:
        """The client is open and this is not its loop thread (a blocking call can be made)."""
        if self.bk.is_closed:
            return False
        try:
            return asyncio.get_running_loop() is not self.loop
        except RuntimeError:
            return True


class NamedLedgers:
    """Blocking named ledgers over a started blocking ``BookKeeper``."""

    def __init__(self, bk: BookKeeper, *, close_fenced_ledgers: bool = True) -> None:
        self._r = _Runner(bk)
        self._aio = AsyncNamedLedgers(bk.aio, close_fenced_ledgers=close_fenced_ledgers)

    @property
    def aio(self) -> AsyncNamedLedgers:
        return self._aio

    def open(
        self,
        name: str,
        mode: OpenMode | str = OpenMode.APPEND,
        *,
        digest_type: str | DigestType | None = None,
        password: bytes = b"",
        ensemble_size: int | None = None,
        write_quorum_size: int | None = None,
        ack_quorum_size: int | None = None,
        custom_metadata: dict[str, bytes] | None = None,
    ) -> NamedLedgerHandle:
        h = self._r.call(self._aio.open(
            name, mode, digest_type=digest_type, password=password, ensemble_size=ensemble_size,
            write_quorum_size=write_quorum_size, ack_quorum_size=ack_quorum_size, custom_metadata=custom_metadata,
        ))
        return NamedLedgerHandle(self._r, h)

    def list(self, prefix: str = "") -> list[str]:
        return self._r.call(self._aio.list(prefix))

    def exists(self, name: str) -> bool:
        return self._r.call(self._aio.exists(name))

    def record(self, name: str) -> Versioned[NamedLedgerRecord]:
        return self._r.call(self._aio.record(name))

    def info(self, name: str) -> NamedLedgerInfo:
        return self._r.call(self._aio.info(name))

    def delete(self, name: str) -> None:
        self._r.call(self._aio.delete(name))

    def shrink(self, name: str, end_entry_id: int, *, force: bool = False) -> int:
        return self._r.call(self._aio.shrink(name, end_entry_id, force=force))

    def get_cursor(self, name: str, key: str) -> tuple[bytes | None, int]:
        return self._r.call(self._aio.get_cursor(name, key))

    def set_cursor(self, name: str, key: str, value: bytes | None, expected_version: int) -> int:
        return self._r.call(self._aio.set_cursor(name, key, value, expected_version))

    def publish_segments(self, name: str, ledger_ids: Sequence[int], *, expected_version: int | None,
                         cursor_updates: Mapping[str, bytes | None] | None = None) -> int:
        return self._r.call(self._aio.publish_segments(
            name, ledger_ids, expected_version=expected_version, cursor_updates=cursor_updates))

    def overwrite(self, name: str, ledger_ids: Sequence[int], *, expected_version: int | None,
                  cursor_updates: Mapping[str, bytes | None] | None = None) -> int:
        return self._r.call(self._aio.overwrite(
            name, ledger_ids, expected_version=expected_version, cursor_updates=cursor_updates))

    def drain(self) -> None:
        self._r.call(self._aio.drain())


class NamedLedgerHandle:
    """Blocking wrapper of :class:`vellum.client.named.NamedLedgerHandle`."""

    def __init__(self, runner: _Runner, handle: AsyncNamedLedgerHandle) -> None:
        self._r = runner
        self._h = handle

    # properties are plain attribute reads: safe from any thread
    @property
    def name(self) -> str:
        return self._h.name

    @property
    def aio(self) -> AsyncNamedLedgerHandle:
        return self._h

    @property
    def record(self) -> NamedLedgerRecord:
        return self._h.record

    @property
    def version(self) -> int:
        return self._h.version

    @property
    def start_entry_id(self) -> int:
        return self._h.start_entry_id

    @property
    def last_add_confirmed(self) -> int:
        return self._h.last_add_confirmed

    @property
    def writer_epoch(self) -> int:
        return self._h.writer_epoch

    def __repr__(self) -> str:
        return f"Blocking{self._h!r}"

    def append(self, data: bytes | bytearray | memoryview) -> int:
        return self._r.call(self._h.append(data))

    def append_async(self, data: bytes | bytearray | memoryview) -> concurrent.futures.Future[int]:
        """Pipelined append; the future completes with the global entry id (in id order)."""
        cf: concurrent.futures.Future[int] = concurrent.futures.Future()
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

        try:
            self._r.loop.call_soon_threadsafe(start)
        except RuntimeError:
            cf.set_exception(ClientClosedError("the BookKeeper client is closed"))
        return cf

    def read(self, first_entry_id: int, last_entry_id: int) -> list[NamedLedgerEntry]:
        return self._r.call(self._h.read(first_entry_id, last_entry_id))

    def read_last_add_confirmed(self) -> int:
        return self._r.call(self._h.read_last_add_confirmed())

    def refresh(self) -> NamedLedgerRecord:
        return self._r.call(self._h.refresh())

    def tail(self, start_entry_id: int | None = None, *, poll_timeout_s: float = 1.0) -> Iterator[NamedLedgerEntry]:
        """Every entry from ``start_entry_id`` as it becomes confirmed (see the async ``tail``)."""
        agen = self._h.tail(start_entry_id, poll_timeout_s=poll_timeout_s)
        assert isinstance(agen, AsyncGenerator)

        async def step() -> NamedLedgerEntry:
            return await agen.__anext__()

        try:
            while True:
                try:
                    item = self._r.call(step())
                except StopAsyncIteration:
                    return
                yield item
        finally:
            if self._r.usable:
                self._r.call(agen.aclose())

    def shrink(self, end_entry_id: int, force: bool = False) -> int:
        return self._r.call(self._h.shrink(end_entry_id, force))

    def get_cursor(self, key: str) -> tuple[bytes | None, int]:
        return self._h.get_cursor(key)

    def set_cursor(self, key: str, value: bytes | None, expected_version: int) -> int:
        return self._r.call(self._h.set_cursor(key, value, expected_version))

    def close(self) -> None:
        self._r.call(self._h.close())

    def __enter__(self) -> NamedLedgerHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
