"""CPU per entry of a bookie's single-entry READ in ledger storage (``LedgerStorage.get_entry``),
in one process (docs/benchmarks.md).

Writes ``--entries`` 1 KiB CRC32C entries into each of a few ledgers of a ``LedgerStorage`` in
a temporary directory, then times, per entry read:

- ``seq-<where>``: every entry in order (a forward reader: from disk, the read-ahead serves most);
- ``random-<where>``: every entry in a shuffled order (from disk, a read per entry, no read-ahead);
- ``last-<where>``: the last entry (``entry_id == -1``, what READ_LAC and recovery ask), repeated;

``where`` is ``cache`` (the entries still in the write cache) or ``disk`` (flushed to the entry
log and the index). Each sequential pass reads a ledger of its own, so the read-ahead starts
afresh. Run it with ``PYTHONPATH`` at two trees, alternating, to compare them; the figures are
best-of ``--repeat``.

    PYTHONPATH=src .venv/bin/python benchmarks/read_entry_bench.py --entries 20000
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from vellum.format.entry import DigestManager, DigestType, master_key
from vellum.storage.ledger_storage import LedgerStorage

RANDOM = 1  # the ledger read in a shuffled order; sequential passes read ledgers 2, 3, ...


def fill(st: LedgerStorage, ledger_ids: range, n: int, payload: int) -> None:
    body = bytes(range(256)) * (payload // 256)
    for lid in ledger_ids:
        st.set_master_key(lid, master_key(b"pw"))
        dm = DigestManager(lid, DigestType.CRC32C, b"pw")
        length = 0
        for eid in range(n):
            length += len(body)
            st.add_entry(dm.compute(eid, eid - 1, length, body))


def best(fn: Callable[[int], int], repeat: int) -> float:
    """Least CPU microseconds per entry over ``repeat`` passes (``fn(pass)`` returns entries read)."""
    least = float("inf")
    for i in range(repeat):
        t0 = time.process_time()
        read = fn(i)
        least = min(least, (time.process_time() - t0) / read)
    return least * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--entries", type=int, default=20_000, help="entries per ledger")
    ap.add_argument("--payload-bytes", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    n, repeat = args.entries, args.repeat
    order = list(range(n))
    random.Random(1).shuffle(order)
    base = Path(tempfile.mkdtemp(prefix="vellum-read-entry-"))
    out: dict[str, float] = {}
    try:
        for where in ("cache", "disk"):
            st = LedgerStorage(base / where, log_size_limit=1 << 30, write_cache_max_bytes=1 << 30,
                               read_cache_max_bytes=16 << 20, read_ahead_batch_size=100,
                               max_throttle_time_ms=10_000, preallocate=False)
            try:
                fill(st, range(RANDOM, RANDOM + 1 + repeat), n, args.payload_bytes)
                if where == "disk":
                    st.flush()

                def sequential(i: int, st: LedgerStorage = st) -> int:
                    for eid in range(n):
                        st.get_entry(RANDOM + 1 + i, eid)
                    return n

                def shuffled(_i: int, st: LedgerStorage = st) -> int:
                    for eid in order:
                        st.get_entry(RANDOM, eid)
                    return n

                def last(_i: int, st: LedgerStorage = st) -> int:
                    for _ in range(n // 10):
                        st.get_entry(RANDOM, -1)
                    return n // 10

                out[f"seq-{where}"] = best(sequential, repeat)
                out[f"random-{where}"] = best(shuffled, repeat)
                out[f"last-{where}"] = best(last, repeat)
            finally:
                st.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if args.json:
        print(json.dumps(out))
    else:
        for name, us in out.items():
            print(f"{name:14s} {us:6.2f} us/entry")


if __name__ == "__main__":
    main()
