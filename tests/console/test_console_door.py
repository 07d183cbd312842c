"""Who may use the console, and where its admin token goes, on real processes: a real console
server (``ConsoleThread``), two real bookie processes whose admin HTTP is https (certificates
from a CA made here with ``vellum.security.pki``) and verifies tokens, also for reads
(``httpServerTokenRequiredForReads``), and a rogue: a bookie registration written into the
metadata store that points at a plain-http listener this test runs on 127.0.0.1 and that
records every header it gets (and answers 401, the answer that tempts a client to retry with
its token).

* a page without a session leads to the login page, an action without one is refused; a login
  with a token gives an HttpOnly, SameSite=Strict, expiring cookie (Secure with its __Host-
  name over https); each session has its own anti-forgery token, and another session's is
  refused;
* a foreign ``Host`` (DNS rebinding) gets 421, a change with a foreign or no ``Origin`` 403;
* ``back=`` never leads to another site;
* the rogue never receives a token, from the console's background polls, pages or actions, nor
  from ``spark gc-report``'s --http path or ``shell gc``; the real https bookies get it only
  where a call needs it;
* custom metadata under a secret key is redacted on every page and cannot be searched for;
* reprs never show the admin token; a console with an admin token and no login does not
  listen beyond loopback.
"""

from __future__ import annotations

import http.client
import json
import re
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import pytest
from click.testing import CliRunner

from vellum.cli.main import cli
from vellum.client.blocking import BookKeeper
from vellum.console.access import Sessions
from vellum.console.app import _safe_back
from vellum.console.bookies import AdminHttp
from vellum.console.cluster import ConsoleSettings
from vellum.console.server import ConsoleServer, ConsoleThread
from vellum.errors import ConfigError
from vellum.ids import BookieId
from vellum.meta import open_metadata_store
from vellum.security import pki, tokens
from vellum.security.admin_http_client import AdminHttpAccess, AdminHttpCallError
from vellum.testing.local_cluster import LocalCluster

SECRET_VALUE = "hunter2-do-not-show"


class Rogue(ThreadingHTTPServer):
    """A plain-http listener that records what it is sent and answers 401 to everything."""

    daemon_threads = True

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str | None]] = []
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _RogueHandler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def requests(self) -> list[tuple[str, str, str | None]]:
        with self.lock:
            return list(self.seen)


class _RogueHandler(BaseHTTPRequestHandler):
    server: Rogue

    def _any(self) -> None:
        with self.server.lock:
            self.server.seen.append((self.command, self.path, self.headers.get("Authorization")))
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        body = b'{"error": "this call needs a token"}'
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PUT = do_POST = do_DELETE = _any

    def log_message(self, *_args: Any) -> None:
        pass


