"""Reads from the replicas of one write set: speculative reads, failover, back-pressure rounds and
digest checks (BookKeeper's ``PendingReadOp`` for one entry, and its batch-read sibling).

Responsibility: turn "entry ``e`` (or the run ``first..last``) is stored on these replicas" into
verified entries, for the reader (``ledger_reader.py``) and recovery (``recovery.py``), which
choose the replicas (``distribution.py``).

Invariants:
- every entry returned was verified against its digest and its entry id; a bad copy is logged
  and skipped (the next replica is asked), never returned;
- "no such entry" (``NoSuchEntryError``) only when every replica asked said explicitly that it has
  no such entry or ledger (rule 3 of docs/correctness.md); any other failure keeps its own error class;
- back-pressure (TOOMANYREQUESTS from every replica) is retried in rounds after
  ``backoff_delay``, within the read timeout, never counted as a missing entry;
- single-entry reads run on callbacks only (no task, no coroutine per entry), so a window of
  hundreds of them costs no task switches; batch reads wait on the bookie client's futures
  (no task per request either).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from vellum.client.backpressure import backoff_delay
from vellum.errors import (
    DigestMismatchError,
    NoSuchEntryError,
    NoSuchLedgerError,
    ReadError,
    TooManyRequestsError,
    VellumError,
)
from vellum.format.entry import BytesLike, DigestManager, Entry, PayloadSpans
from vellum.proto.messages import FrameEntries

if TYPE_CHECKING:
    from vellum.client.bookie_client import BookieClient

log = logging.getLogger(__name__)

_F = TypeVar("_F", bound="asyncio.Future[Any]")
_R = TypeVar("_R")

#: errors that mean "this bookie does not have it" (explicit negatives for coverage). Never
#: ``UnknownLedgerStateError`` (EUNKNOWNLEDGERSTATE): a bookie whose ledger is limbo may have lost
#: the entry, so its answer is neither yes nor no, like a timeout (rule 12 of docs/correctness.md)
NEGATIVE_ANSWERS = (NoSuchEntryError, NoSuchLedgerError)

#: rounds over a write set whose replicas all pushed back (TooManyRequestsError) before giving up
_READ_BACKOFF_ROUNDS = 8


class EntryRead:
    """Reads and verifies one entry from its replicas with callbacks only (no task, no coroutine):
    the first replica; a speculative read to the next one every ``speculative_s`` without an
    answer; the next one at once on an error or a bad digest. If every replica pushed back
    (TooManyRequestsError), another round after a short backoff, within the read timeout.

    ``on_done(self)`` runs exactly once (unless cancelled), with ``result`` or ``error`` set.
    """

    __slots__ = ("deadline", "entry_id", "error", "errors", "finished", "futures", "loop", "next_replica", "on_done",
                 "outstanding", "replicas", "result", "rounds", "source", "timer")

    def __init__(
        self, source: ReplicaReads, entry_id: int, replicas: Sequence[str], on_done: Callable[[EntryRead], None]
    ) -> None:
        self.source = source
        self.entry_id = entry_id
        self.replicas = replicas
        self.on_done = on_done
        self.loop = asyncio.get_running_loop()
        self.deadline = 0.0
        self.next_replica = 0
        self.outstanding = 0
        self.rounds = 0
        self.errors: list[BaseException] = []
        self.futures: list[asyncio.Future[bytes | memoryview]] = []
        self.timer: asyncio.TimerHandle | None = None
        self.result: Entry | None = None
        self.error: BaseException | None = None
        self.finished = False

    def start(self) -> None:
        self.deadline = self.loop.time() + self.source.timeout_s
        self._launch()

    def cancel(self) -> None:
        """Stop: no callback, outstanding answers are dropped."""
        self.finished = True
        self._stop()

    def _stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        for f in self.futures:
            if not f.done():
                f.cancel()

    def _launch(self) -> None:
        bookie = self.replicas[self.next_replica]
        self.next_replica += 1
        src = self.source
        fut = src.bc.read_future(bookie, src.ledger_id, self.entry_id, timeout_s=src.timeout_s)
        self.futures.append(fut)
        self.outstanding += 1
        fut.add_done_callback(functools.partial(self._answered, bookie))
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if src.speculative_s > 0 and self.next_replica < len(self.replicas):
            self.timer = self.loop.call_later(src.speculative_s, self._speculate)

    def _speculate(self) -> None:
        self.timer = None
        if not self.finished and self.next_replica < len(self.replicas):
            self._launch()  # the replica is slow: ask the next one too

    def _answered(self, bookie: str, fut: asyncio.Future[bytes]) -> None:
        if fut.cancelled():
            return
        exc = fut.exception()  # retrieved even when late: asyncio would log an unread error
        if self.finished:
            return
        self.outstanding -= 1
        if exc is None:
            try:
                entry = self.source.digest.verify(fut.result(), self.entry_id)
            except DigestMismatchError as e:
                log.warning("ledger %d entry %d: bad replica on bookie %s: %s", self.source.ledger_id, self.entry_id,
                            bookie, e)
                self.errors.append(e)
            else:
                self._finish(entry, None)
                return
        else:
            self.errors.append(exc)
        if self.next_replica < len(self.replicas):
            self._launch()  # failover at once
        elif self.outstanding == 0:
            recent = self.errors[-len(self.replicas):]
            if (all(isinstance(e, TooManyRequestsError) for e in recent) and self.rounds < _READ_BACKOFF_ROUNDS
                    and self.loop.time() < self.deadline):
                # Every replica pushed back: back-pressure, not a failure. Another round later.
                delay = backoff_delay(self.rounds)
                self.rounds += 1
                self.next_replica = 0
                self.timer = self.loop.call_later(delay, self._retry_round)
                return
            self._finish(None, read_failure(self.source.ledger_id, self.entry_id, self.replicas, self.errors))

    def _retry_round(self) -> None:
        self.timer = None
        if not self.finished:
            self._launch()

    def _finish(self, entry: Entry | None, error: BaseException | None) -> None:
        self.finished = True
        self.result, self.error = entry, error
        self._stop()
        self.on_done(self)


def read_failure(ledger_id: int, entry_id: int, replicas: Sequence[str], errors: list[BaseException]) -> VellumError:
    """The error of a read that no replica served: NoSuchEntryError if every replica said it has
    no such entry, else the first other error (its class, with the context)."""
    if errors and all(isinstance(e, NEGATIVE_ANSWERS) for e in errors):
        return NoSuchEntryError(f"ledger {ledger_id}: no bookie of {list(replicas)} has entry {entry_id}")
    first = next((e for e in errors if not isinstance(e, NEGATIVE_ANSWERS)), None)
    if isinstance(first, VellumError):
        return type(first)(f"ledger {ledger_id} entry {entry_id}: read failed on {list(replicas)}: {first}")
    return ReadError(f"ledger {ledger_id} entry {entry_id}: read failed on {list(replicas)}: {errors}")


@dataclass(frozen=True, slots=True)
class ReplicaReads:
    """How to read one ledger from its bookies: the bookie client, the ledger's digest manager
    (every entry is verified with it), the read timeout and the speculative-read delay."""

    bc: BookieClient
    digest: DigestManager
    ledger_id: int
    timeout_s: float
    speculative_s: float

    async def read_entry(self, entry_id: int, replicas: Sequence[str]) -> Entry:
        """Read and verify ``entry_id`` from ``replicas`` in order (speculative + failover).

        Raises NoSuchEntryError if every replica said it has no such entry, else the first other error.
        """
        fut: asyncio.Future[Entry] = asyncio.get_running_loop().create_future()

        def on_done(r: EntryRead) -> None:
            if fut.done():
                return
            if r.error is not None:
                fut.set_exception(r.error)
            else:
                assert r.result is not None
                fut.set_result(r.result)

        reader = EntryRead(self, entry_id, replicas, on_done)
        reader.start()
        try:
            return await fut
        finally:
            if not reader.finished:
                reader.cancel()

    async def read_batch(self, first: int, last: int, replicas: Sequence[str], max_size: int) -> list[Entry]:
        """One BATCH_READ of ``first..last`` (at most ``max_size`` bytes), verified; ``replicas``
        tried in order, the next one after ``speculative_s`` without an answer or at once on an
        error. ``[]`` if no replica answered with a verified batch (the caller falls back to
        entry reads)."""
        verify = self.digest.verify
        got = await self._batch(first, last, replicas, max_size,
                                lambda raws: list(map(verify, answer_entries(raws), range(first, last + 1))))
        return got or []

    async def read_batch_payloads(self, first: int, last: int, replicas: Sequence[str],
                                  max_size: int) -> tuple[PayloadSpans, int]:
        """:meth:`read_batch` for bulk readers: the verified payloads (spans of the answer's
        buffer) and the greatest LAC they carry; empty and -1 where ``read_batch`` answers ``[]``."""
        got = await self._batch(first, last, replicas, max_size,
                                lambda raws: self.digest.verify_spans(answer_spans(raws), first))
        return got or (PayloadSpans.of(()), -1)

    async def _batch(self, first: int, last: int, replicas: Sequence[str], max_size: int,
                     verify: Callable[[Sequence[BytesLike]], _R]) -> _R | None:
        """The BATCH_READ of ``read_batch``; ``verify`` checks an answer's entries (raising
        DigestMismatchError) and makes the result; None if no replica gave a verified batch."""
        count = last - first + 1
        errors: list[BaseException] = []
        # futures of the bookie client, not tasks: a batch read costs no task switch
        tasks: dict[asyncio.Future[FrameEntries], str] = {}
        next_replica = 0

        def launch() -> None:
            nonlocal next_replica
            bookie = replicas[next_replica]
            next_replica += 1
            tasks[self.bc.batch_read_future(bookie, self.ledger_id, first, count, max_size,
                                            timeout_s=self.timeout_s)] = bookie

        launch()
        running = set(tasks)
        try:
            while running:
                spec = self.speculative_s if self.speculative_s > 0 and next_replica < len(replicas) else None
                done, running = await wait_first(running, spec)
                if not done:
                    launch()
                    running = {t for t in tasks if not t.done()}
                    continue
                for t in done:
                    exc = t.exception()
                    if exc is None:
                        raws = t.result()[:count]
                        if not raws:
                            errors.append(NoSuchEntryError("empty batch"))
                        else:
                            try:
                                return verify(raws)
                            except DigestMismatchError as e:
                                log.warning("ledger %d: bad batch from bookie %s at %d: %s", self.ledger_id,
                                            tasks[t], first, e)
                                errors.append(e)
                    else:
                        errors.append(exc)
                    if next_replica < len(replicas):
                        launch()
                running = {t for t in tasks if not t.done()}
        finally:
            for t in tasks:
                if not t.done():
                    t.cancel()
                elif not t.cancelled():
                    t.exception()
        log.debug("ledger %d: batch read %d..%d failed on every replica: %s", self.ledger_id, first, last, errors)
        return None


def answer_entries(raws: Sequence[BytesLike], count: int | None = None) -> Sequence[BytesLike]:
    """The first ``count`` (default: all) entries of a multi-entry answer, as a list of views of
    its buffer made in C when it arrived as one frame (iterating a ``FrameEntries`` itself is
    ``Sequence``'s iterator in Python: a generator step and an item lookup per entry, about a
    thousand of them a seed of the simulator); any other sequence is only cut to ``count``."""
    if type(raws) is FrameEntries:
        starts, ends = (raws.starts, raws.ends) if count is None else (raws.starts[:count], raws.ends[:count])
        return list(map(raws.body.__getitem__, map(slice, starts, ends)))
    return raws if count is None else raws[:count]


def answer_spans(raws: Sequence[BytesLike]) -> PayloadSpans:
    """A bulk read's answer as spans: the answer's own buffer and offsets when it arrived as
    one frame (no object per entry), else each entry on its own."""
    if isinstance(raws, FrameEntries):
        return PayloadSpans.in_one(raws.body, raws.starts, raws.ends)
    return PayloadSpans.of(raws)


async def collect_answers(
    requests: Mapping[_F, int],
    on_answer: Callable[[int, _F], bool],
    enough: Callable[[], bool],
    *,
    cancel_rest: bool = True,
) -> bool:
    """Hand each finished request (future -> the index it was sent to) to ``on_answer(index,
    future)`` as it completes, all of those that complete together before ``enough()`` is asked.
    True as soon as ``on_answer`` or ``enough()`` returns True; False once every request finished
    without. The requests still running are cancelled then, unless ``cancel_rest`` is False
    (fencing reads keep going: each one still fences its bookie)."""
    pending = set(requests)
    try:
        while pending:
            done, pending = await wait_first(pending)
            for t in done:
                if on_answer(requests[t], t):
                    return True
            if enough():
                return True
        return False
    finally:
        if cancel_rest:
            for t in pending:
                t.cancel()


async def wait_first(fs: Iterable[_F], timeout: float | None = None) -> tuple[set[_F], set[_F]]:
    """``asyncio.wait(fs, timeout=timeout, return_when=FIRST_COMPLETED)`` for futures of ours.

    The same steps on the same objects in the same order as asyncio's (the copy of ``fs``, the
    waiter, its timer, one completion callback per future, their removal, the two sets built
    in the copy's order), so every callback is scheduled as asyncio schedules it; without
    ``wait``'s checks of its arguments (a coroutine test per future) and its second coroutine,
    which cost the read path's frequent waits (LAC reads, recovery reads, batch reads) about
    a fifth of their time."""
    fs = set(fs)
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()
    timeout_handle = None if timeout is None else loop.call_later(timeout, _release_waiter, waiter)

    def on_completion(_f: _F) -> None:
        if timeout_handle is not None:
            timeout_handle.cancel()
        if not waiter.done():
            waiter.set_result(None)

    for f in fs:
        f.add_done_callback(on_completion)
    try:
        await waiter
    finally:
        if timeout_handle is not None:
            timeout_handle.cancel()
        for f in fs:
            f.remove_done_callback(on_completion)
    done: set[_F] = set()
    pending: set[_F] = set()
    for f in fs:
        if f.done():
            done.add(f)
        else:
            pending.add(f)
    return done, pending


def _release_waiter(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
