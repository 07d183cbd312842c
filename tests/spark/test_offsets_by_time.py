"""Offsets by time on real Spark and real bookies: startingTimestamp, endingTimestamp,
startingOffsetsByTimestamp / endingOffsetsByTimestamp, startingOffsetsByTimestampStrategy (batch
and stream), segments skipped by the time range their record keeps, and every bad input refused
at load() with ``[VELLUM_OPTION]`` naming the option."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from vellum.testing.local_cluster import LocalCluster

T0 = 1_600_000_000_000  # 2020-09-13: a time in the past that no other test writes at


def _segment(bk: Any, times: list[int], values: list[bytes] | None = None, *, plain: bool = False) -> int:
    """A closed ledger of one-record entries appended at ``times`` (records-v1), or plain entries."""
    from vellum.format.records import ENTRY_FORMAT_KEY, RECORDS_V1, Record, encode_records

    custom = {} if plain else {ENTRY_FORMAT_KEY: RECORDS_V1}
    lh = bk.create_ledger(custom_metadata=custom)
    futs = []
    for i, t in enumerate(times):
        v = values[i] if values else b"%d" % t
        futs.append(lh.append_async(v if plain else encode_records([Record(v)], append_timestamp=t)))
    for f in futs:
        f.result(30)
    lh.close()
    return int(lh.ledger_id)


def _name_with_segments(bk: Any, name: str) -> list[int]:
    """Three segments; append times rise inside each, but the third goes back below the second:
    S1 (ids 0..49) T0+0..49 with its range in the record; S2 (50..89) T0+100..139 without;
    S3 (90..119) T0+20..49 with. Returns every entry's append time by global id."""
    from vellum.client.named_blocking import NamedLedgers

    named = NamedLedgers(bk)
    s1 = [T0 + i for i in range(50)]
    s2 = [T0 + 100 + i for i in range(40)]
    s3 = [T0 + 20 + i for i in range(30)]
    l1, l2, l3 = _segment(bk, s1), _segment(bk, s2), _segment(bk, s3)
    named.publish_segments(name, [l1], expected_version=None, time_ranges={l1: (s1[0], s1[-1])})
    named.publish_segments(name, [l2], expected_version=named.record(name).version)
    named.publish_segments(name, [l3], expected_version=named.record(name).version,
                           time_ranges={l3: (s3[0], s3[-1])})
    return s1 + s2 + s3


def _reader(spark: Any, uri: str, name: str, **options: Any) -> Any:
    r = spark.read.format("vellum").option("metadataServiceUri", uri).option("name", name)
    for k, v in options.items():
        r = r.option(k, str(v))
    return r


def _ids(spark: Any, uri: str, name: str, **options: Any) -> list[int]:
    rows = _reader(spark, uri, name, **options).load().select("entryId").collect()
    return sorted(r.entryId for r in rows)


def _first_at(times: list[int], t: int) -> int:
    return next((i for i, ts in enumerate(times) if ts >= t), len(times))


def test_batch_offsets_by_time_follow_kafka(spark: Any, cluster: LocalCluster, bk: Any) -> None:
    uri = cluster.metadata_uri
    name = "tests/bytime/batch"
    times = _name_with_segments(bk, name)
    n = len(times)
    # the record keeps the ranges it was given, and none for S2 (older publishers)
    from vellum.spark.names import NameReader

    got = NameReader(bk).record(name)
    assert got is not None
    assert [s.time_range for s in got.value.segments] == [(T0, T0 + 49), None, (T0 + 20, T0 + 49)]

    for t in (T0 - 5, T0 + 25, T0 + 60, T0 + 100, T0 + 139):
        assert _ids(spark, uri, name, startingTimestamp=t) == list(range(_first_at(times, t), n)), t
    # the timestamp column is the append time: every row from the start on was appended at or after
    # t up to the first entry that goes back (S3), none before it was
    rows = _reader(spark, uri, name, startingTimestamp=T0 + 60).load().collect()
    assert min(r.entryId for r in rows) == 50 and all(r.timestampType == 1 for r in rows)
    # endingTimestamp: exclusive, the first entry at or after it
    assert _ids(spark, uri, name, startingTimestamp=T0 + 25, endingTimestamp=T0 + 120) == list(range(25, 70))
    # precedence as Kafka's: the by-time options win over startingOffsets / endingOffsets
    assert _ids(spark, uri, name, startingOffsets=json.dumps({name: 3}),
                startingOffsetsByTimestamp=json.dumps({name: T0 + 130}),
                endingOffsets=json.dumps({name: 100}), endingOffsetsByTimestamp=json.dumps({name: T0 + 135})
                ) == list(range(80, 85))
    assert _ids(spark, uri, name, startingOffsetsByTimestamp=json.dumps({name: T0 + 130}),
                startingTimestamp=T0 + 110) == list(range(60, n))
    # no entry at or after the time: endingTimestamp reads to the end (Kafka: latest)
    assert _ids(spark, uri, name, startingTimestamp=T0 + 135, endingTimestamp=T0 + 10_000) == list(range(85, n))
    # ... startingTimestamp: an error (the default strategy), or start at the end with latest
    from pyspark.errors import AnalysisException

    with pytest.raises(AnalysisException, match=r"VELLUM_OPTION\] option startingTimestamp: named ledger "
                                                 r"'tests/bytime/batch' has no entry appended at or after "
                                                 r"2020-09-13T12:26:50\.000\+00:00"):
        _reader(spark, uri, name, startingTimestamp=T0 + 10_000).load().collect()
    assert _ids(spark, uri, name, startingTimestamp=T0 + 10_000, startingOffsetsByTimestampStrategy="latest") == []
    future = int(time.time() * 1000) + 86_400_000
    with pytest.raises(AnalysisException, match=r"startingTimestamp.*a time in the future.*"
                                                 r"startingOffsetsByTimestampStrategy=latest"):
        _reader(spark, uri, name, startingTimestamp=future).load().collect()
    assert _ids(spark, uri, name, startingTimestamp=future, startingOffsetsByTimestampStrategy="LATEST") == []


