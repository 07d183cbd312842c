"""Which bookie replaces a failed one when the ledger's spares ran out (rule 11 of
docs/correctness.md, "When no spare is left"). Real in-process bookies; a bookie "fails" by
turning read-only (its adds answered EREADONLY, as a full disk or a failed journal does).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from client_testkit import run
from test_ledger_support import client_cluster


def _bookie_by_id(cc, bookie_id: str):  # type: ignore[no-untyped-def]
    for b in cc.bookies:
        if b.bookie_id == bookie_id:
            assert b.opened is not None
            return b.opened.bookie
    raise AssertionError(f"no bookie {bookie_id}")


def test_a_writer_without_never_failed_spares_takes_back_a_recovered_bookie(tmp_path: Path) -> None:
    async def main() -> None:
        async with client_cluster(tmp_path, 4) as cc:
            lh = await cc.bk.create_ledger(ensemble_size=3, write_quorum_size=3, ack_quorum_size=2)
            await lh.append(b"e0")
            a, b, c = (str(x) for x in lh.metadata.ensembles[0])
            # a fails: the only spare (never failed) replaces it
            _bookie_by_id(cc, a).set_forced_read_only(True)
            await lh.append(b"e1")
            await lh.append(b"e2")
            ensemble = [str(x) for x in lh.metadata.ensembles[max(lh.metadata.ensembles)]]
            assert a not in ensemble, ensemble
            # a recovers; then b fails: a is the only bookie outside the ensemble, and it failed before
            _bookie_by_id(cc, a).set_forced_read_only(False)
            _bookie_by_id(cc, b).set_forced_read_only(True)
            for i in range(3, 8):
                await lh.append(b"e%d" % i)
            await lh.close()
            last = [str(x) for x in lh.metadata.ensembles[max(lh.metadata.ensembles)]]
            assert b not in last, f"the failing bookie {b} was kept in the ensemble {last}"
            assert a in last and c in last, last

    run(main())


def test_a_writer_with_no_bookie_left_keeps_the_ack_quorum_and_says_so(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """No candidate at all (3 bookies, 3 in the ensemble): the adds go on to the bookies that
    still answer while every write set keeps its ack quorum, with a warning, and the change is
    retried (it succeeds once a bookie joins; here none does)."""
    async def main() -> None:
        async with client_cluster(tmp_path, 3) as cc:
            lh = await cc.bk.create_ledger(ensemble_size=3, write_quorum_size=3, ack_quorum_size=2)
            await lh.append(b"e0")
            a = str(lh.metadata.ensembles[0][0])
            _bookie_by_id(cc, a).set_forced_read_only(True)
            with caplog.at_level(logging.WARNING, logger="vellum.client.ledger_writer"):
                for i in range(1, 6):
                    assert await lh.append(b"e%d" % i) == i
            assert "no replacement for failed bookies" in caplog.text
            assert [e.payload for e in await lh.read(0, 5)] == [b"e%d" % i for i in range(6)]

    run(main())
