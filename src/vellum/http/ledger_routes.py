"""Admin HTTP routes for ledgers (BookKeeper's ``/api/v1/ledger/*`` but ``metadata``, which
``admin_http`` serves), added to ``build_app`` through ``extra_routes``; each calls
``admin.ledger_admin.LedgerAdmin``.

- ``GET /api/v1/ledger/list[?print_metadata=true[&page=N]]`` -> ``{"<ledger id>": null}`` for
  every ledger, or ``{"<ledger id>": <metadata>}`` (password redacted) with ``print_metadata``,
  100 ledgers a page when ``page`` is given (BookKeeper's ``decode_meta`` is accepted: the
  metadata is always decoded JSON);
- ``GET /api/v1/ledger/read?ledger_id=N[&start_entry_id=A][&end_entry_id=B][&page=P]`` ->
  ``{"<entry id>": "<payload as US-ASCII>"}`` (with ``page``, also ``"Entries for page: ": "P"``,
  1000 entries a page); never past the last add confirmed, at most one page per call. It needs
  the admin role whenever changes do (``admin_http.ADMIN_READS``);
- ``DELETE /api/v1/ledger/delete?ledger_id=N`` -> ``"Deleted ledger: N"`` (404: unknown ledger).
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from vellum.admin.ledger_admin import LedgerAdmin
from vellum.errors import IncorrectParameterError
from vellum.http.json_io import guarded


def _int(request: web.Request, name: str, default: int | None = None) -> int | None:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise IncorrectParameterError(f"{name}={raw!r} is not an integer") from None


def _ledger_id(request: web.Request) -> int:
    ledger_id = _int(request, "ledger_id")
    if ledger_id is None:
        raise IncorrectParameterError("missing query parameter ledger_id (give ledger_id=<id>)")
    return ledger_id


def _flag(request: web.Request, name: str) -> bool:
    raw = request.query.get(name, "false").lower()
    if raw not in ("true", "false"):
        raise IncorrectParameterError(f"{name} must be true or false, not {request.query.get(name)!r}")
    return raw == "true"


def ledger_routes(admin: LedgerAdmin) -> list[web.RouteDef]:
    async def list_ledgers(r: web.Request) -> Any:
        print_metadata = _flag(r, "print_metadata")
        _flag(r, "decode_meta")  # checked; the metadata is always decoded
        page = _int(r, "page") if print_metadata else None
        return await asyncio.to_thread(admin.list_ledgers, print_metadata=print_metadata, page=page)

    async def read(r: web.Request) -> Any:
        ledger_id = _ledger_id(r)
        start = _int(r, "start_entry_id", 0)
        end = _int(r, "end_entry_id", -1)
        assert start is not None and end is not None
        return await admin.read_entries(ledger_id, start_entry_id=start, end_entry_id=end, page=_int(r, "page"))

    async def delete(r: web.Request) -> Any:
        return await asyncio.to_thread(admin.delete_ledger, _ledger_id(r))

    return [
        web.get("/api/v1/ledger/list", guarded(list_ledgers)),
        web.get("/api/v1/ledger/read", guarded(read)),
        web.delete("/api/v1/ledger/delete", guarded(delete)),
    ]
