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
- who may use the console is decided before any handler runs, in one place (``_door``,
  docs/console.md "Who may use the console"): a ``Host`` that does not name the console gets
  421 (DNS rebinding), a change whose ``Origin`` is not the console gets 403, a page without a
  session goes to the login page (when the console has login keys; a loopback console without
  them gives each browser a session of its own), and every change carries its session's own
  anti-forgery token;
- actions exist only with an admin token and a session with the admin role, are confirmed on a
  page of their own, and are POSTed; ``back=`` only ever leads to a path of the console.
"""

from __future__ import annotations

import logging
import math
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import jinja2
from aiohttp import web

from vellum.console.access import AddressCheck, Session, Sessions
from vellum.console.actions import ACTIONS, ActionRefused, describe, run_action
from vellum.console.cluster import ClusterConsole, LedgerQuery, SourceUnavailable
from vellum.console.cursors import metrics_text
from vellum.errors import NoSuchLedgerError, SecurityError
from vellum.security.pki import principal_of, roles_of
from vellum.security.tls import peer_certificate

log = logging.getLogger(__name__)

#: shown for a value that is not known
NONE = "\u2013"

HERE = Path(__file__).parent
STATIC_DIR = HERE / "static"
CONSOLE_KEY: web.AppKey[ClusterConsole] = web.AppKey("console", ClusterConsole)
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; object-src 'none'; "
       "base-uri 'none'; frame-ancestors 'none'; form-action 'self'")
#: Prometheus text of the named ledgers' cursor lag (docs/console.md)
METRICS_PATH = "/metrics"
#: paths served without a session (the login page itself, its style, liveness probes)
OPEN_PATHS = frozenset({"/login", "/healthz"})
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
SESSION_KEY: web.RequestKey[Session | None] = web.RequestKey("console_session")
NEW_SESSION_KEY: web.RequestKey[Session] = web.RequestKey("console_new_session", Session)
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

    def __init__(self, console: ClusterConsole, *, listen_host: str = "127.0.0.1") -> None:
        self.console = console
        self.env = make_env()
        settings = console.settings
        self.addresses = AddressCheck(listen_host, settings.public_names)
        self.sessions = Sessions(settings.session_ttl_s)
        self.verifier = settings.token_verifier()
        self.login_required = settings.login_required

    # -- helpers --------------------------------------------------------------------------
    def _base(self, request: web.Request, page: str, title: str) -> dict[str, Any]:
        s = self.console.settings
        session: Session | None = request.get(SESSION_KEY)
        return {"page": page, "title": title, "pages": PAGES, "metadata_uri": s.metadata_uri,
                "refresh_s": s.refresh_s if session is not None else 0, "read_only": self.console.read_only,
                "now": datetime.now(UTC).strftime("%H:%M:%S UTC"), "path_qs": request.path_qs,
                "csrf": session.csrf if session is not None else "", "session": session,
                "may_act": session is not None and session.admin and not self.console.read_only,
                "actions": ACTIONS}

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
    @staticmethod
    def cookie_name(request: web.Request) -> str:
        # "__Host-": the browser keeps it only if Secure, for this host alone, on path /. The
        # port is in the name: browsers share cookies between the ports of one host, and two
        # consoles on one machine must not log each other out.
        port = _local_address(request)[1]
        return f"__Host-vellum-console-{port}" if request.secure else f"vellum-console-{port}"

    async def _door(self, request: web.Request) -> web.StreamResponse | None:
        """Who may go on (see the module docstring): None, or the refusal to answer with."""
        local = _local_address(request)
        host = request.headers.get("Host")
        if not self.addresses.host_allowed(host, local, request.scheme):
            log.warning("console: %s %s from %s refused: Host %r is not one of the console's addresses",
                        request.method, request.path, request.remote, (host or "")[:100])
            return _plain(421, f"this is not the console of {(host or '(no Host)')[:100]!r}: the Host header names "
                               "none of its addresses (reach it by the address it listens on, or start it with "
                               "--public-name for the name you use)")
        mutating = request.method not in _SAFE_METHODS
        origin = request.headers.get("Origin")
        if mutating and not self.addresses.origin_allowed(origin, local):
            log.warning("console: %s %s from %s refused: Origin %r is not the console", request.method,
                        request.path, request.remote, (origin or "")[:100])
            return _plain(403, "a change must come from the console's own pages: this request's Origin "
                               f"({(origin or 'none')[:100]}) is not the console")
        session = self.sessions.get(request.cookies.get(self.cookie_name(request)))
        if request.path == METRICS_PATH and session is None:
            return self._scraper_door(request)
        public = request.path in OPEN_PATHS or request.path.startswith("/static/")
        if session is None and not self.login_required and request.path not in ("/healthz", "/favicon.ico") \
                and not request.path.startswith("/static/"):
            # a loopback console without login keys: each browser gets a session of its own,
            # so the anti-forgery token is still per session (docs/console.md)
            session = self.sessions.create("local operator", ["admin"], via="loopback")
            request[NEW_SESSION_KEY] = session
        request[SESSION_KEY] = session
        if session is None and not public:
            if mutating:
                return _plain(403, "log in to the console first (your session ended or never began)")
            return _see_other("/login?" + urlencode({"back": request.path_qs}))
        if mutating and session is not None:
            form = await request.post()
            if not session.csrf_matches(str(form.get("csrf", ""))):
                log.warning("console: %s %s from %s refused: anti-forgery token missing or not this session's",
                            request.method, request.path, request.remote)
                return self.error(request, 403, "the form is stale or came from another site: open it again "
                                                "from the console")
        return None

    def _scraper_door(self, request: web.Request) -> web.StreamResponse | None:
        """``/metrics`` without a session (a Prometheus scraper): open on a console without login
        keys (no session is made per scrape); else a valid login token as ``Authorization:
        Bearer`` or a client certificate the console's CA verifies, any role (it shows what every
        page shows)."""
        if not self.login_required:
            return None
        if self._certificate_login(request) is not None:
            return None
        auth = request.headers.get("Authorization", "")
        if auth[:7].lower() == "bearer " and self.verifier is not None:
            try:
                self.verifier.verify(auth[7:].strip(), audience=self.console.settings.token_audience)
                return None
            except SecurityError as e:
                log.warning("console: %s from %s refused: %s", METRICS_PATH, request.remote, e)
                return _plain(401, f"the bearer token was refused: {e}")
        return _plain(401, f"{METRICS_PATH} needs a login: scrape it with the header 'Authorization: Bearer "
                           "<token>' (a login token, `vellum security issue-token`) or a client certificate "
                           "the console's CA verifies")

    @web.middleware
    async def middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        page = request.path.strip("/").split("/")[0]
        try:
            refused = await self._door(request)
            response = refused if refused is not None else await handler(request)
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
        # same-origin, not no-referrer: with no-referrer a browser sends "Origin: null" on the
        # console's own forms, and the Origin check refuses them
        response.headers.setdefault("Referrer-Policy", "same-origin")
        if not request.path.startswith("/static/"):
            response.headers.setdefault("Cache-Control", "no-store")
        new: Session | None = request.get(NEW_SESSION_KEY)
        if new is not None:
            self._set_cookie(request, response, new)
        return response

    def _set_cookie(self, request: web.Request, response: web.StreamResponse, session: Session) -> None:
        response.set_cookie(self.cookie_name(request), session.session_id, path="/", httponly=True,
                            secure=request.secure, samesite="Strict",
                            max_age=max(1, int(session.expires_at - time.time())))

    # -- login ----------------------------------------------------------------------------
    def _certificate_login(self, request: web.Request) -> tuple[str, tuple[str, ...]] | None:
        """The (principal, roles) of the verified client certificate of this connection, if any."""
        if not self.console.settings.tls_client_ca_file or request.transport is None:
            return None
        cert = peer_certificate(request.transport.get_extra_info("ssl_object"))
        if cert is None:
            return None
        try:
            return principal_of(cert), roles_of(cert)
        except SecurityError:
            return None

    def _login_page(self, request: web.Request, back: str, status: int = 200, problem: str = "") -> web.Response:
        return self.render(request, "login.html.j2", "", "Log in", status=status, back=back, problem=problem,
                           takes_token=self.verifier is not None, certificate=self._certificate_login(request))

    async def login_form(self, r: web.Request) -> web.StreamResponse:
        back = _safe_back(r.query.get("back"))
        if r.get(SESSION_KEY) is not None:
            return _see_other(back)
        return self._login_page(r, back)

    async def login(self, r: web.Request) -> web.StreamResponse:
        form = await r.post()
        back = _safe_back(str(form.get("back") or ""))
        if not self.login_required:
            return _see_other(back)
        if form.get("method") == "certificate":
            cert = self._certificate_login(r)
            if cert is None:
                return self._login_page(r, back, 401, "this connection presented no client certificate the "
                                                      "console's CA verifies")
            subject, roles = cert
            if "admin" not in roles:
                return self._login_page(r, back, 403, f"the certificate of {subject!r} (roles {list(roles)}) lacks "
                                                      "the admin role")
            session = self.sessions.create(subject, roles, via="certificate")
        else:
            token = str(form.get("token") or "").strip()
            if self.verifier is None:
                return self._login_page(r, back, 400, "this console takes client certificates, not tokens")
            if not token:
                return self._login_page(r, back, 400, "paste a token (`vellum security issue-token`)")
            try:
                claims = self.verifier.verify(token, audience=self.console.settings.token_audience)
            except SecurityError as e:
                log.warning("console: login from %s refused: %s", r.remote, e)
                return self._login_page(r, back, 401, str(e))
            session = self.sessions.create(claims.subject, claims.roles, via="token",
                                           not_after=claims.expires_at.timestamp())
        log.info("console: %s (roles %s) logged in from %s by %s", session.subject, list(session.roles),
                 r.remote, session.via)
        old = r.get(SESSION_KEY)
        if old is not None:
            self.sessions.end(old.session_id)
        response = _see_other(back)
        self._set_cookie(r, response, session)
        return response

    async def logout(self, r: web.Request) -> web.StreamResponse:
        session: Session | None = r.get(SESSION_KEY)
        if session is not None:
            self.sessions.end(session.session_id)
            log.info("console: %s logged out", session.subject)
        response = _see_other("/login" if self.login_required else "/cluster")
        response.del_cookie(self.cookie_name(r), path="/")
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

    async def metrics(self, _r: web.Request) -> web.Response:
        """Prometheus text: every named ledger's segments, end and position cursors' lag."""
        body = metrics_text(await self.console.name_lags())
        return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def storage(self, r: web.Request) -> web.Response:
        data = await self.console.storage_page()
        return self.render(r, "storage.html.j2", "storage", "Storage & GC", **data)

    async def recovery(self, r: web.Request) -> web.Response:
        data = await self.console.recovery_page()
        return self.render(r, "recovery.html.j2", "recovery", "Recovery", **data)

    # -- actions --------------------------------------------------------------------------
    def _may_act(self, r: web.Request) -> web.Response | None:
        if self.console.read_only:
            return self.error(r, 403, "the console is read-only: start it with --admin-token-file to enable actions")
        session: Session | None = r.get(SESSION_KEY)
        if session is None or not session.admin:
            who = f"{session.subject!r} (roles {list(session.roles)})" if session else "nobody"
            return self.error(r, 403, f"you are logged in as {who}: actions need the admin role")
        return None

    def _action(self, r: web.Request) -> Any:
        action = ACTIONS.get(r.match_info["action"])
        if action is None:
            raise web.HTTPNotFound(reason=f"no action {r.match_info['action']!r}")
        return action

    async def confirm(self, r: web.Request) -> web.Response:
        action = self._action(r)
        target = r.query.get("target") or None
        back = _safe_back(r.query.get("back"))
        refused = self._may_act(r)
        if refused is not None:
            return refused
        return self.render(r, "confirm.html.j2", "", "Confirm: " + action.title, action=action, target=target,
                           back=back, description=describe(action, target))

    async def perform(self, r: web.Request) -> web.Response:
        action = self._action(r)
        form = await r.post()
        back = _safe_back(str(form.get("back") or ""))
        refused = self._may_act(r)
        if refused is not None:
            return refused
        if form.get("confirm") != "yes":
            return _see_other(back)
        target = str(form.get("target") or "") or None
        views, _ur = await self.console.bookies(with_gc=False)
        try:
            outcome = await run_action(self.console.http, action, target, views)
        except ActionRefused as e:
            return self.render(r, "result.html.j2", "", "Action refused", status=502, ok=False, message=str(e),
                               back=back, description=describe(action, target))
        if action.name == "decommission" and target:
            self.console.decommissioning[target] = time.time()
        session = r[SESSION_KEY]
        assert session is not None  # _may_act
        log.info("console action %s on %s by %s: %s", action.name, target, session.subject, outcome)
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
    """A path of the console to go back to, never another site: browsers drop tabs and line
    breaks from a URL and read ``\\`` as ``/``, so ``/<TAB>/evil.example`` and ``/\\evil.example``
    both mean ``//evil.example``. Anything but a plain absolute path is ``/cluster``."""
    if not raw:
        return "/cluster"
    cleaned = "".join(c for c in raw if c not in "\t\n\r")
    parts = urlsplit(cleaned)
    if (not cleaned.startswith("/") or cleaned.startswith(("//", "/\\")) or "\\" in cleaned
            or parts.scheme or parts.netloc or any(ord(c) < 0x20 or ord(c) == 0x7F for c in cleaned)):
        return "/cluster"
    return cleaned


