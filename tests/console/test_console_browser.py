"""The operator console in a real browser (Debian's chromium through Selenium and its
chromedriver; nothing downloaded) against a real local cluster of three bookie processes
whose admin HTTP API is https (certificates from a CA made here) and verifies tokens.

One cluster and one console for the module (tests run in file order and build on each other's
state): the console asks for a login and the browser logs in with a token (the session cookie
is out of the page's reach, each session has its own anti-forgery token); every page loads
with no browser console error; what the pages show equals what the
shell prints; a read-only bookie is marked; a forced GC from the console (with the admin token)
reclaims a deleted ledger's entry log and the storage page shows it; a killed bookie shows as
down within one refresh of the open page; a console without a token offers no action and one
with a wrong token reports the bookie's refusal; HTML in custom metadata is shown, never run.
The last test takes the screenshots of docs/console.md (1280x800; written there only with
VELLUM_UPDATE_SCREENSHOTS=1) and checks phone width.
No timing is asserted beyond "within one refresh".
"""

from __future__ import annotations

import json
import os
import re
import shutil
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from vellum.cli.main import cli
from vellum.client.blocking import BookKeeper
from vellum.client.named_blocking import NamedLedgers, OpenMode
from vellum.console.cluster import ConsoleSettings
from vellum.console.server import ConsoleThread
from vellum.security import pki, tokens
from vellum.testing.local_cluster import LocalCluster

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import TimeoutException  # noqa: E402
from selenium.webdriver.chrome.options import Options  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

REFRESH_S = 2.0
#: docs/console.md's screenshots: rewritten only when asked (VELLUM_UPDATE_SCREENSHOTS=1), so a
#: test run leaves the checkout as it found it; otherwise they go to a temporary directory.
DOC_SHOTS = Path(__file__).resolve().parents[2] / "docs" / "console"
XSS = "<img src=x onerror=\"window.__pwned=1\"><script>window.__pwned=1</script>"


def _browser_paths() -> tuple[str, str] | None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    paths = _browser_paths()
    if paths is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("CI requires Debian's chromium and chromium-driver (./run installs them)")
        pytest.skip("chromium / chromedriver not installed (./run setup installs them)")
    os.environ.setdefault("SE_OFFLINE", "true")  # never let Selenium Manager fetch anything
    opts = Options()
    opts.binary_location = paths[0]
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,800", "--hide-scrollbars", "--force-device-scale-factor=1"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=opts, service=Service(executable_path=paths[1]))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


