"""The simulator over the real bookie (``--bookie real``, docs/verification.md): the real
``Bookie``, ``Journal`` and ``LedgerStorage`` on files, driven by virtual time. A crash loses
what only memory held and a restart replays the journal; seeds run clean and replay exactly.

``VELLUM_SIM_REAL_SEEDS=N`` runs N seeds in the campaign test instead of the CI default."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from vellum.errors import LedgerFencedError, NoSuchEntryError
from vellum.format.entry import DigestManager, DigestType, master_key
from vellum.proto.messages import AddBatch
from vellum.sim.campaign import run_campaign
from vellum.sim.loop import SimLoop
from vellum.sim.metadata import SimMetadataStore
from vellum.sim.real_bookie import PageCache, RealSimBookie
from vellum.sim.runner import SCENARIOS, SimOptions, run_seed
from vellum.sim.workload import WorkloadShape

CI_SHAPE = WorkloadShape(ledgers=2, entries=(10, 30), reader_polls=15)
CI_SEEDS = int(os.environ.get("VELLUM_SIM_REAL_SEEDS", "30"))
REAL = SimOptions(shape=CI_SHAPE, bookie="real")

KEY = master_key(b"pw")
DM = DigestManager(1, DigestType.CRC32C, b"pw")

Answers = list[tuple[list[BaseException | None], BaseException | None]]


def _entry(entry_id: int) -> bytes:
    return bytes(DM.compute(entry_id, entry_id - 1, entry_id + 1, b"payload %d" % entry_id))


def _bookie(loop: SimLoop, home: Path, page_cache: PageCache | None = None) -> RealSimBookie:
    store = SimMetadataStore(loop, lambda _lid, _md: None)
    return RealSimBookie("bookie-0:3181", loop, random.Random(1), home, store.ledgers,
                         lambda lid, key: key == KEY, group_wait_s=0.001, fsync_s=(0.002, 0.003),
                         read_s=(0.0001, 0.0002), checkpoint_s=(1000.0, 1001.0), page_cache=page_cache)


def _add(b: RealSimBookie, entry_id: int, answers: Answers, *, recovery: bool = False) -> None:
    b.add_batch_cb(AddBatch.of_entries([(_entry(entry_id), KEY, recovery)]), lambda r, e: answers.append((r, e)))


def test_a_crash_loses_what_only_memory_held_and_a_restart_replays_the_journal(tmp_path: Path) -> None:
    loop = SimLoop()
    threads_before = threading.active_count()
    b = _bookie(loop, tmp_path)
    assert threading.active_count() == threads_before  # the storage runs no thread of its own
    answers: Answers = []

    async def first_life() -> None:
        for e in range(3):
            _add(b, e, answers)
        assert answers == [] and b.bookie.journals[0].queued  # queued, not yet committed
        await asyncio.sleep(0.01)  # the group commit
        assert answers == [([None], None)] * 3
        _add(b, 3, answers)  # in the write cache and the journal's queue only
        assert await b.read_entry(1, 3)  # readable at once (the write cache)
        b.crash()  # kill -9 before its group commit
        await asyncio.sleep(0.01)

    loop.run_until_complete(first_life())
    assert len(answers) == 3  # the add that was never durable is never answered
    # No checkpoint ran: entries 0..2 are only in the journal on disk (the write cache is gone).
    again = _bookie(loop, tmp_path)
    assert again.replayed >= 3  # the journal was replayed into storage at start
    assert again.held_entries(1) == {0, 1, 2}

    async def second_life() -> None:
        for e in range(3):
            assert bytes(await again.read_entry(1, e)) == _entry(e)
        with pytest.raises(NoSuchEntryError):
            await again.read_entry(1, 3)
        # a checkpoint makes them durable in the ledger storage: the next start replays less
        again.bookie.checkpoint()
        await again.fence(1, KEY)  # journaled after the checkpoint's mark
        again.crash()

    loop.run_until_complete(second_life())
    third = _bookie(loop, tmp_path)
    assert third.replayed == 1  # only the fence, after the persisted mark
    fenced: Answers = []

    async def third_life() -> None:
        _add(third, 3, fenced)
        _add(third, 3, fenced, recovery=True)
        await asyncio.sleep(0.01)

    loop.run_until_complete(third_life())
    assert isinstance(fenced[0][0][0], LedgerFencedError) and fenced[1] == ([None], None)
    assert third.held_entries(1) == {0, 1, 2, 3}
    third.crash()
    loop.close()


@pytest.mark.parametrize("power_loss", [False, True])
def test_a_power_loss_also_takes_what_was_written_but_not_fsynced(tmp_path: Path, power_loss: bool) -> None:
    """The group commit writes at the end of the group wait and fsyncs later (the force-write
    step). A crash between the two: a process crash leaves the written batch in the file (the
    restart replays it, though it was never acknowledged); a power loss takes it back. What was
    fsynced (and acknowledged) survives both."""
    loop = SimLoop()
    cache = PageCache()
    b = _bookie(loop, tmp_path, cache)
    answers: Answers = []

    async def first_life() -> None:
        _add(b, 0, answers)
        _add(b, 1, answers)
        await asyncio.sleep(0.01)
        assert answers == [([None], None)] * 2 and cache.dirty_files == 0  # fsynced
        _add(b, 2, answers)
        await asyncio.sleep(0.0015)  # written at 1 ms, its fsync due at 3 to 4 ms
        assert len(answers) == 2 and cache.dirty_files == 1  # the journal, written and not synced
        b.crash()

    loop.run_until_complete(first_life())
    if power_loss:
        assert cache.lose() == 1
    again = _bookie(loop, tmp_path, cache)
    assert again.held_entries(1) == ({0, 1} if power_loss else {0, 1, 2})
    assert len(answers) == 2  # entry 2 was never acknowledged either way
    again.crash()
    loop.close()


def test_a_campaign_with_power_losses_finds_no_violation() -> None:
    report = run_campaign(range(12), replace(REAL, power_loss=1.0))
    assert report.acks > 0
    assert not report.violations and not report.errors, (report.violations[:2], report.errors[:2])


def test_a_campaign_over_the_real_bookie_finds_no_violation() -> None:
    report = run_campaign(range(CI_SEEDS), REAL)
    assert report.seeds == CI_SEEDS
    assert report.acks > CI_SEEDS * 5, report.acks
    assert report.network["dropped"] and report.network["partitioned"]
    assert not report.violations and not report.errors, (report.violations[:2], report.errors[:2])


def test_real_bookies_crash_and_restart_over_their_journals_in_a_run() -> None:
    """The default faults crash real bookies; each restart opens the bookie again over its files
    and replays its journal from the last checkpoint's mark."""
    restarts: list[str] = []
    for seed in range(40):  # about half of the restarts replay something; which seeds do moves with any change
        result = run_seed(seed, replace(SimOptions(bookie="real"), trace=True))
        assert result.history is not None and not result.violations and result.error is None
        restarts += [str(ev.value) for ev in result.history.events if ev.kind == "restart"]
        if len(restarts) >= 3 and any(" (replayed 0 " not in r for r in restarts):
            break
    assert len(restarts) >= 3, restarts
    assert any(" (replayed 0 " not in r for r in restarts), restarts


