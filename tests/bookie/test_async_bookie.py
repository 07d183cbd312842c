"""AsyncBookie, the server's one way into a bookie: what may touch the disk runs on the reader
pool and comes back as a future on the loop; in-memory answers are given on the caller's thread.

A stand-in bookie records which thread each call ran on (no disks)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, cast

import pytest

from vellum.bookie.bookie import Bookie, BookieInfo
from vellum.bookie.executor import AsyncBookie
from vellum.errors import NoSuchLedgerError


class _RecordingBookie:
    def __init__(self) -> None:
        self.calls: dict[str, str] = {}  # method -> thread name

    def _seen(self, name: str) -> None:
        self.calls[name] = threading.current_thread().name

    def read_cached_entry(self, ledger_id: int, entry_id: int) -> bytes | None:
        self._seen("read_cached_entry")
        return b"cached" if entry_id == 0 else None

    def read_entry(self, ledger_id: int, entry_id: int) -> bytes:
        self._seen("read_entry")
        if entry_id == 13:
            raise OSError(5, "Input/output error")
        return b"e%d" % entry_id

    def read_entries(self, ledger_id: int, first: int, count: int, max_bytes: int) -> list[bytes]:
        self._seen("read_entries")
        return [b"e%d" % i for i in range(first, first + count)]

    def read_strided(self, ledger_id: int, first: int, stride: int, count: int, max_bytes: int) -> list[bytes]:
        self._seen("read_strided")
        return [b"e%d" % (first + i * stride) for i in range(count)]

    def read_explicit_lac(self, ledger_id: int) -> bytes | None:
        self._seen("read_explicit_lac")
        raise NoSuchLedgerError(f"ledger {ledger_id}")

    def entry_ids(self, ledger_id: int) -> list[int]:
        self._seen("entry_ids")
        return [0, 1]

    def trim(self, ledger_id: int, master_key: bytes, end_entry_id: int) -> None:
        self._seen("trim")

    def note_ledger_closed(self, ledger_id: int) -> None:
        self._seen("note_ledger_closed")

    def info(self) -> BookieInfo:
        self._seen("info")
        return BookieInfo(10, 5)


def test_reads_run_on_the_reader_pool_and_in_memory_answers_on_the_loop() -> None:
    fake = _RecordingBookie()
    answers: dict[str, tuple[Any, ...]] = {}

    async def main() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        ab = AsyncBookie(cast(Bookie, fake), loop, read_threads=2)
        waiting: list[asyncio.Future[None]] = []

        def done_for(name: str) -> Any:
            fut = loop.create_future()
            waiting.append(fut)

            def done(value: Any, exc: BaseException | None) -> None:
                answers[name] = (value, exc, threading.current_thread().name)
                fut.set_result(None)
            return done

        try:
            fut = ab.entry_ids(1)
            assert isinstance(fut, asyncio.Future)  # awaited as is: no coroutine on top
            ab.read_cb(1, 4, None, done_for("read_entry"))
            ab.read_entries_cb(1, 3, 2, 0, None, done_for("read_entries"))
            ab.read_strided_cb(1, 1, 3, 3, 0, done_for("read_strided"))
            ab.read_lac_cb(9, done_for("read_lac"))
            got = {"entry_ids": await fut, "trim": await ab.trim(1, bytes(20), 5), "info": await ab.info()}
            await asyncio.wait_for(asyncio.gather(*waiting), 10)
            ab.note_ledger_closed(1)
            return got
        finally:
            ab.close()

    loop_thread = threading.current_thread().name
    got = asyncio.run(main())
    assert got == {"entry_ids": [0, 1], "trim": None, "info": BookieInfo(10, 5)}
    assert answers["read_entry"] == (b"e4", None, loop_thread)
    assert answers["read_entries"] == ([b"e3", b"e4"], None, loop_thread)
    assert answers["read_strided"] == ([b"e1", b"e4", b"e7"], None, loop_thread)
    value, exc, thread = answers["read_lac"]
    assert value is None and isinstance(exc, NoSuchLedgerError) and thread == loop_thread
    pool = {k: v for k, v in fake.calls.items() if k not in ("note_ledger_closed", "read_cached_entry")}
    assert set(pool) == {"read_entry", "read_entries", "read_strided", "read_explicit_lac", "entry_ids",
                         "trim", "info"}
    assert all(name.startswith("bookie-read") for name in pool.values()), pool
    assert fake.calls["note_ledger_closed"] == loop_thread
    assert fake.calls["read_cached_entry"] == loop_thread


class _LacBookie(_RecordingBookie):
    """Ledger 1 has an explicit LAC and entries; ledger 2 has neither (an empty ledger); the LAC
    watch is held until the test advances it, from another thread."""

    def __init__(self) -> None:
        super().__init__()
        self.watchers: list[tuple[int, Any]] = []

    def read_explicit_lac(self, ledger_id: int) -> bytes | None:
        self._seen("read_explicit_lac")
        return b"body" if ledger_id == 1 else None

    def read_entry(self, ledger_id: int, entry_id: int) -> bytes:
        if ledger_id == 2:
            from vellum.errors import NoSuchEntryError
            raise NoSuchEntryError("empty")
        return super().read_entry(ledger_id, 9 if entry_id == -1 else entry_id)

    def watch_lac(self, ledger_id: int, previous_lac: int, fn: Any) -> Any:
        entry = (previous_lac, fn)
        self.watchers.append(entry)
        return lambda: self.watchers.remove(entry) if entry in self.watchers else None


def test_a_lac_read_is_one_reader_hop_and_a_lac_watch_answers_once_at_the_lac_or_the_timeout() -> None:
    fake = _LacBookie()
    got: dict[str, Any] = {}

    async def main() -> None:
        loop = asyncio.get_running_loop()
        ab = AsyncBookie(cast(Bookie, fake), loop, read_threads=1)
        try:
            both = loop.create_future()
            ab.read_lac_cb(1, lambda v, e: got.setdefault("lac1", (v, e)))
            ab.read_lac_cb(2, lambda v, e: (got.setdefault("lac2", (v, e)), both.set_result(None)))
            await asyncio.wait_for(both, 10)

            fired: list[str] = []
            passed, timed_out = loop.create_future(), loop.create_future()
            ab.watch_lac_cb(1, 5, 30.0, lambda: (fired.append("passed"), passed.set_result(None)))
            ab.watch_lac_cb(1, 50, 0.05, lambda: (fired.append("timeout"), timed_out.set_result(None)))
            drop = ab.watch_lac_cb(1, 5, 0.05, lambda: fired.append("dropped"))
            drop()
            assert len(fake.watchers) == 2  # the dropped one let go of its watch
            await asyncio.wait_for(timed_out, 10)
            assert len(fake.watchers) == 1  # the timed-out one let go of its watch
            _previous, fn = fake.watchers[0]
            threading.Thread(target=fn, args=(6,)).start()  # the add path advances the LAC
            await asyncio.wait_for(passed, 10)
            fn(7)  # a second firing is not a second answer
            await asyncio.sleep(0.1)
            got["fired"] = fired
        finally:
            ab.close()

    asyncio.run(main())
    assert got["lac1"] == ((b"body", b"e9"), None)
    assert got["lac2"] == ((b"", b""), None)  # no explicit LAC and no entry: both empty
    assert got["fired"] == ["timeout", "passed"]
    assert not fake.watchers


class _FencingBookie(_RecordingBookie):
    """Fences are held until the test makes them durable (or fails them), from another thread
    (as a journal would)."""

    def __init__(self) -> None:
        super().__init__()
        self.fences: list[tuple[int, bytes, Any]] = []
        self.reads: list[tuple[int, int]] = []

    def fence_ledger(self, ledger_id: int, master_key: bytes, callback: Any) -> None:
        self._seen("fence_ledger")
        self.fences.append((ledger_id, master_key, callback))

    def read_entry(self, ledger_id: int, entry_id: int) -> bytes:
        self.reads.append((ledger_id, entry_id))
        return super().read_entry(ledger_id, entry_id)


def test_a_read_is_handed_over_once_and_answered_once_on_the_loop() -> None:
    """``read_cb``: an entry in memory is answered before the call returns; any other read runs
    on a reader thread and is answered on the loop; a fencing READ reads only once its fence is
    durable (rule 4 of docs/correctness.md), and a failed fence is its answer."""
    fake = _FencingBookie()
    answers: dict[str, tuple[Any, ...]] = {}

    async def main() -> None:
        loop = asyncio.get_running_loop()
        ab = AsyncBookie(cast(Bookie, fake), loop, read_threads=2)
        waiting: dict[str, asyncio.Future[None]] = {}

        def done_for(name: str) -> Any:
            waiting[name] = loop.create_future()

            def done(entry: Any, exc: BaseException | None) -> None:
                answers[name] = (entry, exc, threading.current_thread().name)
                if not waiting[name].done():
                    waiting[name].set_result(None)
            return done

        try:
            ab.read_cb(1, 0, None, done_for("cached"))
            assert "cached" in answers  # at once, on the caller's thread: no hand-off
            ab.read_cb(1, 4, None, done_for("disk"))
            ab.read_cb(1, 13, None, done_for("bad disk"))
            await asyncio.wait_for(asyncio.gather(waiting["disk"], waiting["bad disk"]), 10)

            ab.read_cb(2, 5, b"k" * 20, done_for("fenced"))
            ab.read_cb(3, 6, b"k" * 20, done_for("fence failed"))
            for _ in range(200):
                if len(fake.fences) == 2:
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)
            assert (2, 5) not in fake.reads and "fenced" not in answers  # the fence is not durable yet
            by_ledger = {ledger_id: callback for ledger_id, _key, callback in fake.fences}
            threading.Thread(target=by_ledger[2], args=(None,)).start()
            threading.Thread(target=by_ledger[3], args=(OSError(5, "journal fsync failed"),)).start()
            await asyncio.wait_for(asyncio.gather(waiting["fenced"], waiting["fence failed"]), 10)
        finally:
            ab.close()

    loop_thread = threading.current_thread().name
    asyncio.run(main())
    assert answers["cached"] == (b"cached", None, loop_thread)
    assert answers["disk"] == (b"e4", None, loop_thread)
    entry, exc, thread = answers["bad disk"]
    assert entry is None and isinstance(exc, OSError) and thread == loop_thread
    assert answers["fenced"] == (b"e5", None, loop_thread)
    entry, exc, thread = answers["fence failed"]
    assert entry is None and "journal fsync failed" in str(exc) and thread == loop_thread
    assert (3, 6) not in fake.reads  # a fence that failed is the answer: nothing read
    assert fake.calls["read_entry"].startswith("bookie-read")
    assert fake.calls["fence_ledger"].startswith("bookie-read")  # its key check may read the metadata


def test_a_failing_completion_does_not_drop_the_completions_after_it(caplog: pytest.LogCaptureFixture) -> None:
    """Completions handed over together run in one loop callback: one that raises (a bug in a
    request's answer) must not lose the others (other requests' answers)."""
    from vellum.bookie.executor import LoopBridge

    ran: list[int] = []

    def bug() -> None:
        raise RuntimeError("a bug in one answer")

    async def main() -> None:
        bridge = LoopBridge(asyncio.get_running_loop())
        done = asyncio.get_running_loop().create_future()

        def from_a_thread() -> None:
            bridge.call(ran.append, 1)
            bridge.call(bug)
            bridge.call(ran.append, 2)
            bridge.call(done.set_result, None)

        threading.Thread(target=from_a_thread).start()
        await asyncio.wait_for(done, 10)

    with caplog.at_level("ERROR", logger="vellum.bookie.executor"):
        asyncio.run(main())
    assert ran == [1, 2]
    assert "a completion on the loop failed" in caplog.text and "a bug in one answer" in caplog.text


def test_a_read_after_the_reader_pool_shut_down_is_answered_once_with_the_error() -> None:
    """A READ that misses memory while the bookie stops (its reader pool shut down) is answered
    at once, on the caller's thread, with the pool's error; an entry in memory is still answered
    from memory; BATCH_READ, which always goes to a reader thread, gets the same error."""
    fake = _RecordingBookie()

    async def main() -> list[tuple[Any, ...]]:
        loop = asyncio.get_running_loop()
        ab = AsyncBookie(cast(Bookie, fake), loop, read_threads=1)
        ab.close()
        answers: list[tuple[Any, ...]] = []

        def done(value: Any, exc: BaseException | None) -> None:
            answers.append((value, type(exc), threading.current_thread().name))

        ab.read_cb(1, 5, None, done)
        ab.read_cb(1, 0, None, done)
        ab.read_entries_cb(1, 0, 2, 0, None, done)
        await asyncio.sleep(0.01)
        return answers

    here = threading.current_thread().name
    assert asyncio.run(main()) == [(None, RuntimeError, here), (b"cached", type(None), here),
                                   (None, RuntimeError, here)]
    assert "read_entry" not in fake.calls
