"""Running the console: ``ConsoleServer`` on the current event loop (tests, benchmarks),
``ConsoleThread`` on a loop of its own (``vellum standalone``, which supervises processes from
a plain thread), ``run_console`` for ``vellum console`` (until SIGTERM or Ctrl-C).

The admin token is read from a file (``--admin-token-file``), never taken on the command line
where ``ps`` would show it; an empty or unreadable file is an error at start.

Who may use it (docs/console.md): with login keys (``--token-secret-file`` /
``--token-public-key-file``, or ``--tls-client-ca-file`` for certificate logins) every page
needs a login; without them the console holds its admin token only on a loopback address (a
single operator's machine): a console with an admin token, no login and another address does
not start. With ``--tls-cert-file`` / ``--tls-key-file`` it serves https only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import ssl
import threading
from pathlib import Path

from aiohttp import web

from vellum.console.access import is_loopback
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
        check_door(settings, host)
        self._ssl = server_tls(settings)
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
        return f"{'https' if self._ssl is not None else 'http'}://{host}:{self._port}"

    async def start(self) -> None:
        # The port first: a console that cannot listen starts nothing (no sampler, no session)
        # and leaves nothing to clean up behind the error.
        self._runner = web.AppRunner(build_app(self.console, listen_host=self._host), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port, reuse_address=True, ssl_context=self._ssl)
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
        log.info("console on %s (metadata %s, %s, %s)", self.url, self.console.settings.metadata_uri,
                 "read-only" if self.console.read_only else "admin actions enabled",
                 "login required" if self.console.settings.login_required else "no login: loopback only")

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.console.close()


def check_door(settings: ConsoleSettings, host: str) -> None:
    """Refuse a console that would let whoever reaches its port act with its admin token."""
    settings.token_verifier()  # an unusable key file fails the start, not the first login
    if settings.admin_token and not settings.login_required and not is_loopback(host):
        raise ConfigError(
            f"the console would listen on {host} with an admin token and no login: anyone who reaches the port "
            "could act with the token. Give --token-secret-file or --token-public-key-file (the key the bookies "
            "verify tokens with: tokenSecretKeyFile / tokenPublicKeyFile), or listen on 127.0.0.1")
    if settings.tls_client_ca_file and not settings.tls_cert_file:
        raise ConfigError("--tls-client-ca-file (certificate logins) needs https: give --tls-cert-file and "
                          "--tls-key-file")


def server_tls(settings: ConsoleSettings) -> ssl.SSLContext | None:
    """The console's https context (``--tls-cert-file``/``--tls-key-file``), or None for http."""
    if not settings.tls_cert_file and not settings.tls_key_file:
        return None
    if not settings.tls_cert_file:
        raise ConfigError("--tls-key-file needs --tls-cert-file (the console's certificate, PEM)")
    try:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(settings.tls_cert_file, settings.tls_key_file or None)
        if settings.tls_client_ca_file:
            context.load_verify_locations(cafile=settings.tls_client_ca_file)
            context.verify_mode = ssl.CERT_OPTIONAL  # a login may use a token instead
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"the console's https settings (--tls-cert-file {settings.tls_cert_file}, --tls-key-file "
                          f"{settings.tls_key_file}, --tls-client-ca-file {settings.tls_client_ca_file}): {e}") from None
    return context


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
                  f"{'read-only' if server.console.read_only else 'admin actions enabled'}; "
                  f"{'log in with a token' if settings.login_required else 'no login: loopback only'}). "
                  "Ctrl-C stops it.", flush=True)
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
