"""``vellum.logs``: the formats, per-module levels, size rotation of ``logFile``, an operator's
dictConfig file, and the configuration checks of the log and metrics-port keys."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from vellum import logs
from vellum.config import ServerConfig, build_config
from vellum.errors import ConfigError


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """``configure`` replaces the root handlers (pytest's too): put them back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    named = {n: logging.getLogger(n).level for n in ("vellum.storage", "vellum.client", "vellum.test")}
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
        h.close()
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)
    for n, lvl in named.items():
        logging.getLogger(n).setLevel(lvl)
    logs.BookieIdFilter.process_bookie_id = None


def _record(msg: str, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("vellum.test", logging.WARNING, __file__, 1, msg, (), None)
    for k, v in extra.items():
        setattr(record, k, v)
    return record


def test_logfmt_puts_the_context_keys_after_the_message_and_escapes_values() -> None:
    line = logs.LogfmtFormatter().format(_record('add "x"\nfailed', ledger_id=7, entry_id=3, bookie_id="h:1"))
    assert line.startswith("ts=") and " level=WARNING logger=vellum.test " in line
    assert line.endswith(' msg="add \\"x\\"\\nfailed" bookie=h:1 ledger=7 entry=3'), line
    assert "\n" not in line


def test_json_lines_carry_the_context_keys_present() -> None:
    obj = json.loads(logs.JsonFormatter().format(_record("refused", ledger_id=7, peer="10.0.0.1:3181")))
    assert obj["msg"] == "refused" and obj["ledger"] == 7 and obj["peer"] == "10.0.0.1:3181"
    assert "entry" not in obj and "bookie" not in obj


def test_parse_levels_reads_a_root_level_and_modules_and_names_a_bad_entry() -> None:
    assert logs.parse_levels("WARN, vellum.storage=debug,vellum.client=ERROR") == {
        "": logging.WARNING, "vellum.storage": logging.DEBUG, "vellum.client": logging.ERROR}
    with pytest.raises(ConfigError, match=r"logLevels: 'vellum.storage=LOUD' has level 'LOUD'.*module=LEVEL"):
        logs.parse_levels("vellum.storage=LOUD")
    with pytest.raises(ConfigError, match="names no module"):
        logs.parse_levels("=DEBUG")
    with pytest.raises(ConfigError, match="logLevels"):
        ServerConfig(log_levels="vellum=NOPE")


def test_per_module_levels_apply(tmp_path: Path) -> None:
    out = tmp_path / "x.log"
    logs.configure(file=str(out), levels="vellum.storage=DEBUG,vellum.client=WARNING")
    logging.getLogger("vellum.storage.gc").debug("storage debug")
    logging.getLogger("vellum.client.ledger").info("client info")
    logging.getLogger("vellum.client.ledger").warning("client warning")
    logging.getLogger("vellum.test").debug("other debug")
    logging.getLogger("vellum.test").info("other info")
    text = out.read_text()
    assert "storage debug" in text and "client warning" in text and "other info" in text
    assert "client info" not in text and "other debug" not in text


def test_log_file_rotates_at_its_size_keeping_the_backups(tmp_path: Path) -> None:
    out = tmp_path / "logs" / "bookie.log"
    logs.configure(file=str(out), max_size_mb=1, backups=2, bookie_id="127.0.0.1:3181")
    log = logging.getLogger("vellum.test")
    for i in range(4 * 1024):  # ~4 MiB of lines
        log.info("line %d %s", i, "x" * 1000, extra={"ledger_id": i})
    files = sorted(p.name for p in out.parent.iterdir())
    assert files == ["bookie.log", "bookie.log.1", "bookie.log.2"], files
    for name in files:
        assert (out.parent / name).stat().st_size <= 1024 * 1024
    last = out.read_text().splitlines()[-1]
    assert "bookie=127.0.0.1:3181 ledger=4095" in last


def test_a_dict_config_file_is_used_with_the_bookie_filter(tmp_path: Path) -> None:
    out = tmp_path / "custom.log"
    conf = tmp_path / "logging.json"
    conf.write_text(json.dumps({
        "version": 1,
        "formatters": {"json": {"()": "vellum.logs.JsonFormatter"}},
        "handlers": {"f": {"class": "logging.FileHandler", "filename": str(out), "formatter": "json"}},
        "root": {"level": "INFO", "handlers": ["f"]},
    }))
    logs.configure(config_file=str(conf), levels="vellum.test=WARNING", bookie_id="b:1")
    logging.getLogger("vellum.test").info("hidden")
    logging.getLogger("vellum.test").warning("shown", extra={"entry_id": 4})
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(x["msg"], x["bookie"], x["entry"]) for x in lines] == [("shown", "b:1", 4)]


