"""The bookie's data-integrity check (``admin/integrity_check.py``) with in-process bookies: which
entries a bookie should hold, the limbo marking from the metadata store, and the copy-back of
closed, open and deleted limbo ledgers (limbo cleared only once everything is back)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from client_testkit import run
from test_ledger_support import client_cluster

from vellum.admin.integrity_check import (
    IntegrityCheck,
    Segment,
    entries_to_hold,
    ledgers_of_bookie,
    segments_to_hold,
)
from vellum.errors import UnknownLedgerStateError
from vellum.format.entry import DigestManager, DigestType, master_key
from vellum.ids import BookieId
from vellum.meta.model import LedgerMetadata, LedgerState


def _md(ensembles: dict[int, tuple[str, ...]], *, closed_at: int | None = None, e: int = 3, w: int = 2,
        a: int = 2) -> LedgerMetadata:
    md = LedgerMetadata(ensemble_size=e, write_quorum_size=w, ack_quorum_size=a,
                        ensembles={k: tuple(BookieId(b) for b in v) for k, v in ensembles.items()})
    return md.closed(closed_at, 0) if closed_at is not None else md


def test_segments_and_entries_to_hold() -> None:
    md = _md({0: ("a", "b", "c"), 10: ("a", "d", "c"), 20: ("e", "d", "c")}, closed_at=25)
    assert segments_to_hold(md, "a") == [Segment(0, 9, ("a", "b", "c"), 0), Segment(10, 19, ("a", "d", "c"), 0)]
    assert segments_to_hold(md, "c")[-1] == Segment(20, 25, ("e", "d", "c"), 2)
    assert segments_to_hold(md, "x") == []
    # W2 over E3: index 0 holds entries e with e % 3 in (0, 2)
    assert entries_to_hold(md, Segment(0, 9, ("a", "b", "c"), 0)) == [0, 2, 3, 5, 6, 8, 9]
    # open ledger: the last segment's end is unknown and is never copied
    open_md = _md({0: ("a", "b", "c"), 10: ("a", "d", "c")})
    assert segments_to_hold(open_md, "a") == [Segment(0, 9, ("a", "b", "c"), 0)]
    assert segments_to_hold(open_md, "d") == []
    # an empty closed ledger, and a segment replaced before any entry
    assert segments_to_hold(_md({0: ("a", "b", "c")}, closed_at=-1), "a") == []


def payload(i: int) -> bytes:
    return b"p%d" % i


def test_limbo_ledgers_are_copied_back_then_cleared(tmp_path: Path) -> None:
    async def main() -> None:
        async with client_cluster(tmp_path, 3) as cc:
            key = master_key(b"pw")
            b1, b2, b3 = (b.bookie_id for b in cc.bookies)

            async def ledger(tail_to: tuple[str, ...], tail: int) -> int:
                """20 entries on every bookie, then ``tail`` more on ``tail_to`` only (E3 W3 A2)."""
                lh = await cc.bk.create_ledger(ensemble_size=3, write_quorum_size=3, ack_quorum_size=2,
                                               password=b"pw")
                for i in range(20):
                    await lh.append(payload(i))
                dm = DigestManager(lh.ledger_id, DigestType.CRC32C, b"pw")
                length = sum(len(payload(i)) for i in range(20))
                for i in range(20, 20 + tail):
                    length += len(payload(i))
                    for b in tail_to:
                        await cc.bk.bookie_client.add(b, key, dm.compute(i, i - 1, length, payload(i)), timeout_s=5)
                return lh.ledger_id

            closed = await ledger((b2, b3), 22)
            await (await cc.new_client()).open_ledger(closed, password=b"pw")  # closed at 41
            still_open = await ledger((b2, b3), 5)
            deleted = await ledger((b2, b3), 0)
            bookie1 = cc.bookie(b1)
            assert bookie1.opened is not None and bookie1.async_bookie is not None
            bookie = bookie1.opened.bookie
            held = await asyncio.to_thread(ledgers_of_bookie, cc.store.ledgers, b1)
            assert set(held) == {closed, still_open, deleted}
            for lid, md in held.items():
                assert bookie.mark_limbo(lid, master_key(md.password))
            await cc.bk.delete_ledger(deleted)
            with pytest.raises(UnknownLedgerStateError):
                bookie.read_entry(closed, 30)

            check = IntegrityCheck(bookie=bookie, async_bookie=bookie1.async_bookie, client=cc.bk, bookie_id=b1,
                                   retry_interval_s=0.1)
            await check.run()
            assert bookie.limbo.ids() == []
            for lid, last in ((closed, 41), (still_open, 24)):
                md = await cc.bk.ledger_metadata(lid)
                assert md.state is LedgerState.CLOSED and md.last_entry_id == last
                dm = DigestManager(lid, DigestType.CRC32C, b"pw")
                for e in range(last + 1):
                    raw = await cc.bk.bookie_client.read(b1, lid, e, timeout_s=5)
                    assert dm.verify(raw, e).payload == payload(e)

    run(main(), timeout_s=120)
