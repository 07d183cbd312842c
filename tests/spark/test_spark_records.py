"""Records in Spark with Kafka's column names: the source reads key, value, timestamp,
timestampType and headers of records-v1 entries (and still reads plain and rows-v1 entries, with
those columns null); the sink writes key, headers and timestamp, routes rows to several named
ledgers by a ``name`` column exactly once, and refuses bad input naming the column with nothing
written."""

from __future__ import annotations

import datetime
import shutil
from pathlib import Path
from typing import Any

import pytest

from vellum.testing.local_cluster import LocalCluster

UTC = datetime.UTC


def _write_staging(bk: Any) -> list[str]:
    """Staging registrations of write jobs (batch ``b-``, stream ``s-``); segment merges (``m-``)
    and retired segments waiting out their delay (``r-``) of other tests' sinks are not theirs."""
    return [k for k in bk.aio.store.kv.list("spark/staging/") if k.split("/")[2][:2] in ("b-", "s-")]


def _ts(ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms / 1000, UTC)


def _load(spark: Any, uri: str, name: str, **options: str) -> list[Any]:
    r = spark.read.format("vellum").option("metadataServiceUri", uri).option("name", name)
    for k, v in options.items():
        r = r.option(k, v)
    return sorted(r.load().collect(), key=lambda x: (x.entryId, x.batchIndex))


def _record(bk: Any, name: str) -> Any:
    from vellum.spark.names import NameReader

    got = NameReader(bk).record(name)
    assert got is not None
    return got.value


def _utc(spark: Any) -> None:
    spark.conf.set("spark.sql.session.timeZone", "UTC")


def test_source_reads_records_and_old_entries(spark: Any, cluster: LocalCluster, bk: Any) -> None:
    """One name, three kinds of segments: plain entries, rows-v1 (the old sink format) and
    records-v1 written by the producer."""
    from vellum.client.named_blocking import NamedLedgers, OpenMode
    from vellum.client.producer_blocking import Producer, ProducerSettings
    from vellum.format.records import ENTRY_FORMAT_KEY, ROWS_V1, pack

    _utc(spark)
    uri = cluster.metadata_uri
    name = "tests/records-src"
    named = NamedLedgers(bk)
    with named.open(name, OpenMode.CREATE) as w:
        w.append(b"plain-0")
        w.append(b"plain-1")
    old = bk.create_ledger(custom_metadata={ENTRY_FORMAT_KEY: ROWS_V1})
    old.append(pack([b"row-a", b"row-b"]))
    old.close()
    named.publish_segments(name, [old.ledger_id], expected_version=named.record(name).version)
    before = int(datetime.datetime.now(UTC).timestamp() * 1000)
    with Producer.open(bk, name, settings=ProducerSettings(linger_ms=60_000)) as p:
        futs = [p.write(b"v0", key=b"k0", headers=[("h", b"1"), ("h", b"2")], timestamp=1_700_000_000_123),
                p.write(b"v1")]
    assert [f.result(30).batch_index for f in futs] == [0, 1]
    after = int(datetime.datetime.now(UTC).timestamp() * 1000)

    rows = _load(spark, uri, name, includeHeaders="true")
    assert [r.value for r in rows] == [b"plain-0", b"plain-1", b"row-a", b"row-b", b"v0", b"v1"]
    assert [r.payload for r in rows] == [r.value for r in rows]  # the compatibility alias
    assert [(r.entryId, r.batchIndex) for r in rows] == [(0, 0), (1, 0), (2, 0), (2, 1), (3, 0), (3, 1)]
    for r in rows[:4]:  # old entries: no key, timestamp or headers
        assert (r.key, r.timestamp, r.timestampType, r.headers) == (None, None, None, None)
    v0, v1 = rows[4], rows[5]
    assert v0.key == b"k0" and v1.key is None
    assert v0.timestamp == _ts(1_700_000_000_123).replace(tzinfo=None) and v0.timestampType == 0
    assert v1.timestampType == 1  # no event time: the writer's append time
    assert before - 1000 <= int(v1.timestamp.replace(tzinfo=UTC).timestamp() * 1000) <= after + 1000
    assert [(h.key, bytes(h.value)) for h in v0.headers] == [("h", b"1"), ("h", b"2")]
    assert v1.headers is None  # Kafka's shape: no headers is null
    assert {r.name for r in rows} == {name}
    # without includeHeaders the column is absent; payloadColumn=false drops the alias
    cols = spark.read.format("vellum").option("metadataServiceUri", uri).option("name", name) \
        .option("payloadColumn", "false").load().columns
    assert cols == ["key", "value", "name", "ledgerId", "entryId", "batchIndex", "timestamp", "timestampType"]
    # a metadata-only scan still counts every record
    assert spark.read.format("vellum").option("metadataServiceUri", uri).option("name", name) \
        .option("includePayload", "false").load().count() == 6


