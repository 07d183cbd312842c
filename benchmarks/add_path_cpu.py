"""CPU of a bookie's server-side ADD path, in one process (docs/benchmarks.md, "The ADD path").

Pipelined 1 KiB ADD frames (``--per-read`` of them per socket read) are decoded with
``FrameDecoder(batch_adds=True)`` and each batch is handed to the bookie as the server hands it
(``Bookie.add_batch``; on a checkout that predates it, as ``(entry, key, recovery)`` rows to
``Bookie.add_entries``), with the journal fsynced and at most ``--window`` batches waiting for
their fsync. Reported: CPU seconds of the whole process (all threads) per 1,000 adds, which the
load of a shared machine disturbs less than throughput. Compare two checkouts by alternating
``PYTHONPATH=<checkout>/src`` runs (before / after / after / before).

    ./run bench add_path_cpu [--adds 40000] [--per-read 64] [--window 8] [--json]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from bench_common import emit

from vellum.bookie.assembly import open_bookie
from vellum.config import ServerConfig
from vellum.format.entry import DigestManager, DigestType, master_key
from vellum.proto import FrameDecoder, encode
from vellum.proto.messages import AddRequest


def measure(args: argparse.Namespace) -> dict[str, Any]:
    key = master_key(b"k")
    dm = DigestManager(1, DigestType.CRC32C, b"k")
    payload = bytes(args.size)
    frames = [encode(AddRequest(key, dm.compute(e, e - 1, 0, payload))) for e in range(args.adds)]
    reads = [b"".join(frames[i:i + args.per_read]) for i in range(0, args.adds, args.per_read)]
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        config = ServerConfig(journal_directories=(tmp + "/j",), ledger_directories=(tmp + "/l",),
                              http_server_enabled=False)
        opened = open_bookie(config, bookie_id="bench:1")
        bookie: Any = opened.bookie
        batched = hasattr(bookie, "add_batch")
        pending = [0]
        cond = threading.Condition()

        def durable(exc: BaseException | None) -> None:
            with cond:
                pending[0] -= 1
                cond.notify()

        decoder = FrameDecoder(5 << 20, side="server", batch_adds=True)
        try:
            wall0, cpu0 = time.perf_counter(), time.process_time()
            for data in reads:
                for batch in decoder.feed(data):
                    with cond:
                        pending[0] += 1
                    if batched:
                        bookie.add_batch(batch, durable)
                    else:
                        bookie.add_entries(list(zip(batch.entries, batch.keys, batch.recovery())), durable)
                with cond:
                    cond.wait_for(lambda: pending[0] <= args.window)
            with cond:
                cond.wait_for(lambda: pending[0] == 0)
            cpu1, wall1 = time.process_time(), time.perf_counter()
        finally:
            opened.close()
    return {"adds": args.adds, "per_read": args.per_read, "entry_bytes": args.size,
            "path": "Bookie.add_batch" if batched else "Bookie.add_entries (rows)",
            "cpu_ms_per_1000_adds": 1e6 * (cpu1 - cpu0) / args.adds, "adds_per_s": args.adds / (wall1 - wall0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--adds", type=int, default=40_000)
    ap.add_argument("--per-read", type=int, default=64)
    ap.add_argument("--window", type=int, default=8)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--dir", default="data/bench")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    emit(measure(args), as_json=args.json)


if __name__ == "__main__":
    main()
