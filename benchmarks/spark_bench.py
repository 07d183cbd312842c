"""Spark throughput of the ``vellum`` data source against Parquet on local disk, in the same run.

Starts a LocalCluster (3 bookies, loopback) and a SparkSession on ``local[2]``, then for the
same rows (``--rows`` of ``--payload-bytes`` each, ``--partitions`` tasks):
- write: ``df.write.format("vellum")`` into a named ledger vs ``df.write.parquet``;
- read:  ``spark.read.format("vellum")`` of that name vs ``spark.read.parquet``, into the
  ``noop`` sink (so Spark materialises every row and nothing else is measured).
Each figure is the best of ``--repeat`` runs after a warm-up (the first query of a session is
several times slower). Prints a Markdown table; ``--json`` prints the raw figures.

    .venv/bin/python benchmarks/spark_bench.py --rows 200000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _session() -> Any:
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (SparkSession.builder.master("local[2]").appName("vellum-spark-bench")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").config("spark.driver.memory", "2g")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    from vellum.spark import register

    register(spark)
    return spark


def _best(fn: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--payload-bytes", type=int, default=1024)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--ensemble", default="3,2,2", help="ensembleSize,writeQuorumSize,ackQuorumSize of written ledgers")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    e, w, a = (int(x) for x in args.ensemble.split(","))

    from vellum.testing.local_cluster import LocalCluster

    base = Path(tempfile.mkdtemp(prefix="vellum-spark-bench-"))
    try:
        with LocalCluster(base / "cluster", bookies=3) as cluster:
            spark = _session()
            uri = cluster.metadata_uri
            rows, size = args.rows, args.payload_bytes
            # A distinct payload per row (the id, padded): what a real log holds, not one shared buffer.
            df = spark.range(0, rows, numPartitions=args.partitions).selectExpr(
                f"cast(rpad(cast(id as string), {size}, 'x') as binary) as payload")
            df.cache().count()
            parquet = str(base / "rows.parquet")
            counter = iter(range(1_000_000))

            def write_vellum() -> None:
                (df.write.format("vellum").option("metadataServiceUri", uri).option("ensembleSize", e)
                 .option("writeQuorumSize", w).option("ackQuorumSize", a).mode("append")
                 .save(f"bench/w{next(counter)}"))

            def write_parquet() -> None:
                df.write.mode("overwrite").parquet(parquet)

            def read_vellum() -> None:
                (spark.read.format("vellum").option("metadataServiceUri", uri).option("name", "bench/w0")
                 .option("maxEntriesPerPartition", max(1, rows // args.partitions)).load()
                 .write.format("noop").mode("overwrite").save())

            def read_parquet() -> None:
                spark.read.parquet(parquet).write.format("noop").mode("overwrite").save()

            # warm-up: JIT, Python workers, page cache, client connections
            small = df.limit(1000)
            small.write.format("vellum").option("metadataServiceUri", uri).mode("append").save("bench/warm")
            spark.read.format("vellum").option("metadataServiceUri", uri).option("name", "bench/warm").load() \
                .write.format("noop").mode("overwrite").save()
            small.write.mode("overwrite").parquet(str(base / "warm.parquet"))

            figures = {
                "write_vellum": _best(write_vellum, args.repeat),
                "write_parquet": _best(write_parquet, args.repeat),
                "read_vellum": _best(read_vellum, args.repeat),
                "read_parquet": _best(read_parquet, args.repeat),
            }
            n = spark.read.format("vellum").option("metadataServiceUri", uri).option("name", "bench/w0").load().count()
            assert n == rows, f"read back {n} rows, wrote {rows}"
            spark.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)

    mb = rows * size / 2**20
    result = {k: {"seconds": round(v, 3), "rows_per_s": round(rows / v), "mib_per_s": round(mb / v, 1)}
              for k, v in figures.items()}
    result["ratios"] = {"read_vs_parquet": round(figures["read_parquet"] / figures["read_vellum"], 3),
                        "write_vs_parquet": round(figures["write_parquet"] / figures["write_vellum"], 3)}
    if args.json:
        print(json.dumps({"rows": rows, "payload_bytes": size, "ensemble": args.ensemble, **result}, indent=2))
        return
    print(f"rows={rows} payload={size} B partitions={args.partitions} ensemble={args.ensemble} (best of {args.repeat})")
    print("| path | seconds | rows/s | MiB/s |\n|---|---|---|---|")
    for k in ("write_vellum", "write_parquet", "read_vellum", "read_parquet"):
        r = result[k]
        print(f"| {k} | {r['seconds']} | {r['rows_per_s']:,} | {r['mib_per_s']} |")
    print(f"read vellum/parquet = {result['ratios']['read_vs_parquet']}x, "
          f"write vellum/parquet = {result['ratios']['write_vs_parquet']}x")


if __name__ == "__main__":
    main()