def test_sink_writes_key_headers_timestamp_and_routes_by_name(
    spark: Any, cluster: LocalCluster, bk: Any, tmp_path: Path
) -> None:
    _utc(spark)
    uri = cluster.metadata_uri
    a, b = "tests/route-a", "tests/route-b"
    df = spark.createDataFrame(
        [(f"v{i}", None if i % 3 == 0 else f"k{i}", [("src", b"t%d" % i)] if i % 2 else None,
          _ts(1_600_000_000_000 + i), a if i % 2 else b) for i in range(40)],
        "value string, key string, headers array<struct<key: string, value: binary>>, timestamp timestamp, "
        "name string").repartition(3)
    df.write.format("vellum").option("metadataServiceUri", uri).option("entryMaxRows", 4).mode("append").save()
    for name, parity in ((a, 1), (b, 0)):
        rows = _load(spark, uri, name, includeHeaders="true")
        want = {i for i in range(40) if i % 2 == parity}
        assert sorted(int(r.value[1:]) for r in rows) == sorted(want)
        for r in rows:
            i = int(r.value[1:])
            assert r.key == (None if i % 3 == 0 else b"k%d" % i)
            assert r.timestamp == _ts(1_600_000_000_000 + i).replace(tzinfo=None) and r.timestampType == 0
            assert (r.headers is None) if i % 2 == 0 else [(h.key, bytes(h.value)) for h in r.headers] == [
                ("src", b"t%d" % i)]
        assert max(r.batchIndex for r in rows) <= 3  # entryMaxRows
    # one staging ledger per (task, name): each name got segments of its own rows only
    for name in (a, b):
        for seg in _record(bk, name).segments:
            assert bk.ledger_metadata(seg.ledger_id).custom_metadata["vellum.spark.name"] == name.encode()
    assert _write_staging(bk) == []


def test_stream_sink_routing_replay_does_not_duplicate(
    spark: Any, cluster: LocalCluster, bk: Any, tmp_path: Path
) -> None:
    uri = cluster.metadata_uri
    src = bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
    for f in [src.append_async(b"e%d" % i) for i in range(200)]:
        f.result(30)
    src.close()
    cp = tmp_path / "cp"
    names = ("tests/sroute-even", "tests/sroute-odd")

    def run() -> None:
        q = (spark.readStream.format("vellum").option("metadataServiceUri", uri)
             .option("ledgers", str(src.ledger_id)).option("startingOffsets", "earliest")
             .option("maxEntriesPerTrigger", 50).load()
             .selectExpr("value", "key", f"if(entryId % 2 = 0, '{names[0]}', '{names[1]}') as name")
             .writeStream.format("vellum").option("metadataServiceUri", uri)
             .option("checkpointLocation", str(cp)).trigger(availableNow=True).start())
        assert q.awaitTermination(120)
        assert q.exception() is None

    def contents() -> dict[str, list[bytes]]:
        return {n: sorted(bytes(r.value) for r in _load(spark, uri, n)) for n in names}

    run()
    first = contents()
    assert first == {names[0]: sorted(b"e%d" % i for i in range(0, 200, 2)),
                     names[1]: sorted(b"e%d" % i for i in range(1, 200, 2))}
    assert [list(_record(bk, n).cursors.values()) for n in names] == [[b"3"], [b"3"]]
    # Crash between the sink's commit and Spark's commit log: Spark replays batch 3 on restart.
    (cp / "commits" / "3").unlink()
    shutil.rmtree(cp / "commits" / ".3.crc", ignore_errors=True)
    (cp / "commits" / ".3.crc").unlink(missing_ok=True)
    run()
    assert contents() == first  # the replayed batch was skipped in both names
    assert _write_staging(bk) == []


