"""Running the console: ``ConsoleServer`` on the current event loop (tests, benchmarks),
``ConsoleThread`` on a loop of its own (``vellum standalone``, which supervises processes from
a plain thread), ``run_console`` for ``vellum console`` (until SIGTERM or Ctrl-C).

The admin token is read from a file (``--admin-token-file``), never taken on the command line
where ``ps`` would show it; an empty or unreadable file is an error at start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from pathlib import Path

from aiohttp import web

from vellum.console.app import build_app
from vellum.console.cluster import ClusterConsole, ConsoleSettings
from vellum.errors import ConfigError

log = logging.getLogger(__name__)

DEFAULT_PORT = 8090


def read_admin_token(path: str | Path | None) -> str | None:
    if not path:
        return None
    try:
        token = Path(path).read_text().strip()
    except OSError as e:
        raise ConfigError(f"cannot read the admin token file {path}: {e.strerror or e}") from None
    if not token:
        raise ConfigError(f"the admin token file {path} is empty")
    return token


class ConsoleServer:
    """The console on ``host:port`` of the running loop; ``port=0`` picks a free one."""

    def __init__(self, settings: ConsoleSettings, *, host: str = "127.0.0.1", port: int = DEFAULT_PORT) -> None:
        self.console = ClusterConsole(settings)
        self._host = host
        self._port = port
        self._runner: web.AppRunner | None = None

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self._port}"

    async def start(self) -> None:
        # The port first: a console that cannot listen starts nothing (no sampler, no session)
        # and leaves nothing to clean up behind the error.
        self._runner = web.AppRunner(build_app(self.console), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port, reuse_address=True)
        try:
            await site.start()
        except BaseException:
            await self._runner.cleanup()
            self._runner = None
            raise
        await self.console.start()
        sockets = getattr(site._server, "sockets", None)
        if sockets:
            self._port = sockets[0].getsockname()[1]
        log.info("console on %s (metadata %s, %s)", self.url, self.console.settings.metadata_uri,
                 "read-only" if self.console.read_only else "admin actions enabled")

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.console.close()


class ConsoleThread:
    """A ``ConsoleServer`` on its own event loop thread."""

    def __init__(self, settings: ConsoleSettings, *, host: str = "127.0.0.1", port: int = DEFAULT_PORT) -> None:
        self.server = ConsoleServer(settings, host=host, port=port)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vellum-console", daemon=True)

    @property
    def url(self) -> str:
        return self.server.url

    def start(self, timeout_s: float = 30.0) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self._loop).result(timeout_s)

    def stop(self, timeout_s: float = 10.0) -> None:
        if not self._thread.is_alive():
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self.server.stop(), self._loop).result(timeout_s)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            self._loop.close()


def run_console(settings: ConsoleSettings, *, host: str, port: int, announce: bool = True) -> int:
    """Serve until SIGTERM or Ctrl-C; returns the exit code."""

    async def main() -> None:
        server = ConsoleServer(settings, host=host, port=port)
        await server.start()
        if announce:
            print(f"Vellum console: {server.url}/  (metadata {settings.metadata_uri}; "
                  f"{'read-only' if server.console.read_only else 'admin actions enabled'}). Ctrl-C stops it.",
                  flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            await server.stop()

    asyncio.run(main())
    return 0
