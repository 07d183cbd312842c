"""The checker: the protocol's promises judged over one run's history.

Responsibility: turn a ``History`` (and the final state the run left) into ``Violation`` rows.
The promises (docs/verification.md):

- ``ack-lost``: an acknowledged entry is beyond the end a close or a recovery gave the ledger,
  and was acknowledged before that recovery began (a truncation);
- ``ack-after-fence``: an add of the old writer was acknowledged, after recovery began, beyond
  the end the recovery closed the ledger at;
- ``unreadable``: an acknowledged entry of a closed, not deleted ledger cannot be read back
  once the faults are healed (or reads back different bytes);
- ``divergent``: two observers (the writer's acknowledged bytes, readers, the final read) saw
  different bytes for the same entry;
- ``lac-regressed``: the LAC one reader handle saw went back;
- ``written-after-delete``: an add beyond the end a deleted ledger was closed at was
  acknowledged after the delete completed, or a bookie still holds entries of a deleted ledger
  after GC (a late answer to an add the closed ledger holds is not a write after the delete).
- ``not-replaced``: a bookie of an acknowledged entry's write set lacks it, yet its writer kept
  it at that place of the ensemble until it closed the ledger (rule 11 of docs/correctness.md: a
  write that failed after the ack quorum still replaces its bookie). Judged only on the
  ``Placement`` of ledgers whose writer waited longer than its add timeout before closing (so
  every failed write was noticed) on a cluster with spare bookies.
- ``under-replicated``: once AutoRecovery settled, an acknowledged entry of a closed, not
  deleted ledger is missing (or bad) on a bookie of its write set in the final metadata; judged
  on the segments the cluster can heal (a bookie up at the end outside the segment), and when
  AutoRecovery did not settle in its bounded time.

Each violation carries a minimal history: the events of its ledger (and entry) only.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from vellum.client.distribution import write_set
from vellum.sim.history import Event, History

#: at most this many events in a violation's minimal history
_MAX_EVENTS = 40


@dataclass(frozen=True)
class Violation:
    kind: str
    ledger: int
    entry: int
    message: str
    history: tuple[Event, ...]


@dataclass(frozen=True)
class Placement:
    """Where a ledger its writer closed ended up: the segments of its closed metadata (first
    entry -> ensemble), its write quorum, and the entries each bookie holds."""

    segments: dict[int, tuple[str, ...]]
    write_quorum: int
    held: dict[str, frozenset[int]]


def _not_replaced(ledger: int, placement: Placement, acked: dict[int, tuple[float, str]],
                  events: list[Event]) -> Violation | None:
    firsts = sorted(placement.segments)
    for entry in sorted(acked):
        first = max((f for f in firsts if f <= entry), default=None)
        if first is None:
            continue
        ensemble = placement.segments[first]
        for idx in write_set(entry, len(ensemble), placement.write_quorum):
            bookie = ensemble[idx]
            if entry in placement.held.get(bookie, frozenset()):
                continue
            if any(placement.segments[f][idx] != bookie for f in firsts if f > first):
                continue  # replaced after the failure (the entry itself stays one copy short)
            return Violation("not-replaced", ledger, entry,
                             f"bookie {bookie} lacks acknowledged entry {entry}, yet the writer kept it at "
                             f"position {idx} of the ensemble until it closed the ledger",
                             _minimal(events, ledger, entry))
    return None


def _under_replicated(ledger: int, replicas: Placement, acked: dict[int, tuple[float, str]], final_end: int,
                      up_at_end: frozenset[str], events: list[Event]) -> Violation | None:
    firsts = sorted(replicas.segments)
    for entry in sorted(acked):
        if entry > final_end:
            break
        first = max((f for f in firsts if f <= entry), default=None)
        if first is None:
            continue
        ensemble = replicas.segments[first]
        if not up_at_end - set(ensemble):
            continue  # no spare bookie: nothing can heal this segment
        for idx in write_set(entry, len(ensemble), replicas.write_quorum):
            bookie = ensemble[idx]
            if entry not in replicas.held.get(bookie, frozenset()):
                where = "a bookie lost for good" if bookie not in up_at_end else "a bookie that is up"
                return Violation("under-replicated", ledger, entry,
                                 f"acknowledged entry {entry} is not on {bookie} ({where}), which the final "
                                 f"metadata names in its write set at position {idx}, after AutoRecovery settled",
                                 _minimal(events, ledger, entry))
    return None


def _minimal(events: list[Event], ledger: int, entry: int) -> tuple[Event, ...]:
    """The events of ``ledger`` (of ``entry`` only, where an event names an entry) and the
    faults injected while the ledger was in use; past ``_MAX_EVENTS``, the bookies' fences and
    the repeated failures go first, then the middle."""
    def mine(e: Event) -> bool:
        return e.ledger == ledger and e.kind != "lac" and (entry < 0 or e.entry in (-1, entry))

    own = [e for e in events if mine(e)]
    if not own:
        return ()
    first, last = own[0].t, own[-1].t
    picked = [e for e in events if mine(e) or (e.kind in _FAULTS and first <= e.t <= last)]
    if len(picked) > _MAX_EVENTS:
        picked = [e for e in picked if e.kind not in _NOISE or e.entry == entry >= 0]
    if len(picked) > _MAX_EVENTS:  # keep the start (what the ledger is) and the end (what went wrong)
        picked = picked[:10] + picked[-(_MAX_EVENTS - 10):]
    return tuple(picked)


#: what a long minimal history leaves out first
_NOISE = frozenset({"fence", "add-failed", "recover-failed", "read-failed", "refresh-failed", "gc", "add", "add-refused"})
_FAULTS = frozenset({"crash", "restart", "partition", "heal", "slow", "meta-lost", "corrupt", "torn", "eio", "wipe",
                     "full", "writable", "clock", "fsync-lied", "expire", "lost-for-good"})


def check(history: History, *, final_ends: dict[int, int], leftover_deleted: dict[str, list[int]],
          placements: dict[int, Placement] | None = None, replicas: dict[int, Placement] | None = None,
          up_at_end: frozenset[str] = frozenset(), settled: bool | None = None) -> list[Violation]:
    """``final_ends``: ledger -> last entry of its CLOSED metadata after the final phase (absent:
    not closed or deleted); ``leftover_deleted``: bookie -> deleted ledgers it still holds
    entries of after the final GC; ``placements``: the ledgers ``not-replaced`` judges;
    ``replicas``: where every ledger's entries are once AutoRecovery settled (None: not judged),
    ``up_at_end`` the bookies then up, ``settled`` whether it settled (None: it did not run)."""
    events = history.events
    out: list[Violation] = []
    acks: dict[int, dict[int, tuple[float, str]]] = defaultdict(dict)
    #: (ledger, entry) -> (the first digest of its bytes seen, the actor that saw it), in the
    #: order entries were first seen; ``differing``: the entries seen with other bytes too ->
    #: {digest: the first actor that saw those bytes}, the first digest first
    seen: dict[tuple[int, int], tuple[str, str]] = {}
    seen_get = seen.get
    differing: dict[tuple[int, int], dict[str, str]] = {}
    recover_start: dict[int, float] = {}
    ends: dict[int, list[tuple[str, int, float]]] = defaultdict(list)
    deleted_at: dict[int, float] = {}
    lacs: dict[str, int] = {}
    final_read: dict[tuple[int, int], str] = {}
    # Every event of every seed passes here: the fields are unpacked at once (a named tuple's
    # field is a descriptor call each), and an entry seen with the same bytes each time (all,
    # unless a promise is broken) keeps one pair, not a table of one.
    for t, actor, k, ledger, entry, value in events:
        if k == "read" or k == "ack" or k == "final-read":
            key = (ledger, entry)
            if k == "ack":
                acks[ledger][entry] = (t, value)
            first = seen_get(key)
            if first is None:
                seen[key] = (value, actor)
            elif first[0] != value:
                differing.setdefault(key, {first[0]: first[1]}).setdefault(value, actor)
            if k == "final-read":
                final_read[key] = value
        elif k == "recover-start":
            recover_start.setdefault(ledger, t)
        elif k in ("closed", "recovered"):
            ends[ledger].append((k, int(value), t))
        elif k == "deleted":
            deleted_at.setdefault(ledger, t)
        elif k == "lac":
            handle, lac = value
            prev = lacs.get(handle)
            if prev is not None and lac < prev:
                out.append(Violation("lac-regressed", ledger, -1,
                                     f"reader handle {handle} saw LAC {prev}, then {lac}",
                                     _minimal(events, ledger, -1)))
            lacs[handle] = max(lac, prev if prev is not None else lac)

    if differing:
        for ledger, entry in seen:  # in the order the entries were first seen
            values = differing.get((ledger, entry))
            if values is not None:
                who = ", ".join(f"{actor}={v}" for v, actor in values.items())
                out.append(Violation("divergent", ledger, entry, f"different bytes seen: {who}",
                                     _minimal(events, ledger, entry)))

    for ledger, acked in acks.items():
        for kind, end, t_end in ends.get(ledger, []):
            beyond = [e for e in acked if e > end]  # most ends hold every acknowledged entry
            if beyond:
                entry = min(beyond)  # one violation per close is enough: the first entry beyond it
                t_ack = acked[entry][0]
                started = recover_start.get(ledger)
                if started is not None and t_ack >= started:
                    out.append(Violation(
                        "ack-after-fence", ledger, entry,
                        f"entry {entry} acknowledged at t={t_ack:.4f}, after recovery began at t={started:.4f}, "
                        f"beyond the end {end} the ledger was {kind} at", _minimal(events, ledger, entry)))
                else:
                    out.append(Violation(
                        "ack-lost", ledger, entry,
                        f"entry {entry} acknowledged at t={t_ack:.4f} but the ledger was {kind} at {end} "
                        f"(t={t_end:.4f})", _minimal(events, ledger, entry)))
        deleted = deleted_at.get(ledger)
        if deleted is not None:
            # A late acknowledgement of an entry the closed ledger holds is not a write after the
            # delete (the add was durable before the close; its answer was slow): one beyond the
            # end the ledger was closed at is.
            end_before = max((end for _k, end, t_end in ends.get(ledger, []) if t_end <= deleted), default=None)
            late = [e for e, (t, _v) in acked.items() if t > deleted and (end_before is None or e > end_before)]
            if late:
                out.append(Violation("written-after-delete", ledger, min(late),
                                     f"{len(late)} adds beyond the closed end acknowledged after the delete at "
                                     f"t={deleted:.4f}", _minimal(events, ledger, min(late))))
        placement = (placements or {}).get(ledger)
        if placement is not None and deleted is None:
            v = _not_replaced(ledger, placement, acked, events)
            if v is not None:
                out.append(v)
        final_end = final_ends.get(ledger)
        held = (replicas or {}).get(ledger)
        if final_end is not None and deleted is None and held is not None:
            v = _under_replicated(ledger, held, acked, final_end, up_at_end, events)
            if v is not None:
                out.append(v)
        if final_end is not None and deleted is None:
            for entry in sorted(acked):
                if entry > final_end:
                    continue
                got = final_read.get((ledger, entry))
                if got is None:
                    out.append(Violation("unreadable", ledger, entry,
                                         f"acknowledged entry {entry} of closed ledger {ledger} (end {final_end}) "
                                         "could not be read back after healing", _minimal(events, ledger, entry)))
                    break
    seen_keys: set[tuple[str, int, int]] = set()
    unique = []
    for v in out:  # the same entry judged against several ends (a recovery, then the final one)
        if (v.kind, v.ledger, v.entry) not in seen_keys:
            seen_keys.add((v.kind, v.ledger, v.entry))
            unique.append(v)
    out = unique
    if settled is False:
        out.append(Violation("under-replicated", -1, -1,
                             "AutoRecovery did not settle in its bounded time after the final phase (records left)",
                             tuple(e for e in events if e.actor == "autorecovery")[-_MAX_EVENTS:]))
    for bookie, ledgers in sorted(leftover_deleted.items()):
        for ledger in ledgers:
            out.append(Violation("written-after-delete", ledger, -1,
                                 f"bookie {bookie} still holds entries of deleted ledger {ledger} after GC",
                                 _minimal(events, ledger, -1)))
    return out