def test_bad_time_options_fail_at_load_naming_the_option(spark: Any, cluster: LocalCluster, bk: Any) -> None:
    from pyspark.errors import AnalysisException

    uri = cluster.metadata_uri
    name = "tests/bytime/bad"
    _name_with_segments(bk, name)
    bad = [
        ({"startingOffsetsByTimestampStrategy": "earliest"}, r"option startingOffsetsByTimestampStrategy must be "
                                                              r"error .* or latest .*got 'earliest'"),
        ({"startingTimestamp": "yesterday"}, r"option startingTimestamp must be a time in milliseconds"),
        ({"startingTimestamp": "-1"}, r"option startingTimestamp must be a time in milliseconds.*'-1'"),
        ({"endingTimestamp": "1.5e12"}, r"option endingTimestamp must be a time in milliseconds"),
        ({"startingOffsetsByTimestamp": "{" + name}, r"option startingOffsetsByTimestamp must be a JSON object"),
        ({"endingOffsetsByTimestamp": json.dumps({name: -3})}, r"option endingOffsetsByTimestamp \(key "),
        ({"startingOffsetsByTimestamp": json.dumps({"tests/bytime/other": T0})},
         r"option startingOffsetsByTimestamp names \['tests/bytime/other'\], which the read does not select"),
    ]
    for options, message in bad:
        with pytest.raises(AnalysisException, match=r"\[VELLUM_OPTION\] " + message):
            _reader(spark, uri, name, **options).load().collect()
    # ledger mode: JSON keys are ledger ids
    with pytest.raises(AnalysisException, match=r"option startingOffsetsByTimestamp: keys must be ledger ids"):
        (spark.read.format("vellum").option("metadataServiceUri", uri).option("ledgers", "1")
         .option("startingOffsetsByTimestamp", json.dumps({name: T0})).load().collect())


def test_entries_without_a_time_are_named_in_the_error(spark: Any, cluster: LocalCluster, bk: Any) -> None:
    """Plain entries carry no time: a search that must look inside them fails naming the ledger;
    one that is decided before them (or by segments' ranges) does not look."""
    from pyspark.errors import AnalysisException

    from vellum.client.named_blocking import NamedLedgers

    uri = cluster.metadata_uri
    name = "tests/bytime/plain"
    named = NamedLedgers(bk)
    plain = _segment(bk, [0] * 5, [b"p%d" % i for i in range(5)], plain=True)
    timed = _segment(bk, [T0 + i for i in range(10)])
    named.publish_segments(name, [plain], expected_version=None)
    named.publish_segments(name, [timed], expected_version=named.record(name).version)
    with pytest.raises(AnalysisException, match=rf"VELLUM_OPTION\] option startingTimestamp: named ledger "
                                                 rf"'{name}' has entries without a time: ledger {plain} \(entries "
                                                 r"0\.\.4\) holds plain entries"):
        _reader(spark, uri, name, startingTimestamp=T0).load().collect()
    # the ledger itself, read by id, has the same problem; the records ledger by id has none
    with pytest.raises(AnalysisException, match=rf"option endingTimestamp: ledger '{plain}' has entries without"):
        (spark.read.format("vellum").option("metadataServiceUri", uri).option("ledgers", str(plain))
         .option("endingTimestamp", T0).load().collect())
    rows = (spark.read.format("vellum").option("metadataServiceUri", uri).option("ledgers", str(timed))
            .option("startingTimestamp", T0 + 7).load().select("entryId").collect())
    assert sorted(r.entryId for r in rows) == [7, 8, 9]


