"""Cursor lag in the console, on a real cluster: ``/metrics`` (Prometheus text) exports every
position cursor's lag behind its name's end (the open segment's LAC + 1 read from real bookies)
and the name page shows it; opaque cursors have no lag; a console with login keys serves
``/metrics`` to a bearer token only."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

import vellum
from vellum.client.named_blocking import NamedLedgers
from vellum.client.named_record import PositionCursor
from vellum.console.app import build_app
from vellum.console.cluster import ClusterConsole, ConsoleSettings
from vellum.console.cursors import cursor_lag
from vellum.security import tokens
from vellum.testing.local_cluster import LocalCluster

NAME = "tests/console/lagging"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("cluster"), bookies=2) as c, vellum.BookKeeper(c.metadata_uri) as bk:
        named = NamedLedgers(bk)
        h = named.open(NAME, "create", ensemble_size=2, write_quorum_size=2, ack_quorum_size=2)
        for i in range(40):
            h.append(b"e%d" % i)
        h.close()
        h = named.open(NAME, "append")  # a second segment, left OPEN: the end comes from its LAC
        for i in range(21):
            h.append(b"f%d" % i)  # readers see 40..59 (the piggy-backed LAC lags one add)
        version = named.record(NAME).version
        version = named.set_cursor(NAME, "spark-reader", PositionCursor(25, retain=True).encode(), version)
        version = named.set_cursor(NAME, "caught-up", PositionCursor(60).encode(), version)
        named.set_cursor(NAME, "spark.sink.q", b"7", version)  # a sink's batch id: opaque, no lag exported
        yield c
        h.close()


async def _get(console: ClusterConsole, path: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    client = TestClient(TestServer(build_app(console), host="127.0.0.1"))
    await client.start_server()
    try:
        resp = await client.get(path, headers=headers or {}, allow_redirects=False)
        return resp.status, await resp.text()
    finally:
        await client.close()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_metrics_export_each_position_cursors_lag(cluster: LocalCluster) -> None:
    async def main() -> tuple[int, str, int, str]:
        console = ClusterConsole(ConsoleSettings(cluster.metadata_uri))
        await console.start()
        try:
            status, text = await _get(console, "/metrics")
            page_status, page = await _get(console, f"/names/{NAME}")
            return status, text, page_status, page
        finally:
            await console.close()

    status, text, page_status, page = asyncio.run(main())
    assert status == 200, text
    got = _samples(text)
    labels = (("cursor", "spark-reader"), ("name", NAME))
    assert got[("vellum_named_ledger_end_entry_id", (("name", NAME),))] == 60
    assert got[("vellum_named_ledger_segments", (("name", NAME),))] == 2
    assert got[("vellum_named_ledger_cursor_lag_entries", labels)] == 35
    assert got[("vellum_named_ledger_cursor_position", labels)] == 25
    assert got[("vellum_named_ledger_cursor_retain", labels)] == 1
    assert got[("vellum_named_ledger_cursor_lag_entries", (("cursor", "caught-up"), ("name", NAME)))] == 0
    assert got[("vellum_named_ledger_cursor_retain", (("cursor", "caught-up"), ("name", NAME)))] == 0
    assert not [k for k in got if ("cursor", "spark.sink.q") in k[1]]  # opaque: no lag is guessed
    # the name page shows the same lag (and which cursor holds back a shrink)
    assert page_status == 200
    row = page.split('<th scope="row">spark-reader</th>', 1)[1].split("</tr>", 1)[0]
    assert '<td class="cursor-retain">yes</td>' in row and '<td class="cursor-lag">35</td>' in row


def test_cursor_lag_reads_positions_and_plain_entry_ids() -> None:
    assert cursor_lag(PositionCursor(25).encode(), 59) == 35  # the next entry to read: 25..59 wait
    assert cursor_lag(PositionCursor(80).encode(), 59) == 0  # never negative
    assert cursor_lag(b"21", 59) == 38  # a plain integer: the last entry read
    assert cursor_lag(b"batch-7", 59) is None


def test_metrics_need_a_token_when_the_console_has_login_keys(cluster: LocalCluster, tmp_path: Path) -> None:
    secret = tokens.write_secret_file(tmp_path / "secret")
    signer = tokens.TokenSigner.from_secret_file(secret)
    good = signer.issue("prometheus", ["client"], ttl_s=600, audience=tokens.ADMIN_AUDIENCE)
    other = tokens.TokenSigner.from_secret_file(tokens.write_secret_file(tmp_path / "other")).issue(
        "x", ["admin"], ttl_s=600, audience=tokens.ADMIN_AUDIENCE)

    async def main() -> list[tuple[int, str]]:
        console = ClusterConsole(ConsoleSettings(cluster.metadata_uri, token_secret_file=str(secret)))
        await console.start()
        try:
            return [await _get(console, "/metrics"),
                    await _get(console, "/metrics", {"Authorization": f"Bearer {other}"}),
                    await _get(console, "/metrics", {"Authorization": f"Bearer {good}"}),
                    await _get(console, f"/names/{NAME}", {"Authorization": f"Bearer {good}"})]
        finally:
            await console.close()

    (none, bad, ok, page) = asyncio.run(main())
    assert none[0] == 401 and "Authorization: Bearer" in none[1] and "vellum_" not in none[1]
    assert bad[0] == 401 and "refused" in bad[1]
    assert ok[0] == 200 and "vellum_named_ledger_cursor_lag_entries" in ok[1]
    assert page[0] == 303  # a bearer token opens /metrics only; pages still need a login


