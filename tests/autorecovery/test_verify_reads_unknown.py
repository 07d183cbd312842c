"""A verified check of a fragment that ends with an unknown answer (a read timed out): the
reads it still had queued or in flight are given up with it, and a worker's retry checks the
bookie that did not answer first (unit tests of ``FragmentCopier.holds`` and the worker's
``_bad_fragments`` over a scripted bookie client; the end-to-end behaviour, on real bookies, is
tests/autorecovery/test_worker_copy_sources.py and test_autorecovery_cluster.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from vellum.autorecovery.copier import FragmentCopier
from vellum.autorecovery.fragments import fragments
from vellum.autorecovery.settings import AutoRecoverySettings
from vellum.autorecovery.worker import ReplicationWorker
from vellum.errors import TimeoutError_
from vellum.format.entry import DigestManager, DigestType
from vellum.ids import BookieId
from vellum.meta.model import LedgerMetadata, LedgerState

LID = 5
PASSWORD = b"pw"


def _md(last_entry: int, ensemble: tuple[str, ...] = ("a", "b", "c")) -> LedgerMetadata:
    return LedgerMetadata(len(ensemble), len(ensemble), 2, {0: tuple(BookieId(b) for b in ensemble)},
                          password=PASSWORD, state=LedgerState.CLOSED, last_entry_id=last_entry)


class _Bookies:
    """Answers READ at once with the entry, except from ``silent`` bookies: those time out, the
    first read after ``fail_after`` s, the others never answer (in flight until cancelled)."""

    def __init__(self, silent: set[str], fail_after: float = 0.01) -> None:
        self.silent = silent
        self.fail_after = fail_after
        self.reads: list[tuple[str, int]] = []
        self._failed = False
        self._digest = DigestManager(LID, DigestType.CRC32C, PASSWORD)

    async def read(self, bookie: str, ledger_id: int, entry_id: int, *, timeout_s: float) -> bytes:
        self.reads.append((bookie, entry_id))
        if bookie in self.silent:
            if not self._failed:
                self._failed = True
                await asyncio.sleep(self.fail_after)
                raise TimeoutError_(f"READ {ledger_id}:{entry_id} on {bookie} timed out")
            await asyncio.sleep(3600)
        return bytes(self._digest.compute(entry_id, entry_id - 1, 10 * (entry_id + 1), b"x" * 10))


def test_a_check_that_ends_unknown_gives_up_its_other_reads() -> None:
    async def main() -> tuple[int, int, int]:
        bookies = _Bookies({"a"})
        copier = FragmentCopier(bookies, batch=3, rate_bytes=-1, timeout_s=1.0)  # type: ignore[arg-type]
        md = _md(29)
        fragment = next(fragments(LID, md))  # a's: every entry (E3 W3)
        with pytest.raises(TimeoutError_):
            await copier.holds(fragment, md, verify=True)
        issued = len(bookies.reads)
        await asyncio.sleep(0.1)
        return copier.window.in_flight, issued, len(bookies.reads)

    in_flight, issued, later = asyncio.run(main())
    # nothing of the check holds the window's slots afterwards, and no read starts after it ended
    assert in_flight == 0
    assert later == issued < 30


def test_a_retry_checks_the_bookie_that_did_not_answer_first() -> None:
    async def main() -> list[list[tuple[str, int]]]:
        bookies = _Bookies({"c"})
        bk = SimpleNamespace(context=SimpleNamespace(bookie_client=bookies, writable_bookies=["a", "b", "c"],
                                                     read_only_bookies=[]),
                             store=SimpleNamespace(kv=None))
        worker = ReplicationWorker(bk, AutoRecoverySettings(yield_target_s=None), worker_id="w")  # type: ignore[arg-type]
        md = _md(9)
        rounds = []
        for _ in range(2):
            bookies.reads.clear()
            bookies._failed = False
            with pytest.raises(TimeoutError_):
                await worker._bad_fragments(LID, md, {"a", "c"})
            rounds.append(list(bookies.reads))
        return rounds

    first, retry = asyncio.run(main())
    assert {b for b, _e in first} == {"a", "c"}  # in fragment order: a's entries verified, then c's
    assert retry and all(b == "c" for b, _e in retry)  # c first: the retry fails without reading a's again

