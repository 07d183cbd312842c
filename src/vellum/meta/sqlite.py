"""Embedded metadata driver: ZooKeeper's semantics on one SQLite file (the default).

Responsibility: implement every interface of ``meta.api`` for several processes on one machine
(bookies, clients, Spark workers) sharing one file, with nothing to install.

Schema (format version 1, in ``vellum_meta.format_version``)::

    vellum_meta(key PRIMARY KEY, value)                     format version, creation time
    ledgers(ledger_id INTEGER PRIMARY KEY, version, data)   data = serialized LedgerMetadata
    system(key PRIMARY KEY, version, value)                 LAYOUT, INSTANCEID, cookies/<bookieId>
    kv(key PRIMARY KEY, version, value)                     the key-value area
    counters(name PRIMARY KEY, value)                       'ledger_id': last id handed out
    sessions(session_id INTEGER PRIMARY KEY AUTOINCREMENT, owner, pid, timeout_s, expires_at)
    registrations(bookie_id PRIMARY KEY, read_only, session_id, data)

AutoRecovery (tables created in older stores too, when opened)::

    ur_ledgers(ledger_id INTEGER PRIMARY KEY, version, data)  under-replicated ledger; data =
                                                             BookKeeper's text UnderreplicatedLedgerFormat
    ur_locks(ledger_id INTEGER PRIMARY KEY, session_id, owner)  re-replication lock of a session
    auditor_votes(seq INTEGER PRIMARY KEY AUTOINCREMENT, session_id, bookie_id)  lowest live seq leads
    system['underreplication/disable']                       row exists = replication disabled
    system['underreplication/lostBookieRecoveryDelay']       seconds, decimal text
    system['underreplication/checkallledgersctime']          ms since the epoch, decimal text (also
          .../placementpolicycheckctime, .../replicascheckctime)
    counters['ur_changes']                                   bumped when work may have become available

Invariants:
- every write is one ``BEGIN IMMEDIATE`` transaction (WAL journal, ``busy_timeout``), so a
  ``kill -9`` of any process at any instant leaves either the old or the new state; the
  compare-and-set check and the write happen in the same transaction;
- an error from a write means nothing was written (a failed COMMIT is rolled back): calls run in
  process, so the embedded store has no lost replies, and ``create_ledger`` takes the id and
  inserts the row in one transaction (no orphan). ``create_ledger_with_id`` accepts a row that
  carries the caller's creator token as the caller's own earlier create, as the ZooKeeper driver
  does after a lost reply, so that a caller's retry means the same on both drivers;
- a version starts at 0 and grows by one per write (like a znode's ``stat.version``);
- a session is a row with a lease (``expires_at``, wall-clock seconds) that the owner's
  heartbeat thread renews every third of the timeout. A registration, re-replication lock or
  auditor vote is live only while its session's lease is unexpired; anyone may purge expired
  sessions (with their rows). A heartbeat that finds its own
  lease expired (paused process, slow disk) treats the session as lost: listeners hear EXPIRED,
  a new session is created, registrations are re-created, listeners hear RECONNECTED;
- watches are polled by one thread per store (``PRAGMA data_version`` tells whether any other
  connection committed since the last poll; bookie lists are re-evaluated every poll because a
  lease can lapse without any write).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator
from pathlib import Path
from typing import Any

from vellum.errors import (
    IncorrectParameterError,
    LedgerExistsError,
    MetadataStoreUnavailableError,
    MetadataVersionError,
    MetaStoreError,
    NoSuchLedgerError,
)
from vellum.ids import BookieId, LedgerId
from vellum.meta import paths as P
from vellum.meta import underreplication as UR
from vellum.meta.api import (
    AuditorElection,
    BookiesWatcher,
    DelayWatcher,
    KeyValueStore,
    LayoutManager,
    LedgerIdGenerator,
    LedgerManager,
    LedgerRange,
    LedgerWatcher,
    MetadataStore,
    RegistrationManager,
    SessionEvent,
    SessionListener,
    UnderReplicatedLedger,
    UnderReplicationManager,
    Versioned,
    Watch,
)
from vellum.meta.dispatch import CallbackDispatcher
from vellum.meta.model import (
    LedgerLayout,
    LedgerMetadata,
    deserialize_ledger_metadata,
    serialize_ledger_metadata,
)
from vellum.meta.underreplication import Candidacy

log = logging.getLogger(__name__)

STORE_FORMAT_VERSION = 1
_PAGE = 1000

_SCHEMA = [
    "CREATE TABLE IF NOT EXISTS ledgers(ledger_id INTEGER PRIMARY KEY, version INTEGER NOT NULL, data BLOB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS system(key TEXT PRIMARY KEY, version INTEGER NOT NULL, value BLOB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS kv(key TEXT PRIMARY KEY, version INTEGER NOT NULL, value BLOB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS counters(name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS sessions(session_id INTEGER PRIMARY KEY AUTOINCREMENT, owner TEXT NOT NULL,"
    " pid INTEGER NOT NULL, timeout_s REAL NOT NULL, expires_at REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS registrations(bookie_id TEXT PRIMARY KEY, read_only INTEGER NOT NULL,"
    " session_id INTEGER NOT NULL, data BLOB NOT NULL)",
    "CREATE INDEX IF NOT EXISTS registrations_by_session ON registrations(session_id)",
]

# AutoRecovery's tables: created in stores made before them too (CREATE ... IF NOT EXISTS), so
# they need no format version of their own.
_UR_SCHEMA = [
    "CREATE TABLE IF NOT EXISTS ur_ledgers(ledger_id INTEGER PRIMARY KEY, version INTEGER NOT NULL, data BLOB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS ur_locks(ledger_id INTEGER PRIMARY KEY, session_id INTEGER NOT NULL, owner TEXT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS ur_locks_by_session ON ur_locks(session_id)",
    "CREATE TABLE IF NOT EXISTS auditor_votes(seq INTEGER PRIMARY KEY AUTOINCREMENT, session_id INTEGER NOT NULL,"
    " bookie_id TEXT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS auditor_votes_by_session ON auditor_votes(session_id)",
]


class _Db:
    """One SQLite connection with a lock, transactions and error translation."""

    def __init__(self, path: str, busy_timeout_s: float, synchronous: str) -> None:
        self.path = path
        try:
            self.conn = sqlite3.connect(
                path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
            )
            self.conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
            mode = self.conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise MetaStoreError(f"{path}: cannot switch the metadata store to WAL (got {mode})")
            self.conn.execute(f"PRAGMA synchronous={synchronous}")
        except sqlite3.DatabaseError as e:
            raise MetaStoreError(f"{path}: not a usable SQLite metadata store: {e}") from None
        self.lock = threading.RLock()

    @contextlib.contextmanager
    def txn(self, what: str) -> Iterator[sqlite3.Connection]:
        """A write transaction (BEGIN IMMEDIATE: take the write lock first, so CAS reads are current)."""
        with self.lock, self._translate(what):
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                yield self.conn
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
            try:
                self.conn.execute("COMMIT")
            except BaseException:
                # A COMMIT that fails (busy, I/O error) can leave the transaction open: roll it
                # back so that the caller's error means "nothing was written" (a retry cannot
                # duplicate a ledger) and the connection can start the next transaction.
                if self.conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        self.conn.execute("ROLLBACK")
                raise

    def query(self, what: str, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        with self.lock, self._translate(what):
            return self.conn.execute(sql, args).fetchall()

    @contextlib.contextmanager
    def _translate(self, what: str) -> Iterator[None]:
        try:
            yield
        except sqlite3.IntegrityError:
            raise  # callers turn a duplicate key into LedgerExistsError
        except sqlite3.OperationalError as e:
            if "locked" in str(e) or "busy" in str(e):
                raise MetadataStoreUnavailableError(f"{self.path}: busy while {what}: {e}") from None
            raise MetaStoreError(f"{self.path}: error while {what}: {e}") from None
        except sqlite3.DatabaseError as e:
            raise MetaStoreError(f"{self.path}: error while {what}: {e}") from None

    def close(self) -> None:
        with self.lock:
            self.conn.close()


class SqliteLedgerIdGenerator(LedgerIdGenerator):
    def __init__(self, db: _Db) -> None:
        self._db = db

    def generate_ledger_id(self) -> LedgerId:
        with self._db.txn("generating a ledger id") as c:
            return LedgerId(_next_id(c))


def _next_id(c: sqlite3.Connection) -> int:
    row = c.execute("UPDATE counters SET value = value + 1 WHERE name = 'ledger_id' RETURNING value").fetchone()
    if row is None:
        c.execute("INSERT INTO counters(name, value) VALUES('ledger_id', 0)")
        return 0
    return int(row[0])


class SqliteLedgerManager(LedgerManager):
    def __init__(self, db: _Db, poller: _Poller) -> None:
        self._db = db
        self._poller = poller

    def _where(self, ledger_id: int) -> str:
        return f"{self._db.path} ledgers[{ledger_id}]"

    def create_ledger(self, metadata: LedgerMetadata) -> tuple[LedgerId, int]:
        data = serialize_ledger_metadata(metadata)
        with self._db.txn("creating a ledger") as c:
            # id and row in one transaction: a crash cannot leave a half-created ledger
            while True:
                ledger_id = _next_id(c)
                if c.execute("SELECT 1 FROM ledgers WHERE ledger_id = ?", (ledger_id,)).fetchone() is None:
                    break
            c.execute("INSERT INTO ledgers(ledger_id, version, data) VALUES(?, 0, ?)", (ledger_id, data))
        return LedgerId(ledger_id), 0

    def create_ledger_with_id(self, ledger_id: LedgerId, metadata: LedgerMetadata) -> int:
        P._check_id(ledger_id)
        data = serialize_ledger_metadata(metadata)
        with self._db.txn(f"creating ledger {ledger_id}") as c:
            row = c.execute("SELECT data FROM ledgers WHERE ledger_id = ?", (ledger_id,)).fetchone()
            if row is None:
                c.execute("INSERT INTO ledgers(ledger_id, version, data) VALUES(?, 0, ?)", (ledger_id, data))
                return 0
            # The ZooKeeper driver's rule (BK#1967), kept here so that the drivers agree: a row
            # carrying the caller's creator token is the caller's own earlier create, retried
            # after an error; version 0 is what that create made.
            if metadata.creator_token and _creator_token(row[0], self._where(ledger_id)) == metadata.creator_token:
                return 0
        raise LedgerExistsError(f"ledger {ledger_id} already exists ({self._where(ledger_id)}, another creator)")

    def read_ledger(self, ledger_id: LedgerId) -> Versioned[LedgerMetadata]:
        rows = self._db.query(
            f"reading ledger {ledger_id}", "SELECT version, data FROM ledgers WHERE ledger_id = ?", (ledger_id,)
        )
        if not rows:
            raise NoSuchLedgerError(f"no ledger {ledger_id} ({self._where(ledger_id)})")
        version, data = rows[0]
        return Versioned(deserialize_ledger_metadata(data, where=self._where(ledger_id)), int(version))

    def write_ledger(self, ledger_id: LedgerId, metadata: LedgerMetadata, expected_version: int) -> int:
        data = serialize_ledger_metadata(metadata)
        with self._db.txn(f"writing ledger {ledger_id}") as c:
            row = c.execute("SELECT version FROM ledgers WHERE ledger_id = ?", (ledger_id,)).fetchone()
            if row is None:
                raise NoSuchLedgerError(f"no ledger {ledger_id} ({self._where(ledger_id)})")
            if int(row[0]) != expected_version:
                raise MetadataVersionError(
                    f"ledger {ledger_id} ({self._where(ledger_id)}) changed: expected version "
                    f"{expected_version}, the store has {row[0]}"
                )
            c.execute(
                "UPDATE ledgers SET version = version + 1, data = ? WHERE ledger_id = ?", (data, ledger_id)
            )
            return expected_version + 1

    def delete_ledger(self, ledger_id: LedgerId, expected_version: int | None = None) -> None:
        with self._db.txn(f"deleting ledger {ledger_id}") as c:
            row = c.execute("SELECT version FROM ledgers WHERE ledger_id = ?", (ledger_id,)).fetchone()
            if row is None:
                return
            if expected_version is not None and int(row[0]) != expected_version:
                raise MetadataVersionError(
                    f"ledger {ledger_id} ({self._where(ledger_id)}) changed: expected version "
                    f"{expected_version}, the store has {row[0]}"
                )
            c.execute("DELETE FROM ledgers WHERE ledger_id = ?", (ledger_id,))

    def ledger_exists(self, ledger_id: LedgerId) -> bool:
        return bool(self._db.query("checking a ledger", "SELECT 1 FROM ledgers WHERE ledger_id = ?", (ledger_id,)))

    def ledger_ranges(self, start_after: LedgerId | None = None) -> Iterator[LedgerRange]:
        # Keyset pagination on the primary key: memory stays at one page whatever the count.
        after = -1 if start_after is None else int(start_after)
        while True:
            rows = self._db.query(
                "listing ledgers",
                "SELECT ledger_id FROM ledgers WHERE ledger_id > ? ORDER BY ledger_id LIMIT ?",
                (after, _PAGE),
            )
            if not rows:
                return
            yield LedgerRange(tuple(LedgerId(int(r[0])) for r in rows))
            after = int(rows[-1][0])

    def watch_ledger(self, ledger_id: LedgerId, callback: LedgerWatcher) -> Watch:
        def probe(db: _Db) -> tuple[int, bytes] | None:
            rows = db.query("watching a ledger", "SELECT version, data FROM ledgers WHERE ledger_id = ?", (ledger_id,))
            return (int(rows[0][0]), bytes(rows[0][1])) if rows else None

        def fire(state: tuple[int, bytes] | None) -> None:
            if state is None:
                callback(ledger_id, None)
                return
            try:
                md = deserialize_ledger_metadata(state[1], where=self._where(ledger_id))
            except MetaStoreError:
                log.exception("watched ledger %s has unreadable metadata", ledger_id)
                return
            callback(ledger_id, Versioned(md, state[0]))

        return self._poller.add(probe, fire, key=lambda s: None if s is None else s[0], on_commit_only=True)


def _creator_token(data: bytes, where: str) -> int | None:
    try:
        return deserialize_ledger_metadata(data, where=where).creator_token
    except MetaStoreError:
        return None  # not Vellum metadata: certainly not the caller's


class _PolledWatch(Watch):
    def __init__(self, poller: _Poller, probe: Callable[[_Db], Any], fire: Callable[[Any], None],
                 key: Callable[[Any], Any], on_commit_only: bool) -> None:
        self.poller = poller
        self.probe = probe
        self.fire = fire
        self.key = key
        self.on_commit_only = on_commit_only
        self.last: Any = None

    def cancel(self) -> None:
        self.poller.remove(self)


class _Poller:
    """One thread per store that re-evaluates watches and fires callbacks on change."""

    def __init__(self, open_db: Callable[[], _Db], interval_s: float, dispatch: CallbackDispatcher) -> None:
        self._open_db = open_db
        self._interval_s = interval_s
        self._dispatch = dispatch
        self._watches: list[_PolledWatch] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._db: _Db | None = None
        self._thread: threading.Thread | None = None

    def add(self, probe: Callable[[_Db], Any], fire: Callable[[Any], None], *, key: Callable[[Any], Any],
            on_commit_only: bool) -> _PolledWatch:
        w = _PolledWatch(self, probe, fire, key, on_commit_only)
        with self._lock:
            if self._db is None:
                self._db = self._open_db()
            w.last = key(probe(self._db))
            self._watches.append(w)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="vellum-sqlite-watch", daemon=True)
                self._thread.start()
        return w

    def probe_now(self, probe: Callable[[_Db], Any]) -> Any:
        """``probe`` on the poller's connection (the state a watch just added starts from)."""
        with self._lock:
            assert self._db is not None
            return probe(self._db)

    def remove(self, w: _PolledWatch) -> None:
        with self._lock:
            if w in self._watches:
                self._watches.remove(w)

    def _run(self) -> None:
        data_version = None
        while not self._stop.wait(self._interval_s):
            try:
                with self._lock:
                    db = self._db
                    watches = list(self._watches)
                if db is None or not watches:
                    continue
                dv = db.query("polling", "PRAGMA data_version")[0][0]
                committed = dv != data_version
                data_version = dv
                for w in watches:
                    if w.on_commit_only and not committed:
                        continue
                    state = w.probe(db)
                    k = w.key(state)
                    if k != w.last:
                        w.last = k
                        self._dispatch.submit(self._firer(w, state))
            except Exception:
                log.exception("metadata watch poll failed; retrying")

    def _firer(self, w: _PolledWatch, state: Any) -> Callable[[], None]:
        def fire() -> None:
            if w in self._watches:  # not cancelled since the change was seen
                w.fire(state)

        return fire

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5 * self._interval_s + 5)
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None


