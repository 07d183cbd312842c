"""A forced shrink reclaims the space on real bookie processes before it returns.

Three bookies (``LocalCluster``, BookKeeper's GC defaults: a pass every 10 minutes, so nothing
here is reclaimed by a periodic pass), a named ledger whose entries sit in the bookies' entry
logs. ``shrink(end)`` without force moves the start and leaves the bookies alone; ``shrink(end,
force=True)`` at the same point has every bookie trim, seal and garbage-collect (wire op
COLLECT): by the time it returns, the trimmed entries are gone from each bookie's index and the
entry-log bytes on disk dropped by about their size. Whole segments dropped by a forced shrink
are deleted on the bookies in the same call. A shrink backwards is an error.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from names_testkit import run, unique_name

from vellum.client.bookkeeper import BookKeeper
from vellum.client.named import NamedLedgers, OpenMode
from vellum.errors import IncorrectParameterError, NoSuchLedgerError, UnauthorizedAccessError
from vellum.format.entry import master_key
from vellum.testing.local_cluster import LocalCluster

QUORUM = {"ensemble_size": 3, "write_quorum_size": 3, "ack_quorum_size": 2}  # every bookie holds all
ENTRY = 4096
COUNT = 300
END = 250


def log_bytes(cluster: LocalCluster, i: int) -> int:
    """Bytes of bookie i's entry-log files on disk."""
    return sum(p.stat().st_size for p in cluster.ledger_dir(i).rglob("*.log") if p.is_file())


async def held(bk: BookKeeper, bookie: str, ledger_id: int) -> tuple[tuple[int, int], ...]:
    return await bk.context.bookie_client.list_entries(bookie, ledger_id)


async def wait_for(pred: object, what: str, timeout_s: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not pred():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, f"{what} not reached within {timeout_s}s"
        await asyncio.sleep(0.2)


def test_forced_shrink_reclaims_the_space_on_the_bookies(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "c", bookies=3) as cluster:

        async def main() -> None:
            async with BookKeeper(cluster.metadata_uri) as bk:
                named = NamedLedgers(bk)
                name = unique_name()
                w = await named.open(name, OpenMode.CREATE, **QUORUM)
                await asyncio.gather(*(w.append_async(bytes([i % 251]) * ENTRY) for i in range(COUNT)))
                ledger = w.ledger_id
                bookies = cluster.bookie_ids
                # the bookies' checkpoint (flushInterval 1 s) writes the entries to the entry logs
                await wait_for(lambda: all(log_bytes(cluster, i) >= COUNT * ENTRY for i in range(3)),
                               "entries in every bookie's entry logs")
                for b in bookies:
                    assert await held(bk, b, ledger) == ((0, COUNT - 1),)

                # Without force: the start moves, the bookies keep everything.
                before = [log_bytes(cluster, i) for i in range(3)]
                plain = await w.shrink(END)
                assert (plain.start_entry_id, plain.collections, plain.dropped_ledgers) == (END, (), ())
                assert w.start_entry_id == END
                for b in bookies:
                    assert await held(bk, b, ledger) == ((0, COUNT - 1),)
                assert [log_bytes(cluster, i) for i in range(3)] >= before

                # Backwards is an error, with or without force, and changes nothing.
                for force in (False, True):
                    with pytest.raises(IncorrectParameterError, match="backwards"):
                        await named.shrink(name, END - 1, force=force)
                    with pytest.raises(IncorrectParameterError, match="backwards"):
                        await w.shrink(0, force=force)
                assert (await named.record(name)).value.start_entry_id == END

                # With force at the same point: done on every bookie when shrink returns.
                forced = await w.shrink(END, force=True)
                assert forced.start_entry_id == END and forced.collected, forced
                assert sorted(c.bookie for c in forced.collections) == sorted(bookies)
                for c in forced.collections:
                    assert (c.ledger_id, c.end_entry_id, c.held, c.error) == (ledger, END, True, "")
                    assert c.reclaimed_bytes > 0, c
                trimmed = END * ENTRY
                for i, b in enumerate(bookies):
                    assert await held(bk, b, ledger) == ((END, COUNT - 1),)
                    after = log_bytes(cluster, i)
                    assert after <= before[i] - trimmed * 0.9, (b, before[i], after)
                # the entries at and after the start are untouched
                got = await w.read(END, COUNT - 1)
                assert [e.payload for e in got] == [bytes([i % 251]) * ENTRY for i in range(END, COUNT)]

                # A forced shrink past a whole segment deletes its ledger on the bookies too.
                await w.close()
                w2 = await named.open(name, OpenMode.APPEND)
                grown = [log_bytes(cluster, i) + 50 * 600 for i in range(3)]
                await asyncio.gather(*(w2.append_async(b"second" * 100) for _ in range(50)))
                await wait_for(lambda: all(log_bytes(cluster, i) >= grown[i] for i in range(3)),
                               "the second segment's entries in the entry logs")
                dropping = [log_bytes(cluster, i) for i in range(3)]
                w2_ledger = w2.ledger_id
                result = await w2.shrink(COUNT + 10, force=True)
                assert result.dropped_ledgers == (ledger,) and result.collected, result
                assert {(c.bookie, c.ledger_id) for c in result.collections} == (
                    {(b, ledger) for b in bookies} | {(b, w2.ledger_id) for b in bookies})
                for i, b in enumerate(bookies):
                    with pytest.raises(NoSuchLedgerError):
                        await held(bk, b, ledger)
                    assert await held(bk, b, w2.ledger_id) == ((10, 49),)
                    assert log_bytes(cluster, i) <= dropping[i] - (COUNT - END) * ENTRY * 0.9
                await w2.close()
                await named.drain()

                # COLLECT checks the master key, and never creates a ledger it does not hold.
                bc = bk.context.bookie_client
                with pytest.raises(UnauthorizedAccessError):
                    await bc.collect(bookies[0], w2_ledger, 0, master_key(b"not the password"))
                with pytest.raises(NoSuchLedgerError):
                    await bc.collect(bookies[0], 987654321, 5, master_key(b""))
                with pytest.raises(NoSuchLedgerError):
                    await held(bk, bookies[0], 987654321)

        run(main(), timeout_s=240)
