"""Fixtures for the metadata contract suite: a real ZooKeeper (session scope) and one store per driver."""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from vellum.meta import MetadataStore, open_metadata_store
from vellum.testing.zookeeper import ZooKeeperServer

DRIVERS = ["sqlite", "zk-flat", "zk-hierarchical", "zk-longhierarchical"]


# zk_server: one ZooKeeper per session, in tests/conftest.py


def make_uri(driver: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if driver == "sqlite":
        return f"sqlite://{tmp_path / 'metadata.db'}"
    zk: ZooKeeperServer = request.getfixturevalue("zk_server")
    scheme = "zk+" + driver.removeprefix("zk-")
    return zk.uri(scheme, f"/t-{uuid.uuid4().hex[:12]}/ledgers")


@pytest.fixture(params=DRIVERS)
def driver(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store_uri(driver: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return make_uri(driver, request, tmp_path)


@pytest.fixture
def open_store(store_uri: str) -> Iterator[Callable[..., MetadataStore]]:
    opened: list[MetadataStore] = []

    def _open(**kw: float) -> MetadataStore:
        kw.setdefault("session_timeout_s", 4.0)
        kw.setdefault("poll_interval_s", 0.05)
        s = open_metadata_store(store_uri, **kw)  # type: ignore[arg-type]
        opened.append(s)
        return s

    yield _open
    for s in opened:
        s.close()


@pytest.fixture
def store(open_store: Callable[..., MetadataStore]) -> MetadataStore:
    s = open_store()
    s.format()
    return s


def wait_until(pred: Callable[[], bool], timeout_s: float = 30.0, what: str = "condition") -> None:
    """Poll ``pred`` until true; fail (not hang) after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.05)
sys.modules.setdefault("meta_testkit", sys.modules[__name__])  # see tests/client/conftest.py
