"""What a client sees when a bookie's journal queue is full (its journal disk stopped writing).

The bookie's journal sits on a real ext4 filesystem on a loop device, frozen with ``fsfreeze``
while a writer appends: the journal's writer blocks, its queue fills to ``journalQueueSize``
records, the bookie's add thread waits for room, adds pile up to ``maxAddsInProgressLimit`` and
past it the bookie answers TOOMANYREQUESTS. The client neither fails nor replaces the bookie: it
backs off and sends again (docs/operations.md, "A full journal queue"). Nothing is acknowledged
while the disk cannot write; once it is thawed every append completes, in order, and reads back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from client_testkit import run
from test_ledger_support import client_cluster

from vellum.stats import REGISTRY
from vellum.testing.loop_fs import LoopFsUnavailable, ext4_loop_mount, frozen

APPENDS = 600


def _rejected_adds() -> float:
    """TOOMANYREQUESTS answers to ADDs, summed over every bookie server of this process."""
    return REGISTRY.get_sample_value("bookkeeper_server_REJECTED_total", {"op": "ADD"}) or 0.0


def payload(i: int) -> bytes:
    return f"jq-{i:06d}".encode() * 8


@pytest.fixture
def ext4_mount(tmp_path: Path) -> Iterator[Path]:
    try:
        with ext4_loop_mount(tmp_path / "ext4", size_mb=64) as mount:
            yield mount
    except LoopFsUnavailable as e:
        pytest.skip(f"no loop-mounted ext4 here: {e}")


def test_a_full_journal_queue_slows_the_writer_down_and_loses_nothing(tmp_path: Path, ext4_mount: Path) -> None:
    mount = ext4_mount

    async def main() -> None:
        overrides = {"journal_directories": (str(mount / "journal"),), "journal_queue_size": 16,
                     "max_adds_in_progress_limit": 64}
        # a long add timeout: the freeze below must show back-pressure, not an add timing out
        async with client_cluster(tmp_path / "cluster", 1, bookie_overrides=overrides,
                                  add_entry_timeout_s=120.0) as cc:
            opened = cc.bookies[0].opened
            assert opened is not None
            journal = opened.bookie.journals[0]
            lh = await cc.bk.create_ledger(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1)
            assert await lh.append(payload(0)) == 0
            ensemble = lh.metadata.ensembles[0]
            rejected_before = _rejected_adds()
            with frozen(mount):
                # One append at a time: the journal's writer takes the first and blocks writing
                # it, the next ones wait in the journal queue until it holds journalQueueSize.
                futures = []
                deadline = time.monotonic() + 60
                for _round in range(5):
                    while journal.can_take(1) and len(futures) < 200 and time.monotonic() < deadline:
                        futures.append(lh.append_async(payload(len(futures) + 1)))
                        await asyncio.sleep(0.02)
                    await asyncio.sleep(0.2)  # a writer not yet blocked (a loaded machine) takes them now
                    if not journal.can_take(1):
                        break
                assert not journal.can_take(1), f"{len(futures)} adds and the journal queue is not full"
                # Then a burst: the bookie's add thread waits for room in the queue, adds pile up
                # to maxAddsInProgressLimit and the ones past it are refused with TOOMANYREQUESTS.
                futures += [lh.append_async(payload(i)) for i in range(len(futures) + 1, APPENDS)]
                while _rejected_adds() == rejected_before and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                assert _rejected_adds() > rejected_before, "the bookie never answered TOOMANYREQUESTS"
                assert not any(f.done() for f in futures), "an add was acknowledged while the journal could not write"
            assert await asyncio.wait_for(asyncio.gather(*futures), 90) == list(range(1, APPENDS))
            await lh.close()
            md = await cc.bk.ledger_metadata(lh.ledger_id)
            assert md.ensembles == {0: ensemble}, "back-pressure from a full journal queue changed the ensemble"
            assert md.last_entry_id == APPENDS - 1
            rh = await cc.bk.open_ledger(lh.ledger_id, recovery=False)
            assert [e.payload for e in await rh.read(0, APPENDS - 1)] == [payload(i) for i in range(APPENDS)]

    run(main(), timeout_s=240)
