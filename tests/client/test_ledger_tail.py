"""Tailing readers: LAC reads, long poll, explicit LAC, tail() to the end of a closed ledger."""

from __future__ import annotations

import asyncio
from pathlib import Path

from client_testkit import run
from test_ledger_support import client_cluster


def payload(i: int) -> bytes:
    return f"t{i}".encode() * 10


def test_tailing_reader_sees_every_entry_in_order(tmp_path: Path) -> None:
    async def main() -> None:
        async with client_cluster(tmp_path, 3, explicit_lac_interval_ms=50) as cc:
            lh = await cc.bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
            reader_client = await cc.new_client(explicit_lac_interval_ms=50)
            rh = await reader_client.open_ledger(lh.ledger_id, recovery=False)
            seen: list[int] = []
            payloads: list[bytes] = []

            async def tail() -> None:
                async for entry in rh.tail(0, poll_timeout_s=0.2):
                    seen.append(entry.entry_id)
                    payloads.append(entry.payload)

            task = asyncio.create_task(tail())
            for burst in range(5):
                await asyncio.gather(*(lh.append_async(payload(burst * 20 + i)) for i in range(20)))
                await asyncio.sleep(0.05)
            # the last entries are visible through the explicit LAC before the close
            await asyncio.wait_for(_until(lambda: len(seen) == 100), 20)
            await lh.close()
            await asyncio.wait_for(task, 20)  # ends once CLOSED is noticed
            assert seen == list(range(100))
            assert payloads == [payload(i) for i in range(100)]

    run(main())


async def _until(predicate: object) -> None:
    while not predicate():  # type: ignore[operator]
        await asyncio.sleep(0.02)


def test_lac_reads_and_long_poll(tmp_path: Path) -> None:
    async def main() -> None:
        async with client_cluster(tmp_path, 3) as cc:
            lh = await cc.bk.create_ledger(ensemble_size=3, write_quorum_size=3, ack_quorum_size=2)
            rh = await (await cc.new_client()).open_ledger(lh.ledger_id, recovery=False)
            assert rh.last_add_confirmed == -1
            for i in range(10):
                await lh.append(payload(i))
            # entry 9 carries LAC 8
            assert await rh.read_last_add_confirmed() == 8
            assert await rh.try_read_last_add_confirmed() == 8
            waiter = asyncio.ensure_future(rh.wait_for_lac(8, 10.0))
            await asyncio.sleep(0.05)
            await lh.append(payload(10))
            assert await asyncio.wait_for(waiter, 10) >= 9
            # a long poll that times out answers with what is known
            assert await rh.wait_for_lac(rh.last_add_confirmed, 0.1) == rh.last_add_confirmed
            got = await rh.read(0, rh.last_add_confirmed)
            assert [g.payload for g in got] == [payload(i) for i in range(len(got))]
            # the writer's own tail
            items = []
            async for e in lh.tail(8, poll_timeout_s=0.1):
                items.append(e.entry_id)
                if e.entry_id == 10:
                    break
            assert items == [8, 9, 10]
            await lh.close()
            closed = [e.entry_id async for e in rh.tail(5, poll_timeout_s=0.1)]
            assert closed == list(range(5, 11))

    run(main())