class Env:
    def __init__(self, base: Path) -> None:
        self.base = base
        ca = pki.create_ca("Console test CA")
        self.ca_files = pki.write_ca(ca, base / "ca")
        self.bookie_cert = pki.write_certificate(pki.issue_certificate(ca, name="bookie", role="bookie"),
                                                 base / "bookie", stem="bookie")
        self.console_cert = pki.write_certificate(pki.issue_certificate(ca, name="console", role="bookie"),
                                                  base / "console-cert", stem="console")
        self.admin_cert = pki.write_certificate(pki.issue_certificate(ca, name="root", role="admin"),
                                                base / "admin-cert", stem="admin")
        self.client_cert = pki.write_certificate(pki.issue_certificate(ca, name="alice", role="client"),
                                                 base / "client-cert", stem="client")
        self.secret = tokens.write_secret_file(base / "token-secret")
        self.signer = tokens.TokenSigner.from_secret_file(self.secret)
        self.admin_token = self.signer.issue("console", ["admin"], ttl_s=3600, audience=tokens.ADMIN_AUDIENCE)
        self.token_file = base / "admin.jwt"
        self.token_file.write_text(self.admin_token + "\n")
        self.rogue = Rogue()
        self.cluster: LocalCluster
        self.console: ConsoleThread
        self.rogue_id = f"127.0.0.1:{self.rogue.server_address[1]}"

    @property
    def ca(self) -> str:
        return str(self.ca_files.cert)

    @property
    def port(self) -> int:
        return int(urlsplit(self.console.url).port or 0)

    def settings(self, **kw: Any) -> ConsoleSettings:
        base: dict[str, Any] = dict(admin_token=self.admin_token, http_ca_file=self.ca, refresh_s=1.0,
                                    sample_interval_s=0.3, token_secret_file=str(self.secret))
        return ConsoleSettings(self.cluster.metadata_uri, **{**base, **kw})

    def https(self, i: int) -> str:
        return "https://127.0.0.1:" + self.cluster.http_url(i).rsplit(":", 1)[1]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    e = Env(tmp_path_factory.mktemp("door"))
    conf = {"tokenSecretKeyFile": str(e.secret), "httpServerTlsEnable": "true",
            "httpServerKeyStorePath": str(e.bookie_cert.key), "httpServerCertificatePath": str(e.bookie_cert.cert),
            "httpServerTokenRequiredForReads": "true"}
    threading.Thread(target=e.rogue.serve_forever, name="rogue", daemon=True).start()
    try:
        with LocalCluster(e.base / "cluster", bookies=2, bookie_conf=conf) as cluster:
            e.cluster = cluster
            with open_metadata_store(cluster.metadata_uri) as store:
                # the forged registration: anyone who can write to the metadata store can do this
                store.registration.register_bookie(BookieId(e.rogue_id), data=json.dumps(
                    {"httpAddress": e.rogue.url}).encode())
                e.console = ConsoleThread(e.settings(), port=0)
                e.console.start()
                try:
                    yield e
                finally:
                    e.console.stop()
    finally:
        e.rogue.shutdown()
        e.rogue.server_close()


# ------------------------------------------------------------------------------------ helpers


class Answer:
    def __init__(self, status: int, headers: http.client.HTTPMessage, body: str) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def cookies(self) -> list[str]:
        return self.headers.get_all("Set-Cookie") or []


def request(port: int, method: str, path: str, *, host: str | None = None, origin: str | None = None,
            cookie: str | None = None, form: dict[str, str] | None = None, https: bool = False,
            cert: pki.CertificateFiles | None = None) -> Answer:
    if https:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        if cert is not None:
            ctx.load_cert_chain(str(cert.cert), str(cert.key))
        conn: http.client.HTTPConnection = http.client.HTTPSConnection("127.0.0.1", port, timeout=30, context=ctx)
    else:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Host": host or f"127.0.0.1:{port}"}
    if origin is not None:
        headers["Origin"] = origin
    if cookie:
        headers["Cookie"] = cookie
    body = None
    if form is not None:
        body = urlencode(form)
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return Answer(resp.status, resp.headers, resp.read().decode("utf-8", "replace"))
    finally:
        conn.close()


class Login:
    def __init__(self, cookie: str, csrf: str) -> None:
        self.cookie = cookie
        self.csrf = csrf


def login(port: int, token: str, *, https: bool = False) -> tuple[Login, Answer]:
    scheme = "https" if https else "http"
    answer = request(port, "POST", "/login", origin=f"{scheme}://127.0.0.1:{port}", https=https,
                     form={"token": token, "back": "/storage"})
    assert answer.status == 303, (answer.status, answer.body)
    cookie = answer.cookies()[0].split(";", 1)[0]
    page = request(port, "GET", "/recovery", cookie=cookie, https=https)  # its logout form carries it
    assert page.status == 200, page.body
    match = re.search(r'name="csrf" value="([^"]+)"', page.body)
    assert match, page.body
    return Login(cookie, match.group(1)), answer


def wait_for(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.1)


# -------------------------------------------------------------------------------------- tests


