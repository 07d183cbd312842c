"""The ``clock`` fault's wall-clock steps reach AutoRecovery (docs/verification.md, "Disk and
clock faults"): its ``time.time`` is the store's stepped clock, and a step back must not hold
what AutoRecovery does for the length of the step. Here a writer goes away with its ledger open
and a bookie of its ensemble is lost for good; the auditor marks the ledger, then the wall clock
is stepped back an hour: the replication worker still fences, recovers and heals the ledger
after its grace period (its own wait bounds it), not an hour later."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from vellum.autorecovery import auditor as ar_auditor
from vellum.autorecovery import worker as ar_worker
from vellum.ids import LedgerId
from vellum.sim.autorecovery import SETTINGS, virtual_clock
from vellum.sim.network import current_node
from vellum.sim.runner import SimOptions, World, wall_clock_of


def _abandoned_ledger_after_a_step_back(seed: int) -> tuple[bool, int, float]:
    """(closed, last entry, virtual seconds from the step to the close or the give-up)."""
    world = World(seed, SimOptions(faults=frozenset(), lose_bookie=0.0))
    loop, store = world.loop, world.store
    loop.set_exception_handler(lambda _loop, _ctx: None)
    assert world.autorecovery is not None

    async def scenario() -> tuple[bool, int, float]:
        current_node.set("writer")
        assert world.autorecovery is not None
        world.autorecovery.start()
        bk = await world.client("writer")
        h = await bk.create_ledger(ensemble_size=3, write_quorum_size=3, ack_quorum_size=2, password=b"sim")
        for i in range(5):
            await h.append(b"entry %d" % i)
        await asyncio.sleep(0.2)  # every copy written (no write left to fail and replace a bookie)
        lid = h.ledger_id  # the writer goes away: the ledger stays open
        md = store.ledgers.read_ledger(LedgerId(lid)).value
        assert len(md.ensembles) == 1
        victim = next(n for n in world.nodes if n.name == str(md.ensembles[0][0]))  # of the open segment
        victim.lost = True
        victim.crash()
        for _ in range(100):  # the auditor marks it (the bookie's session ends 0.5 s after the crash)
            if lid in store.cluster.records:
                break
            await asyncio.sleep(0.1)
        assert lid in store.cluster.records
        store.cluster.wall_offset -= 3600.0  # NTP steps the wall clock back an hour
        stepped = loop.time()
        md = store.ledgers.read_ledger(LedgerId(lid)).value
        while not md.is_closed and loop.time() < stepped + 30.0:
            await asyncio.sleep(0.5)
            md = store.ledgers.read_ledger(LedgerId(lid)).value
        took = loop.time() - stepped
        await world.autorecovery.stop()
        return md.is_closed, md.last_entry_id, took

    try:
        with virtual_clock(loop, store.cluster.wall_s), wall_clock_of(world):
            return loop.run_until_complete(scenario())
    finally:
        tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for t in tasks:
            t.cancel()
        with contextlib.suppress(BaseException):
            loop.run_until_complete(asyncio.wait(tasks, timeout=5.0))
        loop.close()


def test_a_step_back_of_the_wall_clock_does_not_hold_an_open_ledgers_recovery() -> None:
    closed, last, took = _abandoned_ledger_after_a_step_back(3)
    assert closed and last == 4  # fenced and recovered: every acknowledged entry kept
    assert took < 4 * SETTINGS.open_ledger_grace_period_ms / 1000, took


def test_without_the_bound_the_step_holds_it_for_the_length_of_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ar_worker, "_bound_grace_by_own_wait", False)
    closed, _last, took = _abandoned_ledger_after_a_step_back(3)
    assert not closed and took >= 29.0  # still open when the test gave up, 30 s on


def test_autorecoverys_clock_is_the_stores_stepped_wall_clock() -> None:
    """The seam itself: inside a run's ``virtual_clock`` AutoRecovery's modules read the store's
    wall clock, which the ``clock`` fault steps, and the loop's monotonic clock."""
    world = World(0, SimOptions(faults=frozenset({"clock"})))
    cluster = world.store.cluster
    with virtual_clock(world.loop, cluster.wall_s):
        before = ar_auditor.time.time()
        cluster.wall_offset += 1800.0
        assert ar_worker.time.time() == pytest.approx(before + 1800.0)
        assert ar_worker.time.monotonic() == world.loop.time()
        assert cluster.now_ms() == int(ar_worker.time.time() * 1000)
    world.loop.close()
