"""Open with recovery: fencing, tail recovery, write-back, close; concurrent recoverers."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from client_testkit import run
from test_ledger_support import client_cluster

from vellum.errors import LedgerFencedError, LedgerRecoveryError
from vellum.format.entry import DigestManager, DigestType, master_key
from vellum.meta.model import LedgerState


def payload(i: int) -> bytes:
    return f"r{i}".encode() * 30


def test_second_writer_fences_the_first(tmp_path: Path) -> None:
    async def main() -> None:
        async with client_cluster(tmp_path, 3) as cc:
            lh = await cc.bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2, password=b"x")
            acked = await asyncio.gather(*(lh.append_async(payload(i)) for i in range(100)))
            other = await cc.new_client()
            rh = await other.open_ledger(lh.ledger_id, password=b"x")
            md = rh.metadata
            assert md.state is LedgerState.CLOSED
            assert md.last_entry_id >= max(acked)
            assert md.length == sum(len(payload(i)) for i in range(md.last_entry_id + 1))
            # the old writer is fenced: its next add fails, and so do all later ones
            with pytest.raises(LedgerFencedError):
                await lh.append(b"late")
            with pytest.raises(LedgerFencedError):
                await lh.append(b"later")
            # the recoverer closed at this writer's LAC: the writer's close agrees (rule 10 of docs/correctness.md)
            assert md.last_entry_id == lh.last_add_confirmed
            await lh.close()
            got = await rh.read(0, md.last_entry_id)
            assert [g.payload for g in got] == [payload(i) for i in range(md.last_entry_id + 1)]

    run(main())


def test_recovery_recovers_unconfirmed_tail_and_writes_it_back(tmp_path: Path) -> None:
    async def main() -> None:
        async with client_cluster(tmp_path, 3) as cc:
            # AQ=1 so that "absent" needs a negative from all three bookies ((WQ-AQ)+1): the one
            # bookie holding entry 5 always answers first or in time, so recovery must keep it.
            # (With AQ=2, two negatives may legitimately declare it absent.)
            lh = await cc.bk.create_ledger(ensemble_size=3, write_quorum_size=3, ack_quorum_size=1, password=b"x")
            for i in range(5):
                await lh.append(payload(i))
            # The writer "crashes" after sending entry 5 to one bookie only: the entry is not
            # acknowledged, its LAC (4) only reached that bookie. Recovery must recover it.
            dm = DigestManager(lh.ledger_id, DigestType.CRC32C, b"x")
            length = sum(len(payload(i)) for i in range(6))
            e5 = dm.compute(5, 4, length, payload(5))
            only = lh.metadata.ensembles[0][2]
            await cc.bk.bookie_client.add(only, master_key(b"x"), e5, timeout_s=5)
            rh = await (await cc.new_client()).open_ledger(lh.ledger_id, password=b"x")
            md = rh.metadata
            assert md.last_entry_id == 5 and md.length == length
            # written back: every bookie of the write set now has entry 5
            for b in lh.metadata.ensembles[0]:
                raw = await cc.bk.bookie_client.read(b, lh.ledger_id, 5, timeout_s=5)
                assert dm.verify(raw, 5).payload == payload(5)

    run(main())


def test_recovery_of_empty_ledger_and_after_ensemble_change(tmp_path: Path) -> None:
    async def main() -> None:
        async with client_cluster(tmp_path, 4) as cc:
            lh = await cc.bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
            rh = await (await cc.new_client()).open_ledger(lh.ledger_id)
            assert rh.metadata.is_closed and rh.metadata.last_entry_id == -1 and rh.metadata.length == 0
            # ensemble change, then recovery: the LAC is at least the new segment's first entry - 1
            lh = await cc.bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
            await asyncio.gather(*(lh.append_async(payload(i)) for i in range(30)))
            await cc.bookie(lh.metadata.ensembles[0][0]).stop()
            await asyncio.gather(*(lh.append_async(payload(i)) for i in range(30, 40)))
            assert len(lh.metadata.ensembles) == 2
            rh = await (await cc.new_client()).open_ledger(lh.ledger_id)
            assert rh.metadata.last_entry_id == 39
            got = await rh.read(0, 39)
            assert [g.payload for g in got] == [payload(i) for i in range(40)]
            with pytest.raises(LedgerFencedError):
                await lh.append(b"x")

    run(main())


def test_concurrent_recoverers_agree(tmp_path: Path) -> None:
    async def main() -> None:
        async with client_cluster(tmp_path, 3) as cc:
            lh = await cc.bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
            await asyncio.gather(*(lh.append_async(payload(i)) for i in range(40)))
            a, b = await cc.new_client(), await cc.new_client()
            ra, rb = await asyncio.gather(a.open_ledger(lh.ledger_id), b.open_ledger(lh.ledger_id))
            assert ra.metadata.is_closed and rb.metadata.is_closed
            assert ra.metadata.last_entry_id == rb.metadata.last_entry_id >= 39
            assert ra.metadata.length == rb.metadata.length

    run(main())


def test_recovery_continues_a_dead_recoverer(tmp_path: Path) -> None:
    async def main() -> None:
        async with client_cluster(tmp_path, 3) as cc:
            lh = await cc.bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
            await asyncio.gather(*(lh.append_async(payload(i)) for i in range(10)))
            # a recoverer that died right after marking the ledger IN_RECOVERY
            cur = await asyncio.to_thread(cc.store.ledgers.read_ledger, lh.ledger_id)
            await asyncio.to_thread(cc.store.ledgers.write_ledger, lh.ledger_id, cur.value.in_recovery(), cur.version)
            rh = await (await cc.new_client()).open_ledger(lh.ledger_id)
            assert rh.metadata.is_closed and rh.metadata.last_entry_id == 9

    run(main())


def test_recovery_without_fencing_coverage_fails_retryably(tmp_path: Path) -> None:
    async def main() -> None:
        async with client_cluster(tmp_path, 2) as cc:
            lh = await cc.bk.create_ledger(ensemble_size=2, write_quorum_size=2, ack_quorum_size=1)
            await lh.append(b"a")
            for b in cc.bookies:
                await b.stop()
            with pytest.raises(LedgerRecoveryError) as info:
                await (await cc.new_client()).open_ledger(lh.ledger_id)
            assert info.value.retryable
            md = await cc.bk.ledger_metadata(lh.ledger_id)
            assert md.state is LedgerState.IN_RECOVERY
            for b in cc.bookies:
                await b.start()
            rh = await (await cc.new_client()).open_ledger(lh.ledger_id)
            assert rh.metadata.is_closed and rh.metadata.last_entry_id == 0

    run(main())