def test_bad_sink_input_is_a_clear_error_and_writes_nothing(spark: Any, cluster: LocalCluster, bk: Any) -> None:
    from pyspark.errors import AnalysisException

    uri = cluster.metadata_uri

    def write(df: Any, name: str | None = "tests/bad-input") -> None:
        w = df.write.format("vellum").option("metadataServiceUri", uri).mode("append")
        if name is None:
            w.save()
        else:
            w.save(name)

    before = set(bk.list_ledgers())
    with pytest.raises(AnalysisException, match="column 'key' must be binary or string, not int"):
        write(spark.createDataFrame([(b"v", 1)], "value binary, key int"))
    with pytest.raises(AnalysisException, match="needs a 'value' column"):
        write(spark.createDataFrame([(b"k",)], "key binary"))
    with pytest.raises(AnalysisException, match="both 'value' and 'payload'"):
        write(spark.createDataFrame([(b"v", b"p")], "value binary, payload binary"))
    with pytest.raises(AnalysisException, match="column 'headers' must be array<struct<key: string"):
        write(spark.createDataFrame([(b"v", ["x"])], "value binary, headers array<string>"))
    with pytest.raises(AnalysisException, match="column 'timestamp' must be timestamp"):
        write(spark.createDataFrame([(b"v", 5)], "value binary, timestamp bigint"))
    with pytest.raises(AnalysisException, match=r"option name is required.*'name' column"):
        write(spark.createDataFrame([(b"v",)], "value binary"), None)
    # found by the tasks: the job fails, nothing is published, every staging ledger is deleted
    with pytest.raises(Exception, match=r"column name is null in 1 row\(s\)"):
        write(spark.createDataFrame([(b"v", "tests/bad-a"), (b"w", None)], "value binary, name string"), None)
    with pytest.raises(Exception, match="column name: 'bad//name' is not a valid name"):
        write(spark.createDataFrame([(b"v", "bad//name")], "value binary, name string"), None)
    with pytest.raises(Exception, match=r"column timestamp: .* before 1970-01-01"):
        write(spark.createDataFrame([(b"v", datetime.datetime(1969, 12, 31, tzinfo=UTC))],
                                    "value binary, timestamp timestamp"))
    with pytest.raises(Exception, match="column value is null in 1 row"):
        write(spark.createDataFrame([(None,)], "value binary"))
    assert not bk.aio.store.kv.list("names/tests/bad-")
    assert _write_staging(bk) == []
    assert set(bk.list_ledgers()) == before


def test_bad_stream_sink_input_is_a_clear_error_and_writes_nothing(spark: Any, cluster: LocalCluster, bk: Any,
                                                                    tmp_path: Path) -> None:
    """The streaming sink refuses the same bad columns as the batch sink, naming the column,
    before anything is written: no ledger, no name record, no staging registration."""
    uri = cluster.metadata_uri
    rate = spark.readStream.format("rate").option("rowsPerSecond", 50).load()
    cases = {
        "key": (["cast(cast(value as string) as binary) as value", "array(value) as key"],
                r"column 'key' must be binary or string, not array<bigint>"),
        "value": (["cast(cast(value as string) as binary) as key"], r"needs a 'value' column"),
        "timestamp": (["cast(cast(value as string) as binary) as value", "value as timestamp"],
                      r"column 'timestamp' must be timestamp.*not bigint"),
        "headers": (["cast(cast(value as string) as binary) as value",
                     "map('h', cast('x' as binary)) as headers"],
                    r"column 'headers' must be array<struct<key: string, value: binary>>.*not map<string,binary>"),
        "headers-fields": (["cast(cast(value as string) as binary) as value",
                            "array(named_struct('key', 1, 'value', cast('x' as binary))) as headers"],
                           r"column 'headers' must be array<struct<key: string, value: binary>>"),
    }
    before = set(bk.list_ledgers())
    for case, (columns, error) in cases.items():
        name = f"tests/bad-stream-{case}"
        query = None
        with pytest.raises(Exception, match=error) as info:
            query = (rate.selectExpr(*columns).writeStream.format("vellum").option("metadataServiceUri", uri)
                     .option("checkpointLocation", str(tmp_path / case)).start(name))
            query.processAllAvailable()
        if query is not None:
            query.stop()
        assert "[VELLUM_OPTION]" in str(info.value), (case, str(info.value)[:500])
        assert not bk.aio.store.kv.list(f"names/{name}")
    assert _write_staging(bk) == []
    assert set(bk.list_ledgers()) == before
