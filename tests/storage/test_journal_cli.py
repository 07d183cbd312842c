"""``vellum shell readjournal`` on a journal written by the Journal."""

from __future__ import annotations

import json
import struct
import threading
from pathlib import Path

from click.testing import CliRunner

from vellum.cli.main import cli
from vellum.storage.journal import Journal


def _write(tmp_path: Path) -> Journal:
    j = Journal(tmp_path / "journal", prealloc_size_mb=1, buffered_entries_threshold=2)
    j.start()
    done = threading.Semaphore(0)
    for i in range(4):
        j.log_entry(5, i, struct.pack(">qqqq", 5, i, i - 1, 3) + b"abc", lambda e: done.release())
    j.log_fence(5, lambda e: done.release())
    j.shutdown()
    return j


def test_readjournal_table_json_and_limit(tmp_path: Path) -> None:
    j = _write(tmp_path)
    runner = CliRunner()
    res = runner.invoke(cli, ["shell", "readjournal", str(j.current_path)])
    assert res.exit_code == 0, res.output
    assert "fence" in res.output and "verified" in res.output and "scan stopped: end" in res.output

    hex_id = f"{j.current_journal_id:x}"
    res = runner.invoke(cli, ["shell", "readjournal", hex_id, "--dir", str(tmp_path / "journal"), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["version"] == 6 and data["batch_checksums"] is True
    assert [(r["type"], r["entry"]) for r in data["records"]] == [
        ("entry", 0),
        ("entry", 1),
        ("entry", 2),
        ("entry", 3),
        ("fence", -0x2000),
    ]
    assert data["stop"]["reason"] == "end"

    res = runner.invoke(cli, ["shell", "readjournal", str(j.current_path), "--json", "--limit", "2"])
    data = json.loads(res.output)
    assert len(data["records"]) == 2 and data["stop"]["reason"] == "limit"


def test_readjournal_reports_a_corrupt_batch_and_bad_arguments(tmp_path: Path) -> None:
    j = _write(tmp_path)
    raw = bytearray(j.current_path.read_bytes())
    raw[1024 + 30] ^= 0xFF  # second batch
    j.current_path.write_bytes(bytes(raw))
    runner = CliRunner()
    res = runner.invoke(cli, ["shell", "readjournal", str(j.current_path), "--json"])
    data = json.loads(res.output)
    assert len(data["records"]) == 2 and data["stop"]["reason"] == "checksum_mismatch"
    assert data["stop"]["valid_end"] == 1024

    res = runner.invoke(cli, ["shell", "readjournal", "abc"])
    assert res.exit_code != 0 and "--dir" in res.output
    res = runner.invoke(cli, ["shell", "readjournal", "zz-not-a-file"])
    assert res.exit_code != 0

    bad = tmp_path / "bad.txn"
    bad.write_bytes(b"BKLG" + struct.pack(">i", 42) + bytes(504))
    res = runner.invoke(cli, ["shell", "readjournal", str(bad)])
    assert res.exit_code != 0 and "version 42" in res.output
