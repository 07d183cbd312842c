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
- the session (lease, heartbeat, watches, listeners) is ``meta/sqlite_session.py``; the parts that
  own rows under it (registrations here, AutoRecovery's locks and votes in
  ``meta/sqlite_underreplication.py``) use its interface only; the SQLite plumbing is
  ``meta/sqlite_db.py``;
- watches are polled by one thread per store (``PRAGMA data_version`` tells whether any other
  connection committed since the last poll; bookie lists are re-evaluated every poll because a
  lease can lapse without any write).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from vellum.errors import (
    LedgerExistsError,
    MetadataStoreUnavailableError,
    MetadataVersionError,
    MetaStoreError,
    NoSuchLedgerError,
)
from vellum.ids import BookieId, LedgerId
from vellum.meta import paths as P
from vellum.meta.api import (
    BookiesWatcher,
    KeyValueStore,
    LayoutManager,
    LedgerIdGenerator,
    LedgerManager,
    LedgerRange,
    LedgerWatcher,
    MetadataStore,
    RegistrationManager,
    SessionListener,
    Versioned,
    Watch,
)
from vellum.meta.model import (
    LedgerLayout,
    LedgerMetadata,
    deserialize_ledger_metadata,
    serialize_ledger_metadata,
)
from vellum.meta.sqlite_db import PAGE, Db, delete_row, put_row, sys_get
from vellum.meta.sqlite_session import SqliteSession
from vellum.meta.sqlite_underreplication import SqliteUnderReplicationManager

log = logging.getLogger(__name__)

STORE_FORMAT_VERSION = 1

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


class SqliteLedgerIdGenerator(LedgerIdGenerator):
    def __init__(self, db: Db) -> None:
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
    def __init__(self, session: SqliteSession) -> None:
        self._db = session.db
        self._session = session

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
                (after, PAGE),
            )
            if not rows:
                return
            yield LedgerRange(tuple(LedgerId(int(r[0])) for r in rows))
            after = int(rows[-1][0])

    def watch_ledger(self, ledger_id: LedgerId, callback: LedgerWatcher) -> Watch:
        def probe(db: Db) -> tuple[int, bytes] | None:
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

        return self._session.watch(probe, fire, key=lambda s: None if s is None else s[0], on_commit_only=True)


def _creator_token(data: bytes, where: str) -> int | None:
    try:
        return deserialize_ledger_metadata(data, where=where).creator_token
    except MetaStoreError:
        return None  # not Vellum metadata: certainly not the caller's



