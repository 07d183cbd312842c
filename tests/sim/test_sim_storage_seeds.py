"""Regression seeds of the storage-side data-safety fixes, with the real bookie in the simulator
(``--bookie real``, docs/verification.md "Regression seeds"): with a fix reverted behind its test
flag a named seed fails within seconds; without the flag the same seed is clean."""

from __future__ import annotations

import warnings
from dataclasses import replace

import pytest

from vellum.sim.runner import DEFAULT_FAULTS, SCENARIOS, SimOptions, run_seed

#: how many seeds after a named seed are tried when it no longer fails (as tests/sim/test_sim_seeds.py)
DRIFT = 60

#: seeds that fail when a bookie whose every disk was wiped starts empty (defect D1, rule 6 of
#: docs/correctness.md): its "no such entry" answers let a recovery close a ledger below an
#: acknowledged entry
START_WIPED_BOOKIE_SEEDS = (38,)
#: stale-writer seeds that fail when a deleted ledger leaves no tombstone (defect D2): a writer
#: paused while its ledger was recovered, deleted and garbage-collected adds on, and the bookies,
#: which forgot the ledger and its fence, recreate it and acknowledge the adds
NO_DELETE_TOMBSTONE_SEEDS = (3,)
STALE_WRITER = replace(SCENARIOS["stale-writer"], bookie="real")
WIPE = SimOptions(bookie="real", faults=DEFAULT_FAULTS | {"wipe"}, autorecovery=False)


def _first_failing(seed: int, options: SimOptions, kinds: set[str]) -> int | None:
    for s in range(seed, seed + DRIFT + 1):
        if {v.kind for v in run_seed(s, options).violations} & kinds:
            return s
    return None


def _check_seed(seed: int, options: SimOptions, flag: str, kinds: set[str]) -> None:
    found = _first_failing(seed, replace(options, flags=frozenset({flag})), kinds)
    assert found is not None, f"none of seeds {seed}..{seed + DRIFT} finds the defect with its fix reverted"
    if found != seed:
        warnings.warn(f"seed {found} (not {seed}) now reproduces the defect: update the named seed", stacklevel=2)
    fixed = run_seed(found, options)
    assert not fixed.violations and fixed.error is None, (fixed.violations, fixed.error)


@pytest.mark.parametrize("seed", START_WIPED_BOOKIE_SEEDS)
def test_a_wiped_bookie_that_starts_empty_truncates_a_ledger(seed: int) -> None:
    """Defect D1: with the cookie check reverted, a bookie restarted on empty disks answers "no
    such entry" and a recovery closes a ledger below an acknowledged entry; with the check, the
    bookie is refused (it stays down) and the same seed is clean."""
    _check_seed(seed, WIPE, "start-wiped-bookie", {"ack-lost"})
    refused = run_seed(seed, replace(WIPE, trace=True))
    assert refused.history is not None and any("refused to start" in str(ev.value) for ev in refused.history.events)


@pytest.mark.parametrize("seed", NO_DELETE_TOMBSTONE_SEEDS)
def test_a_deleted_ledger_without_its_tombstone_takes_a_stale_writers_adds(seed: int) -> None:
    """Defect D2: with the tombstone reverted (GC deletes a ledger's data from the index, replay
    skips nothing) a writer that stalled while its ledger was recovered, deleted and collected
    gets adds beyond the closed end acknowledged after the delete; with it, they are refused as
    fenced and the same seed is clean. Without ``ledgerMasterKeyCheck`` (the scenario's), as a
    bookie port without authentication runs: that check refuses them too."""
    _check_seed(seed, STALE_WRITER, "no-delete-tombstone", {"written-after-delete"})
