"""Producer: applications write records (value, key, headers, timestamp) into a named ledger,
many records per entry (``records-v1``, ``vellum.format.records``).

Responsibility: :class:`Producer` buffers records into a batch, seals the batch into one entry
when it reaches ``batch_size_bytes`` or when ``linger_ms`` has passed since its first record
(Kafka's ``batch.size`` / ``linger.ms``), appends the entry through the name's writer handle,
and resolves each record's future with its :class:`RecordPosition` once that entry's add is
acknowledged. The blocking form is ``vellum.client.producer_blocking``.

Invariants:
- a record's future resolves only after its entry was acknowledged by the ledger's ack quorum
  (the bookies ack only after their journal fsync, docs/architecture.md): never before;
- records keep their write order: entries are appended in order, records in an entry keep it,
  and writers waiting for buffer room are served first come, first served;
- a failed entry fails every record in it, and the producer: every record written after it
  fails too, so the acknowledged records are always a prefix of the written ones (no gaps);
- records buffered or in flight hold at most ``buffer_memory_bytes`` (counted with
  :func:`~vellum.format.records.record_size`); ``write`` waits for room up to ``max_block_ms``
  (Kafka's ``buffer.memory`` / ``max.block.ms``), then raises ``TimeoutError_``;
- append timestamps never decrease within the segment (a clock stepping back repeats the last);
- the segment ledger the producer writes is marked ``vellum.entryFormat = records-v1`` when its
  session opens it (``NamedLedgers.open(segment_metadata=...)``), so readers decode its entries;
  a name may mix plain, ``rows-v1`` and ``records-v1`` segments.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields

from vellum.client.named import NamedLedgerHandle, NamedLedgers, OpenMode
from vellum.errors import IllegalOpError, IncorrectParameterError, TimeoutError_
from vellum.format.entry import DigestType
from vellum.format.records import ENTRY_FORMAT_KEY, RECORDS_V1, Header, Record, encode_records, record_size

__all__ = ["Producer", "ProducerSettings", "RecordPosition"]

log = logging.getLogger(__name__)

#: the last millisecond of year 9999: later times have no Spark (or ISO-8601) representation
MAX_TIMESTAMP_MS = 253_402_300_799_999
#: a packed entry travels in one frame (nettyMaxFrameSizeBytes is 5 MB by default)
MAX_BATCH_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class RecordPosition:
    """Where a record is: its entry's global id in the name, and its index inside the entry
    (the Spark source's ``entryId`` and ``batchIndex``)."""

    entry_id: int
    batch_index: int


@dataclass(frozen=True)
class ProducerSettings:
    """Batching and memory bounds of a :class:`Producer` (Kafka producer's names in brackets)."""

    #: a batch is sealed into an entry once its records reach this many bytes [batch.size]
    batch_size_bytes: int = 16384
    #: ... or this long after its first record [linger.ms]; 0 seals at the next loop turn
    linger_ms: float = 5.0
    #: records buffered or in flight hold at most this much; write() waits beyond [buffer.memory]
    buffer_memory_bytes: int = 32 * 1024 * 1024
    #: the longest write() waits for buffer room before raising TimeoutError_ [max.block.ms]
    max_block_ms: float = 60_000.0
    #: a record above this is refused [max.request.size]; at most batch_size_bytes' limit of 4 MiB
    max_record_bytes: int = 1024 * 1024

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value < 0 or (value == 0 and f.name != "linger_ms"):
                raise IncorrectParameterError(f"producer setting {f.name} must be > 0, got {value}")
        if self.batch_size_bytes > MAX_BATCH_BYTES or self.max_record_bytes > MAX_BATCH_BYTES:
            raise IncorrectParameterError(
                f"producer settings batch_size_bytes ({self.batch_size_bytes}) and max_record_bytes "
                f"({self.max_record_bytes}) must be at most {MAX_BATCH_BYTES}: an entry travels in one frame")
        if self.max_record_bytes > self.buffer_memory_bytes:
            raise IncorrectParameterError(
                f"producer setting max_record_bytes ({self.max_record_bytes}) is above buffer_memory_bytes "
                f"({self.buffer_memory_bytes}): such a record could never be buffered")


def _headers(headers: Mapping[str, bytes] | Iterable[tuple[str, bytes]] | None) -> tuple[Header, ...]:
    if headers is None:
        return ()
    items = headers.items() if isinstance(headers, Mapping) else headers
    out: list[Header] = []
    for item in items:
        try:
            k, v = item
        except (TypeError, ValueError):
            raise IncorrectParameterError(f"headers must be a mapping or (name, value) pairs, got {item!r}") from None
        if not isinstance(k, str) or not isinstance(v, (bytes, bytearray, memoryview)):
            raise IncorrectParameterError(f"header {k!r}: names are str and values bytes, got "
                                          f"{type(k).__name__} -> {type(v).__name__}")
        out.append((k, bytes(v)))
    return tuple(out)


def make_record(value: bytes | bytearray | memoryview, key: bytes | bytearray | memoryview | None,
                headers: Mapping[str, bytes] | Iterable[tuple[str, bytes]] | None,
                timestamp: int | None) -> Record:
    """A validated :class:`Record` (``IncorrectParameterError`` naming the bad argument)."""
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise IncorrectParameterError(f"value must be bytes, got {type(value).__name__}")
    if key is not None and not isinstance(key, (bytes, bytearray, memoryview)):
        raise IncorrectParameterError(f"key must be bytes or None, got {type(key).__name__}")
    if timestamp is not None and (not isinstance(timestamp, int) or isinstance(timestamp, bool)
                                  or not 0 <= timestamp <= MAX_TIMESTAMP_MS):
        raise IncorrectParameterError(f"timestamp must be milliseconds since the Unix epoch (an int from 0 to "
                                      f"{MAX_TIMESTAMP_MS}, the end of year 9999) or None, got {timestamp!r}")
    return Record(bytes(value), None if key is None else bytes(key), timestamp, _headers(headers))


class Producer:
    """Writes records into one named ledger, batched into entries; see the module docstring.

    Make it with :meth:`open` (which marks the writer's segment as ``records-v1``); use it on
    the loop that opened it. ``async with`` closes it (flushing what is buffered first).
    """

    def __init__(self, handle: NamedLedgerHandle, settings: ProducerSettings | None = None, *,
                 clock: Callable[[], float] = time.time) -> None:
        if not handle.is_writer:
            raise IllegalOpError(f"named ledger {handle.name!r}: a producer needs a handle opened for writing")
        self._handle = handle
        self.settings = settings or ProducerSettings()
        self._clock = clock
        self._last_append_ms = 0  # append times never go back within the segment (see _seal)
        self._first_append_ms: int | None = None  # of the first entry: the segment's time range at close
        self._acked_entries = 0
        self._batch: list[Record] = []
        self._batch_futures: list[asyncio.Future[RecordPosition]] = []
        self._batch_bytes = 0
        self._timer: asyncio.TimerHandle | None = None
        self._used = 0  # bytes of records buffered or in flight
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()
        self._in_flight: set[asyncio.Future[int]] = set()
        self._failed: BaseException | None = None
        self._closed = False

    @classmethod
    async def open(
        cls,
        named: NamedLedgers,
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
        """Open ``name`` for writing (fencing its previous writer, as ``NamedLedgers.open`` does)
        with a new segment marked ``records-v1``, and return its producer."""
        settings = settings or ProducerSettings()  # bad settings fail before the name is touched
        if OpenMode(mode) is OpenMode.READ_ONLY:
            raise IncorrectParameterError("a producer writes: open it with CREATE, APPEND or CREATE_OR_APPEND")
        handle = await named.open(
            name, mode, digest_type=digest_type, password=password, ensemble_size=ensemble_size,
            write_quorum_size=write_quorum_size, ack_quorum_size=ack_quorum_size,
            custom_metadata=custom_metadata, segment_metadata={ENTRY_FORMAT_KEY: RECORDS_V1},
        )
        return cls(handle, settings)

    # ------------------------------------------------------------------ properties
    @property
    def name(self) -> str:
        return self._handle.name

    @property
    def handle(self) -> NamedLedgerHandle:
        return self._handle

    @property
    def buffered_bytes(self) -> int:
        """Bytes of records buffered or in flight (bounded by ``buffer_memory_bytes``)."""
        return self._used

    def __repr__(self) -> str:
        return f"Producer(name={self.name!r}, buffered={self._used}, in_flight_entries={len(self._in_flight)})"

    # ------------------------------------------------------------------ writes
    async def write(
        self,
        value: bytes | bytearray | memoryview,
        *,
        key: bytes | bytearray | memoryview | None = None,
        headers: Mapping[str, bytes] | Iterable[tuple[str, bytes]] | None = None,
        timestamp: int | None = None,
    ) -> asyncio.Future[RecordPosition]:
        """Buffer one record and return the future of its position, resolved once its entry is
        acknowledged (failed with the entry's error otherwise).

        Waits while the buffer is full (up to ``max_block_ms``, then ``TimeoutError_``). Raises
        at once for a bad argument, a record above ``max_record_bytes``, a closed producer, or
        one that failed earlier (the error of the entry that failed).
        """
        record = make_record(value, key, headers, timestamp)
        size = record_size(len(record.value), None if record.key is None else len(record.key), record.headers)
        if size > self.settings.max_record_bytes:
            raise IncorrectParameterError(
                f"named ledger {self.name!r}: a record of {size} bytes (value, key and headers) is above "
                f"max_record_bytes ({self.settings.max_record_bytes})")
        self._check_usable()
        if self._waiters or self._used + size > self.settings.buffer_memory_bytes:
            await self._wait_for_room(size)
            try:
                self._check_usable()
            except BaseException:
                self._used -= size  # closed while waiting: hand the reservation back
                self._wake()
                raise
        else:
            self._used += size
        return self._add(record, size)

    def _check_usable(self) -> None:
        if self._failed is not None:
            raise self._failed
        if self._closed:
            raise IllegalOpError(f"named ledger {self.name!r}: the producer is closed")

    async def _wait_for_room(self, size: int) -> None:
        """Queue behind earlier waiters until ``size`` bytes are reserved for this record."""
        loop = asyncio.get_running_loop()
        room: asyncio.Future[None] = loop.create_future()
        self._waiters.append((size, room))
        try:
            await asyncio.wait({room}, timeout=self.settings.max_block_ms / 1000)
        except asyncio.CancelledError:
            self._give_up(size, room)
            raise
        if not room.done():
            self._give_up(size, room)
            raise TimeoutError_(
                f"named ledger {self.name!r}: no buffer room for a record of {size} bytes within max_block_ms "
                f"({self.settings.max_block_ms:g} ms): {self._used} of buffer_memory_bytes "
                f"({self.settings.buffer_memory_bytes}) are buffered or in flight (the bookies are slow or "
                "unreachable)")
        if room.exception() is not None:
            raise room.exception()  # type: ignore[misc]

    def _give_up(self, size: int, room: asyncio.Future[None]) -> None:
        if room.done() and not room.cancelled() and room.exception() is None:
            self._used -= size  # room was reserved just as we stopped waiting: hand it back
        else:
            room.cancel()
            try:
                self._waiters.remove((size, room))
            except ValueError:
                pass
        self._wake()

    def _wake(self) -> None:
        """Serve waiters in order while their record fits (an empty buffer always fits one)."""
        while self._waiters:
            size, room = self._waiters[0]
            if room.done():
                self._waiters.popleft()
                continue
            if self._failed is not None:
                self._waiters.popleft()
                room.set_exception(self._failed)
                continue
            if self._used and self._used + size > self.settings.buffer_memory_bytes:
                return
            self._waiters.popleft()
            self._used += size
            room.set_result(None)

    def _add(self, record: Record, size: int) -> asyncio.Future[RecordPosition]:
        loop = asyncio.get_running_loop()
        if self._batch and self._batch_bytes + size > self.settings.batch_size_bytes:
            self._seal()  # this record would overfill the batch: it starts the next one
        fut: asyncio.Future[RecordPosition] = loop.create_future()
        self._batch.append(record)
        self._batch_futures.append(fut)
        self._batch_bytes += size
        if self._batch_bytes >= self.settings.batch_size_bytes:
            self._seal()
        elif self._timer is None:
            self._timer = loop.call_later(self.settings.linger_ms / 1000, self._seal)
        return fut

    def _seal(self) -> None:
        """Turn the batch into one entry and append it (in order with every earlier entry)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._batch:
            return
        records, futures, nbytes = self._batch, self._batch_futures, self._batch_bytes
        self._batch, self._batch_futures, self._batch_bytes = [], [], 0
        if self._failed is not None:
            self._entry_failed(futures, nbytes, self._failed)
            return
        try:
            # A clock stepping back repeats the last append time: within a ledger append times never
            # decrease, which offsets by time rely on (docs/spark.md "Offsets by time").
            self._last_append_ms = max(self._last_append_ms, int(self._clock() * 1000))
            if self._first_append_ms is None:
                self._first_append_ms = self._last_append_ms
            entry = encode_records(records, append_timestamp=self._last_append_ms)
            add = self._handle.append_async(entry)
        except Exception as exc:  # the handle refused at once (closed): fail the batch like a failed add
            self._entry_failed(futures, nbytes, exc)
            return
        self._in_flight.add(add)
        add.add_done_callback(lambda f: self._entry_done(f, futures, nbytes))

    def _entry_done(self, add: asyncio.Future[int], futures: list[asyncio.Future[RecordPosition]],
                    nbytes: int) -> None:
        self._in_flight.discard(add)
        exc = add.exception() if not add.cancelled() else asyncio.CancelledError("entry add cancelled")
        if exc is not None:
            self._entry_failed(futures, nbytes, exc)
            return
        entry_id = add.result()
        self._acked_entries += 1
        for i, fut in enumerate(futures):
            if not fut.done():
                fut.set_result(RecordPosition(entry_id, i))
        self._used -= nbytes
        self._wake()

    def _entry_failed(self, futures: list[asyncio.Future[RecordPosition]], nbytes: int,
                      exc: BaseException) -> None:
        if self._failed is None:
            self._failed = exc
            log.warning("producer of named ledger %r failed: %s: %s; every record not yet acknowledged fails",
                        self.name, type(exc).__name__, exc)
        for fut in futures:
            if not fut.done():
                fut.set_exception(exc)
        self._used -= nbytes
        self._wake()

    async def flush(self) -> None:
        """Seal the batch now and wait until every entry written so far is acknowledged or
        failed (the records' futures say which)."""
        self._seal()
        while self._in_flight:
            await asyncio.wait(set(self._in_flight))

    async def close(self) -> None:
        """Flush, then close the name's writer session (its segment). Idempotent."""
        if self._closed:
            return
        try:
            await self.flush()
        finally:
            self._closed = True
            self._wake()
            # Every entry acknowledged: the segment's append-time range goes into the record
            # (the handle checks the count against the segment's entries).
            ok = self._failed is None and self._first_append_ms is not None
            await self._handle.close(time_range=(self._first_append_ms or 0, self._last_append_ms) if ok else None,
                                     entries=self._acked_entries)

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