class Env:
    def __init__(self, cluster: LocalCluster, console: ConsoleThread, token: str, secret: Path, ca: Path) -> None:
        self.cluster = cluster
        self.console = console
        self.token = token
        self.secret = secret
        self.ca = ca
        self.ledgers: dict[str, int] = {}
        self.name = "tenant/ns/orders"

    @property
    def url(self) -> str:
        return self.console.url

    def bookie_http(self, i: int, path: str, method: str = "GET", body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        url = "https://127.0.0.1:" + self.cluster.http_url(i).rsplit(":", 1)[1]
        req = urllib.request.Request(url + path, data=data, method=method,
                                     headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(req, timeout=10, context=ssl.create_default_context(cafile=str(self.ca))) as resp:
            return json.loads(resp.read().decode())


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    base = tmp_path_factory.mktemp("console")
    secret = tokens.write_secret_file(base / "token-secret")
    token = tokens.TokenSigner.from_secret_file(secret).issue("console-test", ["admin"], ttl_s=3600,
                                                                audience=tokens.ADMIN_AUDIENCE)
    authority = pki.create_ca("Console browser test CA")
    ca = pki.write_ca(authority, base / "ca").cert
    cert = pki.write_certificate(pki.issue_certificate(authority, name="bookie", role="bookie"), base / "bookie",
                                 stem="bookie")
    conf = {"entryLogPerLedgerEnabled": "true", "tokenSecretKeyFile": str(secret), "flushInterval": "500",
            "httpServerTlsEnable": "true", "httpServerKeyStorePath": str(cert.key),
            "httpServerCertificatePath": str(cert.cert)}
    with LocalCluster(base / "cluster", bookies=3, bookie_conf=conf) as cluster:
        settings = ConsoleSettings(cluster.metadata_uri, admin_token=token, refresh_s=REFRESH_S, sample_interval_s=1.0,
                                   http_ca_file=str(ca), token_secret_file=str(secret))
        e = Env(cluster, ConsoleThread(settings, port=0), token, secret, ca)
        _populate(e)
        e.console.start()
        try:
            yield e
        finally:
            e.console.stop()


def _populate(e: Env) -> None:
    with BookKeeper(e.cluster.metadata_uri) as bk:
        for key, custom in (("doomed", {"purpose": b"deleted by the GC test"}), ("kept", {"app": XSS.encode()})):
            lh = bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2, custom_metadata=custom)
            for i in range(60):
                lh.append(f"{key} {i} ".encode() * 40)
            lh.close()
            e.ledgers[key] = lh.ledger_id
        for i in range(5):
            lh = bk.create_ledger(ensemble_size=2, write_quorum_size=2, ack_quorum_size=2,
                                  custom_metadata={"batch": str(i).encode()})
            lh.append(b"small")
            lh.close()
        open_lh = bk.create_ledger(ensemble_size=3, write_quorum_size=3, ack_quorum_size=2)
        for _ in range(12):
            open_lh.append(b"open ledger entry")
        e.ledgers["open"] = open_lh.ledger_id  # left open on purpose: the console reads its LAC
        named = NamedLedgers(bk)
        h = named.open(e.name, OpenMode.CREATE, password=b"pw")
        for i in range(30):
            h.append(f"order {i}".encode())
        h.close()
        version = named.record(e.name).version
        named.set_cursor(e.name, "billing", b"21", version)


def _shell(*args: str) -> Any:
    result = CliRunner().invoke(cli, ["shell", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def _severe_logs(driver: Any) -> list[str]:
    return [f"{x['level']} {x['message']}" for x in driver.get_log("browser") if x["level"] == "SEVERE"]


def _open(driver: Any, url: str) -> None:
    driver.get(url)
    WebDriverWait(driver, 20).until(lambda d: d.execute_script("return document.readyState") == "complete")


def _rows(driver: Any, css: str) -> list[Any]:
    return driver.find_elements(By.CSS_SELECTOR, css)


def _bookie_states(driver: Any) -> dict[str, str]:
    # read in one script: the page swaps its content at each refresh
    states: dict[str, str] = driver.execute_script(
        "const out = {}; document.querySelectorAll('#bookies tbody tr[data-bookie]')"
        ".forEach(r => { out[r.dataset.bookie] = r.dataset.state; }); return out;")
    return states


# --------------------------------------------------------------------------------------- tests


def _csrf(driver: Any) -> str:
    field = driver.find_element(By.CSS_SELECTOR, "form[action='/logout'] input[name='csrf']")
    value: str = field.get_attribute("value")
    return value


def test_login_in_the_browser(env: Env, browser: Any) -> None:
    _open(browser, env.url + "/storage")
    assert "/login" in browser.current_url and browser.find_elements(By.ID, "token")
    assert env.cluster.metadata_uri not in browser.page_source  # nothing of the cluster before a login
    wrong = tokens.TokenSigner.from_secret_file(tokens.write_secret_file(env.secret.parent / "stranger")).issue(
        "stranger", ["admin"], ttl_s=600)
    browser.find_element(By.ID, "token").send_keys(wrong)
    browser.find_element(By.ID, "login").click()
    WebDriverWait(browser, 10).until(lambda d: d.find_elements(By.ID, "login-problem"))
    assert "bad signature" in browser.find_element(By.ID, "login-problem").text
    browser.find_element(By.ID, "token").send_keys(env.token)
    browser.find_element(By.ID, "login").click()
    WebDriverWait(browser, 10).until(lambda d: d.current_url.endswith("/storage"))
    assert browser.find_element(By.ID, "user").text == "console-test"
    assert browser.execute_script("return document.cookie") == ""  # HttpOnly: out of any script's reach
    cookie = browser.get_cookie(f"vellum-console-{env.url.rsplit(':', 1)[1]}")
    assert cookie and cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie.get("expiry")
    # another session (another login) has another anti-forgery token
    mine = _csrf(browser)
    data = urllib.parse.urlencode({"token": env.token}).encode()
    req = urllib.request.Request(env.url + "/login", data=data, method="POST", headers={"Origin": env.url})
    opener = urllib.request.build_opener(_NoRedirect())
    try:
        opener.open(req, timeout=10)
        raise AssertionError("a login answers with a redirect")
    except urllib.error.HTTPError as e:
        assert e.code == 303
        other_cookie = e.headers["Set-Cookie"].split(";", 1)[0]
    with urllib.request.urlopen(urllib.request.Request(env.url + "/cluster", headers={"Cookie": other_cookie}),
                                timeout=10) as resp:
        other = re.search(r'name="csrf" value="([^"]+)"', resp.read().decode())
    assert other and other.group(1) != mine
    browser.get_log("browser")  # the refused login is a 401 page: expected


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *_args: Any, **_kwargs: Any) -> None:
        return None


def test_every_page_loads_without_console_errors(env: Env, browser: Any) -> None:
    time.sleep(2.5)  # two metric scrapes, so the charts draw too
    pages = ["/cluster", "/ledgers", f"/ledgers/{env.ledgers['kept']}", f"/ledgers/{env.ledgers['open']}",
             "/ledgers?q=state:open", "/names", f"/names/{env.name}", "/storage", "/recovery"]
    browser.get_log("browser")  # drop anything from before
    for page in pages:
        _open(browser, env.url + page)
        assert browser.find_element(By.TAG_NAME, "h1").text, page
        assert not browser.find_elements(By.ID, "error"), (page, browser.find_element(By.ID, "error").text)
        assert _severe_logs(browser) == [], page
    # the charts drew (uPlot made canvases) on the cluster page
    _open(browser, env.url + "/cluster")
    WebDriverWait(browser, 10).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".chart canvas"))
    # it refreshes itself: the status line changes without a reload
    before = browser.find_element(By.ID, "refresh-status").text
    WebDriverWait(browser, REFRESH_S * 3).until(lambda d: d.find_element(By.ID, "refresh-status").text != before)
    assert _severe_logs(browser) == []


