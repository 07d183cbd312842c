"""The bookie's read processors (READ, BATCH_READ, READ_STRIDED, READ_LAC, LONG_POLL_READ_LAC)
answer without an asyncio task per request: each is handed to ``AsyncBookie`` once in callback
form and answered once. A long poll waits on a LAC watcher and a timer. The reader-pool
requests (LIST_ENTRIES, GET_BOOKIE_INFO, TRIM) are answered from their future's done callback,
WRITE_LAC and COLLECT from one callback each, without a task either.

The real server and the real ``AsyncBookie`` (its reader pool, its bridge back to the loop) over
a stand-in ``Bookie`` that answers from memory (no disks), driven over loopback TCP."""

from __future__ import annotations

import asyncio
import errno
import logging
import threading
from collections.abc import Callable, Coroutine, Generator
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from vellum.bookie.bookie import Bookie, BookieInfo
from vellum.bookie.executor import AsyncBookie
from vellum.errors import (
    EINTERNAL,
    EIO,
    ENOENTRY,
    ENOLEDGER,
    EOK,
    NoSuchEntryError,
    NoSuchLedgerError,
    VellumError,
)
from vellum.proto import FrameDecoder, encode
from vellum.proto import messages as m
from vellum.server import processors
from vellum.server.bookie_server import BookieServer, ServerLimits
from vellum.server.metrics import ServerMetrics
from vellum.storage.gc import GcReport

KEY = bytes(20)
BUG_LEDGER = 8    # every read of it hits a bug (KeyError): EINTERNAL, never EIO
DISK_LEDGER = 9   # every read of it is a disk error (OSError EIO): EIO
NO_LEDGER = 10    # not held: ENOLEDGER
BAD_LEDGER = 11   # its reads succeed with something that cannot be encoded (a bug answering them)
SLOW_LEDGER = 12  # its list of entries waits until the test lets it go
GC_FAILS_LEDGER = 13  # the GC pass of its COLLECT fails
NO_DIRS_LEDGER = 14  # no ledger dir holds it: its COLLECT waits for no pass
GC_STOPPED_LEDGER = 15  # the GC thread of one of its dirs is not running


class FakeGc:
    """A dir's GC thread as COLLECT uses it: a requested pass answers from another thread."""

    def __init__(self, error: str = "", running: bool = True) -> None:
        self.error = error
        self.running = running

    def request_pass(self, on_done: Callable[[GcReport], None]) -> None:
        if not self.running:
            raise VellumError("GC of this dir is not running: cannot collect now")
        threading.Thread(target=on_done, args=(GcReport(reclaimed_bytes=10, error=self.error),)).start()

    def garbage_bytes(self) -> int:
        return 3


def _entry(ledger_id: int, entry_id: int) -> bytes:
    return ledger_id.to_bytes(8, "big") + entry_id.to_bytes(8, "big") + bytes(24)


