"""The sink's pipelined adds: a task hands each Arrow batch's entries to the client's loop and
reads the next batch while they are in flight. Rows keep their order across batches, and a task
that fails with adds of earlier batches still in flight publishes nothing and leaves nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from vellum.testing.local_cluster import LocalCluster


@pytest.fixture
def small_arrow_batches(spark: Any) -> Iterator[None]:
    """Arrow batches of 50 rows (Spark's default is 10,000): many batches per task."""
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    old = spark.conf.get(key)
    spark.conf.set(key, "50")
    try:
        yield
    finally:
        spark.conf.set(key, old)


def _staging(bk: Any) -> list[str]:
    return [k for k in bk.aio.store.kv.list("spark/staging/") if k.split("/")[2][:2] in ("b-", "s-")]


def test_rows_keep_their_order_across_arrow_batches(spark: Any, cluster: LocalCluster, small_arrow_batches: None) -> None:
    """One entry per row and two adds in flight: each batch's coroutine waits for acks while
    the next batch's is already submitted; the entries still follow the rows."""
    uri = cluster.metadata_uri
    name = "tests/pipelined/order"
    rows = 600
    df = spark.range(0, rows, numPartitions=1).selectExpr("cast(format_string('%05d', id) as binary) as value")
    (df.write.format("vellum").option("metadataServiceUri", uri).option("entryMaxRows", 1)
     .option("maxInFlight", 2).mode("append").save(name))
    got = (spark.read.format("vellum").option("metadataServiceUri", uri).option("name", name).load()
           .orderBy("entryId", "batchIndex").collect())
    assert [bytes(r.value) for r in got] == [b"%05d" % i for i in range(rows)]


def test_a_task_failing_after_earlier_batches_were_sent_leaves_nothing(
        spark: Any, cluster: LocalCluster, bk: Any, small_arrow_batches: None) -> None:
    uri = cluster.metadata_uri
    name = "tests/pipelined/failed"
    before = set(bk.list_ledgers())
    # row 480 has no value: its Arrow batch fails in the task after 9 batches were handed over
    df = spark.range(0, 500, numPartitions=1).selectExpr(
        "case when id = 480 then null else cast(cast(id as string) as binary) end as value")
    with pytest.raises(Exception, match=r"column value is null in 1 row"):
        (df.write.format("vellum").option("metadataServiceUri", uri).option("entryMaxRows", 1)
         .option("maxInFlight", 4).mode("append").save(name))
    assert not bk.aio.store.kv.list(f"names/{name}")
    assert _staging(bk) == []
    assert set(bk.list_ledgers()) == before
