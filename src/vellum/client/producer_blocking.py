"""Blocking producer: :mod:`vellum.client.producer` for the blocking client (``vellum.BookKeeper``).

Responsibility: the same API as :class:`vellum.client.producer.Producer`, synchronous, for
scripts and Spark executors: ``write`` returns a ``concurrent.futures.Future`` of the record's
position, and blocks only while the producer's buffer is full (``max_block_ms``).

A facade (``client/loop_thread.py``) on the blocking client's loop thread.

Invariants (those of ``client/blocking.py``):
- the asyncio producer and its futures live on the client's loop and are touched only there;
- ``write`` returns only once the record is in the producer's buffer (in call order), so
  records written from one thread keep that thread's order;
- a blocking call made from the loop thread itself raises instead of deadlocking.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Iterable, Mapping

from vellum.client.blocking import BookKeeper
from vellum.client.loop_thread import BlockingFacade, blocking, mirrored
from vellum.client.named import NamedLedgers as AsyncNamedLedgers
from vellum.client.named import OpenMode
from vellum.client.producer import Producer as AsyncProducer
from vellum.client.producer import ProducerSettings, RecordPosition
from vellum.format.entry import DigestType

__all__ = ["Producer", "ProducerSettings", "RecordPosition"]


def _transfer(cf: concurrent.futures.Future[RecordPosition], fut: asyncio.Future[RecordPosition]) -> None:
    if not cf.set_running_or_notify_cancel():
        return
    exc = fut.exception() if not fut.cancelled() else concurrent.futures.CancelledError()
    if exc is not None:
        cf.set_exception(exc)
    else:
        cf.set_result(fut.result())


class Producer(BlockingFacade[AsyncProducer]):
    """Blocking producer of one named ledger: ``with Producer.open(bk, name) as p: p.write(b"v")``."""

    @classmethod
    def open(
        cls,
        bk: BookKeeper,
        name: str,
        mode: OpenMode | str = OpenMode.CREATE_OR_APPEND,
        *,
        settings: ProducerSettings | None = None,
        password: bytes = b"",
        digest_type: str | DigestType | None = None,
        ensemble_size: int | None = None,
        write_quorum_size: int | None = None,
        ack_quorum_size: int | None = None,
        custom_metadata: dict[str, bytes] | None = None,
    ) -> Producer:
        """Open ``name`` for writing through ``bk`` (see :meth:`vellum.client.producer.Producer.open`)."""

        async def start() -> AsyncProducer:
            return await AsyncProducer.open(
                AsyncNamedLedgers(bk.aio), name, mode, settings=settings, password=password,
                digest_type=digest_type, ensemble_size=ensemble_size, write_quorum_size=write_quorum_size,
                ack_quorum_size=ack_quorum_size, custom_metadata=custom_metadata)

        return cls(bk._lt, bk.run(start()))

    name = mirrored(AsyncProducer.name)
    buffered_bytes = mirrored(AsyncProducer.buffered_bytes)

    @property
    def settings(self) -> ProducerSettings:
        return self._aio.settings

    flush = blocking(AsyncProducer.flush)
    close = blocking(AsyncProducer.close)

    def write(
        self,
        value: bytes | bytearray | memoryview,
        *,
        key: bytes | bytearray | memoryview | None = None,
        headers: Mapping[str, bytes] | Iterable[tuple[str, bytes]] | None = None,
        timestamp: int | None = None,
    ) -> concurrent.futures.Future[RecordPosition]:
        """Buffer one record (blocking while the buffer is full) and return the future of its
        position, resolved once its entry is acknowledged (see the async ``write``)."""
        cf: concurrent.futures.Future[RecordPosition] = concurrent.futures.Future()

        async def buffer() -> None:
            fut = await self._aio.write(value, key=key, headers=headers, timestamp=timestamp)
            fut.add_done_callback(lambda f: _transfer(cf, f))

        self._lt.call(buffer())
        return cf

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