class MemoryBookie:
    """The ``Bookie`` calls ``AsyncBookie`` makes for reads, from memory: ledger 7 holds entries
    0..9 (0 in the write cache) and an explicit LAC; the LAC advances when the test says."""

    def __init__(self) -> None:
        self.lac = 5
        self.watchers: list[tuple[int, Callable[[int], None]]] = []
        self.fenced: list[int] = []
        self.trimmed: list[tuple[int, int]] = []
        self.lacs: list[tuple[int, int, bytes]] = []
        self.slow = threading.Event()

    def _check(self, ledger_id: int) -> None:
        if ledger_id == BUG_LEDGER:
            raise KeyError("a bug in the bookie")
        if ledger_id == DISK_LEDGER:
            raise OSError(errno.EIO, "Input/output error")
        if ledger_id == NO_LEDGER:
            raise NoSuchLedgerError(f"ledger {ledger_id} not on this bookie")

    def needs_key_check(self, ledger_id: int) -> bool:
        return False

    def fence_ledger(self, ledger_id: int, master_key: bytes, callback: Callable[[BaseException | None], None]) -> None:
        self.fenced.append(ledger_id)
        callback(None)

    def read_cached_entry(self, ledger_id: int, entry_id: int) -> bytes | None:
        self._check(ledger_id)
        return _entry(ledger_id, 0) if entry_id == 0 else None

    def read_entry(self, ledger_id: int, entry_id: int) -> bytes:
        self._check(ledger_id)
        if entry_id == -1:
            entry_id = 9
        if not 0 <= entry_id <= 9:
            raise NoSuchEntryError(f"entry {entry_id}")
        return _entry(ledger_id, entry_id)

    def read_entries(self, ledger_id: int, first: int, max_count: int, max_bytes: int) -> list[bytes]:
        self._check(ledger_id)
        if ledger_id == BAD_LEDGER:
            return [None]  # type: ignore[list-item]
        return [_entry(ledger_id, e) for e in range(first, min(first + max_count, 10))]

    def read_strided(self, ledger_id: int, first: int, stride: int, max_count: int, max_bytes: int) -> list[bytes]:
        self._check(ledger_id)
        if ledger_id == BAD_LEDGER:
            return [None]  # type: ignore[list-item]
        return [_entry(ledger_id, e) for e in range(first, 10, stride)][:max_count]

    def read_explicit_lac(self, ledger_id: int) -> bytes | None:
        self._check(ledger_id)
        return 42 if ledger_id == BAD_LEDGER else b"explicit"  # type: ignore[return-value]

    def entry_ids(self, ledger_id: int) -> list[int]:
        if ledger_id == SLOW_LEDGER:
            assert self.slow.wait(10)
            return [0]
        self._check(ledger_id)
        if ledger_id == BAD_LEDGER:
            return [None, 1]  # type: ignore[list-item]  # cannot be made into ranges
        return [0, 1, 2, 5]

    def trim(self, ledger_id: int, master_key: bytes, end_entry_id: int) -> None:
        self._check(ledger_id)
        self.trimmed.append((ledger_id, end_entry_id))

    def info(self) -> BookieInfo:
        return BookieInfo(100, 40)

    def write_explicit_lac(self, ledger_id: int, master_key: bytes, lac: int, body: bytes,
                           callback: Callable[[BaseException | None], None]) -> None:
        self._check(ledger_id)  # refused at once, on the caller's thread
        self.lacs.append((ledger_id, lac, body))
        threading.Thread(target=callback, args=(None,)).start()  # durable, on a journal thread

    def prepare_collect(self, ledger_id: int, master_key: bytes, end_entry_id: int) -> list[FakeGc]:
        self._check(ledger_id)
        if ledger_id == NO_DIRS_LEDGER:
            return []
        return [FakeGc("the disk went away" if ledger_id == GC_FAILS_LEDGER else ""),
                FakeGc(running=ledger_id != GC_STOPPED_LEDGER)]

    def watch_lac(self, ledger_id: int, previous_lac: int, fn: Callable[[int], None]) -> Callable[[], None]:
        if self.lac > previous_lac:
            fn(self.lac)
            return lambda: None
        entry = (previous_lac, fn)
        self.watchers.append(entry)

        def cancel() -> None:
            if entry in self.watchers:
                self.watchers.remove(entry)

        return cancel

    def advance(self, lac: int) -> None:
        """As the add path does, from another thread."""
        self.lac = lac
        fire = [fn for previous, fn in self.watchers if lac > previous]
        self.watchers = [(p, fn) for p, fn in self.watchers if lac <= p]
        for fn in fire:
            threading.Thread(target=fn, args=(lac,)).start()


