"""Fixtures: a local cluster of real bookie processes on loopback (embedded metadata store)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from vellum.testing.local_cluster import LocalCluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path / "cluster", bookies=1) as c:
        yield c
