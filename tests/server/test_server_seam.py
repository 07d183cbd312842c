"""The server's only view of the bookie is ``AsyncBookie`` (bookie/executor.py): every request
is served by a stand-in with just that API, and each server counts its own requests.

In-process and without disks: a fake ``AsyncBookie`` answers from memory."""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Callable
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from vellum.bookie.bookie import BookieInfo
from vellum.bookie.executor import AsyncBookie
from vellum.errors import (
    EFENCED,
    EINTERNAL,
    EIO,
    ENOENTRY,
    EOK,
    ETOOMANYREQUESTS,
    LedgerFencedError,
    NoSuchEntryError,
)
from vellum.proto import FrameDecoder, encode
from vellum.proto import messages as m
from vellum.server import processors
from vellum.server.bookie_server import BookieServer, ServerLimits
from vellum.server.metrics import ServerMetrics

KEY = bytes(20)
ENTRY = bytes(range(40))


class FakeAsyncBookie:
    """The AsyncBookie API the server uses, answered from memory; records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def _done(self, value: Any) -> asyncio.Future[Any]:
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(value)
        return fut

    def _failed(self, exc: BaseException) -> asyncio.Future[Any]:
        fut = asyncio.get_running_loop().create_future()
        fut.set_exception(exc)
        return fut

    def read_cb(self, ledger_id: int, entry_id: int, fence_key: bytes | None,
                done: Callable[[bytes | None, BaseException | None], None]) -> None:
        """Entry 1 is "in memory" (answered at once), any other comes on a later turn."""
        self.calls.append(("read_cb", ledger_id, entry_id))
        if entry_id == 1:
            done(ENTRY, None)
            return
        outcome = self.read_entry(ledger_id, entry_id)
        outcome.add_done_callback(
            lambda f: done(None, f.exception()) if f.exception() is not None else done(f.result(), None))

    def read_entry(self, ledger_id: int, entry_id: int) -> asyncio.Future[bytes]:
        self.calls.append(("read_entry", ledger_id, entry_id))
        if entry_id == -1:
            return self._failed(NoSuchEntryError("empty"))
        return self._done(ENTRY)

    def read_entries(self, ledger_id: int, first: int, count: int, max_bytes: int) -> asyncio.Future[list[bytes]]:
        self.calls.append(("read_entries", ledger_id, first, count))
        return self._done([ENTRY, ENTRY])

    def read_strided(self, ledger_id: int, first: int, stride: int, count: int,
                     max_bytes: int) -> asyncio.Future[list[bytes]]:
        self.calls.append(("read_strided", ledger_id, first, stride, count))
        return self._done([])

    def read_explicit_lac(self, ledger_id: int) -> asyncio.Future[bytes | None]:
        self.calls.append(("read_explicit_lac", ledger_id))
        return self._done(b"lac")

    @staticmethod
    def _then(fut: asyncio.Future[Any], done: Callable[[Any, BaseException | None], None]) -> None:
        fut.add_done_callback(
            lambda f: done(None, f.exception()) if f.exception() is not None else done(f.result(), None))

    def read_entries_cb(self, ledger_id: int, first: int, count: int, max_bytes: int, fence_key: bytes | None,
                        done: Callable[[Any, BaseException | None], None]) -> None:
        self._then(self.read_entries(ledger_id, first, count, max_bytes), done)

    def read_strided_cb(self, ledger_id: int, first: int, stride: int, count: int, max_bytes: int,
                        done: Callable[[Any, BaseException | None], None]) -> None:
        self._then(self.read_strided(ledger_id, first, stride, count, max_bytes), done)

    def read_lac_cb(self, ledger_id: int, done: Callable[[Any, BaseException | None], None]) -> None:
        """The explicit LAC and the last entry, as ``executor.lac_answer`` reads them."""
        body = self.read_explicit_lac(ledger_id)
        last = self.read_entry(ledger_id, -1)

        def both(_f: asyncio.Future[Any]) -> None:
            if body.exception() is not None:
                done(None, body.exception())
            elif last.exception() is not None and not isinstance(last.exception(), NoSuchEntryError):
                done(None, last.exception())
            else:
                done((body.result() or b"", b"" if last.exception() is not None else last.result()), None)

        asyncio.gather(body, last, return_exceptions=True).add_done_callback(both)

    def entry_ids(self, ledger_id: int) -> asyncio.Future[list[int]]:
        self.calls.append(("entry_ids", ledger_id))
        return self._done([0, 1, 2, 5])

    def trim(self, ledger_id: int, master_key: bytes, end_entry_id: int) -> asyncio.Future[None]:
        self.calls.append(("trim", ledger_id, end_entry_id))
        return self._done(None)

    def note_ledger_closed(self, ledger_id: int) -> None:
        self.calls.append(("note_ledger_closed", ledger_id))

    def info(self) -> asyncio.Future[BookieInfo]:
        self.calls.append(("info",))
        return self._done(BookieInfo(100, 40))


async def _exchange(port: int, requests: list[Any], answers: int) -> list[Any]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    decoder = FrameDecoder(m.DEFAULT_MAX_FRAME_SIZE, side="client")
    writer.write(b"".join(encode(r) for r in requests))
    got: list[Any] = []
    while len(got) < answers:
        data = await asyncio.wait_for(reader.read(1 << 16), 10)
        assert data, "the server closed the connection"
        got += decoder.feed(data)
    writer.close()
    await writer.wait_closed()
    return got


def _server(bookie: FakeAsyncBookie, metrics: ServerMetrics) -> BookieServer:
    return BookieServer(cast(AsyncBookie, bookie), host="127.0.0.1", port=0, limits=ServerLimits(), metrics=metrics)


def test_every_request_is_served_through_the_async_bookie_api() -> None:
    fake = FakeAsyncBookie()
    metrics = ServerMetrics(CollectorRegistry(auto_describe=True))

    async def main() -> list[Any]:
        server = _server(fake, metrics)
        await server.start()
        try:
            return await _exchange(server.port, [
                m.ReadRequest(7, 1),                         # answered at once (in memory)
                m.ReadRequest(7, 2),                         # answered later (a reader-pool read)
                m.BatchReadRequest(7, 0, 11, 10, 0),
                m.StridedReadRequest(12, 7, 0, 3, 10, 0),
                m.ReadLacRequest(13, 7),
                m.ListEntriesRequest(14, 7),
                m.LedgerClosedNote(15, 7),                   # never answered
                m.TrimRequest(16, 7, 3, KEY),
                m.GetBookieInfoRequest(17),
            ], answers=8)
        finally:
            await server.stop()

    answers = asyncio.run(main())
    by_type: dict[type, Any] = {}
    for a in answers:
        by_type.setdefault(type(a), []).append(a)
    assert sorted(r.entry_id for r in by_type[m.ReadResponse]) == [1, 2]
    assert all(r.status == EOK and r.entry == ENTRY for r in by_type[m.ReadResponse])
    assert by_type[m.BatchReadResponse] == [m.BatchReadResponse(EOK, 7, 0, 11, (ENTRY, ENTRY))]
    assert by_type[m.StridedReadResponse] == [m.StridedReadResponse(12, ENOENTRY, 7, 0)]
    assert by_type[m.ReadLacResponse] == [m.ReadLacResponse(13, EOK, 7, b"lac", b"")]
    assert by_type[m.ListEntriesResponse] == [m.ListEntriesResponse(14, EOK, 7, ((0, 2), (5, 5)))]
    assert by_type[m.TrimResponse] == [m.TrimResponse(16, EOK, 7)]
    assert by_type[m.GetBookieInfoResponse] == [m.GetBookieInfoResponse(17, EOK, 100, 40)]
    names = {c[0] for c in fake.calls}
    assert names == {"read_cb", "read_entry", "read_entries", "read_strided", "read_explicit_lac",
                     "entry_ids", "note_ledger_closed", "trim", "info"}
    assert ("note_ledger_closed", 7) in fake.calls


def test_two_servers_in_one_process_keep_separate_counts() -> None:
    registry = CollectorRegistry(auto_describe=True)
    metrics = ServerMetrics(registry)

    async def main() -> Callable[[], str]:
        a, b = _server(FakeAsyncBookie(), metrics), _server(FakeAsyncBookie(), metrics)
        await a.start()
        await b.start()
        assert len(metrics.sources) == 2
        await _exchange(a.port, [m.ReadRequest(1, 1), m.ReadRequest(1, 1)], answers=2)
        await _exchange(b.port, [m.ReadRequest(1, 1), m.ListEntriesRequest(3, 1)], answers=2)
        ca, cb = metrics.sources
        assert (ca.requests["READ"], cb.requests["READ"]) == (2, 1)
        assert cb.requests["LIST_ENTRIES"] == 1 and "LIST_ENTRIES" not in ca.requests
        text = generate_latest(registry).decode()
        assert 'bookkeeper_server_REQUESTS_total{op="READ"} 3.0' in text
        assert 'bookkeeper_server_REQUESTS_total{op="LIST_ENTRIES"} 1.0' in text
        for name in ("bookkeeper_server_CONNECTIONS", "bookkeeper_server_ADD_ENTRY_IN_PROGRESS",
                     "bookkeeper_server_READ_ENTRY_IN_PROGRESS", "bookkeeper_server_REJECTED"):
            assert name in text
        await b.stop()
        assert metrics.sources == (ca,)  # a stopped server no longer counts
        await a.stop()
        return lambda: generate_latest(registry).decode()

    scrape = asyncio.run(main())
    assert metrics.sources == ()
    assert 'op="READ"' not in scrape()


class FailingAsyncBookie(FakeAsyncBookie):
    """Reads of ledger 8 hit a bug (KeyError), reads of ledger 9 a disk error (OSError EIO);
    every add hits a bug in the bookie's add path."""

    def read_entry(self, ledger_id: int, entry_id: int) -> asyncio.Future[bytes]:
        if ledger_id == 8:
            return self._failed(KeyError("a bug in the bookie"))
        if ledger_id == 9:
            return self._failed(OSError(errno.EIO, "Input/output error"))
        return super().read_entry(ledger_id, entry_id)

    def add_batch_cb(self, batch: m.AddBatch,
                     on_result: Callable[[list[BaseException | None], BaseException | None], None]) -> None:
        bug = RuntimeError("a bug in the add path")
        asyncio.get_running_loop().call_soon(on_result, [bug] * len(batch), None)