def test_sink_records_time_ranges_and_stream_starts_at_a_time(
    spark: Any, cluster: LocalCluster, bk: Any, tmp_path: Path
) -> None:
    """The Spark sink keeps each published segment's append-time range; a stream started from a
    time between two writes reads only the second, and a stream asked for a time after everything fails, or waits at the end with latest."""
    from pyspark.errors import StreamingQueryException

    from vellum.spark.names import NameReader

    uri = cluster.metadata_uri
    name = "tests/bytime/sink"
    first = spark.createDataFrame([(b"a%d" % i,) for i in range(20)], "value binary").repartition(2)
    first.write.format("vellum").option("metadataServiceUri", uri).mode("append").save(name)
    time.sleep(0.05)
    mid = int(time.time() * 1000)
    time.sleep(0.05)
    spark.createDataFrame([(b"b%d" % i,) for i in range(5)], "value binary").coalesce(1) \
        .write.format("vellum").option("metadataServiceUri", uri).mode("append").save(name)
    got = NameReader(bk).record(name)
    assert got is not None
    segs = got.value.segments
    assert segs and all(s.time_range is not None for s in segs)
    assert max(s.time_range[1] for s in segs[:-1]) < mid <= segs[-1].time_range[0]  # type: ignore[index]

    def run(checkpoint: str, **options: Any) -> tuple[list[bytes], Any]:
        seen: list[bytes] = []

        def collect(df: Any, _batch: int) -> None:
            seen.extend(bytes(r.value) for r in df.select("value").collect())

        r = spark.readStream.format("vellum").option("metadataServiceUri", uri).option("name", name)
        for k, v in options.items():
            r = r.option(k, str(v))
        q = (r.load().writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp_path / checkpoint))
             .trigger(availableNow=True).start())
        try:
            q.awaitTermination(120)
        except StreamingQueryException as exc:
            return seen, exc
        return seen, q.exception()

    seen, err = run("c1", startingTimestamp=mid)
    assert err is None and sorted(seen) == sorted(b"b%d" % i for i in range(5))
    seen, err = run("c2", startingOffsetsByTimestamp=json.dumps({name: 0}))
    assert err is None and len(seen) == 25
    future = int(time.time() * 1000) + 86_400_000
    seen, err = run("c3", startingTimestamp=future)
    assert err is not None and "VELLUM_OPTION] option startingTimestamp" in str(err) and "future" in str(err)
    assert seen == []
    seen, err = run("c4", startingTimestamp=future, startingOffsetsByTimestampStrategy="latest")
    assert err is None and seen == []


def test_a_search_reads_log_n_entries_and_none_of_a_skipped_segment(cluster: LocalCluster, bk: Any) -> None:
    """On real bookies, without Spark: a segment whose recorded range ends before t is not read at
    all; one without a range costs its first and last entries; inside, a few rounds of probes."""
    from vellum.client.named_blocking import NamedLedgers
    from vellum.spark.catalog import Bounds
    from vellum.spark.options import parse_read_options
    from vellum.spark.timeseek import PROBES, SCAN, TimeSeek

    named = NamedLedgers(bk)
    name = "tests/bytime/cost"
    s1 = [T0 + i for i in range(300)]
    s2 = [T0 + 1000 + i // 3 for i in range(3000)]  # repeated times: the first of equal ones is found
    l1, l2 = _segment(bk, s1), _segment(bk, s2)
    named.publish_segments(name, [l1], expected_version=None, time_ranges={l1: (s1[0], s1[-1])})
    named.publish_segments(name, [l2], expected_version=named.record(name).version)
    times = s1 + s2
    bounds = Bounds(0, len(times))
    for t in (T0 + 1500, T0 + 1999, T0 + 150):
        opts = parse_read_options({"metadataServiceUri": cluster.metadata_uri, "name": name,
                                   "startingTimestamp": str(t)}, streaming=False)
        seek = TimeSeek(opts, bk, [name])
        assert seek.starting(name, bounds) == _first_at(times, t)
        read = seek._times.entries_read
        if t > s1[-1]:
            # S1 skipped by its range (0 reads); S2: 2 for its ends, <= 3 rounds of probes, one scan
            assert read <= 2 + PROBES * 3 + SCAN, read
        else:
            assert read <= PROBES * 2 + SCAN, read
