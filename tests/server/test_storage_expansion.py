"""Storage expansion on a real bookie process (docs/operations.md, rule 13 of docs/correctness.md): ledgers written on a
bookie with one ledger dir stay readable, fenceable and recoverable after two empty ledger dirs
are added with ``allowStorageExpansion=true``, including entries that reach storage only by
journal replay across the expansion. Before, the bookie refused to start (the store-cookie
comparison ran the wrong way round), and a ledger routed by ``ledger_id % dirs`` would have been
looked up in a dir that never held it ("no such entry": recovery truncates)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from vellum import errors as E
from vellum.aio import BookKeeper
from vellum.config import ClientConfig
from vellum.format.cookie import Cookie
from vellum.ids import BookieId
from vellum.meta import open_metadata_store
from vellum.proto import messages as m
from vellum.testing.local_cluster import LocalCluster
from vellum.testing.wire import RawConnection

CFG = ClientConfig(add_entry_timeout_s=5.0, read_entry_timeout_s=5.0)


def payload(lid: int, i: int) -> bytes:
    return b"%d/%d/" % (lid, i) * 20


def test_added_ledger_dirs_never_hide_existing_ledgers(tmp_path: Path) -> None:
    # No checkpoint of its own during the test: the second batch stays in the journal only.
    conf = {"allowStorageExpansion": "true", "flushInterval": "3600000"}
    with LocalCluster(tmp_path / "c", bookies=1, bookie_conf=conf) as c:
        bookie = c.bookie_ids[0]

        async def write(count: int) -> list[int]:
            async with BookKeeper(c.metadata_uri, config=CFG) as bk:
                ids = []
                for _ in range(count):
                    lh = await bk.create_ledger(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1,
                                                password=b"pw")
                    for i in range(20):
                        await lh.append(payload(lh.ledger_id, i))
                    ids.append(lh.ledger_id)  # left open: recovery must fence and close it
                return ids

        checkpointed = asyncio.run(write(6))
        c.terminate(0)  # clean stop: final checkpoint, these ledgers are in the entry logs and index
        c.restart(0)
        journal_only = asyncio.run(write(6))
        c.kill(0)  # kill -9: these entries are only in the journal

        conf_file = c._bookies[0].spec.conf_file
        base = conf_file.parent
        old = f"ledgerDirectories={base / 'ledgers'}"
        text = conf_file.read_text()
        assert old in text
        conf_file.write_text(text.replace(old, f"{old},{base / 'ledgers-2'},{base / 'ledgers-3'}"))
        c.restart(0)
        assert "storage expansion" in c.log_text(0)

        async def check() -> None:
            # Straight to the bookie first: every entry of every ledger is served (no "no such entry").
            conn = RawConnection(bookie)
            try:
                for lid in checkpointed + journal_only:
                    for i in (0, 19):
                        conn.send(m.ReadRequest(lid, i))
                        resp = conn.recv()
                        assert isinstance(resp, m.ReadResponse) and resp.status == E.EOK, (lid, i, resp)
            finally:
                conn.close()
            async with BookKeeper(c.metadata_uri, config=CFG) as bk:
                for lid in checkpointed + journal_only:
                    rh = await bk.open_ledger(lid, password=b"pw")  # fences and recovers
                    assert rh.metadata.last_entry_id == 19, (lid, rh.metadata)
                    got = await rh.read(0, 19)
                    assert [g.payload for g in got] == [payload(lid, i) for i in range(20)]
                # New ledgers still work on the expanded bookie.
                lh = await bk.create_ledger(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1)
                await lh.append(b"after expansion")
                await lh.close()

        asyncio.run(check())
        # Both cookie copies now list the three ledger dirs.
        with open_metadata_store(c.metadata_uri) as store:
            stored = store.registration.get_cookie(BookieId(bookie))
        assert stored is not None
        assert len(Cookie.decode(stored.value).ledger_dirs) == 3
        # A restart on the expanded dirs is a plain restart.
        c.restart(0)
