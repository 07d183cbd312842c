"""A recovery writer's ensemble changes are written with its close, not when they happen
(``client/metadata_update.py``): a recovery that fails half way must leave the metadata naming
the ensembles the old writer wrote to. Found by the simulator (docs/verification.md); the
simulator's seeds with ``persist-recovery-segments`` show the acknowledged entry it loses."""

from __future__ import annotations

from client_testkit import run
from test_ledger_roles import _metadata, _Store, _updater, _view

from vellum.meta.model import LedgerState


def test_a_recovery_writers_segment_is_written_only_with_its_close() -> None:
    async def main() -> None:
        md = _metadata(LedgerState.IN_RECOVERY)
        store = _Store(md, version=3)
        view = _view(md, version=3)
        updater = _updater(store, view, recovery=True)
        await updater.add_segment(5, ["a:1", "d:1", "c:1"])
        assert store.writes == []  # a recoverer that dies now leaves the writer's ensembles
        assert view.ensemble == ["a:1", "d:1", "c:1"] and view.metadata_version == 3
        await updater.add_segment(6, ["a:1", "d:1", "e:1"])
        got = await updater.close(7, 70)
        assert len(store.writes) == 1 and got.version == 4
        assert got.value.state is LedgerState.CLOSED and got.value.last_entry_id == 7
        assert sorted(got.value.ensembles) == [0, 5, 6] and got.value.ensembles[6][2] == "e:1"

    run(main())


def test_a_close_rebases_the_deferred_segments_over_an_earlier_segments_change() -> None:
    async def main() -> None:
        md = _metadata(LedgerState.IN_RECOVERY, {0: ("a:1", "b:1", "c:1"), 5: ("a:1", "b:1", "c:1")})
        store = _Store(md, version=3)
        view = _view(md, version=3)
        updater = _updater(store, view, recovery=True)
        await updater.add_segment(8, ["a:1", "d:1", "c:1"])
        # re-replication changed the closed segment meanwhile
        store.current = type(store.current)(
            _metadata(LedgerState.IN_RECOVERY, {0: ("x:1", "b:1", "c:1"), 5: ("a:1", "b:1", "c:1")}), 4)
        got = await updater.close(9, 90)
        assert got.value.ensembles[0][0] == "x:1" and got.value.ensembles[8][1] == "d:1"
        assert got.value.last_entry_id == 9 and got.version == 5

    run(main())


def test_a_writers_segment_is_still_written_at_once() -> None:
    async def main() -> None:
        md = _metadata()
        store = _Store(md, version=3)
        updater = _updater(store, _view(md, version=3), recovery=False)
        await updater.add_segment(5, ["a:1", "d:1", "c:1"])
        assert len(store.writes) == 1 and store.current.version == 4

    run(main())
