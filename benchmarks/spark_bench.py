"""Spark throughput of the ``vellum`` data source against Parquet on local disk, in the same run.

Starts a LocalCluster (3 bookies, loopback) and a SparkSession on ``local[2]``, then for the
same rows (``--rows`` of ``--payload-bytes`` each, ``--partitions`` tasks):
- write: ``df.write.format("vellum")`` into a named ledger vs ``df.write.parquet``;
- read:  ``spark.read.format("vellum")`` of that name vs ``spark.read.parquet``, into the
  ``noop`` sink (so Spark materialises every row and nothing else is measured).
After a warm-up (the first query of a session is several times slower), Vellum and Parquet
runs alternate in ABBA order ``--repeat`` times; the ratio reported is the median of the
per-pair ratios (min..max), the rows/s figures the best run of each. Rows are packed into
entries as the sink does by default; ``--entry-max-rows 1`` measures one plain entry per row;
``--cases read --writer producer`` reads records written by the producer, one per entry
(``records-v1``, what applications append). ``--control`` adds an A/A pair (Parquet against
itself: the spread noise alone gives), ``--ceiling`` a Python source serving the rows from memory.
``--rows`` takes a comma-separated list (default 200,000 and 1,000,000): each size is written
and read in turn in the same session. A read of 200,000 rows of 1 KiB takes Parquet ~0.3 s, of
which Spark's fixed per-query costs (planning, scheduling, a Python worker per task for a Python
source) are a large part; the larger size shows the per-row speed. Prints a Markdown table per
size (with the 1-minute load average when it started); ``--json`` prints the raw figures.

    .venv/bin/python benchmarks/spark_bench.py --rows 200000,1000000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
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


def _register_ceiling(spark: Any) -> None:
    """Format ``ceiling``: a Python data source with the vellum read schema that yields ready-made
    Arrow batches from memory (no storage, no network): what any Python source costs Spark."""
    import pyarrow as pa
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
    from pyspark.sql.pandas.types import to_arrow_schema

    from vellum.spark.datasource import read_schema

    class _Part(InputPartition):  # type: ignore[misc]
        def __init__(self, rows: int) -> None:
            self.rows = rows

    class _Reader(DataSourceReader):  # type: ignore[misc]
        def __init__(self, options: dict[str, str]) -> None:
            self.rows, self.parts = int(options["rows"]), int(options["partitions"])
            self.size = int(options["size"])

        def partitions(self) -> list[_Part]:
            return [_Part(self.rows // self.parts)] * self.parts

        def read(self, partition: _Part) -> Any:
            from vellum.spark.reader import RecordColumns, _batch

            schema = to_arrow_schema(read_schema(False, False, False), timezone="UTC")
            n = 4096
            offsets = pa.array([i * self.size for i in range(n + 1)], pa.int32())
            value = pa.Array.from_buffers(pa.binary(), n, [None, offsets.buffers()[1],
                                                           pa.py_buffer(os.urandom(n * self.size))])
            stamps = pa.repeat(pa.scalar(0, pa.timestamp("us", tz="UTC")), n)
            done = 0
            while done < partition.rows:
                k = min(n, partition.rows - done)
                cols = RecordColumns(value.slice(0, k), None, stamps.slice(0, k), pa.repeat(pa.scalar(1, pa.int32()), k))
                yield _batch(schema, "bench", 1, pa.array(range(done, done + k), pa.int64()),
                             pa.repeat(pa.scalar(0, pa.int32()), k), cols, None)
                done += k

    class _Ceiling(DataSource):  # type: ignore[misc]
        @classmethod
        def name(cls) -> str:
            return "ceiling"

        def schema(self) -> Any:
            return read_schema(False, False, False)

        def reader(self, schema: Any) -> _Reader:
            return _Reader(self.options)

    spark.dataSource.register(_Ceiling)


def _produce(uri: str, name: str, rows: int, size: int) -> None:
    """``rows`` records of ``size`` random bytes into ``name``, one record per entry, as an
    application appends them with the producer (``records-v1``, the client's 3,2,2 ledgers)."""
    import asyncio

    from vellum.client.producer import ProducerSettings
    from vellum.client.producer_blocking import Producer
    from vellum.spark.connection import client

    async def fill(producer: Any) -> None:
        futures = [await producer.write(os.urandom(size)) for _ in range(rows)]
        await producer.flush()
        await asyncio.gather(*futures)

    # Untimed loading: a generous add timeout, so that a shared, overloaded machine's stalls (the
    # JVM, other processes) do not make the producer give up on every bookie (the default is 5 s).
    with client(uri, (("addEntryTimeoutSec", "120"),)) as bk:
        producer = Producer.open(bk, name, settings=ProducerSettings(batch_size_bytes=1, linger_ms=0))
        bk.run(fill(producer.aio))
        producer.close()


def _payload_expr(kind: str, size: int) -> str:
    """SQL for a distinct ``size``-byte payload per row (never one shared buffer).

    ``random``: SHA-256 output (incompressible, like encrypted or already-compressed data: both
    sides write and read every byte); ``padded``: the id padded with 'x' (Parquet compresses
    it to almost nothing, so its side moves a few MB while Vellum stores every byte).
    """
    if kind == "padded":
        return f"cast(rpad(cast(id as string), {size}, 'x') as binary)"
    blocks = [f"unhex(sha2(concat(cast(id as string), '-{k}'), 256))" for k in range((size + 31) // 32)]
    return f"substring(concat({', '.join(blocks)}), 1, {size})"


def _timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _abba(vellum: Any, parquet: Any, repeat: int) -> tuple[list[float], list[float]]:
    """Alternate the two in ABBA order; returns (vellum seconds, parquet seconds) per pair."""
    tv: list[float] = []
    tp: list[float] = []
    for i in range(repeat):
        if i % 2 == 0:
            tv.append(_timed(vellum))
            tp.append(_timed(parquet))
        else:
            tp.append(_timed(parquet))
            tv.append(_timed(vellum))
    return tv, tp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="200000,1000000",
                    help="rows per run; a comma-separated list runs each size in turn in the same session "
                         "(small reads are dominated by Spark's fixed per-query costs: see docs/benchmarks.md)")
    ap.add_argument("--payload-bytes", type=int, default=1024)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=4)
    ap.add_argument("--ensemble", default="default",
                    help="ensembleSize,writeQuorumSize,ackQuorumSize of written ledgers, or 'default': no "
                         "quorum options (the sink's default: the client's, 3,2,2)")
    ap.add_argument("--payload", choices=("random", "padded"), default="random",
                    help="random: incompressible bytes; padded: the id padded with 'x' (compressible)")
    ap.add_argument("--entry-max-rows", type=int, default=None,
                    help="sink option entryMaxRows (default: the sink's; 1 = one entry per row)")
    ap.add_argument("--entry-max-bytes", type=int, default=None,
                    help="sink option entryMaxBytes (default: the sink's)")
    ap.add_argument("--writer", choices=("sink", "producer"), default="sink",
                    help="who writes the rows to read (with --cases read): the Spark sink, or the producer "
                         "(vellum.client.producer: records-v1 with one record per entry, random payloads)")
    ap.add_argument("--cases", choices=("all", "read", "write", "ceiling"), default="all",
                    help="read: write the rows once (untimed) and time only the reads; write: only the writes; "
                         "ceiling: only the in-memory Python source against Parquet (no Vellum read or write)")
    ap.add_argument("--write-only", action="store_true", help="the same as --cases write")
    ap.add_argument("--control", action="store_true",
                    help="also run an A/A control of each timed case (Parquet against itself, same ABBA order): "
                         "the spread the machine's noise alone gives a ratio")
    ap.add_argument("--ceiling", action="store_true",
                    help="also time, ABBA against Parquet, a Python data source that yields the same rows "
                         "from memory (the upper bound of any Python source's read)")
    ap.add_argument("--read-option", action="append", default=[], metavar="KEY=VALUE",
                    help="an option of the Vellum read (repeatable), e.g. maxBytesPerPartition=268435456 "
                         "(the read plans one task per 128 MiB by default)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.write_only:
        args.cases = "write"
    if args.cases == "ceiling":
        args.ceiling = True
    quorum: dict[str, int] = {}
    if args.ensemble != "default":
        e, w, a = (int(x) for x in args.ensemble.split(","))
        quorum = {"ensembleSize": e, "writeQuorumSize": w, "ackQuorumSize": a}

    from vellum.testing.local_cluster import LocalCluster

    sizes = [int(x) for x in str(args.rows).split(",")]
    base = Path(tempfile.mkdtemp(prefix="vellum-spark-bench-"))
    results: list[dict[str, Any]] = []
    try:
        with LocalCluster(base / "cluster", bookies=3) as cluster:
            spark = _session()
            if args.ceiling:
                _register_ceiling(spark)
            for rows in sizes:
                figures, pair_ratios, load = _run_size(spark, cluster.metadata_uri, base / f"r{rows}", rows, args,
                                                       quorum)
                results.append(_summary(rows, args, figures, pair_ratios, load))
            spark.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)

    if args.json:
        print(json.dumps(results if len(results) > 1 else results[0], indent=2))
        return
    for result in results:
        _print(result, args)


def _run_size(spark: Any, uri: str, base: Path, rows: int, args: Any,
              quorum: dict[str, int]) -> tuple[dict[str, float], dict[str, list[float]], float]:
    """The timed cases for ``rows`` rows (written under names of their own); (best seconds per
    path, sorted per-pair ratios per comparison, 1-minute load average when the size started)."""
    load = os.getloadavg()[0]
    size = args.payload_bytes
    base.mkdir(parents=True, exist_ok=True)
    tag = f"r{rows}"
    df = spark.range(0, rows, numPartitions=args.partitions).selectExpr(f"{_payload_expr(args.payload, size)} as payload")
    df.cache().count()
    parquet = str(base / "rows.parquet")
    counter = iter(range(1_000_000))

    def write_vellum() -> None:
        wr = df.write.format("vellum").option("metadataServiceUri", uri).options(**quorum).mode("append")
        if args.entry_max_rows is not None:
            wr = wr.option("entryMaxRows", args.entry_max_rows)
        if args.entry_max_bytes is not None:
            wr = wr.option("entryMaxBytes", args.entry_max_bytes)
        wr.save(f"bench/{tag}/w{next(counter)}")

    def write_parquet() -> None:
        df.write.mode("overwrite").parquet(parquet)

    def read_vellum() -> None:
        # payloadColumn=false: the value bytes once (the payload alias would copy them twice)
        (spark.read.format("vellum").option("metadataServiceUri", uri).option("name", f"bench/{tag}/w0")
         .option("maxEntriesPerPartition", max(1, rows // args.partitions))
         .option("payloadColumn", "false").options(**dict(o.split("=", 1) for o in args.read_option)).load()
         .write.format("noop").mode("overwrite").save())

    def read_parquet() -> None:
        # noop materialises every column of every row on both sides (a count() could skip them)
        spark.read.parquet(parquet).write.format("noop").mode("overwrite").save()

    # warm-up: JIT, Python workers, page cache, client connections
    small = df.limit(1000)
    small.write.format("vellum").option("metadataServiceUri", uri).mode("append").save(f"bench/{tag}/warm")
    spark.read.format("vellum").option("metadataServiceUri", uri).option("name", f"bench/{tag}/warm").load() \
        .write.format("noop").mode("overwrite").save()
    small.write.mode("overwrite").parquet(str(base / "warm.parquet"))

    def write_parquet_b() -> None:
        df.write.mode("overwrite").parquet(str(base / "control.parquet"))

    figures: dict[str, float] = {}
    pair_ratios: dict[str, list[float]] = {}
    if args.cases in ("all", "write"):
        wv, wp = _abba(write_vellum, write_parquet, args.repeat)
        figures.update(write_vellum=min(wv), write_parquet=min(wp))
        pair_ratios["write_vs_parquet"] = sorted(p / v for v, p in zip(wv, wp, strict=True))
        if args.control:
            ca, cb = _abba(write_parquet, write_parquet_b, args.repeat)
            pair_ratios["control_write_parquet_aa"] = sorted(b / a for a, b in zip(ca, cb, strict=True))
    elif args.cases == "ceiling":
        write_parquet()
    else:  # the rows to read, written once and untimed
        if args.writer == "producer":
            _produce(uri, f"bench/{tag}/w0", rows, size)
        else:
            write_vellum()
        write_parquet()
    if args.cases in ("all", "read"):
        rv, rp = _abba(read_vellum, read_parquet, args.repeat)
        figures.update(read_vellum=min(rv), read_parquet=min(rp))
        pair_ratios["read_vs_parquet"] = sorted(p / v for v, p in zip(rv, rp, strict=True))
        if args.control:
            ca, cb = _abba(read_parquet, read_parquet, args.repeat)
            pair_ratios["control_read_parquet_aa"] = sorted(b / a for a, b in zip(ca, cb, strict=True))
    if args.ceiling:
        def read_ceiling() -> None:
            (spark.read.format("ceiling").option("rows", rows).option("partitions", args.partitions)
             .option("size", size).load().write.format("noop").mode("overwrite").save())

        read_ceiling()  # warm-up
        cv, cp = _abba(read_ceiling, read_parquet, args.repeat)
        figures.update(read_ceiling=min(cv))
        figures.setdefault("read_parquet", min(cp))
        pair_ratios["ceiling_vs_parquet"] = sorted(p / v for v, p in zip(cv, cp, strict=True))
    if args.cases != "ceiling":
        n = spark.read.format("vellum").option("metadataServiceUri", uri).option("name", f"bench/{tag}/w0").load().count()
        assert n == rows, f"read back {n} rows, wrote {rows}"
    df.unpersist()
    return figures, pair_ratios, load


def _summary(rows: int, args: Any, figures: dict[str, float], pair_ratios: dict[str, list[float]],
             load: float) -> dict[str, Any]:
    size = args.payload_bytes
    mb = rows * size / 2**20
    result: dict[str, Any] = {"rows": rows, "payload_bytes": size, "payload": args.payload, "ensemble": args.ensemble,
                              "load_1min": round(load, 1)}
    result.update({k: {"seconds": round(v, 3), "rows_per_s": round(rows / v), "mib_per_s": round(mb / v, 1)}
                   for k, v in figures.items()})
    result["ratios"] = {k: round(statistics.median(v), 3) for k, v in pair_ratios.items()}
    result["ratio_range"] = {k: [round(v[0], 3), round(v[-1], 3)] for k, v in pair_ratios.items()}
    return result


def _print(result: dict[str, Any], args: Any) -> None:
    print(f"rows={result['rows']} payload={args.payload_bytes} B {args.payload} partitions={args.partitions} "
          f"ensemble={args.ensemble} entryMaxRows={args.entry_max_rows or 'default'} writer={args.writer} "
          f"({args.repeat} ABBA runs; rows/s: best run; load {result['load_1min']})")
    print("| path | seconds | rows/s | MiB/s |\n|---|---|---|---|")
    for k in ("write_vellum", "write_parquet", "read_vellum", "read_parquet", "read_ceiling"):
        if k not in result:
            continue
        r = result[k]
        print(f"| {k} | {r['seconds']} | {r['rows_per_s']:,} | {r['mib_per_s']} |")
    for k, label in (("read_vs_parquet", "read vellum/parquet"), ("write_vs_parquet", "write vellum/parquet"),
                     ("ceiling_vs_parquet", "ceiling (Python source from memory)/parquet"),
                     ("control_read_parquet_aa", "A/A control read parquet/parquet"),
                     ("control_write_parquet_aa", "A/A control write parquet/parquet")):
        if k not in result["ratio_range"]:
            continue
        lo, hi = result["ratio_range"][k]
        print(f"{label} = {result['ratios'][k]}x (median of {args.repeat} pairs, {lo}..{hi})")


if __name__ == "__main__":
    main()
