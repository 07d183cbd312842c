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
