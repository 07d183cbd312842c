"""The metrics port: BookKeeper's ``prometheusStatsHttpPort`` listener, serving ``GET /metrics``
(Prometheus text of a registry, by default ``stats.REGISTRY``, the same one the admin HTTP
``/metrics`` exports) on the bookie's event loop.

Invariants: this listener serves the metrics and nothing else (any other path is 404, any
other method 405), so it may listen on every interface (BookKeeper's default 0.0.0.0) without
exposing the admin API; the metrics carry counts, states and directory names, never a
credential. A request head must arrive within ``header_read_timeout_s`` (idle and half-sent
connections are closed). A port that cannot be bound fails ``start()``: a configured metrics
port is never dropped silently.
"""

from __future__ import annotations

import logging

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from vellum import stats

log = logging.getLogger(__name__)


class MetricsHttpServer:
    """``GET /metrics`` on ``host:port`` (0 = any free port; ``port`` tells the bound one)."""

    def __init__(self, host: str, port: int, *, registry: CollectorRegistry = stats.REGISTRY,
                 header_read_timeout_s: float = 10.0) -> None:
        self._host = host
        self._port = port
        self._registry = registry
        self._header_read_timeout_s = header_read_timeout_s
        self._runner: web.AppRunner | None = None
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        self._app = app

    @property
    def port(self) -> int:
        return self._port

    async def _metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self._registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def start(self) -> None:
        self._runner = web.AppRunner(self._app, access_log=None, keepalive_timeout=self._header_read_timeout_s)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host or None, self._port, reuse_address=True)
        try:
            await site.start()
        except OSError as e:
            await self._runner.cleanup()
            self._runner = None
            raise OSError(e.errno, f"cannot listen on the metrics port {self._host}:{self._port} "
                                   f"(prometheusStatsHttpAddress, prometheusStatsHttpPort): {e.strerror}; choose "
                                   "another port, 0 for any free one, or prometheusStatsHttpEnable=false") from e
        server = site._server  # the bound socket tells the real port when 0 was asked
        sockets = getattr(server, "sockets", None)
        if sockets:
            self._port = sockets[0].getsockname()[1]
        log.info("metrics served at http://%s:%d/metrics", self._host, self._port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
