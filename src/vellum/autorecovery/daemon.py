"""AutoRecovery as a running service: an auditor candidate plus a replication worker.

``AutoRecovery.run`` (async) opens its own client, runs for auditor in the metadata store's
election (``UnderReplicationManager.elect_auditor``; exactly one leader per cluster) and runs a
replication worker; while this candidate leads, the ``Auditor`` runs too. It stops when its
``stop`` event is set: the candidacy is withdrawn (the next candidate takes over at once), the
worker's lock is released with the session.

``AutoRecoveryThread`` runs it in a thread with its own event loop, so that a bookie with
``autoRecoveryDaemonEnabled=true`` copies entries without competing with the loop that serves
its requests. ``vellum autorecovery --conf FILE`` runs it alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from vellum.autorecovery.auditor import Auditor
from vellum.autorecovery.settings import AutoRecoverySettings
from vellum.autorecovery.worker import ReplicationWorker
from vellum.client.bookkeeper import BookKeeper
from vellum.config import ClientConfig
from vellum.ids import BookieId
from vellum.meta.api import AuditorElection, MetadataStore

if TYPE_CHECKING:
    from vellum.client.placement import PlacementPolicy

log = logging.getLogger(__name__)


class AutoRecovery:
    """See the module docstring."""

    def __init__(self, metadata_uri: str, *, bookie_id: str, settings: AutoRecoverySettings,
                 client_config: ClientConfig | None = None, store: MetadataStore | None = None,
                 placement: PlacementPolicy | None = None) -> None:
        self.metadata_uri = metadata_uri
        #: an open store and a placement policy for the client, instead of what the URI and the
        #: configuration give (the simulator's: its store and a seeded policy)
        self._store = store
        self._placement = placement
        self.bookie_id = bookie_id
        self.settings = settings
        self.client_config = client_config or ClientConfig()
        self.election: AuditorElection | None = None
        self.worker: ReplicationWorker | None = None
        self.auditor: Auditor | None = None

    @property
    def is_auditor(self) -> bool:
        return self.election is not None and self.election.is_leader

    async def run(self, stop: asyncio.Event) -> None:
        async with BookKeeper(self.metadata_uri, config=self.client_config, store=self._store,
                              placement=self._placement) as bk:
            urm = bk.store.underreplication
            loop = asyncio.get_running_loop()
            changed = asyncio.Event()

            def poke() -> None:
                loop.call_soon_threadsafe(changed.set)

            self.election = await asyncio.to_thread(urm.elect_auditor, BookieId(self.bookie_id), poke,
                                                    on_lost=poke)
            self.worker = ReplicationWorker(bk, self.settings, worker_id=self.bookie_id)
            log.info("autorecovery %s: replication worker started, running for auditor", self.bookie_id)
            tasks = [asyncio.create_task(self._work(self.worker, stop), name="replication-worker"),
                     asyncio.create_task(self._audit_while_leading(bk, stop, changed), name="auditor")]
            try:
                await stop.wait()
            finally:
                election, self.election = self.election, None
                if election is not None:
                    await asyncio.to_thread(election.resign)
                for t in tasks:
                    t.cancel()
                for t in tasks:
                    with contextlib.suppress(asyncio.CancelledError):
                        await t
                log.info("autorecovery %s: stopped", self.bookie_id)

    async def _work(self, worker: ReplicationWorker, stop: asyncio.Event) -> None:
        """Run the worker until ``stop``. It is not meant to fail; if it does, say so and start it
        again: a worker task that ended unseen would leave every marked ledger unhealed."""
        while not stop.is_set():
            try:
                await worker.run(stop)
            except Exception:
                log.exception("autorecovery %s: the replication worker failed; it starts again in %d ms",
                              self.bookie_id, self.settings.backoff_ms)
                await _first(stop.wait(), asyncio.sleep(self.settings.backoff_ms / 1000))

    async def _audit_while_leading(self, bk: BookKeeper, stop: asyncio.Event, changed: asyncio.Event) -> None:
        while not stop.is_set():
            changed.clear()
            election = self.election
            if election is None or not election.is_leader:
                await _first(stop.wait(), changed.wait())
                continue
            log.warning("autorecovery %s: elected auditor", self.bookie_id)
            self.auditor = Auditor(bk, self.settings)
            auditor_stop = asyncio.Event()
            task = asyncio.create_task(self.auditor.run(auditor_stop), name="auditor-run")
            while not stop.is_set() and election.is_leader and not task.done():
                changed.clear()
                await _first(stop.wait(), changed.wait(), asyncio.shield(task))
            auditor_stop.set()
            try:
                await task
            except Exception:
                log.exception("autorecovery %s: the auditor failed; it runs again while this candidate leads",
                              self.bookie_id)
                await _first(stop.wait(), asyncio.sleep(self.settings.backoff_ms / 1000))
            self.auditor = None
            if not election.is_leader:
                log.warning("autorecovery %s: no longer the auditor", self.bookie_id)


async def _first(*aws: Awaitable[Any]) -> None:
    """Wait until the first of ``aws`` completes; cancel the others."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()


class AutoRecoveryThread:
    """``AutoRecovery`` in a daemon thread with its own event loop (inside a bookie process)."""

    def __init__(self, recovery: AutoRecovery) -> None:
        self.recovery = recovery
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="vellum-autorecovery", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(30)

    def _main(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            self._ready.set()
            try:
                await self.recovery.run(self._stop)
            except Exception:
                log.exception("autorecovery stopped on an error")

        asyncio.run(main())

    def stop(self, timeout_s: float = 15.0) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stop.set)
        self._thread.join(timeout_s)
