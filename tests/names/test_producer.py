"""The producer on real bookie processes: records batched into ``records-v1`` entries by size
and by linger, each record acknowledged only once its entry is (frozen bookies hold the futures),
write order kept, a failed entry failing its whole batch and everything after, bounded memory,
and the blocking facade."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from names_testkit import run, unique_name

from vellum.aio import BookKeeper
from vellum.client.blocking import BookKeeper as BlockingBookKeeper
from vellum.client.named import NamedLedgers, OpenMode
from vellum.client.producer import Producer, ProducerSettings, RecordPosition
from vellum.client.producer_blocking import Producer as BlockingProducer
from vellum.config import ClientConfig
from vellum.errors import IncorrectParameterError, LedgerFencedError, TimeoutError_
from vellum.format.records import ENTRY_FORMAT_KEY, RECORDS_V1, Record, decode_records
from vellum.testing.local_cluster import LocalCluster

QUORUM = {"ensemble_size": 3, "write_quorum_size": 3, "ack_quorum_size": 2}


def _config(**changes: Any) -> ClientConfig:
    return dataclasses.replace(ClientConfig(), **changes)


async def _records(named: NamedLedgers, name: str) -> list[tuple[int, list[Record]]]:
    r = await named.open(name, OpenMode.READ_ONLY)
    last = await r.read_last_add_confirmed()
    entries = await r.read(r.start_entry_id, last) if last >= r.start_entry_id else []
    return [(e.entry_id, decode_records(e.payload).records()) for e in entries]


def test_batches_by_size_and_keeps_order(sqlite_cluster: LocalCluster) -> None:
    async def main() -> None:
        async with BookKeeper(sqlite_cluster.metadata_uri) as bk:
            named = NamedLedgers(bk)
            name = unique_name("prod-size")
            # 58-byte values cost 80 bytes each (record_size): two fit a 200-byte batch, a third
            # would overfill it. The linger is far longer than the test: only size seals batches.
            settings = ProducerSettings(batch_size_bytes=200, linger_ms=600_000)
            async with await Producer.open(named, name, settings=settings, **QUORUM) as p:
                futs = [await p.write(b"%058d" % i, key=b"k%d" % i, headers={"n": b"%d" % i}, timestamp=1000 + i)
                        for i in range(20)]
                await asyncio.sleep(0)  # let the size-sealed entries go
                assert not futs[-1].done()  # the last batch is below batch_size_bytes: close() seals it
            got = await asyncio.gather(*futs)
            assert got == [RecordPosition(i // 2, i % 2) for i in range(20)]
            entries = await _records(named, name)
            assert [eid for eid, _ in entries] == list(range(10))
            flat = [r for _, recs in entries for r in recs]
            assert flat == [Record(b"%058d" % i, b"k%d" % i, 1000 + i, (("n", b"%d" % i),)) for i in range(20)]
            rec = (await named.record(name)).value
            md = await bk.ledger_metadata(rec.segments[-1].ledger_id)
            assert md.custom_metadata[ENTRY_FORMAT_KEY] == RECORDS_V1

    run(main())


def test_linger_seals_a_small_batch_into_one_entry(sqlite_cluster: LocalCluster) -> None:
    async def main() -> None:
        async with BookKeeper(sqlite_cluster.metadata_uri) as bk:
            named = NamedLedgers(bk)
            name = unique_name("prod-linger")
            settings = ProducerSettings(batch_size_bytes=1 << 20, linger_ms=1500)
            async with await Producer.open(named, name, settings=settings, **QUORUM) as p:
                futs = [await p.write(b"r%d" % i) for i in range(3)]
                await asyncio.sleep(0.3)
                assert not any(f.done() for f in futs), "a batch below batch_size_bytes went before linger_ms"
                got = await asyncio.wait_for(asyncio.gather(*futs), 30)
            assert got == [RecordPosition(0, 0), RecordPosition(0, 1), RecordPosition(0, 2)]
            ((_eid, recs),) = await _records(named, name)
            assert [r.value for r in recs] == [b"r0", b"r1", b"r2"]

    run(main())


def test_records_are_acknowledged_only_once_their_entry_is(tmp_path: Any) -> None:
    # E=3, WQ=3, AQ=2 and two bookies frozen (SIGSTOP: their journal cannot answer): the entry
    # cannot reach its ack quorum, so no record of it may complete; the buffer fills up and a
    # further write gives up after max_block_ms; on resume everything completes in order.
    with LocalCluster(tmp_path / "c", bookies=3) as cluster:
        async def main() -> None:
            async with BookKeeper(cluster.metadata_uri, config=_config(add_entry_timeout_s=120.0)) as bk:
                named = NamedLedgers(bk)
                name = unique_name("prod-frozen")
                settings = ProducerSettings(batch_size_bytes=100, linger_ms=0, buffer_memory_bytes=400,
                                            max_record_bytes=100, max_block_ms=300)
                p = await Producer.open(named, name, settings=settings, **QUORUM)
                assert (await (await p.write(b"before"))) == RecordPosition(0, 0)
                for i in (1, 2):
                    cluster.pause(i)
                try:
                    held = [await p.write(b"%060d" % i) for i in range(4)]  # 4 x 82 bytes of 400
                    await asyncio.sleep(1.0)  # room for a wrong early completion to show
                    assert not any(f.done() for f in held), "a record completed before its entry's ack quorum"
                    with pytest.raises(TimeoutError_, match="max_block_ms"):
                        await p.write(b"%060d" % 99)
                    assert p.buffered_bytes == 4 * 82
                finally:
                    for i in (1, 2):
                        cluster.resume(i)
                got = await asyncio.wait_for(asyncio.gather(*held), 60)
                assert [g.entry_id for g in got] == sorted(g.entry_id for g in got)
                assert (await (await p.write(b"after"))).entry_id > got[-1].entry_id
                await p.close()
                assert p.buffered_bytes == 0
                values = [r.value for _, recs in await _records(named, name) for r in recs]
                assert values == [b"before", *[b"%060d" % i for i in range(4)], b"after"]

        run(main(), timeout_s=120)


def test_a_failed_entry_fails_its_batch_and_every_later_record(sqlite_cluster: LocalCluster) -> None:
    async def main() -> None:
        async with BookKeeper(sqlite_cluster.metadata_uri) as bk:
            named = NamedLedgers(bk)
            name = unique_name("prod-fenced")
            p = await Producer.open(named, name, settings=ProducerSettings(linger_ms=200), **QUORUM)
            first = [await p.write(b"a%d" % i) for i in range(3)]
            await p.flush()
            assert [f.result() for f in first] == [RecordPosition(0, i) for i in range(3)]
            other = await named.open(name, OpenMode.APPEND)  # a new writer fences the producer's segment
            batch = [await p.write(b"b%d" % i) for i in range(3)]
            await p.flush()
            for f in batch:
                with pytest.raises(LedgerFencedError):
                    f.result()
            with pytest.raises(LedgerFencedError):
                await p.write(b"c")
            assert p.buffered_bytes == 0
            await p.close()  # a failed producer still closes (its segment is left to the new writer)
            await other.close()
            values = [r.value for _, recs in await _records(named, name) for r in recs]
            assert values == [b"a0", b"a1", b"a2"]

    run(main())


def test_bad_arguments_are_clear_errors(sqlite_cluster: LocalCluster) -> None:
    with pytest.raises(IncorrectParameterError, match="batch_size_bytes must be > 0"):
        ProducerSettings(batch_size_bytes=0)
    with pytest.raises(IncorrectParameterError, match=r"max_record_bytes .* above buffer_memory_bytes"):
        ProducerSettings(buffer_memory_bytes=1000, max_record_bytes=2000)

    async def main() -> None:
        async with BookKeeper(sqlite_cluster.metadata_uri) as bk, await Producer.open(
                NamedLedgers(bk), unique_name("prod-bad"), settings=ProducerSettings(max_record_bytes=100),
                **QUORUM) as p:
            with pytest.raises(IncorrectParameterError, match="value must be bytes"):
                await p.write("text")  # type: ignore[arg-type]
            with pytest.raises(IncorrectParameterError, match="key must be bytes"):
                await p.write(b"v", key=3)  # type: ignore[arg-type]
            with pytest.raises(IncorrectParameterError, match="timestamp must be milliseconds"):
                await p.write(b"v", timestamp=-5)
            with pytest.raises(IncorrectParameterError, match="end of year 9999"):
                await p.write(b"v", timestamp=2**62)
            with pytest.raises(IncorrectParameterError, match="header 1"):
                await p.write(b"v", headers=[(1, b"x")])  # type: ignore[list-item]
            with pytest.raises(IncorrectParameterError, match="above max_record_bytes"):
                await p.write(b"x" * 200)

    run(main())


def test_blocking_producer(sqlite_cluster: LocalCluster) -> None:
    name = unique_name("prod-blocking")
    with BlockingBookKeeper(sqlite_cluster.metadata_uri) as bk:
        with BlockingProducer.open(bk, name, settings=ProducerSettings(batch_size_bytes=120), **QUORUM) as p:
            futs = [p.write(b"%038d" % i, key=b"k", headers=[("h", b"1"), ("h", b"2")]) for i in range(9)]
            p.flush()
            got = [f.result(30) for f in futs]
        # 38-byte values with key "k" and two 1-byte headers cost 38 + 1 + 22 + 2 * 10 = 81 bytes
        # (record_size): a second record would overfill a 120-byte batch, so each gets an entry.
        assert got == [RecordPosition(i, 0) for i in range(9)]
        recs = bk.run(_records(NamedLedgers(bk.aio), name))
        assert next(r for _, rs in recs for r in rs) == Record(b"%038d" % 0, b"k", None, (("h", b"1"), ("h", b"2")))


def test_writers_waiting_for_room_keep_their_order(sqlite_cluster: LocalCluster) -> None:
    # A buffer of three records and 60 writers started in order: most of them wait for room,
    # and are served first come, first served, so positions follow the order of the writes.
    async def main() -> None:
        async with BookKeeper(sqlite_cluster.metadata_uri) as bk:
            named = NamedLedgers(bk)
            name = unique_name("prod-order")
            settings = ProducerSettings(batch_size_bytes=60, linger_ms=1, buffer_memory_bytes=3 * 30,
                                        max_record_bytes=30)
            async with await Producer.open(named, name, settings=settings, **QUORUM) as p:

                async def one(i: int) -> RecordPosition:
                    return await (await p.write(b"%06d" % i))  # 6 + 22 = 28 bytes each

                got = await asyncio.gather(*(asyncio.create_task(one(i)) for i in range(60)))
                assert p.buffered_bytes == 0
            keys = [(g.entry_id, g.batch_index) for g in got]
            assert keys == sorted(keys) and len(set(keys)) == 60
            values = [r.value for _, recs in await _records(named, name) for r in recs]
            assert values == [b"%06d" % i for i in range(60)]

    run(main())