class Client:
    """One raw connection: requests out, decoded answers in (no task: ``asyncio.timeout``)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.decoder = FrameDecoder(m.DEFAULT_MAX_FRAME_SIZE, side="client")
        self.got: list[Any] = []

    def send(self, *requests: Any) -> None:
        self.writer.write(b"".join(encode(r) for r in requests))

    async def answers(self, n: int) -> list[Any]:
        async with asyncio.timeout(10):
            while len(self.got) < n:
                data = await self.reader.read(1 << 16)
                assert data, "the server closed the connection"
                self.got += self.decoder.feed(data)
        out, self.got = self.got[:n], self.got[n:]
        return out


def _serve(fake: MemoryBookie, test: Callable[[BookieServer, Client, AsyncBookie], Coroutine[Any, Any, Any]],
           limits: ServerLimits | None = None, metrics: ServerMetrics | None = None) -> Any:
    async def main() -> Any:
        loop = asyncio.get_running_loop()
        ab = AsyncBookie(cast(Bookie, fake), loop, read_threads=2)
        server = BookieServer(ab, host="127.0.0.1", port=0, limits=limits or ServerLimits(),
                              metrics=metrics or ServerMetrics(CollectorRegistry(auto_describe=True)))
        await server.start()
        try:
            client = Client(*await asyncio.open_connection("127.0.0.1", server.port))
            try:
                return await test(server, client, ab)
            finally:
                client.writer.close()
                await client.writer.wait_closed()
        finally:
            await server.stop()
            ab.close()

    return asyncio.run(main())


class TaskCount:
    """Counts the tasks created on the running loop while it is installed (by coroutine name)."""

    def __init__(self) -> None:
        self.created: list[str] = []

    def __enter__(self) -> TaskCount:
        loop = asyncio.get_running_loop()
        self._loop, self._before = loop, loop.get_task_factory()

        def factory(loop: asyncio.AbstractEventLoop, coro: Generator[Any, None, Any] | Coroutine[Any, Any, Any],
                    **kwargs: Any) -> asyncio.Future[Any]:
            self.created.append(getattr(coro, "__qualname__", repr(coro)))
            return asyncio.Task(coro, loop=loop, **kwargs)

        loop.set_task_factory(factory)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.set_task_factory(self._before)


BURST = 20


def _burst() -> list[Any]:
    """Of each read kind, BURST requests (fencing and not, from memory and from the pool)."""
    out: list[Any] = []
    for i in range(BURST):
        out += [
            m.ReadRequest(7, i % 3),                                       # 0: from memory, else the pool
            m.BatchReadRequest(7, i % 10, 1000 + i, 4, 0),
            m.BatchReadRequest(7, 0, 2000 + i, 2, 0, flags=m.FLAG_DO_FENCING, master_key=KEY),
            m.StridedReadRequest(3000 + i, 7, i % 10, 3, 4, 0),
            m.ReadLacRequest(4000 + i, 7),
            m.LongPollReadLacRequest(5000 + i, 7, 2, 1000),                # LAC 5 > 2: answered at once
        ]
    return out


def test_a_burst_of_every_read_kind_starts_no_task_and_each_is_answered_once() -> None:
    fake = MemoryBookie()

    async def test(server: BookieServer, client: Client, ab: AsyncBookie) -> tuple[list[Any], list[str]]:
        requests = _burst()
        with TaskCount() as tasks:
            client.send(*requests)
            got = await client.answers(len(requests))
            # the long polls that wait: one answered by the LAC passing, one by its timeout
            client.send(m.LongPollReadLacRequest(6000, 7, 5, 10_000), m.LongPollReadLacRequest(6001, 7, 50, 100))
            await asyncio.sleep(0.05)
            assert len(fake.watchers) == 2
            fake.advance(6)
            got += await client.answers(2)
        assert not fake.watchers  # both watches dropped once answered
        return got, tasks.created

    answers, created = _serve(fake, test)
    assert created == [], f"read requests started tasks: {created}"
    by_type: dict[type, list[Any]] = {}
    for a in answers:
        by_type.setdefault(type(a), []).append(a)
    assert len(by_type[m.ReadResponse]) == BURST and all(r.status == EOK for r in by_type[m.ReadResponse])
    batch = {r.request_id: r for r in by_type[m.BatchReadResponse]}
    assert len(batch) == 2 * BURST and all(r.status == EOK for r in batch.values())
    assert [bytes(e) for e in batch[1003].entries] == [_entry(7, e) for e in (3, 4, 5, 6)]
    strided = {r.request_id: r for r in by_type[m.StridedReadResponse]}
    assert len(strided) == BURST
    assert [bytes(e) for e in strided[3001].entries] == [_entry(7, e) for e in (1, 4, 7)]
    lac = by_type[m.ReadLacResponse]
    assert len(lac) == BURST and all((r.status, r.lac_body, bytes(r.last_entry)) == (EOK, b"explicit", _entry(7, 9))
                                     for r in lac)
    polls = {r.request_id: r for r in by_type[m.LongPollReadLacResponse]}
    assert len(polls) == BURST + 2 and all(r.status == EOK for r in polls.values())
    assert answers[-2:] == [polls[6000], polls[6001]] or answers[-2:] == [polls[6001], polls[6000]]
    assert fake.fenced == [7] * BURST


def test_a_long_poll_is_answered_at_its_timeout_and_dropped_when_the_connection_closes() -> None:
    fake = MemoryBookie()

    async def test(server: BookieServer, client: Client, ab: AsyncBookie) -> tuple[float, Any]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        client.send(m.LongPollReadLacRequest(1, 7, 5, 150))
        [answer] = await client.answers(1)
        waited = loop.time() - start
        # a poll left waiting: the connection is busy; closing it drops the watch and the timer
        client.send(m.LongPollReadLacRequest(2, 7, 5, 60_000))
        await asyncio.sleep(0.05)
        [conn] = list(server._connections)  # type: ignore[attr-defined]
        assert conn.is_busy() and len(fake.watchers) == 1
        client.writer.close()
        await client.writer.wait_closed()
        for _ in range(100):
            if not fake.watchers:
                break
            await asyncio.sleep(0.01)
        assert not fake.watchers and not conn.is_busy()
        client.writer = _Closed()  # type: ignore[assignment]
        return waited, answer

    waited, answer = _serve(fake, test)
    assert waited >= 0.14  # not before its timeout
    assert answer == m.LongPollReadLacResponse(1, EOK, 7, b"explicit", _entry(7, 9))


class _Closed:
    def close(self) -> None:
        pass

    async def wait_closed(self) -> None:
        pass


@pytest.fixture
def every_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every failure line is logged (no rate limit left over from other tests)."""
    for name, level in (("_UNEXPECTED", logging.ERROR), ("_IO_ERRORS", logging.WARNING)):
        monkeypatch.setattr(processors, name, processors._RateLimitedLog(level, 0.0))


