"""Lost-disk safety with real bookie processes (docs/autorecovery.md, rule 12 of docs/correctness.md, ``dataIntegrityChecking``):
the interleaving of the wiped-bookie defect (tests/server/test_bookie_process.py), but the wiped
bookie is let back in with ``dataIntegrityChecking=true`` and ``dataIntegrityStampMissingCookies=
true``. It must start, answer "unknown" (EUNKNOWNLEDGERSTATE, never ENOENTRY) for what it lost
while the ledger is limbo, never make recovery truncate, and then copy its entries back."""

from __future__ import annotations

import asyncio
import re
import shutil
import threading
from pathlib import Path

from vellum import errors as E
from vellum.format.entry import DigestManager, DigestType, master_key
from vellum.proto import messages as m
from vellum.standalone import write_bookie_conf
from vellum.testing.local_cluster import LocalCluster
from vellum.testing.wire import RawConnection


def _limbo_gauge(c: LocalCluster, i: int) -> float | None:
    text = c.http_get(i, "/metrics")
    found = re.search(r"^bookie_DATA_INTEGRITY_LIMBO_LEDGERS (\S+)$", str(text), re.MULTILINE)
    return float(found.group(1)) if found else None


def test_wiped_bookie_with_data_integrity_checking_answers_unknown_and_heals(tmp_path: Path) -> None:
    """E3 W3 A2 on 3 bookies: the last 22 acknowledged entries reached only b1 and b2, the writer
    died, b1 lost all its disks and is restarted (stamped over, limbo) while b2 is paused. b1
    answers EUNKNOWNLEDGERSTATE for the entries it lost, its last entry and its LAC, and refuses
    adds. Another client's recovery, started while b2 is still paused and resumed a second
    later, must keep all 42 entries (with b1 answering ENOENTRY it would close at 19: b1 and b3
    would be two explicit negatives for entry 20). Then b1's integrity check copies its entries
    back and clears limbo."""
    from vellum.aio import BookKeeper
    from vellum.config import ClientConfig

    cfg = ClientConfig(add_entry_timeout_s=2.0, read_entry_timeout_s=2.0)
    password = b"pw"
    with LocalCluster(tmp_path / "c", bookies=3) as c:

        async def write() -> tuple[int, str, str]:
            async with BookKeeper(c.metadata_uri, config=cfg) as bk:
                lh = await bk.create_ledger(ensemble_size=3, write_quorum_size=3, ack_quorum_size=2,
                                            password=password)
                for i in range(20):
                    await lh.append(b"e%d" % i)
                # The writer's last adds reach two bookies only, then it dies (never closes).
                b1, b2, _b3 = lh.metadata.ensembles[0]
                dm = DigestManager(lh.ledger_id, DigestType.CRC32C, password)
                length = sum(len(b"e%d" % i) for i in range(20))
                for i in range(20, 42):
                    length += len(b"e%d" % i)
                    entry = dm.compute(i, i - 1, length, b"e%d" % i)
                    for b in (b1, b2):
                        await bk.bookie_client.add(b, master_key(password), entry, timeout_s=5)
                return lh.ledger_id, b1, b2

        ledger_id, wiped_id, holder_id = asyncio.run(write())
        wiped, holder = c.bookie_ids.index(wiped_id), c.bookie_ids.index(holder_id)
        dm = DigestManager(ledger_id, DigestType.CRC32C, password)
        c.terminate(wiped)
        shutil.rmtree(c.journal_dir(wiped))
        shutil.rmtree(c.ledger_dir(wiped))
        spec = c._bookies[wiped].spec
        spec.extra.update({"dataIntegrityChecking": "true", "dataIntegrityStampMissingCookies": "true"})
        write_bookie_conf(spec, c.metadata_uri)
        c.pause(holder)  # the only other copy of 20..41: nothing can be copied or recovered yet
        resumed = threading.Event()

        def resume_holder() -> None:
            if not resumed.is_set():
                resumed.set()
                c.resume(holder)

        try:
            c.restart(wiped)
            log_text = c.log_text(wiped)
            assert "stamping over" in log_text and "1 ledger(s) marked limbo and fenced" in log_text, log_text[-3000:]
            assert (c.ledger_dir(wiped) / "current" / "VERSION").exists()
            assert _limbo_gauge(c, wiped) == 1.0

            with RawConnection(wiped_id) as conn:
                for i in (0, 19, 20, 41, -1):  # every entry was lost; -1 = its last entry
                    conn.send(m.ReadRequest(ledger_id, i))
                    resp = conn.recv()
                    assert isinstance(resp, m.ReadResponse) and resp.status == E.EUNKNOWNLEDGERSTATE, (i, resp)
                conn.send(m.ReadLacRequest(7, ledger_id))
                lac = conn.recv()
                assert isinstance(lac, m.ReadLacResponse) and lac.status == E.EUNKNOWNLEDGERSTATE, lac
                conn.send(m.AddRequest(master_key(password), dm.compute(42, 41, 999, b"late")))
                add = conn.recv()
                assert isinstance(add, m.AddResponse) and add.status == E.EFENCED, add

            async def recover() -> None:
                async with BookKeeper(c.metadata_uri, config=cfg) as bk:
                    threading.Timer(1.0, resume_holder).start()
                    rh = await bk.open_ledger(ledger_id, password=password)
                    assert rh.metadata.last_entry_id == 41, "recovery kept every acknowledged entry"
                    got = await rh.read(0, 41)
                    assert [g.payload for g in got] == [b"e%d" % i for i in range(42)]

            asyncio.run(recover())
        finally:
            resume_holder()

        # b1's integrity check copies its entries back, then clears limbo.
        c.wait_until(lambda: "integrity check: done" in c.log_text(wiped), timeout_s=90,
                     what="the integrity check of the wiped bookie finishes")
        log_text = c.log_text(wiped)
        assert re.search(rf"integrity check: ledger {ledger_id}: copied \d+ entries \(1/1 ledgers\)", log_text)
        assert _limbo_gauge(c, wiped) == 0.0
        metrics = str(c.http_get(wiped, "/metrics"))
        assert re.search(r"^bookie_DATA_INTEGRITY_LEDGERS_REPAIRED_total 1\.0$", metrics, re.MULTILINE), metrics
        copied = re.search(r"^bookie_DATA_INTEGRITY_ENTRIES_COPIED_total (\S+)$", metrics, re.MULTILINE)
        assert copied is not None and float(copied.group(1)) >= 20  # 0..19 at least (recovery writes back only the tail)
        with RawConnection(wiped_id) as conn:
            for i in range(42):
                conn.send(m.ReadRequest(ledger_id, i))
                resp = conn.recv()
                assert isinstance(resp, m.ReadResponse) and resp.status == E.EOK, (i, resp)
                assert dm.verify(resp.entry, i).payload == b"e%d" % i
            conn.send(m.ReadRequest(ledger_id, -1))
            last = conn.recv()
            assert last.status == E.EOK and dm.verify(last.entry).entry_id == 41
            conn.send(m.ReadLacRequest(8, ledger_id))
            lac = conn.recv()
            assert isinstance(lac, m.ReadLacResponse) and lac.status == E.EOK, lac