def test_pages_need_a_login_and_a_login_gives_a_strict_session(env: Env) -> None:
    port = env.port
    here = f"http://127.0.0.1:{port}"
    page = request(port, "GET", "/cluster")
    assert page.status == 303 and page.headers["Location"] == "/login?back=%2Fcluster"
    form = request(port, "GET", "/login")
    assert form.status == 200 and 'name="token"' in form.body and env.cluster.metadata_uri not in form.body
    refused = request(port, "POST", "/actions/gc", origin=here, form={"target": "*", "confirm": "yes"})
    assert refused.status == 403 and "log in" in refused.body

    other_key = tokens.write_secret_file(env.base / "other-secret")
    for bad, why in ((tokens.TokenSigner.from_secret_file(other_key).issue("x", ["admin"]), "bad signature"),
                     ("not-a-token", "malformed")):
        answer = request(port, "POST", "/login", origin=here, form={"token": bad})
        assert answer.status == 401 and why in answer.body and not answer.cookies()

    session, answer = login(port, env.admin_token)
    assert answer.headers["Location"] == "/storage"
    cookie = answer.cookies()[0].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "max-age=" in cookie and "path=/" in cookie
    assert request(port, "GET", "/cluster", cookie=session.cookie).status == 200
    # a second login is another session, with its own anti-forgery token
    other, _ = login(port, env.signer.issue("second", ["admin"], ttl_s=600, audience=tokens.ADMIN_AUDIENCE))
    assert other.csrf != session.csrf and other.cookie != session.cookie
    crossed = request(port, "POST", "/actions/gc", origin=here, cookie=session.cookie,
                      form={"csrf": other.csrf, "target": "*", "confirm": "yes"})
    assert crossed.status == 403 and "stale or came from another site" in crossed.body
    # logout ends the session
    out = request(port, "POST", "/logout", origin=here, cookie=other.cookie, form={"csrf": other.csrf})
    assert out.status == 303 and request(port, "GET", "/cluster", cookie=other.cookie).status == 303
    # a login without the admin role may look, not act
    viewer, _ = login(port, env.signer.issue("viewer", ["client"], ttl_s=600, audience=tokens.ADMIN_AUDIENCE))
    page = request(port, "GET", "/actions/gc?target=*", cookie=viewer.cookie)
    assert page.status == 403 and "admin role" in page.body


def test_a_foreign_host_or_origin_is_refused(env: Env) -> None:
    port = env.port
    here = f"http://127.0.0.1:{port}"
    session, _ = login(port, env.admin_token)
    # DNS rebinding: the browser sends the attacker's name as Host, with the console's cookie
    for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1:{port + 1}", f"localhost.evil.example:{port}"):
        answer = request(port, "GET", "/cluster", host=host, cookie=session.cookie)
        assert answer.status == 421 and env.cluster.metadata_uri not in answer.body, host
        answer = request(port, "POST", "/actions/autorecovery-disable", host=host, origin=f"http://{host}",
                         cookie=session.cookie, form={"csrf": session.csrf, "confirm": "yes"})
        assert answer.status == 421, host
    assert request(port, "GET", "/cluster", host=f"localhost:{port}", cookie=session.cookie).status == 200
    form = {"csrf": session.csrf, "confirm": "yes"}
    for origin in ("http://evil.example", f"http://evil.example:{port}", "null", None, f"http://127.0.0.1:{port + 1}"):
        answer = request(port, "POST", "/actions/autorecovery-disable", origin=origin, cookie=session.cookie, form=form)
        assert answer.status == 403 and "Origin" in answer.body, origin
    # nothing above reached the cluster: re-replication is still enabled
    from vellum.admin import recovery_admin

    with open_metadata_store(env.cluster.metadata_uri) as store:
        assert recovery_admin.status(store) is True
    ok = request(port, "POST", "/actions/autorecovery-enable", origin=here, cookie=session.cookie, form=form)
    assert ok.status == 200 and 'id="result"' in ok.body and "done through" in ok.body, ok.body


@pytest.mark.parametrize("attack", ["/\t/evil.example", "//evil.example", "/\\evil.example", "/\n/evil.example",
                                    "https://evil.example/", "javascript:alert(1)", "\t//evil.example",
                                    "/\r\n/evil.example", "evil.example", "/%09/x\\y"])
def test_back_never_leads_to_another_site(attack: str) -> None:
    assert _safe_back(attack) == "/cluster"