def test_config_checks_of_the_log_and_metrics_keys(tmp_path: Path) -> None:
    yaml_conf = tmp_path / "log.yaml"
    yaml_conf.write_text("version: 1\n")
    with pytest.raises(ConfigError, match=r"logConfigFile=.*log.yaml.*\.json file"):
        build_config(ServerConfig, {"logConfigFile": str(yaml_conf)})
    bad = tmp_path / "bad.json"
    bad.write_text("{\n  version: 1\n")
    with pytest.raises(ConfigError, match=r"logConfigFile=.*bad.json:2: not valid JSON"):
        build_config(ServerConfig, {"logConfigFile": str(bad)})
    good = tmp_path / "good.json"
    good.write_text('{"version": 1}')
    with pytest.raises(ConfigError, match=r"logConfigFile=.* logFile=.*remove"):
        build_config(ServerConfig, {"logConfigFile": str(good), "logFile": str(tmp_path / "x.log")})
    with pytest.raises(ConfigError, match="logFormat='xml' is not one of logfmt, json, text"):
        build_config(ServerConfig, {"logFormat": "xml"})
    with pytest.raises(ConfigError, match="prometheusStatsHttpPort and httpServerPort are both 8080"):
        build_config(ServerConfig, {"prometheusStatsHttpPort": "8080"})
    with pytest.raises(ConfigError, match="prometheusStatsHttpPort and bookiePort are both 3181"):
        build_config(ServerConfig, {"prometheusStatsHttpPort": "3181"})
    # off, or on the admin port with the admin server off: no clash
    build_config(ServerConfig, {"prometheusStatsHttpPort": "8080", "prometheusStatsHttpEnable": "false"})
    build_config(ServerConfig, {"prometheusStatsHttpPort": "8080", "httpServerEnabled": "false"})
    cfg = build_config(ServerConfig, {"enableStatistics": "false"})
    assert not cfg.metrics_port_enabled
    defaults = ServerConfig()
    assert (defaults.prometheus_stats_http_port, defaults.prometheus_stats_http_address) == (8000, "0.0.0.0")
    assert defaults.metrics_port_enabled and defaults.log_format == "logfmt" and defaults.log_file == ""


def test_the_prometheus_keys_are_honoured_not_accepted(tmp_path: Path) -> None:
    accepted: dict[str, str] = {}
    cfg = build_config(ServerConfig, {"prometheusStatsHttpPort": "9100", "prometheusStatsHttpAddress": "127.0.0.1",
                                      "enableStatistics": "true", "prometheusStatsLatencyRolloverSeconds": "60"},
                       accepted=accepted)
    assert (cfg.prometheus_stats_http_port, cfg.prometheus_stats_http_address) == (9100, "127.0.0.1")
    assert list(accepted) == ["prometheusStatsLatencyRolloverSeconds"]


def test_text_keeps_the_earlier_format_and_a_traceback_stays_on_one_logfmt_line() -> None:
    line = logs.TextFormatter().format(_record("plain", ledger_id=7))
    assert line.endswith(" WARNING vellum.test: plain [ledger=7]"), line
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("vellum.test", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    out = logs.LogfmtFormatter().format(record)
    assert "\n" not in out and ' exc="Traceback' in out and "ValueError: boom" in out
    assert json.loads(logs.JsonFormatter().format(record))["exc"].endswith("ValueError: boom")
