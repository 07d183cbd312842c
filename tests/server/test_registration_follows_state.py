"""A bookie's registration follows its state, even across a restart while its disk is full.

A bookie killed while read-only leaves its read-only registration behind until its metadata
session lapses; its restarted process waits for that before it registers. If the disk is freed
during that wait, the bookie turns writable, and the registration it finally writes must say
writable too (a stale read-only one would keep every client from choosing it). Real bookie
processes with a small tmpfs ledger dir, on both metadata drivers.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from vellum.client.blocking import BookKeeper
from vellum.config import ClientConfig
from vellum.testing.local_cluster import LocalCluster, tmpfs_available

pytestmark = pytest.mark.skipif(
    not tmpfs_available() and not os.environ.get("CI"), reason="cannot mount a tmpfs here (needs root)"
)

# A long session: the restarted bookie waits for the killed one's registration to lapse, and
# the disk is freed within that wait.
SESSION_MS = 15000


@pytest.fixture(params=["sqlite", "zk"])
def metadata_uri(request: pytest.FixtureRequest) -> str | None:
    if request.param == "sqlite":
        return None  # LocalCluster's embedded store
    zk = request.getfixturevalue("zk_server")
    return str(zk.uri("zk+hierarchical", f"/t-{uuid.uuid4().hex[:12]}/ledgers"))


def test_disk_freed_while_a_restarted_bookie_waits_to_register_leaves_it_writable(
        tmp_path: Path, metadata_uri: str | None) -> None:
    conf = {"zkTimeout": str(SESSION_MS), "logSizeLimit": str(512 * 1024), "dbStorage_writeCacheMaxSizeMb": "1",
            "entryLogFilePreallocationEnabled": "false"}
    with LocalCluster(tmp_path / "c", bookies=1, small_ledger_dir_mb=16, bookie_conf=conf,
                      metadata_uri=metadata_uri) as c:
        bid = c.bookie_ids[0]
        filler = c.fill_ledger_dir(0, leave_bytes=128 * 1024)
        c.wait_until(lambda: bid in c.registered()[1], timeout_s=30, what="read-only registration")

        c.kill(0)  # its read-only registration stays until its session lapses
        registered_before = c.log_text(0).count(f"registered {bid} as")
        c.restart(0, wait=False)

        def state() -> bool | None:
            try:
                return bool(c.http_get(0, "/api/v1/bookie/state")["readOnly"])
            except OSError:
                return None  # not serving HTTP yet

        c.wait_until(lambda: state() is True, timeout_s=60, what="the restarted bookie read-only")
        waiting = c.log_text(0).count(f"registered {bid} as") == registered_before
        assert waiting and bid in c.registered()[1], "the restarted bookie registered before the old session lapsed"
        filler.unlink()
        c.wait_until(lambda: state() is False, timeout_s=30, what="the restarted bookie writable")
        assert c.log_text(0).count(f"registered {bid} as") == registered_before, "the wait ended too early"

        # Once the old registration lapsed: writable in the store, and clients can use it.
        c.wait_until(lambda: c.registered() == (frozenset({bid}), frozenset()), timeout_s=3 * SESSION_MS / 1000 + 15,
                     what="a writable registration")
        with BookKeeper(c.metadata_uri, config=ClientConfig(metadata_service_uri=c.metadata_uri)) as bk:
            lh = bk.create_ledger(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1, password=b"pw")
            lh.append(b"after the disk was freed")
            lh.close()
        # ...and stays so (a late write of the stale state would undo it).
        assert c.registered() == (frozenset({bid}), frozenset())
