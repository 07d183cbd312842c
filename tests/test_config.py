"""ServerConfig: BookKeeper keys and defaults, file parsing, validation with clear errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from vellum.cli.main import cli
from vellum.config import ClientConfig, ServerConfig, build_config, load_server_config
from vellum.errors import ConfigError


def test_defaults_are_bookkeepers() -> None:
    c = ServerConfig()
    assert c.bookie_port == 3181
    assert c.journal_max_group_wait_ms == 2
    assert c.journal_buffered_writes_threshold_bytes == 524288
    assert c.journal_buffered_entries_threshold == 0
    assert c.journal_flush_when_queue_empty is True  # Vellum's default, documented
    assert c.journal_max_size_mb == 2048 and c.journal_max_backups == 5
    assert c.log_size_limit_bytes == 1073741824
    assert c.db_storage_max_throttle_time_ms == 10000
    assert c.gc_wait_time_ms == 600000
    assert (c.minor_compaction_threshold, c.minor_compaction_interval_s) == (0.2, 3600)
    assert (c.major_compaction_threshold, c.major_compaction_interval_s) == (0.8, 86400)
    assert c.compaction_rate_by_entries == 1000
    assert (c.disk_usage_threshold, c.disk_usage_warn_threshold) == (0.95, 0.90)


def test_conf_file_with_camel_case_keys(tmp_path: Path) -> None:
    conf = tmp_path / "bk_server.conf"
    conf.write_text(
        "# a comment\n"
        "bookiePort=3999\n"
        "journalDirectories=/a, /b\n"
        "journalFlushWhenQueueEmpty=false\n"
        "minorCompactionThreshold = 0.1\n"
        "dbStorage_maxThrottleTimeMs=50\n"
    )
    c = load_server_config(conf)
    assert c.bookie_port == 3999
    assert c.journal_directories == ("/a", "/b")
    assert c.journal_flush_when_queue_empty is False
    assert c.minor_compaction_threshold == 0.1
    assert c.db_storage_max_throttle_time_ms == 50


def test_unknown_key_suggests_the_right_one(tmp_path: Path) -> None:
    conf = tmp_path / "bk_server.conf"
    conf.write_text("journalMaxGroupWaitMsec=5\n")
    with pytest.raises(ConfigError, match=r"unknown configuration key 'journalMaxGroupWaitMsec'.*did you mean") as e:
        load_server_config(conf)
    assert str(conf) in str(e.value)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"minorCompactionThreshold": "0.9"}, "must be below majorCompactionThreshold"),
        ({"majorCompactionThreshold": "1.5"}, "above its maximum"),
        ({"diskUsageLwmThreshold": "0.99"}, "must not exceed diskUsageThreshold"),
        ({"diskUsageWarnThreshold": "0.97"}, "must not exceed diskUsageThreshold"),
        ({"bookiePort": "-1"}, "below its minimum"),
        ({"bookiePort": "abc"}, "not a valid int"),
        ({"journalFlushWhenQueueEmpty": "maybe"}, "not a valid bool"),
        ({"ledgerManagerType": "legacyhierarchical"}, "not one of"),
        ({"journalAlignmentSize": "1000"}, "power of two"),
    ],
)
def test_invalid_values_are_refused_with_the_key(values: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_config(ServerConfig, values)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        # equal values: BookKeeper's GC thread refuses minor >= major, not only minor > major
        ({"minorCompactionThreshold": "0.8", "majorCompactionThreshold": "0.8"},
         r"minorCompactionThreshold \(0\.8\) must be below majorCompactionThreshold \(0\.8\)"),
        ({"minorCompactionInterval": "86400", "majorCompactionInterval": "86400"},
         r"minorCompactionInterval \(86400s\) must be below majorCompactionInterval \(86400s\)"),
        ({"minorCompactionThreshold": "0.9"},
         r"minorCompactionThreshold \(0\.9\) must be below majorCompactionThreshold \(0\.8\)"),
        ({"minorCompactionInterval": "90000"},
         r"minorCompactionInterval \(90000s\) must be below majorCompactionInterval \(86400s\)"),
    ],
)
def test_minor_compaction_must_be_strictly_below_major(values: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_config(ServerConfig, values)


def test_compaction_order_error_from_a_file_names_the_file(tmp_path: Path) -> None:
    conf = tmp_path / "bk_server.conf"
    conf.write_text("minorCompactionThreshold=0.5\nmajorCompactionThreshold=0.5\n")
    with pytest.raises(ConfigError, match=r"majorCompactionThreshold \(0\.5\)") as e:
        load_server_config(conf)
    assert str(conf) in str(e.value)


@pytest.mark.parametrize(
    "values",
    [
        # a compaction turned off (interval <= 0, or threshold 0) orders nothing
        {"minorCompactionInterval": "0", "minorCompactionThreshold": "0.8", "majorCompactionThreshold": "0.8"},
        {"minorCompactionInterval": "-1", "minorCompactionThreshold": "0.9"},
        {"majorCompactionInterval": "0", "minorCompactionInterval": "86400"},
        {"majorCompactionInterval": "-1", "minorCompactionInterval": "90000", "minorCompactionThreshold": "0.9"},
        {"minorCompactionThreshold": "0", "minorCompactionInterval": "86400"},
        {"majorCompactionThreshold": "0", "minorCompactionThreshold": "0.2"},
        {"minorCompactionInterval": "0", "majorCompactionInterval": "0"},
        # strictly below: accepted
        {"minorCompactionThreshold": "0.79", "minorCompactionInterval": "86399"},
    ],
)
def test_compaction_order_is_not_checked_when_one_is_off(values: dict[str, str]) -> None:
    build_config(ServerConfig, values)


def test_the_gc_thread_applies_the_same_compaction_order() -> None:
    """GcSettings (what the GC thread runs with) refuses what the configuration refuses."""
    from vellum.storage.gc import GcSettings

    with pytest.raises(ConfigError, match=r"minorCompactionThreshold \(0\.5\) must be below"):
        GcSettings(minor_compaction_threshold=0.5, major_compaction_threshold=0.5)
    with pytest.raises(ConfigError, match=r"minorCompactionInterval \(86400s\) must be below"):
        GcSettings(minor_compaction_interval_s=86400)
    GcSettings(minor_compaction_interval_s=0, minor_compaction_threshold=0.8)


def test_client_quorums_validated() -> None:
    with pytest.raises(ConfigError, match="ensembleSize >= writeQuorumSize >= ackQuorumSize"):
        ClientConfig(ensemble_size=2, write_quorum_size=3, ack_quorum_size=2)


def test_config_show_prints_effective_values(tmp_path: Path) -> None:
    conf = tmp_path / "bk.conf"
    conf.write_text("bookiePort=4000\n")
    result = CliRunner().invoke(cli, ["config", "show", "--conf", str(conf), "--json"])
    assert result.exit_code == 0, result.output
    import json

    values = {row["key"]: row["value"] for row in json.loads(result.output)}
    assert values["bookiePort"] == 4000
    result = CliRunner().invoke(cli, ["config", "show"])
    assert result.exit_code == 0 and "journalMaxGroupWaitMSec" in result.output


def test_operations_doc_lists_every_key() -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "operations.md").read_text()
    missing = [k for k in (f.metadata["key"] for f in ServerConfig.__dataclass_fields__.values()) if f"`{k}`" not in doc]
    assert missing == [], f"docs/operations.md does not document: {missing}"


def test_write_cache_defaults_to_a_quarter_of_the_memory_the_bookie_may_use() -> None:
    """Requirement R4 of docs/correctness.md: dbStorage_writeCacheMaxSizeMb defaults to 25% of the bookie's memory; a set
    value wins; the memory is the cgroup limit when one is set, else physical RAM."""
    from vellum.bookie.assembly import memory_limit_bytes

    gib = 1 << 30
    assert ServerConfig().db_storage_write_cache_max_size_mb == 0
    assert ServerConfig().write_cache_max_bytes(8 * gib) == 2 * gib
    assert ServerConfig().write_cache_max_bytes(32 << 20) == 16 << 20   # a floor for tiny limits
    assert ServerConfig(db_storage_write_cache_max_size_mb=64).write_cache_max_bytes(8 * gib) == 64 << 20
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert 0 < memory_limit_bytes() <= physical
