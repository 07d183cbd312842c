"""GC on real bookie processes, with both metadata drivers (embedded SQLite, real ZooKeeper):
ledgers written over the wire protocol, half of them deleted from metadata, GC forced through
the admin HTTP API (and the shell): every surviving entry reads back byte for byte over the
wire, the deleted ledgers are gone, and the entry logs shrink by what was deleted."""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
from gc_support import log_bytes, sealed_logs

from vellum import errors as E
from vellum.cli.main import cli
from vellum.format.entry import DigestManager, DigestType, master_key
from vellum.ids import BookieId, LedgerId
from vellum.meta import LedgerMetadata, open_metadata_store
from vellum.proto import messages as m
from vellum.standalone import write_bookie_conf
from vellum.testing.local_cluster import LocalCluster
from vellum.testing.wire import RawConnection

LEDGERS = list(range(1, 21))
ENTRIES = 40


def _payload(lid: int, eid: int) -> bytes:
    seed = f"{lid}/{eid}/".encode()
    return (seed * 200)[: 200 + (lid * 37 + eid * 11) % 600]


def _entry(lid: int, eid: int) -> bytes:
    return DigestManager(lid, DigestType.CRC32C, b"pw").compute(eid, eid - 1, 0, _payload(lid, eid))


Conn = RawConnection


def _http(cluster: LocalCluster, path: str, method: str = "GET", body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(cluster.http_url(0) + path, data=data, method=method)
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read().decode())


@pytest.fixture(params=["sqlite", "zk-hierarchical", "zk-flat"])
def metadata_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'metadata.db'}"
    zk = request.getfixturevalue("zk_server")
    scheme = "zk+flat" if request.param == "zk-flat" else "zk+hierarchical"
    return str(zk.uri(scheme, f"/gc-{uuid.uuid4().hex[:10]}/ledgers"))


def test_force_gc_over_http_reclaims_deleted_ledgers(tmp_path: Path, metadata_uri: str) -> None:
    conf = {"logSizeLimit": str(64 * 1024), "flushInterval": "200"}
    with LocalCluster(tmp_path / "c", bookies=1, metadata_uri=metadata_uri, bookie_conf=conf) as cluster:
        bookie = cluster.bookie_ids[0]
        md = LedgerMetadata(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1,
                            ensembles={0: (BookieId(bookie),)}, password=b"pw")
        with open_metadata_store(metadata_uri) as store:
            for lid in LEDGERS:
                store.ledgers.create_ledger_with_id(LedgerId(lid), md)
        key = master_key(b"pw")
        conn = Conn(bookie)
        try:
            for eid in range(ENTRIES):
                for lid in LEDGERS:
                    conn.send(m.AddRequest(key, _entry(lid, eid)))
            answers = [conn.recv() for _ in range(ENTRIES * len(LEDGERS))]
            assert all(a.status == E.EOK for a in answers)
            written = sum(4 + len(_entry(lid, e)) for lid in LEDGERS for e in range(ENTRIES))
            ledger_dir = cluster.ledger_dir(0)
            cluster.wait_until(lambda: log_bytes(ledger_dir) >= written, what="checkpoint flushed the entries")
            dead, live = LEDGERS[::2], LEDGERS[1::2]
            dead_bytes = sum(4 + len(_entry(lid, e)) for lid in dead for e in range(ENTRIES))
            with open_metadata_store(metadata_uri) as store:
                for lid in dead:
                    store.ledgers.delete_ledger(LedgerId(lid))
            before = log_bytes(ledger_dir)

            # Suspend / resume round trip (BookKeeper's JSON).
            assert _http(cluster, "/api/v1/bookie/gc/suspend_compaction", "PUT",
                         {"suspendMajor": True, "suspendMinor": False}) == {
                "isMajorGcSuspended": True, "isMinorGcSuspended": False}
            assert _http(cluster, "/api/v1/bookie/gc/suspend_compaction")["isMajorGcSuspended"] is True
            with pytest.raises(urllib.error.HTTPError) as bad:  # a flag that is not a boolean: 400 naming it
                _http(cluster, "/api/v1/bookie/gc/resume_compaction", "PUT", {"resumeMajor": "maybe"})
            assert bad.value.code == 400 and "resumeMajor" in bad.value.read().decode()
            assert _http(cluster, "/api/v1/bookie/gc/suspend_compaction")["isMajorGcSuspended"] is True
            _http(cluster, "/api/v1/bookie/gc/resume_compaction", "PUT", {"resumeMajor": True})
            assert _http(cluster, "/api/v1/bookie/gc/suspend_compaction")["isMajorGcSuspended"] is False

            # Force GC through the shell, waiting with its progress bar.
            result = CliRunner().invoke(cli, ["shell", "gc", "--http", cluster.http_url(0), "--wait",
                                              "--timeout", "120"])
            assert result.exit_code == 0, result.output
            assert f"Triggered GC on BookieServer: {bookie}" in result.output
            assert _http(cluster, "/api/v1/bookie/gc") == {"is_in_force_gc": "false"}
            details = _http(cluster, "/api/v1/bookie/gc_details")
            assert isinstance(details, list) and len(details) == 1
            d = details[0]
            for field in ("forceCompacting", "majorCompacting", "minorCompacting", "lastMajorCompactionTime",
                          "lastMinorCompactionTime", "majorCompactionCounter", "minorCompactionCounter"):
                assert field in d
            assert d["majorCompactionCounter"] == 1 and d["deletedLedgers"] == len(dead)

            # Every surviving entry byte for byte over the wire; deleted ledgers are gone.
            for lid in live:
                for eid in range(ENTRIES):
                    conn.send(m.ReadRequest(lid, eid))
                    resp = conn.recv()
                    assert resp.status == E.EOK and bytes(resp.entry) == _entry(lid, eid), (lid, eid)
            for lid in dead:
                conn.send(m.ReadRequest(lid, 0))
                assert conn.recv().status != E.EOK
        finally:
            conn.close()
        after = log_bytes(ledger_dir)
        # The active log (at most logSizeLimit) is never collected; everything else is.
        assert before - after >= dead_bytes - 64 * 1024, (before, after, dead_bytes)
        usage = _http(cluster, "/api/v1/bookie/entrylogs")
        assert all(not set(row["ledgers"]) & set(dead) for row in usage if not row["active"])
        status = CliRunner().invoke(cli, ["shell", "gc-status", "--http", cluster.http_url(0), "--json"])
        assert status.exit_code == 0 and json.loads(status.output)[0]["majorCompactionCounter"] == 1
        files = cluster.http_get(0, "/api/v1/bookie/list_disk_file?file_type=entrylog")
        assert files["entrylog files"]
        metrics = cluster.http_get(0, "/metrics")
        assert "bookie_RECLAIMED_COMPACTION_SPACE_BYTES" in metrics
        assert "bookie_ACTIVE_ENTRY_LOG_TOTAL" in metrics


