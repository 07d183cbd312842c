"""Ledger handle basics against real in-process bookies: round trips, LAC, reads, parameters."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from client_testkit import run
from test_ledger_support import client_cluster

from vellum.errors import (
    IllegalOpError,
    IncorrectParameterError,
    LedgerClosedError,
    NoSuchEntryError,
    ReadError,
    UnauthorizedAccessError,
)
from vellum.format.entry import DigestManager, DigestType
from vellum.meta.model import LedgerState


def payload(i: int) -> bytes:
    return f"entry-{i:05d}-".encode() * 8


@pytest.mark.parametrize(("e", "w", "a", "n_bookies"), [(3, 2, 2, 3), (1, 1, 1, 1), (3, 3, 2, 3)])
def test_round_trip(tmp_path: Path, e: int, w: int, a: int, n_bookies: int) -> None:
    async def main() -> None:
        async with client_cluster(tmp_path, n_bookies) as cc:
            lh = await cc.bk.create_ledger(
                ensemble_size=e,
                write_quorum_size=w,
                ack_quorum_size=a,
                password=b"pw",
                custom_metadata={"app": b"test"},
            )
            assert lh.metadata.state is LedgerState.OPEN
            assert len(lh.metadata.ensembles[0]) == e
            completed: list[int] = []
            futures = []
            for i in range(200):
                f = lh.append_async(payload(i))
                f.add_done_callback(lambda f: completed.append(f.result()))
                futures.append(f)
            ids = await asyncio.gather(*futures)
            assert ids == list(range(200))
            assert completed == list(range(200)), "futures must complete in entry-id order"
            assert lh.last_add_confirmed == 199 and lh.last_add_pushed == 199
            assert await lh.append(b"last") == 200
            total = sum(len(payload(i)) for i in range(200)) + 4
            assert lh.length == total
            entries = await lh.read(0, 200)
            assert [x.entry_id for x in entries] == list(range(201))
            assert [x.payload for x in entries[:200]] == [payload(i) for i in range(200)]
            await lh.close()
            assert lh.is_closed
            md = await cc.bk.ledger_metadata(lh.ledger_id)
            assert md.state is LedgerState.CLOSED and md.last_entry_id == 200 and md.length == total
            assert md.custom_metadata == {"app": b"test"}
            with pytest.raises(LedgerClosedError):
                await lh.append(b"x")
            # a second client reads it, with and without recovery
            other = await cc.new_client()
            for recovery in (False, True):
                rh = await other.open_ledger(lh.ledger_id, password=b"pw", recovery=recovery)
                assert rh.is_closed and rh.last_add_confirmed == 200 and rh.length == total
                got = await rh.read(150, 200)
                assert got[-1].payload == b"last" and got[0].payload == payload(150)
                with pytest.raises(IllegalOpError if not rh.is_closed else LedgerClosedError):
                    await rh.append(b"nope")
                await rh.close()

    run(main())


def test_entries_carry_piggybacked_lac_and_length(tmp_path: Path) -> None:
    async def main() -> None:
        async with client_cluster(tmp_path, 2) as cc:
            lh = await cc.bk.create_ledger(ensemble_size=2, write_quorum_size=2, ack_quorum_size=2)
            for i in range(5):
                await lh.append(payload(i))
            raw = await cc.bk.bookie_client.read(lh.metadata.ensembles[0][0], lh.ledger_id, 4, timeout_s=5)
            entry = DigestManager(lh.ledger_id, DigestType.CRC32C).verify(raw, 4)
            assert entry.lac == 3  # sequential appends: the LAC when entry 4 was sent
            assert entry.length == sum(len(payload(i)) for i in range(5))
            await lh.close()

    run(main())


def test_read_beyond_lac_refused_and_parameters(tmp_path: Path) -> None:
    async def main() -> None:
        async with client_cluster(tmp_path, 3) as cc:
            with pytest.raises(IncorrectParameterError):
                await cc.bk.create_ledger(ensemble_size=2, write_quorum_size=3, ack_quorum_size=2)
            with pytest.raises(IncorrectParameterError):
                await cc.bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=3)
            lh = await cc.bk.create_ledger(ensemble_size=3, write_quorum_size=3, ack_quorum_size=3)
            for i in range(3):
                await lh.append(payload(i))
            with pytest.raises(ReadError):
                await lh.read(0, 3)
            with pytest.raises(IncorrectParameterError):
                await lh.read(2, 1)
            with pytest.raises(IncorrectParameterError):
                await lh.read(-1, 1)
            with pytest.raises(NoSuchEntryError):
                await lh.read_unconfirmed(3, 3)
            # an unconfirmed read of entries the bookies have works beyond a reader's LAC
            reader = await (await cc.new_client()).open_ledger(lh.ledger_id, recovery=False)
            assert reader.last_add_confirmed in (1, 2)  # piggy-backed: the last entry carries 1
            got = await reader.read_unconfirmed(0, 2)
            assert [g.payload for g in got] == [payload(i) for i in range(3)]
            await lh.close()

    run(main())


def test_wrong_password_refused(tmp_path: Path) -> None:
    async def main() -> None:
        async with client_cluster(tmp_path, 1) as cc:
            lh = await cc.bk.create_ledger(
                ensemble_size=1, write_quorum_size=1, ack_quorum_size=1, password=b"right"
            )
            await lh.append(b"x")
            for recovery in (True, False):
                with pytest.raises(UnauthorizedAccessError):
                    await cc.bk.open_ledger(lh.ledger_id, password=b"wrong", recovery=recovery)
            # the ledger was not fenced by the refused open
            assert await lh.append(b"y") == 1
            # a bookie refuses a master key that differs from the ledger's
            from vellum.format.entry import master_key

            entry = DigestManager(lh.ledger_id, DigestType.CRC32C, b"wrong").compute(2, 1, 3, b"z")
            with pytest.raises(UnauthorizedAccessError):
                await cc.bk.bookie_client.add(
                    lh.metadata.ensembles[0][0], master_key(b"wrong"), entry, timeout_s=5
                )
            await lh.close()

    run(main())


def test_batch_read_digests_list_and_delete(tmp_path: Path) -> None:
    async def main() -> None:
        async with client_cluster(tmp_path, 3) as cc:
            ids = []
            for digest in ("CRC32", "CRC32C", "HMAC", "DUMMY"):
                lh = await cc.bk.create_ledger(
                    ensemble_size=2, write_quorum_size=2, ack_quorum_size=1, digest_type=digest, password=b"p"
                )
                await asyncio.gather(*(lh.append_async(payload(i)) for i in range(50)))
                await lh.close()
                rh = await cc.bk.open_ledger(lh.ledger_id, password=b"p")
                got = await rh.batch_read(10, 20)
                assert [g.entry_id for g in got] == list(range(10, 30))
                assert got[0].payload == payload(10)
                small = await rh.batch_read(0, 50, max_size=3 * len(payload(0)))
                assert 1 <= len(small) <= 3
                ids.append(lh.ledger_id)
            # striped ledger (E > WQ): batch read falls back to entry reads
            lh = await cc.bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
            await asyncio.gather(*(lh.append_async(payload(i)) for i in range(10)))
            got = await lh.batch_read(2, 5)
            assert [g.entry_id for g in got] == [2, 3, 4, 5, 6]
            await lh.close()
            ids.append(lh.ledger_id)
            assert sorted(await cc.bk.list_ledgers()) == sorted(ids)
            await cc.bk.delete_ledger(ids[0])
            assert ids[0] not in await cc.bk.list_ledgers()
            assert not await cc.bk.ledger_exists(ids[0])

    run(main())


def test_force_and_empty_ledger_close(tmp_path: Path) -> None:
    async def main() -> None:
        async with client_cluster(tmp_path, 2) as cc:
            lh = await cc.bk.create_ledger(ensemble_size=2, write_quorum_size=2, ack_quorum_size=2)
            await lh.close()
            md = await cc.bk.ledger_metadata(lh.ledger_id)
            assert md.is_closed and md.last_entry_id == -1 and md.length == 0
            lh = await cc.bk.create_ledger(ensemble_size=2, write_quorum_size=2, ack_quorum_size=2)
            futs = [lh.append_async(b"a" * 100) for _ in range(20)]
            assert await lh.force() == 19
            assert all(f.done() for f in futs)
            await lh.close()
            await lh.close()  # idempotent

    run(main())
