"""Blocking named ledgers: :mod:`vellum.client.named` for the blocking client (``vellum.BookKeeper``).

Responsibility: the same API as :class:`vellum.client.named.NamedLedgers` and
:class:`~vellum.client.named.NamedLedgerHandle`, synchronous, for scripts, Spark executors and
the shell.

Both classes are facades (``client/loop_thread.py``) on the blocking client's loop thread: their
forwarded methods and attributes are declared once, typed from the asyncio ones.

Invariants (those of ``client/blocking.py``):
- every asyncio object (the async ``NamedLedgers``, handles, futures) lives on the blocking
  client's private loop and is touched only there; callers see plain values and
  ``concurrent.futures.Future``;
- ``append_async`` calls from one thread reach the loop in call order (``call_soon_threadsafe``
  is FIFO), so global entry ids follow call order;
- a blocking call made from the loop thread itself raises instead of deadlocking.
"""

from __future__ import annotations

from collections.abc import Iterator

from vellum.client.blocking import BookKeeper
from vellum.client.loop_thread import BlockingFacade, blocking, mirrored, pipelined
from vellum.client.named import NamedLedgerEntry, OpenMode
from vellum.client.named import NamedLedgerHandle as AsyncNamedLedgerHandle
from vellum.client.named import NamedLedgers as AsyncNamedLedgers

__all__ = ["NamedLedgerHandle", "NamedLedgers", "OpenMode"]


class NamedLedgerHandle(BlockingFacade[AsyncNamedLedgerHandle]):
    """Blocking wrapper of :class:`vellum.client.named.NamedLedgerHandle`."""

    name = mirrored(AsyncNamedLedgerHandle.name)
    record = mirrored(AsyncNamedLedgerHandle.record)
    version = mirrored(AsyncNamedLedgerHandle.version)
    start_entry_id = mirrored(AsyncNamedLedgerHandle.start_entry_id)
    last_add_confirmed = mirrored(AsyncNamedLedgerHandle.last_add_confirmed)
    writer_epoch = mirrored(AsyncNamedLedgerHandle.writer_epoch)

    append = blocking(AsyncNamedLedgerHandle.append)
    append_async = pipelined(AsyncNamedLedgerHandle.append_async)
    read = blocking(AsyncNamedLedgerHandle.read)
    read_last_add_confirmed = blocking(AsyncNamedLedgerHandle.read_last_add_confirmed)
    refresh = blocking(AsyncNamedLedgerHandle.refresh)
    shrink = blocking(AsyncNamedLedgerHandle.shrink)
    set_cursor = blocking(AsyncNamedLedgerHandle.set_cursor)
    close = blocking(AsyncNamedLedgerHandle.close)

    def tail(self, start_entry_id: int | None = None, *, poll_timeout_s: float = 1.0) -> Iterator[NamedLedgerEntry]:
        """Every entry from ``start_entry_id`` as it becomes confirmed (see the async ``tail``)."""
        return self._lt.iterate(self._aio.tail(start_entry_id, poll_timeout_s=poll_timeout_s))

    def get_cursor(self, key: str) -> tuple[bytes | None, int]:
        """(value, record version) as of this handle's view (no I/O: safe from any thread)."""
        return self._aio.get_cursor(key)

    def __enter__(self) -> NamedLedgerHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class NamedLedgers(BlockingFacade[AsyncNamedLedgers]):
    """Blocking named ledgers over a started blocking ``BookKeeper``."""

    def __init__(self, bk: BookKeeper, *, close_fenced_ledgers: bool = True) -> None:
        # Its asyncio object lives on the client's loop thread, like the client's own.
        super().__init__(bk._lt, AsyncNamedLedgers(bk.aio, close_fenced_ledgers=close_fenced_ledgers))

    open = blocking(AsyncNamedLedgers.open, returns=NamedLedgerHandle)
    list = blocking(AsyncNamedLedgers.list)
    exists = blocking(AsyncNamedLedgers.exists)
    record = blocking(AsyncNamedLedgers.record)
    info = blocking(AsyncNamedLedgers.info)
    delete = blocking(AsyncNamedLedgers.delete)
    shrink = blocking(AsyncNamedLedgers.shrink)
    get_cursor = blocking(AsyncNamedLedgers.get_cursor)
    set_cursor = blocking(AsyncNamedLedgers.set_cursor)
    publish_segments = blocking(AsyncNamedLedgers.publish_segments)
    overwrite = blocking(AsyncNamedLedgers.overwrite)
    merge_segments = blocking(AsyncNamedLedgers.merge_segments)
    drain = blocking(AsyncNamedLedgers.drain)
