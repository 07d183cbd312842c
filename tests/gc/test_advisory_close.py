"""The advisory write close (requirement R1 of docs/correctness.md), end to end: a client's ``close()``, a recovery-open and a
named ledger's APPEND each tell the bookies "ledger closed", and a bookie in entry-log-per-ledger
mode seals that ledger's log at its next checkpoint. A ledger nobody closed keeps its log open
(the idle expiry is far away), so the seals come from the notes.

One real bookie process (E1 W1 A1), Vellum's own client, embedded metadata store.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from gc_support import sealed_logs

from vellum.client.bookkeeper import BookKeeper
from vellum.client.named import NamedLedgers, OpenMode
from vellum.testing.local_cluster import LocalCluster

ONE = {"ensemble_size": 1, "write_quorum_size": 1, "ack_quorum_size": 1}


def _sealed_ledgers(cluster: LocalCluster) -> set[int]:
    return {lid for ledgers in sealed_logs(cluster.ledger_dir(0)).values() for lid in ledgers}


def test_close_recovery_open_and_named_append_seal_the_ledgers_log(tmp_path: Path) -> None:
    conf = {"entryLogPerLedgerEnabled": "true", "flushInterval": "200",
            "minorCompactionInterval": "0", "majorCompactionInterval": "0"}
    uri = f"sqlite:///{tmp_path / 'metadata.db'}"
    with LocalCluster(tmp_path / "c", bookies=1, metadata_uri=uri, bookie_conf=conf) as cluster:

        async def main() -> tuple[int, int, int, int]:
            async with BookKeeper(uri) as writer, BookKeeper(uri) as other:
                closed = await writer.create_ledger(**ONE)
                recovered = await writer.create_ledger(**ONE)
                untouched = await writer.create_ledger(**ONE)
                for lh in (closed, recovered, untouched):
                    for i in range(10):
                        await lh.append(b"entry %d" % i)
                named = await NamedLedgers(writer).open("seg", OpenMode.CREATE, **ONE)
                for i in range(10):
                    await named.append(b"named %d" % i)
                named_ledger = named.ledger_id
                assert named_ledger is not None
                await closed.close()                                          # a writer closes
                await other.open_ledger(recovered.ledger_id)                  # recovery-open fences
                await NamedLedgers(other).open("seg", OpenMode.APPEND)        # APPEND fences
                return closed.ledger_id, recovered.ledger_id, named_ledger, untouched.ledger_id

        closed, recovered, named_ledger, untouched = asyncio.run(asyncio.wait_for(main(), 60))
        cluster.wait_until(lambda: {closed, recovered, named_ledger} <= _sealed_ledgers(cluster),
                           timeout_s=30, what="the closed ledgers' logs sealed")
        assert untouched not in _sealed_ledgers(cluster)
        for ledgers in sealed_logs(cluster.ledger_dir(0)).values():
            assert len(ledgers) == 1  # one ledger per log
