"""CPU per entry of the Spark source's executor-side read, without Spark: reader and bookies.

Starts a LocalCluster (3 bookies, loopback), writes ``N`` one-record ``records-v1`` entries of
1 KiB into a 3,2,2 ledger (what the producer writes with ``batch_size_bytes=1``), then reads
them ``--repeat`` times as a read task does (``read_payloads`` in ranges of 4,096 entries,
READ_STRIDED on a striped ledger, then ``record_columns.unpack``), and prints the wall time and
the CPU seconds of this process (the reader) and of the bookies (from ``/proc``) per entry, with
the system (kernel) part of each: the loopback sends and receives.
``--rows-per-entry R`` packs R records of 1 KiB into each entry instead (the sink packs about
127 by default: ``entryMaxBytes`` 128 KiB) and also prints the reader's CPU per row; ranges are
then about 4,096 rows. Run the same script with ``PYTHONPATH`` at two trees, alternating, to
compare them.

    .venv/bin/python benchmarks/spark_read_cpu.py --entries 50000 --repeat 3
    .venv/bin/python benchmarks/spark_read_cpu.py --entries 2000 --rows-per-entry 127 --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path


def _cpu(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def _sum(pids: list[int]) -> tuple[float, float]:
    times = [_cpu(p) for p in pids]
    return sum(u for u, _ in times), sum(s for _, s in times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--entries", type=int, default=50_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rows-per-entry", type=int, default=1)
    args = ap.parse_args()
    from vellum.client.blocking import BookKeeper
    from vellum.format.records import ENTRY_FORMAT_KEY, RECORDS_V1, Record, encode_records
    from vellum.spark.record_columns import unpack
    from vellum.testing.local_cluster import LocalCluster

    n = args.entries
    rows = max(1, args.rows_per_entry)
    per_range = max(1, 4096 // rows)
    base = Path(tempfile.mkdtemp(prefix="vellum-read-cpu-"))
    try:
        with LocalCluster(base / "cluster", bookies=3) as cluster, BookKeeper(cluster.metadata_uri) as bk:
            lh = bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2, digest_type="CRC32C",
                                  custom_metadata={ENTRY_FORMAT_KEY: RECORDS_V1})

            async def fill() -> None:
                futures = []
                for _ in range(n):
                    records = [Record(os.urandom(1024)) for _ in range(rows)]
                    futures.append(lh.aio.append_async(encode_records(records, 1_700_000_000_000)))
                    if len(futures) >= max(1, 2000 // rows):
                        await asyncio.gather(*futures)
                        futures = []
                await asyncio.gather(*futures)

            bk.run(fill(), timeout_s=600)
            ledger_id = lh.ledger_id
            lh.close()
            handle = bk.open_ledger(ledger_id, recovery=False)
            pids = [int(x) for x in subprocess.check_output(["pgrep", "-f", f"{base}/cluster/bookie"]).split()]
            for _ in range(args.repeat):
                bookies0 = _sum(pids)
                own0 = os.times()
                cpu0, t0 = time.process_time(), time.perf_counter()
                lo = 0
                while lo < n:
                    hi = min(n - 1, lo + per_range - 1)
                    unpack(ledger_id, 0, range(lo, hi + 1), bk.run(handle.aio.read_payloads(lo, hi)), True)
                    lo = hi + 1
                wall, reader = time.perf_counter() - t0, time.process_time() - cpu0
                own1 = os.times()
                user1, sys1 = _sum(pids)
                b_user, b_sys = user1 - bookies0[0], sys1 - bookies0[1]
                bookies = b_user + b_sys
                r_sys = own1.system - own0.system
                per_row = f", {reader / (n * rows) * 1e9:.0f} ns/row" if rows > 1 else ""
                print(f"read {n} entries: wall {wall:.2f} s, reader CPU {reader:.2f} s ({reader / n * 1e6:.1f} us/entry"
                      f"{per_row}; {r_sys / n * 1e6:.1f} system), bookies' CPU {bookies:.2f} s ({bookies / n * 1e6:.1f} us/entry; "
                      f"{b_user / n * 1e6:.1f} user, {b_sys / n * 1e6:.1f} system), "
                      f"load {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