class SqliteRegistrationManager(RegistrationManager):
    def __init__(self, store: SqliteMetadataStore) -> None:
        self._store = store
        self._db = store._db
        self._mine: dict[BookieId, tuple[bool, bytes]] = {}

    def register_bookie(self, bookie_id: BookieId, *, read_only: bool = False, data: bytes = b"") -> None:
        if not bookie_id or "/" in bookie_id:
            raise MetaStoreError(f"bad bookie id {bookie_id!r}")
        # A registration from a live other session (e.g. the same bookie restarted before its old
        # lease lapsed) blocks us until that lease ends, as a leftover ephemeral znode would. The
        # session lock is held per attempt, never across the waits: our own lease must go on
        # being renewed meanwhile.
        deadline = time.monotonic() + 2 * self._store.session_timeout_s + 1
        while True:
            with self._store._session_lock:
                self._mine[bookie_id] = (read_only, data)
                owner = self._insert(bookie_id, read_only, data)
            if owner is None:
                return
            if time.monotonic() > deadline:
                raise MetaStoreError(
                    f"bookie {bookie_id} is already registered in {self._db.path} by another live session {owner}"
                )
            time.sleep(0.2)

    def _insert(self, bookie_id: BookieId, read_only: bool, data: bytes) -> int | None:
        """Write the registration unless another live session holds it; returns that session."""
        sid = self._store._session
        with self._db.txn(f"registering bookie {bookie_id}") as c:
            now = time.time()
            row = c.execute(
                "SELECT r.session_id, s.expires_at FROM registrations r LEFT JOIN sessions s"
                " USING(session_id) WHERE r.bookie_id = ?",
                (bookie_id,),
            ).fetchone()
            if row is None or row[0] == sid or row[1] is None or row[1] < now:
                c.execute(
                    "INSERT OR REPLACE INTO registrations(bookie_id, read_only, session_id, data)"
                    " VALUES(?, ?, ?, ?)",
                    (bookie_id, int(read_only), sid, data),
                )
                return None
            return int(row[0])

    def reregister_all(self) -> None:
        for bookie_id, (read_only, data) in list(self._mine.items()):
            try:
                owner = self._insert(bookie_id, read_only, data)
            except Exception:
                log.exception("re-registering bookie %s failed", bookie_id)
                continue
            if owner is not None:
                log.error("re-registering bookie %s failed: another live session %s holds it in %s",
                          bookie_id, owner, self._db.path)

    def unregister_bookie(self, bookie_id: BookieId) -> None:
        with self._store._session_lock:
            self._mine.pop(bookie_id, None)
            with self._db.txn(f"unregistering bookie {bookie_id}") as c:
                c.execute(
                    "DELETE FROM registrations WHERE bookie_id = ? AND session_id = ?",
                    (bookie_id, self._store._session),
                )

    def list_bookies(self, *, read_only: bool = False) -> frozenset[BookieId]:
        return _live_bookies(self._db, read_only)

    def get_bookie_data(self, bookie_id: BookieId) -> bytes | None:
        rows = self._db.query(
            f"reading the registration of {bookie_id}",
            "SELECT r.data FROM registrations r JOIN sessions s USING(session_id)"
            " WHERE r.bookie_id = ? AND s.expires_at >= ?",
            (bookie_id, time.time()),
        )
        return bytes(rows[0][0] or b"") if rows else None

    def watch_bookies(self, callback: BookiesWatcher, *, read_only: bool = False) -> Watch:
        w = self._store._poller.add(
            lambda db: _live_bookies(db, read_only), callback, key=lambda s: s, on_commit_only=False
        )
        callback(w.last)
        return w

    def get_cookie(self, bookie_id: BookieId) -> Versioned[bytes] | None:
        return _sys_get(self._db, f"{P.COOKIES}/{bookie_id}")

    def put_cookie(self, bookie_id: BookieId, data: bytes, expected_version: int | None) -> int:
        return _put(self._db, "system", f"{P.COOKIES}/{bookie_id}", data, expected_version)

    def remove_cookie(self, bookie_id: BookieId, expected_version: int | None = None) -> None:
        _delete(self._db, "system", f"{P.COOKIES}/{bookie_id}", expected_version)

    def list_cookies(self) -> frozenset[BookieId]:
        prefix = f"{P.COOKIES}/"
        rows = self._db.query("listing cookies", "SELECT key FROM system WHERE substr(key, 1, ?) = ?",
                              (len(prefix), prefix))
        return frozenset(BookieId(r[0][len(prefix):]) for r in rows)

    def get_instance_id(self) -> str | None:
        v = _sys_get(self._db, P.INSTANCEID)
        return None if v is None else v.value.decode("ascii", "replace")


