"""Offline jobs: gc-report on a cluster with deleted ledgers, replica-check, the CLI."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from vellum.testing.local_cluster import LocalCluster


def _logged_ledgers(cluster: LocalCluster) -> dict[str, set[int]]:
    """Per bookie (its ledger dir's label), the ledgers its entry logs hold records of."""
    from vellum.spark.jobs import Liveness, find_ledger_dirs, scan_log
    from vellum.storage.entry_logger import parse_log_file_name

    seen: dict[str, set[int]] = {}
    for label, cur in find_ledger_dirs([cluster.base_dir]):
        held = seen.setdefault(label, set())
        for p in cur.iterdir():
            if parse_log_file_name(p.name) is not None:
                held.update(r["ledgerId"] for r in scan_log(label, p, Liveness(frozenset())))
    return seen


def test_gc_report_and_replica_check(spark: Any, cluster: LocalCluster, bk: Any, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from vellum.cli.main import cli
    from vellum.spark.jobs import gc_report, replica_check, summarize_replicas

    ids = []
    for name in (b"keep-a", b"drop-b", b"keep-c"):
        lh = bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
        for f in [lh.append_async(name + b"x" * 1000) for _ in range(100)]:
            f.result(30)
        lh.close()
        ids.append(int(lh.ledger_id))
    keep_a, drop_b, keep_c = ids
    # bookies flush their write caches to entry logs at the next checkpoint (flushInterval 1 s);
    # with E3 W2 every bookie holds every ledger, so wait for each of them, not for the union
    deadline = time.monotonic() + 60
    while not (len(held := _logged_ledgers(cluster)) == 3 and all(set(ids) <= h for h in held.values())):
        assert time.monotonic() < deadline, "entries never reached the entry logs"
        time.sleep(0.5)
    bk.delete_ledger(drop_b)

    rows = gc_report(spark, metadata_uri=cluster.metadata_uri, dirs=[str(cluster.base_dir)])
    assert {r["bookie"].split("/")[0] for r in rows} == {"bookie-0", "bookie-1", "bookie-2"}
    holding_b = [r for r in rows if r["deadLedgers"] > 0]
    assert holding_b and all(drop_b not in r["pinnedBy"] for r in rows)
    assert any(keep_a in r["pinnedBy"] for r in rows) and any(keep_c in r["pinnedBy"] for r in rows)
    for r in rows:
        assert 0 <= r["liveBytes"] <= r["totalBytes"] and 0.0 <= r["usage"] <= 1.0 and r["ageSeconds"] >= 0

    checked = replica_check(spark, metadata_uri=cluster.metadata_uri, ledger_ids=[keep_a, keep_c], digests=True)
    assert {r["ledgerId"] for r in checked} == {keep_a, keep_c}
    assert sum(r["expected"] for r in checked if r["ledgerId"] == keep_a) == 200  # 100 entries x WQ 2
    assert summarize_replicas(checked) == []
    # a ledger whose bookies never got its entries: metadata says 5 entries exist
    from vellum.meta import open_metadata_store

    with open_metadata_store(cluster.metadata_uri) as store:
        ghost = bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
        got = store.ledgers.read_ledger(ghost.ledger_id)
        store.ledgers.write_ledger(ghost.ledger_id, got.value.closed(4, 50), got.version)
    problems = summarize_replicas(replica_check(spark, metadata_uri=cluster.metadata_uri,
                                                ledger_ids=[ghost.ledger_id]))
    assert [(p["ledgerId"], p["status"], p["missingCopies"]) for p in problems] == [
        (ghost.ledger_id, "under-replicated", 10)]

    # the CLI: JSON, and HTTP mode against the running bookies
    res = CliRunner().invoke(cli, ["spark", "gc-report", "--metadata-uri", cluster.metadata_uri,
                                   "--dir", str(cluster.base_dir), "--json"])
    assert res.exit_code == 0, res.output
    assert len(json.loads(res.output)) == len(rows)
    res = CliRunner().invoke(cli, ["spark", "gc-report", "--metadata-uri", cluster.metadata_uri,
                                   "--http", cluster.http_url(0), "--json"])
    assert res.exit_code == 0, res.output
    # Running cluster without URLs: the bookies publish their admin address in their
    # registration; after a GC pass each one reports its logs with bytes per ledger and mtime.
    import urllib.request

    for i in range(3):
        urllib.request.urlopen(urllib.request.Request(cluster.http_url(i) + "/api/v1/bookie/gc", data=b"{}",
                                                      method="PUT"), timeout=10).close()
    deadline = time.monotonic() + 60
    while not all(any(str(keep_a) in log["ledgerBytes"] for log in cluster.http_get(i, "/api/v1/bookie/entrylogs"))
                  for i in range(3)):  # every bookie holds entries of every ledger (E=3, W=2)
        assert time.monotonic() < deadline, "no GC pass reported the entry logs"
        time.sleep(0.5)
    res = CliRunner().invoke(cli, ["spark", "gc-report", "--metadata-uri", cluster.metadata_uri, "--json"])
    assert res.exit_code == 0, res.output
    live_rows = json.loads(res.output)
    assert {r["bookie"].split(" ")[0] for r in live_rows} == {cluster.http_url(i) for i in range(3)}
    assert any(keep_a in r["pinnedBy"] for r in live_rows) and all(drop_b not in r["pinnedBy"] for r in live_rows)
    assert all(r["ageSeconds"] is not None and r["ageSeconds"] >= 0 for r in live_rows)
    assert all(r["source"] == "http" and 0 <= r["liveBytes"] <= r["totalBytes"] for r in live_rows)
    res = CliRunner().invoke(cli, ["spark", "replica-check", "--metadata-uri", cluster.metadata_uri,
                                   "--ledger", str(keep_a)])
    assert res.exit_code == 0 and "1 ledgers checked, 0 with problems" in res.output, res.output
