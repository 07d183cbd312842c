"""Defect D2 of docs/correctness.md (BookKeeper's ``TestFencing.testWriteAfterDeleted``, BK#4462), on real
bookie processes: writer A holds an open ledger and is idle; client B recovers it (fences),
deletes it, and every bookie garbage-collects it. A's later adds must all fail, also after a
bookie restart: a deleted ledger's fence is never forgotten, and no bookie serves it again."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from click.testing import CliRunner

from vellum import errors as E
from vellum.aio import BookKeeper
from vellum.cli.main import cli
from vellum.config import ClientConfig
from vellum.errors import LedgerFencedError
from vellum.format.entry import DigestManager, DigestType, master_key
from vellum.proto import messages as m
from vellum.testing.local_cluster import LocalCluster
from vellum.testing.wire import RawConnection

CFG = ClientConfig(add_entry_timeout_s=2.0, read_entry_timeout_s=2.0)


def test_adds_to_a_deleted_and_garbage_collected_ledger_fail(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "c", bookies=3) as cluster:

        async def main() -> None:
            async with BookKeeper(cluster.metadata_uri, config=CFG) as a, \
                    BookKeeper(cluster.metadata_uri, config=CFG) as b:
                # A ledger that stays: GC deletes nothing while the metadata listing is empty.
                keeper = await b.create_ledger(ensemble_size=3, write_quorum_size=3, ack_quorum_size=2)
                await keeper.append(b"kept")
                lh = await a.create_ledger(ensemble_size=3, write_quorum_size=3, ack_quorum_size=2, password=b"pw")
                for i in range(10):
                    await lh.append(b"before %d" % i)
                # B recovers (fences) and deletes; A is idle and learns nothing.
                rh = await b.open_ledger(lh.ledger_id, password=b"pw")
                assert rh.metadata.last_entry_id == 9
                await b.delete_ledger(lh.ledger_id)
                for i in range(3):
                    r = await asyncio.to_thread(
                        CliRunner().invoke, cli,
                        ["shell", "gc", "--http", cluster.http_url(i), "--wait", "--timeout", "60"])
                    assert r.exit_code == 0, r.output
                    details = cluster.http_get(i, "/api/v1/bookie/gc_details")
                    assert sum(d["deletedLedgers"] for d in details) >= 1, details
                # The tombstone outlives a crash of the bookie too.
                await asyncio.to_thread(cluster.restart, 0)
                for i in range(20):
                    with pytest.raises(LedgerFencedError):
                        await lh.append(b"after delete %d" % i)
                # Straight on the wire, to each bookie: an ADD with the ledger's key (plain and
                # recovery) is refused as fenced, and nothing of the ledger is served.
                dm = DigestManager(lh.ledger_id, DigestType.CRC32C, b"pw")
                for bookie in cluster.bookie_ids:
                    conn = RawConnection(bookie)
                    try:
                        for flags in (0, m.FLAG_RECOVERY_ADD):
                            conn.send(m.AddRequest(master_key(b"pw"), dm.compute(10, 9, 0, b"x"), flags))
                            assert conn.recv() == m.AddResponse(E.EFENCED, lh.ledger_id, 10)
                        for eid in (0, 10):
                            conn.send(m.ReadRequest(lh.ledger_id, eid))
                            resp = conn.recv()
                            assert isinstance(resp, m.ReadResponse) and resp.status != E.EOK
                    finally:
                        conn.close()
                assert not await a.ledger_exists(lh.ledger_id)
                await keeper.append(b"still taken")  # live ledgers are untouched

        asyncio.run(main())
        import re

        for i in range(3):
            metrics = str(cluster.http_get(i, "/metrics"))
            found = re.search(r'bookie_BOOKIE_ADD_ENTRY_REJECTED_total\{reason="deleted"\} (\S+)', metrics)
            assert found and float(found.group(1)) >= 1, f"bookie {i} counts refused adds to deleted ledgers"
            assert "the ledger was deleted (fenced for good)" in cluster.log_text(i)
