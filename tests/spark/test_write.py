"""Writes into named ledgers: batch append/overwrite, failed jobs leave nothing, stream replays skipped."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from vellum.testing.local_cluster import LocalCluster


def _staging_keys(bk: Any) -> list[str]:
    """Staging registrations of write jobs (batch ``b-``, stream ``s-``); segment merges (``m-``)
    and retired segments waiting out their delay (``r-``) of other tests' sinks are not theirs."""
    return [k for k in bk.aio.store.kv.list("spark/staging/") if k.split("/")[2][:2] in ("b-", "s-")]


def _read_name(spark: Any, uri: str, name: str) -> list[tuple[int, bytes]]:
    """``(entryId, payload)`` of every row, in (entryId, batchIndex) order."""
    df = spark.read.format("vellum").option("metadataServiceUri", uri).option("name", name).load()
    return [(r.entryId, bytes(r.payload)) for r in sorted(df.collect(), key=lambda r: (r.entryId, r.batchIndex))]


def test_batch_write_then_read_back(spark: Any, cluster: LocalCluster, bk: Any) -> None:
    uri = cluster.metadata_uri
    df = spark.range(0, 1000, numPartitions=4).selectExpr("cast(concat('row-', cast(id as string)) as binary) as payload")
    df.write.format("vellum").option("metadataServiceUri", uri).mode("append").save("tests/batch")
    got = _read_name(spark, uri, "tests/batch")
    # packed by default: each task's 250 small rows fit one entry, kept in the task's order
    assert [p for _e, p in got] == [b"row-%d" % i for i in range(1000)]
    assert sorted({e for e, _p in got}) == [0, 1, 2, 3]
    # a second append continues the ids; strings are accepted as payloads
    spark.createDataFrame([("x",), ("y",)], "payload string").write.format("vellum") \
        .option("metadataServiceUri", uri).option("name", "tests/batch").mode("append").save()
    got = _read_name(spark, uri, "tests/batch")
    assert len(got) == 1002 and {p for e, p in got if e >= 4} == {b"x", b"y"}
    end = _record(bk, "tests/batch").closed_end
    # overwrite: only the new rows are visible, ids keep growing, the old ledgers are deleted
    old = {s.ledger_id for s in _record(bk, "tests/batch").segments}
    spark.createDataFrame([(b"new",)], "payload binary").write.format("vellum") \
        .option("metadataServiceUri", uri).mode("overwrite").save("tests/batch")
    assert _read_name(spark, uri, "tests/batch") == [(end, b"new")]
    assert not any(bk.ledger_exists(lid) for lid in old)
    assert _staging_keys(bk) == []
    # a read by pattern sees the name too (a full match: other tests' tests/batch-* names are not)
    df = (spark.read.format("vellum").option("metadataServiceUri", uri).option("namePattern", "tests/b[a-z]*")
          .load())
    assert [(r.name, r.entryId, r.batchIndex) for r in df.collect()] == [("tests/batch", end, 0)]


