"""Process-level faults with real bookie processes (``vellum.testing.local_cluster``):
kill -9 and SIGSTOP of a bookie under write load, then recovery by another client."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from client_testkit import run

from vellum.aio import BookKeeper
from vellum.config import ClientConfig
from vellum.errors import LedgerFencedError
from vellum.testing.local_cluster import LocalCluster

CFG = ClientConfig(add_entry_timeout_s=1.0, read_entry_timeout_s=2.0, speculative_read_timeout_ms=200)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("cluster"), bookies=5) as c:
        yield c


def payload(i: int) -> bytes:
    return f"c{i}".encode() * 50


def _index(cluster: LocalCluster, bookie_id: str) -> int:
    return cluster.bookie_ids.index(bookie_id)


def test_kill_9_bookie_during_writes_changes_ensemble(cluster: LocalCluster) -> None:
    async def main() -> int:
        async with BookKeeper(cluster.metadata_uri, config=CFG) as bk:
            lh = await bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
            victim = lh.metadata.ensembles[0][0]
            futs = [lh.append_async(payload(i)) for i in range(200)]
            await asyncio.gather(*futs[:50])
            await asyncio.to_thread(cluster.kill, _index(cluster, victim))
            futs += [lh.append_async(payload(i)) for i in range(200, 400)]
            assert await asyncio.gather(*futs) == list(range(400))
            assert len(lh.metadata.ensembles) >= 2 and victim not in lh.metadata.last_ensemble
            await lh.close()
        async with BookKeeper(cluster.metadata_uri, config=CFG) as bk2:
            rh = await bk2.open_ledger(lh.ledger_id)
            got = await rh.read(0, 399)
            assert [g.payload for g in got] == [payload(i) for i in range(400)]
        return _index(cluster, victim)

    victim = run(main(), timeout_s=60)
    cluster.restart(victim)


def test_paused_bookie_times_out_and_recovery_fences_writer(cluster: LocalCluster) -> None:
    async def main() -> None:
        async with BookKeeper(cluster.metadata_uri, config=CFG) as bk:
            lh = await bk.create_ledger(ensemble_size=3, write_quorum_size=3, ack_quorum_size=2)
            await asyncio.gather(*(lh.append_async(payload(i)) for i in range(20)))
            paused = _index(cluster, lh.metadata.ensembles[0][1])
            await asyncio.to_thread(cluster.pause, paused)
            try:
                # AQ=2 still reachable; the timeout on the paused bookie triggers an ensemble change
                acked = await asyncio.gather(*(lh.append_async(payload(i)) for i in range(20, 60)))
                assert acked == list(range(20, 60))
                async with BookKeeper(cluster.metadata_uri, config=CFG) as bk2:
                    rh = await bk2.open_ledger(lh.ledger_id)
                    assert rh.metadata.last_entry_id >= 59
                with pytest.raises(LedgerFencedError):
                    await lh.append(b"after recovery")
            finally:
                await asyncio.to_thread(cluster.resume, paused)

    run(main(), timeout_s=60)
