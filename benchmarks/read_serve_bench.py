"""CPU per entry of a bookie serving READ_STRIDED / BATCH_READ runs, in one process: ledger
storage's multi-entry read and the encoding of the reply frame (docs/benchmarks.md).

Writes one ledger of ``--entries`` 1 KiB CRC32C entries into a ``LedgerStorage`` in a temporary
directory, as one bookie of a 3,2,2 ensemble holds them (two entries of every three: each
bookie heads one of three write sets and is second in another), and a second ledger holding
every entry (a 1,1,1 ledger, BATCH_READ's case). Then times, per entry served:

- ``strided-disk``: READ_STRIDED (stride 3) of the first ledger, flushed to the entry log;
- ``batch-disk``: BATCH_READ of the second ledger, flushed;
- ``strided-cache`` / ``batch-cache``: the same with the entries still in the write cache;

each as the server does it: the storage read in runs of ``--count`` entries within a 4 MiB
budget, then ``codec.encode_parts`` of the response. Run it with ``PYTHONPATH`` at two trees,
alternating, to compare them; the figures are best-of ``--repeat``.

    PYTHONPATH=src .venv/bin/python benchmarks/read_serve_bench.py --entries 60000
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from vellum.format.entry import DigestManager, DigestType, master_key
from vellum.proto import codec
from vellum.proto import messages as m
from vellum.storage.ledger_storage import LedgerStorage

STRIDED, BATCH = 11, 12
BUDGET = 4 << 20


def fill(st: LedgerStorage, n: int, payload: int) -> None:
    key = master_key(b"pw")
    body = bytes(range(256)) * (payload // 256)
    for lid in (STRIDED, BATCH):
        st.set_master_key(lid, key)
        dm = DigestManager(lid, DigestType.CRC32C, b"pw")
        length = 0
        for eid in range(n):
            length += len(body)
            if lid == STRIDED and eid % 3 == 1:
                continue  # this bookie is not in the write set of entries 1, 4, 7, ...
            st.add_entry(dm.compute(eid, eid - 1, length, body))


def serve(st: LedgerStorage, lid: int, stride: int, n: int, count: int) -> int:
    """Read the ledger as a reader would (runs of ``count`` wanted entries), encode each reply."""
    served = 0
    first = 0
    while first < n:
        if stride == 1:
            got = st.get_entries(lid, first, count, BUDGET)
            parts = codec.encode_parts(m.BatchReadResponse(0, lid, first, 1, got))
        else:
            got = st.get_strided(lid, first, stride, count, BUDGET)
            parts = codec.encode_parts(m.StridedReadResponse(1, 0, lid, first, got))
        if not got:
            break
        assert parts
        served += len(got)
        first += stride * len(got)
    return served


def timed(fn: Callable[[], int], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        served = fn()
        best = min(best, (time.process_time() - t0) / served)
    return best * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--entries", type=int, default=60_000)
    ap.add_argument("--payload-bytes", type=int, default=1024)
    ap.add_argument("--count", type=int, default=4096, help="entries asked for per request")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    n = args.entries
    base = Path(tempfile.mkdtemp(prefix="vellum-read-serve-"))
    out: dict[str, float] = {}
    try:
        for where in ("cache", "disk"):
            st = LedgerStorage(base / where, log_size_limit=1 << 30, write_cache_max_bytes=1 << 30,
                               read_cache_max_bytes=16 << 20, read_ahead_batch_size=100,
                               max_throttle_time_ms=10_000, preallocate=False)
            try:
                fill(st, n, args.payload_bytes)
                if where == "disk":
                    st.flush()
                out[f"strided-{where}"] = timed(lambda st=st: serve(st, STRIDED, 3, n, args.count), args.repeat)
                out[f"batch-{where}"] = timed(lambda st=st: serve(st, BATCH, 1, n, args.count), args.repeat)
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
