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


class _CountingHandle:
    """A real ledger handle that also records, at each call, the sink's adds outstanding
    (issued and not yet acknowledged) and the size of each call."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle
        self._issued: list[tuple[Any, int]] = []
        self.most_outstanding = 0
        self.slices: list[int] = []

    @property
    def outstanding(self) -> int:
        return sum(n for fut, n in self._issued if not fut.done())

    def append_batch_async(self, entries: list[bytes]) -> Any:
        self.slices.append(len(entries))
        fut = self._handle.append_batch_async(entries)
        self._issued.append((fut, len(entries)))
        self.most_outstanding = max(self.most_outstanding, self.outstanding)
        return fut


def test_the_appender_sends_slices_and_keeps_its_window(cluster: LocalCluster, bk: Any) -> None:
    """Each Arrow batch's entries go out as ``append_batch_async`` slices of a quarter window,
    never more than the window outstanding, in row order across batches."""
    from vellum.spark.writer import _Appender

    handle = bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
    counting = _CountingHandle(handle.aio)
    appender = _Appender(bk, counting, 40)  # type: ignore[arg-type]
    batches = [[b"%05d" % i for i in range(start, start + 95)] for start in range(0, 950, 95)]
    for entries in batches:
        appender.add(entries)
    appender.finish()
    assert counting.outstanding == 0
    assert 10 < counting.most_outstanding <= 40
    assert set(counting.slices) == {10, 5}  # 95 rows: nine slices of 10 and one of 5 per batch
    assert handle.last_add_confirmed == 949
    got = handle.read(0, 949)
    assert [e.payload for e in got] == [b"%05d" % i for i in range(950)]
    handle.close()
