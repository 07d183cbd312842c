"""The small, I/O-free parts of a ledger handle's roles, without bookies: the shared
``LedgerView`` (LAC only forward, a close fixes it), ``collect_answers`` (when a quorum wait
stops, what it cancels) and the writer's metadata updates (``on_ensemble_change`` runs before
every compare-and-set, ``metadata_writes=False`` never writes, conflict rules)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from client_testkit import run

from vellum.client.ledger_view import LedgerView
from vellum.client.metadata_update import LedgerMetadataUpdater
from vellum.client.replica_read import collect_answers
from vellum.errors import LedgerFencedError, LedgerRecoveryError, MetadataVersionError
from vellum.format.entry import DigestManager, DigestType
from vellum.ids import BookieId
from vellum.meta.api import Versioned
from vellum.meta.model import DigestType as MetaDigestType
from vellum.meta.model import LedgerMetadata, LedgerState

LEDGER = 7


def _metadata(state: LedgerState = LedgerState.OPEN, ensembles: dict[int, tuple[str, ...]] | None = None
              ) -> LedgerMetadata:
    ens = ensembles or {0: ("a:1", "b:1", "c:1")}
    return LedgerMetadata(
        ensemble_size=3, write_quorum_size=2, ack_quorum_size=2,
        ensembles={k: tuple(BookieId(b) for b in v) for k, v in ens.items()},
        digest_type=MetaDigestType(3), password=b"", state=state,
    )


def _view(md: LedgerMetadata, version: int = 1) -> LedgerView:
    return LedgerView(LEDGER, Versioned(md, version), DigestManager(LEDGER, DigestType.CRC32C, b""))


class _Store:
    """A metadata store of one ledger with CAS versions, as the writer sees it through its context."""

    def __init__(self, md: LedgerMetadata, version: int = 1) -> None:
        self.current = Versioned(md, version)
        self.writes: list[LedgerMetadata] = []

    async def read_metadata(self, ledger_id: int) -> Versioned[LedgerMetadata]:
        return self.current

    async def write_metadata(self, ledger_id: int, md: LedgerMetadata, expected_version: int) -> int:
        if expected_version != self.current.version:
            raise MetadataVersionError("version changed")
        self.writes.append(md)
        self.current = Versioned(md, expected_version + 1)
        return self.current.version


def _updater(store: _Store, view: LedgerView, **kw: Any) -> LedgerMetadataUpdater:
    return LedgerMetadataUpdater(store, view, **kw)  # type: ignore[arg-type]  # the store fakes the context


# ------------------------------------------------------------------------------- the view


def test_view_lac_moves_only_forward_and_a_close_fixes_it() -> None:
    async def main() -> None:
        view = _view(_metadata())
        assert (view.lac, view.lac_length, view.closed) == (-1, 0, False)
        view.set_lac(5, 50)
        view.set_lac(3, 30)
        assert (view.lac, view.lac_length) == (5, 50)
        view.set_lac(6, None)  # learnt from a piggy-backed LAC: the length stays unknown
        assert (view.lac, view.lac_length) == (6, 50)
        waiter = asyncio.ensure_future(view.wait_for_lac(6, 5.0))
        await asyncio.sleep(0)
        view.adopt(Versioned(_metadata().closed(9, 90), 2))
        await asyncio.wait_for(waiter, 1.0)  # adopting a close wakes the waiters
        assert (view.lac, view.lac_length, view.metadata_version) == (9, 90, 2)

    run(main())


def test_view_ensemble_follows_the_adopted_metadata() -> None:
    async def main() -> None:
        view = _view(_metadata())
        md = _metadata(ensembles={0: ("a:1", "b:1", "c:1"), 4: ("a:1", "d:1", "c:1")})
        view.adopt(Versioned(md, 3))
        assert view.ensemble == ["a:1", "d:1", "c:1"] and view.metadata_version == 3

    run(main())


# ------------------------------------------------------------------------- collect_answers


def test_collect_answers_stops_at_enough_and_cancels_the_rest() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        futures = {loop.create_future(): i for i in range(4)}
        seen: list[int] = []

        def on_answer(i: int, f: asyncio.Future[int]) -> bool:
            seen.append(i)
            return False

        for f, i in list(futures.items())[:2]:
            f.set_result(i)
        stopped = await collect_answers(futures, on_answer, lambda: len(seen) >= 2)
        assert stopped and sorted(seen) == [0, 1]
        assert all(f.cancelled() for f, i in futures.items() if i >= 2)

    run(main())


def test_collect_answers_reports_false_when_all_answered_without_enough() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        futures = {loop.create_future(): i for i in range(3)}
        for f in futures:
            f.set_exception(RuntimeError("down"))
        assert not await collect_answers(futures, lambda i, f: f.exception() is None, lambda: False)

    run(main())


def test_collect_answers_can_leave_the_rest_running() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        first, second = loop.create_future(), loop.create_future()
        first.set_result(b"fenced")
        assert await collect_answers({first: 0, second: 1}, lambda i, f: True, lambda: False, cancel_rest=False)
        assert not second.done(), "a fencing read still in flight keeps fencing its bookie"
        second.cancel()

    run(main())


# ----------------------------------------------------------------------- metadata updates


def test_ensemble_change_hook_runs_before_the_cas_and_may_refuse() -> None:
    async def main() -> None:
        store = _Store(_metadata())
        view = _view(store.current.value)
        order: list[str] = []

        async def hook(md: LedgerMetadata) -> None:
            order.append(f"hook:{len(store.writes)}:{list(md.last_ensemble)}")

        await _updater(store, view, recovery=False, on_ensemble_change=hook).add_segment(5, ["a:1", "d:1", "c:1"])
        assert order == ["hook:0:['a:1', 'd:1', 'c:1']"], "the hook sees the new segment before it is written"
        assert view.metadata.ensembles[5] == ("a:1", "d:1", "c:1") and view.metadata_version == 2
        assert view.ensemble == ["a:1", "d:1", "c:1"]

        async def refuse(md: LedgerMetadata) -> None:
            raise LedgerFencedError("the name record moved on")

        with pytest.raises(LedgerFencedError):
            await _updater(store, view, recovery=False, on_ensemble_change=refuse).add_segment(9, ["e:1", "d:1", "c:1"])
        assert len(store.writes) == 1, "a refused change writes nothing"

    run(main())


def test_a_probe_never_writes_the_metadata() -> None:
    async def main() -> None:
        store = _Store(_metadata())
        view = _view(store.current.value, version=-1)
        probe = _updater(store, view, recovery=True, metadata_writes=False)
        with pytest.raises(LedgerRecoveryError):
            await probe.add_segment(3, ["a:1", "d:1", "c:1"])
        with pytest.raises(LedgerRecoveryError):
            await probe.close(2, 20)
        assert store.writes == []

    run(main())


def test_close_conflicts_follow_rule_10() -> None:
    async def main() -> None:
        # Someone else closed at another entry: a writer is fenced, a recoverer accepts it.
        store = _Store(_metadata().closed(4, 40), version=5)
        with pytest.raises(LedgerFencedError):
            await _updater(store, _view(_metadata()), recovery=False).close(6, 60)
        view = _view(_metadata(LedgerState.IN_RECOVERY))
        got = await _updater(store, view, recovery=True).close(6, 60)
        assert got.value.last_entry_id == 4 and view.lac == 4 and store.writes == []
        # Only an earlier segment changed (re-replication): rebase and close on top of it.
        base = _metadata(ensembles={0: ("a:1", "b:1", "c:1"), 5: ("a:1", "d:1", "c:1")})
        store = _Store(_metadata(ensembles={0: ("x:1", "b:1", "c:1"), 5: ("a:1", "d:1", "c:1")}), version=8)
        view = _view(base, version=7)
        got = await _updater(store, view, recovery=False).close(6, 60)
        assert got.version == 9 and got.value.ensembles[0][0] == "x:1" and got.value.last_entry_id == 6

    run(main())