def _live_bookies(db: _Db, read_only: bool) -> frozenset[BookieId]:
    rows = db.query(
        "listing bookies",
        "SELECT r.bookie_id FROM registrations r JOIN sessions s USING(session_id)"
        " WHERE r.read_only = ? AND s.expires_at >= ?",
        (int(read_only), time.time()),
    )
    return frozenset(BookieId(r[0]) for r in rows)


def _sys_get(db: _Db, key: str, table: str = "system") -> Versioned[bytes] | None:
    rows = db.query(f"reading {table}[{key}]", f"SELECT version, value FROM {table} WHERE key = ?", (key,))
    return Versioned(bytes(rows[0][1]), int(rows[0][0])) if rows else None


def _put(db: _Db, table: str, key: str, value: bytes, expected_version: int | None) -> int:
    where = f"{db.path} {table}[{key}]"
    with db.txn(f"writing {table}[{key}]") as c:
        row = c.execute(f"SELECT version FROM {table} WHERE key = ?", (key,)).fetchone()
        if expected_version is None:
            if row is not None:
                raise MetadataVersionError(f"{where} already exists")
            c.execute(f"INSERT INTO {table}(key, version, value) VALUES(?, 0, ?)", (key, value))
            return 0
        if row is None or int(row[0]) != expected_version:
            raise MetadataVersionError(
                f"{where} is not at version {expected_version} (has {None if row is None else row[0]})"
            )
        c.execute(f"UPDATE {table} SET version = version + 1, value = ? WHERE key = ?", (value, key))
        return expected_version + 1


