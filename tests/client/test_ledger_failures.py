"""Writes through bookie failures: ensemble change, quorum writes with a dead bookie, fencing,
bad replicas, close conflicts (in-process bookies; a stopped server = a dead bookie)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest
from client_testkit import run
from test_ledger_support import client_cluster

from vellum.errors import LedgerFencedError, WriteError
from vellum.format.entry import DigestManager, DigestType, master_key
from vellum.ids import LedgerId


def payload(i: int) -> bytes:
    return f"p{i}".encode() * 20


def test_ensemble_change_when_a_bookie_dies(tmp_path: Path) -> None:
    async def main() -> None:
        async with client_cluster(tmp_path, 4) as cc:
            lh = await cc.bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
            first = lh.metadata.ensembles[0]
            assert await asyncio.gather(*(lh.append_async(payload(i)) for i in range(50))) == list(range(50))
            victim = first[1]
            await cc.bookie(victim).stop()
            ids = await asyncio.gather(*(lh.append_async(payload(i)) for i in range(50, 150)))
            assert ids == list(range(50, 150))
            md = lh.metadata
            assert len(md.ensembles) == 2
            change_at = max(md.ensembles)
            assert 50 <= change_at <= 150
            assert victim not in md.last_ensemble and victim in md.ensembles[0]
            spare = next(b.bookie_id for b in cc.bookies if b.bookie_id not in first)
            assert md.last_ensemble[1] == spare  # only the failed position changed
            # the persisted metadata has the new segment (rule 5 of docs/correctness.md)
            stored = await cc.bk.ledger_metadata(lh.ledger_id)
            assert stored.ensembles == md.ensembles
            await lh.close()
            rh = await (await cc.new_client()).open_ledger(lh.ledger_id)
            got = await rh.read(0, 149)
            assert [g.payload for g in got] == [payload(i) for i in range(150)]

    run(main())


def test_quorum_writes_with_one_bookie_dead_and_no_spare(tmp_path: Path) -> None:
    async def main() -> None:
        async with client_cluster(tmp_path, 3) as cc:
            lh = await cc.bk.create_ledger(ensemble_size=3, write_quorum_size=3, ack_quorum_size=2)
            await asyncio.gather(*(lh.append_async(payload(i)) for i in range(20)))
            victim = lh.metadata.ensembles[0][2]
            await cc.bookie(victim).stop()
            # AQ=2 of WQ=3 still reachable: adds succeed (out-of-order acks complete in order)
            completed: list[int] = []
            futs = [lh.append_async(payload(i)) for i in range(20, 120)]
            for f in futs:
                f.add_done_callback(lambda f: completed.append(f.result()))
            assert await asyncio.gather(*futs) == list(range(20, 120))
            assert completed == list(range(20, 120))
            assert len(lh.metadata.ensembles) == 1  # no spare bookie: no ensemble change
            got = await lh.read(0, 119)
            assert [g.payload for g in got] == [payload(i) for i in range(120)]
            await lh.close()
            rh = await (await cc.new_client()).open_ledger(lh.ledger_id)
            assert rh.last_add_confirmed == 119

    run(main())


def test_ack_quorum_unreachable_fails_adds(tmp_path: Path) -> None:
    async def main() -> None:
        async with client_cluster(tmp_path, 2) as cc:
            lh = await cc.bk.create_ledger(ensemble_size=2, write_quorum_size=2, ack_quorum_size=2)
            await lh.append(b"a")
            await cc.bookie(lh.metadata.ensembles[0][0]).stop()
            with pytest.raises(Exception) as info:
                await lh.append(b"b")
            assert getattr(info.value, "code", None) is not None
            await lh.close()
            md = await cc.bk.ledger_metadata(lh.ledger_id)
            assert md.is_closed and md.last_entry_id == 0

    run(main())


def test_max_ensemble_changes(tmp_path: Path) -> None:
    async def main() -> None:
        async with client_cluster(tmp_path, 3, max_num_ensemble_changes=0) as cc:
            lh = await cc.bk.create_ledger(ensemble_size=2, write_quorum_size=2, ack_quorum_size=2)
            await lh.append(b"a")
            await cc.bookie(lh.metadata.ensembles[0][0]).stop()
            with pytest.raises(WriteError):
                await lh.append(b"b")

    run(main())


def test_digest_mismatch_on_one_replica_falls_back(tmp_path: Path) -> None:
    async def main() -> None:
        async with client_cluster(tmp_path, 2) as cc:
            lh = await cc.bk.create_ledger(
                ensemble_size=2, write_quorum_size=2, ack_quorum_size=2, password=b"k"
            )
            for i in range(3):
                await lh.append(payload(i))
            await lh.close()
            dm = DigestManager(lh.ledger_id, DigestType.CRC32C, b"k")
            good = dm.compute(1, 0, len(payload(0)) + len(payload(1)), payload(1))
            bad = bytearray(good)
            bad[-1] ^= 0xFF  # flip a payload byte: the digest no longer matches
            first_replica = lh.metadata.ensembles[0][1]  # entry 1's write set starts at index 1
            await cc.bk.bookie_client.add(
                first_replica, master_key(b"k"), bytes(bad), recovery=True, timeout_s=5
            )
            raw = await cc.bk.bookie_client.read(first_replica, lh.ledger_id, 1, timeout_s=5)
            assert raw == bytes(bad), "the bookie must now serve the corrupt copy"
            rh = await (await cc.new_client()).open_ledger(lh.ledger_id, password=b"k")
            got = await rh.read(0, 2)
            assert [g.payload for g in got] == [payload(i) for i in range(3)]

    run(main())


def test_close_cas_conflict(tmp_path: Path) -> None:
    async def main() -> None:
        async with client_cluster(tmp_path, 2) as cc:
            store = cc.store
            # 1. someone else closed it at a different last entry: close refuses, never overwrites
            lh = await cc.bk.create_ledger(ensemble_size=2, write_quorum_size=2, ack_quorum_size=2)
            for i in range(3):
                await lh.append(payload(i))
            cur = await asyncio.to_thread(store.ledgers.read_ledger, LedgerId(lh.ledger_id))
            await asyncio.to_thread(
                store.ledgers.write_ledger, LedgerId(lh.ledger_id), cur.value.closed(0, 5), cur.version
            )
            with pytest.raises(LedgerFencedError):
                await lh.close()
            md = await cc.bk.ledger_metadata(lh.ledger_id)
            assert md.last_entry_id == 0 and md.length == 5
            # 2. closed by someone else at the same last entry: close succeeds
            lh = await cc.bk.create_ledger(ensemble_size=2, write_quorum_size=2, ack_quorum_size=2)
            await lh.append(b"abc")
            cur = await asyncio.to_thread(store.ledgers.read_ledger, LedgerId(lh.ledger_id))
            await asyncio.to_thread(
                store.ledgers.write_ledger, LedgerId(lh.ledger_id), cur.value.closed(0, 3), cur.version
            )
            await lh.close()
            # 3. an unrelated change (version bump, same open segment): close rebases and succeeds
            lh = await cc.bk.create_ledger(ensemble_size=2, write_quorum_size=2, ack_quorum_size=2)
            await lh.append(b"abc")
            cur = await asyncio.to_thread(store.ledgers.read_ledger, LedgerId(lh.ledger_id))
            changed = dataclasses.replace(cur.value, custom_metadata={"touched": b"1"})
            await asyncio.to_thread(store.ledgers.write_ledger, LedgerId(lh.ledger_id), changed, cur.version)
            await lh.close()
            md = await cc.bk.ledger_metadata(lh.ledger_id)
            assert md.is_closed and md.last_entry_id == 0 and md.custom_metadata == {"touched": b"1"}
            # 4. put in recovery by someone else: close is fenced
            lh = await cc.bk.create_ledger(ensemble_size=2, write_quorum_size=2, ack_quorum_size=2)
            await lh.append(b"abc")
            cur = await asyncio.to_thread(store.ledgers.read_ledger, LedgerId(lh.ledger_id))
            await asyncio.to_thread(
                store.ledgers.write_ledger, LedgerId(lh.ledger_id), cur.value.in_recovery(), cur.version
            )
            with pytest.raises(LedgerFencedError):
                await lh.close()

    run(main())
