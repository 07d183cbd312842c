"""AutoRecovery end to end on real bookie processes: a bookie is lost for good (killed, its
disks deleted) and the cluster heals itself: the auditor (elected among the bookies) marks the
ledgers that had fragments on it, the replication workers (in the bookies,
autoRecoveryDaemonEnabled=true) copy those fragments to other bookies and replace the lost one
in the metadata, and every entry is again on a full write quorum."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

from vellum.client.bookkeeper import BookKeeper
from vellum.meta import open_metadata_store
from vellum.meta.model import LedgerMetadata
from vellum.testing.local_cluster import LocalCluster

CONF = {"autoRecoveryDaemonEnabled": "true", "lostBookieRecoveryDelay": "0",
        "rereplicationEntryBatchSize": "50", "openLedgerRereplicationGracePeriod": "3000"}


def _payload(lid: int, eid: int) -> bytes:
    return f"{lid}:{eid}:".encode() * 20


async def _write(uri: str, ledgers: int, entries: int, *, leave_open: int = 0) -> list[int]:
    ids = []
    async with BookKeeper(uri) as bk:
        for n in range(ledgers):
            lh = await bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
            await asyncio.gather(*(lh.append_async(_payload(lh.ledger_id, e)) for e in range(entries)))
            if n >= leave_open:
                await lh.close()
            else:
                lh.abandon()  # a writer that went away without closing
            ids.append(lh.ledger_id)
    return ids


def _all_metadata(uri: str, ids: list[int]) -> dict[int, LedgerMetadata]:
    with open_metadata_store(uri) as store:
        return {lid: store.ledgers.read_ledger(lid).value for lid in ids}


def _under_replicated(uri: str) -> list[int]:
    with open_metadata_store(uri) as store:
        return [int(r.ledger_id) for r in store.underreplication.list_under_replicated()]


async def _check_replicas(uri: str, ids: list[int], entries: int) -> None:
    """Every entry is on every bookie of its write set, and reads back intact."""
    from vellum.autorecovery.fragments import fragments

    async with BookKeeper(uri) as bk:
        bc = bk.context.bookie_client
        for lid in ids:
            await bk.open_ledger(lid)  # closes the ledgers whose writer went away (not on the lost bookie)
            md = (await bk.context.read_metadata(lid)).value
            assert md.is_closed and md.last_entry_id == entries - 1, (lid, md)
            for f in fragments(lid, md):
                want = set(f.entries(md.write_quorum_size))
                ranges = await bc.list_entries(f.bookie, lid)
                held = {e for lo, hi in ranges for e in range(lo, hi + 1)}
                assert want <= held, (lid, f.first_entry, f.bookie, sorted(want - held))
            rh = await bk.open_ledger(lid, recovery=False)
            got = await rh.read(0, entries - 1)
            assert [g.payload for g in got] == [_payload(lid, e) for e in range(entries)]


def test_a_lost_bookie_is_healed_by_the_auditor_and_the_workers(tmp_path: Path) -> None:
    entries = 40
    with LocalCluster(tmp_path / "c", bookies=4, bookie_conf=CONF) as cluster:
        uri = cluster.metadata_uri
        ids = asyncio.run(_write(uri, 12, entries, leave_open=2))
        victim_index = 1
        victim = cluster.bookie_ids[victim_index]
        on_victim = [lid for lid, md in _all_metadata(uri, ids).items()
                     if any(victim in map(str, e) for e in md.ensembles.values())]
        assert on_victim
        cluster.kill(victim_index)
        shutil.rmtree(cluster.ledger_dir(victim_index))
        shutil.rmtree(cluster.journal_dir(victim_index))

        def healed() -> bool:
            mds = _all_metadata(uri, ids)
            named = any(victim in map(str, e) for md in mds.values() for e in md.ensembles.values())
            return not named and not _under_replicated(uri)

        deadline = time.monotonic() + 120
        while not healed():
            assert time.monotonic() < deadline, (
                f"not healed: under-replicated {_under_replicated(uri)}\n"
                + "\n".join(cluster.log_text(i)[-2000:] for i in (0, 2, 3)))
            time.sleep(0.5)
        asyncio.run(_check_replicas(uri, ids, entries))
        logs = "".join(cluster.log_text(i) for i in (0, 2, 3))
        assert "elected auditor" in logs and "re-replicated" in logs
