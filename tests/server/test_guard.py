"""``server/guard.py`` alone: the refusal log's rate limit and counts, the unauthenticated
budget's eviction order and the deadlines, with fake connections and a fake clock (the same
behaviour on real bookie processes: tests/security/test_unauthenticated_peers.py)."""

from __future__ import annotations

import asyncio
import collections
import logging

import pytest

from vellum.server import guard as g
from vellum.server.guard import ConnectionGuard, PeerLimits, RefusalLog
from vellum.server.metrics import ServerCounters

LOG = "vellum.server.bookie_server"


class FakeConnection:
    def __init__(self, name: str, guard: ConnectionGuard) -> None:
        self.name = name
        self.guard = guard
        self.closed: str | None = None
        self.busy = False
        self.active = False

    def peer_host(self) -> str:
        return "10.0.0.9"

    def is_busy(self) -> bool:
        return self.busy

    def take_activity(self) -> bool:
        active, self.active = self.active, False
        return active

    def close_for(self, reason: str, message: str, detail: str = "") -> None:
        self.closed = reason
        self.guard.refusals.refused(reason, self.peer_host(), message, detail)
        self.guard.closed(self)


def test_refusals_are_counted_always_and_logged_once_per_period_with_a_count(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> collections.Counter[str]:
        counts: collections.Counter[str] = collections.Counter()
        refusals = RefusalLog(60.0, counts)
        now = asyncio.get_running_loop().time()
        for _ in range(100):
            refusals.refused(g.AUTH_REFUSED, "10.0.0.9", "AUTH refused: bad signature", "bad signature")
        refusals.refused(g.AUTH_REFUSED, "10.0.0.9", "AUTH refused: expired", "expired")  # another detail
        refusals.refused(g.AUTH_REFUSED, "10.0.0.7", "AUTH refused: bad signature", "bad signature")  # another peer
        refusals.flush(now + 61)
        return counts

    with caplog.at_level(logging.WARNING, logger=LOG):
        counts = asyncio.run(main())
    assert counts[g.AUTH_REFUSED] == 102
    lines = [r.getMessage() for r in caplog.records]
    assert lines.count("AUTH refused: bad signature") == 2  # one per peer
    assert lines.count("AUTH refused: expired") == 1
    assert "99 more auth_refused refusals from 10.0.0.9 not logged in the last 61s" in lines
    # the peer is a field of the record too, for a formatter that prints it
    assert {getattr(r, "peer", None) for r in caplog.records if r.getMessage().startswith("AUTH refused")} == {
        "10.0.0.9", "10.0.0.7"}


def test_many_addresses_share_one_log_key_past_the_bound() -> None:
    async def main() -> int:
        refusals = RefusalLog(60.0, collections.Counter())
        for i in range(RefusalLog.MAX_KEYS + 500):
            refusals.refused(g.AUTHENTICATION_TIMEOUT, f"10.1.{i // 256}.{i % 256}", "timeout")
        return len(refusals._last)

    assert asyncio.run(main()) <= RefusalLog.MAX_KEYS + 1


def test_the_budget_closes_the_oldest_and_the_deadline_the_rest() -> None:
    async def main() -> None:
        counters = ServerCounters()
        guard = ConnectionGuard(PeerLimits(max_unauthenticated=3, authentication_timeout_s=10.0),
                                RefusalLog(60.0, counters.refused), counters=counters)
        now = asyncio.get_running_loop().time()
        conns = [FakeConnection(f"c{i}", guard) for i in range(5)]
        for c in conns:
            guard.accepted(c, authenticated=False)
        assert [c.closed for c in conns] == [g.UNAUTHENTICATED_BUDGET] * 2 + [None] * 3
        assert counters.unauthenticated == 3
        guard.authenticated(conns[2])  # leaves the budget and its deadline
        guard.sweep(now + 11)
        assert [c.closed for c in conns[2:]] == [None, g.AUTHENTICATION_TIMEOUT, g.AUTHENTICATION_TIMEOUT]
        assert counters.unauthenticated == 0
        assert counters.refused == {g.UNAUTHENTICATED_BUDGET: 2, g.AUTHENTICATION_TIMEOUT: 2}

    asyncio.run(main())


def test_idle_authenticated_connections_are_closed_unless_busy_or_active() -> None:
    async def main() -> None:
        counters = ServerCounters()
        guard = ConnectionGuard(PeerLimits(idle_timeout_s=5.0), RefusalLog(60.0, counters.refused),
                                counters=counters)
        now = asyncio.get_running_loop().time()
        idle, busy, active = (FakeConnection(n, guard) for n in ("idle", "busy", "active"))
        for c in (idle, busy, active):
            guard.accepted(c, authenticated=True)
        busy.busy = True  # e.g. a long-poll LAC read waiting at the bookie
        for t in (2, 4):
            active.active = True
            guard.sweep(now + t)
        guard.sweep(now + 6)
        assert (idle.closed, busy.closed, active.closed) == (g.IDLE_TIMEOUT, None, None)

    asyncio.run(main())
