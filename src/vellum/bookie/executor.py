"""The seam between the storage engine's threads and the asyncio loop.

Storage work runs on threads owned by the engine (journal writer, force-write, flush,
checkpoint) and on a small read pool; results cross back to the loop only here, through
``LoopBridge``, which batches completions so that one fsync covering a thousand adds wakes the
loop once, not a thousand times. ``AsyncBookie`` is the asyncio face of ``Bookie`` and the
server's only view of it.

Invariants: callbacks handed to ``LoopBridge.call`` run on the loop thread, in the order they
were handed over, each even if one before it raised (logged); ``AsyncBookie`` never blocks the loop on the disk or on back-pressure (what
may wait runs on the add thread or the reader pool; on the loop run only in-memory answers and
the adds that need no waiting: known ledgers, room in the write cache and the journal queue;
a ledger's first request that must have its master key checked against the metadata runs on
the add thread or a reader thread).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from vellum.bookie.bookie import Bookie, BookieInfo
from vellum.errors import NoSuchEntryError, VellumError
from vellum.format.entry import BytesLike
from vellum.proto.messages import AddBatch, PackedEntries
from vellum.storage.gc import GarbageCollectorThread, GcReport

log = logging.getLogger(__name__)

_T = TypeVar("_T")
#: what ``on_result`` of a batch add gets: per add its refusal or None, and the durability outcome
OnAddResult = Callable[[list[BaseException | None], BaseException | None], None]
#: what ``done`` of a READ gets: the entry and None, or None and the error
OnRead = Callable[[bytes | memoryview | None, BaseException | None], None]
#: what ``done`` of a BATCH_READ or READ_STRIDED gets: the entries and None, or None and the error
OnEntries = Callable[[PackedEntries | None, BaseException | None], None]
#: the answer to READ_LAC: the explicit LAC body and the last entry (each ``b""`` when there is none)
LacAnswer = tuple[bytes, bytes | memoryview]
#: what ``done`` of a READ_LAC gets: the answer and None, or None and the error
OnLac = Callable[[LacAnswer | None, BaseException | None], None]
#: what ``done`` of a fence or an explicit LAC write gets: None once durable, or the error
OnDurable = Callable[[BaseException | None], None]
#: an add batch waiting for the add thread, with its ``on_result``
_Pending = tuple[AddBatch, OnAddResult]
#: the most adds the add thread takes together
_MAX_MERGED = 4096


@dataclass(frozen=True)
class CollectOutcome:
    """What a COLLECT did on this bookie (see ``AsyncBookie.collect_cb``)."""

    reclaimed_bytes: int
    garbage_bytes: int


#: what ``done`` of a COLLECT gets: the outcome and None, or None and the error
OnCollect = Callable[[CollectOutcome | None, BaseException | None], None]


def _garbage_bytes(threads: list[GarbageCollectorThread]) -> int:
    """The garbage the dirs of ``threads`` hold (on a reader thread: it reads each storage)."""
    return sum(gc.garbage_bytes() for gc in threads)


def lac_answer(bookie: Bookie, ledger_id: int) -> LacAnswer:
    """What READ_LAC answers (on a reader thread: both may read the disk): the ledger's explicit
    LAC body and its last entry on this bookie, ``b""`` for either when there is none."""
    return bookie.read_explicit_lac(ledger_id) or b"", lac_answer_last(bookie, ledger_id)


def lac_answer_last(bookie: Bookie, ledger_id: int) -> bytes | memoryview:
    """The last entry READ_LAC answers: the ledger's last on this bookie, ``b""`` if it has none."""
    try:
        return bookie.read_entry(ledger_id, -1)
    except NoSuchEntryError:
        return b""


def watch_until(loop: asyncio.AbstractEventLoop, timeout_s: float, done: Callable[[], None],
                watch: Callable[[Callable[[], None]], Callable[[], None]]) -> Callable[[], None]:
    """``done()`` once, on the loop, at the first of: the watch fires, ``timeout_s`` passes.
    ``watch(fire)`` registers ``fire`` (which it must call on the loop, never inside ``watch``)
    and returns the function that unregisters it. Returns the function that drops the watch
    and the timer without answering. A long poll's wait, without a task."""
    answered = False

    def stop() -> None:
        nonlocal answered
        answered = True
        timer.cancel()
        unwatch()

    def fire() -> None:
        if not answered:
            stop()
            done()

    timer = loop.call_later(timeout_s, fire)
    try:
        unwatch = watch(fire)
    except BaseException:
        timer.cancel()
        raise
    return stop