class SqliteRegistrationManager(RegistrationManager):
    def __init__(self, session: SqliteSession) -> None:
        self._session = session
        self._db = session.db
        self._mine: dict[BookieId, tuple[bool, bytes]] = {}

    def register_bookie(self, bookie_id: BookieId, *, read_only: bool = False, data: bytes = b"") -> None:
        if not bookie_id or "/" in bookie_id:
            raise MetaStoreError(f"bad bookie id {bookie_id!r}")
        # A registration from a live other session (e.g. the same bookie restarted before its old
        # lease lapsed) blocks us until that lease ends, as a leftover ephemeral znode would. The
        # session lock is held per attempt, never across the waits: our own lease must go on
        # being renewed meanwhile.
        deadline = time.monotonic() + 2 * self._session.timeout_s + 1
        while True:
            with self._session.lock:
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
        sid = self._session.id
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
        with self._session.lock:
            self._mine.pop(bookie_id, None)
            with self._db.txn(f"unregistering bookie {bookie_id}") as c:
                c.execute(
                    "DELETE FROM registrations WHERE bookie_id = ? AND session_id = ?",
                    (bookie_id, self._session.id),
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
        w = self._session.watch(
            lambda db: _live_bookies(db, read_only), callback, key=lambda s: s, on_commit_only=False
        )
        callback(w.last)
        return w

    def get_cookie(self, bookie_id: BookieId) -> Versioned[bytes] | None:
        return sys_get(self._db, f"{P.COOKIES}/{bookie_id}")

    def put_cookie(self, bookie_id: BookieId, data: bytes, expected_version: int | None) -> int:
        return put_row(self._db, "system", f"{P.COOKIES}/{bookie_id}", data, expected_version)

    def remove_cookie(self, bookie_id: BookieId, expected_version: int | None = None) -> None:
        delete_row(self._db, "system", f"{P.COOKIES}/{bookie_id}", expected_version)

    def list_cookies(self) -> frozenset[BookieId]:
        prefix = f"{P.COOKIES}/"
        rows = self._db.query("listing cookies", "SELECT key FROM system WHERE substr(key, 1, ?) = ?",
                              (len(prefix), prefix))
        return frozenset(BookieId(r[0][len(prefix):]) for r in rows)

    def get_instance_id(self) -> str | None:
        v = sys_get(self._db, P.INSTANCEID)
        return None if v is None else v.value.decode("ascii", "replace")


def _live_bookies(db: Db, read_only: bool) -> frozenset[BookieId]:
    rows = db.query(
        "listing bookies",
        "SELECT r.bookie_id FROM registrations r JOIN sessions s USING(session_id)"
        " WHERE r.read_only = ? AND s.expires_at >= ?",
        (int(read_only), time.time()),
    )
    return frozenset(BookieId(r[0]) for r in rows)



class SqliteLayoutManager(LayoutManager):
    def __init__(self, db: Db) -> None:
        self._db = db

    def read_layout(self) -> LedgerLayout | None:
        v = sys_get(self._db, P.LAYOUT)
        return None if v is None else LedgerLayout.parse(v.value, where=f"{self._db.path} system[{P.LAYOUT}]")

    def store_layout(self, layout: LedgerLayout) -> None:
        put_row(self._db, "system", P.LAYOUT, layout.serialize(), None)

    def delete_layout(self) -> None:
        delete_row(self._db, "system", P.LAYOUT, None)


class SqliteKeyValueStore(KeyValueStore):
    def __init__(self, db: Db) -> None:
        self._db = db

    def get(self, key: str) -> Versioned[bytes] | None:
        return sys_get(self._db, P.validate_kv_key(key), "kv")

    def create(self, key: str, value: bytes) -> int:
        return put_row(self._db, "kv", P.validate_kv_key(key), bytes(value), None)

    def cas(self, key: str, value: bytes, expected_version: int) -> int:
        return put_row(self._db, "kv", P.validate_kv_key(key), bytes(value), expected_version)

    def delete(self, key: str, expected_version: int | None = None) -> bool:
        return delete_row(self._db, "kv", P.validate_kv_key(key), expected_version)

    def list(self, prefix: str = "", *, start_after: str | None = None, limit: int | None = None) -> list[str]:
        lo = max(prefix, start_after) if start_after is not None else prefix
        op = ">" if start_after is not None and start_after >= prefix else ">="
        rows = self._db.query(
            "listing keys",
            f"SELECT key FROM kv WHERE key {op} ? AND substr(key, 1, ?) = ? ORDER BY key LIMIT ?",
            (lo, len(prefix), prefix, -1 if limit is None else limit),
        )
        return [r[0] for r in rows]



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
        self._session = SqliteSession(self._db, self._open_db, timeout_s=session_timeout_s,
                                      poll_interval_s=poll_interval_s)
        self._ledgers = SqliteLedgerManager(self._session)
        self._idgen = SqliteLedgerIdGenerator(self._db)
        self._registration = SqliteRegistrationManager(self._session)
        self._layout = SqliteLayoutManager(self._db)
        self._kv = SqliteKeyValueStore(self._db)
        self._ur = SqliteUnderReplicationManager(self._session)
        self._session.start(on_new_session=self._registration.reregister_all)

    def _open_db(self) -> Db:
        return Db(self.path, self._busy_timeout_s, self._synchronous)

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

    @property
    def session_id(self) -> int:
        return self._session.id

    def add_session_listener(self, listener: SessionListener) -> Callable[[], None]:
        return self._session.add_listener(listener)

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
                c.execute("DELETE FROM registrations WHERE session_id != ?", (self._session.id,))
            elif c.execute(
                "SELECT 1 FROM system WHERE key IN (?, ?)", (P.LAYOUT, P.INSTANCEID)
            ).fetchone():
                raise MetaStoreError(f"{self.path} is already formatted; use --force to wipe it")
            c.execute("INSERT INTO system(key, version, value) VALUES(?, 0, ?)", (P.LAYOUT, layout.serialize()))
            c.execute("INSERT INTO system(key, version, value) VALUES(?, 0, ?)", (P.INSTANCEID, instance_id.encode()))
        return instance_id

    def close(self) -> None:
        if not self._session.mark_closed():
            return
        self._ur.close()
        try:
            self._session.close()
        finally:
            self._db.close()
