"""End-to-end latency: a producer's ``write()`` to the row arriving in a streaming query's ``foreachBatch``.

Starts a LocalCluster (3 bookies, loopback; or uses ``--metadata-uri``), opens a blocking
:class:`vellum.client.producer_blocking.Producer` on a fresh named ledger, and starts a streaming
query ``spark.readStream.format("vellum").option("name", ...)`` with a processing-time trigger of
0 s and a ``foreachBatch`` that notes the wall-clock time it was called and collects the
8-byte send time (``time.time_ns()`` of the ``write()`` call) at the head of every row's value.
A producer thread writes ``--rate`` records/s of ``--payload-bytes`` each for ``--seconds``;
records written in the first ``--warmup`` seconds are not counted (the first micro-batches pay
for Python workers and connections). Then it waits (bounded by ``--drain-s``) until every
record arrived, and prints p50/p95/p99/max of latency (ms) and the records/s achieved.

``--master``: ``local[2]`` (default), ``standalone`` (starts a master and a worker, 2 cores,
from pyspark's own ``spark-class`` on 127.0.0.1, as tests/spark/test_cluster.py does; this
process is the driver), or a ``spark://`` URL.

    .venv/bin/python benchmarks/spark_latency.py --rate 10000 --seconds 30
    .venv/bin/python benchmarks/spark_latency.py --master standalone
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[1] / "src"


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(SPARK_HOME=str(_spark_home()), SPARK_LOCAL_IP="127.0.0.1", SPARK_DAEMON_MEMORY="256m")
    return env


class Standalone:
    """A master and one worker (2 cores) from pyspark's ``spark-class``; stopped by ``stop()``."""

    def __init__(self, base: Path) -> None:
        from vellum.testing.local_cluster import free_port

        self.base = base
        self.port, self.ui = free_port(), free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen[bytes]] = []
        cls = str(_spark_home() / "bin" / "spark-class")
        for name, args in (("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                       "--port", str(self.port), "--webui-port", str(self.ui)]),
                           ("worker", ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                                       "--cores", "2", "--memory", "1g", "--webui-port", str(free_port()),
                                       "--work-dir", str(base / "work"), self.url])):
            with open(base / f"{name}.log", "wb") as out:
                self.procs.append(subprocess.Popen([cls, *args], stdout=out, stderr=subprocess.STDOUT, env=_env(),
                                                   start_new_session=True))
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.ui}/json/", timeout=2) as r:
                    if json.load(r).get("aliveworkers", 0) >= 1:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"standalone master/worker did not come up; see {base}/*.log")

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


def _session(master: str) -> Any:
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    b = (SparkSession.builder.master(master).appName("vellum-spark-latency")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.shuffle.partitions", "2").config("spark.driver.memory", "1g")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1"))
    if master.startswith("spark://"):
        b = (b.config("spark.executor.memory", "512m").config("spark.cores.max", "2")
             .config("spark.executorEnv.PYTHONPATH", str(SRC)))
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    from vellum.spark import register

    register(spark)
    return spark


def _percentile(sorted_ms: list[float], q: float) -> float:
    if not sorted_ms:
        return float("nan")
    return sorted_ms[min(len(sorted_ms) - 1, max(0, round(q * len(sorted_ms)) - 1))]


