"""Fixtures shared by every suite: one real ZooKeeper server per test session."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from vellum.testing.zookeeper import ZooKeeperServer, missing_reason


@pytest.fixture(scope="session")
def zk_server() -> Iterator[ZooKeeperServer]:
    """Debian's ZooKeeper on 127.0.0.1 (free port, temp dir). Under CI it must exist."""
    reason = missing_reason()
    if reason is not None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI requires a real ZooKeeper: {reason}")
        pytest.skip(f"real ZooKeeper unavailable: {reason}")
    with ZooKeeperServer() as server:
        yield server
