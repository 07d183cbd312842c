"""The bookie's admin HTTP server (aiohttp), on the bookie's own event loop.

Paths and JSON shapes follow BookKeeper's REST API (``/heartbeat``, ``/metrics``,
``/api/v1/bookie/...``, ``/api/v1/ledger/metadata``). Handlers only parse and render: the work
is done by ``admin.BookieAdmin`` in a thread, so a slow metadata store never blocks the loop.
Errors come back as JSON ``{"error": "..."}`` with 400 (bad parameter), 404 (unknown ledger)
or 500.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from vellum.admin.bookie_admin import BookieAdmin
from vellum.errors import (
    IncorrectParameterError,
    NoSuchLedgerError,
    NoSuchLedgerOnMetadataServerError,
    VellumError,
)
from vellum.stats import REGISTRY

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(data, indent=2), status=status, content_type="application/json")


def _error(message: str, status: int) -> web.Response:
    return _json({"error": message}, status)


async def _body(request: web.Request) -> dict[str, Any]:
    text = await request.text()
    if not text.strip():
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise IncorrectParameterError(f"request body is not JSON: {e}") from None
    if not isinstance(data, dict):
        raise IncorrectParameterError("request body must be a JSON object")
    return data


def _int_param(request: web.Request, name: str) -> int:
    raw = request.query.get(name)
    if raw is None:
        raise IncorrectParameterError(f"missing query parameter {name}")
    try:
        return int(raw)
    except ValueError:
        raise IncorrectParameterError(f"{name}={raw!r} is not an integer") from None


def _bool(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise IncorrectParameterError(f"{name} must be a boolean, got {value!r}")


def build_app(admin: BookieAdmin, extra_routes: list[web.RouteDef] | None = None) -> web.Application:
    """The aiohttp application; ``extra_routes`` lets later features (GC) add their paths."""

    def guarded(fn: Callable[[web.Request], Awaitable[Any]]) -> Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            try:
                result = await fn(request)
            except IncorrectParameterError as e:
                return _error(str(e), 400)
            except (NoSuchLedgerError, NoSuchLedgerOnMetadataServerError) as e:
                return _error(str(e), 404)
            except VellumError as e:
                return _error(str(e), 500)
            if isinstance(result, web.StreamResponse):
                return result
            return _json(result)

        return handler

    async def heartbeat(_r: web.Request) -> web.Response:
        return web.Response(text="OK\n")

    async def metrics(_r: web.Request) -> web.Response:
        body = generate_latest(REGISTRY)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def info(_r: web.Request) -> Any:
        return await asyncio.to_thread(admin.info)

    async def state(_r: web.Request) -> Any:
        return admin.state()

    async def readonly_get(_r: web.Request) -> Any:
        return {"readOnly": admin.state()["readOnly"]}

    async def readonly_put(r: web.Request) -> Any:
        body = await _body(r)
        if "readOnly" not in body:
            raise IncorrectParameterError('body must be {"readOnly": true|false}')
        return admin.set_read_only(_bool(body["readOnly"], "readOnly"))

    async def list_bookies(r: web.Request) -> Any:
        kind = r.query.get("type", "rw")
        hostnames = r.query.get("print_hostnames", "false").lower() == "true"
        return await asyncio.to_thread(admin.list_bookies, kind, hostnames)

    async def cluster_info(_r: web.Request) -> Any:
        return await asyncio.to_thread(admin.cluster_info)

    async def ledger_metadata(r: web.Request) -> Any:
        ledger_id = _int_param(r, "ledger_id")
        return await asyncio.to_thread(admin.ledger_metadata, ledger_id)

    async def list_disk_file(r: web.Request) -> Any:
        return await asyncio.to_thread(admin.list_disk_files, r.query.get("file_type"))

    async def last_log_mark(_r: web.Request) -> Any:
        return await asyncio.to_thread(admin.last_log_mark)

    async def is_ready(_r: web.Request) -> web.Response:
        st = admin.state()
        return web.Response(text="OK\n" if st["running"] else "not ready\n", status=200 if st["running"] else 503)

    app = web.Application()
    app.add_routes(
        [
            web.get("/heartbeat", heartbeat),
            web.get("/metrics", metrics),
            web.get("/api/v1/bookie/info", guarded(info)),
            web.get("/api/v1/bookie/state", guarded(state)),
            web.get("/api/v1/bookie/state/readonly", guarded(readonly_get)),
            web.put("/api/v1/bookie/state/readonly", guarded(readonly_put)),
            web.get("/api/v1/bookie/is_ready", is_ready),
            web.get("/api/v1/bookie/list_bookies", guarded(list_bookies)),
            web.get("/api/v1/bookie/cluster_info", guarded(cluster_info)),
            web.get("/api/v1/bookie/list_disk_file", guarded(list_disk_file)),
            web.get("/api/v1/bookie/last_log_mark", guarded(last_log_mark)),
            web.get("/api/v1/ledger/metadata", guarded(ledger_metadata)),
            *(extra_routes or []),
        ]
    )
    return app


class AdminHttpServer:
    """Runs ``build_app`` on (host, port) on the current event loop."""

    def __init__(
        self, admin: BookieAdmin, *, host: str, port: int, extra_routes: list[web.RouteDef] | None = None
    ) -> None:
        self._app = build_app(admin, extra_routes)
        self._host = host
        self._port = port
        self._runner: web.AppRunner | None = None

    @property
    def port(self) -> int:
        return self._port

    async def start(self) -> None:
        self._runner = web.AppRunner(self._app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port, reuse_address=True)
        await site.start()
        server = site._server  # the bound socket tells the real port when 0 was asked
        sockets = getattr(server, "sockets", None)
        if sockets:
            self._port = sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
