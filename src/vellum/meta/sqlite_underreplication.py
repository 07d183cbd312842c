"""AutoRecovery's records on the embedded store: under-replicated ledgers, their re-replication
locks, the switch, the lost-bookie delay, the check timestamps and the auditor election.

Tables (``meta/sqlite.py`` describes the whole schema)::

    ur_ledgers(ledger_id INTEGER PRIMARY KEY, version, data)  data = BookKeeper's text UnderreplicatedLedgerFormat
    ur_locks(ledger_id INTEGER PRIMARY KEY, session_id, owner)  re-replication lock of a session
    auditor_votes(seq INTEGER PRIMARY KEY AUTOINCREMENT, session_id, bookie_id)  lowest live seq leads
    system['underreplication/...']                           the switch, the delay, the timestamps
    counters['ur_changes']                                   bumped when work may have become available

Locks and votes belong to the store's session and are written through its interface
(``SqliteSession``: connection, lock, id, watches, callback thread, listeners) only.
"""

from __future__ import annotations

import logging
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any

from vellum.errors import IncorrectParameterError, MetaStoreError
from vellum.ids import BookieId, LedgerId
from vellum.meta import paths as P
from vellum.meta import underreplication as UR
from vellum.meta.api import (
    AuditorElection,
    DelayWatcher,
    SessionEvent,
    UnderReplicatedLedger,
    UnderReplicationManager,
    Versioned,
    Watch,
)
from vellum.meta.sqlite_db import PAGE, UR_CHANGES, Db, PolledWatch, bump_ur_changes, sys_get
from vellum.meta.sqlite_session import SqliteSession
from vellum.meta.underreplication import Candidacy

log = logging.getLogger(__name__)


_UR_KEY = P.UNDERREPLICATION + "/"


def _leading_vote(db: Db) -> tuple[int, str] | None:
    """The lowest vote whose session's lease is unexpired: the auditor."""
    rows = db.query(
        "reading the auditor election",
        "SELECT v.seq, v.bookie_id FROM auditor_votes v JOIN sessions s USING(session_id)"
        " WHERE s.expires_at >= ? ORDER BY v.seq LIMIT 1",
        (time.time(),),
    )
    return (int(rows[0][0]), str(rows[0][1])) if rows else None


class _SqliteAuditorElection(Candidacy):
    """A row in ``auditor_votes`` owned by the store's session; the lowest live one leads.

    The store's poll thread re-reads the leading vote every poll interval (a lease can lapse
    without any write) and the change reaches ``evaluate`` on the dispatcher thread.
    """

    def __init__(
        self,
        manager: SqliteUnderReplicationManager,
        session: SqliteSession,
        bookie_id: BookieId,
        on_leader: Callable[[], None] | None,
        on_lost: Callable[[], None] | None,
    ) -> None:
        super().__init__(bookie_id, manager.current_auditor, on_leader, on_lost, session.submit)
        self._manager = manager
        self._session = session
        self._seq: int | None = None
        self._watch: PolledWatch | None = None

    def start(self) -> None:
        self.vote()
        self._watch = self._session.watch(_leading_vote, self.evaluate, key=lambda s: s, on_commit_only=False)
        self.evaluate(self._watch.last)

    def vote(self) -> None:
        """A new vote under the store's current session (at the end of the line)."""
        with self._lock, self._session.lock:
            if self.state.closed:
                return
            with self._session.db.txn("voting for auditor") as c:
                cur = c.execute(
                    "INSERT INTO auditor_votes(session_id, bookie_id) VALUES(?, ?)",
                    (self._session.id, self._bookie_id),
                )
                self._seq = int(cur.lastrowid or 0)

    def evaluate(self, leading: tuple[int, str] | None) -> None:
        with self._lock:
            if self.state.closed:
                return
            mine = self._seq is not None and leading is not None and leading[0] == self._seq
        if mine:
            self.state.won()
        else:
            self.state.lost()

    def session_expired(self) -> None:
        with self._lock:
            self._seq = None  # purged with the session
        self.state.lost()

    def resign(self) -> None:
        if not self.state.close():
            return
        self._manager._forget(self)
        if self._watch is not None:
            self._watch.cancel()
        with self._lock:
            seq, self._seq = self._seq, None
        if seq is not None:
            with self._session.db.txn("withdrawing an auditor vote") as c:
                c.execute("DELETE FROM auditor_votes WHERE seq = ?", (seq,))


