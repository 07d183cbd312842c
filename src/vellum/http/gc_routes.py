"""Admin HTTP routes for GC (docs/gc.md), added to ``build_app`` through ``extra_routes``.

BookKeeper's paths and JSON:
- ``PUT /api/v1/bookie/gc``: force GC; optional body ``{"forceMajor": bool, "forceMinor": bool}``
  (each defaults to "not suspended"); answers ``"Triggered GC on BookieServer: <id>"``;
- ``GET /api/v1/bookie/gc``: ``{"is_in_force_gc": "true|false"}``;
- ``GET /api/v1/bookie/gc_details``: a JSON array, one object per GC thread (ledger dir);
- ``PUT /api/v1/bookie/gc/suspend_compaction`` body ``{"suspendMajor": bool, "suspendMinor": bool}``,
  ``GET`` answers ``{isMajorGcSuspended, isMinorGcSuspended}``;
- ``PUT /api/v1/bookie/gc/resume_compaction`` body ``{"resumeMajor": bool, "resumeMinor": bool}``.
Vellum's own: ``GET /api/v1/bookie/entrylogs`` (per-log size, live bytes, usage, ledgers) and
``GET /api/v1/bookie/disk_usage`` (per ledger dir usage and state, journal and entry-log bytes,
thresholds, version: what the operator console draws).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiohttp import web

from vellum.admin.gc_admin import GcAdmin
from vellum.http.json_io import json_body, json_response


def _flag(body: dict[str, Any], name: str, default: bool | None) -> bool | None:
    value = body.get(name, default)
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ValueError(f"{name} must be a boolean, got {value!r}")


async def _with_flags(r: web.Request, names: tuple[str, str], default: bool | None,
                      act: Callable[[bool | None, bool | None], Any]) -> web.Response:
    """Read the (major, minor) flags named ``names`` from the JSON body and answer ``act``'s
    result; a flag that is not a boolean is a 400 naming it."""
    body = await json_body(r)
    try:
        major = _flag(body, names[0], default)
        minor = _flag(body, names[1], default)
    except ValueError as e:
        return json_response({"error": str(e)}, 400)
    return json_response(act(major, minor))


def gc_routes(admin: GcAdmin) -> list[web.RouteDef]:
    async def gc_put(r: web.Request) -> web.Response:
        return await _with_flags(r, ("forceMajor", "forceMinor"), None, admin.trigger_gc)

    async def gc_get(_r: web.Request) -> web.Response:
        return json_response(admin.is_in_force_gc())

    async def gc_details(_r: web.Request) -> web.Response:
        return json_response(admin.gc_details())

    async def suspend_get(_r: web.Request) -> web.Response:
        return json_response(admin.suspension())

    async def suspend_put(r: web.Request) -> web.Response:
        return await _with_flags(r, ("suspendMajor", "suspendMinor"), False,
                                 lambda major, minor: admin.suspend_compaction(bool(major), bool(minor)))

    async def resume_put(r: web.Request) -> web.Response:
        return await _with_flags(r, ("resumeMajor", "resumeMinor"), False,
                                 lambda major, minor: admin.resume_compaction(bool(major), bool(minor)))

    async def entrylogs(_r: web.Request) -> web.Response:
        return json_response(await asyncio.to_thread(admin.entry_log_usage))

    async def disk_usage(_r: web.Request) -> web.Response:
        return json_response(await asyncio.to_thread(admin.disk_usage))

    return [
        web.put("/api/v1/bookie/gc", gc_put),
        web.get("/api/v1/bookie/gc", gc_get),
        web.get("/api/v1/bookie/gc_details", gc_details),
        web.get("/api/v1/bookie/gc/suspend_compaction", suspend_get),
        web.put("/api/v1/bookie/gc/suspend_compaction", suspend_put),
        web.put("/api/v1/bookie/gc/resume_compaction", resume_put),
        web.get("/api/v1/bookie/entrylogs", entrylogs),
        web.get("/api/v1/bookie/disk_usage", disk_usage),
    ]
