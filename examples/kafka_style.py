"""A pipeline written the way a Kafka user writes one, on Vellum.

1. a producer (Kafka's ``KafkaProducer`` -> ``vellum.client.producer_blocking.Producer``) writes
   keyed records, with event timestamps and headers, to the named ledger ``demo/orders-<run>``
   (a topic): first a backlog of old orders, then, after a moment noted as ``start``, the orders
   of interest;
2. a Structured Streaming query reads the name from ``startingTimestamp = start`` (so the
   backlog is skipped without being read), sums the amounts per user and 10-second window of
   event time with a 30-second watermark, and writes each window's total as a record (key =
   user, value = JSON, timestamp = the window's end) into ``demo/order-totals-<run>``;
3. the totals are read back with a batch read and checked against what the producer sent
   after ``start``.

Kafka option -> Vellum option: ``kafka.bootstrap.servers`` -> ``metadataServiceUri``,
``subscribe`` -> ``name``, ``startingTimestamp`` and ``includeHeaders`` keep their names,
``maxOffsetsPerTrigger`` -> ``maxEntriesPerTrigger``; the sink's ``topic`` -> ``name``
(docs/spark.md, "Kafka connector options and their Vellum counterparts").

Run (starts its own 3-bookie LocalCluster in a temporary directory)::

    .venv/bin/python examples/kafka_style.py [--master URL] [--metadata-uri URI]

or through ``spark-submit`` like ``examples/pipeline.py`` (docs/spark.md, "Running on a cluster").
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipeline import metadata_uri, session  # the same cluster and session set-up as pipeline.py

WINDOW_S = 10
USERS = ("alice", "bob", "carol")


def produce(uri: str, name: str, n: int, rnd: random.Random, event_ms: int, *,
            tick: bool = False) -> Counter[tuple[str, int]]:
    """``n`` orders with event times from ``event_ms`` on (within 25 s, so none is later than the
    watermark allows), as one producer session; returns the sum per (user, window start ms)."""
    import vellum
    from vellum.client.producer_blocking import Producer, ProducerSettings

    sums: Counter[tuple[str, int]] = Counter()
    with vellum.BookKeeper(uri) as bk, \
            Producer.open(bk, name, settings=ProducerSettings(linger_ms=20)) as producer:
        futures = []
        for i in range(n):
            user, amount = rnd.choice(USERS), rnd.randrange(1, 100)
            ts = event_ms + rnd.randrange(25_000)
            futures.append(producer.write(json.dumps({"order": i, "amount": amount}).encode(), key=user.encode(),
                                          headers=[("source", b"web"), ("schema", b"order-v1")], timestamp=ts))
            sums[(user, ts - ts % (WINDOW_S * 1000))] += amount
        if tick:
            # Event time moves on: a record two minutes after the orders takes the watermark past
            # every order's window, so append mode emits them (its own window stays open).
            futures.append(producer.write(json.dumps({"order": -1, "amount": 0}).encode(), key=b"tick",
                                          headers=[("schema", b"order-v1")], timestamp=event_ms + 120_000))
        for f in futures:
            f.result(60)  # acknowledged by the ack quorum
    return sums


def stream_totals(spark: Any, uri: str, source: str, sink: str, start_ms: int, checkpoint: Path) -> None:
    """The streaming query, as with Kafka's connector; one availableNow run."""
    from pyspark.sql import functions as F

    orders = (spark.readStream.format("vellum")
              .option("metadataServiceUri", uri)          # kafka.bootstrap.servers
              .option("name", source)                     # subscribe
              .option("startingTimestamp", start_ms)      # the same option
              .option("includeHeaders", "true")           # the same option
              .option("maxEntriesPerTrigger", 50)         # maxOffsetsPerTrigger
              .load())
    parsed = orders.select(
        F.col("key").cast("string").alias("user"),
        F.get_json_object(F.col("value").cast("string"), "$.amount").cast("int").alias("amount"),
        F.col("timestamp"),
        F.expr("filter(headers, h -> h.key = 'schema')[0].value").cast("string").alias("schema"))
    totals = (parsed.where(F.col("schema") == "order-v1")
              .withWatermark("timestamp", "30 seconds")
              .groupBy(F.window("timestamp", f"{WINDOW_S} seconds"), "user")
              .agg(F.sum("amount").alias("total")))
    out = totals.select(
        F.col("user").alias("key"),
        F.to_json(F.struct(F.expr("unix_millis(window.start)").alias("windowStartMs"), "total")).alias("value"),
        F.col("window.end").alias("timestamp"))
    q = (out.writeStream.format("vellum").option("metadataServiceUri", uri).option("name", sink)  # topic
         .outputMode("append").option("checkpointLocation", str(checkpoint))
         .trigger(availableNow=True).start())
    q.awaitTermination(300)
    if q.exception() is not None:
        raise RuntimeError(f"streaming query failed: {q.exception()}")


def read_totals(spark: Any, uri: str, sink: str) -> dict[tuple[str, int], int]:
    """The total per (user, window start ms): append mode writes each window once, when the
    watermark has passed its end."""
    rows = (spark.read.format("vellum").option("metadataServiceUri", uri).option("name", sink).load()
            .orderBy("entryId", "batchIndex").collect())
    out: dict[tuple[str, int], int] = {}
    for r in rows:
        d = json.loads(bytes(r.value))
        window = (bytes(r.key).decode(), int(d["windowStartMs"]))
        if window in out:
            raise RuntimeError(f"window {window} written twice")
        out[window] = d["total"]
    return out


def run(spark: Any, uri: str, work: Path, *, backlog: int = 300, orders: int = 300, seed: int = 7) -> int:
    run_id = os.urandom(3).hex()
    source, sink = f"demo/orders-{run_id}", f"demo/order-totals-{run_id}"
    rnd = random.Random(seed)
    now = int(time.time() * 1000)
    produce(uri, source, backlog, rnd, now - 3_600_000)  # an hour old: before the start
    time.sleep(0.05)
    start_ms = int(time.time() * 1000)
    time.sleep(0.05)
    expected = produce(uri, source, orders, rnd, start_ms, tick=True)
    stream_totals(spark, uri, source, sink, start_ms, work / "checkpoint")
    got = read_totals(spark, uri, sink)
    print(f"{orders} orders after the start ({backlog} before it skipped): {len(got)} (user, window) totals")
    if got != dict(expected):
        print(f"MISMATCH:\n  expected {sorted(expected.items())}\n  got      {sorted(got.items())}", file=sys.stderr)
        return 1
    print("kafka-style pipeline OK: windowed totals from the start time match the produced orders")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description="producer -> named ledger -> windowed stream from a time -> named ledger")
    ap.add_argument("--metadata-uri", help="use this running cluster (default: start a LocalCluster)")
    ap.add_argument("--orders", type=int, default=300)
    ap.add_argument("--master", help="Spark master URL (default: what spark-submit was given, else local[2])")
    ap.add_argument("--checkpoint-dir", help="streaming checkpoint directory (default: a temporary directory)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="vellum-kafka-style-") as tmp, \
            metadata_uri(args.metadata_uri, Path(tmp)) as uri:
        spark = session(args.master)
        try:
            work = Path(args.checkpoint_dir) if args.checkpoint_dir else Path(tmp)
            return run(spark, uri, work, orders=args.orders)
        finally:
            spark.stop()


if __name__ == "__main__":
    raise SystemExit(main())