def test_back_keeps_a_path_of_the_console(env: Env) -> None:
    port = env.port
    session, _ = login(port, env.admin_token)
    assert _safe_back("/storage?x=1#y") == "/storage?x=1#y"
    confirm = request(port, "GET", "/actions/gc?" + urlencode({"target": "*", "back": "/\t/evil.example"}),
                      cookie=session.cookie)
    assert confirm.status == 200 and "evil.example" not in confirm.body
    cancelled = request(port, "POST", "/actions/gc", origin=f"http://127.0.0.1:{port}", cookie=session.cookie,
                        form={"csrf": session.csrf, "back": "/\t/evil.example", "confirm": "no"})
    assert cancelled.status == 303 and cancelled.headers["Location"] == "/cluster"
    back = request(port, "GET", "/login?" + urlencode({"back": "/\\evil.example"}), cookie=session.cookie)
    assert back.status == 303 and back.headers["Location"] == "/cluster"


def test_a_rogue_registration_never_receives_a_token(env: Env) -> None:
    port = env.port
    here = f"http://127.0.0.1:{port}"
    session, _ = login(port, env.admin_token)
    # the background sampler polls every 0.3 s; pages and actions call the bookies too
    wait_for(lambda: sum(1 for _m, p, _a in env.rogue.requests() if p == "/metrics") >= 3, 20, "rogue polled")
    for page in ("/cluster", "/storage", "/recovery"):
        assert request(port, "GET", page, cookie=session.cookie).status == 200
    cluster = request(port, "GET", "/cluster", cookie=session.cookie).body
    assert "no actions here" in cluster and "is plain http" in cluster  # the page says why, before any click
    refused = request(port, "POST", "/actions/gc", origin=here, cookie=session.cookie,
                      form={"csrf": session.csrf, "target": env.rogue_id, "confirm": "yes"})
    assert refused.status == 502 and "plain http" in refused.body, refused.body
    # the real bookies (https, certificate verified with the CA) get it where a call needs it
    real = env.cluster.bookie_ids[0]
    done = request(port, "POST", "/actions/gc", origin=here, cookie=session.cookie,
                   form={"csrf": session.csrf, "target": real, "confirm": "yes"})
    assert done.status == 200 and "Triggered GC" in done.body, done.body
    every = request(port, "POST", "/actions/gc", origin=here, cookie=session.cookie,
                    form={"csrf": session.csrf, "target": "*", "confirm": "yes"})
    assert every.status == 200 and every.body.count("Triggered GC") == 2 and "not done" in every.body, every.body
    # a cluster-wide switch goes through a bookie the token may go to, even when the rogue is listed first
    import asyncio

    from vellum.console.actions import ACTIONS, run_action
    from vellum.console.bookies import WRITABLE, BookieView

    async def switch() -> str:
        http = AdminHttp(token=env.admin_token, ca_file=env.ca)
        try:
            views = [BookieView(env.rogue_id, env.rogue.url, WRITABLE, WRITABLE),
                     BookieView(real, env.https(0), WRITABLE, WRITABLE)]
            return await run_action(http, ACTIONS["autorecovery-enable"], None, views)
        finally:
            await http.close()

    assert f"done through {real}" in asyncio.run(switch())
    storage = request(port, "GET", "/storage", cookie=session.cookie).body
    assert all(f'data-bookie="{b}"' in storage for b in env.cluster.bookie_ids)

    # gc-report's --http path over the registered addresses, and the shell, with the admin token
    from vellum.spark.jobs import discover_http_urls, gc_report

    urls = discover_http_urls(env.cluster.metadata_uri)
    assert urls[env.rogue_id] == env.rogue.url
    access = AdminHttpAccess.from_files(str(env.token_file), env.ca)
    with pytest.raises(AdminHttpCallError, match="plain http"):
        gc_report(None, metadata_uri=env.cluster.metadata_uri, http_urls=list(urls.values()), access=access)
    rows = gc_report(None, metadata_uri=env.cluster.metadata_uri, access=access,
                     http_urls=[env.https(i) for i in range(2)])  # reads that need a token get it
    assert all(r["source"] == "http" for r in rows)
    result = CliRunner().invoke(cli, ["shell", "gc", "--http", env.rogue.url, "--admin-token-file", str(env.token_file),
                                      "--http-ca-file", env.ca], env={"VELLUM_ADMIN_TOKEN_FILE": None})
    assert result.exit_code != 0 and "plain http" in result.output, result.output

    seen = env.rogue.requests()
    assert len(seen) >= 5 and {m for m, _p, _a in seen} >= {"GET"}
    assert [a for _m, _p, a in seen if a] == [], "the rogue registration received a token"


