"""A simulated power loss takes back what the real bookie's RocksDB indexes had not synced
(``sim/index_power.py`` through the ``IndexOps`` seam of ``storage/index.py``; docs/verification.md,
"The real bookie"): a process crash keeps every index write (RocksDB's WAL is in the file), a
power loss keeps what a WAL sync covered and a prefix of the rest, and the bookie recovers
what the indexes lost from its journal (its checkpoint syncs the indexes before it moves the
journal's mark)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from vellum.errors import LedgerFencedError
from vellum.format.entry import DigestManager, DigestType, master_key
from vellum.format.ledger_index import LedgerData
from vellum.proto.messages import AddBatch
from vellum.sim.index_power import UnsyncedIndex
from vellum.sim.loop import SimLoop
from vellum.sim.metadata import SimMetadataStore
from vellum.sim.real_bookie import PageCache, RealSimBookie
from vellum.storage.index import EntryLocationIndex, LedgerMetadataIndex

KEY = master_key(b"pw")
DM = DigestManager(1, DigestType.CRC32C, b"pw")


def _data(n: int) -> LedgerData:
    return LedgerData(exists=True, fenced=False, master_key=bytes([n]) * 4)


@pytest.mark.parametrize("power_loss", [False, True])
def test_unsynced_index_writes_survive_a_crash_and_not_a_power_loss(tmp_path: Path, power_loss: bool) -> None:
    ops = UnsyncedIndex()
    ledgers, locations = LedgerMetadataIndex(tmp_path, ops=ops), EntryLocationIndex(tmp_path, ops=ops)
    ledgers.put(1, _data(1))
    locations.put_locations([(1, 0, 100), (1, 1, 200), (1, 2, 300)])
    ledgers.sync()
    locations.sync()
    assert ops.unsynced == 0
    ledgers.put(2, _data(2))  # none of these is synced
    ledgers.put(1, _data(9))
    ledgers.delete(1)
    locations.put_locations([(2, 0, 400)])
    locations.delete_range(1, 1, 3)
    assert ops.unsynced == 5
    ledgers.abandon()  # kill -9: RocksDB's WAL holds every write
    locations.abandon()
    if power_loss:
        assert ops.lose() == 5
    ledgers, locations = LedgerMetadataIndex(tmp_path), EntryLocationIndex(tmp_path)
    try:
        if power_loss:  # back to what the syncs covered
            assert list(ledgers.ledgers()) == [1] and ledgers.get(1) == _data(1)
            assert list(locations.items()) == [(1, 0, 100), (1, 1, 200), (1, 2, 300)]
        else:
            assert list(ledgers.ledgers()) == [2] and ledgers.get(2) == _data(2)
            assert list(locations.items()) == [(1, 0, 100), (2, 0, 400)]
    finally:
        ledgers.close()
        locations.close()


def test_a_power_loss_keeps_a_prefix_of_the_unsynced_writes(tmp_path: Path) -> None:
    """RocksDB's point-in-time WAL recovery: what survives is the synced state and then the
    unsynced writes in order up to some point, never a later write without an earlier one."""
    kept = set()
    for seed in range(12):
        home = tmp_path / str(seed)
        ops = UnsyncedIndex()
        ledgers = LedgerMetadataIndex(home, ops=ops)
        ledgers.set_storage_flags(1)  # a synced write: durable with everything before it
        for lid in range(10, 16):
            ledgers.put(lid, _data(lid))
        ledgers.abandon()
        lost = ops.lose(random.Random(seed))
        ledgers = LedgerMetadataIndex(home)
        survivors = list(ledgers.ledgers())
        assert ledgers.get_storage_flags() == 1
        ledgers.close()
        assert survivors == list(range(10, 10 + len(survivors))) and len(survivors) + lost == 6
        kept.add(len(survivors))
    assert len(kept) >= 3, kept  # the prefix is drawn: some losses keep part of the tail


def test_a_synced_write_makes_the_writes_before_it_durable(tmp_path: Path) -> None:
    ops = UnsyncedIndex()
    ledgers = LedgerMetadataIndex(tmp_path, ops=ops)
    ledgers.put(3, _data(3))
    ledgers.set_storage_flags(2)
    ledgers.put(4, _data(4))
    ledgers.abandon()
    assert ops.lose() == 1
    ledgers = LedgerMetadataIndex(tmp_path)
    assert list(ledgers.ledgers()) == [3] and ledgers.get_storage_flags() == 2
    ledgers.close()


def test_a_lying_disk_loses_what_a_wal_sync_acknowledged(tmp_path: Path) -> None:
    ops = UnsyncedIndex(lies=lambda: True)
    ledgers = LedgerMetadataIndex(tmp_path, ops=ops)
    ledgers.put(5, _data(5))
    ledgers.sync()
    assert ops.lied_databases == 1
    ledgers.abandon()
    assert ops.lose() == 1
    ledgers = LedgerMetadataIndex(tmp_path)
    assert list(ledgers.ledgers()) == []
    ledgers.close()


def _entry(entry_id: int) -> bytes:
    return bytes(DM.compute(entry_id, entry_id - 1, entry_id + 1, b"payload %d" % entry_id))


def _bookie(loop: SimLoop, home: Path, page_cache: PageCache) -> RealSimBookie:
    store = SimMetadataStore(loop, lambda _lid, _md: None)
    return RealSimBookie("bookie-0:3181", loop, random.Random(1), home, store.ledgers,
                         lambda lid, key: key == KEY, group_wait_s=0.001, fsync_s=(0.002, 0.003),
                         read_s=(0.0001, 0.0002), checkpoint_s=(1000.0, 1001.0), page_cache=page_cache)


def test_a_bookie_recovers_what_its_index_lost_at_a_power_loss_from_its_journal(tmp_path: Path) -> None:
    """A fence and new entries reach the ledgers index and the write cache at once, the journal
    makes them durable, the index only at the next checkpoint: a power loss before it takes the
    index writes back, and the restart's journal replay puts them back (rule 4 of
    docs/correctness.md: the fence was answered, so it must hold)."""
    loop = SimLoop()
    cache = PageCache()
    b = _bookie(loop, tmp_path, cache)
    answers: list[object] = []

    async def first_life() -> None:
        for e in range(3):
            b.add_batch_cb(AddBatch.of_entries([(_entry(e), KEY, False)]), lambda r, e: answers.append((r, e)))
        await asyncio.sleep(0.01)
        assert answers == [([None], None)] * 3
        b.bookie.checkpoint()  # entries 0..2 in the entry log and the index, synced; the mark moves
        assert cache.index.unsynced == 0
        await b.fence(1, KEY)  # answered once the journal made it durable
        assert cache.index.unsynced >= 1  # the ledgers index has it, unsynced
        b.crash()

    loop.run_until_complete(first_life())
    assert cache.lose() >= 0 and cache.index.lost_writes >= 1  # the index lost the fence
    again = _bookie(loop, tmp_path, cache)
    assert again.replayed >= 1  # the fence, after the persisted mark
    assert again.held_entries(1) == {0, 1, 2}
    refused: list[tuple[list[BaseException | None], BaseException | None]] = []

    async def second_life() -> None:
        again.add_batch_cb(AddBatch.of_entries([(_entry(3), KEY, False)]), lambda r, e: refused.append((r, e)))
        await asyncio.sleep(0.01)

    loop.run_until_complete(second_life())
    assert isinstance(refused[0][0][0], LedgerFencedError)
    again.crash()
    loop.close()
