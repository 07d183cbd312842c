"""Ledger recovery against a bookie in limbo (rule 12 of docs/correctness.md): its EUNKNOWNLEDGERSTATE answers
count as neither positive nor negative (like an error or a timeout), so such a bookie can never
make recovery truncate a ledger. First at the level of the fencing and recovery reads (a fake
bookie client), then end to end with in-process bookies."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from client_testkit import run
from test_ledger_support import client_cluster

from vellum.client import recovery
from vellum.client.distribution import RoundRobinSchedule
from vellum.client.replica_read import NEGATIVE_ANSWERS
from vellum.errors import (
    LedgerRecoveryError,
    NoSuchEntryError,
    NoSuchLedgerError,
    TimeoutError_,
    UnknownLedgerStateError,
)
from vellum.format.entry import DigestManager, DigestType, master_key
from vellum.meta.model import LedgerMetadata

LEDGER = 9
DM = DigestManager(LEDGER, DigestType.CRC32C, b"pw")
ENSEMBLE = ["b1:1", "b2:1", "b3:1"]


def _schedule() -> RoundRobinSchedule:
    md = _md()
    return RoundRobinSchedule(md.ensemble_size, md.write_quorum_size, md.ack_quorum_size)


def _md() -> LedgerMetadata:
    return LedgerMetadata(ensemble_size=3, write_quorum_size=3, ack_quorum_size=2, ensembles={0: tuple(ENSEMBLE)},
                          password=b"pw")


class FakeBookies:
    """``read`` answers from a table: bookie -> entry id -> stored bytes or an exception."""

    def __init__(self, answers: dict[str, dict[int, Any]]) -> None:
        self.answers = answers
        self.fenced: set[str] = set()

    async def read(self, bookie: str, ledger_id: int, entry_id: int, *, fence_master_key: bytes | None = None,
                   timeout_s: float = 1.0) -> bytes:
        if fence_master_key is not None:
            self.fenced.add(bookie)
        answer = self.answers[bookie].get(entry_id, NoSuchEntryError("none"))
        if isinstance(answer, BaseException):
            raise answer
        return bytes(answer)


def _ctx(bookies: FakeBookies) -> Any:
    return SimpleNamespace(bookie_client=bookies, config=SimpleNamespace(read_entry_timeout_s=1.0))


def _entry(eid: int, lac: int) -> bytes:
    return DM.compute(eid, lac, 10 * (eid + 1), b"p" * 10)


def test_unknown_is_not_a_negative_answer() -> None:
    assert not issubclass(UnknownLedgerStateError, NEGATIVE_ANSWERS)
    assert issubclass(NoSuchEntryError, NEGATIVE_ANSWERS) and issubclass(NoSuchLedgerError, NEGATIVE_ANSWERS)


def test_recovery_read_never_declares_absent_on_unknown_answers() -> None:
    async def main() -> None:
        unknown = UnknownLedgerStateError("limbo")
        # One explicit negative and one "unknown": (WQ - AQ) + 1 = 2 negatives are needed.
        bookies = FakeBookies({"b1:1": {5: unknown}, "b2:1": {}, "b3:1": {5: TimeoutError_("slow")}})
        with pytest.raises(LedgerRecoveryError, match="neither readable nor absent"):
            await recovery._recovery_read(_ctx(bookies), DM, LEDGER, 5, ENSEMBLE, _schedule(), master_key(b"pw"))
        # Two explicit negatives do prove the entry was never acknowledged, "unknown" or not.
        bookies = FakeBookies({"b1:1": {5: unknown}, "b2:1": {}, "b3:1": {}})
        assert await recovery._recovery_read(_ctx(bookies), DM, LEDGER, 5, ENSEMBLE, _schedule(), master_key(b"pw")) is None
        # A positive answer elsewhere wins.
        bookies = FakeBookies({"b1:1": {5: unknown}, "b2:1": {5: _entry(5, 4)}, "b3:1": {}})
        found = await recovery._recovery_read(_ctx(bookies), DM, LEDGER, 5, ENSEMBLE, _schedule(), master_key(b"pw"))
        assert found is not None and found[1].entry_id == 5

    run(main())


def test_fencing_does_not_count_unknown_answers() -> None:
    async def main() -> None:
        unknown = UnknownLedgerStateError("limbo")
        # Ensemble coverage (E - AQ) + 1 = 2: one answer plus one "unknown" is not enough.
        bookies = FakeBookies({"b1:1": {-1: unknown}, "b2:1": {-1: TimeoutError_("down")},
                               "b3:1": {-1: _entry(19, 18)}})
        with pytest.raises(LedgerRecoveryError, match="fencing reached 1 of the 2"):
            await recovery._fence(_ctx(bookies), LEDGER, ENSEMBLE, _md(), DM, master_key(b"pw"))
        assert bookies.fenced == set(ENSEMBLE)
        bookies = FakeBookies({"b1:1": {-1: unknown}, "b2:1": {-1: _entry(41, 40)}, "b3:1": {-1: _entry(19, 18)}})
        lac, known = await recovery._fence(_ctx(bookies), LEDGER, ENSEMBLE, _md(), DM, master_key(b"pw"))
        assert lac == 40 and set(known) == {19, 41}

    run(main())


def payload(i: int) -> bytes:
    return b"e%d" % i


def test_a_limbo_bookie_cannot_make_recovery_truncate(tmp_path: Path) -> None:
    """E3 W3 A2. Entries 20..41 were acknowledged by b1 and b2 only; b1 lost them (limbo now),
    b2 is unreachable. Recovery must fail (retryably), not close the ledger at 19; once b2 is
    back it keeps every acknowledged entry. Without limbo, b1's "no such entry" answers would
    have let recovery close at 19 (shown first, on a twin ledger)."""

    async def main() -> None:
        async with client_cluster(tmp_path, 3) as cc:
            key = master_key(b"pw")

            async def ledger_with_tail_on(holder: str) -> tuple[int, list[str]]:
                """20 entries on every bookie, then 22 more written to ``holder`` only."""
                lh = await cc.bk.create_ledger(ensemble_size=3, write_quorum_size=3, ack_quorum_size=2,
                                               password=b"pw")
                for i in range(20):
                    await lh.append(payload(i))
                ensemble = [str(b) for b in lh.metadata.ensembles[0]]
                dm = DigestManager(lh.ledger_id, DigestType.CRC32C, b"pw")
                length = sum(len(payload(i)) for i in range(20))
                for i in range(20, 42):  # the writer's last adds; b1 "lost" them, b2 keeps them
                    length += len(payload(i))
                    await cc.bk.bookie_client.add(holder, key, dm.compute(i, i - 1, length, payload(i)), timeout_s=5)
                return lh.ledger_id, ensemble

            b1, b2 = cc.bookies[0].bookie_id, cc.bookies[1].bookie_id  # E = 3: b1, b2, b3 all
            twin, _ = await ledger_with_tail_on(b2)
            ledger_id, _ = await ledger_with_tail_on(b2)
            await cc.bookie(b2).stop()
            # Without limbo: b1 and b3 say "no such entry" for 20..: recovery truncates at 19.
            rh = await (await cc.new_client()).open_ledger(twin, password=b"pw")
            assert rh.metadata.last_entry_id == 19, "the danger limbo exists for"
            # With b1 in limbo: no decision without b2.
            limbo_bookie = cc.bookie(b1)
            assert limbo_bookie.opened is not None
            assert limbo_bookie.opened.bookie.mark_limbo(ledger_id, key)
            with pytest.raises(LedgerRecoveryError) as info:
                await (await cc.new_client()).open_ledger(ledger_id, password=b"pw")
            assert info.value.retryable
            await cc.bookie(b2).start()
            rh = await (await cc.new_client()).open_ledger(ledger_id, password=b"pw")
            assert rh.metadata.last_entry_id == 41, "recovery kept every acknowledged entry"
            got = await rh.read(0, 41)
            assert [g.payload for g in got] == [payload(i) for i in range(42)]

    run(main(), timeout_s=120)
