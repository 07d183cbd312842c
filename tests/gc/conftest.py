"""Fixtures for the GC tests: a real ZooKeeper (session scope) for the metadata-driver cases."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from vellum.testing.zookeeper import ZooKeeperServer, missing_reason


@pytest.fixture(scope="session")
def zk_server() -> Iterator[ZooKeeperServer]:
    reason = missing_reason()
    if reason is not None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI requires a real ZooKeeper: {reason}")
        pytest.skip(f"real ZooKeeper unavailable: {reason}")
    with ZooKeeperServer() as server:
        yield server
