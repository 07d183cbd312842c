"""A bookie's metadata session is the one its ``bk_server.conf`` configures: ``zkTimeout`` is
the session timeout ZooKeeper negotiates with the bookie process (read back from the real
server with the ``cons`` four-letter word), for the bookie's registration session and for the
AutoRecovery client inside it; on the embedded store it is the bookie's lease."""

from __future__ import annotations

import re
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from vellum.testing.local_cluster import LocalCluster
from vellum.testing.zookeeper import ZooKeeperServer, missing_reason

ZK_TIMEOUT_MS = 4000  # not the 10000 default: a session that ignores zkTimeout shows it


@pytest.fixture(scope="module")
def zk_cons() -> Iterator[ZooKeeperServer]:
    """A ZooKeeper of our own that answers ``cons`` (the shared one answers no four-letter word)."""
    if missing_reason() is not None:
        pytest.skip(f"real ZooKeeper unavailable: {missing_reason()}")
    with ZooKeeperServer(four_letter_words=("cons",)) as server:
        yield server


def negotiated_timeouts(zk: ZooKeeperServer) -> dict[int, int]:
    """session id -> negotiated timeout (ms) of every connection the server has now."""
    out = {}
    for m in re.finditer(r"sid=0x([0-9a-f]+),.*?to=(\d+)", zk.four_letter_word("cons")):
        out[int(m.group(1), 16)] = int(m.group(2))
    return out


def test_zk_timeout_is_the_negotiated_session_timeout_of_a_bookie_process(tmp_path: Path,
                                                                          zk_cons: ZooKeeperServer) -> None:
    uri = zk_cons.uri("zk+hierarchical", f"/t-{uuid.uuid4().hex[:12]}/ledgers")
    before = set(negotiated_timeouts(zk_cons))
    conf = {"zkTimeout": str(ZK_TIMEOUT_MS), "autoRecoveryDaemonEnabled": "true"}
    with LocalCluster(tmp_path / "c", bookies=1, metadata_uri=uri, bookie_conf=conf) as c:
        bid = c.bookie_ids[0]
        zk = KazooClient(hosts=zk_cons.hosts)
        zk.start(10)
        try:
            root = uri.split(zk_cons.hosts, 1)[1]
            _, stat = zk.get(f"{root}/available/{bid}")
            owner = stat.ephemeralOwner
        finally:
            zk.stop()
            zk.close()
        assert negotiated_timeouts(zk_cons)[owner] == ZK_TIMEOUT_MS  # the registration's session
        # The AutoRecovery client in the bookie opens its own session, from the same file.
        # (The test's own sessions, LocalCluster's, keep the 10000 ms default.)
        c.wait_until(lambda: [t for s, t in negotiated_timeouts(zk_cons).items() if s not in before].count(
            ZK_TIMEOUT_MS) >= 2, timeout_s=30, what="the AutoRecovery session with zkTimeout")


def test_zk_timeout_is_the_lease_of_a_bookie_on_the_embedded_store(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "c", bookies=1, bookie_conf={"zkTimeout": str(ZK_TIMEOUT_MS)}) as c:
        db = sqlite3.connect(f"file:{c.base_dir / 'metadata.db'}?mode=ro", uri=True)
        try:
            rows = db.execute("SELECT s.timeout_s FROM registrations r JOIN sessions s USING(session_id)"
                              " WHERE r.bookie_id = ?", (c.bookie_ids[0],)).fetchall()
        finally:
            db.close()
        assert rows == [(ZK_TIMEOUT_MS / 1000,)]
