"""``read_payloads`` (the bulk read of the Spark source): the same entries and the same checks
as ``read_unconfirmed``, with the payloads as views and no object per entry; a bad replica is
skipped, an entry bad on every replica fails the read (in-process bookies)."""

from __future__ import annotations

from pathlib import Path

import pytest
from client_testkit import run
from test_ledger_support import client_cluster

from vellum.errors import VellumError
from vellum.format.entry import DigestManager, DigestType, master_key


def payload(i: int) -> bytes:
    return f"payload-{i:05d}-".encode() * (1 + i % 5)


@pytest.mark.parametrize(("e", "w"), [(3, 2), (2, 2)])  # striped (READ_STRIDED), unstriped (BATCH_READ)
def test_read_payloads_reads_what_read_unconfirmed_reads(tmp_path: Path, e: int, w: int) -> None:
    async def main() -> None:
        async with client_cluster(tmp_path, 3) as cc:
            lh = await cc.bk.create_ledger(ensemble_size=e, write_quorum_size=w, ack_quorum_size=w, password=b"k")
            for i in range(700):
                lh.append_async(payload(i))
            await lh.append(payload(700))
            rh = await (await cc.new_client()).open_ledger(lh.ledger_id, password=b"k", recovery=False)
            assert rh.last_add_confirmed < 701
            for i in range(701, 703):
                await lh.append(payload(i))  # entry 702 carries LAC 701
            await rh.read_payloads(690, 702)
            assert rh.last_add_confirmed >= 701  # learnt from the LAC the entries carry
            for first, last in ((0, 702), (3, 9), (5, 5), (101, 650)):
                got = await rh.read_payloads(first, last)
                assert [bytes(p) for p in got] == [payload(i) for i in range(first, last + 1)]
                assert [bytes(p) for p in got] == [x.payload for x in await rh.read_unconfirmed(first, last)]

    run(main())


@pytest.mark.parametrize(("e", "w"), [(3, 2), (2, 2)])
def test_a_corrupt_replica_is_skipped_and_a_corrupt_entry_fails(tmp_path: Path, e: int, w: int) -> None:
    async def main() -> None:
        async with client_cluster(tmp_path, 3) as cc:
            lh = await cc.bk.create_ledger(ensemble_size=e, write_quorum_size=w, ack_quorum_size=w, password=b"k")
            for i in range(40):
                await lh.append(payload(i))
            await lh.close()
            dm = DigestManager(lh.ledger_id, DigestType.CRC32C, b"k")
            length = sum(len(payload(i)) for i in range(13))
            bad = bytearray(dm.compute(12, 11, length, payload(12)))
            bad[-1] ^= 0xFF  # a payload byte flipped: the digest no longer matches
            ensemble = lh.metadata.ensembles[0]
            write_set = [ensemble[(12 + k) % e] for k in range(w)]
            await cc.bk.bookie_client.add(write_set[0], master_key(b"k"), bytes(bad), recovery=True, timeout_s=5)
            rh = await (await cc.new_client()).open_ledger(lh.ledger_id, password=b"k", recovery=False)
            got = await rh.read_payloads(0, 39)
            assert [bytes(p) for p in got] == [payload(i) for i in range(40)]
            for bookie in write_set[1:]:  # now every replica serves the corrupt copy
                await cc.bk.bookie_client.add(bookie, master_key(b"k"), bytes(bad), recovery=True, timeout_s=5)
            with pytest.raises(VellumError) as alone:
                await rh.read_unconfirmed(0, 39)
            with pytest.raises(type(alone.value)):
                await rh.read_payloads(0, 39)

    run(main())


def test_read_payloads_across_an_ensemble_change_and_a_dead_bookie(tmp_path: Path) -> None:
    """Chunks never cross a segment; the first segment is still read with one of its bookies
    dead (its entries from the other replica, entry by entry where a chunk's bookie is gone)."""

    async def main() -> None:
        async with client_cluster(tmp_path, 4) as cc:
            lh = await cc.bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2, password=b"k")
            first = lh.metadata.ensembles[0]
            for i in range(60):
                lh.append_async(payload(i))
            await lh.append(payload(60))
            await cc.bookie(first[1]).stop()
            for i in range(61, 200):
                lh.append_async(payload(i))
            await lh.append(payload(200))
            await lh.close()
            assert len(lh.metadata.ensembles) == 2
            rh = await (await cc.new_client()).open_ledger(lh.ledger_id, password=b"k", recovery=False)
            got = await rh.read_payloads(0, 200)
            assert [bytes(p) for p in got] == [payload(i) for i in range(201)]
            got = await rh.read_payloads(40, 120)
            assert [bytes(p) for p in got] == [payload(i) for i in range(40, 121)]

    run(main())
