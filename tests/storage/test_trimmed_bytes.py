"""TrimmedBytes alone: counts, persistence after changes only, unusable files ignored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vellum.errors import StorageError
from vellum.storage.trimmed_bytes import TrimmedBytes


def test_counts_survive_a_reload_and_logs_that_are_gone_drop_out(tmp_path: Path) -> None:
    path = tmp_path / "trimmed.json"
    t = TrimmedBytes(path, existing_logs=[1, 2, 3])
    t.add({1: 100, 2: 50})
    t.add({1: 10})
    t.add({})
    assert t.snapshot() == {1: 110, 2: 50}
    t.save()
    assert json.loads(path.read_bytes()) == {"version": 1, "trimmed": {"1": 110, "2": 50}}
    assert TrimmedBytes(path, existing_logs=[1, 2]).snapshot() == {1: 110, 2: 50}
    assert TrimmedBytes(path, existing_logs=[2]).snapshot() == {2: 50}
    t.forget(1)
    t.forget(9)
    t.save()
    assert TrimmedBytes(path, existing_logs=[1, 2]).snapshot() == {2: 50}


def test_save_writes_only_after_a_change_and_retries_after_a_failure(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "trimmed.json"
    t = TrimmedBytes(path, existing_logs=[])
    t.save()
    assert not path.exists()  # nothing changed: nothing written
    t.add({1: 5})
    with pytest.raises(StorageError):
        t.save()  # the directory does not exist
    path.parent.mkdir()
    t.save()  # still dirty: written now
    assert TrimmedBytes(path, existing_logs=[1]).snapshot() == {1: 5}


@pytest.mark.parametrize("content", [b"{not json", b'{"version": 2, "trimmed": {}}', b'{"version": 1}', b"[]"])
def test_an_unusable_file_is_reported_and_ignored(tmp_path: Path, content: bytes,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "trimmed.json"
    path.write_bytes(content)
    assert TrimmedBytes(path, existing_logs=[1]).snapshot() == {}
    assert "not a valid trimmed-bytes file" in caplog.text