def test_no_token_to_https_without_the_clusters_ca(env: Env) -> None:
    """An https listener whose certificate the system's CAs would vouch for (here: a context that
    trusts it, without --http-ca-file) is not a verified bookie: no token goes there either."""
    import asyncio

    rogue = Rogue()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(str(env.bookie_cert.cert), str(env.bookie_cert.key))
    rogue.socket = server_ctx.wrap_socket(rogue.socket, server_side=True)
    threading.Thread(target=rogue.serve_forever, name="tls-rogue", daemon=True).start()
    url = rogue.url.replace("http://", "https://")
    trusting = ssl.create_default_context(cafile=env.ca)  # verifies, but is not the cluster CA setting
    try:
        access = AdminHttpAccess(token=env.admin_token, ssl_context=trusting)
        with pytest.raises(AdminHttpCallError, match="--http-ca-file"):
            access.call(url, "/api/v1/bookie/gc", "PUT", {})
        with pytest.raises(AdminHttpCallError, match=r"HTTP 401.*the token was not sent.*--http-ca-file"):
            access.call(url, "/api/v1/bookie/entrylogs")
        result = CliRunner().invoke(cli, ["shell", "gc", "--http", url, "--admin-token-file", str(env.token_file)],
                                    env={"VELLUM_HTTP_CA_FILE": None, "VELLUM_ADMIN_TOKEN_FILE": None})
        assert result.exit_code != 0 and "--http-ca-file" in result.output, result.output

        async def console_calls() -> None:
            http = AdminHttp(token=env.admin_token)
            try:
                with pytest.raises(Exception, match=r"certificate .* was not accepted.*--http-ca-file"):
                    await http.call(url, "/metrics", parse_json=False)
                with pytest.raises(Exception, match="--http-ca-file"):
                    await http.call(url, "/api/v1/bookie/gc", "PUT", {})
            finally:
                await http.close()

        asyncio.run(console_calls())
        seen = rogue.requests()
        assert seen and [a for _m, _p, a in seen if a] == []
    finally:
        rogue.shutdown()
        rogue.server_close()


def test_custom_metadata_under_a_secret_key_is_redacted(env: Env) -> None:
    with BookKeeper(env.cluster.metadata_uri) as bk:
        lh = bk.create_ledger(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1,
                              custom_metadata={"application.password": SECRET_VALUE.encode(), "app": b"orders"})
        lh.append(b"x")
        lh.close()
    port = env.port
    session, _ = login(port, env.admin_token)
    link = f'href="/ledgers/{lh.ledger_id}"'
    for path in (f"/ledgers/{lh.ledger_id}", "/ledgers", "/ledgers?q=orders"):
        page = request(port, "GET", path, cookie=session.cookie)
        assert page.status == 200 and SECRET_VALUE not in page.body and "(redacted)" in page.body, path
    assert link in request(port, "GET", "/ledgers?q=orders", cookie=session.cookie).body
    for guess in (SECRET_VALUE, f"application.password={SECRET_VALUE}"):  # guessing the secret finds nothing
        page = request(port, "GET", "/ledgers?" + urlencode({"q": guess}), cookie=session.cookie)
        assert page.status == 200 and link not in page.body, guess


def test_https_console_sets_a_secure_host_cookie(env: Env) -> None:
    console = ConsoleThread(env.settings(tls_cert_file=str(env.console_cert.cert),
                                         tls_key_file=str(env.console_cert.key)), port=0)
    console.start()
    try:
        assert console.url.startswith("https://")
        port = int(urlsplit(console.url).port or 0)
        session, answer = login(port, env.admin_token, https=True)
        cookie = answer.cookies()[0]
        assert cookie.startswith(f"__Host-vellum-console-{port}=")
        assert "secure" in cookie.lower() and "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()
        assert request(port, "GET", "/cluster", cookie=session.cookie, https=True).status == 200
    finally:
        console.stop()