def test_numbers_match_the_shell(env: Env, browser: Any) -> None:
    uri = env.cluster.metadata_uri
    writable = {r["bookie id"] for r in _shell("listbookies", "--uri", uri, "--json")}
    _open(browser, env.url + "/cluster")
    states = _bookie_states(browser)
    assert {b for b, s in states.items() if s == "writable"} == writable == set(env.cluster.bookie_ids)
    info = _shell("clusterinfo", "--uri", uri, "--json")
    assert browser.find_element(By.ID, "ledger-count").text == str(info["ledgers"])

    listed = _shell("listledgers", "--uri", uri, "--json", "--limit", "50")["ledgers"]
    _open(browser, env.url + "/ledgers")
    shown = [int(td.text) for td in _rows(browser, "#ledgers .ledger-id")]
    assert shown == listed

    for key in ("kept", "open"):
        md = _shell("ledgermetadata", str(env.ledgers[key]), "--uri", uri, "--json")
        _open(browser, env.url + f"/ledgers/{env.ledgers[key]}")
        assert browser.find_element(By.ID, "ledger-state").text == md["state"]
        if md["state"] == "CLOSED":
            assert browser.find_element(By.ID, "last-entry").text == str(md["lastEntryId"])
        else:  # what the client's non-recovery open learns from the bookies
            with BookKeeper(uri) as bk:
                lac = bk.open_ledger(env.ledgers[key], recovery=False).last_add_confirmed
            assert browser.find_element(By.ID, "lac").text == str(lac)
            assert browser.find_element(By.ID, "last-entry").text == "11"  # 12 appends stored
        statuses = [td.text for td in _rows(browser, ".replica-status")]
        assert statuses and all(s == "holds every entry" for s in statuses), statuses

    name = _shell("name", env.name, "--uri", uri, "--json")
    _open(browser, env.url + f"/names/{env.name}")
    assert browser.find_element(By.ID, "name-start").text == str(name["startEntryId"])
    assert browser.find_element(By.ID, "name-last").text == str(name["lastEntryId"])
    lag = browser.find_element(By.CSS_SELECTOR, "#cursors tbody td:last-child").text
    assert lag == str(name["lastEntryId"] - 21)


def test_html_in_custom_metadata_is_shown_not_run(env: Env, browser: Any) -> None:
    _open(browser, env.url + f"/ledgers/{env.ledgers['kept']}")
    assert XSS in browser.find_element(By.CSS_SELECTOR, ".kvtable td").text
    _open(browser, env.url + "/ledgers?q=app")
    assert XSS in browser.find_element(By.CSS_SELECTOR, "#ledgers .custom").text
    assert browser.execute_script("return window.__pwned || 0") == 0
    _open(browser, env.url + "/ledgers/123456789")
    assert "123456789" in browser.find_element(By.ID, "error").text
    _open(browser, env.url + "/ledgers/not-a-number")
    assert "integer" in browser.find_element(By.ID, "error").text
    browser.get_log("browser")  # the 404 and 400 answers above are expected


