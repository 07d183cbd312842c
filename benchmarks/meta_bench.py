"""Metadata benchmark: both drivers (embedded SQLite, real ZooKeeper started by the test helper).

Measures
- ledger create+close metadata round trips per second (create_ledger, then a CAS write to CLOSED),
- time and peak Python memory (tracemalloc) to iterate N ledger ids (default 100,000).
Populating for the iteration bypasses the API (bulk SQL insert / async znode creates) so the
run stays short; the iteration itself goes through the public LedgerManager.

    .venv/bin/python benchmarks/meta_bench.py [--ledgers N] [--roundtrips N] [--json]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import tempfile
import time
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

from vellum.ids import BookieId
from vellum.meta import LedgerMetadata, MetadataStore, open_metadata_store
from vellum.meta.model import serialize_ledger_metadata
from vellum.meta.zk import ZkLedgerManager, ZkMetadataStore
from vellum.testing.zookeeper import ZooKeeperServer, missing_reason

MD = LedgerMetadata(
    ensemble_size=3, write_quorum_size=2, ack_quorum_size=2,
    ensembles={0: (BookieId("b1:3181"), BookieId("b2:3181"), BookieId("b3:3181"))}, password=b"pw",
)


def roundtrips(store: MetadataStore, n: int) -> float:
    lm = store.ledgers
    t0 = time.perf_counter()
    for _ in range(n):
        lid, v = lm.create_ledger(MD)
        lm.write_ledger(lid, MD.closed(99, 9900), v)
    return n / (time.perf_counter() - t0)


def populate_sqlite(path: Path, n: int) -> None:
    data = serialize_ledger_metadata(MD)
    with sqlite3.connect(path) as c:
        c.executemany("INSERT INTO ledgers(ledger_id, version, data) VALUES(?, 0, ?)",
                      ((1_000_000 + i, data) for i in range(n)))
    c.close()


def populate_zk(store: ZkMetadataStore, n: int) -> None:
    lm = store.ledgers
    assert isinstance(lm, ZkLedgerManager)
    data = serialize_ledger_metadata(MD)
    paths = [lm.ledger_path(1_000_000 + i) for i in range(n)]
    for parent in sorted({p.rsplit("/", 1)[0] for p in paths}):
        store.client.ensure_path(parent)
    for k in range(0, n, 5000):
        for r in [store.client.create_async(p, data) for p in paths[k:k + 5000]]:
            r.get(timeout=120)


def iterate(store: MetadataStore) -> tuple[int, float, int]:
    tracemalloc.start()
    t0 = time.perf_counter()
    count = sum(1 for _ in store.ledgers.iter_ledger_ids())
    elapsed = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return count, elapsed, peak


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    results = []
    with tempfile.TemporaryDirectory(prefix="vellum-meta-bench-") as tmp:
        path = Path(tmp) / "metadata.db"
        with open_metadata_store(f"sqlite://{path}") as s:
            s.format()
            rate = roundtrips(s, args.roundtrips)
            populate_sqlite(path, args.ledgers)
            count, secs, peak = iterate(s)
            results.append({"driver": "sqlite (WAL, synchronous=FULL)", "create_close_per_s": rate,
                            "ledgers": count, "iterate_s": secs, "iterate_peak_bytes": peak})
    reason = missing_reason()
    if reason:
        print(f"skipping ZooKeeper: {reason}")
        return results
    with ZooKeeperServer() as zk:
        for scheme in ("zk+hierarchical", "zk+flat"):
            with open_metadata_store(zk.uri(scheme, f"/b-{uuid.uuid4().hex[:8]}/ledgers")) as s:
                s.format()
                assert isinstance(s, ZkMetadataStore)
                rate = roundtrips(s, args.roundtrips)
                populate_zk(s, args.ledgers)
                count, secs, peak = iterate(s)
                results.append({"driver": f"{scheme} (ZooKeeper 3.8, 1 server)", "create_close_per_s": rate,
                                "ledgers": count, "iterate_s": secs, "iterate_peak_bytes": peak})
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ledgers", type=int, default=100_000, help="ledgers to iterate")
    ap.add_argument("--roundtrips", type=int, default=2000, help="create+close round trips to time")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    results = run(args)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{'driver':40} {'create+close/s':>15} {'ledgers':>9} {'iterate s':>10} {'peak MiB':>9}")
    for r in results:
        print(f"{r['driver']:40} {r['create_close_per_s']:15.0f} {r['ledgers']:9d} {r['iterate_s']:10.2f} "
              f"{r['iterate_peak_bytes'] / 2**20:9.2f}")


if __name__ == "__main__":
    main()