def test_a_client_certificate_with_the_admin_role_is_a_login(env: Env) -> None:
    console = ConsoleThread(env.settings(token_secret_file="", tls_cert_file=str(env.console_cert.cert),
                                         tls_key_file=str(env.console_cert.key), tls_client_ca_file=env.ca), port=0)
    console.start()
    try:
        port = int(urlsplit(console.url).port or 0)
        here = f"https://127.0.0.1:{port}"
        assert request(port, "GET", "/cluster", https=True, cert=env.admin_cert).status == 303  # a login first
        page = request(port, "GET", "/login", https=True, cert=env.admin_cert)
        assert "Log in as root" in page.body and 'name="token"' not in page.body
        form = {"method": "certificate", "back": "/recovery"}
        for cert, status in ((None, 401), (env.client_cert, 403)):
            answer = request(port, "POST", "/login", https=True, cert=cert, origin=here, form=form)
            assert answer.status == status and not answer.cookies(), answer.body
        answer = request(port, "POST", "/login", https=True, cert=env.admin_cert, origin=here, form=form)
        assert answer.status == 303 and answer.headers["Location"] == "/recovery"
        cookie = answer.cookies()[0].split(";", 1)[0]
        assert request(port, "GET", "/cluster", https=True, cookie=cookie).status == 200
    finally:
        console.stop()


def test_a_loopback_console_without_login_still_has_a_door(env: Env) -> None:
    """No login keys, loopback: each browser gets its own session and anti-forgery token, and
    Host and Origin are checked all the same."""
    console = ConsoleThread(env.settings(token_secret_file=""), port=0)
    console.start()
    try:
        port = int(urlsplit(console.url).port or 0)
        tokens_seen = []
        for _ in range(2):
            page = request(port, "GET", "/actions/gc?target=*")
            assert page.status == 200 and page.cookies()
            match = re.search(r'name="csrf" value="([^"]+)"', page.body)
            assert match
            tokens_seen.append((page.cookies()[0].split(";", 1)[0], match.group(1)))
        assert tokens_seen[0][1] != tokens_seen[1][1]
        cookie, csrf = tokens_seen[0]
        assert request(port, "GET", "/cluster", host=f"evil.example:{port}", cookie=cookie).status == 421
        answer = request(port, "POST", "/actions/gc", origin="http://evil.example", cookie=cookie,
                         form={"csrf": csrf, "target": "*", "confirm": "yes"})
        assert answer.status == 403
        answer = request(port, "POST", "/actions/gc", origin=f"http://127.0.0.1:{port}", cookie=cookie,
                         form={"csrf": tokens_seen[1][1], "target": "*", "confirm": "yes"})
        assert answer.status == 403
    finally:
        console.stop()


def test_sessions_expire_and_the_one_in_use_is_kept() -> None:
    sessions = Sessions(ttl_s=60, max_sessions=3)
    mine = sessions.create("alice", ["admin"], via="token", now=1000.0)
    for i in range(5):  # cookie-less callers (probes, scripts) come and go
        sessions.create(f"probe-{i}", [], via="loopback", now=1000.0)
        assert sessions.get(mine.session_id, now=1001.0) is mine
    assert len(sessions) == 3
    short = sessions.create("bob", ["admin"], via="token", not_after=1010.0, now=1000.0)
    assert short.expires_at == 1010.0 and sessions.get(short.session_id, now=1010.5) is None
    assert sessions.get(mine.session_id, now=1061.0) is None


def test_no_admin_token_beyond_loopback_without_login(env: Env) -> None:
    with pytest.raises(ConfigError, match="no login"):
        ConsoleServer(env.settings(token_secret_file=""), host="0.0.0.0", port=0)
    ConsoleServer(env.settings(token_secret_file="", admin_token=None), host="0.0.0.0", port=0)  # read-only: may


def test_reprs_never_show_the_admin_token(env: Env) -> None:
    token = env.admin_token
    for thing in (env.settings(), AdminHttpAccess(token=token), AdminHttpAccess.from_files(str(env.token_file), env.ca),
                  AdminHttp(token=token)):
        assert token not in repr(thing) and "(redacted)" in repr(thing), type(thing).__name__