def test_packed_and_plain_entries(spark: Any, cluster: LocalCluster, bk: Any) -> None:
    """Rows are packed into records-v1 entries up to entryMaxRows / entryMaxBytes; entryMaxRows=1
    writes plain entries any client reads; a plain client unpacks packed ones with vellum.records."""
    from vellum.format.records import ENTRY_FORMAT_KEY, RECORDS_V1, unpack

    uri = cluster.metadata_uri
    rows = [(b"%04d" % i) * (1 + i % 50) for i in range(600)]  # 4..200 bytes, distinct
    df = spark.createDataFrame([(r,) for r in rows], "payload binary").coalesce(1)
    w = df.write.format("vellum").option("metadataServiceUri", uri).mode("append")
    w.option("entryMaxRows", 64).option("entryMaxBytes", 4096).save("tests/packed")
    w.option("entryMaxRows", 1).save("tests/plain")

    packed = _record(bk, "tests/packed")
    (seg,) = packed.segments
    h = bk.open_ledger(seg.ledger_id)
    assert h.metadata.custom_metadata[ENTRY_FORMAT_KEY] == RECORDS_V1
    entries = [unpack(e.payload) for e in h.read(0, h.last_add_confirmed)]
    assert [r for e in entries for r in e] == rows
    assert all(len(e) <= 64 and (len(e) == 1 or sum(map(len, e)) <= 4096) for e in entries)
    assert len(entries) == packed.closed_end
    got = spark.read.format("vellum").option("metadataServiceUri", uri).option("name", "tests/packed") \
        .option("arrowBatchEntries", 100).load().collect()
    assert [bytes(r.payload) for r in sorted(got, key=lambda r: (r.entryId, r.batchIndex))] == rows
    assert sorted((r.entryId, r.batchIndex) for r in got) == [
        (eid, i) for eid, e in enumerate(entries) for i in range(len(e))]
    # a consumer that stops early (limit) drops the read ahead and gets exactly what it asked
    few = spark.read.format("vellum").option("metadataServiceUri", uri).option("name", "tests/packed") \
        .option("arrowBatchEntries", 10).load().limit(3).collect()
    assert len(few) == 3 and {bytes(r.payload) for r in few} <= set(rows)
    # metadata-only scans still give one row per packed row
    n = spark.read.format("vellum").option("metadataServiceUri", uri).option("name", "tests/packed") \
        .option("includePayload", "false").load().count()
    assert n == len(rows)

    plain = _record(bk, "tests/plain")
    (seg,) = plain.segments
    h = bk.open_ledger(seg.ledger_id)
    assert ENTRY_FORMAT_KEY not in h.metadata.custom_metadata
    assert [e.payload for e in h.read(0, h.last_add_confirmed)] == rows
    got = _read_name(spark, uri, "tests/plain")
    assert got == list(enumerate(rows))


def _record(bk: Any, name: str) -> Any:
    from vellum.spark.names import NameReader

    got = NameReader(bk).record(name)
    assert got is not None
    return got.value


def test_failed_batch_write_leaves_nothing(spark: Any, cluster: LocalCluster, bk: Any) -> None:
    uri = cluster.metadata_uri
    before = set(bk.list_ledgers())
    # one task fails mid-way (after other tasks wrote and closed their staging ledgers)
    df = spark.range(0, 1000, numPartitions=4).selectExpr(
        "cast(if(id = 777, raise_error('invalid row 777'), cast(id as string)) as binary) as payload")
    with pytest.raises(Exception, match="invalid row 777"):
        df.write.format("vellum").option("metadataServiceUri", uri).mode("append").save("tests/failed")
    assert not bk.aio.store.kv.list("names/tests/failed")
    assert _staging_keys(bk) == []
    assert set(bk.list_ledgers()) == before  # every staging ledger was deleted


def test_write_options_are_validated(spark: Any, cluster: LocalCluster) -> None:
    from pyspark.errors import AnalysisException

    df = spark.createDataFrame([(b"a", 1)], "payload binary, other int")
    w = df.write.format("vellum").option("metadataServiceUri", cluster.metadata_uri).mode("append")
    with pytest.raises(AnalysisException, match=r"other columns: \['other'\]"):
        w.save("tests/x")
    with pytest.raises(AnalysisException, match="option name is required"):
        df.select("payload").write.format("vellum").option("metadataServiceUri", cluster.metadata_uri) \
            .mode("append").save()
    with pytest.raises(AnalysisException, match="entryMaxBytes must be at most"):
        df.select("payload").write.format("vellum").option("metadataServiceUri", cluster.metadata_uri) \
            .option("entryMaxBytes", 64 << 20).mode("append").save("tests/x")
    with pytest.raises(AnalysisException, match="bad ledger name"):
        df.select("payload").write.format("vellum").option("metadataServiceUri", cluster.metadata_uri) \
            .mode("append").save("bad//name")


