"""What a bookie spends on peers it does not trust yet, and on idle ones: bounded, and every
refusal counted and logged without flooding the log.

``ConnectionGuard`` (one per ``BookieServer``, loop thread only) keeps:
- the unauthenticated connections, oldest first: accepted, not yet through START_TLS (when TLS
  is required) and AUTH (when authentication is on). At most ``max_unauthenticated`` of them:
  a new one past the budget closes the oldest (which has had the most time to authenticate),
  so a flood of silent connections never keeps a real client out and never holds more than the
  budget in descriptors. Each is closed at ``authentication_timeout_s`` after its accept;
- with ``idle_timeout_s`` (off by default), authenticated connections that received nothing,
  sent nothing and had no request in progress for that long are closed (a long-poll LAC read
  waiting on the bookie is a request in progress);
- a probe of the descriptor limit at each sweep: when the process cannot open one more
  descriptor, accepting connections is failing (uvloop drops them silently), and that is logged.

``RefusalLog`` counts every refusal by reason (``bookkeeper_server_REFUSED``) and logs the
first one per (reason, peer address, detail) per ``period_s`` (the detail tells different
failures apart, e.g. an expired token from a bad signature); the refusals it held back are
reported as a count with the next line, or by the sweep once the period is over.

Invariants: the guard never reads or writes a connection's data; it only closes connections
through their ``close_for`` (which logs through the ``RefusalLog``). The sweep is one task,
started and stopped with the server; each sweep does work proportional to the connections it
closes plus, only with an idle timeout, one check per authenticated connection.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import logging
import os
import resource
from dataclasses import dataclass
from typing import Protocol

from vellum.server.metrics import ServerCounters

log = logging.getLogger("vellum.server.bookie_server")

#: refusal reasons (the ``reason`` label of ``bookkeeper_server_REFUSED``)
FRAME_TOO_BIG = "frame_too_big_before_auth"
UNAUTHENTICATED_BUDGET = "unauthenticated_budget"
AUTHENTICATION_TIMEOUT = "authentication_timeout"
IDLE_TIMEOUT = "idle_timeout"
PLAINTEXT = "plaintext_before_tls"
TLS_HANDSHAKE = "tls_handshake_failed"
AUTH_REFUSED = "auth_refused"
REQUEST_BEFORE_AUTH = "request_before_auth"
BAD_FRAMING = "bad_framing"
#: not a close: a well-framed request that could not be decoded, answered with an error
BAD_FRAME = "bad_frame"
#: not a close: START_TLS to a bookie without TLS, answered EBADREQ
START_TLS_UNAVAILABLE = "start_tls_unavailable"
DESCRIPTORS = "descriptors_exhausted"


class Guarded(Protocol):
    """What the guard needs of a connection."""

    def peer_host(self) -> str: ...

    def is_busy(self) -> bool: ...

    def take_activity(self) -> bool: ...

    def close_for(self, reason: str, message: str, detail: str = "") -> None: ...


@dataclass(frozen=True)
class PeerLimits:
    """Limits on unauthenticated and idle connections (``docs/operations.md``)."""

    #: the largest frame accepted before a connection is authenticated (an AUTH with the
    #: largest token fits)
    unauthenticated_max_frame_size: int = 16384
    #: unauthenticated connections per bookie; past it the oldest is closed (0 = no bound)
    max_unauthenticated: int = 500
    #: seconds from accept to authenticated (and upgraded to TLS when required); 0 = no deadline
    authentication_timeout_s: float = 10.0
    #: seconds an authenticated connection may stay idle; 0 = forever
    idle_timeout_s: float = 0.0
    #: a refusal reason is logged once per peer address per this many seconds, with a count
    refusal_log_period_s: float = 60.0


class RefusalLog:
    """Counts refusals by reason and logs them rate-limited per (reason, peer address)."""

    #: distinct (reason, address) pairs remembered; past it addresses are no longer told apart
    MAX_KEYS = 1024

    def __init__(self, period_s: float, counts: collections.Counter[str]) -> None:
        self._period_s = period_s
        self._counts = counts  # the server's REFUSED counter (by reason)
        # (reason, address, detail) -> [time of the last line, refusals not logged since]
        self._last: dict[tuple[str, str, str], list[float]] = {}
        self._loop = asyncio.get_running_loop()

    def refused(self, reason: str, host: str, message: str, detail: str = "") -> None:
        """Count a refusal; log ``message`` unless this (reason, host, detail) was logged
        less than a period ago."""
        self._counts[reason] += 1
        now = self._loop.time()
        key = (reason, host, detail)
        entry = self._last.get(key)
        if entry is None and len(self._last) >= self.MAX_KEYS:
            self.flush(now)
            if len(self._last) >= self.MAX_KEYS:
                key = (reason, "(many addresses)", "")
                entry = self._last.get(key)
        if entry is not None and now - entry[0] < self._period_s:
            entry[1] += 1
            return
        held = int(entry[1]) if entry is not None else 0
        self._last[key] = [now, 0]
        log.warning("%s%s", message, f" ({held} more {reason} refusals from {key[1]} not logged in the last "
                                     f"{now - entry[0]:.0f}s)" if held and entry is not None else "",
                    extra={"peer": host})

    def flush(self, now: float) -> None:
        """Report the refusals held back in periods that are over, and forget quiet peers."""
        for key, entry in list(self._last.items()):
            if now - entry[0] < self._period_s:
                continue
            if entry[1]:
                log.warning("%d more %s refusals from %s not logged in the last %.0fs",
                            int(entry[1]), key[0], key[1], now - entry[0])
                self._last[key] = [now, 0]
            else:
                del self._last[key]


class ConnectionGuard:
    """The budget and the deadlines of a server's connections (see the module docstring)."""

    def __init__(self, limits: PeerLimits, refusals: RefusalLog, *, counters: ServerCounters) -> None:
        self.limits = limits
        self.refusals = refusals
        self._counters = counters  # its ``unauthenticated`` gauge is kept here
        self._loop = asyncio.get_running_loop()
        # unauthenticated connection -> accept time, oldest first (dicts keep insertion order)
        self._unauthenticated: dict[Guarded, float] = {}
        # authenticated connection -> last time it was seen active (only with an idle timeout)
        self._authenticated: dict[Guarded, float] = {}
        self._listening_fd: int | None = None
        self._sweeper: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------------- lifecycle
    def start(self, listening_fd: int | None) -> None:
        self._listening_fd = listening_fd
        self._sweeper = self._loop.create_task(self._sweep_forever())

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            try:
                await self._sweeper
            except asyncio.CancelledError:
                pass
            self._sweeper = None

    @property
    def unauthenticated(self) -> int:
        return len(self._unauthenticated)

    # ----------------------------------------------------------------- connection events
    def accepted(self, conn: Guarded, *, authenticated: bool) -> None:
        """A new connection; an unauthenticated one past the budget closes the oldest."""
        if authenticated:
            self.authenticated(conn)
            return
        budget = self.limits.max_unauthenticated
        if budget and len(self._unauthenticated) >= budget:
            oldest = next(iter(self._unauthenticated))
            del self._unauthenticated[oldest]
            oldest.close_for(UNAUTHENTICATED_BUDGET, (
                f"closing unauthenticated connection {oldest.peer_host()}: {budget} unauthenticated connections "
                f"are open (unauthenticatedConnectionsLimit), the oldest makes room for a new one"))
        self._unauthenticated[conn] = self._loop.time()
        self._counters.unauthenticated = len(self._unauthenticated)

    def authenticated(self, conn: Guarded) -> None:
        self._unauthenticated.pop(conn, None)
        self._counters.unauthenticated = len(self._unauthenticated)
        if self.limits.idle_timeout_s > 0:
            self._authenticated[conn] = self._loop.time()

    def closed(self, conn: Guarded) -> None:
        self._unauthenticated.pop(conn, None)
        self._counters.unauthenticated = len(self._unauthenticated)
        self._authenticated.pop(conn, None)

    # ----------------------------------------------------------------------------- sweep
    def _interval(self) -> float:
        timeouts = [t for t in (self.limits.authentication_timeout_s, self.limits.idle_timeout_s) if t > 0]
        return min([1.0] + [t / 4 for t in timeouts]) if timeouts else 1.0

    async def _sweep_forever(self) -> None:
        interval = max(0.05, self._interval())
        while True:
            await asyncio.sleep(interval)
            try:
                self.sweep(self._loop.time())
            except Exception:  # a bug here must not end the deadlines
                log.exception("connection sweep failed")

    def sweep(self, now: float) -> None:
        timeout = self.limits.authentication_timeout_s
        if timeout > 0:
            expired = []
            for conn, accepted_at in self._unauthenticated.items():  # oldest first
                if now - accepted_at < timeout:
                    break
                expired.append(conn)
            for conn in expired:
                del self._unauthenticated[conn]
                self._counters.unauthenticated = len(self._unauthenticated)
                conn.close_for(AUTHENTICATION_TIMEOUT, (
                    f"closing connection {conn.peer_host()}: not authenticated within {timeout:g}s "
                    f"(authenticationTimeoutMs)"))
        idle = self.limits.idle_timeout_s
        if idle > 0:
            for conn, seen in list(self._authenticated.items()):
                if conn.take_activity() or conn.is_busy():
                    self._authenticated[conn] = now
                elif now - seen >= idle:
                    del self._authenticated[conn]
                    conn.close_for(IDLE_TIMEOUT, (
                        f"closing connection {conn.peer_host()}: idle for {idle:g}s (connectionIdleTimeoutMs)"))
        self.refusals.flush(now)
        self._probe_descriptors()

    def _probe_descriptors(self) -> None:
        """Log when the process is out of descriptors: accept() is failing then."""
        if self._listening_fd is None:
            return
        try:
            os.close(os.dup(self._listening_fd))
        except OSError as e:
            if e.errno in (errno.EMFILE, errno.ENFILE):
                soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
                self.refusals.refused(DESCRIPTORS, "-", (
                    f"out of file descriptors ({os.strerror(e.errno)}, RLIMIT_NOFILE {soft}): new connections are "
                    f"being refused; {len(self._unauthenticated)} unauthenticated connections are open "
                    f"(unauthenticatedConnectionsLimit={self.limits.max_unauthenticated}); raise the limit "
                    f"(ulimit -n) or lower unauthenticatedConnectionsLimit"))
