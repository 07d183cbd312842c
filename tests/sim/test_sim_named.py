"""Named ledgers in the simulator (``--named``, ``--scenario named``; docs/verification.md): the
real named-ledger client appends, rolls over, shrinks and is fenced under the run's faults, and
the checker's promises over each name's records hold; the promises themselves catch a lost
record, a gap and different bytes."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import vellum
from vellum.sim.campaign import run_campaign
from vellum.sim.checker import check
from vellum.sim.history import Event, History, digest
from vellum.sim.named_workload import NamedWorkload
from vellum.sim.runner import FAULT_KINDS, SCENARIOS, run_seed

NAMED = SCENARIOS["named"]


def _describe(report) -> str:  # type: ignore[no-untyped-def]
    return "\n".join([f"seed {s}: {v.kind}: {v.message}" for s, v in report.violations[:3]]
                     + [f"seed {s}: {e}" for s, e in report.errors[:3]])


def test_named_ledgers_under_every_fault_keep_their_promises() -> None:
    report = run_campaign(range(8), replace(NAMED, faults=frozenset(FAULT_KINDS)))
    assert not report.violations and not report.errors, _describe(report)


def test_a_named_run_rolls_over_shrinks_fences_and_reads_every_name_back() -> None:
    result = run_seed(1, replace(NAMED, trace=True))
    assert not result.violations and result.error is None, (result.violations, result.error)
    assert result.history is not None
    kinds = [ev.kind for ev in result.history.events]
    assert kinds.count("named-open") >= 6  # each writer session an acquisition: a new segment
    assert kinds.count("named-ack") >= 30
    assert "named-shrink" in kinds and "named-abandon" in kinds
    assert sum(1 for ev in result.history.events if ev.actor == "named-final" and ev.kind == "named-read") >= 1
    again = run_seed(1, replace(NAMED, trace=True))
    assert again.fingerprint == result.fingerprint


def test_the_named_promises_catch_a_lost_record_a_gap_and_other_bytes() -> None:
    named = NamedWorkload(lambda _name: None, History(), random.Random(0))  # type: ignore[arg-type, return-value]
    named.acked["orders"] = {0: digest(b"a"), 1: digest(b"b"), 2: digest(b"c"), 3: digest(b"d")}
    named.shrunk["orders"] = 1  # entry 0 may be gone
    named.reads["orders"] = [("named-final", 1, digest(b"b")), ("named-final", 2, digest(b"X"))]
    named.orders["orders"] = [("named-final", [1, 2]), ("named-reader", [1, 3])]
    kinds = sorted((v.kind, v.entry) for v in named.check())
    assert kinds == [("named-lost", 3), ("named-order", 1), ("named-order", 2)], kinds


def test_the_segments_are_judged_by_the_plain_ledgers_promises_too() -> None:
    """Every acknowledged append reaches the history under its segment's ledger and local entry
    id, the final phase recovers and reads back every segment left, and the plain promises judge
    them: a segment entry read back with other bytes is ``divergent``, one missing from the final
    read ``unreadable``, one beyond the end the segment was closed at ``ack-lost``."""
    result = run_seed(1, replace(NAMED, trace=True))
    assert result.history is not None and not result.violations and result.error is None
    events = result.history.events
    acks = [e for e in events if e.actor == "named" and e.kind == "ack"]
    segments = {e.ledger for e in acks}
    ends = {e.ledger: int(e.value) for e in events if e.actor == "final" and e.kind == "recovered"}
    assert len(segments) >= 4 and segments <= set(ends), (segments, ends)
    final = {(e.ledger, e.entry) for e in events if e.kind == "final-read"}
    assert {(e.ledger, e.entry) for e in acks} <= final  # no shrink dropped a whole segment in this seed
    assert any(e.kind == "read" and e.actor == "named-reader" and e.ledger in segments for e in events)
    assert check(History(list(events)), final_ends=ends, leftover_deleted={}) == []
    seg, entry = acks[0].ledger, acks[0].entry

    def kinds(changed: list[Event]) -> set[tuple[str, int, int]]:
        return {(v.kind, v.ledger, v.entry) for v in check(History(changed), final_ends=ends, leftover_deleted={})}

    other = [e._replace(value="other") if (e.kind, e.ledger, e.entry) == ("final-read", seg, entry) else e
             for e in events]
    assert ("divergent", seg, entry) in kinds(other)
    missing = [e for e in events if (e.kind, e.ledger, e.entry) != ("final-read", seg, entry)]
    assert ("unreadable", seg, entry) in kinds(missing)
    end = ends[seg]
    beyond = [*events, Event(acks[0].t, "named", "ack", seg, end + 1, "lost")]  # before any recovery
    assert ("ack-lost", seg, end + 1) in kinds(beyond)


def test_the_new_options_replay_exactly_in_another_process_with_another_hash_seed() -> None:
    """Named ledgers, rack power losses on lying disks and a limbo start on real bookies: the
    same fingerprint in processes with different ``PYTHONHASHSEED``s."""
    code = ("from dataclasses import replace; from vellum.sim.runner import SCENARIOS, run_seed; "
            "w = SCENARIOS['wiped-bookie']; "
            "print(run_seed(0, replace(w, bookie='real', named=True, "
            "faults=w.faults | {'limbo', 'rack', 'lying-fsync'})).fingerprint)")
    src = str(Path(vellum.__file__).parents[1])
    prints = set()
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": src}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                             check=True)
        prints.add(out.stdout.strip())
    assert len(prints) == 1, prints


def test_the_cli_takes_the_new_flags_and_refuses_what_needs_the_real_bookie() -> None:
    from click.testing import CliRunner

    from vellum.cli.main import cli

    result = CliRunner().invoke(cli, ["verify", "sim", "--seeds", "2", "--json", "--named", "--ledgers", "1",
                                      "--entries", "10", "--faults", "default,rack"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert "rack" in data["faults"] and not data["violations"]
    for mode in ("limbo", "wipe"):
        refused = CliRunner().invoke(cli, ["verify", "sim", "--seeds", "1", "--faults", f"default,{mode}"])
        assert refused.exit_code == 2 and "--bookie real" in refused.output
    lying = CliRunner().invoke(cli, ["verify", "sim", "--seeds", "1", "--bookie", "real",
                                     "--faults", "crash,lying-fsync"])
    assert lying.exit_code == 2 and "power loss" in " ".join(lying.output.split())
