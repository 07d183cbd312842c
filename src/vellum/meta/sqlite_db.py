"""The embedded metadata store's SQLite plumbing, shared by its parts (``meta/sqlite.py`` and
``meta/sqlite_underreplication.py``): one connection with transactions and error translation
(``Db``), the poll thread behind every watch (``Poller``), versioned rows of the ``system`` and
``kv`` tables, and the change counter that waiting replication workers poll. The schema and its
invariants are described in ``meta/sqlite.py``."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
from collections.abc import Callable, Iterator
from typing import Any

from vellum.errors import MetadataStoreUnavailableError, MetadataVersionError, MetaStoreError
from vellum.meta.api import Versioned, Watch
from vellum.meta.dispatch import CallbackDispatcher

log = logging.getLogger(__name__)

#: rows per page of every paged listing
PAGE = 1000
#: ``counters[UR_CHANGES]`` grows with every change that may free re-replication work
UR_CHANGES = "ur_changes"


class Db:
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

class PolledWatch(Watch):
    def __init__(self, poller: Poller, probe: Callable[[Db], Any], fire: Callable[[Any], None],
                 key: Callable[[Any], Any], on_commit_only: bool) -> None:
        self.poller = poller
        self.probe = probe
        self.fire = fire
        self.key = key
        self.on_commit_only = on_commit_only
        self.last: Any = None

    def cancel(self) -> None:
        self.poller.remove(self)


class Poller:
    """One thread per store that re-evaluates watches and fires callbacks on change."""

    def __init__(self, open_db: Callable[[], Db], interval_s: float, dispatch: CallbackDispatcher) -> None:
        self._open_db = open_db
        self._interval_s = interval_s
        self._dispatch = dispatch
        self._watches: list[PolledWatch] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._db: Db | None = None
        self._thread: threading.Thread | None = None

    def add(self, probe: Callable[[Db], Any], fire: Callable[[Any], None], *, key: Callable[[Any], Any],
            on_commit_only: bool) -> PolledWatch:
        w = PolledWatch(self, probe, fire, key, on_commit_only)
        with self._lock:
            if self._db is None:
                self._db = self._open_db()
            w.last = key(probe(self._db))
            self._watches.append(w)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="vellum-sqlite-watch", daemon=True)
                self._thread.start()
        return w

    def probe_now(self, probe: Callable[[Db], Any]) -> Any:
        """``probe`` on the poller's connection (the state a watch just added starts from)."""
        with self._lock:
            assert self._db is not None
            return probe(self._db)

    def remove(self, w: PolledWatch) -> None:
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

    def _firer(self, w: PolledWatch, state: Any) -> Callable[[], None]:
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

def sys_get(db: Db, key: str, table: str = "system") -> Versioned[bytes] | None:
    rows = db.query(f"reading {table}[{key}]", f"SELECT version, value FROM {table} WHERE key = ?", (key,))
    return Versioned(bytes(rows[0][1]), int(rows[0][0])) if rows else None


def put_row(db: Db, table: str, key: str, value: bytes, expected_version: int | None) -> int:
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


def delete_row(db: Db, table: str, key: str, expected_version: int | None) -> bool:
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

def bump_ur_changes(c: sqlite3.Connection) -> None:
    """Tell waiting replication workers that work may have become available."""
    c.execute(
        "INSERT INTO counters(name, value) VALUES(?, 1) ON CONFLICT(name) DO UPDATE SET value = value + 1",
        (UR_CHANGES,),
    )

