"""A bookie lost for good must stay unregistered: the ``full`` fault once re-registered a dead
bookie (read-only, then writable) through the store's own session, so the auditor saw it alive
and AutoRecovery never settled on its ledgers (seeds 6 and 45 of this mix reported
``under-replicated``). A registration now goes through the bookie process's own session, and a
dead process has none (docs/verification.md, "Disk and clock faults")."""

from __future__ import annotations

import dataclasses

import pytest

from vellum.sim.runner import DEFAULT_FAULTS, SimOptions, run_seed

FAULTS = DEFAULT_FAULTS | {"corrupt", "full"}


@pytest.mark.parametrize("seed", [6, 45])
def test_a_full_disk_fault_never_brings_a_dead_bookie_back_into_the_registry(seed: int) -> None:
    result = run_seed(seed, dataclasses.replace(SimOptions(), faults=frozenset(FAULTS)))
    assert result.error is None and not result.violations, (result.error, result.violations[:1])
    assert result.acks > 0