class SqliteUnderReplicationManager(UnderReplicationManager):
    """AutoRecovery's records in ``ur_ledgers`` (data = BookKeeper's text record), locks in
    ``ur_locks`` and votes in ``auditor_votes`` (both owned by a session, live while its lease
    is), the switch, delay and timestamps as ``system`` rows under ``underreplication/``.

    Waiting polls: ``counters['ur_changes']`` grows with every change that may free work (a
    record marked, a lock released or purged, replication enabled); the switch is re-read.
    """

    def __init__(self, session: SqliteSession) -> None:
        self._session = session
        self._db = session.db
        self._poll_s = session.poll_interval_s
        self._lock = threading.Lock()
        self._held: dict[int, int] = {}  # ledger id -> record version when this session locked it
        self._elections: set[_SqliteAuditorElection] = set()
        self._seen = threading.local()
        self._closed = threading.Event()
        session.add_listener(self._on_session)

    def _where(self, ledger_id: int) -> str:
        return f"{self._db.path} ur_ledgers[{ledger_id}]"

    def _on_session(self, event: SessionEvent) -> None:
        # On the dispatcher thread, after the heartbeat replaced an expired session.
        with self._lock:
            elections = list(self._elections)
        for e in elections:
            try:
                if event is SessionEvent.EXPIRED:
                    e.session_expired()
                else:
                    e.vote()
                    e.evaluate(_leading_vote(self._db))
            except Exception:
                log.exception("auditor election of %s after a new session failed", e.bookie_id)

    def _changes(self) -> int:
        rows = self._db.query("polling for re-replication work", "SELECT value FROM counters WHERE name = ?",
                              (UR_CHANGES,))
        return int(rows[0][0]) if rows else 0

    def _poll_until(self, ready: Callable[[], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            if ready():
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._closed.wait(min(self._poll_s, remaining)):
                return False

    def _upsert(self, name: str, value: bytes) -> None:
        with self._db.txn(f"writing system[{_UR_KEY}{name}]") as c:
            c.execute(
                "INSERT INTO system(key, version, value) VALUES(?, 0, ?)"
                " ON CONFLICT(key) DO UPDATE SET version = version + 1, value = excluded.value",
                (_UR_KEY + name, value),
            )

    def _value(self, name: str) -> bytes | None:
        v = sys_get(self._db, _UR_KEY + name)
        return None if v is None else v.value

    # -- records --------------------------------------------------------------------------

    def mark_under_replicated(self, ledger_id: LedgerId, missing_replicas: Iterable[str]) -> None:
        P._check_id(ledger_id)
        missing = [str(r) for r in missing_replicas]
        where = self._where(ledger_id)
        with self._db.txn(f"marking ledger {ledger_id} under-replicated") as c:
            row = c.execute("SELECT data FROM ur_ledgers WHERE ledger_id = ?", (ledger_id,)).fetchone()
            if row is None:
                c.execute(
                    "INSERT INTO ur_ledgers(ledger_id, version, data) VALUES(?, 0, ?)",
                    (ledger_id, UR.encode_under_replicated(missing, UR.now_ms())),
                )
            else:
                replicas, _ = UR.decode_under_replicated(row[0], where=where)
                merged = UR.merge_replicas(replicas, missing)
                if merged is None:
                    return
                c.execute(
                    "UPDATE ur_ledgers SET version = version + 1, data = ? WHERE ledger_id = ?",
                    (UR.encode_under_replicated(merged, UR.now_ms()), ledger_id),
                )
            bump_ur_changes(c)

    def _record(self, row: Any) -> UnderReplicatedLedger:
        ledger_id = int(row[0])
        replicas, ctime = UR.decode_under_replicated(row[2], where=self._where(ledger_id))
        return UnderReplicatedLedger(LedgerId(ledger_id), tuple(BookieId(r) for r in replicas), ctime, int(row[1]))

    def get_under_replicated(self, ledger_id: LedgerId) -> UnderReplicatedLedger | None:
        rows = self._db.query(
            f"reading under-replicated ledger {ledger_id}",
            "SELECT ledger_id, version, data FROM ur_ledgers WHERE ledger_id = ?", (ledger_id,),
        )
        return self._record(rows[0]) if rows else None

    def list_under_replicated(self) -> Iterator[UnderReplicatedLedger]:
        after = -1
        while True:
            rows = self._db.query(
                "listing under-replicated ledgers",
                "SELECT ledger_id, version, data FROM ur_ledgers WHERE ledger_id > ? ORDER BY ledger_id LIMIT ?",
                (after, PAGE),
            )
            if not rows:
                return
            for row in rows:
                yield self._record(row)
            after = int(rows[-1][0])

    # -- locks ----------------------------------------------------------------------------

    def acquire_ledger_to_rereplicate(
        self, exclude: Collection[int] = (), *, worker_id: str | None = None
    ) -> LedgerId | None:
        excluded = set(exclude)
        owner = socket.gethostname() if worker_id is None else worker_id
        with self._session.lock, self._db.txn("acquiring a ledger to re-replicate") as c:
            row = c.execute("SELECT value FROM counters WHERE name = ?", (UR_CHANGES,)).fetchone()
            self._seen.gen = int(row[0]) if row else 0
            if c.execute("SELECT 1 FROM system WHERE key = ?", (_UR_KEY + P.UR_DISABLE,)).fetchone():
                return None
            now = time.time()
            after = -1
            while True:
                rows = c.execute(
                    "SELECT u.ledger_id, u.version FROM ur_ledgers u WHERE u.ledger_id > ? AND NOT EXISTS"
                    " (SELECT 1 FROM ur_locks l JOIN sessions s USING(session_id)"
                    "  WHERE l.ledger_id = u.ledger_id AND s.expires_at >= ?)"
                    " ORDER BY u.ledger_id LIMIT ?",
                    (after, now, PAGE),
                ).fetchall()
                for ledger_id, version in rows:
                    if ledger_id in excluded:
                        continue
                    # A lock row of a dead session may still be there: it is replaced.
                    c.execute(
                        "INSERT OR REPLACE INTO ur_locks(ledger_id, session_id, owner) VALUES(?, ?, ?)",
                        (ledger_id, self._session.id, owner),
                    )
                    with self._lock:
                        self._held[int(ledger_id)] = int(version)
                    return LedgerId(int(ledger_id))
                if len(rows) < PAGE:
                    return None
                after = int(rows[-1][0])

    def wait_for_work(self, timeout_s: float) -> bool:
        seen = getattr(self._seen, "gen", None)
        if seen is None:
            return True
        return self._poll_until(lambda: self._changes() != seen, timeout_s)

    def _delete_own_lock(self, c: sqlite3.Connection, ledger_id: int) -> bool:
        return bool(c.execute(
            "DELETE FROM ur_locks WHERE ledger_id = ? AND session_id = ?", (ledger_id, self._session.id)
        ).rowcount)

    def release_ledger(self, ledger_id: LedgerId) -> None:
        with self._lock:
            self._held.pop(ledger_id, None)
        with self._session.lock, self._db.txn(f"releasing ledger {ledger_id}") as c:
            if self._delete_own_lock(c, ledger_id):
                bump_ur_changes(c)

    def mark_replicated(self, ledger_id: LedgerId, expected_version: int | None = None) -> bool:
        with self._lock:
            version = self._held.get(ledger_id) if expected_version is None else expected_version
        with self._session.lock, self._db.txn(f"marking ledger {ledger_id} replicated") as c:
            row = c.execute("SELECT version FROM ur_ledgers WHERE ledger_id = ?", (ledger_id,)).fetchone()
            # A record marked again meanwhile (another bookie lost) stays for a new check.
            deleted = row is not None and (version is None or int(row[0]) == version)
            if deleted:
                c.execute("DELETE FROM ur_ledgers WHERE ledger_id = ?", (ledger_id,))
            if self._delete_own_lock(c, ledger_id) and not deleted:
                bump_ur_changes(c)
        with self._lock:
            self._held.pop(ledger_id, None)
        return deleted

    def _live_lock(self, ledger_id: int) -> list[Any]:
        return self._db.query(
            f"reading the lock of ledger {ledger_id}",
            "SELECT l.owner FROM ur_locks l JOIN sessions s USING(session_id)"
            " WHERE l.ledger_id = ? AND s.expires_at >= ?",
            (ledger_id, time.time()),
        )

    def is_locked(self, ledger_id: LedgerId) -> bool:
        return bool(self._live_lock(ledger_id))

    def lock_owner(self, ledger_id: LedgerId) -> str | None:
        rows = self._live_lock(ledger_id)
        return str(rows[0][0]) if rows else None

    # -- switch, delay, timestamps --------------------------------------------------------

    def disable_replication(self) -> None:
        with self._db.txn("disabling replication") as c:
            c.execute("INSERT OR IGNORE INTO system(key, version, value) VALUES(?, 0, x'')", (_UR_KEY + P.UR_DISABLE,))

    def enable_replication(self) -> None:
        with self._db.txn("enabling replication") as c:
            if c.execute("DELETE FROM system WHERE key = ?", (_UR_KEY + P.UR_DISABLE,)).rowcount:
                bump_ur_changes(c)

    def is_replication_enabled(self) -> bool:
        return self._value(P.UR_DISABLE) is None

    def wait_replication_enabled(self, timeout_s: float) -> bool:
        return self._poll_until(self.is_replication_enabled, timeout_s)

    def get_lost_bookie_recovery_delay(self) -> int | None:
        data = self._value(P.UR_LOST_BOOKIE_RECOVERY_DELAY)
        where = f"{self._db.path} system[{_UR_KEY}{P.UR_LOST_BOOKIE_RECOVERY_DELAY}]"
        return None if data is None else UR.decode_delay(data, where=where)

    def set_lost_bookie_recovery_delay(self, seconds: int) -> None:
        if seconds < 0:
            raise IncorrectParameterError(f"lost bookie recovery delay must be >= 0 s, got {seconds}")
        self._upsert(P.UR_LOST_BOOKIE_RECOVERY_DELAY, UR.encode_delay(seconds))

    def watch_lost_bookie_recovery_delay(self, callback: DelayWatcher) -> Watch:
        name = P.UR_LOST_BOOKIE_RECOVERY_DELAY
        where = f"{self._db.path} system[{_UR_KEY}{name}]"

        def fire(state: Versioned[bytes] | None) -> None:
            try:
                callback(None if state is None else UR.decode_delay(state.value, where=where))
            except MetaStoreError:
                log.exception("unreadable lost bookie recovery delay")

        def probe(db: Db) -> Versioned[bytes] | None:
            return sys_get(db, _UR_KEY + name)

        # Keyed by version, not value: setting the same delay again fires too (ZooKeeper's data
        # watch does), which is how `triggeraudit` reaches the auditor.
        w = self._session.watch(probe, fire, key=lambda v: None if v is None else v.version,
                                    on_commit_only=True)
        fire(self._session.probe_now(probe))
        return w

    def _get_ctime(self, name: str) -> int | None:
        data = self._value(name)
        if data is None:
            return None
        try:
            return int(data.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            raise MetaStoreError(f"{self._db.path} system[{_UR_KEY}{name}]: not a time: {data[:40]!r}") from None

    def get_check_all_ledgers_ctime(self) -> int | None:
        return self._get_ctime(P.UR_CHECK_ALL_LEDGERS_CTIME)

    def set_check_all_ledgers_ctime(self, ctime_ms: int) -> None:
        self._upsert(P.UR_CHECK_ALL_LEDGERS_CTIME, str(int(ctime_ms)).encode())

    def get_placement_policy_check_ctime(self) -> int | None:
        return self._get_ctime(P.UR_PLACEMENT_POLICY_CHECK_CTIME)

    def set_placement_policy_check_ctime(self, ctime_ms: int) -> None:
        self._upsert(P.UR_PLACEMENT_POLICY_CHECK_CTIME, str(int(ctime_ms)).encode())

    def get_replicas_check_ctime(self) -> int | None:
        return self._get_ctime(P.UR_REPLICAS_CHECK_CTIME)

    def set_replicas_check_ctime(self, ctime_ms: int) -> None:
        self._upsert(P.UR_REPLICAS_CHECK_CTIME, str(int(ctime_ms)).encode())

    # -- auditor election -----------------------------------------------------------------

    def elect_auditor(
        self,
        bookie_id: BookieId,
        on_leader: Callable[[], None] | None = None,
        *,
        on_lost: Callable[[], None] | None = None,
    ) -> AuditorElection:
        election = _SqliteAuditorElection(self, self._session, bookie_id, on_leader, on_lost)
        with self._lock:
            if self._closed.is_set():
                raise MetaStoreError("the metadata store is closed")
            self._elections.add(election)
        try:
            election.start()
        except BaseException:
            election.resign()
            raise
        return election

    def _forget(self, election: _SqliteAuditorElection) -> None:
        with self._lock:
            self._elections.discard(election)

    def current_auditor(self) -> BookieId | None:
        leading = _leading_vote(self._db)
        return None if leading is None else BookieId(leading[1])

    def close(self) -> None:
        """Before the session ends: no callback runs after this, waiters return."""
        self._closed.set()
        with self._lock:
            elections, self._elections = list(self._elections), set()
        for e in elections:
            e.state.close()
