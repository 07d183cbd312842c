"""Streaming output modes of the vellum sink on real Spark: ``complete`` replaces the name's
contents with each micro-batch's whole result table; ``append`` adds; ``update`` is refused by
Spark for Python data source sinks, with Spark's own message."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from vellum.testing.local_cluster import LocalCluster


def _rows(spark: Any, uri: str, name: str) -> list[str]:
    df = spark.read.format("vellum").option("metadataServiceUri", uri).option("name", name).load()
    return sorted(r.value.decode() for r in df.select("value").collect())


def test_complete_mode_replaces_the_name_every_micro_batch(spark: Any, cluster: LocalCluster,
                                                           tmp_path: Path) -> None:
    name = "tests/sink/complete"
    q = (spark.readStream.format("rate").option("rowsPerSecond", 50).option("numPartitions", 1).load()
         .selectExpr("value % 3 AS k").groupBy("k").count()
         .selectExpr("CONCAT(CAST(k AS STRING), ':', CAST(count AS STRING)) AS value")
         .writeStream.format("vellum").outputMode("complete").option("metadataServiceUri", cluster.metadata_uri)
         .option("checkpointLocation", str(tmp_path / "cp")).trigger(processingTime="0 seconds").start(name))
    try:
        deadline = time.monotonic() + 120
        while (q.lastProgress is None or q.lastProgress["batchId"] < 3) and time.monotonic() < deadline:
            assert q.exception() is None, q.exception()
            time.sleep(0.5)
        assert q.lastProgress is not None and q.lastProgress["batchId"] >= 3, "fewer than 4 micro-batches"
    finally:
        q.stop()
    assert q.exception() is None
    rows = _rows(spark, cluster.metadata_uri, name)
    # one row per key, the latest counts: earlier batches' tables were replaced, not appended
    assert sorted(r.split(":")[0] for r in rows) == ["0", "1", "2"], rows
    assert sum(int(r.split(":")[1]) for r in rows) > 0


def test_update_mode_is_refused_by_spark(spark: Any, cluster: LocalCluster, tmp_path: Path) -> None:
    stream = (spark.readStream.format("rate").option("rowsPerSecond", 10).load()
              .selectExpr("value % 3 AS k").groupBy("k").count()
              .selectExpr("CAST(count AS STRING) AS value"))
    with pytest.raises(Exception, match=r"(?i)update"):
        q = (stream.writeStream.format("vellum").outputMode("update")
             .option("metadataServiceUri", cluster.metadata_uri)
             .option("checkpointLocation", str(tmp_path / "cp")).start("tests/sink/update"))
        try:
            deadline = time.monotonic() + 60
            while q.isActive and q.exception() is None and time.monotonic() < deadline:
                time.sleep(0.5)
            if q.exception() is not None:
                raise RuntimeError(str(q.exception()))
        finally:
            q.stop()
