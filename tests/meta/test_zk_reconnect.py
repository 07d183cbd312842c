"""The ZooKeeper driver across reconnections (real ZooKeeper, the client connected through a TCP
link the test cuts, ``vellum.testing.tcp_link``).

kazoo calls session listeners on its connection thread, before that connection serves any
request. The store's listener must therefore never wait for a lock that another thread holds
across a ZooKeeper round trip: that thread's request, queued while the client was
disconnected, would wait for the connection, and the connection for the listener, with every
thread idle.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from kazoo.client import KazooState

from vellum.meta import open_metadata_store
from vellum.meta.zk import ZkMetadataStore
from vellum.testing.tcp_link import CuttableLink
from vellum.testing.zookeeper import ZooKeeperServer

pytestmark = [pytest.mark.zk, pytest.mark.timeout(120)]


@pytest.fixture
def link(zk_server: ZooKeeperServer) -> Iterator[CuttableLink]:
    host, port = zk_server.hosts.split(",")[0].rsplit(":", 1)
    proxy = CuttableLink((host, int(port)))
    yield proxy
    proxy.close()


def _wait(what: str, predicate: object, timeout_s: float = 15.0) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout_s}s: {what}"
        time.sleep(0.02)


def test_a_first_ledger_access_during_a_reconnection_completes(zk_server: ZooKeeperServer,
                                                               link: CuttableLink) -> None:
    root = f"/zk-reconnect-{uuid.uuid4().hex[:8]}/ledgers"
    with open_metadata_store(zk_server.uri("zk+hierarchical", root)) as admin:
        admin.format()
    store = open_metadata_store(f"zk+hierarchical://127.0.0.1:{link.port}{root}")
    assert isinstance(store, ZkMetadataStore)
    stuck = False
    try:
        states: list[str] = []
        store.client.add_listener(states.append)
        link.refuse()
        link.cut()
        _wait("the client notices the cut", lambda: KazooState.SUSPENDED in states)
        # The first use of the ledger manager reads the layout (a ZooKeeper round trip) while
        # the client is disconnected: the request waits for the next connection.
        result: list[object] = []
        reader = threading.Thread(target=lambda: result.append(store.ledgers), daemon=True)
        reader.start()
        time.sleep(0.3)  # the reader is inside the round trip now
        link.accept()
        reader.join(15)
        stuck = reader.is_alive()
        assert not stuck, "the first ledger access never completed after the reconnection (deadlock)"
        assert result and store.client.connected
    finally:
        if not stuck:  # a deadlocked kazoo client cannot be stopped
            store.close()
