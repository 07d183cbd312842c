"""bookie/assembly.py: the one place that reads a ServerConfig to build a bookie. Its pure
part (config -> plain settings) is tested here; opening, replay and crashes in the other
tests of this directory."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from vellum.bookie import bookie as bookie_module
from vellum.bookie.assembly import gc_settings, open_bookie
from vellum.bookie.metrics import BookieMetrics
from vellum.config import ServerConfig
from vellum.storage.gc import GcSettings
from vellum.storage.journal import Journal


def test_gc_settings_carry_every_gc_key_of_the_config() -> None:
    config = ServerConfig(
        gc_wait_time_ms=1234, minor_compaction_interval_s=11, minor_compaction_threshold=0.1,
        major_compaction_interval_s=22, major_compaction_threshold=0.7, minor_compaction_max_time_ms=33,
        major_compaction_max_time_ms=44, compaction_rate_by_entries=55, compaction_rate_by_bytes=66,
        is_throttle_by_bytes=True, is_force_gc_allow_when_no_space=True, force_allow_compaction=True,
    )
    settings = gc_settings(config)
    assert isinstance(settings, GcSettings)
    for f in dataclasses.fields(GcSettings):
        assert getattr(settings, f.name) == getattr(config, f.name), f.name
    assert settings != GcSettings()  # every value above differs from the default


def test_the_bookie_module_does_not_know_the_configuration() -> None:
    # Lower layers take plain values: only the assembly reads a ServerConfig.
    assert not hasattr(bookie_module, "ServerConfig")
    assert not hasattr(bookie_module, "open_bookie")


def test_a_failed_open_leaves_no_bookie_in_the_metrics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    metrics = BookieMetrics(CollectorRegistry())
    config = ServerConfig(journal_directories=(str(tmp_path / "j"),), ledger_directories=(str(tmp_path / "l"),),
                          http_server_enabled=False)

    def refuse(_journal: Journal) -> None:
        raise OSError("journal cannot start")

    monkeypatch.setattr(Journal, "start", refuse)  # fails after the Bookie was built and tracked
    with pytest.raises(OSError, match="journal cannot start"):
        open_bookie(config, bookie_id="b:1", metrics=metrics)
    assert metrics.sources == ()
