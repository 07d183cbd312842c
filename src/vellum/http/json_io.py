"""JSON in and out of the admin HTTP API, one way for every route module: responses, request
bodies, and ``guarded``, the one mapping of a use-case's exceptions to statuses (400 bad
parameter, 404 unknown ledger, 503 busy, 500 anything else; each logged)."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from vellum.errors import (
    IncorrectParameterError,
    NoSuchLedgerError,
    NoSuchLedgerOnMetadataServerError,
    TooManyRequestsError,
    VellumError,
)

log = logging.getLogger(__name__)


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(data, indent=2), status=status, content_type="application/json")


def parse_json_object(text: str) -> dict[str, Any]:
    """A request body: empty means ``{}``; anything but a JSON object is IncorrectParameterError."""
    if not text.strip():
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise IncorrectParameterError(f"request body is not JSON: {e}") from None
    if not isinstance(data, dict):
        raise IncorrectParameterError("request body must be a JSON object")
    return data


async def json_body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object; a bad body ends the request with 400 and the reason."""
    try:
        return parse_json_object(await request.text())
    except IncorrectParameterError as e:
        raise web.HTTPBadRequest(text=json.dumps({"error": str(e)}), content_type="application/json") from None


def guarded(fn: Callable[[web.Request], Awaitable[Any]]) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """A handler answering ``fn``'s result as JSON (or as is, if it is a response), and its
    errors as ``{"error": "..."}`` with the status their kind calls for."""

    async def handler(request: web.Request) -> web.StreamResponse:
        status: int
        error: VellumError
        try:
            result = await fn(request)
        except IncorrectParameterError as e:
            status, error = 400, e
        except (NoSuchLedgerError, NoSuchLedgerOnMetadataServerError) as e:
            status, error = 404, e
        except TooManyRequestsError as e:
            status, error = 503, e
        except VellumError as e:
            log.warning("admin HTTP %s %s failed: %r", request.method, request.path_qs, e)
            return json_response({"error": str(e)}, 500)
        else:
            return result if isinstance(result, web.StreamResponse) else json_response(result)
        log.info("admin HTTP %s %s answered %d: %s", request.method, request.path_qs, status, error)
        return json_response({"error": str(error)}, status)

    return handler
