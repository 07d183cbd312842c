"""A writer whose spares ran out after a pause takes a recovered bookie back (rule 11 of
docs/correctness.md, "When no spare is left").

In ``silent-bookie`` with the disk and clock faults, a suspended host makes two bookies' adds
time out; the writer replaces them. When a third bookie then fails, no bookie that never failed
is left: the writer must take back one that failed earlier and is registered writable again,
not keep the failing bookie (which then lacks acknowledged entries) until it closes the ledger.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from vellum.sim.runner import SCENARIOS, run_seed

#: ``vellum verify sim --scenario silent-bookie --faults delay,partition,slow,eio,full,clock``
FAULTS = frozenset({"delay", "partition", "slow", "eio", "full", "clock"})


@pytest.mark.parametrize("seed", [18, 88])
def test_a_writer_out_of_spares_after_a_pause_still_replaces_the_failed_bookie(seed: int) -> None:
    result = run_seed(seed, replace(SCENARIOS["silent-bookie"], faults=FAULTS))
    assert result.error is None, result.error
    assert not result.violations, [(v.kind, v.message) for v in result.violations]