def test_stream_write_exactly_once_with_forced_replay(
    spark: Any, cluster: LocalCluster, bk: Any, tmp_path: Path
) -> None:
    uri = cluster.metadata_uri
    src = bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
    for f in [src.append_async(b"e%d" % i) for i in range(400)]:
        f.result(30)
    src.close()
    cp = tmp_path / "cp"

    def run() -> None:
        q = (spark.readStream.format("vellum").option("metadataServiceUri", uri)
             .option("ledgers", str(src.ledger_id)).option("startingOffsets", "earliest")
             .option("maxEntriesPerTrigger", 100).load().select("payload")
             .writeStream.format("vellum").option("metadataServiceUri", uri).option("name", "tests/stream")
             .option("checkpointLocation", str(cp)).trigger(availableNow=True).start())
        assert q.awaitTermination(120)
        assert q.exception() is None

    run()
    first = _read_name(spark, uri, "tests/stream")
    assert sorted(p for _e, p in first) == sorted(b"e%d" % i for i in range(400))
    cursors = dict(_record(bk, "tests/stream").cursors)
    assert list(cursors.values()) == [b"3"]
    # Crash between the sink's commit and Spark's commit log: Spark replays batch 3 on restart.
    (cp / "commits" / "3").unlink()
    shutil.rmtree(cp / "commits" / ".3.crc", ignore_errors=True)
    (cp / "commits" / ".3.crc").unlink(missing_ok=True)
    run()
    assert _read_name(spark, uri, "tests/stream") == first  # the replayed batch was skipped
    assert _staging_keys(bk) == []


def test_task_attempt_finishing_after_abort_leaves_nothing(cluster: LocalCluster, bk: Any) -> None:
    """A task that registers its staging ledger after the driver's abort listed the job's
    registrations sees the job's finished marker and removes its own ledger."""
    import pyarrow as pa

    from vellum.spark.options import parse_write_options
    from vellum.spark.writer import abort_job, write_task

    opts = parse_write_options({"metadataServiceUri": cluster.metadata_uri, "name": "tests/late-task"})
    before = set(bk.list_ledgers())
    abort_job(opts, "b-late-task-job", [])          # the driver gave up on the job first
    batch = pa.RecordBatch.from_pydict({"payload": pa.array([b"x", b"y"], pa.binary())})
    with pytest.raises(RuntimeError, match="already finished"):
        write_task(opts, "b-late-task-job", iter([batch]))
    assert _staging_keys(bk) == []
    assert set(bk.list_ledgers()) == before, "the late attempt's staging ledger must be deleted"


def test_segment_quorums_come_from_options_else_the_client(spark: Any, cluster: LocalCluster, bk: Any) -> None:
    """Unset quorums are the client's (3, 2); given ones are kept; inconsistent ones fail at save()."""
    uri = cluster.metadata_uri
    df = spark.range(0, 40, numPartitions=2).selectExpr("cast(cast(id as string) as binary) as payload")
    df.write.format("vellum").option("metadataServiceUri", uri).mode("append").save("tests/q-default")
    df.write.format("vellum").option("metadataServiceUri", uri).option("ensembleSize", 2) \
        .option("writeQuorumSize", 2).mode("append").save("tests/q-unstriped")
    for name, want in (("tests/q-default", (3, 2)), ("tests/q-unstriped", (2, 2))):
        segments = _record(bk, name).segments
        assert segments
        for seg in segments:
            md = bk.ledger_metadata(seg.ledger_id)
            assert (md.ensemble_size, md.write_quorum_size) == want, (name, seg.ledger_id)
    assert sorted(bytes(p) for _e, p in _read_name(spark, uri, "tests/q-unstriped")) == \
        sorted(b"%d" % i for i in range(40))
    with pytest.raises(Exception, match="ackQuorumSize 3 is above writeQuorumSize 2"):
        df.write.format("vellum").option("metadataServiceUri", uri).option("writeQuorumSize", 2) \
            .option("ackQuorumSize", 3).mode("append").save("tests/bad-quorum")
    with pytest.raises(Exception, match="writeQuorumSize 3 is above ensembleSize 2"):
        df.write.format("vellum").option("metadataServiceUri", uri).option("ensembleSize", 2) \
            .option("writeQuorumSize", 3).mode("append").save("tests/bad-quorum")
