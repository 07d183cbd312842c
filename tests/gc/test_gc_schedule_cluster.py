"""Compaction as a running bookie process does it on its own schedule and pace: the intervals
alone (no forced GC) start minor and major compactions, and `isThrottleByBytes` with
`compactionRateByBytes` paces a compaction by the bytes it moves. Ledgers are written over the
wire protocol and deleted from metadata (embedded SQLite); status, metrics and reads come from
the bookie's admin HTTP API and wire port."""

from __future__ import annotations

import json
import re
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from gc_support import log_bytes

from vellum import errors as E
from vellum.format.entry import DigestManager, DigestType, master_key
from vellum.ids import BookieId, LedgerId
from vellum.meta import LedgerMetadata, open_metadata_store
from vellum.proto import messages as m
from vellum.testing.local_cluster import LocalCluster
from vellum.testing.wire import RawConnection

LEDGERS = list(range(1, 21))
DEAD, LIVE = LEDGERS[::2], LEDGERS[1::2]
ENTRIES = 40


def _entry(lid: int, eid: int) -> bytes:
    seed = f"{lid}/{eid}/".encode()
    payload = (seed * 200)[: 200 + (lid * 37 + eid * 11) % 600]
    return DigestManager(lid, DigestType.CRC32C, b"pw").compute(eid, eid - 1, 0, payload)


def _http(cluster: LocalCluster, path: str, method: str = "GET", body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(cluster.http_url(0) + path, data=data, method=method)
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read().decode())


def _metric(text: str, name: str) -> float:
    """Sum of a metric's samples (every ledger dir) in a Prometheus text page."""
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def _write_then_delete_half(cluster: LocalCluster, uri: str) -> None:
    bookie = cluster.bookie_ids[0]
    md = LedgerMetadata(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1,
                        ensembles={0: (BookieId(bookie),)}, password=b"pw")
    with open_metadata_store(uri) as store:
        for lid in LEDGERS:
            store.ledgers.create_ledger_with_id(LedgerId(lid), md)
    key = master_key(b"pw")
    conn = RawConnection(bookie)
    try:
        for eid in range(ENTRIES):
            for lid in LEDGERS:
                conn.send(m.AddRequest(key, _entry(lid, eid)))
        assert all(conn.recv().status == E.EOK for _ in range(ENTRIES * len(LEDGERS)))
    finally:
        conn.close()
    written = sum(4 + len(_entry(lid, e)) for lid in LEDGERS for e in range(ENTRIES))
    cluster.wait_until(lambda: log_bytes(cluster.ledger_dir(0)) >= written, what="checkpoint flushed the entries")
    with open_metadata_store(uri) as store:
        for lid in DEAD:
            store.ledgers.delete_ledger(LedgerId(lid))


def _read_live(cluster: LocalCluster) -> None:
    conn = RawConnection(cluster.bookie_ids[0])
    try:
        for lid in LIVE:
            for eid in reversed(range(ENTRIES)):
                conn.send(m.ReadRequest(lid, eid))
                resp = conn.recv()
                assert resp.status == E.EOK and bytes(resp.entry) == _entry(lid, eid), (lid, eid)
        for lid in DEAD:
            conn.send(m.ReadRequest(lid, 0))
            assert conn.recv().status != E.EOK
    finally:
        conn.close()


def test_compaction_intervals_alone_start_minor_and_major_compactions(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'metadata.db'}"
    conf = {"logSizeLimit": str(64 * 1024), "flushInterval": "200", "gcWaitTime": "1000",
            "minorCompactionInterval": "2", "majorCompactionInterval": "5"}
    with LocalCluster(tmp_path / "c", bookies=1, metadata_uri=uri, bookie_conf=conf) as cluster:
        _write_then_delete_half(cluster, uri)
        dead_bytes = sum(4 + len(_entry(lid, e)) for lid in DEAD for e in range(ENTRIES))
        written = sum(4 + len(_entry(lid, e)) for lid in LEDGERS for e in range(ENTRIES))

        def both_ran() -> bool:
            d = _http(cluster, "/api/v1/bookie/gc_details")[0]
            return bool(d["minorCompactionCounter"] >= 1 and d["majorCompactionCounter"] >= 1
                        and d["deletedLedgers"] == len(DEAD) and d["compactedBytes"] > 0)

        cluster.wait_until(both_ran, timeout_s=90, what="a scheduled minor and a scheduled major compaction")
        # Nobody forced anything: the passes were the GC thread's own, on its intervals.
        assert _http(cluster, "/api/v1/bookie/gc") == {"is_in_force_gc": "false"}
        d = _http(cluster, "/api/v1/bookie/gc_details")[0]
        assert d["lastMajorCompactionTime"] > 0 and d["lastMinorCompactionTime"] > 0
        metrics = cluster.http_get(0, "/metrics")
        assert _metric(metrics, "bookie_MINOR_COMPACTION_TOTAL_total") >= 1
        assert _metric(metrics, "bookie_MAJOR_COMPACTION_TOTAL_total") >= 1
        # The major compaction gave the deleted ledgers' space back (the active log, at most
        # logSizeLimit, is never compacted) and every live entry reads back over the wire.
        cluster.wait_until(lambda: log_bytes(cluster.ledger_dir(0)) <= written - dead_bytes + 64 * 1024,
                           timeout_s=60, what="deleted ledgers' space reclaimed")
        _read_live(cluster)


def test_compaction_throttled_by_bytes_on_a_running_bookie(tmp_path: Path) -> None:
    """isThrottleByBytes=true: the compaction waits for its bytes at compactionRateByBytes. By
    entries (a million per second) it would not wait at all, so a pass that lasted at least the
    time the moved bytes need at that rate shows the byte throttle at work (a lower bound:
    load can only make it longer)."""
    uri = f"sqlite:///{tmp_path / 'metadata.db'}"
    rate = 50_000
    conf = {"logSizeLimit": str(64 * 1024), "flushInterval": "200", "isThrottleByBytes": "true",
            "compactionRateByBytes": str(rate), "compactionRateByEntries": "1000000"}
    with LocalCluster(tmp_path / "c", bookies=1, metadata_uri=uri, bookie_conf=conf) as cluster:
        _write_then_delete_half(cluster, uri)
        _http(cluster, "/api/v1/bookie/gc", "PUT", {})
        deadline = time.monotonic() + 120
        while _http(cluster, "/api/v1/bookie/gc")["is_in_force_gc"] == "true":
            assert time.monotonic() < deadline, "forced GC did not finish"
            time.sleep(0.1)
        d = _http(cluster, "/api/v1/bookie/gc_details")[0]
        assert d["majorCompactionCounter"] == 1 and d["deletedLedgers"] == len(DEAD)
        moved = d["compactedBytes"]  # records (4-byte size + entry) plus each new log's ledgers map
        # Entries here are at least 200 bytes, so entry bytes >= 200/204 of record bytes; a map
        # is at most 20 + 16 * 20 bytes per new log (a new log per 64 KiB moved, plus one).
        entry_bytes = moved * 200 / 204 - (moved // (64 * 1024) + 1) * 340
        assert entry_bytes > 3 * rate, moved
        minimum_s = (entry_bytes - rate) / rate  # one second's worth passes at once
        assert d["lastGcRunTimeMillis"] >= minimum_s * 1000, (d["lastGcRunTimeMillis"], minimum_s)
        _read_live(cluster)
