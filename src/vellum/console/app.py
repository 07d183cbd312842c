"""The console's web application: aiohttp routes rendering Jinja2 templates, the static files
(the vendored uPlot chart library, the console's script and style), and the action flow.

Responsibility: parse requests, call ``ClusterConsole`` for the data, render. Every page is a
linkable URL (its state is in the query string) and refreshes itself: ``console.js`` fetches
the same URL with ``X-Console-Fragment: 1`` every ``refresh_s`` and swaps the ``live`` block
(without JavaScript the page is complete, only static). Invariants:
- no stack trace reaches a page: a source that is down, an unknown ledger, bad parameters and
  unexpected errors all render the error page with a sentence (the trace goes to the log);
- everything shown is escaped (Jinja2 autoescape: custom metadata and names may hold HTML);
  the Content-Security-Policy allows scripts, styles and images from the console only;
- actions exist only with an admin token, are confirmed on a page of their own, and are POSTed
  with a per-process anti-forgery token.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import secrets
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
from aiohttp import web

from vellum.console.actions import ACTIONS, ActionRefused, describe, run_action
from vellum.console.cluster import ClusterConsole, LedgerQuery, SourceUnavailable
from vellum.errors import NoSuchLedgerError

log = logging.getLogger(__name__)

#: shown for a value that is not known
NONE = "\u2013"

HERE = Path(__file__).parent
STATIC_DIR = HERE / "static"
CONSOLE_KEY: web.AppKey[ClusterConsole] = web.AppKey("console", ClusterConsole)
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; object-src 'none'; "
       "base-uri 'none'; frame-ancestors 'none'; form-action 'self'")
PAGES = [("cluster", "/cluster", "Cluster"), ("ledgers", "/ledgers", "Ledgers"), ("names", "/names", "Named ledgers"),
         ("storage", "/storage", "Storage & GC"), ("recovery", "/recovery", "Recovery")]


# ---------------------------------------------------------------------------------- filters


def human_bytes(n: Any) -> str:
    if n is None:
        return NONE
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def human_age(seconds: Any) -> str:
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return NONE
    s = int(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def epoch_ms(ms: Any) -> str:
    if not ms or int(ms) <= 0:
        return "never"
    return datetime.fromtimestamp(int(ms) / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def percent(x: Any) -> str:
    return NONE if x is None else f"{float(x) * 100:.1f} %"


def rate(x: Any) -> str:
    return NONE if x is None else f"{float(x):.1f}/s"


def make_env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(HERE / "templates")),
                             autoescape=jinja2.select_autoescape(["html", "j2"], default=True),
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(bytes=human_bytes, age=human_age, epoch_ms=epoch_ms, pct=percent, rate=rate)
    return env


# ------------------------------------------------------------------------------------ app


class ConsoleApp:
    """Routes and rendering (see the module docstring)."""

    def __init__(self, console: ClusterConsole) -> None:
        self.console = console
        self.env = make_env()
        self._csrf_key = secrets.token_bytes(32)

    # -- helpers --------------------------------------------------------------------------
    def csrf_token(self) -> str:
        return hmac.new(self._csrf_key, b"console-actions", hashlib.sha256).hexdigest()

    def _base(self, request: web.Request, page: str, title: str) -> dict[str, Any]:
        s = self.console.settings
        return {"page": page, "title": title, "pages": PAGES, "metadata_uri": s.metadata_uri,
                "refresh_s": s.refresh_s, "read_only": self.console.read_only,
                "now": datetime.now(UTC).strftime("%H:%M:%S UTC"), "path_qs": request.path_qs,
                "csrf": self.csrf_token(), "actions": ACTIONS}

    def render(self, request: web.Request, template: str, page: str, title: str, status: int = 200,
               **ctx: Any) -> web.Response:
        tpl = self.env.get_template(template)
        context = {**self._base(request, page, title), **ctx}
        if template in ("confirm.html.j2", "result.html.j2"):
            context["refresh_s"] = 0  # an action's pages stay as they are
        if request.headers.get("X-Console-Fragment") == "1" and "live" in tpl.blocks:
            body = "".join(tpl.blocks["live"](tpl.new_context(context)))
        else:
            body = tpl.render(context)
        return web.Response(text=body, status=status, content_type="text/html", charset="utf-8")

    def error(self, request: web.Request, status: int, message: str, page: str = "") -> web.Response:
        titles = {404: "Not found", 400: "Bad request", 503: "A source is unavailable", 502: "A bookie refused"}
        return self.render(request, "error.html.j2", page, titles.get(status, "Error"), status=status,
                           message=message, status_code=status)

    # -- middleware -----------------------------------------------------------------------
    @web.middleware
    async def middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        page = request.path.strip("/").split("/")[0]
        try:
            response = await handler(request)
        except web.HTTPException as e:
            if e.status >= 400 and not request.path.startswith("/static/"):
                response = self.error(request, e.status, e.reason or "not found", page)
            else:
                raise
        except SourceUnavailable as e:
            response = self.error(request, 503, str(e), page)
        except NoSuchLedgerError as e:
            response = self.error(request, 404, str(e), page)
        except Exception:
            log.exception("console: %s %s failed", request.method, request.path_qs)
            response = self.error(request, 500, "the console hit an internal error while building this page; "
                                                "its log has the details", page)
        response.headers.setdefault("Content-Security-Policy", CSP)
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Referrer-Policy", "no-referrer")
        if not request.path.startswith("/static/"):
            response.headers.setdefault("Cache-Control", "no-store")
        return response

    # -- pages ----------------------------------------------------------------------------
    async def index(self, _r: web.Request) -> web.Response:
        raise web.HTTPFound("/cluster")

    async def healthz(self, _r: web.Request) -> web.Response:
        return web.Response(text="OK\n")

    async def cluster(self, r: web.Request) -> web.Response:
        data = await self.console.cluster_page()
        return self.render(r, "cluster.html.j2", "cluster", "Cluster", **data)

    async def ledgers(self, r: web.Request) -> web.Response:
        q = r.query.get("q", "")
        after = _int_or_none(r.query.get("after"), "after")
        before = _int_or_none(r.query.get("before"), "before")
        query = LedgerQuery.parse(q)
        page = await self.console.ledgers_page(query, after, before)

        def link(**kw: Any) -> str:
            params = {k: v for k, v in {"q": q, **kw}.items() if v not in (None, "")}
            return "/ledgers" + ("?" + urlencode(params) if params else "")

        return self.render(r, "ledgers.html.j2", "ledgers", "Ledgers", result=page, q=query.text, query=query,
                           next_link=link(after=page.next_after) if page.next_after is not None else None,
                           prev_link=link(before=page.prev_before) if page.prev_before is not None else None,
                           first_link=link() if (after is not None or before is not None) else None,
                           now_s=time.time())

    async def ledger(self, r: web.Request) -> web.Response:
        ledger_id = _int_or_none(r.match_info["ledger_id"], "ledger id")
        assert ledger_id is not None
        data = await self.console.ledger_page(ledger_id)
        return self.render(r, "ledger.html.j2", "ledgers", f"Ledger {ledger_id}", **data)

    async def names(self, r: web.Request) -> web.Response:
        prefix = r.query.get("prefix", "")[:900]
        after = r.query.get("after") or None
        data = await self.console.names_page(prefix, after)
        next_link = ("/names?" + urlencode({"prefix": prefix, "after": data["next_after"]})
                     if data["next_after"] else None)
        return self.render(r, "names.html.j2", "names", "Named ledgers", next_link=next_link, **data)

    async def name(self, r: web.Request) -> web.Response:
        name = r.match_info["name"]
        data = await self.console.name_page(name)
        return self.render(r, "name.html.j2", "names", f"Named ledger {name}", **data)

    async def storage(self, r: web.Request) -> web.Response:
        data = await self.console.storage_page()
        return self.render(r, "storage.html.j2", "storage", "Storage & GC", **data)

    async def recovery(self, r: web.Request) -> web.Response:
        data = await self.console.recovery_page()
        return self.render(r, "recovery.html.j2", "recovery", "Recovery", **data)

    # -- actions --------------------------------------------------------------------------
    def _action(self, r: web.Request) -> Any:
        action = ACTIONS.get(r.match_info["action"])
        if action is None:
            raise web.HTTPNotFound(reason=f"no action {r.match_info['action']!r}")
        return action

    async def confirm(self, r: web.Request) -> web.Response:
        action = self._action(r)
        target = r.query.get("target") or None
        back = _safe_back(r.query.get("back"))
        if self.console.read_only:
            return self.error(r, 403, "the console is read-only: start it with --admin-token-file to enable actions")
        return self.render(r, "confirm.html.j2", "", "Confirm: " + action.title, action=action, target=target,
                           back=back, description=describe(action, target))

    async def perform(self, r: web.Request) -> web.Response:
        action = self._action(r)
        form = await r.post()
        back = _safe_back(str(form.get("back") or ""))
        if self.console.read_only:
            return self.error(r, 403, "the console is read-only: start it with --admin-token-file to enable actions")
        if not hmac.compare_digest(str(form.get("csrf", "")), self.csrf_token()):
            return self.error(r, 403, "the confirmation form is stale or came from another site: open the action "
                                      "again from the console")
        if form.get("confirm") != "yes":
            raise web.HTTPSeeOther(back)
        target = str(form.get("target") or "") or None
        views, _ur = await self.console.bookies(with_gc=False)
        try:
            outcome = await run_action(self.console.http, action, target, views)
        except ActionRefused as e:
            return self.render(r, "result.html.j2", "", "Action refused", status=502, ok=False, message=str(e),
                               back=back, description=describe(action, target))
        if action.name == "decommission" and target:
            self.console.decommissioning[target] = time.time()
        log.info("console action %s on %s: %s", action.name, target, outcome)
        return self.render(r, "result.html.j2", "", "Done", ok=True, message=outcome, back=back,
                           description=describe(action, target))


def _int_or_none(raw: str | None, what: str) -> int | None:
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise web.HTTPBadRequest(reason=f"{what} must be an integer, not {raw[:40]!r}") from None


def _safe_back(raw: str | None) -> str:
    """A local path to go back to (never another site)."""
    if raw and raw.startswith("/") and not raw.startswith("//") and "\\" not in raw:
        return raw
    return "/cluster"


def build_app(console: ClusterConsole) -> web.Application:
    ui = ConsoleApp(console)
    app = web.Application(middlewares=[ui.middleware], client_max_size=64 * 1024)
    app[CONSOLE_KEY] = console
    app.add_routes([
        web.get("/", ui.index),
        web.get("/healthz", ui.healthz),
        web.get("/cluster", ui.cluster),
        web.get("/ledgers", ui.ledgers),
        web.get(r"/ledgers/{ledger_id}", ui.ledger),
        web.get("/names", ui.names),
        web.get(r"/names/{name:.+}", ui.name),
        web.get("/storage", ui.storage),
        web.get("/recovery", ui.recovery),
        web.get("/actions/{action}", ui.confirm),
        web.post("/actions/{action}", ui.perform),
        web.static("/static", STATIC_DIR, append_version=False),
    ])
    return app