def _delete(db: _Db, table: str, key: str, expected_version: int | None) -> bool:
    with db.txn(f"deleting {table}[{key}]") as c:
        row = c.execute(f"SELECT version FROM {table} WHERE key = ?", (key,)).fetchone()
        if row is None:
            return False
        if expected_version is not None and int(row[0]) != expected_version:
            raise MetadataVersionError(
                f"{db.path} {table}[{key}] is not at version {expected_version} (has {row[0]})"
            )
        c.execute(f"DELETE FROM {table} WHERE key = ?", (key,))
        return True


class SqliteLayoutManager(LayoutManager):
    def __init__(self, db: _Db) -> None:
        self._db = db

    def read_layout(self) -> LedgerLayout | None:
        v = _sys_get(self._db, P.LAYOUT)
        return None if v is None else LedgerLayout.parse(v.value, where=f"{self._db.path} system[{P.LAYOUT}]")

    def store_layout(self, layout: LedgerLayout) -> None:
        _put(self._db, "system", P.LAYOUT, layout.serialize(), None)

    def delete_layout(self) -> None:
        _delete(self._db, "system", P.LAYOUT, None)


class SqliteKeyValueStore(KeyValueStore):
    def __init__(self, db: _Db) -> None:
        self._db = db

    def get(self, key: str) -> Versioned[bytes] | None:
        return _sys_get(self._db, P.validate_kv_key(key), "kv")

    def create(self, key: str, value: bytes) -> int:
        return _put(self._db, "kv", P.validate_kv_key(key), bytes(value), None)

    def cas(self, key: str, value: bytes, expected_version: int) -> int:
        return _put(self._db, "kv", P.validate_kv_key(key), bytes(value), expected_version)

    def delete(self, key: str, expected_version: int | None = None) -> bool:
        return _delete(self._db, "kv", P.validate_kv_key(key), expected_version)

    def list(self, prefix: str = "", *, start_after: str | None = None, limit: int | None = None) -> list[str]:
        lo = max(prefix, start_after) if start_after is not None else prefix
        op = ">" if start_after is not None and start_after >= prefix else ">="
        rows = self._db.query(
            "listing keys",
            f"SELECT key FROM kv WHERE key {op} ? AND substr(key, 1, ?) = ? ORDER BY key LIMIT ?",
            (lo, len(prefix), prefix, -1 if limit is None else limit),
        )
        return [r[0] for r in rows]


