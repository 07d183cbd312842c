"""``append_batch_async``: many entries in one call, one future, against real in-process bookies:
ids and completions in call order mixed with single appends, the in-flight bound, an ensemble
change in the middle of a batch, refusals, and ``force``/``close`` waiting for batch entries."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from client_testkit import run
from test_ledger_support import client_cluster

from vellum.errors import IncorrectParameterError, LedgerClosedError, LedgerFencedError
from vellum.format.entry import DigestManager, DigestType


def payload(i: int) -> bytes:
    return f"batch-{i:05d}-".encode() * 6


def test_batches_and_single_appends_keep_call_order(tmp_path: Path) -> None:
    async def main() -> None:
        async with client_cluster(tmp_path, 3) as cc:
            lh = await cc.bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
            lh.max_adds_in_flight = 16  # most of each batch waits in the queue, built when sent
            completed: list[int] = []
            futures = []
            i = 0
            for size in (1, 40, 7, 100, 3):
                f = lh.append_async(payload(i))
                f.add_done_callback(lambda f: completed.append(f.result()))
                futures.append(f)
                i += 1
                b = lh.append_batch_async([payload(j) for j in range(i, i + size)])
                b.add_done_callback(lambda f: completed.append(f.result()))
                futures.append(b)
                i += size
            ids = await asyncio.gather(*futures)
            # a batch's future gives its last id
            assert ids == completed == sorted(ids), "futures complete in entry-id order"
            assert ids[-1] == i - 1 and lh.last_add_confirmed == i - 1
            assert lh.length == sum(len(payload(j)) for j in range(i))
            got = await lh.read(0, i - 1)
            assert [g.payload for g in got] == [payload(j) for j in range(i)]
            digest = DigestManager(lh.ledger_id, DigestType.CRC32C)
            for j in (1, 2, 45, i - 1):  # each stored entry carries the ledger's length up to it
                raw = await cc.bk.bookie_client.read(lh.metadata.ensembles[0][j % 3], lh.ledger_id, j, timeout_s=5)
                assert digest.verify(raw, j).length == sum(len(payload(k)) for k in range(j + 1))
            with pytest.raises(IncorrectParameterError, match="no entries"):
                await lh.append_batch_async([])
            await lh.close()
            with pytest.raises(LedgerClosedError):
                await lh.append_batch_async([b"late"])

    run(main())


def test_close_and_force_wait_for_every_batch_entry(tmp_path: Path) -> None:
    async def main() -> None:
        async with client_cluster(tmp_path, 3) as cc:
            lh = await cc.bk.create_ledger(ensemble_size=3, write_quorum_size=3, ack_quorum_size=2)
            lh.max_adds_in_flight = 8
            first = lh.append_batch_async([payload(j) for j in range(50)])
            second = lh.append_batch_async([memoryview(payload(j)) for j in range(50, 120)])
            assert await lh.force() == 119  # a barrier over both batches, entries without futures too
            assert first.result() == 49 and second.result() == 119
            lh.append_batch_async([payload(j) for j in range(120, 200)])
            await lh.close()  # waits for the batch even though nobody awaited its future
            rh = await (await cc.new_client()).open_ledger(lh.ledger_id)
            assert rh.last_add_confirmed == 199
            got = await rh.read(0, 199)
            assert [g.payload for g in got] == [payload(j) for j in range(200)]

    run(main())


def test_a_bookie_dying_in_the_middle_of_a_batch_changes_the_ensemble(tmp_path: Path) -> None:
    async def main() -> None:
        async with client_cluster(tmp_path, 4) as cc:
            lh = await cc.bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
            assert await lh.append_batch_async([payload(j) for j in range(30)]) == 29
            victim = lh.metadata.ensembles[0][1]
            lh.max_adds_in_flight = 20
            batch = lh.append_batch_async([payload(j) for j in range(30, 230)])
            await cc.bookie(victim).stop()
            assert await batch == 229
            md = lh.metadata
            assert len(md.ensembles) == 2 and victim not in md.last_ensemble
            await lh.close()
            rh = await (await cc.new_client()).open_ledger(lh.ledger_id)
            got = await rh.read(0, 229)
            assert [g.payload for g in got] == [payload(j) for j in range(230)]

    run(main())


def test_a_fenced_ledger_fails_the_whole_batch(tmp_path: Path) -> None:
    async def main() -> None:
        async with client_cluster(tmp_path, 3) as cc:
            lh = await cc.bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
            assert await lh.append_batch_async([payload(j) for j in range(10)]) == 9
            # another client recovers (fences) the ledger: the writer's next adds are refused
            other = await cc.new_client()
            rh = await other.open_ledger(lh.ledger_id, recovery=True)
            assert rh.last_add_confirmed == 9
            with pytest.raises(LedgerFencedError):
                await lh.append_batch_async([payload(j) for j in range(10, 40)])
            with pytest.raises(LedgerFencedError):
                await lh.append_batch_async([payload(40)])  # the writer stays failed

    run(main())