def test_an_unexpected_exception_is_answered_einternal_logged_once_with_its_ids_and_counted(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # Every line of this test is logged (no rate limit left over from other tests).
    for name, level in (("_UNEXPECTED", logging.ERROR), ("_IO_ERRORS", logging.WARNING)):
        monkeypatch.setattr(processors, name, processors._RateLimitedLog(level, 0.0))
    registry = CollectorRegistry(auto_describe=True)
    metrics = ServerMetrics(registry)
    add = b"".join(encode(m.AddRequest(KEY, (8).to_bytes(8, "big") + i.to_bytes(8, "big") + bytes(24)))
                   for i in range(3))

    async def main() -> tuple[list[Any], str]:
        server = _server(FailingAsyncBookie(), metrics)
        await server.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(encode(m.ReadRequest(8, 2)) + encode(m.ReadRequest(9, 3)) + add)
            decoder = FrameDecoder(m.DEFAULT_MAX_FRAME_SIZE, side="client")
            got: list[Any] = []
            while len(got) < 5:
                data = await asyncio.wait_for(reader.read(1 << 16), 10)
                assert data, "the server closed the connection"
                got += decoder.feed(data)
            writer.close()
            await writer.wait_closed()
            return got, generate_latest(registry).decode()
        finally:
            await server.stop()

    with caplog.at_level(logging.DEBUG, logger="vellum.server.bookie_server"):
        answers, text = asyncio.run(main())
    reads = sorted((a for a in answers if type(a) is m.ReadResponse), key=lambda a: a.ledger_id)
    # A bug is not a disk error: EINTERNAL, not EIO; a disk error stays EIO.
    assert reads == [m.ReadResponse(EINTERNAL, 8, 2), m.ReadResponse(EIO, 9, 3)]
    assert sorted((a.status, a.entry_id) for a in answers if type(a) is m.AddResponse) == [
        (EINTERNAL, 0), (EINTERNAL, 1), (EINTERNAL, 2)]
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    by_ledger = {(r.ledger_id, r.entry_id): r for r in errors}  # type: ignore[attr-defined]
    assert len(errors) == 3, [r.getMessage() for r in errors]  # the three adds' one bug: one line
    read_bug, disk, add_bug = by_ledger[(8, 2)], by_ledger[(9, 3)], by_ledger[(8, 0)]
    assert read_bug.levelno == logging.ERROR and read_bug.exc_info is not None
    assert "READ of entry 2 of ledger 8 from ('127.0.0.1'" in read_bug.getMessage()
    assert "failed unexpectedly, answering EINTERNAL: KeyError('a bug in the bookie')" in read_bug.getMessage()
    assert disk.levelno == logging.WARNING and "answering EIO" in disk.getMessage()
    assert add_bug.levelno == logging.ERROR and "ADD of entry 0 of ledger 8" in add_bug.getMessage()
    assert str(read_bug.peer).startswith("('127.0.0.1'")  # type: ignore[attr-defined]
    assert 'bookkeeper_server_REQUEST_ERRORS_total{op="READ",status="EINTERNAL"} 1.0' in text
    assert 'bookkeeper_server_REQUEST_ERRORS_total{op="READ",status="EIO"} 1.0' in text
    assert 'bookkeeper_server_REQUEST_ERRORS_total{op="ADD",status="EINTERNAL"} 3.0' in text


class RaisingAsyncBookie(FakeAsyncBookie):
    """Hands a READ of ledger 8 and every LEDGER_CLOSED note back with an exception raised at
    once, in the processor's own call (the bug guard of ``Processors.dispatch``)."""

    def read_cb(self, ledger_id: int, entry_id: int, fence_key: bytes | None,
                done: Callable[[bytes | None, BaseException | None], None]) -> None:
        if ledger_id == 8:
            raise KeyError("a bug in read_cb")
        super().read_cb(ledger_id, entry_id, fence_key, done)

    def note_ledger_closed(self, ledger_id: int) -> None:
        raise OSError(errno.EIO, "Input/output error")


def test_a_processor_that_raises_is_answered_with_its_own_refusal_and_the_connection_serves_on(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    for name, level in (("_UNEXPECTED", logging.ERROR), ("_IO_ERRORS", logging.WARNING)):
        monkeypatch.setattr(processors, name, processors._RateLimitedLog(level, 0.0))
    registry = CollectorRegistry(auto_describe=True)
    metrics = ServerMetrics(registry)

    async def main() -> tuple[list[Any], str]:
        server = _server(RaisingAsyncBookie(), metrics)
        await server.start()
        try:
            got = await _exchange(server.port, [m.ReadRequest(8, 2), m.LedgerClosedNote(3, 9), m.ReadRequest(7, 1)],
                                  answers=2)
            return got, generate_latest(registry).decode()
        finally:
            await server.stop()

    with caplog.at_level(logging.DEBUG, logger="vellum.server.bookie_server"):
        answers, text = asyncio.run(main())
    # The READ's own response type, EINTERNAL (a bug, not a disk error); the note gets no answer;
    # the next request on the connection is served.
    assert answers == [m.ReadResponse(EINTERNAL, 8, 2), m.ReadResponse(EOK, 7, 1, ENTRY)]
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(errors) == 2, [r.getMessage() for r in errors]
    bug, disk = errors
    assert (bug.ledger_id, bug.entry_id) == (8, 2) and bug.exc_info is not None  # type: ignore[attr-defined]
    assert "READ of entry 2 of ledger 8 from" in bug.getMessage() and "answering EINTERNAL" in bug.getMessage()
    assert (disk.ledger_id, disk.levelno) == (9, logging.WARNING)  # type: ignore[attr-defined]
    assert 'bookkeeper_server_REQUEST_ERRORS_total{op="READ",status="EINTERNAL"} 1.0' in text
    assert 'bookkeeper_server_REQUEST_ERRORS_total{op="LEDGER_CLOSED",status="EIO"} 1.0' in text


class HoldingAsyncBookie(FakeAsyncBookie):
    """Adds and reads are held until the test answers them; entry 1 of every add batch is
    refused as fenced."""

    def __init__(self) -> None:
        super().__init__()
        self.adds: list[tuple[m.AddBatch, Any]] = []
        self.reads: list[Any] = []

    def add_batch_cb(self, batch: m.AddBatch, on_result: Any) -> None:
        self.adds.append((batch, on_result))

    def read_cb(self, ledger_id: int, entry_id: int, fence_key: bytes | None, done: Any) -> None:
        self.reads.append(done)


def _add_frame(ledger_id: int, entry_id: int) -> bytes:
    return encode(m.AddRequest(KEY, ledger_id.to_bytes(8, "big") + entry_id.to_bytes(8, "big") + bytes(24)))


def test_a_batch_past_the_bound_is_refused_at_once_and_the_rest_answered_in_one_reply_with_each_status() -> None:
    """The processor decides before the batch goes down: the adds past maxAddsInProgressLimit are
    answered ETOOMANYREQUESTS at once, the others go to the bookie as one batch; their answer
    carries each add's own status (a refused add its refusal, the others the durable outcome),
    and while a READ is with the bookie the connection is busy (the guard's idle timeout)."""
    bookie = HoldingAsyncBookie()
    metrics = ServerMetrics(CollectorRegistry(auto_describe=True))

    async def main() -> tuple[list[Any], list[Any]]:
        server = BookieServer(cast(AsyncBookie, bookie), host="127.0.0.1", port=0,
                              limits=ServerLimits(max_adds_in_progress=3), metrics=metrics)
        await server.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            decoder = FrameDecoder(m.DEFAULT_MAX_FRAME_SIZE, side="client")

            async def answers(n: int) -> list[Any]:
                got: list[Any] = []
                while len(got) < n:
                    data = await asyncio.wait_for(reader.read(1 << 16), 10)
                    assert data, "the server closed the connection"
                    got += decoder.feed(data)
                return got

            writer.write(b"".join(_add_frame(4, i) for i in range(5)) + encode(m.ReadRequest(4, 9)))
            at_once = await answers(2)
            for _ in range(200):
                if bookie.adds and bookie.reads:
                    break
                await asyncio.sleep(0.01)
            (conn,) = server._connections
            assert conn.is_busy()
            (batch, on_result), = bookie.adds
            assert batch.entry_ids == [0, 1, 2]  # the admitted ones, as one batch
            on_result([None, LedgerFencedError("fenced"), None], None)
            bookie.reads[0](b"", NoSuchEntryError("no entry 9"))
            later = await answers(4)
            assert not conn.is_busy()
            writer.close()
            await writer.wait_closed()
            return at_once, later
        finally:
            await server.stop()

    at_once, later = asyncio.run(main())
    assert at_once == [m.AddResponse(ETOOMANYREQUESTS, 4, 3), m.AddResponse(ETOOMANYREQUESTS, 4, 4)]
    assert later == [m.AddResponse(EOK, 4, 0), m.AddResponse(EFENCED, 4, 1), m.AddResponse(EOK, 4, 2),
                     m.ReadResponse(ENOENTRY, 4, 9)]
