"""The embedded store's session, as the store's parts see it.

``SqliteSession`` is one row of ``sessions`` with a lease that a heartbeat thread renews every
third of the timeout (``meta/sqlite.py`` states the invariants), plus what every part that owns
rows under the session needs: the store's connection, the lock under which the session id does
not change, watches on the store's poll thread, the ordered callback thread, session listeners.
The registration manager and the under-replication part (``meta/sqlite_underreplication.py``)
use only this interface, never the store's internals.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from vellum.meta.api import SessionEvent, SessionListener
from vellum.meta.dispatch import CallbackDispatcher
from vellum.meta.sqlite_db import Db, PolledWatch, Poller, bump_ur_changes

log = logging.getLogger(__name__)


class SqliteSession:
    """One store's session: lease, heartbeat, watches and listeners."""

    def __init__(self, db: Db, open_db: Callable[[], Db], *, timeout_s: float, poll_interval_s: float) -> None:
        #: the store's connection (every part shares it)
        self.db = db
        self.timeout_s = timeout_s
        self.poll_interval_s = poll_interval_s
        self._open_db = open_db
        self._dispatch = CallbackDispatcher("vellum-sqlite-events")
        self._poller = Poller(open_db, poll_interval_s, self._dispatch)
        self._listeners: list[SessionListener] = []
        #: held, the session id does not change (the heartbeat replaces an expired session under it)
        self.lock = threading.RLock()
        self._closed = False
        self._id = self._new_session()
        self._on_new_session: Callable[[], None] = lambda: None
        self._stop = threading.Event()
        self._heartbeat_db: Db | None = None
        self._heartbeat: threading.Thread | None = None

    @property
    def id(self) -> int:
        """The current session id (read it under ``lock`` when writing rows the session owns)."""
        return self._id

    def watch(self, probe: Callable[[Db], Any], fire: Callable[[Any], None], *, key: Callable[[Any], Any],
              on_commit_only: bool) -> PolledWatch:
        """``fire(state)`` on the callback thread whenever ``key(probe(db))`` changes (polled)."""
        return self._poller.add(probe, fire, key=key, on_commit_only=on_commit_only)

    def probe_now(self, probe: Callable[[Db], Any]) -> Any:
        """``probe`` on the poll thread's connection (the state a watch just added starts from)."""
        return self._poller.probe_now(probe)

    def submit(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the callback thread, in order with watch and session callbacks."""
        self._dispatch.submit(fn)

    def add_listener(self, listener: SessionListener) -> Callable[[], None]:
        self._listeners.append(listener)

        def remove() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return remove

    # -- lease ----------------------------------------------------------------------------

    def _new_session(self) -> int:
        with self.db.txn("opening a session") as c:
            cur = c.execute(
                "INSERT INTO sessions(owner, pid, timeout_s, expires_at) VALUES(?, ?, ?, ?)",
                (f"{os.uname().nodename}:{os.getpid()}", os.getpid(), self.timeout_s,
                 time.time() + self.timeout_s),
            )
            return int(cur.lastrowid or 0)

    def start(self, on_new_session: Callable[[], None]) -> None:
        """Start the heartbeat; ``on_new_session`` runs (under ``lock``) after an expired session
        was replaced, before listeners hear RECONNECTED."""
        self._on_new_session = on_new_session
        self._heartbeat_db = self._open_db()
        self._heartbeat = threading.Thread(target=self._heartbeat_loop, name="vellum-sqlite-lease", daemon=True)
        self._heartbeat.start()

    def _heartbeat_loop(self) -> None:
        interval = self.timeout_s / 3
        while not self._stop.wait(interval):
            try:
                self._beat()
            except Exception:
                log.exception("metadata session heartbeat failed; retrying")

    def _beat(self) -> None:
        db = self._heartbeat_db
        assert db is not None
        with self.lock:
            with db.txn("renewing the session lease") as c:
                now = time.time()
                renewed = c.execute(
                    "UPDATE sessions SET expires_at = ? WHERE session_id = ? AND expires_at >= ?",
                    (now + self.timeout_s, self._id, now),
                ).rowcount
                # Purge every expired session (ours included): their registrations, re-replication
                # locks and auditor votes go with them.
                expired = "SELECT session_id FROM sessions WHERE expires_at < ?"
                c.execute(f"DELETE FROM registrations WHERE session_id IN ({expired})", (now,))
                c.execute(f"DELETE FROM auditor_votes WHERE session_id IN ({expired})", (now,))
                if c.execute(f"DELETE FROM ur_locks WHERE session_id IN ({expired})", (now,)).rowcount:
                    bump_ur_changes(c)
                c.execute("DELETE FROM sessions WHERE expires_at < ?", (now,))
            if renewed or self._closed:
                return
            log.warning("metadata session %s in %s expired; opening a new one", self._id, self.db.path)
            self._emit(SessionEvent.EXPIRED)
            self._id = self._new_session()
            self._on_new_session()
        self._emit(SessionEvent.RECONNECTED)

    def _emit(self, event: SessionEvent) -> None:
        for fn in list(self._listeners):
            self._dispatch.submit(lambda fn=fn: fn(event))  # type: ignore[misc]

    # -- end ------------------------------------------------------------------------------

    def mark_closed(self) -> bool:
        """Mark the session closing (the heartbeat then never replaces it); False if it already was."""
        with self.lock:
            if self._closed:
                return False
            self._closed = True
            return True

    def close(self) -> None:
        """Stop the heartbeat and the watches, then end the session: like closing a ZooKeeper
        session, its registrations, locks and votes vanish at once."""
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join(self.timeout_s + 5)
        self._poller.close()
        try:
            with self.db.txn("closing the session") as c:
                c.execute("DELETE FROM registrations WHERE session_id = ?", (self._id,))
                c.execute("DELETE FROM auditor_votes WHERE session_id = ?", (self._id,))
                if c.execute("DELETE FROM ur_locks WHERE session_id = ?", (self._id,)).rowcount:
                    bump_ur_changes(c)
                c.execute("DELETE FROM sessions WHERE session_id = ?", (self._id,))
        except Exception:
            log.exception("could not remove session %s from %s", self._id, self.db.path)
        finally:
            self._dispatch.close()
            if self._heartbeat_db is not None:
                self._heartbeat_db.close()
