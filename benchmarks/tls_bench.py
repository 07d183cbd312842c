"""TLS on the bookie port against plaintext, through Vellum's client (docs/security.md).

Two one-bookie clusters on the same disk, started once: A serves plaintext, B mutual TLS with
authorization (``bookieAuthProviderFactoryClass=tls``, ``authorizedRoles=client``; certificates
made by ``vellum.security.pki``, EC P-256). One asyncio client per cluster keeps its connection
open; each slice appends to an E=W=A=1 ledger for ``--seconds`` with ``--inflight`` adds in
flight (default 64), 1 KiB then 64 KiB entries. Slices alternate in ABBA order for ``--pairs``
pairs (docs/benchmarks.md, "How we measure"); the figure is the median of the per-pair ratios
TLS / plaintext with p10..p90, after an A/A control (plaintext against itself, two ledgers)
that shows the noise floor. Targets: >= 0.8 at 1 KiB, >= 0.7 at 64 KiB.

Adds are acknowledged after the journal fsync (journalSyncData=true, the production setting),
so the disk is part of every figure; ``--no-sync`` turns the fsync off on both clusters to
expose the CPU cost of TLS alone (a lower bound of the ratio).

    .venv/bin/python benchmarks/tls_bench.py [--pairs 6] [--seconds 1.0] [--no-sync] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).parent))
from bench_common import emit, pct

from vellum.client import BookKeeper
from vellum.config import TLS_CONTEXT_FACTORY, ClientConfig
from vellum.security import pki
from vellum.testing.local_cluster import LocalCluster

Slice = Callable[[float], Awaitable[tuple[int, float]]]


async def slice_factory(bk: BookKeeper, size: int, inflight: int) -> Slice:
    lh = await bk.create_ledger(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1)
    payload = os.urandom(size)

    async def run(seconds: float) -> tuple[int, float]:
        sem = asyncio.Semaphore(inflight)
        done = 0
        failed: list[BaseException] = []

        def on_done(fut: asyncio.Future[int]) -> None:
            nonlocal done
            sem.release()
            exc = fut.exception()
            if exc is None:
                done += 1
            else:
                failed.append(exc)

        t0 = time.perf_counter()
        end = t0 + seconds
        n = 0
        while time.perf_counter() < end:
            await sem.acquire()
            lh.append_async(payload).add_done_callback(on_done)
            n += 1
            if n % 64 == 0:
                await asyncio.sleep(0)
        for _ in range(inflight):
            await sem.acquire()
        if failed:
            raise RuntimeError(f"{len(failed)} adds failed: {failed[0]!r}")
        return done, time.perf_counter() - t0

    return run


async def abba(a: Slice, b: Slice, pairs: int, seconds: float, size: int) -> dict[str, float]:
    """Median and p10..p90 of the per-pair ratios b/a of entries per second."""
    ratios, ra, rb = [], [], []
    await a(min(0.5, seconds))  # warm up both (connections, caches)
    await b(min(0.5, seconds))
    for i in range(pairs):
        order = [("a", a), ("b", b)] if i % 2 == 0 else [("b", b), ("a", a)]
        rates: dict[str, float] = {}
        for name, fn in order:
            n, elapsed = await fn(seconds)
            rates[name] = n / elapsed
        ra.append(rates["a"])
        rb.append(rates["b"])
        ratios.append(rates["b"] / rates["a"])
    return {
        "a_median_per_s": statistics.median(ra),
        "b_median_per_s": statistics.median(rb),
        "a_median_MB_per_s": statistics.median(ra) * size / 1e6,
        "b_median_MB_per_s": statistics.median(rb) * size / 1e6,
        "ratio_b_over_a_median": statistics.median(ratios),
        "ratio_p10": pct(ratios, 0.1),
        "ratio_p90": pct(ratios, 0.9),
    }


def make_certificates(base: Path) -> tuple[Path, pki.CertificateFiles, pki.CertificateFiles]:
    ca = pki.create_ca("tls bench CA")
    ca_files = pki.write_ca(ca, base / "ca")
    bookie = pki.write_certificate(pki.issue_certificate(ca, name="bench-bookie", role="bookie"), base / "bookie")
    client = pki.write_certificate(pki.issue_certificate(ca, name="bench-client", role="client"), base / "client")
    return ca_files.cert, bookie, client


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    report: dict[str, Any] = {"pairs": args.pairs, "slice_seconds": args.seconds, "inflight": args.inflight,
                              "journal_sync": not args.no_sync}
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        base = Path(tmp)
        ca, bookie, client = make_certificates(base / "pki")
        common = {"journalSyncData": "false"} if args.no_sync else {}
        tls_conf = {
            **common,
            "tlsProviderFactoryClass": TLS_CONTEXT_FACTORY, "tlsKeyStore": str(bookie.key),
            "tlsCertificatePath": str(bookie.cert), "tlsTrustStore": str(ca), "tlsClientAuthentication": "true",
            "bookieAuthProviderFactoryClass": "tls", "authorizedRoles": "client",
        }
        tls_client = ClientConfig(tls_provider_factory_class=TLS_CONTEXT_FACTORY, tls_trust_store=str(ca),
                                  tls_certificate_path=str(client.cert), tls_key_store=str(client.key))
        with LocalCluster(base / "plain", bookies=1, bookie_conf=common) as plain, \
                LocalCluster(base / "tls", bookies=1, bookie_conf=tls_conf) as secured:
            async with BookKeeper(plain.metadata_uri) as bk_plain, \
                    BookKeeper(secured.metadata_uri, config=tls_client) as bk_tls:
                a1 = await slice_factory(bk_plain, 1024, args.inflight)
                a2 = await slice_factory(bk_plain, 1024, args.inflight)
                report["aa_control_1KiB"] = await abba(a1, a2, max(4, args.pairs), args.seconds, 1024)
                print("A/A control done", file=sys.stderr)
                for size, label in ((1024, "1KiB"), (65536, "64KiB")):
                    a = await slice_factory(bk_plain, size, args.inflight)
                    b = await slice_factory(bk_tls, size, args.inflight)
                    report[f"tls_vs_plaintext_{label}"] = await abba(a, b, args.pairs, args.seconds, size)
                    print(f"{label} done", file=sys.stderr)
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=6, help="ABBA pairs per comparison")
    ap.add_argument("--seconds", type=float, default=1.0, help="length of one slice")
    ap.add_argument("--inflight", type=int, default=64)
    ap.add_argument("--no-sync", action="store_true", help="journalSyncData=false on both clusters (CPU cost only)")
    ap.add_argument("--dir", default="data/bench")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    report = uvloop.run(main_async(args))
    emit(report, as_json=args.json)


if __name__ == "__main__":
    main()
