"""The console forgets a decommissioned bookie (real console, real bookie processes).

A bookie the console has seen is shown *down* when it stops (its registration is gone, its
cookie is not: it may come back). Once it is decommissioned, whoever did it (here the shell's
`decommissionbookie`, not the console's own button), its cookie is deleted from the metadata
store: it left the cluster, and the console drops it from the cluster and recovery pages and
drops its metric history (no stale rates), without being restarted."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from aiohttp.test_utils import TestClient, TestServer
from click.testing import CliRunner

from vellum.cli.main import cli
from vellum.client.bookkeeper import BookKeeper
from vellum.console.app import build_app
from vellum.console.cluster import ClusterConsole, ConsoleSettings
from vellum.testing.local_cluster import LocalCluster

CONF = {"autoRecoveryDaemonEnabled": "true", "lostBookieRecoveryDelay": "3600", "rwRereplicateBackoffMs": "300"}


async def _write(uri: str) -> None:
    async with BookKeeper(uri) as bk:
        for _ in range(6):
            lh = await bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
            for i in range(5):
                await lh.append(b"entry %d" % i)
            await lh.close()


def test_a_decommissioned_bookie_leaves_the_console(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "c", bookies=4, bookie_conf=CONF) as cluster:
        uri = cluster.metadata_uri
        asyncio.run(_write(uri))
        victim_index = 3
        victim = cluster.bookie_ids[victim_index]

        async def main() -> None:
            console = ClusterConsole(ConsoleSettings(uri, meta_timeout_s=5.0, sample_interval_s=0.3))
            await console.start()
            client = TestClient(TestServer(build_app(console), host="127.0.0.1"))
            await client.start_server()

            async def page(path: str) -> str:
                resp = await client.get(path)
                assert resp.status == 200, path
                return await resp.text()

            async def until(predicate: object, what: str, timeout_s: float = 60.0) -> None:
                deadline = time.monotonic() + timeout_s
                assert callable(predicate)
                while not await predicate():
                    assert time.monotonic() < deadline, what
                    await asyncio.sleep(0.3)

            try:
                async def sampled() -> bool:
                    return len(console.history.samples(victim)) >= 2
                await until(sampled, "the victim's metrics sampled")
                assert victim in await page("/cluster")

                await asyncio.to_thread(cluster.terminate, victim_index)

                async def shown_down() -> bool:
                    views, _ur = await console.bookies(with_gc=False)
                    return any(v.bookie_id == victim and v.state == "down" for v in views)
                await until(shown_down, "the stopped bookie shown down")  # cookie kept: it may come back
                assert victim in await page("/recovery")

                result = await asyncio.to_thread(
                    CliRunner().invoke, cli,
                    ["shell", "decommissionbookie", "--uri", uri, "--bookieid", victim, "--timeout", "120"])
                assert result.exit_code == 0, result.output

                for path in ("/cluster", "/recovery"):
                    assert victim not in await page(path), path
                views, _ur = await console.bookies(with_gc=False)
                assert victim not in {v.bookie_id for v in views}
                assert console.history.samples(victim) == []  # no stale rates
                assert len(views) == 3 and all(v.state == "writable" for v in views)
            finally:
                await client.close()
                await console.close()

        asyncio.run(main())
