"""``read_payloads`` (the bulk read of the Spark source): the same entries and the same checks
as ``read_unconfirmed``, with the payloads as views and no object per entry; a bad replica is
skipped, an entry bad on every replica fails the read (in-process bookies)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

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


@pytest.mark.parametrize(("e", "w"), [(3, 2), (2, 2)])
def test_range_reads_with_a_dead_bookie_start_no_task_per_entry(tmp_path: Path, e: int, w: int) -> None:
    """The failover of a range read (a chunk's bookie is gone, so its entries are read one by
    one from the other replicas) runs on callbacks, and batch reads on the bookie client's
    futures: a read of 300 entries starts a task per chunk at most, never one per entry."""

    async def main() -> None:
        async with client_cluster(tmp_path, 3) as cc:
            lh = await cc.bk.create_ledger(ensemble_size=e, write_quorum_size=w, ack_quorum_size=w, password=b"k")
            for i in range(299):
                lh.append_async(payload(i))
            await lh.append(payload(299))
            await lh.close()
            await cc.bookie(lh.metadata.ensembles[0][0]).stop()
            rh = await (await cc.new_client()).open_ledger(lh.ledger_id, password=b"k", recovery=False)
            loop = asyncio.get_running_loop()
            started: list[object] = []
            factory = loop.get_task_factory()

            def counting(lp: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> asyncio.Future[Any]:
                started.append(coro)
                return factory(lp, coro, **kw) if factory is not None else asyncio.Task(coro, loop=lp, **kw)

            loop.set_task_factory(counting)
            try:
                got = await rh.read_unconfirmed(0, 299)
                spans = await rh.read_payloads(0, 299)
            finally:
                loop.set_task_factory(factory)
            assert [x.payload for x in got] == [payload(i) for i in range(300)]
            assert [bytes(p) for p in spans] == [payload(i) for i in range(300)]
            # the client's tasks (the in-process bookies run theirs on this loop too), beyond
            # one per chunk of the range and the connections it opens
            client = [c for c in started if "vellum/client/" in c.cr_code.co_filename.replace("\\", "/")]
            per_read = [c.__qualname__ for c in client if "_gather_window" not in c.__qualname__
                        and "_connect" not in c.__qualname__]
            assert per_read == []

    run(main())


@pytest.mark.parametrize(("e", "w"), [(3, 2), (2, 2)])
def test_a_range_is_read_in_one_request_per_bookie(tmp_path: Path, e: int, w: int) -> None:
    """A bulk read asks each bookie of the ensemble for its share of the range in one
    READ_STRIDED or BATCH_READ (bytes permitting), not in chunks of ``BATCH_CHUNK_ENTRIES``:
    each request costs the bookie and the client a fixed share of work."""

    async def main() -> None:
        async with client_cluster(tmp_path, 3) as cc:
            lh = await cc.bk.create_ledger(ensemble_size=e, write_quorum_size=w, ack_quorum_size=w, password=b"k")
            n = 1200  # more than BATCH_CHUNK_ENTRIES (256) per bookie
            for i in range(n - 1):
                lh.append_async(payload(i))
            await lh.append(payload(n - 1))
            await lh.close()
            reader = await cc.new_client()
            rh = await reader.open_ledger(lh.ledger_id, password=b"k", recovery=False)
            bc = reader.bookie_client
            asked: list[tuple[str, int]] = []
            strided, batch = bc.read_strided, bc.batch_read_future

            def count_strided(bookie: str, ledger_id: int, first: int, stride: int, count: int,
                              *a: Any, **kw: Any) -> Any:
                asked.append((bookie, count))
                return strided(bookie, ledger_id, first, stride, count, *a, **kw)

            def count_batch(bookie: str, ledger_id: int, first: int, count: int, *a: Any, **kw: Any) -> Any:
                asked.append((bookie, count))
                return batch(bookie, ledger_id, first, count, *a, **kw)

            bc.read_strided, bc.batch_read_future = count_strided, count_batch  # type: ignore[method-assign]
            got = await rh.read_payloads(0, n - 1)
            assert [bytes(p) for p in got] == [payload(i) for i in range(n)]
            assert sorted(c for _b, c in asked) == [n // e] * e, asked
            assert len({b for b, _c in asked}) == e  # spread over the bookies

    run(main())
