"""The network server metrics of a process (``bookkeeper_server_*``), read from every live
``BookieServer`` at scrape time.

A server counts requests, rejections, connections and the adds/reads in progress with plain
ints on the loop thread (its ``ServerCounters``), tracked here from ``start()`` to ``stop()``.
As for the bookie metrics (``bookie/metrics.py``), several servers in one process are exported
summed, with the labels of a single server: a one-bookie process exports exactly its own values.
"""

from __future__ import annotations

import collections

from prometheus_client import CollectorRegistry

from vellum import stats


class ServerCounters:
    """What one server counts (the loop thread only): requests received and rejected for
    overload by opcode name, requests answered with an error by opcode and status, connections refused or closed by reason (``server/guard.py``),
    open connections and how many of them are not authenticated yet, and the adds and reads in
    progress (also the server's admission state, bounded by its limits)."""

    __slots__ = ("adds", "connections", "errors", "reads", "refused", "rejected", "requests", "unauthenticated")

    def __init__(self) -> None:
        self.requests: collections.Counter[str] = collections.Counter()
        self.rejected: collections.Counter[str] = collections.Counter()
        self.refused: collections.Counter[str] = collections.Counter()
        #: requests answered with an error status, by (opcode name, status name)
        self.errors: collections.Counter[tuple[str, str]] = collections.Counter()
        self.connections = 0
        self.unauthenticated = 0
        self.adds = 0
        self.reads = 0


_METRICS: tuple[stats.SourceMetric[ServerCounters], ...] = (
    stats.SourceMetric("bookkeeper_server_REQUESTS", "requests received by opcode",
                       lambda c: {(op,): float(n) for op, n in c.requests.items()}, labels=("op",)),
    stats.SourceMetric("bookkeeper_server_REJECTED", "requests rejected for overload (TOOMANYREQUESTS)",
                       lambda c: {(op,): float(n) for op, n in c.rejected.items()}, labels=("op",)),
    stats.SourceMetric("bookkeeper_server_REQUEST_ERRORS", "requests answered with an error status, by opcode "
                       "and status (EINTERNAL: an unexpected failure of the bookie, logged with its traceback)",
                       lambda c: {key: float(n) for key, n in c.errors.items()}, labels=("op", "status")),
    stats.SourceMetric("bookkeeper_server_REFUSED", "connections refused or closed by the bookie, by reason "
                       "(unauthenticated budget, authentication or idle timeout, oversized frame before "
                       "authentication, plaintext before START_TLS, failed TLS handshake or AUTH, ...)",
                       lambda c: {(reason,): float(n) for reason, n in c.refused.items()}, labels=("reason",)),
    # BookKeeper's counters of overload rejections, spelled as its Prometheus provider does
    stats.SourceMetric("bookkeeper_server_ADD_ENTRY_REJECTED", "adds rejected for overload (BookKeeper's name; "
                       "also in bookkeeper_server_REJECTED)",
                       lambda c: {(): float(c.rejected["ADD"])}, kind="bk_counter"),
    stats.SourceMetric("bookkeeper_server_READ_ENTRY_REJECTED", "reads (single, batch, strided) rejected for "
                       "overload (BookKeeper's name; also in bookkeeper_server_REJECTED)",
                       lambda c: {(): float(sum(n for op, n in c.rejected.items() if "READ" in op))}, kind="bk_counter"),
    stats.SourceMetric("bookkeeper_server_CONNECTIONS", "open client connections",
                       lambda c: {(): float(c.connections)}, kind="gauge"),
    stats.SourceMetric("bookkeeper_server_UNAUTHENTICATED_CONNECTIONS",
                       "open connections not authenticated yet (bounded by unauthenticatedConnectionsLimit)",
                       lambda c: {(): float(c.unauthenticated)}, kind="gauge"),
    stats.SourceMetric("bookkeeper_server_ADD_ENTRY_IN_PROGRESS", "adds in progress",
                       lambda c: {(): float(c.adds)}, kind="gauge"),
    stats.SourceMetric("bookkeeper_server_READ_ENTRY_IN_PROGRESS", "reads in progress",
                       lambda c: {(): float(c.reads)}, kind="gauge"),
)


class ServerMetrics(stats.LiveSources[ServerCounters]):
    """Exports every tracked server's counters, summed."""

    def __init__(self, registry: CollectorRegistry = stats.REGISTRY) -> None:
        super().__init__(_METRICS, registry=registry)


#: The server metrics on ``stats.REGISTRY`` (what the admin HTTP server exports), made on first use.
process_server_metrics = stats.once_per_process(ServerMetrics)
