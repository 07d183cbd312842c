"""Where a replication worker reads the entries it copies, and what it heals when one fragment
cannot be healed, on real bookie processes.

A closed ledger E3 W2 on [A, B, C] with entries 0..2 written straight to their bookies: entry 0
on A and B, entry 1 on B and C, entry 2 on C only (A missed it). Then B goes for good. A's
fragment (entries 0 and 2) is bad (A misses entry 2) and B's (entries 0 and 1) is lost. The only
copy of entry 0 left is on A, the bookie whose fragment is being replaced: the copy must read it
from there (before, it read only from the other bookies of the write set and failed forever).
A, registered and missing only an entry of its own fragment, may then take B's place.
Found by the simulator's ``copy-only-from-other-replicas`` and ``avoid-bad-fragment-bookies``
seeds (tests/sim/test_sim_autorecovery.py).

And: a fragment no bookie may take (its segment spans every bookie left) does not stop the
worker from replacing the others (``stop-at-unhealable-fragment``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from vellum.autorecovery.cannot_heal import CannotHealError
from vellum.autorecovery.settings import AutoRecoverySettings
from vellum.autorecovery.worker import Outcome, ReplicationWorker
from vellum.client.bookkeeper import BookKeeper
from vellum.client.distribution import write_set
from vellum.format.entry import DigestManager, DigestType, master_key
from vellum.ids import BookieId, LedgerId
from vellum.meta import open_metadata_store
from vellum.meta.model import LedgerMetadata, LedgerState
from vellum.testing.local_cluster import LocalCluster

pytestmark = pytest.mark.timeout(180)

PASSWORD = b"copy-sources"
LID = 777


async def _write_entries(bk: BookKeeper, placed: dict[int, list[str]]) -> None:
    digest = DigestManager(LID, DigestType.CRC32C, PASSWORD)
    for entry_id, bookies in placed.items():
        payload = b"entry %d " % entry_id * 10
        raw = digest.compute(entry_id, entry_id - 1, len(payload) * (entry_id + 1), payload)
        for b in bookies:
            await bk.context.bookie_client.add(b, master_key(PASSWORD), raw)


async def _heal(uri: str) -> tuple[Outcome, tuple[str, ...], dict[str, set[int]]]:
    async with BookKeeper(uri) as bk:
        store = bk.store
        record = store.underreplication.get_under_replicated(LedgerId(LID))
        worker = ReplicationWorker(bk, AutoRecoverySettings(request_timeout_s=2.0, yield_target_s=None),
                                   worker_id="w-sources")
        outcome = await worker.heal(LID, record)
        md = (await bk.context.read_metadata(LID)).value
        ensemble = tuple(str(b) for b in md.ensembles[0])
        held = {b: set(await _entries(bk, b)) for b in ensemble}
    return outcome, ensemble, held


async def _entries(bk: BookKeeper, bookie: str) -> list[int]:
    ranges = await bk.context.bookie_client.list_entries(bookie, LID, timeout_s=5.0)
    return [e for lo, hi in ranges for e in range(lo, hi + 1)]


def test_the_only_copy_left_on_the_replaced_bookie_is_copied_and_the_ledger_heals(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "c", bookies=4) as cluster:
        uri = cluster.metadata_uri
        a, b, c, d = cluster.bookie_ids
        md = LedgerMetadata(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2, password=PASSWORD,
                            digest_type=DigestType.CRC32C,
                            ensembles={0: (BookieId(a), BookieId(b), BookieId(c))},
                            state=LedgerState.CLOSED, last_entry_id=2)
        with open_metadata_store(uri) as store:
            store.ledgers.create_ledger_with_id(LedgerId(LID), md)
        ensemble = [a, b, c]
        assert [[ensemble[i] for i in write_set(e, 3, 2)] for e in range(3)] == [[a, b], [b, c], [c, a]]

        async def write() -> None:
            async with BookKeeper(uri) as bk:
                await _write_entries(bk, {0: [a, b], 1: [b, c], 2: [c]})  # A misses entry 2

        asyncio.run(write())
        cluster.terminate(1)  # B goes for good (its registration with it)
        cluster.wait_until(lambda: b not in cluster.registered()[0], what="B unregistered")
        with open_metadata_store(uri) as store:
            store.underreplication.mark_under_replicated(LedgerId(LID), [a, b])

        outcome, healed, held = asyncio.run(_heal(uri))
        assert outcome is Outcome.HEALED
        assert b not in healed and set(healed) <= {a, c, d}, healed
        for e in range(3):  # every entry on every bookie of its write set in the new ensemble
            for i in write_set(e, 3, 2):
                assert e in held[healed[i]], (e, healed, held)


def test_a_fragment_without_a_spare_does_not_stop_the_others(tmp_path: Path) -> None:
    """Segment 0 [A, C, D] (entries 0..2; A misses entry 2), segment 3 [A, B, C] (entries 3..5);
    B goes. A's fragment of segment 0 has no spare (every bookie left is in it); B's fragment of
    segment 3 has D. The worker replaces B with D, then says the ledger cannot heal."""
    with LocalCluster(tmp_path / "c", bookies=4) as cluster:
        uri = cluster.metadata_uri
        a, b, c, d = cluster.bookie_ids
        md = LedgerMetadata(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2, password=PASSWORD,
                            digest_type=DigestType.CRC32C,
                            ensembles={0: (BookieId(a), BookieId(c), BookieId(d)),
                                       3: (BookieId(a), BookieId(b), BookieId(c))},
                            state=LedgerState.CLOSED, last_entry_id=5)
        with open_metadata_store(uri) as store:
            store.ledgers.create_ledger_with_id(LedgerId(LID), md)

        async def write() -> None:
            async with BookKeeper(uri) as bk:
                await _write_entries(bk, {0: [a, c], 1: [c, d], 2: [d],  # A misses entry 2
                                          3: [a, b], 4: [b, c], 5: [c, a]})

        asyncio.run(write())
        cluster.terminate(1)
        cluster.wait_until(lambda: b not in cluster.registered()[0], what="B unregistered")
        with open_metadata_store(uri) as store:
            store.underreplication.mark_under_replicated(LedgerId(LID), [a, b])

        async def heal() -> tuple[tuple[str, ...], tuple[str, ...]]:
            async with BookKeeper(uri) as bk:
                record = bk.store.underreplication.get_under_replicated(LedgerId(LID))
                worker = ReplicationWorker(bk, AutoRecoverySettings(request_timeout_s=2.0, yield_target_s=None),
                                           worker_id="w-sources")
                with pytest.raises(CannotHealError, match="no spare bookie"):
                    await worker.heal(LID, record)
                now = (await bk.context.read_metadata(LID)).value
                return tuple(str(x) for x in now.ensembles[0]), tuple(str(x) for x in now.ensembles[3])

        first, second = asyncio.run(heal())
        assert first == (a, c, d)  # nowhere to go: recorded as one that cannot heal
        assert second == (a, d, c)  # healed all the same
