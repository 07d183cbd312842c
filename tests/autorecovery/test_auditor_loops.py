"""The auditor notices a lost bookie while a long audit pass is running: the lost-bookie watch
does not wait behind the periodic ledger check (a pass over many ledgers can take minutes).

Real bookie processes and the embedded metadata store; the auditor runs in this process with
its ledger check held open (as a long pass would be) until the test ends."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from vellum.autorecovery.auditor import Auditor
from vellum.autorecovery.fragments import bookies_of
from vellum.autorecovery.settings import AutoRecoverySettings
from vellum.client.bookkeeper import BookKeeper
from vellum.testing.local_cluster import LocalCluster


class _LongLedgerCheck(Auditor):
    """An auditor whose periodic ledger check does not finish while the test runs."""

    def __init__(self, bk: BookKeeper, settings: AutoRecoverySettings) -> None:
        super().__init__(bk, settings)
        self.checking = asyncio.Event()
        self.release = asyncio.Event()

    async def ledger_check(self, *, verify_share: float = 0.0) -> int:
        self.checking.set()
        await self.release.wait()
        return 0


def test_a_lost_bookie_is_marked_while_a_ledger_check_runs(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "c", bookies=3) as cluster:

        async def scenario() -> None:
            async with BookKeeper(cluster.metadata_uri) as bk:
                victim_index = 0
                victim = cluster.bookie_ids[victim_index]
                on_victim = set()
                for _ in range(6):
                    lh = await bk.create_ledger(ensemble_size=2, write_quorum_size=2, ack_quorum_size=2)
                    await lh.append(b"entry")
                    await lh.close()
                    if victim in bookies_of(lh.metadata):
                        on_victim.add(lh.ledger_id)
                assert on_victim
                # the ledger check is due at once (never run before) and then takes "forever"
                settings = AutoRecoverySettings(lost_bookie_recovery_delay_s=0, ledger_check_interval_s=3600,
                                                tick_s=0.2)
                auditor = _LongLedgerCheck(bk, settings)
                stop = asyncio.Event()
                run = asyncio.create_task(auditor.run(stop))
                try:
                    await asyncio.wait_for(auditor.checking.wait(), 30)
                    await asyncio.to_thread(cluster.kill, victim_index)
                    urm = bk.store.underreplication
                    deadline = time.monotonic() + 30
                    marked: set[int] = set()
                    while time.monotonic() < deadline and not on_victim <= marked:
                        marked = {int(r.ledger_id) for r in await asyncio.to_thread(
                            lambda: list(urm.list_under_replicated()))}
                        await asyncio.sleep(0.2)
                    assert on_victim <= marked, (
                        f"the lost bookie's ledgers {sorted(on_victim)} were not marked while a ledger check ran "
                        f"(marked: {sorted(marked)})")
                    assert not auditor.release.is_set()  # the check was still running
                finally:
                    auditor.release.set()
                    stop.set()
                    await asyncio.wait_for(run, 30)

        asyncio.run(scenario())