def test_read_only_bookie_is_marked(env: Env, browser: Any) -> None:
    bookie = env.cluster.bookie_ids[1]
    assert env.bookie_http(1, "/api/v1/bookie/state/readonly", "PUT", {"readOnly": True}) == {"readOnly": True}
    uri = env.cluster.metadata_uri
    env.cluster.wait_until(lambda: bookie in env.cluster.registered()[1], what="read-only registration")
    _open(browser, env.url + "/cluster")
    WebDriverWait(browser, REFRESH_S + 3).until(lambda d: _bookie_states(d).get(bookie) == "read-only")
    read_only = {r["bookie id"] for r in _shell("listbookies", "--uri", uri, "--json", "--readonly")}
    assert {b for b, s in _bookie_states(browser).items() if s == "read-only"} == read_only == {bookie}


def _force_gc_everywhere(env: Env) -> None:
    for i in range(3):
        env.bookie_http(i, "/api/v1/bookie/gc", "PUT", {})


def _logs_with(env: Env, i: int, ledger_id: int) -> list[dict[str, Any]]:
    return [lg for lg in env.bookie_http(i, "/api/v1/bookie/entrylogs")
            if not lg.get("active") and str(ledger_id) in (lg.get("ledgerBytes") or {})]


def test_forced_gc_from_the_console_reclaims_a_deleted_ledger(env: Env, browser: Any) -> None:
    doomed = env.ledgers["doomed"]
    holders = list(range(3))  # E=3: every bookie holds part of it
    # A first pass makes the sealed per-ledger logs visible (as of the last GC pass).
    def sealed_everywhere() -> bool:
        _force_gc_everywhere(env)
        time.sleep(0.3)
        return all(_logs_with(env, i, doomed) for i in holders)
    env.cluster.wait_until(sealed_everywhere, timeout_s=30, what="the doomed ledger's logs sealed and listed")
    _open(browser, env.url + "/storage")
    card = browser.find_element(By.CSS_SELECTOR, f".storage-card[data-bookie='{env.cluster.bookie_ids[0]}']")
    reclaimed_before = int(card.find_element(By.CSS_SELECTOR, ".reclaimed").get_attribute("data-bytes"))
    log_ids = [lg["logId"] for lg in _logs_with(env, 0, doomed)]
    assert all(card.find_elements(By.CSS_SELECTOR, f"tr[data-log='{lid}']") for lid in log_ids)

    result = CliRunner().invoke(cli, ["shell", "deleteledger", str(doomed), "--uri", env.cluster.metadata_uri, "--yes"])
    assert result.exit_code == 0, result.output
    _open(browser, env.url + "/storage")
    card = browser.find_element(By.CSS_SELECTOR, f".storage-card[data-bookie='{env.cluster.bookie_ids[0]}']")
    why = card.find_element(By.CSS_SELECTOR, f"tr[data-log='{log_ids[0]}'] .why").text
    assert "no live ledger left" in why

    # Force GC from the console: the button, the confirmation page, the bookie's answer.
    card.find_element(By.XPATH, ".//button[contains(., 'Force GC')]").click()
    WebDriverWait(browser, 10).until(lambda d: d.find_elements(By.ID, "confirm"))
    assert env.cluster.bookie_ids[0] in browser.find_element(By.ID, "confirm-h").text
    browser.find_element(By.ID, "confirm").click()
    WebDriverWait(browser, 10).until(lambda d: d.find_elements(By.ID, "result"))
    assert "Triggered GC on BookieServer" in browser.find_element(By.ID, "result").text
    browser.find_element(By.ID, "back").click()

    def reclaimed_shown(d: Any) -> bool:
        c = d.find_element(By.CSS_SELECTOR, f".storage-card[data-bookie='{env.cluster.bookie_ids[0]}']")
        gone = not any(c.find_elements(By.CSS_SELECTOR, f"tr[data-log='{lid}']") for lid in log_ids)
        return gone and int(c.find_element(By.CSS_SELECTOR, ".reclaimed").get_attribute("data-bytes")) > reclaimed_before

    WebDriverWait(browser, 30).until(reclaimed_shown)  # the page refreshes itself until GC is done
    assert not _logs_with(env, 0, doomed)
    assert _severe_logs(browser) == []


