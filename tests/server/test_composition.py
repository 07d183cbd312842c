"""The pure parts of the composition root (service.py) and of standalone supervision
(standalone.py): registration data, bookie ids, process layout, conf files, command lines."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from vellum.config import ServerConfig, load_server_config
from vellum.service import bookie_id_of, default_metadata_uri, service_info
from vellum.standalone import (
    BookieProcessSpec,
    bookie_command,
    bookie_conf_text,
    process_specs,
    write_bookie_conf,
)


def test_service_info_publishes_where_the_admin_http_listens() -> None:
    def address(bookie_id: str, host: str, port: int) -> str:
        return str(json.loads(service_info(bookie_id, host, port))["httpAddress"])

    assert address("10.0.0.5:3181", "10.0.0.7", 8080) == "http://10.0.0.7:8080"
    # A wildcard bind address is published as the bookie id's host.
    assert address("10.0.0.5:3181", "0.0.0.0", 8080) == "http://10.0.0.5:8080"
    assert address("10.0.0.5:3181", "", 8080) == "http://10.0.0.5:8080"
    assert address("[::1]:3181", "::", 8080) == "http://[::1]:8080"
    assert address("b:1", "fe80::1", 8080) == "http://[fe80::1]:8080"  # IPv6 literal in brackets


def test_bookie_id_and_default_metadata_uri() -> None:
    assert bookie_id_of(ServerConfig(bookie_id="my-bookie:1"), 3181) == "my-bookie:1"
    assert bookie_id_of(ServerConfig(advertised_address="10.1.2.3"), 3181) == "10.1.2.3:3181"
    cfg = ServerConfig(ledger_directories=("/data/bk/ledgers",))
    assert default_metadata_uri(cfg) == "sqlite:////data/bk/metadata.db"
    assert default_metadata_uri(ServerConfig(metadata_service_uri="zk://h:2181/ledgers")) == "zk://h:2181/ledgers"


def test_process_specs_lay_bookies_out_by_index(tmp_path: Path) -> None:
    specs = process_specs(tmp_path, bookies=3, port_base=4000, http_port_base=9000)
    assert [(s.index, s.port, s.http_port) for s in specs] == [(0, 4000, 9000), (1, 4001, 9001), (2, 4002, 9002)]
    assert specs[2].bookie_id == "127.0.0.1:4002"
    assert specs[1].base == tmp_path / "bookie-1" and specs[1].conf_file == tmp_path / "bookie-1" / "bk_server.conf"


def test_bookie_conf_is_a_loadable_bk_server_conf(tmp_path: Path) -> None:
    spec = BookieProcessSpec(0, 4000, 9000, tmp_path / "b0", tmp_path / "b0" / "bk_server.conf",
                             {"journalMaxGroupWaitMSec": "1", "httpServerPort": "9999"})
    text = bookie_conf_text(spec, "sqlite:///x.db")
    assert text.splitlines()[0] == "bookiePort=4000"
    write_bookie_conf(spec, "sqlite:///x.db")
    assert spec.conf_file.read_text() == text
    cfg = load_server_config(str(spec.conf_file))
    assert cfg.bookie_port == 4000
    assert cfg.http_server_port == 9999  # the spec's extra keys win
    assert cfg.journal_max_group_wait_ms == 1
    assert cfg.journal_directories == (str(tmp_path / "b0" / "journal"),)
    assert cfg.metadata_service_uri == "sqlite:///x.db"


def test_bookie_command_runs_this_interpreter() -> None:
    assert bookie_command(Path("/c.conf")) == [sys.executable, "-m", "vellum.cli.main", "bookie", "--conf", "/c.conf"]


def test_bookies_on_one_machine_get_their_own_metrics_ports(tmp_path: Path) -> None:
    """``vellum standalone`` gives bookie i the metrics port base + i on loopback; without a base
    (tests, embedders) each bookie takes any free port, never BookKeeper's 8000 for all."""
    specs = process_specs(tmp_path, bookies=3, port_base=4000, http_port_base=9000, metrics_port_base=8000)
    assert [s.metrics_port for s in specs] == [8000, 8001, 8002]
    assert [s.metrics_port for s in process_specs(tmp_path, bookies=2, port_base=4000, http_port_base=9000)] == [0, 0]
    write_bookie_conf(specs[1], "sqlite:///x.db")
    cfg = load_server_config(str(specs[1].conf_file))
    assert (cfg.prometheus_stats_http_port, cfg.prometheus_stats_http_address) == (8001, "127.0.0.1")
    assert cfg.metrics_port_enabled
