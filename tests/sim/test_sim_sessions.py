"""The simulated metadata store's sessions on virtual time: what AutoRecovery and the ``expiry``
fault rely on (docs/verification.md). An expired session loses its registrations, locks and
auditor vote at once, its calls fail as a driver's do while the session is gone, and it comes
back with a new session id, its registrations and a new vote at the end of the line; a record
marked again merges its replicas; ``wait_for_work`` blocks (through the loop's executor hook)
until the records change."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from vellum.errors import MetadataStoreUnavailableError
from vellum.ids import BookieId, LedgerId
from vellum.meta.api import SessionEvent
from vellum.sim.loop import SimLoop
from vellum.sim.metadata import EPOCH_S, SimMetadataStore

B1, B2 = BookieId("bk1:3181"), BookieId("bk2:3181")


def _run(body: Callable[[SimLoop, SimMetadataStore], Any]) -> None:
    loop = SimLoop()
    try:
        loop.run_until_complete(body(loop, SimMetadataStore(loop)))
    finally:
        loop.close()


def test_expiry_drops_registrations_locks_and_the_vote_then_the_session_comes_back() -> None:
    async def body(loop: SimLoop, observer: SimMetadataStore) -> None:
        victim, other = observer.session("victim"), observer.session("other")
        events: list[SessionEvent] = []
        victim.add_session_listener(events.append)
        victim.registration.register_bookie(B1)
        ur = victim.underreplication
        ur.mark_under_replicated(LedgerId(7), [str(B2)])
        assert ur.acquire_ledger_to_rereplicate(worker_id="w") == 7
        lost: list[str] = []
        mine = ur.elect_auditor(B1, on_lost=lambda: lost.append("lost"))
        theirs = other.underreplication.elect_auditor(B2)
        await asyncio.sleep(0)
        assert mine.is_leader and not theirs.is_leader
        old = victim.session_id

        assert victim.expire(0.5)
        assert not victim.expire(0.5)  # already expired
        assert observer.registration.list_bookies() == frozenset()
        assert not observer.underreplication.is_locked(LedgerId(7))
        assert theirs.is_leader and not mine.is_leader
        with pytest.raises(MetadataStoreUnavailableError, match="SessionExpiredError"):
            victim.ledgers.ledger_exists(LedgerId(1))
        with pytest.raises(MetadataStoreUnavailableError, match="SessionExpiredError"):
            ur.release_ledger(LedgerId(7))
        assert other.underreplication.acquire_ledger_to_rereplicate(worker_id="o") == 7
        await asyncio.sleep(0.1)
        assert events == [SessionEvent.EXPIRED] and lost == ["lost"]

        await asyncio.sleep(0.5)
        assert events == [SessionEvent.EXPIRED, SessionEvent.RECONNECTED]
        assert victim.session_id != old
        assert observer.registration.list_bookies() == frozenset({B1})  # re-registered
        assert theirs.is_leader and not mine.is_leader  # voted again, behind the new leader
        theirs.resign()
        await asyncio.sleep(0)
        assert mine.is_leader and observer.underreplication.current_auditor() == B1

    _run(body)


def test_a_closed_session_ends_for_good_without_callbacks() -> None:
    async def body(loop: SimLoop, observer: SimMetadataStore) -> None:
        s = observer.session("bookie")
        s.registration.register_bookie(B1)
        called: list[str] = []
        s.underreplication.elect_auditor(B1, lambda: called.append("leader"), on_lost=lambda: called.append("lost"))
        await asyncio.sleep(0)
        s.close()
        await asyncio.sleep(1.0)
        assert called == ["leader"]
        assert observer.registration.list_bookies() == frozenset()
        assert observer.underreplication.current_auditor() is None
        with pytest.raises(MetadataStoreUnavailableError, match="closed"):
            s.registration.list_bookies()

    _run(body)


def test_marks_merge_replicas_and_stamp_the_virtual_wall_clock() -> None:
    async def body(loop: SimLoop, store: SimMetadataStore) -> None:
        ur = store.underreplication
        ur.mark_under_replicated(LedgerId(5), ["b:1"])
        first = ur.get_under_replicated(LedgerId(5))
        assert first is not None and first.ctime_ms == int((EPOCH_S + loop.time()) * 1000)
        await asyncio.sleep(2.0)
        ur.mark_under_replicated(LedgerId(5), ["b:1"])  # nothing new: same record
        assert ur.get_under_replicated(LedgerId(5)) == first
        ur.mark_under_replicated(LedgerId(5), ["a:1"])
        second = ur.get_under_replicated(LedgerId(5))
        assert second is not None and second.replicas == ("a:1", "b:1") and second.version == first.version + 1
        assert second.ctime_ms == first.ctime_ms + 2000

    _run(body)


def test_wait_for_work_blocks_on_virtual_time_until_a_record_is_marked() -> None:
    async def body(loop: SimLoop, auditor: SimMetadataStore) -> None:
        worker = auditor.session("worker")
        ur = worker.underreplication

        def acquire_or_wait() -> LedgerId | None:  # as the replication worker does, in one call
            lid = ur.acquire_ledger_to_rereplicate(worker_id="w")
            if lid is None:
                ur.wait_for_work(10.0)
            return lid

        def executor(func: Callable[..., Any], args: tuple[Any, ...]) -> asyncio.Future[Any]:
            fut: asyncio.Future[Any] = loop.create_future()
            result = func(*args)
            blocked = worker.take_block()
            if blocked is None:
                fut.set_result(result)
            else:
                worker.wake_after(blocked, lambda: fut.set_result(result))
            return fut

        loop.executor_hook = executor
        t0 = loop.time()
        assert await asyncio.to_thread(acquire_or_wait) is None  # nothing: waited its timeout
        assert loop.time() - t0 == pytest.approx(10.0)
        loop.call_later(3.0, auditor.underreplication.mark_under_replicated, LedgerId(9), ["b:1"])
        t0 = loop.time()
        assert await asyncio.to_thread(acquire_or_wait) is None
        assert loop.time() - t0 == pytest.approx(3.0)  # woken by the mark, not the timeout
        assert await asyncio.to_thread(acquire_or_wait) == 9

    _run(body)