def test_killed_bookie_shows_down_within_one_refresh(env: Env, browser: Any) -> None:
    victim = env.cluster.bookie_ids[2]
    _open(browser, env.url + "/cluster")
    assert _bookie_states(browser)[victim] == "writable"
    env.cluster.kill(2)
    killed_at = time.monotonic()
    try:
        WebDriverWait(browser, REFRESH_S + 1.5, poll_frequency=0.1).until(
            lambda d: _bookie_states(d).get(victim) == "down")
    except TimeoutException:
        pytest.fail(f"{victim} not shown as down {time.monotonic() - killed_at:.1f}s after the kill "
                    f"(refresh every {REFRESH_S}s): {_bookie_states(browser)}")
    _open(browser, env.url + "/recovery")
    assert browser.find_elements(By.CSS_SELECTOR, f"#lost tr[data-bookie='{victim}']")


def test_console_without_token_or_with_a_wrong_one(env: Env, browser: Any) -> None:
    uri = env.cluster.metadata_uri
    ro = ConsoleThread(ConsoleSettings(uri, refresh_s=REFRESH_S), port=0)
    other_secret = tokens.write_secret_file(env.secret.parent / "other-secret")
    wrong = ConsoleThread(ConsoleSettings(uri, admin_token=tokens.TokenSigner.from_secret_file(other_secret).issue(
        "intruder", ["admin"], ttl_s=600), refresh_s=REFRESH_S, http_ca_file=str(env.ca)), port=0)
    ro.start()
    wrong.start()
    try:
        _open(browser, ro.url + "/storage")
        assert "Read-only" in browser.find_element(By.CSS_SELECTOR, ".mode").text
        assert not browser.find_elements(By.CSS_SELECTOR, "button.action")
        _open(browser, ro.url + "/actions/gc?target=*")
        assert "read-only" in browser.find_element(By.ID, "error").text

        _open(browser, wrong.url + "/cluster")
        browser.find_element(By.XPATH, "//button[contains(., 'Force GC')]").click()
        WebDriverWait(browser, 10).until(lambda d: d.find_elements(By.ID, "confirm"))
        browser.find_element(By.ID, "confirm").click()
        WebDriverWait(browser, 10).until(lambda d: d.find_elements(By.ID, "result"))
        assert "refused the console's admin token" in browser.find_element(By.ID, "result").text
    finally:
        _open(browser, env.url + "/cluster")  # leave the consoles about to stop
        ro.stop()
        wrong.stop()
    browser.get_log("browser")  # the refused action is a 502 page: expected, not a page error


def _traffic(uri: str, stop: threading.Event) -> None:
    """Adds and reads (on the one bookie still writable), so the rate charts have something to show."""
    with BookKeeper(uri) as bk:
        lh = bk.create_ledger(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1,
                              custom_metadata={"purpose": b"screenshot traffic"})
        n = 0
        while not stop.is_set():
            lh.append(b"traffic " * 16)
            n += 1
            if n % 4 == 0:
                lh.read(max(0, n - 4), n - 2)
            time.sleep(0.004)
        lh.close()


def test_screenshots_and_phone_width(env: Env, browser: Any, tmp_path: Path) -> None:
    shots = DOC_SHOTS if os.environ.get("VELLUM_UPDATE_SCREENSHOTS") == "1" else tmp_path
    shots.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    traffic = threading.Thread(target=_traffic, args=(env.cluster.metadata_uri, stop), daemon=True)
    traffic.start()
    try:
        time.sleep(4)  # a few scrapes with traffic
        _take_screenshots(env, browser, shots)
    finally:
        stop.set()
        traffic.join(30)


def _take_screenshots(env: Env, browser: Any, shots: Path) -> None:
    pages = {"cluster": "/cluster", "ledgers": "/ledgers", "ledger": f"/ledgers/{env.ledgers['kept']}",
             "names": "/names", "named-ledger": f"/names/{env.name}", "storage": "/storage", "recovery": "/recovery"}
    browser.set_window_size(1280, 800)
    for key, path in pages.items():
        _open(browser, env.url + path)
        time.sleep(0.3)  # charts draw after load
        assert browser.save_screenshot(str(shots / f"{key}.png"))
    browser.set_window_size(390, 844)
    try:
        for path in pages.values():
            _open(browser, env.url + path)
            overflow = browser.execute_script(
                "return document.documentElement.scrollWidth - document.documentElement.clientWidth")
            assert overflow <= 1, (path, overflow)
    finally:
        browser.set_window_size(1280, 800)
    assert _severe_logs(browser) == []
