"""A bookie's registration in the metadata store, kept equal to the bookie's current state.

Responsibility: one ``BookieRegistration`` per bookie service registers the bookie writable or
read-only as the bookie *is*, and follows every later change (disks full or freed, the admin
switch, a new metadata session), on both metadata drivers.

Invariants:
- the registration never goes stale: the state is read *after* each registration is written
  and written again while it differs. A registration can wait a long time (a restarted bookie
  waits for its crashed predecessor's registration to lapse, up to two session timeouts); a
  state change during that wait is seen when the write returns, whatever thread changed it;
- the listener side (``state_changed``, ``session_restored``) never blocks: it is called from
  the storage threads and the loop; registration writes run on this object's own thread, one
  at a time (a lock orders them, so an older state can never overwrite a newer one);
- a failed write (store unreachable) is retried every ``retry_s`` until it succeeds or the
  registration is closed; after ``close()`` nothing is written.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from vellum.ids import BookieId
from vellum.meta.api import RegistrationManager

log = logging.getLogger(__name__)


class BookieRegistration:
    """Registers ``bookie_id`` as ``is_read_only()`` says, now and after every change."""

    def __init__(
        self,
        registration: RegistrationManager,
        bookie_id: BookieId,
        *,
        is_read_only: Callable[[], bool],
        data: bytes = b"",
        retry_s: float = 1.0,
    ) -> None:
        self._reg = registration
        self._bookie_id = bookie_id
        self._is_read_only = is_read_only
        self._data = data
        self._retry_s = retry_s
        self._lock = threading.Lock()  # one registration write at a time, in order
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._closed = False
        #: what the store holds for us (None: nothing registered yet, or unknown after a failure)
        self._registered: bool | None = None
        self._thread: threading.Thread | None = None

    @property
    def registered_read_only(self) -> bool | None:
        """The state last written (None before the first registration)."""
        return self._registered

    def register(self) -> None:
        """The first registration, in the calling thread (it may wait for a predecessor's
        registration to lapse; the store's error if it never does), then follow the state.
        Hook ``state_changed`` to the bookie *before* calling this: a change while the first
        write waits is then never lost."""
        self._sync(force=True)
        self._thread = threading.Thread(target=self._follow, name=f"registration-{self._bookie_id}", daemon=True)
        self._thread.start()

    def state_changed(self, _read_only: bool | None = None) -> None:
        """The bookie turned writable or read-only (any thread; never blocks). The argument is
        ignored: the state is read again when the registration is written."""
        self._wake.set()

    def session_restored(self) -> None:
        """A new metadata session: the store re-created the registration it last wrote; check
        it still matches the state (it changed while the session was gone, perhaps)."""
        self._wake.set()

    def close(self) -> None:
        """Stop following; waits for a write under way. Deregistering is the caller's step."""
        self._closed = True
        self._stop.set()
        self._wake.set()
        with self._lock:
            pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)

    # ------------------------------------------------------------------------------ internals
    def _follow(self) -> None:
        while not self._closed:
            self._wake.wait()
            if self._closed:
                return
            self._wake.clear()
            try:
                self._sync(force=False)
            except Exception:
                log.exception("registering %s as %s failed; retrying in %gs", self._bookie_id,
                              _kind(self._is_read_only()), self._retry_s)
                self._registered = None  # unknown: write it again
                self._wake.set()
                self._stop.wait(self._retry_s)

    def _sync(self, *, force: bool) -> None:
        """Write the current state until the store holds what the bookie is."""
        with self._lock:
            while not self._closed:
                read_only = self._is_read_only()
                if read_only == self._registered and not force:
                    return
                force = False
                # The drivers move a registration between writable and read-only themselves.
                self._reg.register_bookie(self._bookie_id, read_only=read_only, data=self._data)
                self._registered = read_only
                log.info("registered %s as %s", self._bookie_id, _kind(read_only))


def _kind(read_only: bool) -> str:
    return "read-only" if read_only else "writable"
