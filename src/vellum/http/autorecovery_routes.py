"""Admin HTTP routes for AutoRecovery (BookKeeper's ``/api/v1/autorecovery/*``), added to
``build_app`` through ``extra_routes``. Each calls the use-case in ``admin/recovery_admin``.

- ``GET /api/v1/autorecovery/status`` -> ``{"enabled": bool, ...}`` (BookKeeper's field, then what
  ``vellum shell autorecovery status --json`` shows: auditor, whether any ledger is
  under-replicated, ``ledgersThatCannotHeal``); ``PUT ...?enabled=true|false``
  (or body ``{"enabled": bool}``) switches re-replication for the whole cluster;
- ``GET /api/v1/autorecovery/list_under_replicated_ledger[?missingreplica=B][&excludingmissingreplica=B]``
  -> a JSON array of ``{ledgerId, missingReplicas, ctime, lockedBy}`` (404 when there are none,
  as BookKeeper);
- ``GET /api/v1/autorecovery/who_is_auditor`` -> ``{"Auditor": "host:port"}`` (404: none);
- ``PUT /api/v1/autorecovery/trigger_audit``;
- ``GET|PUT /api/v1/autorecovery/lost_bookie_recovery_delay`` (PUT body ``{"delay_seconds": N}``);
- ``PUT /api/v1/autorecovery/decommission`` body ``{"bookie_src": "host:port"}``: starts moving
  the ledgers off a stopped bookie (answers at once; ``list_under_replicated_ledger`` shows the
  progress), its cookie is deleted at the end;
- ``PUT /api/v1/autorecovery/bookie`` body ``{"bookie_src": [..], "delete_cookie": bool}``:
  re-replicates the ledgers of the given bookies from this process (BookKeeper's recover).
Long operations run as tasks of the server; their outcome is logged.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from aiohttp import web

from vellum.admin import recovery_admin as ra
from vellum.autorecovery.settings import AutoRecoverySettings
from vellum.client.bookkeeper import BookKeeper
from vellum.config import ClientConfig
from vellum.http.json_io import json_body, json_response
from vellum.ids import BookieId
from vellum.meta.api import MetadataStore

log = logging.getLogger(__name__)


def autorecovery_routes(store: MetadataStore, metadata_uri: str, settings: AutoRecoverySettings,
                        client_config: ClientConfig | None = None) -> list[web.RouteDef]:
    """``client_config``: the client the long operations open (the bookie's own, with its TLS)."""
    tasks: set[asyncio.Task[Any]] = set()

    def background(what: str, coro: Coroutine[Any, Any, Any]) -> None:
        async def run() -> None:
            try:
                result = await coro
                log.info("%s finished: %s", what, result)
            except Exception:
                log.exception("%s failed", what)

        task = asyncio.create_task(run())
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def status_get(_r: web.Request) -> web.Response:
        return json_response(await asyncio.to_thread(ra.status_report, store))

    async def status_put(r: web.Request) -> web.Response:
        body = await json_body(r)
        raw = r.query.get("enabled", body.get("enabled"))
        if isinstance(raw, str) and raw.lower() in ("true", "false"):
            raw = raw.lower() == "true"
        if not isinstance(raw, bool):
            return json_response({"error": "give enabled=true or enabled=false"}, 400)
        await asyncio.to_thread(ra.set_enabled, store, raw)
        return json_response({"enabled": raw})

    async def list_ur(r: web.Request) -> web.Response:
        rows = await asyncio.to_thread(ra.list_under_replicated, store,
                                       missing_replica=r.query.get("missingreplica"),
                                       excluding_missing_replica=r.query.get("excludingmissingreplica"))
        if not rows:
            return json_response({"error": "no under-replicated ledgers"}, 404)
        return json_response([row.to_json() for row in rows])

    async def who(_r: web.Request) -> web.Response:
        auditor = await asyncio.to_thread(ra.who_is_auditor, store)
        if auditor is None:
            return json_response({"error": "no auditor is elected"}, 404)
        return json_response({"Auditor": auditor})

    async def trigger(_r: web.Request) -> web.Response:
        delay = await asyncio.to_thread(ra.trigger_audit, store, settings.lost_bookie_recovery_delay_s)
        return json_response({"triggered": True, "lostBookieRecoveryDelay": delay})

    async def delay_get(_r: web.Request) -> web.Response:
        delay = await asyncio.to_thread(ra.get_lost_bookie_recovery_delay, store, settings.lost_bookie_recovery_delay_s)
        return json_response({"lostBookieRecoveryDelay": delay})

    async def delay_put(r: web.Request) -> web.Response:
        body = await json_body(r)
        value = body.get("delay_seconds")
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            return json_response({"error": "body must be {\"delay_seconds\": N} with N >= 0"}, 400)
        await asyncio.to_thread(ra.set_lost_bookie_recovery_delay, store, value)
        return json_response({"lostBookieRecoveryDelay": value})

    async def decommission(r: web.Request) -> web.Response:
        body = await json_body(r)
        bookie = body.get("bookie_src")
        if not isinstance(bookie, str) or not bookie:
            return json_response({"error": "body must be {\"bookie_src\": \"host:port\"}"}, 400)
        reg = store.registration
        registered = await asyncio.to_thread(lambda: reg.list_bookies() | reg.list_bookies(read_only=True))
        if BookieId(bookie) in registered:
            return json_response({"error": f"bookie {bookie} is still registered: stop it first"}, 409)

        async def run() -> int:
            async with BookKeeper(metadata_uri, config=client_config) as bk:
                return await ra.decommission(bk, bookie)

        background(f"decommission of {bookie}", run())
        return json_response({"decommissioning": bookie})

    async def recover(r: web.Request) -> web.Response:
        body = await json_body(r)
        src = body.get("bookie_src")
        if not isinstance(src, list) or not src or not all(isinstance(b, str) for b in src):
            return json_response({"error": "body must be {\"bookie_src\": [\"host:port\", ...]}"}, 400)
        delete_cookie = bool(body.get("delete_cookie", False))

        async def run() -> dict[int, str]:
            async with BookKeeper(metadata_uri, config=client_config) as bk:
                results = await ra.recover(bk, set(src), settings)
                if delete_cookie and not any(v.startswith("failed") for v in results.values()):
                    for b in src:
                        if await asyncio.to_thread(store.registration.get_cookie, BookieId(b)) is not None:
                            await asyncio.to_thread(store.registration.remove_cookie, BookieId(b))
                return results

        background(f"recovery of {', '.join(src)}", run())
        return json_response({"recovering": src})

    return [
        web.get("/api/v1/autorecovery/status", status_get),
        web.put("/api/v1/autorecovery/status", status_put),
        web.get("/api/v1/autorecovery/list_under_replicated_ledger", list_ur),
        web.get("/api/v1/autorecovery/who_is_auditor", who),
        web.put("/api/v1/autorecovery/trigger_audit", trigger),
        web.get("/api/v1/autorecovery/lost_bookie_recovery_delay", delay_get),
        web.put("/api/v1/autorecovery/lost_bookie_recovery_delay", delay_put),
        web.put("/api/v1/autorecovery/decommission", decommission),
        web.put("/api/v1/autorecovery/bookie", recover),
    ]
