"""``vellum shell lastmark`` and ``vellum shell cookie`` (click CliRunner)."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from vellum.cli.shell_bookie import register
from vellum.format.lastmark import LogMark
from vellum.storage.cookies import check_or_stamp_cookies
from vellum.storage.dirs import current_dir


@pytest.fixture
def shell() -> click.Group:
    group = click.Group("shell")
    register(group)
    return group


def run(shell: click.Group, *args: str) -> click.testing.Result:
    return CliRunner().invoke(shell, list(args), catch_exceptions=False)


def test_lastmark_single_journal(tmp_path: Path, shell: click.Group) -> None:
    d0, d1 = tmp_path / "l0", tmp_path / "l1"
    current_dir(d0).mkdir(parents=True)
    current_dir(d1).mkdir(parents=True)
    (current_dir(d0) / "lastMark").write_bytes(LogMark(0x18A3F, 4096).encode())
    (current_dir(d1) / "lastMark").write_bytes(LogMark(0x18A40, 512).encode())
    result = run(shell, "lastmark", "--dir", str(d0), "--dir", str(d1), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["journal_count"] == 1
    assert [f["journal_id_hex"] for f in data["files"]] == ["18a3f", "18a40"]
    assert data["effective"] == [
        {"journal": 0, "journal_id": 0x18A40, "journal_id_hex": "18a40", "offset": 512, "from_start": False}
    ]
    table = run(shell, "lastmark", "--dir", str(d0), "--dir", str(d1))
    assert table.exit_code == 0 and "18a40" in table.output and "effective" in table.output


def test_lastmark_detects_multi_journal_files_and_reports_missing_and_corrupt(
    tmp_path: Path, shell: click.Group
) -> None:
    d0, d1 = tmp_path / "l0", tmp_path / "l1"
    current_dir(d0).mkdir(parents=True)
    current_dir(d1).mkdir(parents=True)
    (current_dir(d0) / "lastMark.0").write_bytes(LogMark(3, 10).encode())
    (current_dir(d0) / "lastMark.1").write_bytes(LogMark(4, 20).encode())
    (current_dir(d1) / "lastMark.1").write_bytes(b"bad")
    data = json.loads(run(shell, "lastmark", "--dir", str(d0), "--dir", str(d1), "--json").output)
    assert data["journal_count"] == 2
    statuses = {(Path(f["dir"]).name, f["file"]): f["status"] for f in data["files"]}
    assert statuses == {
        ("l0", "lastMark.0"): "ok",
        ("l0", "lastMark.1"): "ok",
        ("l1", "lastMark.0"): "missing",
        ("l1", "lastMark.1"): "corrupt",
    }
    assert [(e["journal_id"], e["offset"]) for e in data["effective"]] == [(3, 10), (4, 20)]


def test_lastmark_with_no_marks_is_zero(tmp_path: Path, shell: click.Group) -> None:
    current_dir(tmp_path).mkdir()
    data = json.loads(run(shell, "lastmark", "--dir", str(tmp_path), "--journals", "2", "--json").output)
    assert [e["from_start"] for e in data["effective"]] == [True, True]


def test_lastmark_all_corrupt_fails_naming_the_file(tmp_path: Path, shell: click.Group) -> None:
    current_dir(tmp_path).mkdir()
    (current_dir(tmp_path) / "lastMark").write_bytes(b"xx")
    result = run(shell, "lastmark", "--dir", str(tmp_path))
    assert result.exit_code == 1
    assert str(current_dir(tmp_path) / "lastMark") in result.output


def test_cookie_command(tmp_path: Path, shell: click.Group) -> None:
    j, lg = tmp_path / "j", tmp_path / "l"
    check_or_stamp_cookies("127.0.0.1:3181", [j], [lg], [], "inst-1")
    data = json.loads(run(shell, "cookie", "--dir", str(lg), "--json").output)
    assert data["bookie_id"] == "127.0.0.1:3181"
    assert data["ledger_dirs"] == [str(lg)]
    assert data["instance_id"] == "inst-1"
    assert data["layout_version"] == 5
    table = run(shell, "cookie", "--dir", str(j))
    assert table.exit_code == 0 and "127.0.0.1:3181" in table.output


def test_cookie_command_errors(tmp_path: Path, shell: click.Group) -> None:
    result = run(shell, "cookie", "--dir", str(tmp_path))
    assert result.exit_code == 1 and "no cookie" in result.output
    current_dir(tmp_path).mkdir()
    (current_dir(tmp_path) / "VERSION").write_text("junk\n")
    result = run(shell, "cookie", "--dir", str(tmp_path))
    assert result.exit_code == 1 and "VERSION" in result.output
