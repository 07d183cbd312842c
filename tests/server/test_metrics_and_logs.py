"""The metrics port (``prometheusStatsHttpPort``) and structured logs, on real bookie processes:
each bookie of a LocalCluster serves Prometheus text on its own port, with BookKeeper's metric
spellings, and nothing but metrics; a bookie with ``logFormat=json`` writes one JSON object per
line carrying its bookie id, and an ADD it refuses is logged with the ledger and entry;
``logLevels`` applies per module; ``logFile`` takes the log off stderr."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from vellum.aio import BookKeeper
from vellum.config import ClientConfig
from vellum.errors import LedgerFencedError
from vellum.testing.local_cluster import LocalCluster

CFG = ClientConfig(add_entry_timeout_s=5.0, read_entry_timeout_s=5.0)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    conf = {"logFormat": "json", "logLevels": "INFO,vellum.server.metrics_http=WARNING"}
    with LocalCluster(tmp_path_factory.mktemp("metrics-logs"), bookies=2, bookie_conf=conf) as c:
        yield c


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return str(resp.read().decode())


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def _fenced_writer(cluster: LocalCluster) -> tuple[int, int]:
    """Writer A adds, client B recovers (fences) the ledger, A's next add is refused by the
    bookies; returns (ledger id, refused entry id)."""

    async def main() -> tuple[int, int]:
        async with BookKeeper(cluster.metadata_uri, config=CFG) as a, \
                BookKeeper(cluster.metadata_uri, config=CFG) as b:
            lh = await a.create_ledger(ensemble_size=2, write_quorum_size=2, ack_quorum_size=2, password=b"pw")
            for i in range(5):
                await lh.append(b"entry %d" % i)
            await b.open_ledger(lh.ledger_id, password=b"pw")  # recovery: fences the ledger
            with pytest.raises(LedgerFencedError):
                await lh.append(b"after the fence")
            return lh.ledger_id, 5

    return asyncio.run(main())


def test_each_bookie_serves_its_metrics_port_with_bookkeepers_names(cluster: LocalCluster) -> None:
    _fenced_writer(cluster)
    ports = {cluster.metrics_url(i) for i in range(2)}
    assert len(ports) == 2  # one port per bookie: bookies on one machine never collide
    for i in range(2):
        text = _get(cluster.metrics_url(i))
        samples = _samples(text)
        # BookKeeper's spellings, as its dashboards query them
        assert samples[("bookie_BOOKIE_ADD_ENTRY_count", (("success", "true"),))] >= 5, text
        assert samples[("bookie_SERVER_STATUS", ())] == 1.0
        assert ("bookkeeper_server_ADD_ENTRY_REJECTED", ()) in samples
        assert ("bookkeeper_server_READ_ENTRY_REJECTED", ()) in samples
        assert any(name == "bookie_journal_JOURNAL_SYNC_count" for name, _ in samples)
        assert samples[("bookie_BOOKIE_ADD_ENTRY_REJECTED_total", (("reason", "fenced"),))] >= 1
        # the same registry as the admin HTTP /metrics
        admin = _samples(str(cluster.http_get(i, "/metrics")))
        assert {name for name, _ in admin} == {name for name, _ in samples}


def test_the_metrics_port_serves_nothing_but_metrics(cluster: LocalCluster) -> None:
    base = cluster.metrics_url(0).removesuffix("/metrics")
    for path in ("/api/v1/bookie/info", "/api/v1/ledger/metadata?ledger_id=1", "/heartbeat", "/"):
        with pytest.raises(urllib.error.HTTPError) as err:
            _get(base + path)
        err.value.close()
        assert err.value.code == 404, path
    req = urllib.request.Request(base + "/metrics", method="PUT", data=b"{}")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    err.value.close()
    assert err.value.code == 405


def test_json_logs_carry_the_bookie_id_and_a_refused_add_names_ledger_and_entry(cluster: LocalCluster) -> None:
    ledger_id, entry_id = _fenced_writer(cluster)
    refused = []
    for i, bookie_id in enumerate(cluster.bookie_ids):
        lines = _json_lines(cluster.log_text(i))
        assert len(lines) >= 3, cluster.log_text(i)[-2000:]
        for line in lines:
            assert {"ts", "level", "logger", "msg"} <= line.keys(), line
            assert line["bookie"] == bookie_id, line
        # every line is JSON (the READY line is the process's stdout, not a log record)
        others = [x for x in cluster.log_text(i).splitlines() if x and not x.startswith(("{", "READY "))]
        assert others == [], others[:5]
        refused += [x for x in lines if x["msg"].startswith("refused entry") and x.get("ledger") == ledger_id]
    assert refused, "a refused ADD is logged by the bookies"
    assert all(x["entry"] == entry_id and x["level"] == "INFO" for x in refused), refused
    assert f"refused entry {ledger_id}:{entry_id}: the ledger is fenced" in {x["msg"] for x in refused}


def test_log_levels_apply_per_module(cluster: LocalCluster) -> None:
    loggers = {line["logger"] for line in _json_lines(cluster.log_text(0))}
    assert "vellum.service" in loggers  # INFO of the other modules is kept ("bookie ... serving on")
    assert "vellum.server.metrics_http" not in loggers  # its INFO start line is below WARNING


def test_a_bookie_logs_to_its_log_file_in_logfmt(tmp_path: Path) -> None:
    log_file = tmp_path / "logs" / "bookie.log"
    conf = {"logFile": str(log_file), "logFileMaxSizeMb": "1", "logFileBackups": "2"}
    with LocalCluster(tmp_path / "c", bookies=1, bookie_conf=conf) as c:
        c.wait_until(lambda: "serving on" in (log_file.read_text() if log_file.exists() else ""),
                     what="the start line in logFile")
        stderr = c.log_text(0)
        metrics = _get(c.metrics_url(0))
    text = log_file.read_text()
    start = next(line for line in text.splitlines() if "serving on" in line)
    assert start.startswith("ts=") and " level=INFO logger=vellum.service msg=\"bookie " in start, start
    assert start.endswith(f"bookie={c.bookie_ids[0]}"), start
    assert "serving on" not in stderr  # the log went to the file, not to stderr
    assert "bookie_SERVER_STATUS 1.0" in metrics
