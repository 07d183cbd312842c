"""The simulator's checker: each promise fails on a history that breaks it, and a clean
history passes (a checker that cannot fail checks nothing)."""

from __future__ import annotations

from vellum.sim.checker import Placement, check
from vellum.sim.history import History


def _history(rows: list[tuple[float, str, str, int, int, object]]) -> History:
    h = History()
    now = {"t": 0.0}
    h.clock = lambda: now["t"]
    for t, actor, kind, ledger, entry, value in rows:
        now["t"] = t
        h.add(actor, kind, ledger, entry, value)
    return h


def _kinds(h: History, **kw: object) -> list[str]:
    return [v.kind for v in check(h, final_ends=kw.get("final_ends", {}),  # type: ignore[arg-type]
                                   leftover_deleted=kw.get("leftover_deleted", {}),  # type: ignore[arg-type]
                                   placements=kw.get("placements"))]  # type: ignore[arg-type]


CLEAN = [
    (1.0, "writer", "ack", 1, 0, "aa"),
    (1.1, "writer", "ack", 1, 1, "bb"),
    (1.2, "reader", "lac", 1, -1, ("r/1", 0)),
    (1.3, "reader", "read", 1, 0, "aa"),
    (1.4, "reader", "lac", 1, -1, ("r/1", 1)),
    (2.0, "recoverer", "recover-start", 1, -1, None),
    (2.1, "recoverer", "recovered", 1, -1, 1),
    (3.0, "final", "final-read", 1, 0, "aa"),
    (3.0, "final", "final-read", 1, 1, "bb"),
]


def test_a_clean_history_passes() -> None:
    assert _kinds(_history(CLEAN), final_ends={1: 1}) == []


def test_a_recovery_that_closes_below_an_earlier_ack_is_ack_lost() -> None:
    rows = [r for r in CLEAN if r[2] != "recovered"] + [(2.1, "recoverer", "recovered", 1, -1, 0)]
    assert "ack-lost" in _kinds(_history(rows), final_ends={1: 1})


def test_an_ack_after_recovery_began_beyond_its_end_is_ack_after_fence() -> None:
    rows = [*CLEAN, (2.05, "writer", "ack", 1, 2, "cc")]
    rows.sort(key=lambda r: r[0])
    assert _kinds(_history(rows), final_ends={1: 1}) == ["ack-after-fence"]


def test_different_bytes_for_one_entry_are_divergent() -> None:
    rows = [*CLEAN, (3.5, "reader", "read", 1, 1, "zz")]
    assert "divergent" in _kinds(_history(rows), final_ends={1: 1})


def test_a_lac_going_back_is_reported() -> None:
    rows = [*CLEAN, (3.5, "reader", "lac", 1, -1, ("r/1", 0))]
    assert _kinds(_history(rows), final_ends={1: 1}) == ["lac-regressed"]


def test_an_acknowledged_entry_missing_from_the_final_read_is_unreadable() -> None:
    rows = [r for r in CLEAN if not (r[2] == "final-read" and r[4] == 1)]
    assert _kinds(_history(rows), final_ends={1: 1}) == ["unreadable"]


def test_an_ack_after_the_delete_and_a_bookie_keeping_a_deleted_ledger_are_reported() -> None:
    # an entry beyond the closed end acknowledged after the delete
    rows = [*CLEAN, (4.0, "recoverer", "deleted", 1, -1, None), (4.5, "writer", "ack", 1, 2, "cc")]
    assert "written-after-delete" in _kinds(_history(rows), final_ends={})
    # a late answer to an add the closed ledger holds is not a write after the delete
    late = [r for r in CLEAN if not (r[2] == "ack" and r[4] == 1)]
    late += [(4.0, "recoverer", "deleted", 1, -1, None), (4.5, "writer", "ack", 1, 1, "bb")]
    assert _kinds(_history(late), final_ends={}) == []
    assert _kinds(_history(CLEAN), final_ends={1: 1}, leftover_deleted={"b0": [1]}) == ["written-after-delete"]


def test_the_minimal_history_keeps_the_ledger_and_entry_in_question() -> None:
    rows = [(0.5, "writer", "ack", 2, 0, "xx"), *CLEAN, (2.05, "writer", "ack", 1, 2, "cc"),
            (2.06, "nemesis", "crash", -1, -1, "bookie-1")]
    rows.sort(key=lambda r: r[0])
    (v,) = check(_history(rows), final_ends={1: 1}, leftover_deleted={})
    kinds = [(e.kind, e.ledger, e.entry) for e in v.history]
    assert ("ack", 1, 2) in kinds and ("recovered", 1, -1) in kinds and ("crash", -1, -1) in kinds
    assert all(e.ledger in (1, -1) for e in v.history)
    assert ("ack", 1, 0) not in kinds  # another entry of the ledger


def test_a_bookie_that_missed_an_acknowledged_entry_and_stayed_in_the_ensemble_is_not_replaced() -> None:
    """Rule 11 of docs/correctness.md: entries 0 and 1 on E=WQ=3, AQ=2; bookie c lacks entry 1."""
    every = frozenset({0, 1})
    kept = Placement({0: ("a", "b", "c")}, 3, {"a": every, "b": every, "c": frozenset({0})})
    assert _kinds(_history(CLEAN), final_ends={1: 1}, placements={1: kept}) == ["not-replaced"]
    # replaced at its position by a later segment: the entry stays one copy short, the promise holds
    replaced = Placement({0: ("a", "b", "c"), 2: ("a", "b", "d")}, 3, kept.held)
    assert _kinds(_history(CLEAN), final_ends={1: 1}, placements={1: replaced}) == []
    # a later segment that moved another position does not count
    moved = Placement({0: ("a", "b", "c"), 2: ("d", "b", "c")}, 3, kept.held)
    assert _kinds(_history(CLEAN), final_ends={1: 1}, placements={1: moved}) == ["not-replaced"]
    # every copy present: clean
    full = Placement({0: ("a", "b", "c")}, 3, {"a": every, "b": every, "c": every})
    assert _kinds(_history(CLEAN), final_ends={1: 1}, placements={1: full}) == []


def test_the_first_entry_beyond_an_end_is_reported_and_divergent_bytes_in_the_order_first_seen() -> None:
    """One ``ack-lost`` per end, for the first acknowledged entry beyond it; ``divergent`` lists
    each distinct digest with the first actor that saw it, entries in the order first seen (not
    in the order they diverged)."""
    rows = [*CLEAN, (1.15, "writer", "ack", 1, 3, "dd"), (1.16, "writer", "ack", 1, 2, "cc"),
            (1.35, "reader", "read", 1, 1, "xx"), (3.5, "reader", "read", 1, 0, "zz"),
            (3.6, "final", "final-read", 1, 0, "yy"), (3.7, "final", "final-read", 1, 0, "zz")]
    rows.sort(key=lambda r: r[0])
    got = [(v.kind, v.entry, v.message) for v in check(_history(rows), final_ends={1: 1}, leftover_deleted={})]
    assert got == [
        ("divergent", 0, "different bytes seen: writer=aa, reader=zz, final=yy"),
        ("divergent", 1, "different bytes seen: writer=bb, reader=xx"),
        ("ack-lost", 2, "entry 2 acknowledged at t=1.1600 but the ledger was recovered at 1 (t=2.1000)"),
    ]
