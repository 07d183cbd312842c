"""JSON in and out of the admin HTTP API, one way for every route module."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from vellum.errors import IncorrectParameterError


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
