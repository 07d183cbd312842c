"""The two active-log strategies alone (no files): which log a ledger's entry goes to, LRU
sealing at the cap, idle logs, and which sealed logs GC may take."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from vellum.storage.entry_log_allocator import ActiveLog
from vellum.storage.entry_log_policy import ActiveLogPolicy, PerLedgerActiveLogs, SharedActiveLog


class FakeLogs:
    """Allocates numbered logs and seals them through the policy, as the entry logger does."""

    def __init__(self) -> None:
        self.ids = itertools.count()
        self.sealed: list[int] = []
        self.policy: ActiveLogPolicy | None = None

    def allocate(self) -> ActiveLog:
        log_id = next(self.ids)
        return ActiveLog(log_id, Path(f"{log_id:x}.log"), fd=-1)

    def seal(self, log: ActiveLog) -> None:
        self.sealed.append(log.log_id)
        assert self.policy is not None
        self.policy.forget(log)


def shared() -> tuple[SharedActiveLog, FakeLogs]:
    logs = FakeLogs()
    policy = SharedActiveLog(logs.allocate)
    logs.policy = policy
    return policy, logs


def per_ledger(now: list[float], cap: int = 3) -> tuple[PerLedgerActiveLogs, FakeLogs]:
    logs = FakeLogs()
    policy = PerLedgerActiveLogs(logs.allocate, logs.seal, max_active_logs=cap, access_expiry_s=60,
                                 clock=lambda: now[0])
    logs.policy = policy
    return policy, logs


def test_shared_every_ledger_writes_to_the_one_log_until_it_is_forgotten() -> None:
    policy, _ = shared()
    assert policy.logs() == [] and not policy.per_ledger
    first = policy.log_for(1)
    assert policy.log_for(2) is first and policy.logs() == [first]
    assert policy.log_of(1) is None and policy.ledgers() == {} and policy.idle_logs() == []
    policy.forget(ActiveLog(99, Path("63.log"), fd=-1))  # another log: no effect
    assert policy.logs() == [first]
    policy.forget(first)
    assert policy.logs() == []
    assert policy.log_for(1).log_id == 1


def test_per_ledger_each_ledger_has_its_own_log_and_the_cap_seals_the_least_recently_used() -> None:
    now = [0.0]
    policy, logs = per_ledger(now)
    assert policy.per_ledger
    ids = {lid: policy.log_for(lid).log_id for lid in (1, 2, 3)}
    assert len(set(ids.values())) == 3 and logs.sealed == []
    policy.log_for(1)  # 1 is now the most recently used
    policy.log_for(4)
    assert logs.sealed == [ids[2]]
    assert sorted(policy.ledgers()) == [1, 3, 4]
    assert policy.log_of(2) is None and policy.log_of(1) is not None


def test_per_ledger_idle_logs_are_those_not_written_for_the_expiry() -> None:
    now = [1000.0]
    policy, _ = per_ledger(now)
    a, b = policy.log_for(1), policy.log_for(2)
    now[0] += 45
    policy.log_for(2)
    now[0] += 30  # 1 idle for 75 s, 2 for 30 s
    assert policy.idle_logs() == [a]
    now[0] += 30
    assert {log.log_id for log in policy.idle_logs()} == {a.log_id, b.log_id}


@pytest.mark.parametrize(("make", "expected"), [("shared", [0, 1]), ("per_ledger", [0, 1, 4, 6])])
def test_flushed_logs_follow_each_modes_rule(make: str, expected: list[int]) -> None:
    # Logs 0..6 exist; 2 and 5 are active, 3 preallocated: busy.
    policy: ActiveLogPolicy = shared()[0] if make == "shared" else per_ledger([0.0])[0]
    assert policy.flushed(range(7), busy={2, 3, 5}, next_id=7) == expected
    assert policy.flushed(range(3), busy=set(), next_id=3) == [0, 1, 2]


def test_per_ledger_needs_room_for_one_log() -> None:
    with pytest.raises(ValueError):
        PerLedgerActiveLogs(FakeLogs().allocate, lambda log: None, max_active_logs=0, access_expiry_s=1)
