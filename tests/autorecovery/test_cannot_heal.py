"""A cluster that cannot heal says why, once (real bookie processes, their own AutoRecovery).

Four bookies with strict zone-aware placement (enforceStrictZoneawarePlacement: a bookie whose
location is unknown is never chosen): bookie 0 in /z0, bookies 2 and 3 in /z1, bookie 1 with
no location. Bookie 3 is switched off before any ledger is written, so E=3 ledgers (written with
the default policy) are on bookies 0, 1 and 2, E=2 ledgers (zone-aware) on bookies 0 and 2.
Bookie 2 is killed:
- an E=3 ledger has **no spare bookie** (both writable bookies are already in its ensemble): the
  reason names the ensemble's need (3) and what is available (2);
- an E=2 ledger has a spare (bookie 1) that the zone-aware policy refuses: the reason says
  **placement cannot be met**, naming the policy and its constraint.
The reason is in `listunderreplicated` (table and JSON), `autorecovery status`, the admin HTTP
list and cluster_info, and the console's recovery page; the bookies' logs say it once per
ledger instead of a warning per ledger every retry. Bookie 3 comes back: the workers retry at
once (the registered bookies changed), every ledger heals, the reasons are gone.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from click.testing import CliRunner

from vellum.autorecovery.auditor import Auditor
from vellum.autorecovery.fragments import bookies_of
from vellum.autorecovery.settings import AutoRecoverySettings
from vellum.cli.main import cli
from vellum.client.bookkeeper import BookKeeper
from vellum.config import ClientConfig, build_config
from vellum.console.app import build_app
from vellum.console.cluster import ClusterConsole, ConsoleSettings
from vellum.meta import open_metadata_store
from vellum.standalone import format_if_needed
from vellum.testing.local_cluster import LocalCluster

ZONES = {"ensemblePlacementPolicy": "zoneaware", "enforceStrictZoneawarePlacement": "true",
         "minNumZonesPerWriteQuorum": "1", "desiredNumZonesPerWriteQuorum": "2"}
CONF = {"autoRecoveryDaemonEnabled": "true", "lostBookieRecoveryDelay": "0", "rwRereplicateBackoffMs": "300",
        "openLedgerRereplicationGracePeriod": "1000", **ZONES}


def _shell(*args: str) -> str:
    result = CliRunner().invoke(cli, ["shell", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def _rows(uri: str) -> list[dict[str, Any]]:
    out = _shell("listunderreplicated", "--uri", uri, "--json")
    rows: list[dict[str, Any]] = json.loads(out[out.index("["):])
    return rows


def _wait(predicate: Any, timeout_s: float, what: str, cluster: LocalCluster) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- bookie {i}\n" + cluster.log_text(i)[-2000:] for i in range(4))
            raise AssertionError(f"{what} not reached within {timeout_s}s\n{logs}")
        time.sleep(0.3)


async def _recovery_page(uri: str) -> str:
    console = ClusterConsole(ConsoleSettings(uri, meta_timeout_s=5.0))
    await console.start()
    client = TestClient(TestServer(build_app(console), host="127.0.0.1"))
    await client.start_server()
    try:
        resp = await client.get("/recovery")
        assert resp.status == 200
        return await resp.text()
    finally:
        await client.close()
        await console.close()


def test_a_ledger_that_cannot_heal_says_why_once_and_heals_when_a_bookie_joins(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "c", bookies=4, bookie_conf=CONF)
    b = cluster.bookie_ids
    format_if_needed(cluster.metadata_uri)
    uri = cluster.metadata_uri
    _shell("racks", "--uri", uri, "--set", f"{b[0]}=/z0/ud0", "--set", f"{b[2]}=/z1/ud0", "--set", f"{b[3]}=/z1/ud1")
    zoneaware = build_config(ClientConfig, ZONES)

    async def write() -> tuple[list[int], list[int]]:
        wide, narrow = [], []
        async with BookKeeper(uri) as plain, BookKeeper(uri, config=zoneaware) as zoned:
            for n in range(8):
                e = 3 if n % 2 == 0 else 2
                bk = plain if e == 3 else zoned
                lh = await bk.create_ledger(ensemble_size=e, write_quorum_size=e, ack_quorum_size=e)
                for i in range(5):
                    await lh.append(b"entry %d" % i)
                await lh.close()
                assert b[2] in map(str, lh.metadata.ensembles[0]) and b[3] not in map(str, lh.metadata.ensembles[0])
                (wide if e == 3 else narrow).append(lh.ledger_id)
            # and one left open by a writer that went away: fenced and recovered after the grace
            # period, whose recovery cannot replace the lost bookie either
            lh = await plain.create_ledger(ensemble_size=3, write_quorum_size=3, ack_quorum_size=2)
            for i in range(5):
                await lh.append(b"entry %d" % i)
            lh.abandon()
            wide.append(lh.ledger_id)
        return wide, narrow

    with cluster:
        cluster.terminate(3)
        _wait(lambda: b[3] not in cluster.registered()[0], 30, "bookie 3 unregistered", cluster)
        wide, narrow = asyncio.run(write())
        ledgers = set(wide) | set(narrow)
        cluster.kill(2)

        def all_blocked() -> bool:
            rows = _rows(uri)
            return {r["ledgerId"] for r in rows if r["cannotHeal"]} == ledgers
        _wait(all_blocked, 90, "every ledger's reason recorded", cluster)
        rows = {r["ledgerId"]: r for r in _rows(uri)}
        for lid in wide:
            why = rows[lid]["cannotHeal"]
            assert why["kind"] == "no-spare-bookie", why
            assert f"no spare bookie to replace {b[2]}: an ensemble of 3 needs 3 writable bookies, 2 available" in \
                why["reason"], why
        for lid in narrow:
            why = rows[lid]["cannotHeal"]
            assert why["kind"] == "placement", why
            assert why["reason"].startswith(f"placement cannot be met replacing {b[2]}: ensemblePlacementPolicy="
                                            "zoneaware"), why
            assert "enforceStrictZoneawarePlacement=true" in why["reason"], why

        table = _shell("listunderreplicated", "--uri", uri)
        assert f"{len(wide)} ledgers cannot heal: no spare bookie to replace {b[2]}" in table, table
        assert f"{len(narrow)} ledgers cannot heal: placement cannot be met" in table, table
        status = _shell("autorecovery", "status", "--uri", uri, "--json")
        assert json.loads(status)["ledgersThatCannotHeal"] == len(ledgers)
        listed = cluster.http_get(0, "/api/v1/autorecovery/list_under_replicated_ledger")
        assert {r["ledgerId"]: r["cannotHeal"]["kind"] for r in listed} == {
            **{lid: "no-spare-bookie" for lid in wide}, **{lid: "placement" for lid in narrow}}
        assert cluster.http_get(0, "/api/v1/bookie/cluster_info")["ledgersThatCannotHeal"] == len(ledgers)
        assert cluster.http_get(0, "/api/v1/autorecovery/status")["ledgersThatCannotHeal"] == len(ledgers)
        page = asyncio.run(_recovery_page(uri))
        assert f"{len(ledgers)} under-replicated ledgers cannot heal" in page, page
        assert "an ensemble of 3 needs 3 writable bookies, 2 available" in page
        assert "placement cannot be met" in page

        # Said once per ledger: several retry periods later, no more lines about these ledgers
        # (before, every worker warned about every ledger at each retry, every 300 ms here).
        time.sleep(3)
        logs = cluster.log_text(0) + cluster.log_text(1)
        said = re.findall(r"ledger (\d+) cannot heal", logs)
        assert sorted(map(int, said)) == sorted(ledgers), said
        # A worker that reached a ledger before it saw the bookie's registration go may find the
        # bookie unreachable and leave the ledger for a retry: once, before it says why the
        # ledger cannot heal, never again after.
        for worker in (0, 1):
            text = cluster.log_text(worker)
            for lid in ledgers:
                retries = [m.start() for m in re.finditer(rf"ledger {lid} left for a retry", text)]
                assert len(retries) <= 1, (worker, lid, retries)
                told = text.find(f"ledger {lid} cannot heal")
                assert all(told == -1 or at < told for at in retries), (worker, lid, retries, told)

        async def summary() -> int:
            async with BookKeeper(uri) as bk:
                return await Auditor(bk, AutoRecoverySettings()).cannot_heal_summary()
        assert asyncio.run(summary()) == len(ledgers)

        cluster.restart(3)  # a bookie joins (/z1): every ledger can heal now, without waiting a minute
        _wait(lambda: not _rows(uri), 60, "every ledger healed", cluster)
        with open_metadata_store(uri) as store:
            for lid in ledgers:
                assert b[2] not in bookies_of(store.ledgers.read_ledger(lid).value)
        assert json.loads(_shell("autorecovery", "status", "--uri", uri, "--json"))["ledgersThatCannotHeal"] == 0
        assert asyncio.run(summary()) == 0
        with open_metadata_store(uri) as store:
            assert store.kv.list("autorecovery/cannotheal/") == []
