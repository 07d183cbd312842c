"""`vellum autorecovery` as processes of their own (BookKeeper's `bookkeeper autorecovery`), with
bookies that run no AutoRecovery: two such processes hold the auditor election (one leads,
`whoisauditor` names it), a bookie is lost and its ledgers are healed by them; the auditor
process is killed, the other one takes over and heals a second lost bookie's ledgers."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from vellum.autorecovery.fragments import bookies_of, fragments
from vellum.cli.main import cli
from vellum.client.bookkeeper import BookKeeper
from vellum.format.entry import DigestManager, DigestType
from vellum.meta import open_metadata_store
from vellum.testing.local_cluster import LocalCluster

ENTRIES = 10


def _shell_json(*args: str) -> Any:
    result = CliRunner().invoke(cli, ["shell", *args, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    out = result.output
    return json.loads(out[min(i for i in (out.find("{"), out.find("[")) if i >= 0):])


def _payload(lid: int, eid: int) -> bytes:
    return f"{lid}:{eid}:".encode() * 10


async def _write(uri: str, ledgers: int) -> list[int]:
    ids = []
    async with BookKeeper(uri) as bk:
        for _ in range(ledgers):
            lh = await bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
            await asyncio.gather(*(lh.append_async(_payload(lh.ledger_id, e)) for e in range(ENTRIES)))
            await lh.close()
            ids.append(lh.ledger_id)
    return ids


async def _check(uri: str, ids: list[int], gone: set[str]) -> None:
    async with BookKeeper(uri) as bk:
        bc = bk.context.bookie_client
        for lid in ids:
            md = (await bk.context.read_metadata(lid)).value
            assert not bookies_of(md) & gone, (lid, md.ensembles)
            digest = DigestManager(lid, DigestType(int(md.digest_type)), md.password)
            for f in fragments(lid, md):
                for e in f.entries(md.write_quorum_size):
                    assert digest.verify(await bc.read(f.bookie, lid, e), e).payload == _payload(lid, e)


def _on(uri: str, ids: list[int], bookie: str) -> set[int]:
    with open_metadata_store(uri) as store:
        return {lid for lid in ids if bookie in bookies_of(store.ledgers.read_ledger(lid).value)}


def test_autorecovery_processes_elect_an_auditor_and_heal_lost_bookies(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "c", bookies=5, bookie_conf={"zkTimeout": "4000"}) as cluster:
        uri = cluster.metadata_uri
        conf = tmp_path / "autorecovery.conf"
        conf.write_text(f"metadataServiceUri={uri}\nlostBookieRecoveryDelay=0\nrwRereplicateBackoffMs=300\n"
                        "zkTimeout=4000\nrereplicationEntryBatchSize=20\n")
        procs: dict[str, subprocess.Popen[bytes]] = {}
        logs: dict[str, Path] = {}

        def wait(predicate: Any, timeout_s: float, what: str) -> None:
            deadline = time.monotonic() + timeout_s
            while not predicate():
                if time.monotonic() > deadline:
                    text = "\n".join(f"--- {n}\n{p.read_text(errors='replace')[-2000:]}" for n, p in logs.items())
                    raise AssertionError(f"{what} not reached within {timeout_s}s\n{text}")
                time.sleep(0.3)

        try:
            for name in ("ar-1", "ar-2"):
                logs[name] = tmp_path / f"{name}.log"
                with open(logs[name], "wb") as out:
                    procs[name] = subprocess.Popen(
                        [sys.executable, "-m", "vellum.cli.main", "autorecovery", "--conf", str(conf), "--id", name],
                        stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            for name in procs:
                wait(lambda name=name: f"READY autorecovery {name}" in logs[name].read_text(), 30, f"{name} ready")
            wait(lambda: _shell_json("whoisauditor", "--uri", uri)["auditor"] in procs, 30, "an auditor elected")
            auditor = _shell_json("whoisauditor", "--uri", uri)["auditor"]
            other = next(n for n in procs if n != auditor)

            ids = asyncio.run(_write(uri, 20))
            first = cluster.bookie_ids[0]
            assert _on(uri, ids, first)
            cluster.kill(0)
            shutil.rmtree(cluster.ledger_dir(0))
            wait(lambda: not _on(uri, ids, first) and not _shell_json("listunderreplicated", "--uri", uri), 120,
                 "the first lost bookie's ledgers healed")
            asyncio.run(_check(uri, ids, {first}))
            assert "re-replicated" in logs["ar-1"].read_text() + logs["ar-2"].read_text()

            procs[auditor].send_signal(signal.SIGKILL)  # the auditor dies: its session expires
            procs[auditor].wait(10)
            wait(lambda: _shell_json("whoisauditor", "--uri", uri)["auditor"] == other, 60, "the other one elected")
            second = cluster.bookie_ids[1]
            assert _on(uri, ids, second)
            cluster.kill(1)
            shutil.rmtree(cluster.ledger_dir(1))
            wait(lambda: not _on(uri, ids, second) and not _shell_json("listunderreplicated", "--uri", uri), 120,
                 "the second lost bookie's ledgers healed")
            asyncio.run(_check(uri, ids, {first, second}))
            procs[other].send_signal(signal.SIGTERM)  # a clean stop: it resigns
            assert procs[other].wait(30) == 0
            assert "stopped" in logs[other].read_text()
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.kill()
                    p.wait()
