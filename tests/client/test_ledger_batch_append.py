"""``append_batch_async``: many entries in one call, one future, against real in-process bookies:
ids and completions in call order mixed with single appends, the in-flight bound, an ensemble
change in the middle of a batch, refusals, and ``force``/``close`` waiting for batch entries."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from client_testkit import run
from test_ledger_support import client_cluster

from vellum.client.bookie_client import BookieClient
from vellum.errors import IncorrectParameterError, LedgerClosedError, LedgerFencedError, TimeoutError_
from vellum.format.entry import DigestManager, DigestType


def payload(i: int) -> bytes:
    return f"batch-{i:05d}-".encode() * 6


def test_batches_and_single_appends_keep_call_order(tmp_path: Path) -> None:
    async def main() -> None:
        async with client_cluster(tmp_path, 3) as cc:
            lh = await cc.bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
            lh.max_adds_in_flight = 16  # most of each batch waits in the queue, built when sent
            completed: list[int] = []
            futures = []
            i = 0
            for size in (1, 40, 7, 100, 3):
                f = lh.append_async(payload(i))
                f.add_done_callback(lambda f: completed.append(f.result()))
                futures.append(f)
                i += 1
                b = lh.append_batch_async([payload(j) for j in range(i, i + size)])
                b.add_done_callback(lambda f: completed.append(f.result()))
                futures.append(b)
                i += size
            ids = await asyncio.gather(*futures)
            # a batch's future gives its last id
            assert ids == completed == sorted(ids), "futures complete in entry-id order"
            assert ids[-1] == i - 1 and lh.last_add_confirmed == i - 1
            assert lh.length == sum(len(payload(j)) for j in range(i))
            got = await lh.read(0, i - 1)
            assert [g.payload for g in got] == [payload(j) for j in range(i)]
            digest = DigestManager(lh.ledger_id, DigestType.CRC32C)
            for j in (1, 2, 45, i - 1):  # each stored entry carries the ledger's length up to it
                raw = await cc.bk.bookie_client.read(lh.metadata.ensembles[0][j % 3], lh.ledger_id, j, timeout_s=5)
                assert digest.verify(raw, j).length == sum(len(payload(k)) for k in range(j + 1))
            with pytest.raises(IncorrectParameterError, match="no entries"):
                await lh.append_batch_async([])
            await lh.close()
            with pytest.raises(LedgerClosedError):
                await lh.append_batch_async([b"late"])

    run(main())


def test_a_batch_of_entries_of_mixed_lengths_is_stored_entry_by_entry(tmp_path: Path) -> None:
    # The bookie client builds one ADD frame head per entry length of a batch and reuses it:
    # entries of other lengths in between must each get their own.
    async def main() -> None:
        async with client_cluster(tmp_path, 3) as cc:
            lh = await cc.bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
            entries = [bytes([k]) * (7, 300, 0, 7, 4096, 300)[k % 6] for k in range(60)]
            assert await lh.append_batch_async(entries) == 59
            got = await lh.read(0, 59)
            assert [g.payload for g in got] == entries
            assert lh.length == sum(map(len, entries))
            await lh.close()

    run(main())


def test_close_and_force_wait_for_every_batch_entry(tmp_path: Path) -> None:
    async def main() -> None:
        async with client_cluster(tmp_path, 3) as cc:
            lh = await cc.bk.create_ledger(ensemble_size=3, write_quorum_size=3, ack_quorum_size=2)
            lh.max_adds_in_flight = 8
            first = lh.append_batch_async([payload(j) for j in range(50)])
            second = lh.append_batch_async([memoryview(payload(j)) for j in range(50, 120)])
            assert await lh.force() == 119  # a barrier over both batches, entries without futures too
            assert first.result() == 49 and second.result() == 119
            lh.append_batch_async([payload(j) for j in range(120, 200)])
            await lh.close()  # waits for the batch even though nobody awaited its future
            rh = await (await cc.new_client()).open_ledger(lh.ledger_id)
            assert rh.last_add_confirmed == 199
            got = await rh.read(0, 199)
            assert [g.payload for g in got] == [payload(j) for j in range(200)]

    run(main())


def test_a_bookie_dying_in_the_middle_of_a_batch_changes_the_ensemble(tmp_path: Path) -> None:
    async def main() -> None:
        async with client_cluster(tmp_path, 4) as cc:
            lh = await cc.bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
            assert await lh.append_batch_async([payload(j) for j in range(30)]) == 29
            victim = lh.metadata.ensembles[0][1]
            lh.max_adds_in_flight = 20
            batch = lh.append_batch_async([payload(j) for j in range(30, 230)])
            await cc.bookie(victim).stop()
            assert await batch == 229
            md = lh.metadata
            assert len(md.ensembles) == 2 and victim not in md.last_ensemble
            await lh.close()
            rh = await (await cc.new_client()).open_ledger(lh.ledger_id)
            got = await rh.read(0, 229)
            assert [g.payload for g in got] == [payload(j) for j in range(230)]

    run(main())


def test_a_fenced_ledger_fails_the_whole_batch(tmp_path: Path) -> None:
    async def main() -> None:
        async with client_cluster(tmp_path, 3) as cc:
            lh = await cc.bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
            assert await lh.append_batch_async([payload(j) for j in range(10)]) == 9
            # another client recovers (fences) the ledger: the writer's next adds are refused
            other = await cc.new_client()
            rh = await other.open_ledger(lh.ledger_id, recovery=True)
            assert rh.last_add_confirmed == 9
            with pytest.raises(LedgerFencedError):
                await lh.append_batch_async([payload(j) for j in range(10, 40)])
            with pytest.raises(LedgerFencedError):
                await lh.append_batch_async([payload(40)])  # the writer stays failed

    run(main())


def _intercept_batches(bc: BookieClient, wrap: Callable[..., tuple[Any, ...]]) -> None:
    """Route every ``add_quorum_batch_cb`` of ``bc`` through ``wrap(args) -> args`` (the real
    client still sends each request and runs its timeouts)."""
    real = bc.add_quorum_batch_cb

    def intercepted(*args: Any) -> None:
        real(*wrap(*args))

    bc.add_quorum_batch_cb = intercepted  # type: ignore[method-assign]


def test_batch_entries_are_acknowledged_at_their_ack_quorum_and_in_entry_order(tmp_path: Path) -> None:
    """Answers of two of the three bookies are held back: with AQ 2 no entry of either batch is
    acknowledged on one bookie's answers; then the second bookie's answers come in reverse
    entry order and the LAC stays put until entry 0 has its quorum, then jumps over the whole
    contiguous prefix, and the two batch futures complete in order."""

    async def main() -> None:
        async with client_cluster(tmp_path, 3) as cc:
            lh = await cc.bk.create_ledger(ensemble_size=3, write_quorum_size=3, ack_quorum_size=2)
            ens = lh.metadata.ensembles[0]
            held: list[tuple[Any, Any, int, str, BaseException | None]] = []

            def hold(ensemble: Any, sets: Any, key: bytes, entries: Any, recovery: bool, callback: Any,
                     tokens: Any, timeout_s: float) -> tuple[Any, ...]:
                def answer(token: Any, idx: int, bid: str, exc: BaseException | None) -> None:
                    if bid == ens[2]:
                        callback(token, idx, bid, exc)
                    else:
                        held.append((callback, token, idx, bid, exc))
                return ensemble, sets, key, entries, recovery, answer, tokens, timeout_s

            _intercept_batches(cc.bk.bookie_client, hold)
            completed: list[int] = []
            first = lh.append_batch_async([payload(j) for j in range(20)])
            second = lh.append_batch_async([payload(j) for j in range(20, 40)])
            for f in (first, second):
                f.add_done_callback(lambda f: completed.append(f.result()))
            while len(held) < 80:  # bounded by run()'s cap
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)
            assert all(exc is None for *_x, exc in held)
            assert lh.last_add_confirmed == -1 and not first.done(), "acknowledged on one answer with AQ 2"
            from_b0 = sorted((h for h in held if h[3] == ens[0]), key=lambda h: -h[1].entry_id)
            for callback, token, idx, bid, exc in from_b0[:-1]:  # entries 39 .. 1
                callback(token, idx, bid, exc)
                await asyncio.sleep(0)
                assert lh.last_add_confirmed == -1 and not first.done() and not second.done(), (
                    f"entry {token.entry_id} acknowledged before entry 0 reached its quorum")
            callback, token, idx, bid, exc = from_b0[-1]
            assert token.entry_id == 0
            callback(token, idx, bid, exc)
            assert lh.last_add_confirmed == 39
            await asyncio.sleep(0)
            assert completed == [19, 39]
            for callback, token, idx, bid, exc in held:
                if bid == ens[1]:
                    callback(token, idx, bid, exc)  # late answers change nothing
            assert lh.last_add_confirmed == 39
            await lh.close()

    run(main())


def test_entries_of_a_batch_timing_out_on_one_bookie_are_resent_to_its_replacement(tmp_path: Path) -> None:
    """From entry 10 on, one bookie's requests go to a server that never answers: those entries
    (and only those) time out there, the ensemble changes at entry 10 and the replacement gets
    them; with AQ = WQ no entry is acknowledged before that, and every entry reads back."""

    async def main() -> None:
        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while await reader.read(65536):
                    pass
            finally:
                writer.close()

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        black_hole = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        try:
            async with client_cluster(tmp_path, 4, add_entry_timeout_s=0.5) as cc:
                lh = await cc.bk.create_ledger(ensemble_size=3, write_quorum_size=3, ack_quorum_size=3)
                victim = lh.metadata.ensembles[0][1]
                timed_out: list[int] = []

                def divert(ensemble: Any, sets: Any, key: bytes, entries: Any, recovery: bool, callback: Any,
                           tokens: Any, timeout_s: float) -> tuple[Any, ...]:
                    if ensemble[1] != victim:
                        return ensemble, sets, key, entries, recovery, callback, tokens, timeout_s
                    tokens = list(tokens)
                    late = [t.entry_id >= 10 for t in tokens]
                    diverted = [*ensemble[:1], black_hole, *ensemble[2:]]

                    def answer(token: Any, idx: int, bid: str, exc: BaseException | None) -> None:
                        if bid == black_hole:
                            assert isinstance(exc, TimeoutError_), exc
                            timed_out.append(token.entry_id)
                            bid = victim
                        callback(token, idx, bid, exc)

                    # the early entries as sent, the late ones with the victim's requests diverted
                    early_n = late.count(False)
                    if early_n:
                        cc_real(ensemble, sets[:early_n], key, entries[:early_n], recovery, callback,
                                tokens[:early_n], timeout_s)
                    return diverted, sets[early_n:], key, entries[early_n:], recovery, answer, tokens[early_n:], \
                        timeout_s

                cc_real = cc.bk.bookie_client.add_quorum_batch_cb
                _intercept_batches(cc.bk.bookie_client, divert)
                batch = lh.append_batch_async([payload(j) for j in range(30)])
                assert await asyncio.wait_for(batch, 20) == 29
                assert sorted(timed_out) == list(range(10, 30)), "only the diverted requests time out"
                md = lh.metadata
                assert len(md.ensembles) == 2 and victim not in md.last_ensemble
                assert list(md.ensembles)[1] == 10, "the new segment starts after the acknowledged prefix"
                await lh.close()
                rh = await (await cc.new_client()).open_ledger(lh.ledger_id)
                got = await rh.read(0, 29)
                assert [g.payload for g in got] == [payload(j) for j in range(30)]
        finally:
            server.close()
            await server.wait_closed()

    run(main())