@pytest.mark.parametrize("scenario", ["fence-race", "tailing"])
def test_the_other_scenarios_over_the_real_bookie_find_no_violation(scenario: str) -> None:
    report = run_campaign(range(8), replace(SCENARIOS[scenario], bookie="real"))
    assert not report.violations and not report.errors, (report.violations[:2], report.errors[:2])


def test_a_real_bookie_seed_replays_exactly_in_this_process_and_another() -> None:
    a, b = run_seed(4242, REAL), run_seed(4242, REAL)
    assert a.fingerprint == b.fingerprint and a.events == b.events and a.acks == b.acks > 0
    assert run_seed(4243, REAL).fingerprint != a.fingerprint
    code = ("from vellum.sim.runner import SimOptions, run_seed; from vellum.sim.workload import WorkloadShape; "
            "print(run_seed(4242, SimOptions(shape=WorkloadShape(ledgers=2, entries=(10, 30), reader_polls=15), "
            "bookie='real')).fingerprint)")
    src = str(Path(__file__).resolve().parents[2] / "src")
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": src}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                             check=True)
        assert out.stdout.strip() == a.fingerprint


def test_the_real_bookie_refuses_the_model_only_fault_and_the_model_a_power_loss() -> None:
    with pytest.raises(ValueError, match="torn"):
        run_seed(1, replace(REAL, faults=REAL.faults | {"torn"}))
    with pytest.raises(ValueError, match="wipe"):
        run_seed(1, SimOptions(faults=SimOptions().faults | {"wipe"}))
    with pytest.raises(ValueError, match="power loss"):
        run_seed(1, SimOptions(power_loss=0.5))
