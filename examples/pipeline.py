"""End-to-end pipeline: producer -> named ledger -> Structured Streaming aggregation -> named ledger.

1. a producer appends JSON events (``{"user": "u3", "amount": 7}``) to the named ledger
   ``demo/events-<run>`` through the Vellum client;
2. a Structured Streaming query reads ``demo/events`` with ``format("vellum")``, sums the
   amounts per user and writes the running totals into the named ledger ``demo/totals``
   (``outputMode("complete")``: each micro-batch replaces the totals, exactly once);
3. after each round the totals are read back with a batch ``spark.read.format("vellum")`` and
   checked against what the producer sent.

The producer runs three rounds; the query runs with ``trigger(availableNow=True)`` after each
one and resumes from its checkpoint, so the totals grow round by round.

Run (starts its own 3-bookie LocalCluster in a temporary directory)::

    .venv/bin/python examples/pipeline.py

or against a running ``vellum standalone`` (``--metadata-uri`` of that standalone)::

    .venv/bin/python examples/pipeline.py --metadata-uri sqlite:///path/to/data/metadata.db

or on a Spark standalone cluster (docs/spark.md, "Running on a cluster")::

    PYSPARK_PYTHON=$PWD/.venv/bin/python .venv/bin/spark-submit --master spark://HOST:7077 \
        examples/pipeline.py --metadata-uri zk://ZKHOST:2181/ledgers
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# A run id keeps reruns against a long-lived cluster apart (each run starts from empty names).
RUN = os.urandom(3).hex()
EVENTS = f"demo/events-{RUN}"
TOTALS = f"demo/totals-{RUN}"


@contextlib.contextmanager
def metadata_uri(given: str | None, base: Path) -> Iterator[str]:
    if given:
        yield given
        return
    from vellum.testing.local_cluster import LocalCluster

    with LocalCluster(base / "cluster", bookies=3) as cluster:
        print(f"started a local cluster: {cluster.metadata_uri}")
        yield cluster.metadata_uri


def produce(uri: str, n: int, rnd: random.Random, expected: Counter[str]) -> None:
    """Append ``n`` events to demo/events as a new writer session (fences the previous one)."""
    import vellum
    from vellum.client.named import NamedLedgers

    with vellum.BookKeeper(uri) as bk:
        named = NamedLedgers(bk.aio)

        async def run() -> None:
            h = await named.open(EVENTS, "create_or_append")
            futures = []
            for _ in range(n):
                user, amount = f"u{rnd.randrange(5)}", rnd.randrange(1, 10)
                expected[user] += amount
                futures.append(h.append_async(json.dumps({"user": user, "amount": amount}).encode()))
            await asyncio.gather(*futures)
            await h.close()  # closing makes every entry readable (no LAC lag)

        asyncio.run_coroutine_threadsafe(run(), bk.loop).result(120)


def session(master: str | None) -> Any:
    """The SparkSession: ``master`` if given, else the one spark-submit was given, else local[2].

    Executors run ``PYSPARK_PYTHON`` (default here: this very Python, which has Vellum); on a
    cluster of several hosts that path must exist with Vellum installed on every worker.
    """
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    from vellum.spark import register

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # Start (or join, under spark-submit) the JVM first: only then does SparkConf() see the
    # master that spark-submit or spark-defaults.conf gave.
    SparkContext._ensure_initialized()
    given = SparkConf().get("spark.master", None)
    chosen = master or given or "local[2]"
    builder = SparkSession.builder.appName("vellum-pipeline")
    if chosen != given:
        builder = builder.master(chosen)
    if chosen.startswith("local") or "127.0.0.1" in chosen or "localhost" in chosen:
        # Everything on this machine: keep Spark's own traffic on loopback.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = (builder.config("spark.driver.host", "127.0.0.1")
                   .config("spark.driver.bindAddress", "127.0.0.1"))
    spark = (builder.config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)  # on a cluster: fails at once, saying how, if an executor lacks Vellum
    return spark


def aggregate(spark: Any, uri: str, checkpoint: Path) -> None:
    """One availableNow run of the streaming aggregation (resumes from the checkpoint)."""
    from pyspark.sql import functions as F

    events = (spark.readStream.format("vellum").option("metadataServiceUri", uri).option("name", EVENTS)
              .option("startingOffsets", "earliest").option("maxEntriesPerTrigger", 500).load())
    parsed = events.select(F.from_json(F.col("payload").cast("string"), "user STRING, amount INT").alias("e"))
    totals = parsed.groupBy("e.user").agg(F.sum("e.amount").alias("total"))
    out = totals.select(F.to_json(F.struct("user", "total")).cast("binary").alias("payload"))
    q = (out.writeStream.format("vellum").option("metadataServiceUri", uri).option("name", TOTALS)
         .outputMode("complete").option("checkpointLocation", str(checkpoint))
         .trigger(availableNow=True).start())
    q.awaitTermination(300)
    if q.exception() is not None:
        raise RuntimeError(f"streaming query failed: {q.exception()}")


def read_totals(spark: Any, uri: str) -> dict[str, int]:
    df = spark.read.format("vellum").option("metadataServiceUri", uri).option("name", TOTALS).load()
    return {d["user"]: d["total"] for d in (json.loads(bytes(r.payload)) for r in df.collect())}


def main() -> int:
    ap = argparse.ArgumentParser(description="producer -> named ledger -> streaming aggregation -> named ledger")
    ap.add_argument("--metadata-uri", help="use this running cluster (default: start a LocalCluster)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--events", type=int, default=1000, help="events per round")
    ap.add_argument("--master", help="Spark master URL, e.g. spark://host:7077 (default: what spark-submit "
                                     "was given, else local[2])")
    ap.add_argument("--checkpoint-dir", help="streaming checkpoint directory; on a cluster of several hosts "
                                             "a shared file system (default: a temporary directory)")
    args = ap.parse_args()
    rnd = random.Random(42)
    expected: Counter[str] = Counter()
    with tempfile.TemporaryDirectory(prefix="vellum-pipeline-") as tmp, metadata_uri(args.metadata_uri, Path(tmp)) as uri:
        spark = session(args.master)
        checkpoint = Path(args.checkpoint_dir) if args.checkpoint_dir else Path(tmp) / "checkpoint"
        try:
            for i in range(1, args.rounds + 1):
                produce(uri, args.events, rnd, expected)
                aggregate(spark, uri, checkpoint)
                totals = read_totals(spark, uri)
                print(f"round {i}: {args.events} events in, totals = {dict(sorted(totals.items()))}")
                if totals != dict(expected):
                    print(f"MISMATCH: expected {dict(sorted(expected.items()))}", file=sys.stderr)
                    return 1
            print("pipeline OK: streamed totals match the produced events exactly")
            return 0
        finally:
            spark.stop()


if __name__ == "__main__":
    raise SystemExit(main())
