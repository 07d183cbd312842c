"""A bookie process whose journal disk dies leaves the writable set (docs/operations.md, "A
failed journal"). Its journal dir is a real ext4 filesystem on a loop device, shut down with
ext4's shutdown ioctl (every later write and fsync answers EIO). The bookie must register as
read-only at once, say why, keep answering what needs the journal with EIO and serve reads; a
client's new ledgers avoid it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from test_bookie_process import RawConnection, _entry

from vellum import errors as E
from vellum.client.blocking import BookKeeper
from vellum.config import ClientConfig
from vellum.format.entry import master_key
from vellum.proto import messages as m
from vellum.testing.local_cluster import LocalCluster
from vellum.testing.loop_fs import LoopFsUnavailable, ext4_loop_mount, shut_down


@pytest.fixture
def ext4_mount(tmp_path: Path) -> Iterator[Path]:
    try:
        with ext4_loop_mount(tmp_path / "ext4", size_mb=64) as mount:
            yield mount
    except LoopFsUnavailable as e:
        pytest.skip(f"no loop-mounted ext4 here: {e}")


def test_a_bookie_whose_journal_disk_dies_leaves_the_writable_set(tmp_path: Path, ext4_mount: Path) -> None:
    key = master_key(b"pw")
    c = LocalCluster(tmp_path / "c", bookies=4)
    # bookie 0's journal lives on the loop filesystem
    (ext4_mount / "journal").mkdir()
    c.journal_dir(0).parent.mkdir(parents=True, exist_ok=True)
    c.journal_dir(0).symlink_to(ext4_mount / "journal", target_is_directory=True)
    with c:
        bid = c.bookie_ids[0]
        conn = RawConnection(bid)
        try:
            conn.send(m.AddRequest(key, _entry(1, 0, b"before")))
            assert conn.recv() == m.AddResponse(E.EOK, 1, 0)
            assert c.registered()[0] == frozenset(c.bookie_ids)

            shut_down(ext4_mount)
            conn.send(m.AddRequest(key, _entry(1, 1, b"after the disk died")))
            assert conn.recv() == m.AddResponse(E.EIO, 1, 1)  # never success
            c.wait_until(lambda: bid in c.registered()[1] and bid not in c.registered()[0], timeout_s=10,
                         what="the read-only registration")
            state = c.http_get(0, "/api/v1/bookie/state")
            assert state["readOnly"] is True
            assert state["readOnlyReason"].startswith("journal failed: ")
            assert "restart the bookie after checking the journal disk" in state["readOnlyReason"]
            assert "bookie turned read-only until restarted: journal failed" in c.log_text(0)

            # reads are served; what needs the journal is not (EIO, never success)
            conn.send(m.ReadRequest(1, 0))
            resp = conn.recv()
            assert isinstance(resp, m.ReadResponse) and resp.status == E.EOK, resp
            conn.send(m.AddRequest(key, _entry(1, 1, b"recovery"), m.FLAG_RECOVERY_ADD))
            assert conn.recv() == m.AddResponse(E.EIO, 1, 1)
            conn.send(m.ReadRequest(2, -1, m.FLAG_DO_FENCING, key))
            fenced = conn.recv()
            assert isinstance(fenced, m.ReadResponse) and fenced.status != E.EOK, fenced
        finally:
            conn.close()

        # new ledgers avoid it, and what they hold reads back
        with BookKeeper(c.metadata_uri, config=ClientConfig(metadata_service_uri=c.metadata_uri)) as bk:
            for i in range(4):
                lh = bk.create_ledger(ensemble_size=3, write_quorum_size=3, ack_quorum_size=2, password=b"pw")
                ensemble = {str(b) for b in lh.metadata.ensembles[0]}
                assert bid not in ensemble, ensemble
                lh.append(b"entry %d" % i)
                lh.close()
                assert [e.payload for e in lh.read(0, 0)] == [b"entry %d" % i]