class LoopBridge:
    """Run callables on an asyncio loop from any thread, batched."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._pending: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = deque()
        self._scheduled = False

    def call(self, fn: Callable[..., Any], *args: Any) -> None:
        with self._lock:
            self._pending.append((fn, args))
            if self._scheduled:
                return
            self._scheduled = True
        try:
            self._loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # loop closed during shutdown: nobody is waiting any more
            pass

    def _drain(self) -> None:
        with self._lock:
            items = self._pending
            self._pending = deque()
            self._scheduled = False
        for fn, args in items:
            try:
                fn(*args)
            except Exception:
                # A failing completion must not take the ones after it with it: those are other
                # requests' answers (an add never answered leaves its client waiting forever).
                log.exception("a completion on the loop failed: %r", fn)


class AsyncBookie:
    """asyncio face of a ``Bookie``: completions arrive on the loop thread. Three kinds of calls:

    - callback style for the hot paths (``add_batch_cb``, ``read_cb``, ``read_entries_cb``,
      ``read_strided_cb``, ``read_lac_cb``, ``watch_lac_cb``, ``fence_cb``,
      ``write_explicit_lac_cb``): no future and no task per request; a READ of an entry in
      memory is answered on the caller's thread, any other read on a reader thread; a LAC
      watch holds a watcher and a timer, no thread;
    - reader-pool calls returning a future (``entry_ids``, ``trim``, ``info``): plain
      functions returning the pool's future, so that awaiting one costs that future and no
      coroutine on top;
    - ``collect_cb``: reader-pool work, then a wait for GC passes that holds no thread and no
      task (the GC thread answers through the bridge);
    - in-memory answers given on the caller's thread (``note_ledger_closed``).
    """

    def __init__(self, bookie: Bookie, loop: asyncio.AbstractEventLoop, *, read_threads: int = 8) -> None:
        self._bookie = bookie
        self._loop = loop
        self.bridge = LoopBridge(loop)
        self._reads = ThreadPoolExecutor(max_workers=read_threads, thread_name_prefix="bookie-read")
        # One add thread, so batches keep their order (BookKeeper: numAddWorkerThreads=1). The
        # batches handed over while it works are taken together and added as one.
        self._add_lock = threading.Lock()
        self._add_wake = threading.Condition(self._add_lock)
        self._add_pending: list[_Pending] = []
        self._add_idle = False
        self._add_closed = False
        self._add_thread = threading.Thread(target=self._add_loop, name="bookie-add", daemon=True)
        self._add_thread.start()

    def add_entries_cb(self, adds: list[tuple[BytesLike, bytes, bool]], on_result: OnAddResult) -> None:
        """``add_batch_cb`` of ``(entry, master key, recovery)`` rows (tools)."""
        self.add_batch_cb(AddBatch.of_entries(adds), on_result)

    def add_batch_cb(self, batch: AddBatch, on_result: OnAddResult) -> None:
        """Batch add (see ``Bookie.add_batch``: the batch goes down as it is) on the bookie's add thread, so that a full
        write cache's back-pressure stalls the writers, not the event loop. ``on_result(refused,
        error)`` runs once on the loop thread: ``refused`` per add (an error, or None if
        accepted) and ``error`` the durability outcome of the accepted ones (None = durable).
        Batches are processed in submission order (one thread); the batches waiting when the
        add thread gets to them are added together (one journal record batch, one fsync
        callback), and each is answered when all of them are durable.

        When the add thread is idle with nothing queued and the bookie can take the batch at
        once (known ledgers, room in the write cache and the journal queue: nothing to wait
        for), the batch is added right here instead, which saves the hand-off; the order of
        batches is the same."""
        with self._add_lock:
            if self._add_closed:
                raise RuntimeError("cannot add after the bookie's add thread was shut down")
            inline = self._add_idle and not self._add_pending
        if inline and self._add_now(batch, [(batch, on_result)], wait=False):
            return
        with self._add_lock:
            self._add_pending.append((batch, on_result))
            if self._add_idle:
                self._add_idle = False
                self._add_wake.notify()

    def _add_loop(self) -> None:
        lock, wake = self._add_lock, self._add_wake
        while True:
            with lock:
                while not self._add_pending and not self._add_closed:
                    self._add_idle = True
                    wake.wait()
                self._add_idle = False
                pending = self._add_pending
                if not pending:
                    return  # closed and drained
                # At most _MAX_MERGED adds at once; the rest waits for the next round.
                taken, total = 0, 0
                while taken < len(pending) and (taken == 0 or total + len(pending[taken][0]) <= _MAX_MERGED):
                    total += len(pending[taken][0])
                    taken += 1
                batches, self._add_pending = pending[:taken], pending[taken:]
            # The batches handed over meanwhile go down as one.
            self._add_now(AddBatch.concat([batch for batch, _on_result in batches]), batches)

    def _add_now(self, adds: AddBatch, batches: list[_Pending], *, wait: bool = True) -> bool:
        """Add ``adds`` (the ``batches``, in order, as one batch); answer each batch on the loop.
        ``wait=False``: only if that needs no waiting (see ``Bookie.add_batch``); False if
        nothing was done."""
        bridge = self.bridge
        lock = threading.Lock()
        parts = [2]  # the refusals are known, and the accepted adds are durable
        outcome: list[BaseException | None] = [None]
        refused: list[BaseException | None] = []

        def finish(refused: list[BaseException | None], exc: BaseException | None) -> None:  # on the loop
            if len(batches) == 1:
                batches[0][1](refused, exc)
                return
            pos = 0
            for batch_adds, on_result in batches:
                n = len(batch_adds)
                on_result(refused[pos:pos + n], exc)
                pos += n

        def part_done() -> None:
            with lock:
                parts[0] -= 1
                last = parts[0] == 0
            if last:
                bridge.call(finish, refused, outcome[0])

        def durable(exc: BaseException | None) -> None:
            outcome[0] = exc
            part_done()

        try:
            result = self._bookie.add_batch(adds, durable, wait=wait)
        except Exception as exc:  # a bug, not a refusal: fail the whole batch
            refused[:] = [exc] * len(adds)
            part_done()
        else:
            if result is None:
                return False  # would have to wait: nothing done
            refused.extend(result)
            if refused.count(None) == 0:
                part_done()  # nothing accepted: no durability callback will come
        part_done()
        return True

    def fence_cb(self, ledger_id: int, master_key: bytes, done: Callable[[BaseException | None], None]) -> None:
        """Fence the ledger; ``done(error or None)`` on the loop once the fence is durable. A
        ledger whose key must first be checked against its metadata (``needs_key_check``) is
        fenced on a reader thread: that check reads the metadata store."""
        bridge = self.bridge
        if self._bookie.needs_key_check(ledger_id):
            self._reads.submit(self._fence_off_loop, ledger_id, master_key, done)
            return
        try:
            self._bookie.fence_ledger(ledger_id, master_key, lambda exc: bridge.call(done, exc))
        except Exception as exc:
            done(exc)

    def _fence_off_loop(self, ledger_id: int, master_key: bytes, done: Callable[[BaseException | None], None]) -> None:
        bridge = self.bridge
        try:
            self._bookie.fence_ledger(ledger_id, master_key, lambda exc: bridge.call(done, exc))
        except Exception as exc:
            bridge.call(done, exc)

    # Future style.
    def _future_cb(self) -> tuple[asyncio.Future[None], Callable[[BaseException | None], None]]:
        fut: asyncio.Future[None] = self._loop.create_future()

        def done(exc: BaseException | None) -> None:
            if fut.done():
                return
            if exc is None:
                fut.set_result(None)
            else:
                fut.set_exception(exc)

        return fut, done

    async def fence(self, ledger_id: int, master_key: bytes) -> None:
        fut, done = self._future_cb()
        self.fence_cb(ledger_id, master_key, done)
        await fut

    def write_explicit_lac_cb(self, ledger_id: int, master_key: bytes, lac: int, body: bytes,
                              done: OnDurable) -> None:
        """Write the explicit LAC; ``done(error or None)`` runs once, on the loop, once it is
        durable. A ledger whose key must first be checked against its metadata
        (``needs_key_check``) is written on a reader thread: that check reads the metadata
        store. A refusal on the loop is answered at once, as ``fence_cb`` does."""
        bridge = self.bridge
        if self._bookie.needs_key_check(ledger_id):
            try:
                self._reads.submit(self._write_lac_off_loop, ledger_id, master_key, lac, body, done)
            except RuntimeError as exc:  # the reader pool was shut down: the bookie is stopping
                done(exc)
            return
        try:
            self._bookie.write_explicit_lac(ledger_id, master_key, lac, body, lambda exc: bridge.call(done, exc))
        except Exception as exc:
            done(exc)

    def _write_lac_off_loop(self, ledger_id: int, master_key: bytes, lac: int, body: bytes, done: OnDurable) -> None:
        bridge = self.bridge
        try:
            self._bookie.write_explicit_lac(ledger_id, master_key, lac, body, lambda exc: bridge.call(done, exc))
        except Exception as exc:
            bridge.call(done, exc)

    def read_cb(self, ledger_id: int, entry_id: int, fence_key: bytes | None, done: OnRead) -> None:
        """READ of one entry (``entry_id == -1``: the last one this bookie has); ``done(entry,
        None)`` or ``done(None, error)`` runs once on the loop thread. An entry in memory (write
        or read-ahead cache) is answered at once, on the caller's thread; any other is read on a
        reader thread. With ``fence_key`` the ledger is fenced first, on a reader thread (its
        master key check may read the metadata), and the READ follows as any other once the
        fence is durable (rule 4 of docs/correctness.md); a failed fence is the answer."""
        if fence_key is not None:
            self._fence_first(ledger_id, fence_key, done,
                              lambda: self.read_cb(ledger_id, entry_id, None, done))
            return
        try:
            cached = self._bookie.read_cached_entry(ledger_id, entry_id)
            if cached is None:  # on disk: read on a reader thread, answered through the bridge
                self._reads.submit(self._run_off_loop, done, self._bookie.read_entry, ledger_id, entry_id)
                return
        except Exception as exc:  # the lookup failed, or the reader pool is shut down (the bookie is stopping)
            done(None, exc)
            return
        done(cached, None)

    def read_entries_cb(self, ledger_id: int, first: int, max_count: int, max_bytes: int,
                        fence_key: bytes | None, done: OnEntries) -> None:
        """BATCH_READ: consecutive entries from ``first`` (see ``Bookie.read_entries``) on a
        reader thread; ``done(entries, None)`` or ``done(None, error)`` once on the loop. With
        ``fence_key`` the ledger is fenced first, as ``read_cb`` does."""
        if fence_key is not None:
            self._fence_first(ledger_id, fence_key, done,
                              lambda: self.read_entries_cb(ledger_id, first, max_count, max_bytes, None, done))
            return
        self._off_loop(done, self._bookie.read_entries, ledger_id, first, max_count, max_bytes)

    def read_strided_cb(self, ledger_id: int, first: int, stride: int, max_count: int, max_bytes: int,
                        done: OnEntries) -> None:
        """READ_STRIDED: entries ``first, first + stride, ...`` (see ``Bookie.read_strided``) on a
        reader thread; ``done`` as ``read_entries_cb``."""
        self._off_loop(done, self._bookie.read_strided, ledger_id, first, stride, max_count, max_bytes)

    def read_lac_cb(self, ledger_id: int, done: OnLac) -> None:
        """READ_LAC: the explicit LAC body and the last entry this bookie has (``b""`` for
        either when there is none), read together on one reader thread; ``done`` once on the
        loop. ``NoSuchLedgerError`` if the bookie does not hold the ledger."""
        self._off_loop(done, lac_answer, self._bookie, ledger_id)

    def watch_lac_cb(self, ledger_id: int, previous_lac: int, timeout_s: float,
                     done: Callable[[], None]) -> Callable[[], None]:
        """Long poll: ``done()`` once on the loop when this bookie's LAC for the ledger passes
        ``previous_lac`` or ``timeout_s`` has passed, whichever is first (the caller then reads
        what the bookie has). Holds a LAC watcher and a timer, no thread and no task. Returns
        the function that drops both without answering (the connection closed)."""
        bridge = self.bridge
        return watch_until(self._loop, timeout_s, done, lambda fire: self._bookie.watch_lac(
            ledger_id, previous_lac, lambda _lac: bridge.call(fire)))

    def _fence_first(self, ledger_id: int, fence_key: bytes, done: Callable[[Any, BaseException | None], None],
                     then: Callable[[], None]) -> None:
        """Fence on a reader thread (its master key check may read the metadata); once the
        fence is durable ``then()`` on the loop, or ``done(None, error)`` if it failed."""
        def fenced(exc: BaseException | None) -> None:  # on the loop, once the fence is durable
            if exc is not None:
                done(None, exc)
            else:
                then()

        try:
            self._reads.submit(self._fence_off_loop, ledger_id, fence_key, fenced)
        except RuntimeError as exc:  # the reader pool was shut down: the bookie is stopping
            done(None, exc)

    def _off_loop(self, done: Callable[[Any, BaseException | None], None], fn: Callable[..., Any],
                  *args: Any) -> None:
        """``fn(*args)`` on a reader thread; ``done(result, None)`` or ``done(None, error)`` on the loop."""
        try:
            self._reads.submit(self._run_off_loop, done, fn, *args)
        except RuntimeError as exc:  # the reader pool was shut down: the bookie is stopping
            done(None, exc)

    def _run_off_loop(self, done: Callable[[Any, BaseException | None], None], fn: Callable[..., Any],
                      *args: Any) -> None:
        try:
            out = fn(*args)
        except Exception as exc:
            self.bridge.call(done, None, exc)
        else:
            self.bridge.call(done, out, None)

    def _on_reader(self, fn: Callable[..., _T], *args: Any) -> asyncio.Future[_T]:
        return self._loop.run_in_executor(self._reads, fn, *args)

    def entry_ids(self, ledger_id: int) -> asyncio.Future[list[int]]:
        """The ids of the ledger's entries this bookie holds (LIST_ENTRIES)."""
        return self._on_reader(self._bookie.entry_ids, ledger_id)

    def trim(self, ledger_id: int, master_key: bytes, end_entry_id: int) -> asyncio.Future[None]:
        """Drop the ledger's entries below ``end_entry_id``; see ``Bookie.trim``."""
        return self._on_reader(self._bookie.trim, ledger_id, master_key, end_entry_id)

    def collect_cb(self, ledger_id: int, master_key: bytes, end_entry_id: int, done: OnCollect) -> None:
        """COLLECT: trim and seal on the reader pool (``Bookie.prepare_collect``), then wait,
        holding no thread and no task, for a GC pass of each dir holding the ledger that
        started after the request (each GC thread answers through the bridge); then, on the
        reader pool, the garbage those passes left. ``done(outcome, None)`` or ``done(None,
        error)`` runs once, on the loop: ``reclaimed_bytes`` of those passes, ``garbage_bytes``
        they left; a failed pass is a ``VellumError`` naming each failure."""
        def prepared(threads: list[GarbageCollectorThread] | None, exc: BaseException | None) -> None:  # on the loop
            if exc is not None:
                done(None, exc)
                return
            assert threads is not None
            reports: list[GcReport | None] = [None] * len(threads)
            waiting = [len(threads)]

            def passed(i: int, report: GcReport) -> None:  # on the loop, once per pass
                if reports[i] is not None or waiting[0] <= 0:
                    return
                reports[i] = report
                waiting[0] -= 1
                if not waiting[0]:
                    finish([r for r in reports if r is not None])

            def finish(got: list[GcReport]) -> None:
                failed = [r.error for r in got if r.error]
                if failed:
                    done(None, VellumError(
                        f"ledger {ledger_id}: the garbage collection pass failed: {'; '.join(failed)}"))
                    return
                reclaimed = sum(r.reclaimed_bytes for r in got)

                def measured(garbage: int | None, exc: BaseException | None) -> None:
                    if exc is not None:
                        done(None, exc)
                    else:
                        assert garbage is not None
                        done(CollectOutcome(reclaimed, garbage), None)

                self._off_loop(measured, _garbage_bytes, threads)

            if not threads:
                finish([])
                return
            for i, gc in enumerate(threads):
                try:
                    gc.request_pass(functools.partial(self.bridge.call, passed, i))
                except Exception as exc:  # its GC thread is not running: nothing would answer
                    waiting[0] = 0  # the passes already asked for answer nobody
                    done(None, exc)
                    return

        self._off_loop(prepared, self._bookie.prepare_collect, ledger_id, master_key, end_entry_id)

    def note_ledger_closed(self, ledger_id: int) -> None:
        """Advisory "ledger closed" (in memory: answered on the caller's thread)."""
        self._bookie.note_ledger_closed(ledger_id)

    def info(self) -> asyncio.Future[BookieInfo]:
        """Disk capacity and free space of the ledger dirs."""
        return self._on_reader(self._bookie.info)

    def close(self) -> None:
        with self._add_lock:
            self._add_closed = True
            self._add_wake.notify()
        if self._add_thread is not threading.current_thread():
            self._add_thread.join()
        self._reads.shutdown(wait=True)
