"""What a replication worker remembers of the open ledgers it defers (the grace period's own
bound, docs/autorecovery.md): nothing of a ledger another worker took, once the grace is long
past (a unit test of ``ReplicationWorker._deferred_ms`` on a stepped monotonic clock)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import vellum.autorecovery.worker as worker_module
from vellum.autorecovery.settings import AutoRecoverySettings
from vellum.autorecovery.worker import ReplicationWorker
from vellum.ids import BookieId, LedgerId
from vellum.meta.api import UnderReplicatedLedger


def test_a_worker_forgets_the_deferrals_of_ledgers_another_worker_took(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker remembers when it first deferred an open ledger (the grace period's own bound);
    a ledger that another worker then healed never comes back to it, and its entry must not stay
    for the daemon's lifetime."""
    now = [1000.0]
    monkeypatch.setattr(worker_module.time, "monotonic", lambda: now[0])
    bk = SimpleNamespace(context=SimpleNamespace(bookie_client=None), store=SimpleNamespace(kv=None))
    settings = AutoRecoverySettings(yield_target_s=None)
    worker = ReplicationWorker(bk, settings, worker_id="w")  # type: ignore[arg-type]
    grace_s = settings.open_ledger_grace_period_ms / 1000

    def record(lid: int) -> UnderReplicatedLedger:
        return UnderReplicatedLedger(LedgerId(lid), (BookieId("a"),), 0, 1)

    for lid in range(100):  # deferred once each, then taken by another worker
        assert worker._deferred_ms(lid, record(lid)) == 0.0
    now[0] += grace_s / 2
    assert worker._deferred_ms(0, record(0)) == pytest.approx(grace_s / 2 * 1000)  # still counting
    now[0] += 3 * grace_s
    worker._deferred_ms(500, record(500))  # a new deferral much later
    assert set(worker._deferring) == {500}
