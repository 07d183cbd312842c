"""Shell commands readlog, entrylogs and rebuild-index through click's CliRunner."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import click
import crc32c
import pytest
from click.testing import CliRunner

from vellum.cli.shell_storage import register
from vellum.storage.entry_logger import EntryLogger
from vellum.storage.index import EntryLocationIndex


@click.group()
def shell() -> None:
    pass


register(shell)


def make_entry(ledger_id: int, entry_id: int, payload: bytes = b"") -> bytes:
    ids = struct.pack(">qq", ledger_id, entry_id)
    return ids + struct.pack(">I", crc32c.crc32c(ids + payload)) + payload


@pytest.fixture
def ledger_dir(tmp_path: Path) -> Path:
    with EntryLogger(tmp_path, log_size_limit=1 << 20, preallocate=False) as el:
        for e in range(3):
            el.add_entry(1, make_entry(1, e, b"one"))
            el.add_entry(2, make_entry(2, e, b"two"))
        el.rotate()
        el.add_entry(2, make_entry(2, 3, b"two"))
        el.flush()
    return tmp_path


def test_readlog_json(ledger_dir: Path) -> None:
    result = CliRunner().invoke(shell, ["readlog", "0", "--dir", str(ledger_dir), "--json", "--show-payload"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert [(r["ledger"], r["entry"]) for r in out["records"]] == [
        (1, 0),
        (2, 0),
        (1, 1),
        (2, 1),
        (1, 2),
        (2, 2),
    ]
    assert out["records"][0]["offset"] == 1028 and out["records"][0]["location"] == 1028
    assert out["records"][0]["payload"].endswith(b"one".hex())
    assert out["ledgers_map"] == [{"ledger": 1, "size": 3 * 27}, {"ledger": 2, "size": 3 * 27}]
    assert out["scan"]["stop"] == "end"
    assert out["header"]["ledgers_count"] == 2


def test_readlog_filters_and_unsealed_file(ledger_dir: Path) -> None:
    path = ledger_dir / "current" / "1.log"
    result = CliRunner().invoke(shell, ["readlog", str(path), "--ledger", "2", "--limit", "5", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert [(r["ledger"], r["entry"], r["location"]) for r in out["records"]] == [(2, 3, (1 << 32) | 1028)]
    assert out["ledgers_map"] is None
    table = CliRunner().invoke(shell, ["readlog", str(path)])
    assert table.exit_code == 0 and "absent or inconsistent" in table.output


def test_readlog_reports_truncation_and_bad_input(ledger_dir: Path) -> None:
    path = ledger_dir / "current" / "1.log"
    path.write_bytes(path.read_bytes()[:-3])
    out = json.loads(CliRunner().invoke(shell, ["readlog", str(path), "--json"]).output)
    assert out["scan"]["stop"] == "truncated" and out["scan"]["offset"] == 1024
    bad = CliRunner().invoke(shell, ["readlog", "zz"])
    assert bad.exit_code != 0 and "neither a file nor a hex" in bad.output
    missing = CliRunner().invoke(shell, ["readlog", "5"])
    assert missing.exit_code != 0 and "--dir" in missing.output


def test_entrylogs(ledger_dir: Path) -> None:
    result = CliRunner().invoke(shell, ["entrylogs", "--dir", str(ledger_dir), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert [(r["log"], r["ledgers"], r["source"]) for r in out] == [("0", 2, "map"), ("1", 1, "scan")]
    table = CliRunner().invoke(shell, ["entrylogs", "--dir", str(ledger_dir)])
    assert table.exit_code == 0 and "map" in table.output


def test_rebuild_index_cli(ledger_dir: Path) -> None:
    result = CliRunner().invoke(shell, ["rebuild-index", "--dir", str(ledger_dir), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["entries"] == 7 and out["logs"] == 2 and out["ledgers"] == 2
    idx = EntryLocationIndex(ledger_dir)
    try:
        assert idx.get_location(2, 3) == (1 << 32) | 1028
    finally:
        idx.close()
    shutil.rmtree(ledger_dir / "current" / "locations")
    table = CliRunner().invoke(shell, ["rebuild-index", "--dir", str(ledger_dir)])
    assert table.exit_code == 0, table.output
    assert "entries" in table.output
    nodir = CliRunner().invoke(shell, ["rebuild-index", "--dir", str(ledger_dir / "nope")])
    assert nodir.exit_code != 0 and "no current/" in nodir.output
