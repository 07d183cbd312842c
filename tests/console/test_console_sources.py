"""The console's parts without a browser: metrics parsing and history, replica arithmetic,
ledger search, the gc-report explanation, admin HTTP calls against bookies that misbehave
(refused, garbage, errors, silence), and pages over a metadata store that is missing or a
bookie that answers garbage: a sentence on the page, never a trace, never a hang."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given
from hypothesis import strategies as st

from vellum.console import replicas
from vellum.console.app import build_app
from vellum.console.bookies import AdminHttp, AdminHttpError, http_address_of
from vellum.console.cluster import (
    ClusterConsole,
    ConsoleSettings,
    LedgerQuery,
    explain_log,
    list_ledgers_page,
)
from vellum.console.promtext import MetricsFormatError, MetricsHistory, parse_metrics
from vellum.ids import BookieId, LedgerId
from vellum.meta import LedgerMetadata, open_metadata_store

T = TypeVar("T")


def run(coro: Awaitable[T], timeout_s: float = 30.0) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout_s)

    return asyncio.run(bounded())


# ----------------------------------------------------------------------------------- pure parts


def test_parse_metrics_sums_labels_and_refuses_garbage() -> None:
    text = ("# TYPE bookie_BOOKIE_ADD_ENTRY_total counter\nbookie_BOOKIE_ADD_ENTRY_total 20.0\n"
            'bookie_RECLAIMED_DELETION_SPACE_BYTES_total{ledgerDir="/a"} 5.0\n'
            'bookie_RECLAIMED_DELETION_SPACE_BYTES_total{ledgerDir="/b"} 7.0\n')
    got = parse_metrics(text)
    assert got["bookie_BOOKIE_ADD_ENTRY_total"] == 20.0
    assert got["bookie_RECLAIMED_DELETION_SPACE_BYTES_total"] == 12.0
    with pytest.raises(MetricsFormatError):
        parse_metrics("<html>not metrics</html> {{{")


def test_history_rates_are_bounded_and_never_negative() -> None:
    h = MetricsHistory(max_samples=3)
    for t, v in [(0, 0.0), (1, 10.0), (2, 30.0), (3, 5.0)]:  # 5.0: the bookie restarted
        h.add("b", float(t), {"adds": v})
    assert len(h.samples("b")) == 3
    assert h.rates("b", "adds") == ([2.0, 3.0], [20.0, 0.0])
    h.forget_except([])
    assert h.samples("b") == []


@given(st.integers(0, 50), st.integers(0, 50), st.integers(1, 6), st.data())
def test_expected_in_matches_striping(a: int, n: int, e: int, data: st.DataObject) -> None:
    wq = data.draw(st.integers(1, e))
    index = data.draw(st.integers(0, e - 1))
    b = a + n
    brute = sum(1 for x in range(a, b + 1) if index in {(x + k) % e for k in range(wq)})
    assert replicas.expected_in(a, b, index, e, wq) == brute


def test_replica_state_finds_missing_entries() -> None:
    seg = replicas.Segment(0, 9, ("a", "b", "c"))
    full = replicas.replica_state(seg, 0, [(0, 9)], 3, 2)
    assert full.complete and full.expected == 7
    gap = replicas.replica_state(seg, 0, [(0, 2), (5, 9)], 3, 2)
    assert gap.missing == 1 and gap.first_missing == (3,)
    assert replicas.segments({0: ("a", "b"), 5: ("a", "c")}, 7) == [
        replicas.Segment(0, 4, ("a", "b")), replicas.Segment(5, 7, ("a", "c"))]


def _md(**kw: Any) -> LedgerMetadata:
    base: dict[str, Any] = dict(ensemble_size=2, write_quorum_size=2, ack_quorum_size=2,
                                ensembles={0: (BookieId("127.0.0.1:1"), BookieId("127.0.0.1:2"))})
    return LedgerMetadata(**{**base, **kw})


def test_ledger_query() -> None:
    q = LedgerQuery.parse("state:open app=orders 17 Billing")
    assert (q.state, q.custom, q.start_id, q.words) == ("OPEN", (("app", "orders"),), 17, ("billing",))
    md = _md(custom_metadata={"app": b"orders", "team": b"Billing-EU"})
    assert q.matches(md)
    assert not q.matches(_md(custom_metadata={"app": b"orders"}))
    assert LedgerQuery.parse("bookie:127.0.0.1:2").matches(md)
    assert not LedgerQuery.parse("bookie:127.0.0.1:9").matches(md)


def test_explain_log() -> None:
    log = {"logId": "a", "ledgerDir": "/d", "totalBytes": 300, "ledgerBytes": {"1": 100, "2": 200}, "active": False}
    pinned = explain_log(log, alive={2})
    assert (pinned["liveBytes"], pinned["deadBytes"], pinned["pinnedBy"]) == (200, 100, [2])
    assert "pinned by live ledger 2" in pinned["why"]
    assert "deleted at the next GC pass" in explain_log(log, alive=set())["why"]
    assert "active" in explain_log({**log, "active": True}, alive={1})["why"]
    held = {**log, "held": "1 live entries cannot be read (ledgers 2)", "corrupt": "1 unreadable span(s)"}
    assert explain_log(held, alive={2})["why"].startswith("held: 1 live entries cannot be read")
    # a log with a skipped span that is not held is collected like any other
    assert "pinned by live ledger 2" in explain_log({**log, "corrupt": "1 unreadable span(s)"}, alive={2})["why"]


def test_ledger_pages_read_only_what_they_show(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    with open_metadata_store(uri) as store:
        store.format()
        for lid in range(1, 121):
            store.ledgers.create_ledger_with_id(LedgerId(lid), _md(custom_metadata={"n": str(lid % 7).encode()}))
        reads = 0
        real = store.ledgers.read_ledger

        def counting(ledger_id: LedgerId) -> Any:
            nonlocal reads
            reads += 1
            return real(ledger_id)

        store.ledgers.read_ledger = counting  # type: ignore[method-assign]
        page = list_ledgers_page(store, LedgerQuery(), after=None, before=None, limit=50)
        assert [r.ledger_id for r in page.rows] == list(range(1, 51)) and page.next_after == 50 and page.total == 120
        assert reads == 50
        last = list_ledgers_page(store, LedgerQuery(), after=100, before=None, limit=50)
        assert [r.ledger_id for r in last.rows] == list(range(101, 121)) and last.next_after is None
        prev = list_ledgers_page(store, LedgerQuery(), after=None, before=101, limit=50)
        assert [r.ledger_id for r in prev.rows] == list(range(51, 101)) and prev.prev_before == 51
        reads = 0
        found = list_ledgers_page(store, LedgerQuery.parse("n=3"), after=None, before=None, limit=50, budget=30,
                                  time_budget_s=60)
        assert reads == 30 and [r.ledger_id for r in found.rows] == [3, 10, 17, 24] and found.scanned_to == 30


# ------------------------------------------------------------------------- misbehaving bookies


async def _serve(handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> TestServer:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


def test_admin_http_errors_are_sentences() -> None:
    async def main() -> None:
        seen: dict[str, str] = {}

        async def handler(r: web.Request) -> web.StreamResponse:
            seen["auth"] = r.headers.get("Authorization", "")
            if r.path == "/garbage":
                return web.Response(text="\x00\x01 not json")
            if r.path == "/error":
                return web.json_response({"error": "no such thing"}, status=500)
            if r.path == "/slow":
                await asyncio.sleep(5)
            return web.json_response({"ok": True})

        server = await _serve(handler)
        base = str(server.make_url("")).rstrip("/")
        http = AdminHttp(token="tok", timeout_s=0.5)
        try:
            assert await http.call(base, "/fine") == {"ok": True}
            assert seen["auth"] == ""  # a read that needs none, and plain http: the token stays home
            with pytest.raises(AdminHttpError, match="plain http"):
                await http.call(base, "/fine", "PUT", {})
            assert seen["auth"] == ""
            with pytest.raises(AdminHttpError, match="not JSON"):
                await http.call(base, "/garbage")
            with pytest.raises(AdminHttpError, match="HTTP 500: no such thing"):
                await http.call(base, "/error")
            t0 = time.monotonic()
            with pytest.raises(AdminHttpError, match="no answer within"):
                await http.call(base, "/slow")
            assert time.monotonic() - t0 < 3
            with pytest.raises(AdminHttpError, match="cannot connect"):
                await http.call("http://127.0.0.1:1", "/x")
        finally:
            await http.close()
            await server.close()

    run(main())
    assert http_address_of(b'{"httpAddress": "http://h:1/"}') == "http://h:1"
    assert http_address_of(b"garbage") is None and http_address_of(b'{"httpAddress": "javascript:x"}') is None


async def _page(console: ClusterConsole, path: str) -> tuple[int, str]:
    client = TestClient(TestServer(build_app(console), host="127.0.0.1"))
    await client.start_server()
    try:
        resp = await client.get(path)
        return resp.status, await resp.text()
    finally:
        await client.close()


def test_missing_store_is_a_message_not_a_trace(tmp_path: Path) -> None:
    async def main() -> None:
        console = ClusterConsole(ConsoleSettings(f"sqlite:///{tmp_path / 'nothing.db'}", meta_timeout_s=1.0))
        await console.start()
        try:
            for path in ("/cluster", "/ledgers", "/ledgers/5", "/names", "/storage", "/recovery"):
                t0 = time.monotonic()
                status, body = await _page(console, path)
                assert status == 503 and "no metadata store at" in body and "Traceback" not in body, path
                assert time.monotonic() - t0 < 5
        finally:
            await console.close()
        assert not (tmp_path / "nothing.db").exists()  # the console never creates a store

    run(main())


def test_bookie_answering_garbage_is_shown_on_the_page(tmp_path: Path) -> None:
    async def main() -> None:
        async def garbage(_r: web.Request) -> web.StreamResponse:
            return web.Response(text="<html>I am not a bookie</html>")

        server = await _serve(garbage)
        uri = f"sqlite:///{tmp_path / 'm.db'}"
        store = open_metadata_store(uri)
        store.format()
        bookie = f"127.0.0.1:{server.port}"  # the port answers, so it is not 'down'
        store.registration.register_bookie(BookieId(bookie), data=json.dumps(
            {"httpAddress": str(server.make_url("")).rstrip("/")}).encode())
        store.ledgers.create_ledger_with_id(LedgerId(7), _md(custom_metadata={"x": b"<b>bold</b>"}))
        console = ClusterConsole(ConsoleSettings(uri, meta_timeout_s=2.0))
        await console.start()
        try:
            status, body = await _page(console, "/cluster")
            assert status == 200 and "the answer is not JSON" in body and bookie in body
            status, body = await _page(console, "/storage")
            assert status == 200 and "not JSON" in body
            status, body = await _page(console, "/ledgers")
            assert status == 200 and "&lt;b&gt;bold&lt;/b&gt;" in body and "<b>bold</b>" not in body
            status, body = await _page(console, "/names/nope")
            assert status == 404 and "no named ledger" in body
        finally:
            await console.close()
            store.close()
            await server.close()

    run(main())


def test_a_console_that_cannot_listen_starts_nothing(tmp_path: Path) -> None:
    """A busy port (e.g. `vellum standalone` next to another console) fails the start and leaves
    no sampler task or HTTP session running behind the error."""
    import asyncio
    import socket

    from vellum.console.cluster import ConsoleSettings
    from vellum.console.server import ConsoleServer

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]

        async def main() -> None:
            server = ConsoleServer(ConsoleSettings(f"sqlite:///{tmp_path / 'metadata.db'}"), port=port)
            with pytest.raises(OSError):
                await server.start()
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            assert others == [], others

        asyncio.run(main())