def test_entry_log_per_ledger_bookie_process_reclaims_files(tmp_path: Path) -> None:
    """10 ledgers on a bookie in entry-log-per-ledger mode, 5 deleted: whole files go, no
    compaction needed (compaction disabled), and the flag is switched off across a restart."""
    uri = f"sqlite:///{tmp_path / 'metadata.db'}"
    conf = {"entryLogPerLedgerEnabled": "true", "flushInterval": "200",
            "minorCompactionInterval": "0", "majorCompactionInterval": "0"}
    ledgers = list(range(1, 11))
    with LocalCluster(tmp_path / "c", bookies=1, metadata_uri=uri, bookie_conf=conf) as cluster:
        bookie = cluster.bookie_ids[0]
        md = LedgerMetadata(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1,
                            ensembles={0: (BookieId(bookie),)}, password=b"pw")
        with open_metadata_store(uri) as store:
            for lid in ledgers:
                store.ledgers.create_ledger_with_id(LedgerId(lid), md)
        key = master_key(b"pw")
        conn = Conn(bookie)
        try:
            for eid in range(ENTRIES):
                for lid in ledgers:
                    conn.send(m.AddRequest(key, _entry(lid, eid)))
            assert all(conn.recv().status == E.EOK for _ in range(ENTRIES * len(ledgers)))
            for lid in ledgers:  # the advisory close: each log is sealed at the next checkpoint
                conn.send(m.LedgerClosedNote(lid, lid))
        finally:
            conn.close()
        ledger_dir = cluster.ledger_dir(0)
        cluster.wait_until(lambda: len(sealed_logs(ledger_dir)) >= len(ledgers), what="closed ledgers' logs sealed")
        for ledgers_in_log in sealed_logs(ledger_dir).values():
            assert len(ledgers_in_log) == 1  # one ledger per log
        with open_metadata_store(uri) as store:
            for lid in ledgers[:5]:
                store.ledgers.delete_ledger(LedgerId(lid))
        before = log_bytes(ledger_dir)
        _http(cluster, "/api/v1/bookie/gc", "PUT", {})
        deadline = time.monotonic() + 60
        while _http(cluster, "/api/v1/bookie/gc")["is_in_force_gc"] == "true":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        d = _http(cluster, "/api/v1/bookie/gc_details")[0]
        assert d["majorCompactionCounter"] == 0 and d["minorCompactionCounter"] == 0
        assert d["compactedBytes"] == 0 and d["deletedLedgers"] == 5
        dead_bytes = sum(4 + len(_entry(lid, e)) for lid in ledgers[:5] for e in range(ENTRIES))
        assert before - log_bytes(ledger_dir) >= dead_bytes
        assert not [ls for ls in sealed_logs(ledger_dir).values() if ls & set(ledgers[:5])]
        # The flag switched off across a restart, on the same data.
        cluster.terminate(0)
        spec = cluster._bookies[0].spec
        spec.extra["entryLogPerLedgerEnabled"] = "false"
        write_bookie_conf(spec, uri)
        cluster.restart(0)
        conn = Conn(bookie)
        try:
            for lid in ledgers[5:]:
                conn.send(m.AddRequest(key, _entry(lid, ENTRIES)))
                assert conn.recv().status == E.EOK
        finally:
            conn.close()
        conn = Conn(bookie)
        try:
            for lid in ledgers[5:]:
                for eid in range(ENTRIES + 1):
                    conn.send(m.ReadRequest(lid, eid))
                    resp = conn.recv()
                    assert resp.status == E.EOK and bytes(resp.entry) == _entry(lid, eid)
        finally:
            conn.close()
