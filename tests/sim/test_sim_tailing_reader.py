"""The workload's tailing reader and deleted ledgers (docs/verification.md, "The tailing reader
and deleted ledgers"): after an entry at or below the LAC is not found it refreshes the ledger's
metadata, as an application would, and stops tailing a ledger that was deleted; the read that
found the entry gone stays in the history."""

from __future__ import annotations

from vellum.sim.runner import SimOptions, run_seed
from vellum.sim.workload import WorkloadShape


def test_the_reader_stops_tailing_a_deleted_ledger_after_the_read_that_finds_it_gone() -> None:
    run = run_seed(3, SimOptions(trace=True))
    assert run.history is not None and not run.violations and run.error is None
    events = run.history.events
    gone = [e for e in events if e.actor == "reader" and e.kind == "gone"]
    assert gone, [(e.actor, e.kind, e.ledger) for e in events if e.actor == "reader"][-10:]
    for g in gone:
        deleted = [e.t for e in events if e.kind == "deleted" and e.ledger == g.ledger]
        assert deleted and deleted[0] <= g.t  # the recoverer deleted it first
        reader = [e for e in events if e.actor == "reader" and e.ledger == g.ledger]
        failed = [e for e in reader if e.kind == "read-failed" and e.t >= deleted[0]]
        assert failed and failed[-1].value == "NoSuchEntryError" and failed[-1].t <= g.t  # the read is kept
        assert reader[-1] is g  # and nothing of that ledger after it


def test_the_reader_goes_on_to_the_next_ledgers_after_a_delete() -> None:
    """Seed 100000 of the benchmark's ``target`` workload: the reader used to spend its 80 polls
    on ledger 1 after its delete and never read ledgers 2 to 8."""
    shape = WorkloadShape(ledgers=8, entries=(50, 110), reader_polls=80)
    run = run_seed(100000, SimOptions(shape=shape, autorecovery=False, trace=True))
    assert run.history is not None and not run.violations and run.error is None
    reader = [e for e in run.history.events if e.actor == "reader"]
    assert any(e.kind == "gone" for e in reader)
    assert len({e.ledger for e in reader if e.kind == "read"}) >= 4
    assert sum(e.kind == "read-failed" for e in reader) < 20
