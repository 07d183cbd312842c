"""Bookie metrics are given to each bookie by the composition: two bookies in one process keep
their own counts, and the process exports them summed under the names of a single bookie."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from vellum.bookie.assembly import OpenedBookie, open_bookie
from vellum.bookie.metrics import BookieMetrics, process_bookie_metrics
from vellum.config import ServerConfig
from vellum.errors import WriteOnReadOnlyBookieError
from vellum.format.entry import DigestManager, DigestType, master_key
from vellum.stats import REGISTRY

KEY = master_key(b"k")


def _open(base: Path, metrics: BookieMetrics, name: str) -> OpenedBookie:
    config = ServerConfig(journal_directories=(str(base / name / "j"),),
                          ledger_directories=(str(base / name / "l"),), http_server_enabled=False)
    return open_bookie(config, bookie_id=f"{name}:1", metrics=metrics)


def _add(opened: OpenedBookie, ledger_id: int, count: int) -> None:
    dm = DigestManager(ledger_id, DigestType.CRC32C, b"k")
    done = threading.Semaphore(0)
    errors: list[BaseException] = []

    def cb(exc: BaseException | None) -> None:
        if exc is not None:
            errors.append(exc)
        done.release()

    for e in range(count):
        opened.bookie.add_entry(dm.compute(e, e - 1, 0, b"x"), KEY, cb)
    for _ in range(count):
        assert done.acquire(timeout=10)
    assert errors == []


def _text(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


def test_two_bookies_in_one_process_keep_separate_counts(tmp_path: Path) -> None:
    registry = CollectorRegistry(auto_describe=True)
    metrics = BookieMetrics(registry)
    a = _open(tmp_path, metrics, "a")
    b = _open(tmp_path, metrics, "b")
    try:
        _add(a, 1, 3)
        _add(b, 2, 2)
        a.bookie.read_entry(1, 0)
        b.bookie.set_forced_read_only(True)
        with pytest.raises(WriteOnReadOnlyBookieError):
            _add(b, 2, 1)

        # Each bookie has its own counts (the second bookie no longer replaces the first's).
        assert (a.bookie.adds_total, b.bookie.adds_total) == (3, 2)
        assert (a.bookie.reads_total, b.bookie.reads_total) == (1, 0)
        assert a.bookie.adds_rejected["readonly"] == 0 and b.bookie.adds_rejected["readonly"] == 1
        assert metrics.sources == (a.bookie, b.bookie)

        # The process exports their sum, with a single bookie's names and labels.
        text = _text(registry)
        assert 'bookie_BOOKIE_ADD_ENTRY_count{success="true"} 5.0' in text
        assert 'bookie_BOOKIE_READ_ENTRY_count{success="true"} 1.0' in text
        assert 'bookie_BOOKIE_ADD_ENTRY_REJECTED_total{reason="readonly"} 1.0' in text
        assert 'bookie_BOOKIE_ADD_ENTRY_REJECTED_total{reason="deleted"} 0.0' in text
        assert 'bookie_journal_JOURNAL_SYNC_count{journal="0",success="true"}' in text
        assert metrics.samples("bookie_journal_JOURNAL_SYNCED_RECORDS")[("0",)] >= 5
        # One read-only bookie: the process is not writable.
        assert "bookie_SERVER_STATUS 0.0" in text

        b.close()
        # A closed bookie no longer counts; the other's counts are untouched.
        assert metrics.sources == (a.bookie,)
        text = _text(registry)
        assert 'bookie_BOOKIE_ADD_ENTRY_count{success="true"} 3.0' in text
        assert "bookie_SERVER_STATUS 1.0" in text
    finally:
        a.close()
        if b.bookie in metrics.sources:
            b.close()
    assert metrics.sources == ()


def test_process_metrics_are_registered_once_on_the_exported_registry() -> None:
    assert process_bookie_metrics() is process_bookie_metrics()
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        BookieMetrics(REGISTRY)  # a second collector of the same names is refused


def test_open_bookie_reports_to_the_process_metrics_by_default(tmp_path: Path) -> None:
    config = ServerConfig(journal_directories=(str(tmp_path / "j"),), ledger_directories=(str(tmp_path / "l"),),
                          http_server_enabled=False)
    opened = open_bookie(config, bookie_id="p:1")
    try:
        assert opened.bookie in process_bookie_metrics().sources
        assert "bookie_SERVER_STATUS" in generate_latest(REGISTRY).decode()
    finally:
        opened.close()
    assert opened.bookie not in process_bookie_metrics().sources
