"""The producer's append times never go back within its segment, also when the clock steps back
(offsets by time binary-search them, docs/spark.md "Offsets by time"), and the segment it closes
keeps their range in the name record; on real bookie processes."""

from __future__ import annotations

from names_testkit import run, unique_name

from vellum.aio import BookKeeper
from vellum.client.named import NamedLedgers, OpenMode
from vellum.client.producer import Producer, ProducerSettings
from vellum.format.records import ENTRY_FORMAT_KEY, RECORDS_V1, Record, decode_records, encode_records
from vellum.testing.local_cluster import LocalCluster


def test_append_times_never_decrease_when_the_clock_steps_back(sqlite_cluster: LocalCluster) -> None:
    clock = iter([50.0, 40.0, 45.0, 60.0, 59.0])

    async def main() -> None:
        async with BookKeeper(sqlite_cluster.metadata_uri) as bk:
            named = NamedLedgers(bk)
            name = unique_name("prod-clock")
            handle = await named.open(name, OpenMode.CREATE, segment_metadata={ENTRY_FORMAT_KEY: RECORDS_V1})
            async with Producer(handle, ProducerSettings(linger_ms=600_000), clock=lambda: next(clock)) as p:
                for i in range(5):
                    fut = await p.write(b"v%d" % i)
                    await p.flush()  # one entry per record: one clock reading each
                    await fut
            r = await named.open(name, OpenMode.READ_ONLY)
            entries = await r.read(0, await r.read_last_add_confirmed())
            assert [decode_records(e.payload).append_timestamp for e in entries] == [
                50_000, 50_000, 50_000, 60_000, 60_000]
            # closed by its producer: the segment keeps its append-time range (docs/formats.md)
            seg = (await named.record(name)).value.segments[-1]
            assert seg.time_range == (50_000, 60_000)
            # a session that also appended by hand: the producer did not write every entry, no range
            h2 = await named.open(name, OpenMode.APPEND, segment_metadata={ENTRY_FORMAT_KEY: RECORDS_V1})
            await h2.append(encode_records([Record(b"by hand")], append_timestamp=1))
            async with Producer(h2, ProducerSettings(linger_ms=0)) as p2:
                await (await p2.write(b"v"))
            assert (await named.record(name)).value.segments[-1].time_range is None

    run(main())
