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

    async def main() -> dict[str, Any]:
        ab = AsyncBookie(cast(Bookie, fake), asyncio.get_running_loop(), read_threads=2)
        try:
            fut = ab.read_entries(1, 3, 2, 0)
            assert isinstance(fut, asyncio.Future)  # awaited as is: no coroutine on top
            got = {
                "read_entry": await ab.read_entry(1, 4),
                "read_entries": await fut,
                "read_strided": await ab.read_strided(1, 1, 3, 3, 0),
                "entry_ids": await ab.entry_ids(1),
                "trim": await ab.trim(1, bytes(20), 5),
                "info": await ab.info(),
            }
            with pytest.raises(NoSuchLedgerError):
                await ab.read_explicit_lac(9)
            ab.note_ledger_closed(1)
            return got
        finally:
            ab.close()

    loop_thread = threading.current_thread().name
    got = asyncio.run(main())
    assert got == {"read_entry": b"e4", "read_entries": [b"e3", b"e4"], "read_strided": [b"e1", b"e4", b"e7"],
                   "entry_ids": [0, 1], "trim": None, "info": BookieInfo(10, 5)}
    pool = {k: v for k, v in fake.calls.items() if k != "note_ledger_closed"}
    assert set(pool) == {"read_entry", "read_entries", "read_strided", "read_explicit_lac", "entry_ids",
                         "trim", "info"}
    assert all(name.startswith("bookie-read") for name in pool.values()), pool
    assert fake.calls["note_ledger_closed"] == loop_thread


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