def _produce(uri: str, name: str, rate: int, seconds: float, payload: int, linger_ms: float,
             api: str) -> dict[str, Any]:
    """Write ``rate`` records/s for ``seconds`` (paced in 1 ms slots, catching up when late);
    run in a process of its own (``--produce``), as an application would be."""
    from vellum.client.blocking import BookKeeper
    from vellum.client.producer import ProducerSettings

    pad = b"x" * max(0, payload - 8)
    pack = struct.Struct(">q").pack
    settings = ProducerSettings(linger_ms=linger_ms)
    stats: dict[str, Any] = {}
    if api == "blocking":
        from vellum.client.producer_blocking import Producer

        with BookKeeper(uri) as bk, Producer.open(bk, name, settings=settings) as producer:
            t0 = time.monotonic()
            written = 0
            last = None
            while (elapsed := time.monotonic() - t0) < seconds:
                due = min(int(elapsed * rate) + 1, int(seconds * rate))
                while written < due:
                    last = producer.write(pack(time.time_ns()) + pad)
                    written += 1
                time.sleep(0.001)
            if last is not None:
                last.result(timeout=60)
            stats.update(written=written, produce_s=time.monotonic() - t0)
        return stats

    import asyncio

    from vellum.client.bookkeeper import BookKeeper as AsyncBookKeeper
    from vellum.client.named import NamedLedgers
    from vellum.client.producer import Producer as AsyncProducer

    async def run() -> None:
        async with AsyncBookKeeper(uri) as abk:
            producer = await AsyncProducer.open(NamedLedgers(abk), name, settings=settings)
            t0 = time.monotonic()
            written = 0
            last = None
            while (elapsed := time.monotonic() - t0) < seconds:
                due = min(int(elapsed * rate) + 1, int(seconds * rate))
                while written < due:
                    last = await producer.write(pack(time.time_ns()) + pad)
                    written += 1
                await asyncio.sleep(0.001)
            if last is not None:
                await last
            stats.update(written=written, produce_s=time.monotonic() - t0)
            await producer.close()

    asyncio.run(run())
    return stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--master", default="local[2]", help="local[N], 'standalone' (started here), or spark://host:port")
    ap.add_argument("--metadata-uri", default=None, help="an existing cluster's metadataServiceUri (default: start one)")
    ap.add_argument("--rate", type=int, default=10_000, help="records/s the producer writes")
    ap.add_argument("--seconds", type=float, default=40.0, help="how long the producer writes")
    ap.add_argument("--warmup", type=float, default=10.0, help="records of the first seconds are not counted")
    ap.add_argument("--payload-bytes", type=int, default=100)
    ap.add_argument("--linger-ms", type=float, default=5.0, help="producer linger_ms")
    ap.add_argument("--drain-s", type=float, default=60.0, help="longest wait for the last records after writing")
    ap.add_argument("--source-option", action="append", default=[], metavar="KEY=VALUE",
                    help="extra option of the vellum stream source (repeatable), e.g. lacPollIntervalMs=100")
    ap.add_argument("--producer", choices=("blocking", "async"), default="blocking",
                    help="the producer API the application uses (producer_blocking.Producer or the asyncio one)")
    ap.add_argument("--verbose", action="store_true", help="a line per micro-batch")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--produce", help=argparse.SUPPRESS)  # internal: run as the producer process
    args = ap.parse_args()
    if args.produce:
        print(json.dumps(_produce(*json.loads(args.produce))))
        return
    if args.rate <= 0 or args.seconds <= 0 or args.seconds <= args.warmup:
        ap.error("--rate and --seconds must be > 0 and --seconds above --warmup")

    from vellum.client.blocking import BookKeeper
    from vellum.testing.local_cluster import LocalCluster

    base = Path(tempfile.mkdtemp(prefix="vellum-spark-latency-"))
    cluster = standalone = spark = query = None
    try:
        uri = args.metadata_uri
        if uri is None:
            cluster = LocalCluster(base / "cluster", bookies=3)
            cluster.__enter__()
            uri = cluster.metadata_uri
        master = args.master
        if master == "standalone":
            standalone = Standalone(base)
            master = standalone.url
        spark = _session(master)
        name = f"latency/{uuid.uuid4().hex[:8]}"
        bk = BookKeeper(uri)
        # The name must exist before the stream starts (the source reads from its start).
        from vellum.client.producer_blocking import Producer

        with Producer.open(bk, name) as p:
            p.write(struct.pack(">q", time.time_ns())).result(timeout=30)

        arrivals: list[tuple[float, list[int]]] = []
        seeded = threading.Event()
        batch_sizes: list[int] = []

        def on_batch(df: Any, batch_id: int) -> None:
            arrived = time.time_ns()
            # Arrow, not Rows: the benchmark's own cost per row stays small
            col = df.selectExpr("substring(value, 1, 8) as s").toArrow().column("s")
            sent = [int.from_bytes(v, "big", signed=True) for v in col.to_pylist()]
            arrivals.append((arrived, sent))
            batch_sizes.append(len(sent))
            if sent:
                seeded.set()
            if args.verbose:
                print(f"batch {batch_id}: {len(sent)} rows, foreachBatch {(time.time_ns() - arrived) / 1e6:.0f} ms",
                      flush=True)

        reader = (spark.readStream.format("vellum").option("metadataServiceUri", uri).option("name", name)
                  .option("startingOffsets", "earliest"))  # the seed record: the first batch warms the read path
        for kv in args.source_option:
            k, _, v = kv.partition("=")
            reader = reader.option(k, v)
        query = (reader.load().writeStream.foreachBatch(on_batch).trigger(processingTime="0 seconds")
                 .option("checkpointLocation", str(base / "ckpt")).start())
        # let the first micro-batch (which reads the seed record) run before the clock starts
        if not seeded.wait(180):
            raise RuntimeError("the first micro-batch (the seed record) did not arrive within 180 s")

        t_start = time.time_ns()
        # The producer is an application of its own: a process, not a thread sharing the
        # driver's GIL with foreachBatch.
        done = subprocess.run([sys.executable, __file__, "--produce", json.dumps(
            [uri, name, args.rate, args.seconds, args.payload_bytes, args.linger_ms, args.producer])],
            capture_output=True, text=True, timeout=args.seconds + 120, env={**os.environ, "PYTHONPATH": str(SRC)})
        if done.returncode != 0:
            raise RuntimeError(f"producer failed: {done.stderr[-3000:]}")
        stats = json.loads(done.stdout.strip().splitlines()[-1])
        expected = stats.get("written", 0) + 1
        deadline = time.monotonic() + args.drain_s
        while sum(batch_sizes) < expected and time.monotonic() < deadline:
            time.sleep(0.05)
        durations: dict[str, list[float]] = {}
        for prog in query.recentProgress:
            if args.verbose:
                print(f"progress batch {prog.batchId}: rows={prog.numInputRows} durationMs={prog.durationMs}")
            if prog.numInputRows:
                for k, v in (prog.durationMs or {}).items():
                    durations.setdefault(k, []).append(float(v))
        query.stop()
        query = None
        bk.close()

        counted_from = t_start + int(args.warmup * 1e9)
        lat_ms = sorted((arrived - s) / 1e6 for arrived, sends in arrivals for s in sends if s >= counted_from)
        received = sum(batch_sizes) - 1
        result = {
            "master": args.master, "rate_asked": args.rate, "seconds": args.seconds,
            "written": stats.get("written", 0), "received": received,
            "records_per_s": round(stats.get("written", 0) / stats.get("produce_s", float("inf")), 1),
            "batches": len(batch_sizes), "counted": len(lat_ms),
            "p50_ms": round(_percentile(lat_ms, 0.50), 1), "p95_ms": round(_percentile(lat_ms, 0.95), 1),
            "p99_ms": round(_percentile(lat_ms, 0.99), 1), "max_ms": round(lat_ms[-1], 1) if lat_ms else None,
            "mean_rows_per_batch": round(statistics.mean(batch_sizes), 1) if batch_sizes else 0,
            "source_options": args.source_option, "producer": args.producer, "linger_ms": args.linger_ms,
            "batch_duration_ms_median": {k: statistics.median(v) for k, v in sorted(durations.items())},
        }
    finally:
        if query is not None:
            query.stop()
        if spark is not None:
            spark.stop()
        if standalone is not None:
            standalone.stop()
        if cluster is not None:
            cluster.__exit__(None, None, None)
        shutil.rmtree(base, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"master={result['master']} rate asked={args.rate}/s achieved={result['records_per_s']}/s "
          f"written={result['written']} received={result['received']} batches={result['batches']} "
          f"(~{result['mean_rows_per_batch']} rows/batch) counted={result['counted']} "
          f"source options={args.source_option or 'defaults'}")
    print("| p50 ms | p95 ms | p99 ms | max ms |\n|---|---|---|---|")
    print(f"| {result['p50_ms']} | {result['p95_ms']} | {result['p99_ms']} | {result['max_ms']} |")
    print("median ms per micro-batch (Spark's durationMs):",
          ", ".join(f"{k}={v:g}" for k, v in result["batch_duration_ms_median"].items()))


if __name__ == "__main__":
    main()