_UR_KEY = P.UNDERREPLICATION + "/"
_UR_CHANGES = "ur_changes"


def _leading_vote(db: _Db) -> tuple[int, str] | None:
    """The lowest vote whose session's lease is unexpired: the auditor."""
    rows = db.query(
        "reading the auditor election",
        "SELECT v.seq, v.bookie_id FROM auditor_votes v JOIN sessions s USING(session_id)"
        " WHERE s.expires_at >= ? ORDER BY v.seq LIMIT 1",
        (time.time(),),
    )
    return (int(rows[0][0]), str(rows[0][1])) if rows else None


def _bump_ur_changes(c: sqlite3.Connection) -> None:
    """Tell waiting replication workers that work may have become available."""
    c.execute(
        "INSERT INTO counters(name, value) VALUES(?, 1) ON CONFLICT(name) DO UPDATE SET value = value + 1",
        (_UR_CHANGES,),
    )


class _SqliteAuditorElection(Candidacy):
    """A row in ``auditor_votes`` owned by the store's session; the lowest live one leads.

    The store's poll thread re-reads the leading vote every poll interval (a lease can lapse
    without any write) and the change reaches ``evaluate`` on the dispatcher thread.
    """

    def __init__(
        self,
        manager: SqliteUnderReplicationManager,
        bookie_id: BookieId,
        on_leader: Callable[[], None] | None,
        on_lost: Callable[[], None] | None,
    ) -> None:
        super().__init__(bookie_id, manager.current_auditor, on_leader, on_lost, manager._store._dispatch.submit)
        self._manager = manager
        self._store = manager._store
        self._seq: int | None = None
        self._watch: _PolledWatch | None = None

    def start(self) -> None:
        self.vote()
        self._watch = self._store._poller.add(_leading_vote, self.evaluate, key=lambda s: s, on_commit_only=False)
        self.evaluate(self._watch.last)

    def vote(self) -> None:
        """A new vote under the store's current session (at the end of the line)."""
        with self._lock, self._store._session_lock:
            if self.state.closed:
                return
            with self._store._db.txn("voting for auditor") as c:
                cur = c.execute(
                    "INSERT INTO auditor_votes(session_id, bookie_id) VALUES(?, ?)",
                    (self._store._session, self._bookie_id),
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
            with self._store._db.txn("withdrawing an auditor vote") as c:
                c.execute("DELETE FROM auditor_votes WHERE seq = ?", (seq,))


class SqliteUnderReplicationManager(UnderReplicationManager):
    """AutoRecovery's records in ``ur_ledgers`` (data = BookKeeper's text record), locks in
    ``ur_locks`` and votes in ``auditor_votes`` (both owned by a session, live while its lease
    is), the switch, delay and timestamps as ``system`` rows under ``underreplication/``.

    Waiting polls: ``counters['ur_changes']`` grows with every change that may free work (a
    record marked, a lock released or purged, replication enabled); the switch is re-read.
    """

    def __init__(self, store: SqliteMetadataStore) -> None:
        self._store = store
        self._db = store._db
        self._poll_s = store._poll_interval_s
        self._lock = threading.Lock()
        self._held: dict[int, int] = {}  # ledger id -> record version when this session locked it
        self._elections: set[_SqliteAuditorElection] = set()
        self._seen = threading.local()
        self._closed = threading.Event()
        store.add_session_listener(self._on_session)

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
                              (_UR_CHANGES,))
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
        v = _sys_get(self._db, _UR_KEY + name)
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
            _bump_ur_changes(c)

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
                (after, _PAGE),
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
        with self._store._session_lock, self._db.txn("acquiring a ledger to re-replicate") as c:
            row = c.execute("SELECT value FROM counters WHERE name = ?", (_UR_CHANGES,)).fetchone()
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
                    (after, now, _PAGE),
                ).fetchall()
                for ledger_id, version in rows:
                    if ledger_id in excluded:
                        continue
                    # A lock row of a dead session may still be there: it is replaced.
                    c.execute(
                        "INSERT OR REPLACE INTO ur_locks(ledger_id, session_id, owner) VALUES(?, ?, ?)",
                        (ledger_id, self._store._session, owner),
                    )
                    with self._lock:
                        self._held[int(ledger_id)] = int(version)
                    return LedgerId(int(ledger_id))
                if len(rows) < _PAGE:
                    return None
                after = int(rows[-1][0])

    def wait_for_work(self, timeout_s: float) -> bool:
        seen = getattr(self._seen, "gen", None)
        if seen is None:
            return True
        return self._poll_until(lambda: self._changes() != seen, timeout_s)

    def _delete_own_lock(self, c: sqlite3.Connection, ledger_id: int) -> bool:
        return bool(c.execute(
            "DELETE FROM ur_locks WHERE ledger_id = ? AND session_id = ?", (ledger_id, self._store._session)
        ).rowcount)

    def release_ledger(self, ledger_id: LedgerId) -> None:
        with self._lock:
            self._held.pop(ledger_id, None)
        with self._store._session_lock, self._db.txn(f"releasing ledger {ledger_id}") as c:
            if self._delete_own_lock(c, ledger_id):
                _bump_ur_changes(c)

    def mark_replicated(self, ledger_id: LedgerId, expected_version: int | None = None) -> bool:
        with self._lock:
            version = self._held.get(ledger_id) if expected_version is None else expected_version
        with self._store._session_lock, self._db.txn(f"marking ledger {ledger_id} replicated") as c:
            row = c.execute("SELECT version FROM ur_ledgers WHERE ledger_id = ?", (ledger_id,)).fetchone()
            # A record marked again meanwhile (another bookie lost) stays for a new check.
            deleted = row is not None and (version is None or int(row[0]) == version)
            if deleted:
                c.execute("DELETE FROM ur_ledgers WHERE ledger_id = ?", (ledger_id,))
            if self._delete_own_lock(c, ledger_id) and not deleted:
                _bump_ur_changes(c)
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
                _bump_ur_changes(c)

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

        def probe(db: _Db) -> Versioned[bytes] | None:
            return _sys_get(db, _UR_KEY + name)

        # Keyed by version, not value: setting the same delay again fires too (ZooKeeper's data
        # watch does), which is how `triggeraudit` reaches the auditor.
        w = self._store._poller.add(probe, fire, key=lambda v: None if v is None else v.version,
                                    on_commit_only=True)
        fire(self._store._poller.probe_now(probe))
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
        election = _SqliteAuditorElection(self, bookie_id, on_leader, on_lost)
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


