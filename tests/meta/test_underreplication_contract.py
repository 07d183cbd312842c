"""AutoRecovery's metadata, one contract for both drivers (sqlite, and a real ZooKeeper).

Reads as the specification of ``MetadataStore.underreplication``: under-replicated records
merge, locks are exclusive and die with their session, a record marked again while a worker was
busy stays, the global switch and the lost-bookie delay, audit timestamps, and the auditor
election (one leader; the next takes over when it resigns or its session ends). The last tests
pin BookKeeper's znode layout and encodings, so BookKeeper's tools see what Vellum writes.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from meta_testkit import make_uri, wait_until  # type: ignore[import-not-found]

from vellum.errors import IncorrectParameterError, MetaStoreError
from vellum.ids import BookieId, LedgerId
from vellum.meta import MetadataStore, UnderReplicatedLedger, open_metadata_store
from vellum.meta import underreplication as UR

# The records do not depend on the ledger manager: one ZooKeeper layout is enough.
UR_DRIVERS = ["sqlite", "zk"]

B1, B2, B3 = BookieId("bk1:3181"), BookieId("bk2:3181"), BookieId("bk3:3181")


@pytest.fixture(params=UR_DRIVERS)
def ur_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return str(make_uri("sqlite" if request.param == "sqlite" else "zk-hierarchical", request, tmp_path))


@pytest.fixture
def open_ur(ur_uri: str) -> Iterator[Callable[..., MetadataStore]]:
    """Open stores (sessions) on one cluster; every one is closed after the test."""
    opened: list[MetadataStore] = []

    def _open(**kw: float) -> MetadataStore:
        kw.setdefault("session_timeout_s", 4.0)
        kw.setdefault("poll_interval_s", 0.05)
        s = open_metadata_store(ur_uri, **kw)  # type: ignore[arg-type]
        opened.append(s)
        return s

    yield _open
    for s in opened:
        s.close()


# -- under-replicated records -----------------------------------------------------------------

def test_mark_creates_then_merges_replicas(open_ur: Callable[..., MetadataStore]) -> None:
    ur = open_ur().underreplication
    assert ur.get_under_replicated(LedgerId(7)) is None
    before = UR.now_ms()
    ur.mark_under_replicated(LedgerId(7), [B2])
    first = ur.get_under_replicated(LedgerId(7))
    assert first is not None and first.replicas == (B2,) and first.ctime_ms >= before
    ur.mark_under_replicated(LedgerId(7), [B2])  # nothing new: no write, same version
    assert ur.get_under_replicated(LedgerId(7)) == first
    ur.mark_under_replicated(LedgerId(7), [B1, B2])  # a second lost bookie: merged, new version
    second = ur.get_under_replicated(LedgerId(7))
    assert second is not None and second.replicas == (B1, B2) and second.version != first.version


def test_list_in_ledger_id_order(open_ur: Callable[..., MetadataStore]) -> None:
    ur = open_ur().underreplication
    ids = [70_000, 3, (1 << 40) + 1, 1 << 62, 0, 9_999_999_999, 10_000_000_000]
    for i in ids:
        ur.mark_under_replicated(LedgerId(i), [B1])
    listed = list(ur.list_under_replicated())
    assert [r.ledger_id for r in listed] == sorted(ids)
    assert all(isinstance(r, UnderReplicatedLedger) and r.replicas == (B1,) for r in listed)


def test_concurrent_marks_lose_no_replica(open_ur: Callable[..., MetadataStore]) -> None:
    """Two auditors' views merging into one record: a CAS loop, no replica lost."""
    a, b = open_ur().underreplication, open_ur().underreplication
    wanted = [BookieId(f"bk{i}:3181") for i in range(12)]

    def mark(ur: object, bookies: list[BookieId]) -> None:
        for bk in bookies:
            ur.mark_under_replicated(LedgerId(5), [bk])  # type: ignore[attr-defined]

    threads = [threading.Thread(target=mark, args=(ur, wanted[k::2])) for k, ur in enumerate((a, b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    record = a.get_under_replicated(LedgerId(5))
    assert record is not None and record.replicas == tuple(sorted(wanted))


# -- locks ------------------------------------------------------------------------------------

def test_two_sessions_cannot_hold_the_same_ledger(open_ur: Callable[..., MetadataStore]) -> None:
    a, b = open_ur().underreplication, open_ur().underreplication
    a.mark_under_replicated(LedgerId(11), [B1])
    assert not a.is_locked(LedgerId(11)) and a.lock_owner(LedgerId(11)) is None
    assert a.acquire_ledger_to_rereplicate(worker_id="worker-a") == 11
    assert b.acquire_ledger_to_rereplicate() is None  # the only record is taken
    assert b.is_locked(LedgerId(11)) and b.lock_owner(LedgerId(11)) == "worker-a"
    b.release_ledger(LedgerId(11))  # not b's lock: nothing happens
    assert a.is_locked(LedgerId(11))
    a.release_ledger(LedgerId(11))  # given back unfinished: the record stays, anyone may take it
    assert not b.is_locked(LedgerId(11)) and b.get_under_replicated(LedgerId(11)) is not None
    assert b.acquire_ledger_to_rereplicate(worker_id="worker-b") == 11
    assert a.lock_owner(LedgerId(11)) == "worker-b"


def test_acquire_skips_excluded_and_locked(open_ur: Callable[..., MetadataStore]) -> None:
    a, b = open_ur().underreplication, open_ur().underreplication
    for i in (1, 2, 3):
        a.mark_under_replicated(LedgerId(i), [B1])
    got_a = {a.acquire_ledger_to_rereplicate(exclude=[1]), a.acquire_ledger_to_rereplicate(exclude=[1])}
    assert got_a == {2, 3}
    assert b.acquire_ledger_to_rereplicate(exclude={1}) is None
    assert b.acquire_ledger_to_rereplicate() == 1
    assert a.acquire_ledger_to_rereplicate() is None


def test_many_workers_take_each_ledger_once(open_ur: Callable[..., MetadataStore]) -> None:
    stores = [open_ur().underreplication for _ in range(3)]
    for i in range(30):
        stores[0].mark_under_replicated(LedgerId(1000 + i), [B1])
    taken: list[int] = []
    lock = threading.Lock()

    def work(ur: object) -> None:
        while (lid := ur.acquire_ledger_to_rereplicate()) is not None:  # type: ignore[attr-defined]
            with lock:
                taken.append(lid)

    threads = [threading.Thread(target=work, args=(ur,)) for ur in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(taken) == [1000 + i for i in range(30)]


def test_closing_a_session_frees_its_locks(open_ur: Callable[..., MetadataStore]) -> None:
    a_store = open_ur()
    a, b = a_store.underreplication, open_ur().underreplication
    a.mark_under_replicated(LedgerId(21), [B1])
    assert a.acquire_ledger_to_rereplicate() == 21
    assert b.acquire_ledger_to_rereplicate() is None
    a_store.close()  # ZooKeeper: the session ends with the client; sqlite: the lease row goes
    assert not b.is_locked(LedgerId(21))
    assert b.acquire_ledger_to_rereplicate() == 21


_WORKER = textwrap.dedent(
    """
    import sys, time
    from vellum.meta import open_metadata_store
    s = open_metadata_store(sys.argv[1], session_timeout_s=float(sys.argv[2]))
    s.underreplication.mark_under_replicated(31, ["bk1:3181"])
    print("acquired", s.underreplication.acquire_ledger_to_rereplicate(worker_id="doomed"), flush=True)
    s.underreplication.elect_auditor("doomed:3181").wait_leader(30)
    print("leader", flush=True)
    while True:
        time.sleep(0.1)
    """
)


def test_a_killed_process_loses_its_locks_and_leadership(open_ur: Callable[..., MetadataStore], ur_uri: str) -> None:
    """No goodbye (SIGKILL): only session expiry (ZooKeeper) or lease expiry (sqlite) frees them."""
    ur = open_ur().underreplication
    p = subprocess.Popen([sys.executable, "-c", _WORKER, ur_uri, "2.0"], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None
        assert p.stdout.readline().split() == ["acquired", "31"]
        assert p.stdout.readline().split() == ["leader"]
        took_over = threading.Event()
        mine = ur.elect_auditor(BookieId("survivor:3181"), took_over.set)
        assert ur.lock_owner(LedgerId(31)) == "doomed" and ur.current_auditor() == "doomed:3181"
        assert not mine.is_leader
        os.kill(p.pid, signal.SIGKILL)
        p.wait(30)
        wait_until(lambda: not ur.is_locked(LedgerId(31)), what="the dead worker's lock to expire")
        assert ur.acquire_ledger_to_rereplicate() == 31
        assert mine.wait_leader(30) and took_over.wait(10)
        assert ur.current_auditor() == "survivor:3181"
    finally:
        p.kill()
        p.wait(30)
        if p.stdout is not None:
            p.stdout.close()


# -- finishing --------------------------------------------------------------------------------

def test_record_marked_again_while_replicating_stays(open_ur: Callable[..., MetadataStore]) -> None:
    """BookKeeper's rule: the worker deletes the record only at the version it started from."""
    auditor, worker = open_ur().underreplication, open_ur().underreplication
    auditor.mark_under_replicated(LedgerId(41), [B1])
    assert worker.acquire_ledger_to_rereplicate() == 41
    auditor.mark_under_replicated(LedgerId(41), [B2])  # a second bookie lost meanwhile
    assert worker.mark_replicated(LedgerId(41)) is False  # default: the version it acquired
    kept = auditor.get_under_replicated(LedgerId(41))
    assert kept is not None and kept.replicas == (B1, B2)
    assert not auditor.is_locked(LedgerId(41))  # released all the same
    assert worker.acquire_ledger_to_rereplicate() == 41
    current = worker.get_under_replicated(LedgerId(41))
    assert current is not None
    assert worker.mark_replicated(LedgerId(41), expected_version=current.version + 7) is False
    assert worker.acquire_ledger_to_rereplicate() == 41
    assert worker.mark_replicated(LedgerId(41), expected_version=current.version) is True
    assert auditor.get_under_replicated(LedgerId(41)) is None and not auditor.is_locked(LedgerId(41))
    assert worker.mark_replicated(LedgerId(41)) is False  # gone already: idempotent
    assert list(auditor.list_under_replicated()) == []


def test_wait_for_work_wakes_on_a_new_record(open_ur: Callable[..., MetadataStore]) -> None:
    auditor, worker = open_ur().underreplication, open_ur().underreplication
    assert worker.wait_for_work(0.0) is True  # never tried to acquire: go and try
    assert worker.acquire_ledger_to_rereplicate() is None
    t0 = time.monotonic()
    assert worker.wait_for_work(0.3) is False  # nothing changed
    assert time.monotonic() - t0 >= 0.25
    timer = threading.Timer(0.3, auditor.mark_under_replicated, (LedgerId(51), [B1]))
    timer.start()
    try:
        assert worker.wait_for_work(30) is True
    finally:
        timer.join()
    assert worker.acquire_ledger_to_rereplicate() == 51


def test_wait_for_work_wakes_when_a_lock_is_released(open_ur: Callable[..., MetadataStore]) -> None:
    a, b = open_ur().underreplication, open_ur().underreplication
    a.mark_under_replicated(LedgerId(52), [B1])
    assert a.acquire_ledger_to_rereplicate() == 52
    assert b.acquire_ledger_to_rereplicate() is None
    timer = threading.Timer(0.3, a.release_ledger, (LedgerId(52),))
    timer.start()
    try:
        assert b.wait_for_work(30) is True
    finally:
        timer.join()
    assert b.acquire_ledger_to_rereplicate() == 52


# -- switch, delay, timestamps ----------------------------------------------------------------

def test_replication_switch(open_ur: Callable[..., MetadataStore]) -> None:
    admin, worker = open_ur().underreplication, open_ur().underreplication
    admin.mark_under_replicated(LedgerId(61), [B1])
    assert worker.is_replication_enabled()
    admin.disable_replication()
    admin.disable_replication()  # idempotent
    assert not worker.is_replication_enabled()
    assert worker.acquire_ledger_to_rereplicate() is None  # no work handed out while disabled
    assert worker.wait_replication_enabled(0.2) is False
    admin.mark_under_replicated(LedgerId(62), [B1])  # the auditor keeps marking
    timer = threading.Timer(0.3, admin.enable_replication)
    timer.start()
    try:
        assert worker.wait_replication_enabled(30) is True
    finally:
        timer.join()
    admin.enable_replication()  # idempotent
    assert worker.is_replication_enabled()
    assert worker.wait_for_work(10) is True  # enabling is a change a waiting worker hears of
    assert worker.acquire_ledger_to_rereplicate() in (61, 62)


def test_lost_bookie_recovery_delay(open_ur: Callable[..., MetadataStore]) -> None:
    a, b = open_ur().underreplication, open_ur().underreplication
    assert a.get_lost_bookie_recovery_delay() is None  # unset: the configuration applies
    seen: list[int | None] = []
    w = b.watch_lost_bookie_recovery_delay(seen.append)
    assert seen == [None]  # called at once with the current value
    a.set_lost_bookie_recovery_delay(30)
    assert b.get_lost_bookie_recovery_delay() == 30
    wait_until(lambda: seen[-1:] == [30], what="delay watch (30)")
    a.set_lost_bookie_recovery_delay(0)
    wait_until(lambda: seen[-1:] == [0], what="delay watch (0)")
    calls = len(seen)
    a.set_lost_bookie_recovery_delay(0)  # the same value again (triggeraudit) fires the watch too
    wait_until(lambda: len(seen) > calls and seen[-1] == 0, what="delay watch (0 again)")
    w.cancel()
    with pytest.raises(IncorrectParameterError):
        a.set_lost_bookie_recovery_delay(-1)


def test_audit_timestamps(open_ur: Callable[..., MetadataStore]) -> None:
    ur = open_ur().underreplication
    getters = (ur.get_check_all_ledgers_ctime, ur.get_placement_policy_check_ctime, ur.get_replicas_check_ctime)
    setters = (ur.set_check_all_ledgers_ctime, ur.set_placement_policy_check_ctime, ur.set_replicas_check_ctime)
    assert [g() for g in getters] == [None, None, None]
    for k, set_ctime in enumerate(setters):
        set_ctime(1_700_000_000_000 + k)
    assert [g() for g in getters] == [1_700_000_000_000, 1_700_000_000_001, 1_700_000_000_002]
    ur.set_replicas_check_ctime(1_800_000_000_000)
    assert ur.get_replicas_check_ctime() == 1_800_000_000_000


# -- auditor election -------------------------------------------------------------------------

def test_one_auditor_and_the_next_takes_over_on_resign(open_ur: Callable[..., MetadataStore]) -> None:
    a, b, observer = open_ur().underreplication, open_ur().underreplication, open_ur().underreplication
    assert observer.current_auditor() is None
    a_led, b_led = threading.Event(), threading.Event()
    ea = a.elect_auditor(B1, a_led.set)
    assert ea.wait_leader(30) and a_led.wait(10)
    eb = b.elect_auditor(B2, b_led.set)
    assert not eb.wait_leader(0.3) and not eb.is_leader and not b_led.is_set()
    assert observer.current_auditor() == B1 and eb.leader() == B1 and ea.bookie_id == B1
    ea.resign()
    assert not ea.is_leader and ea.wait_leader(5) is False
    assert eb.wait_leader(30) and b_led.wait(10)
    assert observer.current_auditor() == B2
    ea.resign()  # idempotent
    eb.resign()
    wait_until(lambda: observer.current_auditor() is None, what="no auditor left")


def test_leader_session_end_elects_the_next(open_ur: Callable[..., MetadataStore]) -> None:
    a_store = open_ur()
    b = open_ur().underreplication
    ea = a_store.underreplication.elect_auditor(B1)
    assert ea.wait_leader(30)
    b_led = threading.Event()
    candidates = [b.elect_auditor(bk, b_led.set if bk == B2 else None) for bk in (B2, B3)]
    a_store.close()
    assert candidates[0].wait_leader(30) and b_led.wait(10)
    time.sleep(0.3)
    assert [c.is_leader for c in candidates] == [True, False]  # exactly one leader
    assert b.current_auditor() == B2
    candidates[0].resign()
    assert candidates[1].wait_leader(30)


def _expire_session(store: MetadataStore) -> None:
    """End ``store``'s session from outside, as the server would (it then gets a new one)."""
    from vellum.meta.sqlite import SqliteMetadataStore
    from vellum.meta.zk import ZkMetadataStore

    if isinstance(store, ZkMetadataStore):
        from kazoo.client import KazooClient

        # A second client joins the session and closes it: a real server-side expiry.
        killer = KazooClient(hosts=store.hosts, client_id=store.client.client_id, timeout=4.0)
        killer.start(10)
        killer.stop()
        killer.close()
    else:
        assert isinstance(store, SqliteMetadataStore)
        with sqlite3.connect(store.path, timeout=30) as db:  # the lease lapses, as for a paused process
            db.execute("UPDATE sessions SET expires_at = 0 WHERE session_id = ?", (store.session_id,))
        db.close()


def test_session_expiry_frees_locks_and_elects_again(open_ur: Callable[..., MetadataStore]) -> None:
    victim = open_ur()
    other = open_ur().underreplication
    ur = victim.underreplication
    ur.mark_under_replicated(LedgerId(71), [B1])
    assert ur.acquire_ledger_to_rereplicate() == 71
    led, lost = threading.Event(), threading.Event()
    ev = ur.elect_auditor(B1, led.set, on_lost=lost.set)
    assert ev.wait_leader(30) and led.wait(10)
    eo = other.elect_auditor(B2)
    led.clear()
    old_session = victim.session_id
    _expire_session(victim)
    assert lost.wait(30)  # the leader hears that it no longer leads
    assert eo.wait_leader(30)
    wait_until(lambda: other.acquire_ledger_to_rereplicate() == 71, what="the expired session's lock to go")
    # With its new session the old leader runs again: a new vote, behind the new leader.
    wait_until(lambda: victim.session_id != old_session, what="a new session")
    time.sleep(0.5)
    assert not ev.is_leader and not led.is_set() and other.current_auditor() == B2
    eo.resign()
    assert ev.wait_leader(30) and led.wait(10)
    assert other.current_auditor() == B1


def test_no_thread_left_after_close(open_ur: Callable[..., MetadataStore]) -> None:
    before = set(threading.enumerate())
    s = open_ur()
    ur = s.underreplication
    ur.mark_under_replicated(LedgerId(81), [B1])
    ur.watch_lost_bookie_recovery_delay(lambda _v: None)
    ur.elect_auditor(B1).wait_leader(30)
    assert ur.acquire_ledger_to_rereplicate() == 81
    assert ur.acquire_ledger_to_rereplicate() is None
    waiter = threading.Thread(target=ur.wait_for_work, args=(60,))
    waiter.start()
    s.close()
    waiter.join(10)
    assert not waiter.is_alive()  # close wakes a waiting worker
    wait_until(lambda: not [t for t in threading.enumerate() if t not in before and t.is_alive()],
               timeout_s=15, what="the store's threads to end")


# -- BookKeeper's layout and encodings --------------------------------------------------------

def test_zk_layout_is_bookkeepers(open_ur: Callable[..., MetadataStore], ur_uri: str) -> None:
    if not ur_uri.startswith("zk"):
        pytest.skip("ZooKeeper layout")
    from vellum.meta.zk import ZkMetadataStore

    s = open_ur()
    assert isinstance(s, ZkMetadataStore)
    zk, ur = s.client, s.underreplication
    base = f"{s.root}/underreplication"
    lid = LedgerId(0x7AFEBEEF0000FEED)
    ur.mark_under_replicated(lid, [B2, B1])
    record = f"{base}/ledgers/7afe/beef/0000/feed/urL{lid:010d}"
    data, _ = zk.get(record)
    ctime = ur.get_under_replicated(lid).ctime_ms  # type: ignore[union-attr]
    assert data == f'replica: "bk1:3181"\nreplica: "bk2:3181"\nctime: {ctime}\n'.encode()
    assert zk.get(f"{base}/LAYOUT")[0] == b'type: "BASIC"\nversion: 1\n'
    assert ur.acquire_ledger_to_rereplicate(worker_id="host-a") == lid
    lock_data, lock_stat = zk.get(f"{base}/locks/urL{lid:010d}")
    assert lock_data == b'bookieId: "host-a"\n' and lock_stat.ephemeralOwner == s.session_id
    assert ur.mark_replicated(lid)
    assert zk.get_children(f"{base}/ledgers") == []  # the empty hex levels are pruned
    assert zk.get_children(f"{base}/locks") == []

    ur.disable_replication()
    assert zk.get(f"{base}/disable")[0] == b""
    ur.set_lost_bookie_recovery_delay(45)
    assert zk.get(f"{base}/lostBookieRecoveryDelay")[0] == b"45"
    ur.set_check_all_ledgers_ctime(1_700_000_000_000)
    ur.set_placement_policy_check_ctime(1)
    ur.set_replicas_check_ctime(300)
    assert zk.get(f"{base}/checkallledgersctime")[0] == b"\x08\x80\xd0\x95\xff\xbc\x31"
    assert zk.get(f"{base}/placementpolicycheckctime")[0] == b"\x08\x01"
    assert zk.get(f"{base}/replicascheckctime")[0] == b"\x08\xac\x02"

    election = ur.elect_auditor(BookieId("bk9:3181"))
    assert election.wait_leader(30)
    votes = zk.get_children(f"{base}/auditorelection")
    assert len(votes) == 1 and votes[0].startswith("V_") and len(votes[0]) == 12
    vote_data, vote_stat = zk.get(f"{base}/auditorelection/{votes[0]}")
    assert vote_data == b'bookieId: "bk9:3181"\n' and vote_stat.ephemeralOwner == s.session_id
    assert zk.get(f"{base}/auditorelection")[0] == b'bookieId: "bk9:3181"\n'


def test_zk_reads_what_bookkeeper_writes(open_ur: Callable[..., MetadataStore], ur_uri: str) -> None:
    """Records, votes and the delay as BookKeeper's Java code leaves them."""
    if not ur_uri.startswith("zk"):
        pytest.skip("ZooKeeper layout")
    from vellum.meta.zk import ZkMetadataStore

    s = open_ur()
    assert isinstance(s, ZkMetadataStore)
    zk, ur = s.client, s.underreplication
    base = f"{s.root}/underreplication"
    # unsorted replicas and no ctime (storeSystemTimeAsLedgerUnderreplicatedMarkTime=false)
    zk.create(f"{base}/ledgers/0000/0000/0000/002a/urL0000000042", b'replica: "h2:3181"\nreplica: "h1:3181"\n',
              makepath=True)
    assert ur.get_under_replicated(LedgerId(42)) == UnderReplicatedLedger(
        LedgerId(42), (BookieId("h1:3181"), BookieId("h2:3181")), UR.UNASSIGNED_CTIME, 0
    )
    ur.mark_under_replicated(LedgerId(42), ["h1:3181"])  # nothing new: BookKeeper's bytes stay
    assert zk.get(f"{base}/ledgers/0000/0000/0000/002a/urL0000000042")[1].version == 0
    zk.create(f"{base}/auditorelection/V_", b'bookieId: "java-bookie:3181"\n', ephemeral=True, sequence=True,
              makepath=True)
    assert ur.current_auditor() == "java-bookie:3181"
    zk.create(f"{base}/lostBookieRecoveryDelay", b"120")
    assert ur.get_lost_bookie_recovery_delay() == 120
    zk.create(f"{base}/replicascheckctime", b"")  # an empty message: field not set
    assert ur.get_replicas_check_ctime() is None
    zk.set(f"{base}/LAYOUT", b'type: "OTHER"\nversion: 2\n')
    fresh = open_ur().underreplication
    with pytest.raises(MetaStoreError, match="incompatible re-replication layout"):
        fresh.mark_under_replicated(LedgerId(43), [B1])


# -- pure encodings ---------------------------------------------------------------------------

_bookie_ids = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=30)


@given(st.lists(_bookie_ids, max_size=6), st.one_of(st.none(), st.integers(0, 1 << 62)))
def test_record_round_trip(replicas: list[str], ctime: int | None) -> None:
    data = UR.encode_under_replicated(replicas, ctime)
    assert data.isascii()  # Java's TextFormat escapes everything else
    got = UR.decode_under_replicated(data, where="test")
    assert got == (tuple(sorted(set(replicas))), UR.UNASSIGNED_CTIME if ctime is None else ctime)


@given(st.integers(-(1 << 63), (1 << 63) - 1))
def test_ctime_round_trip(value: int) -> None:
    assert UR.decode_ctime(UR.encode_ctime(value), where="test") == value


def test_text_format_accepts_what_protobuf_accepts() -> None:
    text = b"# a comment\nreplica: 'h\\0721:1' replica : \"h0\" \"x\"\nctime: 0x10\nunknown_field: ENUM\n"
    assert UR.decode_under_replicated(text, where="t") == (("h0x", "h:1:1"), 16)
    assert UR.decode_bookie_id_record(b"", where="t") == ""
    with pytest.raises(MetaStoreError, match="not protobuf text"):
        UR.decode_under_replicated(b"replica: {", where="znode /x")
    with pytest.raises(MetaStoreError, match="ctime must be int"):
        UR.decode_under_replicated(b'ctime: "soon"', where="znode /x")