FAILING = [
    ("READ", lambda lid: m.ReadRequest(lid, 3), lambda a: (a.status, a.ledger_id, a.entry_id), 3),
    ("BATCH_READ", lambda lid: m.BatchReadRequest(lid, 4, 11, 3, 0), lambda a: (a.status, a.ledger_id, 4), 4),
    ("READ_STRIDED", lambda lid: m.StridedReadRequest(12, lid, 2, 3, 3, 0), lambda a: (a.status, a.ledger_id, 2), 2),
    ("READ_LAC", lambda lid: m.ReadLacRequest(13, lid), lambda a: (a.status, a.ledger_id, None), None),
    ("LONG_POLL_READ_LAC", lambda lid: m.LongPollReadLacRequest(14, lid, -1, 1000),
     lambda a: (a.status, a.ledger_id, None), None),
]


@pytest.mark.parametrize(("op", "request_of", "ids_of", "entry_id"), FAILING, ids=[f[0] for f in FAILING])
def test_a_failing_storage_read_is_answered_with_its_status_logged_once_with_its_ids_and_counted(
        every_line: None, caplog: pytest.LogCaptureFixture, op: str, request_of: Callable[[int], Any],
        ids_of: Callable[[Any], tuple[int, int, int | None]], entry_id: int | None) -> None:
    registry = CollectorRegistry(auto_describe=True)
    metrics = ServerMetrics(registry)

    async def test(server: BookieServer, client: Client, ab: AsyncBookie) -> tuple[list[Any], str]:
        client.send(request_of(BUG_LEDGER), request_of(DISK_LEDGER), request_of(NO_LEDGER), request_of(7))
        got = await client.answers(4)
        return got, generate_latest(registry).decode()

    with caplog.at_level(logging.DEBUG, logger="vellum.server.bookie_server"):
        answers, text = _serve(MemoryBookie(), test, metrics=metrics)
    statuses = {ids_of(a)[1]: ids_of(a)[0] for a in answers}
    # A bug is not a disk error: EINTERNAL, never EIO; a disk error stays EIO.
    assert statuses == {BUG_LEDGER: EINTERNAL, DISK_LEDGER: EIO, NO_LEDGER: ENOLEDGER, 7: EOK}
    lines = [r for r in caplog.records if getattr(r, "ledger_id", None) in (BUG_LEDGER, DISK_LEDGER, NO_LEDGER)]
    by_ledger: dict[int, list[logging.LogRecord]] = {}
    for r in lines:
        by_ledger.setdefault(r.ledger_id, []).append(r)  # type: ignore[attr-defined]
    assert {lid: len(rs) for lid, rs in by_ledger.items()} == {BUG_LEDGER: 1, DISK_LEDGER: 1, NO_LEDGER: 1}
    [bug], [disk], [missing] = by_ledger[BUG_LEDGER], by_ledger[DISK_LEDGER], by_ledger[NO_LEDGER]
    assert bug.levelno == logging.ERROR and bug.exc_info is not None
    assert bug.entry_id == entry_id  # type: ignore[attr-defined]
    assert f"of ledger {BUG_LEDGER} from ('127.0.0.1'" in bug.getMessage()
    assert "failed unexpectedly, answering EINTERNAL: KeyError('a bug in the bookie')" in bug.getMessage()
    assert disk.levelno == logging.WARNING and "answering EIO" in disk.getMessage()
    assert missing.levelno == logging.DEBUG
    for status in ("EINTERNAL", "EIO", "ENOLEDGER"):
        assert f'bookkeeper_server_REQUEST_ERRORS_total{{op="{op}",status="{status}"}} 1.0' in text
    assert f'bookkeeper_server_REQUESTS_total{{op="{op}"}} 4.0' in text


