"""A replication worker keeps healing across a ZooKeeper reconnection (real ZooKeeper, its
client connected through a small TCP link the test can cut).

A lost reply is made on purpose: the link holds ZooKeeper's answers, then cuts the connection,
so the request in flight fails with ConnectionLoss (the metadata store says
``MetadataStoreUnavailableError``) and kazoo reconnects on the same session, as when one server
of an ensemble restarts. This is done once, at one chosen metadata call of the worker's loop
(reading the under-replication record, deleting it, releasing the ledger's lock); afterwards
the worker must still heal every marked ledger and leave no lock behind.

The marked ledgers have no metadata (deleted ledgers: healed by removing the record), so no
bookie is needed: what is tested is the worker's loop over the metadata store.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from vellum.autorecovery.daemon import AutoRecovery
from vellum.autorecovery.settings import AutoRecoverySettings
from vellum.autorecovery.worker import ReplicationWorker
from vellum.client.bookkeeper import BookKeeper
from vellum.errors import MetadataStoreUnavailableError
from vellum.ids import LedgerId
from vellum.meta import MetadataStore, open_metadata_store
from vellum.testing.tcp_link import CuttableLink
from vellum.testing.zookeeper import ZooKeeperServer

pytestmark = [pytest.mark.zk, pytest.mark.timeout(120)]

#: how long the worker has to heal everything after the fault (it needs well under a second)
HEAL_WITHIN_S = 15.0


@pytest.fixture
def link(zk_server: ZooKeeperServer) -> Iterator[CuttableLink]:
    host, port = zk_server.hosts.split(",")[0].rsplit(":", 1)
    proxy = CuttableLink((host, int(port)))
    yield proxy
    proxy.close()


@pytest.fixture
def stores(zk_server: ZooKeeperServer, link: CuttableLink) -> Iterator[tuple[MetadataStore, MetadataStore]]:
    """The worker's store (through the link) and an observer's (straight to ZooKeeper)."""
    root = f"/worker-reconnect-{uuid.uuid4().hex[:8]}/ledgers"
    with open_metadata_store(f"zk+hierarchical://127.0.0.1:{link.port}{root}") as linked, \
            open_metadata_store(zk_server.uri("zk+hierarchical", root)) as observer:
        linked.format()
        yield linked, observer


def lose_one_reply(link: CuttableLink, obj: Any, name: str) -> list[BaseException]:
    """Make the first call of ``obj.name`` lose its reply (held, then the connection is cut);
    returns the errors that call raised, to prove the fault happened."""
    real: Callable[..., Any] = getattr(obj, name)
    failures: list[BaseException] = []

    def once(*args: Any, **kwargs: Any) -> Any:
        if failures:
            return real(*args, **kwargs)
        link.hold_replies()
        cutter = threading.Timer(0.3, link.cut)
        cutter.start()
        try:
            return real(*args, **kwargs)
        except BaseException as e:
            failures.append(e)
            raise
        finally:
            cutter.join()

    setattr(obj, name, once)
    return failures


async def _heal_through_a_lost_reply(store: MetadataStore, observer: MetadataStore, link: CuttableLink,
                                     call: str) -> str | None:
    """None when the worker healed every marked ledger after the fault, else what is wrong."""
    urm, seen = store.underreplication, observer.underreplication
    marked = [LedgerId(9101), LedgerId(9102), LedgerId(9103)]
    for lid in marked:
        urm.mark_under_replicated(lid, ["10.0.0.9:3181"])
    failures = lose_one_reply(link, urm, call)
    problem: str | None = None
    async with BookKeeper(store=store) as bk:
        worker = ReplicationWorker(bk, AutoRecoverySettings(backoff_ms=200), worker_id="w-reconnect")
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run(stop))
        deadline = time.monotonic() + HEAL_WITHIN_S
        while True:
            left = await asyncio.to_thread(lambda: [r.ledger_id for r in seen.list_under_replicated()])
            locked = await asyncio.to_thread(lambda: [lid for lid in marked if seen.is_locked(lid)])
            if not left and not locked:
                break
            if task.done() or time.monotonic() > deadline:
                why = f"the worker task ended: {task.exception()!r}" if task.done() else "the worker is stuck"
                problem = f"still marked {left}, still locked {locked} ({why})"
                break
            await asyncio.sleep(0.1)
        if problem is None and task.done():
            problem = f"the worker task ended: {task.exception()!r}"
        stop.set()
        await asyncio.wait([task], timeout=30)
        if task.done() and not task.cancelled() and task.exception() is not None and problem is None:
            problem = f"the worker task failed at stop: {task.exception()!r}"
    if problem is None and not (failures and isinstance(failures[0], MetadataStoreUnavailableError)):
        problem = f"the fault did not happen as planned: {failures}"
    return None if problem is None else f"after a lost reply in {call}: {problem} (faults {failures}, cuts {link.cuts})"


@pytest.mark.parametrize("call", ["get_under_replicated", "mark_replicated", "release_ledger"])
def test_the_worker_keeps_healing_after_a_lost_reply(stores: tuple[MetadataStore, MetadataStore], link: CuttableLink,
                                                    call: str) -> None:
    problem = asyncio.run(_heal_through_a_lost_reply(*stores, link, call))
    assert problem is None, problem


def test_the_daemon_starts_a_failed_worker_again(zk_server: ZooKeeperServer, monkeypatch: pytest.MonkeyPatch,
                                                caplog: pytest.LogCaptureFixture) -> None:
    """The worker is not meant to fail any more; if it does anyway (planted here: its first run
    raises), AutoRecovery says so and starts it again instead of leaving it dead unseen."""
    uri = zk_server.uri("zk+hierarchical", f"/worker-restart-{uuid.uuid4().hex[:8]}/ledgers")
    with open_metadata_store(uri) as observer:
        observer.format()
        observer.underreplication.mark_under_replicated(LedgerId(9201), ["10.0.0.9:3181"])
        real_run = ReplicationWorker.run
        runs: list[int] = []

        async def failing_once(self: ReplicationWorker, stop: asyncio.Event) -> None:
            runs.append(1)
            if len(runs) == 1:
                raise RuntimeError("planted: the worker's first run fails")
            await real_run(self, stop)

        monkeypatch.setattr(ReplicationWorker, "run", failing_once)

        async def main() -> bool:
            recovery = AutoRecovery(uri, bookie_id="10.0.0.1:3181", settings=AutoRecoverySettings(backoff_ms=200))
            stop = asyncio.Event()
            task = asyncio.create_task(recovery.run(stop))
            deadline = time.monotonic() + HEAL_WITHIN_S
            healed = False
            while not task.done() and time.monotonic() < deadline:
                if not await asyncio.to_thread(lambda: list(observer.underreplication.list_under_replicated())):
                    healed = True
                    break
                await asyncio.sleep(0.1)
            stop.set()
            await asyncio.wait([task], timeout=30)
            return healed

        with caplog.at_level(logging.ERROR, logger="vellum.autorecovery.daemon"):
            healed = asyncio.run(main())
    assert len(runs) >= 2 and healed, f"runs {len(runs)}, healed {healed}"
    assert "the replication worker failed; it starts again" in caplog.text