def secure_store_file(path: str) -> None:
    """Create the store file with mode 0600 if it does not exist (SQLite gives its -wal and -shm
    files the same mode); refuse one that group or others may write: whoever can write it can
    rewrite every ledger's metadata (ensembles, state, passwords) and the bookie cookies."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    except OSError as e:
        raise MetadataStoreUnavailableError(f"{path}: cannot create the metadata store: {e.strerror or e}") from None
    else:
        os.close(fd)
    for name in (path, path + "-wal", path + "-shm"):
        try:
            mode = os.stat(name).st_mode
        except FileNotFoundError:
            continue
        if mode & 0o022:
            raise MetaStoreError(
                f"{name} is writable by group or others (mode {mode & 0o777:04o}): anyone with those rights "
                f"could rewrite ledger metadata and cookies. Fix it with `chmod 600 {path} {path}-wal {path}-shm` "
                "(the files that exist) and start again"
            )


class SqliteMetadataStore(MetadataStore):
    """The embedded store on ``path``; one session (lease + heartbeat thread) per instance."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        ledger_manager_type: str | None = None,
        session_timeout_s: float = 10.0,
        poll_interval_s: float = 0.1,
        busy_timeout_s: float = 30.0,
        synchronous: str = "FULL",
        uri: str = "",
    ) -> None:
        self.path = str(path)
        self.uri = uri or f"sqlite://{Path(self.path).resolve()}"
        self.session_timeout_s = session_timeout_s
        self._wanted_type = ledger_manager_type
        self._busy_timeout_s = busy_timeout_s
        self._synchronous = synchronous.upper()
        if self._synchronous not in ("FULL", "NORMAL", "EXTRA"):
            raise MetaStoreError(f"synchronous={synchronous!r}: use FULL, EXTRA or NORMAL")
        parent = Path(self.path).parent
        if not parent.is_dir():
            raise MetadataStoreUnavailableError(f"{self.path}: directory {parent} does not exist")
        secure_store_file(self.path)
        self._db = self._open_db()
        self._check_and_create_schema()
        self._dispatch = CallbackDispatcher("vellum-sqlite-events")
        self._poll_interval_s = poll_interval_s
        self._poller = _Poller(self._open_db, poll_interval_s, self._dispatch)
        self._listeners: list[SessionListener] = []
        self._session_lock = threading.RLock()
        self._closed = False
        self._session = self._new_session()
        self._ledgers = SqliteLedgerManager(self._db, self._poller)
        self._idgen = SqliteLedgerIdGenerator(self._db)
        self._registration = SqliteRegistrationManager(self)
        self._layout = SqliteLayoutManager(self._db)
        self._kv = SqliteKeyValueStore(self._db)
        self._ur = SqliteUnderReplicationManager(self)
        self._stop = threading.Event()
        self._heartbeat_db = self._open_db()
        self._heartbeat = threading.Thread(target=self._heartbeat_loop, name="vellum-sqlite-lease", daemon=True)
        self._heartbeat.start()

    def _open_db(self) -> _Db:
        return _Db(self.path, self._busy_timeout_s, self._synchronous)

    def _check_and_create_schema(self) -> None:
        with self._db.txn("checking the schema") as c:
            tables = {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if tables and "vellum_meta" not in tables:
                raise MetaStoreError(
                    f"{self.path} is an SQLite database but not a Vellum metadata store "
                    f"(no vellum_meta table; tables: {', '.join(sorted(tables)[:8])})"
                )
            c.execute("CREATE TABLE IF NOT EXISTS vellum_meta(key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            row = c.execute("SELECT value FROM vellum_meta WHERE key = 'format_version'").fetchone()
            if row is not None:
                try:
                    version = int(row[0])
                except ValueError:
                    raise MetaStoreError(f"{self.path}: bad vellum_meta.format_version {row[0]!r}") from None
                if version > STORE_FORMAT_VERSION:
                    raise MetaStoreError(
                        f"{self.path}: metadata store format version {version} is newer than this Vellum "
                        f"understands (up to {STORE_FORMAT_VERSION}); upgrade Vellum"
                    )
                for stmt in _UR_SCHEMA:
                    c.execute(stmt)
                return
            for stmt in _SCHEMA + _UR_SCHEMA:
                c.execute(stmt)
            c.execute(
                "INSERT INTO vellum_meta(key, value) VALUES('format_version', ?), ('created_at', ?)",
                (str(STORE_FORMAT_VERSION), str(time.time())),
            )

    # -- sessions -------------------------------------------------------------------------

    def _new_session(self) -> int:
        with self._db.txn("opening a session") as c:
            cur = c.execute(
                "INSERT INTO sessions(owner, pid, timeout_s, expires_at) VALUES(?, ?, ?, ?)",
                (f"{os.uname().nodename}:{os.getpid()}", os.getpid(), self.session_timeout_s,
                 time.time() + self.session_timeout_s),
            )
            return int(cur.lastrowid or 0)

    @property
    def session_id(self) -> int:
        return self._session

    def _heartbeat_loop(self) -> None:
        interval = self.session_timeout_s / 3
        while not self._stop.wait(interval):
            try:
                self._beat()
            except Exception:
                log.exception("metadata session heartbeat failed; retrying")

    def _beat(self) -> None:
        db = self._heartbeat_db
        with self._session_lock:
            with db.txn("renewing the session lease") as c:
                now = time.time()
                renewed = c.execute(
                    "UPDATE sessions SET expires_at = ? WHERE session_id = ? AND expires_at >= ?",
                    (now + self.session_timeout_s, self._session, now),
                ).rowcount
                # Purge every expired session (ours included): their registrations, re-replication
                # locks and auditor votes go with them.
                expired = "SELECT session_id FROM sessions WHERE expires_at < ?"
                c.execute(f"DELETE FROM registrations WHERE session_id IN ({expired})", (now,))
                c.execute(f"DELETE FROM auditor_votes WHERE session_id IN ({expired})", (now,))
                if c.execute(f"DELETE FROM ur_locks WHERE session_id IN ({expired})", (now,)).rowcount:
                    _bump_ur_changes(c)
                c.execute("DELETE FROM sessions WHERE expires_at < ?", (now,))
            if renewed or self._closed:
                return
            log.warning("metadata session %s in %s expired; opening a new one", self._session, self.path)
            self._emit(SessionEvent.EXPIRED)
            self._session = self._new_session()
            self._registration.reregister_all()
        self._emit(SessionEvent.RECONNECTED)

    def _emit(self, event: SessionEvent) -> None:
        for fn in list(self._listeners):
            self._dispatch.submit(lambda fn=fn: fn(event))  # type: ignore[misc]

    def add_session_listener(self, listener: SessionListener) -> Callable[[], None]:
        self._listeners.append(listener)

        def remove() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return remove

    # -- managers -------------------------------------------------------------------------

    @property
    def ledgers(self) -> LedgerManager:
        layout = self._layout.read_layout()
        if layout is None:
            raise MetaStoreError(
                f"no ledger layout in {self.path} (system[{P.LAYOUT}]): the store is not formatted "
                f"(run `vellum shell metaformat --uri {self.uri}`)"
            )
        if self._wanted_type is not None and layout.manager_type != self._wanted_type:
            raise MetaStoreError(
                f"{self.uri} asks for the {self._wanted_type} ledger manager but the layout says {layout.manager_type}"
            )
        return self._ledgers

    @property
    def id_generator(self) -> LedgerIdGenerator:
        return self._idgen

    @property
    def registration(self) -> SqliteRegistrationManager:
        return self._registration

    @property
    def layout(self) -> LayoutManager:
        return self._layout

    @property
    def kv(self) -> KeyValueStore:
        return self._kv

    @property
    def underreplication(self) -> SqliteUnderReplicationManager:
        return self._ur

    def is_formatted(self) -> bool:
        return self._layout.read_layout() is not None

    def format(self, ledger_manager_type: str | None = None, *, force: bool = False) -> str:
        # The embedded store keeps ledgers in one table whatever the layout; the layout record
        # says which ZooKeeper layout a migration would use and keeps clusterinfo uniform.
        layout = LedgerLayout(ledger_manager_type or self._wanted_type or "hierarchical")
        instance_id = str(uuid.uuid4())
        with self._db.txn("formatting") as c:
            if force:
                for table in ("ledgers", "system", "kv", "counters", "ur_ledgers", "ur_locks"):
                    c.execute(f"DELETE FROM {table}")
                c.execute("DELETE FROM registrations WHERE session_id != ?", (self._session,))
            elif c.execute(
                "SELECT 1 FROM system WHERE key IN (?, ?)", (P.LAYOUT, P.INSTANCEID)
            ).fetchone():
                raise MetaStoreError(f"{self.path} is already formatted; use --force to wipe it")
            c.execute("INSERT INTO system(key, version, value) VALUES(?, 0, ?)", (P.LAYOUT, layout.serialize()))
            c.execute("INSERT INTO system(key, version, value) VALUES(?, 0, ?)", (P.INSTANCEID, instance_id.encode()))
        return instance_id

    def close(self) -> None:
        with self._session_lock:
            if self._closed:
                return
            self._closed = True
        self._ur.close()
        self._stop.set()
        self._heartbeat.join(self.session_timeout_s + 5)
        self._poller.close()
        try:
            # Like closing a ZooKeeper session: our registrations, locks and votes vanish at once.
            with self._db.txn("closing the session") as c:
                c.execute("DELETE FROM registrations WHERE session_id = ?", (self._session,))
                c.execute("DELETE FROM auditor_votes WHERE session_id = ?", (self._session,))
                if c.execute("DELETE FROM ur_locks WHERE session_id = ?", (self._session,)).rowcount:
                    _bump_ur_changes(c)
                c.execute("DELETE FROM sessions WHERE session_id = ?", (self._session,))
        except Exception:
            log.exception("could not remove session %s from %s", self._session, self.path)
        finally:
            self._dispatch.close()
            self._heartbeat_db.close()
            self._db.close()
