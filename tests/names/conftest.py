"""Fixtures of the named-ledger tests: real bookie processes (LocalCluster) on the embedded store
and on the real ZooKeeper, a bounded ``run``, and a metadata store that counts operations.

Test modules import the helpers with ``from names_testkit import ...`` (this conftest registers
itself under that unique module name; see tests/client/conftest.py for why).
"""

from __future__ import annotations

import asyncio
import collections
import sys
import uuid
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from vellum.meta.api import MetadataStore
from vellum.testing.local_cluster import LocalCluster
from vellum.testing.zookeeper import ZooKeeperServer

sys.modules.setdefault("names_testkit", sys.modules[__name__])

_T = TypeVar("_T")
DRIVERS = ["sqlite", "zk"]


def run(coro: Coroutine[Any, Any, _T], *, timeout_s: float = 60.0) -> _T:
    """Run ``coro`` on a fresh loop; fail (not hang) after ``timeout_s``."""

    async def bounded() -> _T:
        return await asyncio.wait_for(coro, timeout_s)

    return asyncio.run(bounded())


def unique_name(prefix: str = "t") -> str:
    return f"{prefix}/ns-{uuid.uuid4().hex[:8]}/log"


# zk_server: one ZooKeeper per session, in tests/conftest.py


def _cluster(driver: str, request: pytest.FixtureRequest, base: Path) -> LocalCluster:
    if driver == "sqlite":
        return LocalCluster(base, 3)
    zk: ZooKeeperServer = request.getfixturevalue("zk_server")
    return LocalCluster(base, 3, metadata_uri=zk.uri("zk+hierarchical", f"/n-{uuid.uuid4().hex[:10]}/ledgers"))


@pytest.fixture(scope="module", params=DRIVERS)
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three real bookie processes sharing one metadata store, per driver (shared by a module)."""
    with _cluster(str(request.param), request, tmp_path_factory.mktemp(f"names-{request.param}")) as c:
        yield c


@pytest.fixture(scope="module")
def sqlite_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("names-sqlite"), 3) as c:
        yield c


class _Counting:
    """Wraps one manager of a store and counts the calls of its methods as ``<role>.<method>``."""

    def __init__(self, inner: Any, role: str, counts: collections.Counter[str]) -> None:
        self._inner = inner
        self._role = role
        self._counts = counts

    def __getattr__(self, attr: str) -> Any:
        value = getattr(self._inner, attr)
        if not callable(value):
            return value

        def counted(*args: Any, **kw: Any) -> Any:
            self._counts[f"{self._role}.{attr}"] += 1
            return value(*args, **kw)

        return counted


class CountingStore:
    """A real metadata store whose key-value, ledger and id-generator calls are counted.

    Reads: kv.get, kv.list, ledgers.read_ledger, ledgers.ledger_exists. Everything else that
    these managers do is a write. Registration calls (bookie lists) are not counted: they are
    the client's, not the named-ledger layer's.
    """

    READS = frozenset({"kv.get", "kv.list", "ledgers.read_ledger", "ledgers.ledger_exists"})

    def __init__(self, inner: MetadataStore) -> None:
        self._inner = inner
        self.counts: collections.Counter[str] = collections.Counter()
        self.kv = _Counting(inner.kv, "kv", self.counts)
        self.ledgers = _Counting(inner.ledgers, "ledgers", self.counts)
        self.id_generator = _Counting(inner.id_generator, "id_generator", self.counts)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._inner, attr)

    def reset(self) -> None:
        self.counts.clear()

    def reads(self) -> int:
        return sum(n for k, n in self.counts.items() if k in self.READS)

    def writes(self) -> int:
        return sum(n for k, n in self.counts.items() if k not in self.READS)
