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
from typing import Any

import pytest
from kazoo.client import KazooState

from vellum.ids import BookieId
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


def _expire(zk_server: ZooKeeperServer, store: ZkMetadataStore) -> None:
    """End the store's session from outside, as ZooKeeper does when a client was away too long:
    a second client takes the session over and closes it."""
    from kazoo.client import KazooClient

    session_id, password = store.client.client_id
    thief = KazooClient(hosts=zk_server.hosts, client_id=(session_id, password))
    thief.start(timeout=15)
    thief.stop()
    thief.close()


def test_a_registration_lost_with_the_session_is_made_again_after_a_failed_first_try(
        zk_server: ZooKeeperServer, link: CuttableLink) -> None:
    """After a new session the store re-creates its bookie registrations; when that fails (the
    connection drops again meanwhile) it tries again at the next connection, instead of leaving
    a running bookie unregistered for as long as the new session lives."""
    root = f"/zk-reregister-{uuid.uuid4().hex[:8]}/ledgers"
    bookie = BookieId("127.0.0.1:31181")
    with open_metadata_store(zk_server.uri("zk+hierarchical", root)) as observer:
        observer.format()
        store = open_metadata_store(f"zk+hierarchical://127.0.0.1:{link.port}{root}", session_timeout_s=4.0)
        assert isinstance(store, ZkMetadataStore)
        try:
            store.registration.register_bookie(bookie)
            assert bookie in observer.registration.list_bookies()
            registration = store.registration
            real_create = registration._create
            failed: list[BaseException] = []

            def create_losing_one_reply(*args: Any) -> None:
                if failed:
                    return real_create(*args)
                link.hold_replies()
                cutter = threading.Timer(0.3, link.cut)
                cutter.start()
                try:
                    return real_create(*args)
                except BaseException as e:
                    failed.append(e)
                    raise
                finally:
                    cutter.join()

            registration._create = create_losing_one_reply  # type: ignore[method-assign]
            old_session = store.session_id
            _expire(zk_server, store)
            _wait("the registration is gone with the old session",
                  lambda: bookie not in observer.registration.list_bookies())
            _wait("a new session", lambda: store.client.connected and store.session_id not in (0, old_session))
            _wait("the first re-registration failed", lambda: bool(failed))
            _wait("the bookie is registered again", lambda: bookie in observer.registration.list_bookies())
        finally:
            store.close()
