"""Vellum against Redis 7 (appendonly yes, appendfsync always), side by side (docs/benchmarks.md).

Both acknowledge a write only after fdatasync. Both are driven from this Python process with
64 writes in flight and 1 KiB payloads: Vellum through its asyncio client, Redis through
redis-py (hiredis parser) doing XADD of the same payloads over 64 pooled connections.
Method (docs/benchmarks.md, "How we measure"): start both once, keep connections open, alternate
~1 s slices in ABBA order for N pairs, report the median of per-pair ratios with p10..p90,
after an A/A control (Vellum against itself). Also recorded per configuration: entries per
fsync (bookie journal counters), CPU seconds per 1,000 entries of the server processes
(/proc/<pid>/stat) and of the client (this process, which runs one client per slice), 64 KiB MB/s against the disk's group-commit limit, and tailing-read
latency (append -> visible at a long-polling reader).

    ./run bench redis_compare [--pairs 30] [--seconds 1.0] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
import uvloop

sys.path.insert(0, str(Path(__file__).parent))
from bench_common import cpu_seconds, emit, pct

from vellum.client import BookKeeper
from vellum.testing.local_cluster import LocalCluster

Slice = Callable[[float], Awaitable[tuple[int, float, list[float]]]]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    def __init__(self, base: Path) -> None:
        self.port = _free_port()
        self.dir = base / "redis"
        self.dir.mkdir(parents=True)
        exe = shutil.which("redis-server")
        if exe is None:
            raise SystemExit("redis-server is not installed (./run installs Debian's redis-server)")
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir), "--appendonly", "yes",
             "--appendfsync", "always", "--save", "", "--protected-mode", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)


async def vellum_slice_factory(bk: BookKeeper, e: int, w: int, a: int, size: int, inflight: int) -> Slice:
    lh = await bk.create_ledger(ensemble_size=e, write_quorum_size=w, ack_quorum_size=a)
    payload = os.urandom(size)

    async def run(seconds: float) -> tuple[int, float, list[float]]:
        sem = asyncio.Semaphore(inflight)
        lat: list[float] = []
        done = 0

        def on_done(fut: asyncio.Future[int], t: float) -> None:
            nonlocal done
            sem.release()
            if fut.exception() is None:
                done += 1
                lat.append(time.perf_counter() - t)

        t0 = time.perf_counter()
        end = t0 + seconds
        n = 0
        while time.perf_counter() < end:
            await sem.acquire()
            t = time.perf_counter()
            lh.append_async(payload).add_done_callback(lambda f, t=t: on_done(f, t))
            n += 1
            if n % 64 == 0:
                await asyncio.sleep(0)
        for _ in range(inflight):
            await sem.acquire()
        return done, time.perf_counter() - t0, lat

    return run


async def redis_slice_factory(port: int, size: int, inflight: int) -> tuple[Slice, Any]:
    pool = aioredis.ConnectionPool(host="127.0.0.1", port=port, max_connections=inflight)
    client = aioredis.Redis(connection_pool=pool)
    await client.ping()
    payload = os.urandom(size)

    async def run(seconds: float) -> tuple[int, float, list[float]]:
        lat: list[float] = []
        end = time.perf_counter() + seconds
        done = 0

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < end:
                t = time.perf_counter()
                await client.xadd("bench", {"p": payload}, maxlen=100_000, approximate=True)
                lat.append(time.perf_counter() - t)
                done += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(inflight)))
        return done, time.perf_counter() - t0, lat

    return run, client


async def abba(a: Slice, b: Slice, pairs: int, seconds: float, a_pids: list[int], b_pids: list[int]) -> dict[str, Any]:
    ratios, ra, rb, p99a, p99b = [], [], [], [], []
    cpu = {"a": 0.0, "b": 0.0}
    client_cpu = {"a": 0.0, "b": 0.0}  # this process: the client driving the slice (only one runs)
    count = {"a": 0, "b": 0}
    for i in range(pairs):
        order = [("a", a), ("b", b)] if i % 2 == 0 else [("b", b), ("a", a)]
        rates: dict[str, float] = {}
        for name, fn in order:
            pids = a_pids if name == "a" else b_pids
            c0 = sum(cpu_seconds(p) for p in pids)
            k0 = time.process_time()
            n, el, lat = await fn(seconds)
            client_cpu[name] += time.process_time() - k0
            cpu[name] += sum(cpu_seconds(p) for p in pids) - c0
            count[name] += n
            rates[name] = n / el
            (p99a if name == "a" else p99b).append(pct(lat, 0.99) * 1e3)
        ra.append(rates["a"])
        rb.append(rates["b"])
        ratios.append(rates["a"] / rates["b"])
    return {
        "a_median_per_s": statistics.median(ra),
        "b_median_per_s": statistics.median(rb),
        "ratio_a_over_b_median": statistics.median(ratios),
        "ratio_p10": pct(ratios, 0.1),
        "ratio_p90": pct(ratios, 0.9),
        "a_p99_ms_median": statistics.median(p99a),
        "b_p99_ms_median": statistics.median(p99b),
        "a_cpu_s_per_1000": 1000 * cpu["a"] / max(1, count["a"]),
        "b_cpu_s_per_1000": 1000 * cpu["b"] / max(1, count["b"]),
        "a_client_cpu_s_per_1000": 1000 * client_cpu["a"] / max(1, count["a"]),
        "b_client_cpu_s_per_1000": 1000 * client_cpu["b"] / max(1, count["b"]),
        "total_cpu_a_over_b": ((cpu["a"] + client_cpu["a"]) / max(1, count["a"]))
        / max(1e-12, (cpu["b"] + client_cpu["b"]) / max(1, count["b"])),
    }


def bookie_pids(cluster: LocalCluster) -> list[int]:
    return [b.proc.pid for b in cluster._bookies if b.proc is not None]


def journal_counters(cluster: LocalCluster) -> tuple[float, float]:
    fsyncs = records = 0.0
    for i in range(len(cluster.bookie_ids)):
        for line in str(cluster.http_get(i, "/metrics")).splitlines():
            if line.startswith("bookie_journal_JOURNAL_SYNC_total"):
                fsyncs += float(line.split()[-1])
            elif line.startswith("bookie_journal_JOURNAL_SYNCED_RECORDS_total"):
                records += float(line.split()[-1])
    return fsyncs, records


async def tail_latency(bk: BookKeeper, reader: BookKeeper, rate: float, seconds: float) -> dict[str, float]:
    """A writer appends at ``rate`` entries/s; a second client tails with long polls. Latency of
    an entry = the moment the reader learns it is confirmed (its LAC passes it) minus the moment
    the writer called append. Readers learn the LAC from the entries that follow (piggy-backed),
    as in BookKeeper, so a steady stream is what this measures."""
    lh = await bk.create_ledger(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1)
    rh = await reader.open_ledger(lh.ledger_id, recovery=False)
    sent: list[float] = []
    lat: list[float] = []
    total = int(rate * seconds)

    async def write() -> None:
        t0 = time.perf_counter()
        for i in range(total):
            delay = t0 + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            sent.append(time.perf_counter())
            lh.append_async(b"x" * 100)

    async def tail() -> None:
        seen = -1
        # The writer's piggy-backed LAC trails its last sends by the entries still in flight, so
        # the final few entries are confirmed only by close; stop short of them.
        while seen < total - 100:
            lac = await rh.wait_for_lac(seen, 5.0)
            now = time.perf_counter()
            for e in range(seen + 1, lac + 1):
                lat.append(now - sent[e])
            seen = max(seen, lac)

    await asyncio.gather(write(), asyncio.wait_for(tail(), seconds + 30))
    await lh.close()
    return {"p50_ms": pct(lat, 0.5) * 1e3, "p99_ms": pct(lat, 0.99) * 1e3, "entries": float(len(lat)),
            "rate_per_s": rate}


def plain_fsync_limit(base: Path, size: int, inflight: int, seconds: float) -> float:
    """MB/s of a plain write+fdatasync loop in batches of ``inflight`` entries."""
    buf = os.urandom(size) * inflight
    path = base / "plain.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        os.write(fd, buf)
        os.fdatasync(fd)
        n += len(buf)
    os.close(fd)
    path.unlink()
    return n / (time.perf_counter() - t0) / 1e6


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    report: dict[str, Any] = {"pairs": args.pairs, "slice_seconds": args.seconds, "inflight": args.inflight}
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        base = Path(tmp)
        redis_server = RedisServer(base)
        try:
            for label, bookies, (e, w, a) in (("1 bookie E=W=A=1", 1, (1, 1, 1)), ("3 bookies E=3 W=3 A=2", 3, (3, 3, 2))):
                with LocalCluster(base / f"vellum-{bookies}", bookies=bookies) as cluster:
                    async with BookKeeper(cluster.metadata_uri) as bk:
                        v1 = await vellum_slice_factory(bk, e, w, a, 1024, args.inflight)
                        v2 = await vellum_slice_factory(bk, e, w, a, 1024, args.inflight)
                        r, rclient = await redis_slice_factory(redis_server.port, 1024, args.inflight)
                        pids = bookie_pids(cluster)
                        if bookies == 1:
                            report["aa_control"] = await abba(v1, v2, max(6, args.pairs // 3), args.seconds, pids, pids)
                            print("A/A done", file=sys.stderr)
                        f0, r0 = journal_counters(cluster)
                        res = await abba(v1, r, args.pairs, args.seconds, pids, [redis_server.proc.pid])
                        f1, r1 = journal_counters(cluster)
                        res["vellum_entries_per_fsync"] = (r1 - r0) / max(1.0, f1 - f0)
                        report[f"vellum_vs_redis: {label}"] = res
                        print(f"{label} done", file=sys.stderr)
                        if bookies == 1:
                            big = await vellum_slice_factory(bk, 1, 1, 1, 65536, args.inflight)
                            n, el, _ = await big(max(2.0, args.seconds * 3))
                            report["vellum_64KiB_MB_per_s"] = n * 65536 / el / 1e6
                            report["plain_fsync_64KiB_x64_MB_per_s"] = plain_fsync_limit(base, 65536, args.inflight, 2.0)
                            async with BookKeeper(cluster.metadata_uri) as reader:
                                report["tailing_read_latency"] = await tail_latency(bk, reader, 2000.0, 3.0)
                        await rclient.aclose()
        finally:
            redis_server.stop()
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=30)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--inflight", type=int, default=64)
    ap.add_argument("--dir", default="data/bench")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    report = uvloop.run(main_async(args))
    emit(report, as_json=args.json)


if __name__ == "__main__":
    main()
