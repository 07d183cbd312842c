"""GC and compaction benchmark (docs/gc.md), every figure measured in the same run:

(a) sequential write rate: a plain Python loop appending 1 MiB chunks and fsyncing every 8 MiB
    (the disk's rate as Python sees it), then compaction throughput: MB/s of live data moved
    by a major compaction (unthrottled) of logs that are 50% dead, and the ratio of the two;
(b) foreground adds (a real bookie: journal fsync + write cache + flushes) while compaction runs
    with byte throttling on, as a ratio of the same workload without compaction. Slices
    alternate A (no compaction) / B (compaction running) in ABBA order; a B slice whose
    compaction ran out of work is reported;
(c) the add path with entry log per ledger at 1, 100 and 1,000 concurrently written ledgers as a
    ratio of the shared-log mode (ABBA slices, small write cache so flushes happen in-slice).

    ./run bench gc_bench [--seconds 2] [--pairs 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_bookie import local_bookie

from vellum.bookie.assembly import OpenedBookie
from vellum.format.entry import DigestManager, DigestType, master_key
from vellum.storage.gc import GarbageCollectorThread, GcSettings
from vellum.storage.ledger_storage import LedgerStorage

MB = 1 << 20


def sequential_write_mb_s(path: Path, total_mb: int = 64) -> float:
    chunk = os.urandom(MB)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        t0 = time.perf_counter()
        for i in range(total_mb):
            os.write(fd, chunk)
            if i % 8 == 7:
                os.fsync(fd)
        os.fsync(fd)
        return total_mb / (time.perf_counter() - t0)
    finally:
        os.close(fd)
        os.unlink(path)


def _fill(storage: LedgerStorage, ledgers: range, entries: int, entry_size: int) -> None:
    payload = os.urandom(entry_size)
    for lid in ledgers:
        storage.set_master_key(lid, b"k")
    dms = {lid: DigestManager(lid, DigestType.CRC32C, b"") for lid in ledgers}
    for eid in range(entries):
        for lid in ledgers:
            storage.add_entry(dms[lid].compute(eid, eid - 1, 0, payload))
    storage.flush()
    storage.entry_logger.rotate()


def compaction_throughput(base: Path, total_mb: int, entry_size: int) -> dict:
    storage = LedgerStorage(
        base / "compact", log_size_limit=8 * MB, write_cache_max_bytes=32 * MB,
        read_cache_max_bytes=0, read_ahead_batch_size=0, max_throttle_time_ms=60000,
    )
    try:
        ledgers = range(1, 21)
        entries = total_mb * MB // entry_size // len(ledgers)
        _fill(storage, ledgers, entries, entry_size)
        for lid in ledgers[::2]:
            storage.delete_ledger(lid)
        gc = GarbageCollectorThread(
            storage, GcSettings(is_throttle_by_bytes=True, compaction_rate_by_bytes=1 << 40)
        )
        t0 = time.perf_counter()
        report = gc.run_once(force=True)
        elapsed = time.perf_counter() - t0
        moved = sum(c.bytes_moved for c in report.compactions)
        return {"live_mb_moved": moved / MB, "seconds": elapsed, "mb_per_s": moved / MB / elapsed,
                "logs_compacted": len(report.compactions)}
    finally:
        storage.close()


class Adds:
    """A real bookie driven with ``inflight`` adds in flight, round robin over ``ledgers``."""

    def __init__(self, base: Path, *, ledgers: int, entry_size: int, inflight: int, **overrides: object) -> None:
        self.opened: OpenedBookie = local_bookie(base, **overrides)
        self.key = master_key(b"")
        self.ledgers = ledgers
        self.dms = [DigestManager(100_000 + i, DigestType.CRC32C, b"") for i in range(ledgers)]
        self.payload = os.urandom(entry_size)
        self.inflight = inflight
        self.next_entry = [0] * ledgers
        self.turn = 0

    @property
    def storage(self) -> LedgerStorage:
        return self.opened.bookie.gc_threads[0].storage

    def slice(self, seconds: float) -> tuple[int, float]:
        bookie = self.opened.bookie
        sem = threading.Semaphore(self.inflight)
        acked = [0]
        errors: list[BaseException] = []

        def done(exc: BaseException | None) -> None:
            if exc is not None:
                errors.append(exc)
            else:
                acked[0] += 1
            sem.release()

        t0 = time.perf_counter()
        deadline = t0 + seconds
        while time.perf_counter() < deadline:
            sem.acquire()
            i = self.turn
            self.turn = (i + 1) % self.ledgers
            eid = self.next_entry[i]
            self.next_entry[i] += 1
            bookie.add_entry(self.dms[i].compute(eid, eid - 1, 0, self.payload), self.key, done)
        for _ in range(self.inflight):
            sem.acquire()
        elapsed = time.perf_counter() - t0
        for _ in range(self.inflight):
            sem.release()
        if errors:
            raise errors[0]
        return acked[0], elapsed

    def close(self) -> None:
        self.opened.close()


def abba(a: Callable[[], float], b: Callable[[], float], pairs: int) -> dict:
    ratios, ra, rb = [], [], []
    for i in range(pairs):
        order = [(a, ra), (b, rb)] if i % 2 == 0 else [(b, rb), (a, ra)]
        got = {}
        for fn, sink in order:
            rate = fn()
            sink.append(rate)
            got[id(sink)] = rate
        ratios.append(got[id(rb)] / got[id(ra)])
    return {"a_median_per_s": statistics.median(ra), "b_median_per_s": statistics.median(rb),
            "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios)}


def foreground_with_compaction(base: Path, seconds: float, pairs: int, entry_size: int, rate_bytes: int) -> dict:
    adds = Adds(base / "fg", ledgers=10, entry_size=entry_size, inflight=64,
                db_storage_write_cache_max_size_mb=16, log_size_limit_bytes=8 * MB, flush_interval_ms=1000)
    try:
        # Backlog: 50%-dead logs worth far more than the B slices can move at the throttled rate.
        backlog = range(1, 41)
        needed_mb = max(32, int(rate_bytes * seconds * pairs * 2 * 2 / MB))
        _fill(adds.storage, backlog, needed_mb * MB // entry_size // len(backlog), entry_size)
        for lid in backlog[::2]:
            adds.storage.delete_ledger(lid)
        settings = GcSettings(is_throttle_by_bytes=True, compaction_rate_by_bytes=rate_bytes)
        ran_dry = [0]

        def a() -> float:
            n, el = adds.slice(seconds)
            return n / el

        def b() -> float:
            gc = GarbageCollectorThread(adds.storage, settings)
            t = threading.Thread(target=gc.run_once, kwargs={"force": True})
            t.start()
            n, el = adds.slice(seconds)
            if not t.is_alive():
                ran_dry[0] += 1
            gc.stop()  # aborts the current log's copy: the backlog stays for the next slice
            t.join()
            return n / el

        out = abba(a, b, pairs)
        out["compaction_rate_by_bytes"] = rate_bytes
        out["b_slices_where_compaction_finished_early"] = ran_dry[0]
        return out
    finally:
        adds.close()


def entry_log_per_ledger(base: Path, seconds: float, pairs: int, entry_size: int, counts: list[int]) -> dict:
    out = {}
    for n in counts:
        common = dict(db_storage_write_cache_max_size_mb=8, flush_interval_ms=500, log_size_limit_bytes=64 * MB)
        shared = Adds(base / f"shared-{n}", ledgers=n, entry_size=entry_size, inflight=64, **common)
        per = Adds(base / f"elpl-{n}", ledgers=n, entry_size=entry_size, inflight=64,
                   entry_log_per_ledger_enabled=True, maximum_number_of_active_entry_logs=max(500, n + 1),
                   **common)
        try:
            def a(s: Adds = shared) -> float:
                k, el = s.slice(seconds)
                return k / el

            def b(p: Adds = per) -> float:
                k, el = p.slice(seconds)
                return k / el

            out[str(n)] = abba(a, b, pairs)
            out[str(n)]["entry_logs_written"] = len(per.storage.entry_logger.log_ids())
        finally:
            shared.close()
            per.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--entry-size", type=int, default=1024)
    ap.add_argument("--compaction-mb", type=int, default=64)
    ap.add_argument("--rate-bytes", type=int, default=8 * MB, help="compactionRateByBytes for (b)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="vellum-gc-bench-", dir=os.environ.get("BENCH_DIR")) as tmp:
        base = Path(tmp)
        result: dict = {}
        seq = sequential_write_mb_s(base / "seq.bin")
        comp = compaction_throughput(base, args.compaction_mb, args.entry_size)
        result["sequential_write_mb_s"] = seq
        result["compaction"] = {**comp, "ratio_to_sequential_write": comp["mb_per_s"] / seq}
        result["foreground_adds_during_compaction"] = foreground_with_compaction(
            base, args.seconds, args.pairs, args.entry_size, args.rate_bytes
        )
        result["entry_log_per_ledger_vs_shared"] = entry_log_per_ledger(
            base, args.seconds, args.pairs, args.entry_size, [1, 100, 1000]
        )
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"sequential write          {seq:8.1f} MB/s")
    print(f"compaction (live moved)   {comp['mb_per_s']:8.1f} MB/s  ({comp['live_mb_moved']:.1f} MB in "
          f"{comp['seconds']:.2f}s, {comp['mb_per_s'] / seq:.2f} of sequential write)")
    fg = result["foreground_adds_during_compaction"]
    print(f"adds during compaction    ratio {fg['ratio_median']:.2f} (min {fg['ratio_min']:.2f}, max "
          f"{fg['ratio_max']:.2f}); {fg['a_median_per_s']:.0f} vs {fg['b_median_per_s']:.0f} adds/s; "
          f"byte throttle {args.rate_bytes} B/s; early-finished B slices {fg['b_slices_where_compaction_finished_early']}")
    for n, r in result["entry_log_per_ledger_vs_shared"].items():
        print(f"entry log per ledger, {n:>4} ledgers: ratio {r['ratio_median']:.2f} (min {r['ratio_min']:.2f}, "
              f"max {r['ratio_max']:.2f}); shared {r['a_median_per_s']:.0f} adds/s, per-ledger "
              f"{r['b_median_per_s']:.0f} adds/s; {r['entry_logs_written']} logs")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
