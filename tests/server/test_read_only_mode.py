"""A bookie whose ledger dirs fill up turns read-only: it registers as read-only, refuses normal
adds, still serves reads, fences and recovery adds, and turns writable again when space returns.
The ledger dir is a small tmpfs the test mounts (needs root, as CI and this machine have)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_bookie_process import RawConnection, _entry

from vellum import errors as E
from vellum.format.entry import master_key
from vellum.proto import messages as m
from vellum.testing.local_cluster import LocalCluster, tmpfs_available

pytestmark = pytest.mark.skipif(
    not tmpfs_available() and not os.environ.get("CI"), reason="cannot mount a tmpfs here (needs root)"
)


def test_full_ledger_dir_turns_bookie_read_only_and_back(tmp_path: Path) -> None:
    key = master_key(b"pw")
    conf = {"logSizeLimit": str(512 * 1024), "dbStorage_writeCacheMaxSizeMb": "1",
            "entryLogFilePreallocationEnabled": "false"}
    with LocalCluster(tmp_path / "c", bookies=1, small_ledger_dir_mb=16, bookie_conf=conf) as c:
        bid = c.bookie_ids[0]
        conn = RawConnection(bid)
        try:
            conn.send(m.AddRequest(key, _entry(1, 0, b"before")))
            assert conn.recv() == m.AddResponse(E.EOK, 1, 0)
            filler = c.fill_ledger_dir(0, leave_bytes=128 * 1024)
            c.wait_until(lambda: bid in c.registered()[1], timeout_s=30, what="read-only registration")
            assert bid not in c.registered()[0]
            assert c.http_get(0, "/api/v1/bookie/state")["readOnly"] is True
            conn.send(m.AddRequest(key, _entry(1, 1, b"refused")))
            assert conn.recv() == m.AddResponse(E.EREADONLY, 1, 1)
            conn.send(m.ReadRequest(1, 0))
            resp = conn.recv()
            assert isinstance(resp, m.ReadResponse) and resp.status == E.EOK
            conn.send(m.AddRequest(key, _entry(1, 1, b"recovery"), m.FLAG_RECOVERY_ADD))
            assert conn.recv() == m.AddResponse(E.EOK, 1, 1)
            filler.unlink()
            c.wait_until(lambda: bid in c.registered()[0], timeout_s=30, what="writable again")
            conn.send(m.AddRequest(key, _entry(1, 2, b"after")))
            assert conn.recv() == m.AddResponse(E.EOK, 1, 2)
        finally:
            conn.close()


def test_ledgers_of_a_full_dir_continue_in_another_dir_and_read_back_across_a_restart(tmp_path: Path) -> None:
    """Requirement R1 of docs/correctness.md: with two ledger dirs, one filling up leaves the bookie writable; the ledger
    that lived in the full dir continues in the other one, and after a restart every entry is
    read back from whichever dir holds it (never "no such entry": rule 3 of docs/correctness.md)."""
    key = master_key(b"pw")
    base = (tmp_path / "c" / "bookie-0").resolve()
    conf = {"logSizeLimit": str(512 * 1024), "dbStorage_writeCacheMaxSizeMb": "1",
            "entryLogFilePreallocationEnabled": "false",
            "ledgerDirectories": f"{base / 'ledgers'},{base / 'ledgers2'}"}
    payload = b"p" * 1000
    per_ledger = 300  # 2 x 300 KB after the fill: far more than the 128 KiB left on the tmpfs
    with LocalCluster(tmp_path / "c", bookies=1, small_ledger_dir_mb=16, bookie_conf=conf) as c:
        bid = c.bookie_ids[0]
        conn = RawConnection(bid)
        try:
            # Ledger 1 gets dir 2 (both empty: spread by id), ledger 2 the tmpfs (fewest logs).
            for lid in (1, 2):
                conn.send(m.AddRequest(key, _entry(lid, 0, payload)))
                assert conn.recv() == m.AddResponse(E.EOK, lid, 0)
            c.fill_ledger_dir(0, leave_bytes=128 * 1024)
            c.wait_until(lambda: "is full" in c.log_text(0), timeout_s=30, what="the tmpfs dir seen full")
            for eid in range(1, per_ledger):
                for lid in (1, 2):
                    conn.send(m.AddRequest(key, _entry(lid, eid, payload)))
            for _ in range(2 * (per_ledger - 1)):
                resp = conn.recv()
                assert isinstance(resp, m.AddResponse) and resp.status == E.EOK, resp
            assert bid in c.registered()[0]  # still writable: one dir has room
        finally:
            conn.close()
        c.restart(0)
        conn = RawConnection(bid)
        try:
            for lid in (1, 2):
                for eid in range(per_ledger):
                    conn.send(m.ReadRequest(lid, eid))
                    resp = conn.recv()
                    assert isinstance(resp, m.ReadResponse) and resp.status == E.EOK, (lid, eid, resp)
                    assert bytes(resp.entry) == _entry(lid, eid, payload)
            conn.send(m.AddRequest(key, _entry(2, per_ledger, payload)))  # and it goes on writing
            assert conn.recv() == m.AddResponse(E.EOK, 2, per_ledger)
        finally:
            conn.close()
        assert "ledger 2 continues in" in c.log_text(0)