class RaisingAsyncBookie(AsyncBookie):
    """Its reads (single, multi-entry, LAC) raise in the hand-down itself, for ledger 8 (a bug)."""

    def read_cb(self, ledger_id: int, *args: Any) -> None:
        if ledger_id == BUG_LEDGER:
            raise KeyError("a bug in read_cb")
        super().read_cb(ledger_id, *args)

    def read_entries_cb(self, ledger_id: int, *args: Any) -> None:
        if ledger_id == BUG_LEDGER:
            raise KeyError("a bug in read_entries_cb")
        super().read_entries_cb(ledger_id, *args)

    def read_strided_cb(self, ledger_id: int, *args: Any) -> None:
        if ledger_id == BUG_LEDGER:
            raise KeyError("a bug in read_strided_cb")
        super().read_strided_cb(ledger_id, *args)

    def read_lac_cb(self, ledger_id: int, *args: Any) -> None:
        if ledger_id == BUG_LEDGER:
            raise KeyError("a bug in read_lac_cb")
        super().read_lac_cb(ledger_id, *args)


def test_a_hand_down_that_raises_is_refused_by_the_bug_guard_and_leaves_the_read_bound_and_busy_clear(
        every_line: None, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> tuple[list[Any], bool]:
        loop = asyncio.get_running_loop()
        ab = RaisingAsyncBookie(cast(Bookie, MemoryBookie()), loop, read_threads=1)
        # one read in progress at most: a leaked admission would refuse every later read
        server = BookieServer(ab, host="127.0.0.1", port=0, limits=ServerLimits(max_reads_in_progress=1),
                              metrics=ServerMetrics(CollectorRegistry(auto_describe=True)))
        await server.start()
        try:
            client = Client(*await asyncio.open_connection("127.0.0.1", server.port))
            got: list[Any] = []
            for bad, good in ((m.BatchReadRequest(BUG_LEDGER, 0, 1, 2, 0), m.BatchReadRequest(7, 0, 2, 2, 0)),
                              (m.StridedReadRequest(3, BUG_LEDGER, 0, 2, 2, 0), m.StridedReadRequest(4, 7, 0, 2, 2, 0)),
                              (m.ReadLacRequest(5, BUG_LEDGER), m.ReadLacRequest(6, 7)),
                              (m.ReadRequest(BUG_LEDGER, 1), m.ReadRequest(7, 1))):
                client.send(bad)
                got += await client.answers(1)
                client.send(good)
                got += await client.answers(1)
            [conn] = list(server._connections)  # type: ignore[attr-defined]
            busy = conn.is_busy()
            client.writer.close()
            await client.writer.wait_closed()
            return got, busy
        finally:
            await server.stop()
            ab.close()

    with caplog.at_level(logging.DEBUG, logger="vellum.server.bookie_server"):
        answers, busy = asyncio.run(main())
    assert not busy
    assert answers[0] == m.BatchReadResponse(EINTERNAL, BUG_LEDGER, 0, 1)
    assert answers[1].status == EOK and len(answers[1].entries) == 2
    assert answers[2] == m.ErrorResponse(EINTERNAL, 3, m.OP_READ_STRIDED, BUG_LEDGER)
    assert answers[3].status == EOK and len(answers[3].entries) == 2
    assert answers[4] == m.ErrorResponse(EINTERNAL, 5, m.OP_READ_LAC, BUG_LEDGER)
    assert answers[5].status == EOK
    assert answers[6] == m.ReadResponse(EINTERNAL, BUG_LEDGER, 1)
    assert answers[7].status == EOK and answers[7].entry_id == 1
    bugs = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [(r.ledger_id, r.entry_id, r.levelno) for r in bugs] == [  # type: ignore[attr-defined]
        (BUG_LEDGER, 0, logging.ERROR), (BUG_LEDGER, 0, logging.ERROR), (BUG_LEDGER, None, logging.ERROR),
        (BUG_LEDGER, 1, logging.ERROR)]
    assert "BATCH_READ of entry 0 of ledger 8" in bugs[0].getMessage() and bugs[0].exc_info is not None


@pytest.mark.parametrize(("op", "request_of", "ids_of", "entry_id"), FAILING[1:], ids=[f[0] for f in FAILING[1:]])
def test_an_answer_that_cannot_be_sent_is_answered_einternal_and_logged_once(
        every_line: None, caplog: pytest.LogCaptureFixture, op: str, request_of: Callable[[int], Any],
        ids_of: Callable[[Any], tuple[int, int, int | None]], entry_id: int | None) -> None:
    async def test(server: BookieServer, client: Client, ab: AsyncBookie) -> list[Any]:
        client.send(request_of(BAD_LEDGER), request_of(7))
        return await client.answers(2)

    with caplog.at_level(logging.DEBUG, logger="vellum.server.bookie_server"):
        answers = _serve(MemoryBookie(), test)
    assert sorted(ids_of(a)[:2] for a in answers) == [(EOK, 7), (EINTERNAL, BAD_LEDGER)]
    [bug] = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert (bug.ledger_id, bug.entry_id, bug.levelno) == (BAD_LEDGER, entry_id, logging.ERROR)  # type: ignore[attr-defined]
    assert bug.getMessage().startswith(op) and bug.exc_info is not None


def test_an_empty_run_is_no_such_entry() -> None:
    async def test(server: BookieServer, client: Client, ab: AsyncBookie) -> list[Any]:
        client.send(m.BatchReadRequest(7, 20, 1, 3, 0), m.StridedReadRequest(2, 7, 20, 2, 3, 0))
        return await client.answers(2)

    assert _serve(MemoryBookie(), test) == [m.BatchReadResponse(ENOENTRY, 7, 20, 1), m.StridedReadResponse(2, ENOENTRY, 7, 20)]


def test_list_entries_bookie_info_and_trim_start_no_task_and_answer_each_outcome_with_their_own_response() -> None:
    """Each is handed to the bookie's reader pool once and answered once from the future's done
    callback: results, and every failure (no such ledger, a disk error, a bug in the bookie, a
    bug building the answer) with the request's own response type; no task is started, and the
    connection is busy while one is in progress."""
    fake = MemoryBookie()

    async def test(server: BookieServer, client: Client, ab: AsyncBookie) -> tuple[list[Any], list[str], bool, bool]:
        requests: list[Any] = []
        for i in range(BURST):
            requests += [m.ListEntriesRequest(100 + i, 7), m.GetBookieInfoRequest(200 + i),
                         m.TrimRequest(300 + i, 7, i, KEY)]
        requests += [m.ListEntriesRequest(400, NO_LEDGER), m.ListEntriesRequest(401, DISK_LEDGER),
                     m.TrimRequest(402, BUG_LEDGER, 3, KEY), m.ListEntriesRequest(403, BAD_LEDGER)]
        with TaskCount() as tasks:
            client.send(*requests)
            got = await client.answers(len(requests))
            client.send(m.ListEntriesRequest(500, SLOW_LEDGER))
            await asyncio.sleep(0.05)
            [conn] = list(server._connections)  # type: ignore[attr-defined]
            busy_while_listing = conn.is_busy()
            fake.slow.set()
            got += await client.answers(1)
            busy_after = conn.is_busy()
        return got, tasks.created, busy_while_listing, busy_after

    answers, created, busy_while_listing, busy_after = _serve(fake, test)
    assert created == [], f"LIST_ENTRIES, GET_BOOKIE_INFO or TRIM started tasks: {created}"
    assert busy_while_listing and not busy_after
    by_id = {a.request_id: a for a in answers}
    assert len(by_id) == len(answers) == 3 * BURST + 5  # each answered once
    for i in range(BURST):
        assert by_id[100 + i] == m.ListEntriesResponse(100 + i, EOK, 7, ((0, 2), (5, 5)))
        assert by_id[200 + i] == m.GetBookieInfoResponse(200 + i, EOK, 100, 40)
        assert by_id[300 + i] == m.TrimResponse(300 + i, EOK, 7)
    assert sorted(fake.trimmed) == sorted((7, i) for i in range(BURST))
    assert by_id[400] == m.ListEntriesResponse(400, ENOLEDGER, NO_LEDGER)
    assert by_id[401] == m.ListEntriesResponse(401, EIO, DISK_LEDGER)
    assert by_id[402] == m.TrimResponse(402, EINTERNAL, BUG_LEDGER)
    assert by_id[403] == m.ListEntriesResponse(403, EINTERNAL, BAD_LEDGER)
    assert by_id[500] == m.ListEntriesResponse(500, EOK, SLOW_LEDGER, ((0, 0),))


def test_write_lac_and_collect_start_no_task_and_answer_each_outcome_with_their_own_response(
        every_line: None, caplog: pytest.LogCaptureFixture) -> None:
    """WRITE_LAC is answered once durable (``write_explicit_lac_cb``), COLLECT once the GC
    passes it asked for have run and the garbage left is measured (``collect_cb``); each
    failure with the request's own response type; no task is started."""
    fake = MemoryBookie()

    async def test(server: BookieServer, client: Client, ab: AsyncBookie) -> tuple[list[Any], list[str]]:
        requests: list[Any] = []
        for i in range(BURST):
            requests += [m.WriteLacRequest(100 + i, 7, i, KEY, b"lac%d" % i), m.CollectRequest(200 + i, 7, i, KEY)]
        requests += [m.WriteLacRequest(300, NO_LEDGER, 1, KEY, b"x"), m.WriteLacRequest(301, BUG_LEDGER, 1, KEY, b"x"),
                     m.CollectRequest(302, NO_LEDGER, 1, KEY), m.CollectRequest(303, GC_FAILS_LEDGER, 1, KEY),
                     m.CollectRequest(304, NO_DIRS_LEDGER, 1, KEY), m.CollectRequest(305, GC_STOPPED_LEDGER, 1, KEY)]
        with TaskCount() as tasks:
            client.send(*requests)
            got = await client.answers(len(requests))
        return got, tasks.created

    with caplog.at_level(logging.INFO, logger="vellum.server.bookie_server"):
        answers, created = _serve(fake, test)
    assert created == [], f"WRITE_LAC or COLLECT started tasks: {created}"
    by_id = {a.request_id: a for a in answers}
    assert len(by_id) == len(answers) == 2 * BURST + 6  # each answered once
    for i in range(BURST):
        assert by_id[100 + i] == m.WriteLacResponse(100 + i, EOK, 7)
        assert by_id[200 + i] == m.CollectResponse(200 + i, EOK, 7, 20, 6)  # two dirs: 10 reclaimed, 3 left each
    assert sorted(fake.lacs) == sorted((7, i, b"lac%d" % i) for i in range(BURST))
    assert by_id[300] == m.WriteLacResponse(300, ENOLEDGER, NO_LEDGER)
    assert by_id[301] == m.WriteLacResponse(301, EINTERNAL, BUG_LEDGER)
    assert by_id[302] == m.CollectResponse(302, ENOLEDGER, NO_LEDGER)
    assert by_id[303] == m.CollectResponse(303, EIO, GC_FAILS_LEDGER)  # a VellumError, as before
    assert by_id[304] == m.CollectResponse(304, EOK, NO_DIRS_LEDGER, 0, 0)
    assert by_id[305] == m.CollectResponse(305, EIO, GC_STOPPED_LEDGER)
    lines = [r.getMessage() for r in caplog.records]
    assert sum("COLLECT of ledger 7 below entry" in line and "20 bytes reclaimed, 6 garbage bytes left" in line
               for line in lines) == BURST
    assert any("the garbage collection pass failed: the disk went away" in line for line in lines)


def test_status_for_an_expected_answer_counts_it_and_builds_its_line_only_when_it_is_written(
        caplog: pytest.LogCaptureFixture) -> None:
    """An expected answer (ENOENTRY: most failed reads of a reader polling past the LAC) is
    counted whatever the log level; its DEBUG line, with the peer, is built only when DEBUG is
    on: with it off the peer is not even asked (a read's answer stays cheap)."""
    counters = processors.Counters(max_adds=0, max_reads=0, max_frame_size=1 << 20)
    asked: list[int] = []

    def describe_peer() -> str:
        asked.append(1)
        return "peer-1"

    ch = processors.Channel(cast(Any, None), counters, cast(Any, None), cast(Any, None), describe_peer)
    caplog.set_level(logging.INFO, logger="vellum.server.bookie_server")
    assert ch.status_for(NoSuchEntryError("no entry 5"), "READ", 7, 5) == ENOENTRY
    assert counters.errors[("READ", "ENOENTRY")] == 1
    assert asked == [] and not caplog.records
    caplog.set_level(logging.DEBUG, logger="vellum.server.bookie_server")
    assert ch.status_for(NoSuchEntryError("no entry 6"), "READ", 7, 6) == ENOENTRY
    assert counters.errors[("READ", "ENOENTRY")] == 2
    (line,) = caplog.records
    assert line.levelno == logging.DEBUG and line.getMessage() == (
        "READ of entry 6 of ledger 7 from peer-1: answering ENOENTRY: no entry 6")
    assert (line.ledger_id, line.entry_id, line.peer) == (7, 6, "peer-1")  # type: ignore[attr-defined]
