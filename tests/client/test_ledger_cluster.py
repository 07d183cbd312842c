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


def _under_replicated_adds() -> float:
    from vellum.stats import REGISTRY

    return REGISTRY.get_sample_value("bookkeeper_client_ADD_ENTRY_UR_total") or 0.0


def test_bookie_cut_off_while_the_ack_quorum_holds_is_replaced(cluster: LocalCluster) -> None:
    """Defect D3 of docs/correctness.md (rule 11 of docs/correctness.md). E4 W3 A2: one ensemble bookie stops answering; every
    add is still acknowledged by the two others, and the timeouts to the silent bookie come after
    the ack. It must still be replaced (the new ensemble persisted), and the under-replicated
    adds counted, instead of entries sitting at two copies with nothing said."""

    async def main() -> None:
        async with BookKeeper(cluster.metadata_uri, config=CFG) as bk:
            lh = await bk.create_ledger(ensemble_size=4, write_quorum_size=3, ack_quorum_size=2)
            await asyncio.gather(*(lh.append_async(payload(i)) for i in range(20)))
            victim = lh.metadata.ensembles[0][1]
            before = _under_replicated_adds()
            await asyncio.to_thread(cluster.pause, _index(cluster, victim))
            try:
                for i in range(20, 60):  # acknowledged at once by the two live bookies
                    assert await asyncio.wait_for(lh.append(payload(i)), 0.9) == i
                deadline = asyncio.get_running_loop().time() + 10
                i = 60
                while victim in lh.metadata.last_ensemble and asyncio.get_running_loop().time() < deadline:
                    await lh.append(payload(i))
                    i += 1
                    await asyncio.sleep(0.05)
                assert victim not in lh.metadata.last_ensemble, "the silent bookie was never replaced"
                assert _under_replicated_adds() > before
                # persisted: another client sees the new segment
                async with BookKeeper(cluster.metadata_uri, config=CFG) as other:
                    md = await other.ledger_metadata(lh.ledger_id)
                    assert victim not in md.last_ensemble and len(md.ensembles) >= 2
                await lh.close()
                async with BookKeeper(cluster.metadata_uri, config=CFG) as reader:
                    rh = await reader.open_ledger(lh.ledger_id, recovery=False)
                    got = await rh.read(0, rh.metadata.last_entry_id)
                    assert [g.payload for g in got] == [payload(j) for j in range(i)]
            finally:
                await asyncio.to_thread(cluster.resume, _index(cluster, victim))

    run(main(), timeout_s=90)
