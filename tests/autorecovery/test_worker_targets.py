"""Which bookies a replication worker may copy a fragment to (``ReplicationWorker._replace``), on
a real ZooKeeper.

The cluster is four registrations (no bookie processes: the ledger is closed and empty, so the
copy moves no entry and the test is about the choice of target and the metadata written). Bookie
D was marked as a missing replica of the ledger earlier and is registered again; bookie A is lost
now, so the record names both. On four bookies the only spare for A's place in the segment
[A, B, C] is D: excluding every bookie the record names left "no spare bookie" although D is up.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest

from vellum.autorecovery.settings import AutoRecoverySettings
from vellum.autorecovery.worker import Outcome, ReplicationWorker
from vellum.client.bookkeeper import BookKeeper
from vellum.ids import BookieId, LedgerId
from vellum.meta import MetadataStore, open_metadata_store
from vellum.meta.model import LedgerMetadata, LedgerState
from vellum.testing.zookeeper import ZooKeeperServer

pytestmark = [pytest.mark.zk, pytest.mark.timeout(120)]

A, B, C, D = (f"127.0.0.1:{port}" for port in (31001, 31002, 31003, 31004))


@pytest.fixture
def store(zk_server: ZooKeeperServer) -> Iterator[MetadataStore]:
    with open_metadata_store(zk_server.uri("zk+hierarchical", f"/worker-targets-{uuid.uuid4().hex[:8]}/ledgers")) as s:
        s.format()
        yield s


async def _heal(store: MetadataStore, lid: LedgerId) -> tuple[Outcome, tuple[str, ...]]:
    record = store.underreplication.get_under_replicated(lid)
    assert record is not None and {str(r) for r in record.replicas} == {A, D}
    async with BookKeeper(store=store) as bk:
        worker = ReplicationWorker(bk, AutoRecoverySettings(), worker_id="w-targets")
        outcome = await worker.heal(int(lid), record)
        md = (await bk.context.read_metadata(int(lid))).value
    return outcome, tuple(str(b) for b in md.ensembles[0])


def test_a_suspect_registered_again_may_take_the_copy(store: MetadataStore) -> None:
    for bookie in (B, C, D):  # A is lost: not registered
        store.registration.register_bookie(BookieId(bookie))
    lid = LedgerId(4242)
    store.ledgers.create_ledger_with_id(lid, LedgerMetadata(
        ensemble_size=3, write_quorum_size=2, ack_quorum_size=2,
        ensembles={0: (BookieId(A), BookieId(B), BookieId(C))}, state=LedgerState.CLOSED, last_entry_id=-1))
    urm = store.underreplication
    urm.mark_under_replicated(lid, [D])  # D was lost once, and came back
    urm.mark_under_replicated(lid, [A])

    outcome, ensemble = asyncio.run(_heal(store, lid))
    assert outcome is Outcome.HEALED
    assert ensemble == (D, B, C)
