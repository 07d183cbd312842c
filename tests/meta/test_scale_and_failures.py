"""20,000-ledger iteration on both ZooKeeper layouts, bad input, unreachable ZooKeeper, kill -9 of a writer."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from vellum.errors import ConfigError, MetadataStoreUnavailableError, MetaStoreError
from vellum.ids import BookieId, LedgerId
from vellum.meta import LedgerMetadata, open_metadata_store, parse_metadata_uri
from vellum.meta.model import serialize_ledger_metadata
from vellum.meta.zk import ZkLedgerManager, ZkMetadataStore
from vellum.testing.zookeeper import ZooKeeperServer, free_port

MD = LedgerMetadata(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1, ensembles={0: (BookieId("b:1"),)})


def populate_zk(store: ZkMetadataStore, ids: list[int]) -> None:
    """Fast populate: parents first, then async creates in flight together."""
    lm = store.ledgers
    assert isinstance(lm, ZkLedgerManager)
    data = serialize_ledger_metadata(MD)
    paths = [lm.ledger_path(i) for i in ids]
    for parent in sorted({p.rsplit("/", 1)[0] for p in paths}):
        store.client.ensure_path(parent)
    for k in range(0, len(paths), 2000):
        for r in [store.client.create_async(p, data) for p in paths[k:k + 2000]]:
            r.get(timeout=60)


@pytest.mark.parametrize("scheme", ["zk+flat", "zk+hierarchical", "zk+longhierarchical"])
def test_iterate_20000_ledgers(zk_server: ZooKeeperServer, scheme: str) -> None:
    with open_metadata_store(zk_server.uri(scheme, f"/big-{uuid.uuid4().hex[:8]}/ledgers")) as store:
        store.format()
        assert isinstance(store, ZkMetadataStore)
        ids = list(range(0, 40_000, 2))  # spans several hierarchical leaf nodes
        populate_zk(store, ids)
        ranges = list(store.ledgers.ledger_ranges())
        got = [i for r in ranges for i in r.ledger_ids]
        assert got == ids
        assert all(len(r.ledger_ids) <= 10_000 for r in ranges)
        if scheme != "zk+flat":
            assert len(ranges) == 4  # one per leaf node: ids 0..9999, 10000..19999, ...
        if scheme == "zk+longhierarchical":  # BookKeeper's 3/4/4/4/4 split, small ids too
            assert isinstance(store.ledgers, ZkLedgerManager)
            assert store.ledgers.ledger_path(42).endswith("/ledgers/000/0000/0000/0000/L0042")
        assert list(store.ledgers.iter_ledger_ids(LedgerId(39_990)))[:2] == [39_992, 39_994]


def test_corrupt_and_foreign_znodes_name_the_path(zk_server: ZooKeeperServer) -> None:
    with open_metadata_store(zk_server.uri("zk+hierarchical", f"/bad-{uuid.uuid4().hex[:8]}")) as store:
        store.format()
        assert isinstance(store, ZkMetadataStore)
        lm = store.ledgers
        assert isinstance(lm, ZkLedgerManager)
        lid, _ = lm.create_ledger(MD)
        path = lm.ledger_path(lid)
        store.client.set(path, b"\xff\x00junk")
        with pytest.raises(MetaStoreError, match=f"{path}.*not Vellum ledger metadata"):
            lm.read_ledger(lid)
        store.client.set(path, b"BookieMetadataFormatVersion\t3\n\x10\x01")
        with pytest.raises(MetaStoreError, match="BookKeeper's own"):
            lm.read_ledger(lid)
        store.client.set(path, b"VellumLedgerMetadata\t9\n{}")
        with pytest.raises(MetaStoreError, match="newer"):
            lm.read_ledger(lid)
        store.client.set(f"{store.root}/LAYOUT", b"garbage")
        with pytest.raises(MetaStoreError, match=f"{store.root}/LAYOUT"):
            store.layout.read_layout()


def test_missing_layout_and_layout_mismatch(zk_server: ZooKeeperServer, tmp_path: Path) -> None:
    root = f"/lay-{uuid.uuid4().hex[:8]}/ledgers"
    with open_metadata_store(zk_server.uri("zk", root)) as s:
        with pytest.raises(MetaStoreError, match=f"{root}/LAYOUT.*not formatted"):
            _ = s.ledgers
        s.format("hierarchical")
    with open_metadata_store(zk_server.uri("zk+flat", root)) as s, pytest.raises(
        MetaStoreError, match=r"flat ledger manager but .*hierarchical"
    ):
        _ = s.ledgers
    with open_metadata_store(f"sqlite://{tmp_path / 'm.db'}") as s, pytest.raises(
        MetaStoreError, match=r"LAYOUT.*not formatted"
    ):
        _ = s.ledgers


def test_zookeeper_unreachable_at_start() -> None:
    port = free_port()
    t0 = time.monotonic()
    with pytest.raises(MetadataStoreUnavailableError, match=f"127.0.0.1:{port}.*/ledgers"):
        open_metadata_store(f"zk://127.0.0.1:{port}/ledgers", connect_timeout_s=1.0)
    assert time.monotonic() - t0 < 30  # bounded, not a hang


def test_sqlite_bad_files(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(MetaStoreError, match=str(junk)):
        open_metadata_store(f"sqlite://{junk}")
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as c:
        c.execute("CREATE TABLE users(id)")
    c.close()
    with pytest.raises(MetaStoreError, match="not a Vellum metadata store"):
        open_metadata_store(f"sqlite://{foreign}")
    newer = tmp_path / "newer.db"
    open_metadata_store(f"sqlite://{newer}").close()
    with sqlite3.connect(newer) as c:
        c.execute("UPDATE vellum_meta SET value = '2' WHERE key = 'format_version'")
    c.close()
    with pytest.raises(MetaStoreError, match="format version 2 is newer"):
        open_metadata_store(f"sqlite://{newer}")
    # a corrupt ledger row names the file and the ledger
    good = tmp_path / "good.db"
    with open_metadata_store(f"sqlite://{good}") as s:
        s.format()
        lid, _ = s.ledgers.create_ledger(MD)
        with sqlite3.connect(good) as c:
            c.execute("UPDATE ledgers SET data = x'00ff' WHERE ledger_id = ?", (lid,))
        c.close()
        with pytest.raises(MetaStoreError, match=rf"good.db ledgers\[{lid}\]"):
            s.ledgers.read_ledger(lid)


@pytest.mark.parametrize(
    "uri",
    ["", "zk:/x", "zk://nohostport/ledgers", "zk://h:99999/l", "etcd://h:1/x", "mysql://h/x", "sqlite://rel.db"],
)
def test_bad_uris(uri: str) -> None:
    with pytest.raises(ConfigError, match="metadataServiceUri"):
        parse_metadata_uri(uri)


def test_uri_forms() -> None:
    assert parse_metadata_uri("sqlite:///./data/metadata.db").path == "./data/metadata.db"
    assert parse_metadata_uri("sqlite:///tmp/m.db").path == "/tmp/m.db"
    assert parse_metadata_uri("sqlite:////tmp/m.db").path == "/tmp/m.db"
    u = parse_metadata_uri("zk+flat://a:1,b:2/bk/ledgers")
    assert (u.hosts, u.root, u.ledger_manager_type) == ("a:1,b:2", "/bk/ledgers", "flat")
    assert parse_metadata_uri("zk://a:1").root == "/ledgers"


_WRITER = textwrap.dedent(
    """
    import sys
    from vellum.meta import open_metadata_store, LedgerMetadata
    md = LedgerMetadata(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1, ensembles={0: ("b:1",)})
    s = open_metadata_store(sys.argv[1])
    print("ready", flush=True)
    while True:
        lid, v = s.ledgers.create_ledger(md)
        v = s.ledgers.write_ledger(lid, md.closed(10, 100), v)
        s.kv.create(f"k/{lid}", b"x" * 100)
    """
)


def test_sqlite_survives_kill_9_of_writers(tmp_path: Path) -> None:
    uri = f"sqlite://{tmp_path / 'm.db'}"
    with open_metadata_store(uri) as s:
        s.format()
    for _ in range(3):
        procs = [subprocess.Popen([sys.executable, "-c", _WRITER, uri], stdout=subprocess.PIPE, text=True)
                 for _ in range(2)]
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().startswith("ready")
        time.sleep(0.5)  # let them write; the kill lands mid-transaction at some point
        for p in procs:
            os.kill(p.pid, signal.SIGKILL)
            p.wait(30)
            assert p.stdout is not None
            p.stdout.close()
    with open_metadata_store(uri) as s:
        with sqlite3.connect(tmp_path / "m.db") as c:
            assert c.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        c.close()
        ids = list(s.ledgers.iter_ledger_ids())
        assert ids
        for lid in ids:
            s.ledgers.read_ledger(lid)  # every stored ledger is whole and readable
        assert len(set(ids)) == len(ids)
