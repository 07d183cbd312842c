"""One Vellum bookie against the minimal group-commit server (target 1 of docs/benchmarks.md), side by side.

Both get the same raw BookKeeper v2 ADD frames (1 KiB entries by default, CRC32C digests, one
ledger, increasing entry ids) from one client connection with ``--inflight`` requests in flight,
so the client's cost is the same on both sides. Interleaved slices of ``--seconds`` in ABBA
order, ``--pairs`` pairs; reported: acks per second of each, the median per-pair ratio
(bookie / minimal) with p10..p90, p50/p99 latencies, and an A/A control (the bookie against
itself). Server CPU seconds per 1,000 acks are read from /proc.

    ./run bench bookie_vs_group_commit [--pairs 10] [--seconds 1.0] [--size 1024] [--json]

``--versus-src DIR`` also starts a second one-bookie cluster whose bookie runs the ``vellum``
package found in ``DIR`` (e.g. an export of the previous commit's ``src``) and compares the two
bookies directly (ABBA, same client): the before/after ratio of a change, measured in one run.
``--versus-conf KEY VALUE`` does the same with a second bookie that differs in its settings.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).parent))
from bench_common import cpu_seconds, emit, pct

from vellum.bookie.assembly import memory_limit_bytes
from vellum.config import ServerConfig, build_config
from vellum.format.entry import DigestManager, DigestType, master_key
from vellum.testing.local_cluster import LocalCluster

Slice = Callable[[float], Awaitable[tuple[int, float, list[float]]]]
_ADD_HEADER = struct.pack(">i", (2 << 24) | (1 << 16))
_RESP = struct.Struct(">iiiqq")


class AddClient(asyncio.Protocol):
    """Pipelined raw ADDs on one connection; answers matched by entry id."""

    def __init__(self, ledger_id: int, size: int) -> None:
        self.ledger_id = ledger_id
        self.digest = DigestManager(ledger_id, DigestType.CRC32C, b"pw")
        self.key = master_key(b"pw")
        self.payload = os.urandom(size)
        self.next_entry = 0
        self.sent: dict[int, float] = {}
        self.buf = bytearray()
        self.latencies: list[float] = []
        self.acked = 0
        self.window: asyncio.Semaphore | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def frame(self) -> bytes:
        e = self.next_entry
        self.next_entry += 1
        entry = self.digest.compute(e, e - 1, 0, self.payload)
        body_len = 4 + 20 + len(entry)
        self.sent[e] = time.perf_counter()
        return struct.pack(">i", body_len) + _ADD_HEADER + self.key + entry

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos, end, now = 0, len(buf), time.perf_counter()
        while end - pos >= _RESP.size:
            _n, _h, rc, _ledger, entry = _RESP.unpack_from(buf, pos)
            pos += _RESP.size
            if rc != 0:
                raise RuntimeError(f"ADD {entry} answered rc={rc}")
            self.latencies.append(now - self.sent.pop(entry))
            self.acked += 1
            assert self.window is not None
            self.window.release()
        del buf[:pos]


async def connect(port: int, ledger_id: int, size: int) -> AddClient:
    loop = asyncio.get_running_loop()
    _t, proto = await loop.create_connection(lambda: AddClient(ledger_id, size), "127.0.0.1", port)
    return proto


def slice_of(client: AddClient, inflight: int) -> Slice:
    async def run(seconds: float) -> tuple[int, float, list[float]]:
        client.window = asyncio.Semaphore(inflight)
        client.latencies, client.acked = [], 0
        assert client.transport is not None
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            await client.window.acquire()
            client.transport.write(client.frame())
        for _ in range(inflight):
            await client.window.acquire()
        return client.acked, time.perf_counter() - t0, client.latencies

    return run


async def abba(a: Slice, b: Slice, pairs: int, seconds: float, a_pid: int, b_pid: int) -> dict[str, Any]:
    ratios, ra, rb, p99a, p99b, p50a, p50b = [], [], [], [], [], [], []
    cpu = {"a": 0.0, "b": 0.0}
    count = {"a": 0, "b": 0}
    for i in range(pairs):
        order = [("a", a, a_pid), ("b", b, b_pid)] if i % 2 == 0 else [("b", b, b_pid), ("a", a, a_pid)]
        rates = {}
        for name, fn, pid in order:
            c0 = cpu_seconds(pid)
            n, el, lat = await fn(seconds)
            cpu[name] += cpu_seconds(pid) - c0
            count[name] += n
            rates[name] = n / el
            (p99a if name == "a" else p99b).append(pct(lat, 0.99) * 1e3)
            (p50a if name == "a" else p50b).append(pct(lat, 0.5) * 1e3)
        ra.append(rates["a"])
        rb.append(rates["b"])
        ratios.append(rates["a"] / rates["b"])
    return {
        "a_median_per_s": statistics.median(ra), "b_median_per_s": statistics.median(rb),
        "ratio_a_over_b_median": statistics.median(ratios), "ratio_p10": pct(ratios, 0.1),
        "ratio_p90": pct(ratios, 0.9),
        "a_p50_ms": statistics.median(p50a), "b_p50_ms": statistics.median(p50b),
        "a_p99_ms": statistics.median(p99a), "b_p99_ms": statistics.median(p99b),
        "a_cpu_s_per_1000": 1000 * cpu["a"] / max(1, count["a"]),
        "b_cpu_s_per_1000": 1000 * cpu["b"] / max(1, count["b"]),
    }


def rss_report(pid: int, conf: dict[str, str]) -> dict[str, float]:
    """The bookie's peak RSS (VmHWM) against write cache + read-ahead cache + 200 MiB."""
    config = build_config(ServerConfig, conf, source="benchmark settings")
    status = Path(f"/proc/{pid}/status").read_text()
    peak_kib = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:"))
    mib = 1024 * 1024
    write_cache = config.write_cache_max_bytes(memory_limit_bytes()) / mib
    read_cache = config.db_storage_read_ahead_cache_max_size_mb
    return {"peak_rss_mib": peak_kib / 1024, "write_cache_mib": write_cache, "read_cache_mib": float(read_cache),
            "bound_mib": write_cache + read_cache + 200, "peak_over_bound": peak_kib / 1024 / (write_cache + read_cache + 200)}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    report: dict[str, Any] = {"pairs": args.pairs, "slice_seconds": args.seconds, "size": args.size,
                              "inflight": args.inflight}
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        base = Path(tmp)
        minimal = subprocess.Popen(
            [sys.executable, str(Path(__file__).parent / "group_commit_server.py"), "--file", str(base / "gc.bin")],
            stdout=subprocess.PIPE, text=True)
        try:
            assert minimal.stdout is not None
            port = int(minimal.stdout.readline().split()[1])
            with LocalCluster(base / "vellum", bookies=1, bookie_conf=dict(args.conf)) as cluster:
                bookie_port = int(cluster.bookie_ids[0].rsplit(":", 1)[1])
                bookie_pid = cluster._bookies[0].proc.pid  # type: ignore[union-attr]
                v1 = slice_of(await connect(bookie_port, 1, args.size), args.inflight)
                v2 = slice_of(await connect(bookie_port, 2, args.size), args.inflight)
                g = slice_of(await connect(port, 1, args.size), args.inflight)
                await v1(0.5)
                await g(0.5)
                report["aa_control (bookie vs bookie)"] = await abba(v1, v2, max(4, args.pairs // 2), args.seconds,
                                                                     bookie_pid, bookie_pid)
                report["bookie (a) vs minimal group commit (b)"] = await abba(v1, g, args.pairs, args.seconds,
                                                                              bookie_pid, minimal.pid)
                if args.versus_src or args.versus_conf:
                    report["bookie (a) vs the --versus bookie (b)"] = await versus(args, base, v1, bookie_pid)
                report["memory (target 4)"] = rss_report(bookie_pid, dict(args.conf))
        finally:
            minimal.terminate()
            minimal.wait(10)
    return report


async def versus(args: argparse.Namespace, base: Path, a: Slice, a_pid: int) -> dict[str, Any]:
    """ABBA of the bookie against a bookie running the code in ``--versus-src`` and/or with the
    extra settings of ``--versus-conf``."""
    saved = os.environ.get("PYTHONPATH")
    if args.versus_src:
        os.environ["PYTHONPATH"] = str(Path(args.versus_src).resolve())  # inherited by the bookie process
    try:
        other = LocalCluster(base / "versus", bookies=1, bookie_conf=dict(args.conf + args.versus_conf))
        other.start()
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved
    try:
        port = int(other.bookie_ids[0].rsplit(":", 1)[1])
        pid = other._bookies[0].proc.pid  # type: ignore[union-attr]
        b = slice_of(await connect(port, 1, args.size), args.inflight)
        await b(0.5)
        return await abba(a, b, args.pairs, args.seconds, a_pid, pid)
    finally:
        other.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--inflight", type=int, default=64)
    ap.add_argument("--conf", nargs=2, action="append", default=[], metavar=("KEY", "VALUE"),
                    help="extra bookie configuration")
    ap.add_argument("--dir", default="data/bench")
    ap.add_argument("--versus-src", default=None, metavar="DIR",
                    help="also compare with a bookie running the vellum package in DIR (before/after)")
    ap.add_argument("--versus-conf", nargs=2, action="append", default=[], metavar=("KEY", "VALUE"),
                    help="also compare with a bookie that has these extra settings")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    report = uvloop.run(main_async(args))
    emit(report, as_json=args.json)


if __name__ == "__main__":
    main()
