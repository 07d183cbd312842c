"""The public building blocks named ledgers (and other layers) use: ``BookKeeper.context``,
``recovery.fence_ledger`` / ``recover_tail``, ``LedgerHandle.abandon``, the blocking client's
``run`` and its ``close`` stopping named writers' timers, ``EntriesShrunkError``."""

from __future__ import annotations

import asyncio
import concurrent.futures
from pathlib import Path

import pytest
from client_testkit import run
from test_ledger_support import FAST, client_cluster

import vellum
from vellum.client import named as named_module
from vellum.client.ledger import RECOVERY, LedgerHandle
from vellum.client.named import NamedLedgers, OpenMode
from vellum.client.named_blocking import NamedLedgers as BlockingNamedLedgers
from vellum.client.recovery import fence_ledger, recover_tail
from vellum.config import ClientConfig
from vellum.errors import (
    ClientClosedError,
    EntriesShrunkError,
    IllegalOpError,
    LedgerClosedError,
    LedgerFencedError,
    NoSuchEntryError,
)
from vellum.meta.model import LedgerState


def test_entries_shrunk_error_lives_in_errors_and_is_re_exported() -> None:
    assert named_module.EntriesShrunkError is EntriesShrunkError
    assert issubclass(EntriesShrunkError, NoSuchEntryError)
    assert EntriesShrunkError.code == NoSuchEntryError.code


def test_fence_and_recover_tail_write_no_metadata(tmp_path: Path) -> None:
    async def main() -> None:
        async with client_cluster(tmp_path, 3) as cc:
            assert cc.bk.context.bookie_client is cc.bk.bookie_client
            lh = await cc.bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2, password=b"p")
            assert await asyncio.gather(*(lh.append_async(b"e%d" % i) for i in range(20))) == list(range(20))
            other = await cc.new_client()
            ctx = other.context
            current = await ctx.read_metadata(lh.ledger_id)
            fenced = await fence_ledger(ctx, lh.ledger_id, current.value, b"p")
            assert -1 <= fenced.lac <= 19 and fenced.lengths  # pipelined entries carry an old LAC
            with pytest.raises(LedgerFencedError):
                await lh.append(b"after the fence")
            probe = LedgerHandle(ctx, lh.ledger_id, current, b"p", mode=RECOVERY)
            try:
                assert await recover_tail(ctx, probe, b"p") == (19, sum(len(b"e%d" % i) for i in range(20)))
            finally:
                probe.abandon()
            assert probe not in ctx.writers
            after = await ctx.read_metadata(lh.ledger_id)
            assert after.version == current.version and after.value.state is LedgerState.OPEN
            with pytest.raises(LedgerClosedError):
                await probe.append(b"x")

    run(main())


def test_abandon_fails_queued_adds_and_leaves_the_metadata_alone(tmp_path: Path) -> None:
    async def main() -> None:
        async with client_cluster(tmp_path, 2, explicit_lac_interval_ms=50) as cc:
            lh = await cc.bk.create_ledger(ensemble_size=2, write_quorum_size=2, ack_quorum_size=2)
            assert lh in cc.bk.context.writers
            lh.max_adds_in_flight = 2
            futures = [lh.append_async(b"x") for _ in range(50)]
            lh.abandon()
            results = await asyncio.gather(*futures, return_exceptions=True)
            assert any(isinstance(r, LedgerClosedError) for r in results)
            assert lh not in cc.bk.context.writers and not lh.is_writable
            assert (await cc.bk.ledger_metadata(lh.ledger_id)).state is LedgerState.OPEN
            lh.abandon()  # idempotent

    run(main())


def test_blocking_run_and_close_stop_named_writer_timers(tmp_path: Path) -> None:
    async def main() -> None:
        async with client_cluster(tmp_path, 3) as cc:
            await asyncio.to_thread(_blocking_scenario, cc.uri)

    run(main())


def _blocking_scenario(uri: str) -> None:
    bk = vellum.BookKeeper(uri, config=ClientConfig(**{**FAST, "explicit_lac_interval_ms": 50}))
    try:
        named = BlockingNamedLedgers(bk)
        w = named.open("api/timers", OpenMode.CREATE, ensemble_size=2, write_quorum_size=2, ack_quorum_size=2)
        assert w.append(b"a") == 0
        writer = w.aio._writer
        assert writer is not None and writer in bk.aio.context.writers
        assert bk.run(_lac_timer_armed(writer)) is True

        # run() refuses the loop thread (it would deadlock) and closes the coroutine unrun
        out: concurrent.futures.Future[BaseException | None] = concurrent.futures.Future()

        def on_loop() -> None:
            coro = asyncio.sleep(0)
            try:
                bk.run(coro)
                out.set_result(None)
            except BaseException as e:
                out.set_result(e)

        bk.loop.call_soon_threadsafe(on_loop)
        assert isinstance(out.result(timeout=10), IllegalOpError)
        with pytest.raises(TimeoutError):
            bk.run(asyncio.sleep(5), timeout_s=0.05)
        assert isinstance(bk.run(NamedLedgers(bk.aio).list("api/")), list)
    finally:
        bk.close()
    assert writer.writer is not None and not writer.writer.timers_armed, (
        "closing the client must stop the named writer's timers"
    )
    with pytest.raises(ClientClosedError):
        bk.run(asyncio.sleep(0))


async def _lac_timer_armed(h: LedgerHandle) -> bool:
    return h.writer is not None and h.writer.timers_armed