def _see_other(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": location})


def _plain(status: int, text: str) -> web.Response:
    """A refusal that shows nothing of the cluster (the asker may be another site's script)."""
    return web.Response(status=status, text=text + "\n", content_type="text/plain", charset="utf-8")


def _local_address(request: web.Request) -> tuple[str, int]:
    """The console's own address and port this request arrived on."""
    sockname = request.transport.get_extra_info("sockname") if request.transport is not None else None
    if isinstance(sockname, tuple) and len(sockname) >= 2:
        return str(sockname[0]), int(sockname[1])
    return "", 0


def build_app(console: ClusterConsole, *, listen_host: str = "127.0.0.1") -> web.Application:
    ui = ConsoleApp(console, listen_host=listen_host)
    app = web.Application(middlewares=[ui.middleware], client_max_size=64 * 1024)
    app[CONSOLE_KEY] = console
    app.add_routes([
        web.get("/", ui.index),
        web.get("/healthz", ui.healthz),
        web.get("/login", ui.login_form),
        web.post("/login", ui.login),
        web.post("/logout", ui.logout),
        web.get("/cluster", ui.cluster),
        web.get("/ledgers", ui.ledgers),
        web.get(r"/ledgers/{ledger_id}", ui.ledger),
        web.get("/names", ui.names),
        web.get(r"/names/{name:.+}", ui.name),
        web.get("/storage", ui.storage),
        web.get(METRICS_PATH, ui.metrics),
        web.get("/recovery", ui.recovery),
        web.get("/actions/{action}", ui.confirm),
        web.post("/actions/{action}", ui.perform),
        web.static("/static", STATIC_DIR, append_version=False),
    ])
    return app
