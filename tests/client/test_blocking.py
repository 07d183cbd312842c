"""The blocking facade (``vellum.BookKeeper``) end to end against in-process bookies.

The bookies run on the test's loop; the blocking client runs on its own loop thread, driven
from a worker thread (``asyncio.to_thread``) so the bookies keep serving meanwhile.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from pathlib import Path

import pytest
from client_testkit import run
from test_ledger_support import FAST, client_cluster

import vellum
from vellum.config import ClientConfig
from vellum.errors import LedgerClosedError, LedgerFencedError


def test_blocking_end_to_end(tmp_path: Path) -> None:
    async def main() -> None:
        async with client_cluster(tmp_path, 3) as cc:
            await asyncio.to_thread(_scenario, cc.uri)

    run(main())


def _scenario(uri: str) -> None:
    cfg = ClientConfig(**FAST)
    with vellum.BookKeeper(uri, config=cfg) as bk:
        lh = bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2, password=b"b")
        assert lh.append(b"first") == 0
        futs = [lh.append_async(f"e{i}".encode()) for i in range(1, 200)]
        assert all(isinstance(f, concurrent.futures.Future) for f in futs)
        assert [f.result(timeout=30) for f in futs] == list(range(1, 200))
        assert lh.last_add_confirmed == 199
        assert [e.payload for e in lh.read(0, 2)] == [b"first", b"e1", b"e2"]
        assert len(lh.batch_read(0, 10)) == 10
        assert lh.force() == 199
        # pipelined entries all carried LAC 0: one more entry tells the bookies LAC 199
        assert lh.append(b"tail") == 200

        with vellum.BookKeeper(uri, config=cfg) as reader_bk:
            rh = reader_bk.open_ledger(lh.ledger_id, password=b"b", recovery=False)
            assert rh.read_last_add_confirmed() == 199
            it = rh.tail(195, poll_timeout_s=0.1)
            assert [next(it).entry_id for _ in range(4)] == [195, 196, 197, 198]
            it.close()
            lh.close()
            assert lh.is_closed
            with pytest.raises(LedgerClosedError):
                lh.append(b"x")
            assert [e.entry_id for e in rh.tail(190, poll_timeout_s=0.1)] == list(range(190, 201))
            assert lh.ledger_id in reader_bk.list_ledgers()
            assert reader_bk.ledger_metadata(lh.ledger_id).last_entry_id == 200

        # fencing through the facade
        w = bk.create_ledger(ensemble_size=2, write_quorum_size=2, ack_quorum_size=2)
        w.append(b"a")
        with vellum.BookKeeper(uri, config=cfg) as other:
            r = other.open_ledger(w.ledger_id)
            assert r.metadata.last_entry_id == 0
        with pytest.raises(LedgerFencedError):
            w.append(b"b")
        f = w.append_async(b"c")
        with pytest.raises(LedgerFencedError):
            f.result(timeout=10)
        bk.delete_ledger(w.ledger_id)
        assert w.ledger_id not in bk.list_ledgers()
    bk.close()  # idempotent
