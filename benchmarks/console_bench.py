"""The operator console with 10,000 ledgers in the metadata store (docs/console.md): time each page.

A real local cluster (``--bookies`` bookie processes, embedded SQLite store); ``--ledgers``
ledgers' metadata written directly into the store (ensembles on the real bookies, mixed
states, custom metadata; no entries), ``--names`` named-ledger records; the console in this
process on its own loop thread, asked over HTTP from the main thread (a separate client, like a
browser). Each page is fetched ``--runs`` times after 3 warm-up fetches; reported: median, p90
and max in ms, and the process's resident memory before and after (the console pages on the
server side, so it must not grow with the number of fetches).

    ./run bench console_bench [--ledgers 10000] [--runs 30] [--bookies 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from vellum.client.named_record import KEY_PREFIX, NamedLedgerRecord, Segment, serialize_record
from vellum.console.cluster import ConsoleSettings
from vellum.console.server import ConsoleThread
from vellum.format.entry import DigestType
from vellum.ids import BookieId, LedgerId
from vellum.meta import LedgerMetadata, LedgerState, open_metadata_store
from vellum.testing.local_cluster import LocalCluster


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def populate(uri: str, bookies: list[str], ledgers: int, names: int) -> float:
    t0 = time.perf_counter()
    now_ms = int(time.time() * 1000)
    with open_metadata_store(uri) as store:
        for lid in range(1, ledgers + 1):
            e = min(3, len(bookies))
            ens = tuple(BookieId(bookies[(lid + k) % len(bookies)]) for k in range(e))
            closed = lid % 10 != 0
            md = LedgerMetadata(ensemble_size=e, write_quorum_size=min(2, e), ack_quorum_size=min(2, e),
                                ensembles={0: ens}, password=b"pw",
                                state=LedgerState.CLOSED if closed else LedgerState.OPEN,
                                last_entry_id=(lid % 500) if closed else -1, length=(lid % 500) * 1024 if closed else 0,
                                custom_metadata={"app": f"app-{lid % 17}".encode(), "tenant": f"t{lid % 5}".encode()},
                                ctime_ms=now_ms - (ledgers - lid) * 1000)
            store.ledgers.create_ledger_with_id(LedgerId(lid), md)
        for n in range(names):
            first = 1 + n * 3
            segs = tuple(Segment(first + k, k * 100, k * 100 + 99, 100 * 64, 1) for k in range(3))
            rec = NamedLedgerRecord(name=f"tenant-{n % 5}/ns/log-{n}", digest_type=DigestType.CRC32C, password=b"pw",
                                    ensemble_size=3, write_quorum_size=2, ack_quorum_size=2, segments=segs,
                                    writer_epoch=1, writer="bench:1", cursors={"reader": str(250 - n % 50).encode()})
            store.kv.create(KEY_PREFIX + rec.name, serialize_record(rec))
    return time.perf_counter() - t0


def fetch(url: str) -> tuple[int, float]:
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            resp.read()
            status = resp.status
    except urllib.error.HTTPError as e:
        e.read()
        status = e.code
    return status, (time.perf_counter() - t0) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ledgers", type=int, default=10_000)
    ap.add_argument("--names", type=int, default=200)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--bookies", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="console-bench-") as tmp, \
            LocalCluster(Path(tmp) / "cluster", bookies=args.bookies) as cluster:
        took = populate(cluster.metadata_uri, cluster.bookie_ids, args.ledgers, args.names)
        console = ConsoleThread(ConsoleSettings(cluster.metadata_uri), port=0)
        console.start()
        try:
            mid = args.ledgers // 2
            pages = {
                "cluster": "/cluster",
                "ledgers (first page)": "/ledgers",
                f"ledgers (after {mid})": f"/ledgers?after={mid}",
                "ledgers (previous of the last)": f"/ledgers?before={args.ledgers - 40}",
                "ledgers search state:open": "/ledgers?q=state:open",
                "ledgers search app=app-3 tenant=t1": "/ledgers?q=app%3Dapp-3+tenant%3Dt1",
                "ledger page": f"/ledgers/{mid}",
                "named ledgers": "/names",
                "named ledger page": "/names/tenant-0/ns/log-0",
                "storage & GC": "/storage",
                "recovery": "/recovery",
            }
            rss_before = _rss_mib()
            results: dict[str, Any] = {}
            for label, path in pages.items():
                for _ in range(3):
                    fetch(console.url + path)
                times = []
                for _ in range(args.runs):
                    status, ms = fetch(console.url + path)
                    if status != 200:
                        raise SystemExit(f"{path}: HTTP {status}")
                    times.append(ms)
                times.sort()
                results[label] = {"path": path, "median_ms": round(statistics.median(times), 1),
                                  "p90_ms": round(times[int(0.9 * (len(times) - 1))], 1),
                                  "max_ms": round(times[-1], 1)}
            rss_after = _rss_mib()
        finally:
            console.stop()
    report = {"ledgers": args.ledgers, "names": args.names, "bookies": args.bookies, "runs": args.runs,
              "populate_s": round(took, 1), "rss_mib_before": round(rss_before, 1),
              "rss_mib_after": round(rss_after, 1), "pages": results}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"{args.ledgers} ledgers, {args.names} named ledgers, {args.bookies} bookies; "
          f"metadata written in {took:.1f}s; {args.runs} fetches per page")
    print(f"{'page':40} {'median ms':>10} {'p90 ms':>8} {'max ms':>8}")
    for label, r in results.items():
        print(f"{label:40} {r['median_ms']:>10} {r['p90_ms']:>8} {r['max_ms']:>8}")
    print(f"resident memory of this process (console + client): {rss_before:.0f} MiB before, "
          f"{rss_after:.0f} MiB after the fetches")


if __name__ == "__main__":
    main()
