"""Shared fixtures of the client tests: real bookies served in-process on 127.0.0.1.

``inprocess_bookies(tmp_path, n)`` is an async context manager yielding ``n`` started
:class:`InProcessBookie` (real storage, journal and network server on the running loop). Each
can ``stop()`` its network server (clients see the connection drop), ``start()`` it again on
the same port, or ``restart()`` completely (close storage, reopen from disk: journal replay).
Everything is closed on exit, whatever state the bookies are in.

Test modules import these helpers with ``from client_testkit import ...``: this conftest
registers itself under that unique module name, because ``from conftest import ...`` resolves
to whichever directory's conftest pytest loaded last (e.g. ``pytest tests/meta tests/client``). The ``bookie_cluster`` fixture
offers ``inprocess_bookies`` bound to the test's ``tmp_path`` for fixture-style use.

Also: ``run(coro)`` runs a coroutine on a fresh loop (pytest-asyncio is not used), ``make_entry`` / ``MASTER_KEY`` build stored entries.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from vellum.bookie.assembly import OpenedBookie, open_bookie
from vellum.bookie.executor import AsyncBookie
from vellum.config import ServerConfig
from vellum.format.entry import DigestManager, DigestType, master_key
from vellum.server.bookie_server import BookieServer, ServerLimits

_T = TypeVar("_T")

sys.modules.setdefault("client_testkit", sys.modules[__name__])

PASSWORD = b"secret"
MASTER_KEY = master_key(PASSWORD)


def run(coro: Coroutine[Any, Any, _T], *, timeout_s: float = 60.0, use_uvloop: bool = False) -> _T:
    """Run ``coro`` to completion on a new event loop, bounded in time.

    The stdlib loop by default: ``BookieServer.connection_made`` asserts
    ``isinstance(transport, asyncio.Transport)``, which uvloop's TCPTransport fails, so an
    in-process bookie cannot serve on uvloop yet. Tests against fake servers pass
    ``use_uvloop=True`` so the client is exercised on the loop it runs on in production.
    """

    async def bounded() -> _T:
        return await asyncio.wait_for(coro, timeout_s)

    if use_uvloop:
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(bounded())
    return asyncio.run(bounded())


def make_entry(
    ledger_id: int, entry_id: int, payload: bytes, *, lac: int = -1, password: bytes = PASSWORD
) -> bytes:
    """A stored entry (CRC32C digest) as a client would send it."""
    return DigestManager(ledger_id, DigestType.CRC32C, password).compute(entry_id, lac, len(payload), payload)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class InProcessBookie:
    """One real bookie on the running loop: storage + journal + network server."""

    base: Path
    port: int
    config: ServerConfig
    opened: OpenedBookie | None = None
    async_bookie: AsyncBookie | None = None
    server: BookieServer | None = None
    _closed: bool = field(default=False, repr=False)

    @property
    def bookie_id(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def open(self) -> None:
        """Open storage (replaying the journal) and start serving."""
        loop = asyncio.get_running_loop()
        self.opened = await loop.run_in_executor(
            None, lambda: open_bookie(self.config, bookie_id=self.bookie_id)
        )
        self.async_bookie = AsyncBookie(self.opened.bookie, loop)
        await self.start()

    async def start(self) -> None:
        """(Re)start the network server on the same port."""
        assert self.async_bookie is not None and self.server is None
        cfg = self.config
        limits = ServerLimits(
            max_adds_in_progress=cfg.max_adds_in_progress_limit,
            max_reads_in_progress=cfg.max_reads_in_progress_limit,
            max_frame_size=cfg.netty_max_frame_size_bytes,
        )
        server = BookieServer(self.async_bookie, host="127.0.0.1", port=self.port, limits=limits)
        await server.start()
        self.server = server

    async def stop(self) -> None:
        """Stop the network server (connections drop); storage stays open."""
        if self.server is not None:
            server, self.server = self.server, None
            await server.stop()

    async def close(self) -> None:
        """Stop serving and close storage (a clean shutdown)."""
        await self.stop()
        if self.async_bookie is not None:
            self.async_bookie.close()
            self.async_bookie = None
        if self.opened is not None:
            opened, self.opened = self.opened, None
            await asyncio.get_running_loop().run_in_executor(None, opened.close)

    async def restart(self) -> None:
        """Clean shutdown, then reopen from disk on the same port."""
        await self.close()
        await self.open()


def _config(base: Path, port: int, overrides: dict[str, Any]) -> ServerConfig:
    settings: dict[str, Any] = {
        "bookie_port": port,
        "journal_directories": (str(base / "journal"),),
        "ledger_directories": (str(base / "ledgers"),),
        "http_server_enabled": False,
        # small caches: many bookies live in one test process
        "db_storage_write_cache_max_size_mb": 4,
        "db_storage_read_ahead_cache_max_size_mb": 4,
        "journal_pre_alloc_size_mb": 1,
    }
    settings.update(overrides)
    return ServerConfig(**settings)


@contextlib.asynccontextmanager
async def inprocess_bookies(
    tmp_path: Path, n: int, **config_overrides: Any
) -> AsyncIterator[list[InProcessBookie]]:
    """``n`` real bookies serving on 127.0.0.1 (``bookie_id`` = ``127.0.0.1:<port>``).

    ``config_overrides`` are ServerConfig fields applied to every bookie (the server limits
    ``max_adds_in_progress_limit`` / ``max_reads_in_progress_limit`` included).
    """
    bookies: list[InProcessBookie] = []
    try:
        for i in range(n):
            for attempt in range(5):
                # a fresh dir per attempt: the cookie binds the dir to the bookie id (= port)
                base = tmp_path / f"bookie{i}" if attempt == 0 else tmp_path / f"bookie{i}-{attempt}"
                port = _free_port()
                bookie = InProcessBookie(base, port, _config(base, port, config_overrides))
                try:
                    await bookie.open()
                except OSError:  # the free port was taken meanwhile: try another
                    await bookie.close()
                    if attempt == 4:
                        raise
                    continue
                bookies.append(bookie)
                break
        yield bookies
    finally:
        for bookie in bookies:
            await bookie.close()


@pytest.fixture
def bookie_cluster(tmp_path: Path) -> Any:
    """``bookie_cluster(n, **overrides)``: :func:`inprocess_bookies` bound to ``tmp_path``."""

    def factory(n: int, **overrides: Any) -> contextlib.AbstractAsyncContextManager[list[InProcessBookie]]:
        return inprocess_bookies(tmp_path, n, **overrides)

    return factory
