"""A real bookie process: wire protocol over loopback, admin HTTP, registration, shutdown,
bad input (malformed frames, wrong master key) without losing the connection of others."""

from __future__ import annotations

import struct
from pathlib import Path

from vellum import errors as E
from vellum.format.entry import DigestManager, DigestType, master_key
from vellum.proto import messages as m
from vellum.testing.local_cluster import LocalCluster
from vellum.testing.wire import RawConnection


def _entry(ledger_id: int, entry_id: int, payload: bytes, password: bytes = b"pw") -> bytes:
    return DigestManager(ledger_id, DigestType.CRC32C, password).compute(entry_id, entry_id - 1, 0, payload)


def test_add_read_fence_over_the_wire(cluster: LocalCluster) -> None:
    key = master_key(b"pw")
    conn = RawConnection(cluster.bookie_ids[0])
    try:
        for i in range(20):
            conn.send(m.AddRequest(key, _entry(5, i, b"payload %d" % i)))
        answers = [conn.recv() for _ in range(20)]
        assert answers == [m.AddResponse(E.EOK, 5, i) for i in range(20)]
        conn.send(m.ReadRequest(5, 7))
        resp = conn.recv()
        assert isinstance(resp, m.ReadResponse) and resp.status == E.EOK
        assert DigestManager(5, DigestType.CRC32C, b"pw").verify(resp.entry).payload == b"payload 7"
        conn.send(m.ReadRequest(5, 99))
        assert conn.recv() == m.ReadResponse(E.ENOENTRY, 5, 99)
        # Fencing LAC read: answered with the last entry once the fence is durable.
        conn.send(m.ReadRequest(5, -1, m.FLAG_DO_FENCING, key))
        resp = conn.recv()
        assert isinstance(resp, m.ReadResponse) and resp.status == E.EOK
        conn.send(m.AddRequest(key, _entry(5, 20, b"late")))
        assert conn.recv() == m.AddResponse(E.EFENCED, 5, 20)
        conn.send(m.AddRequest(key, _entry(5, 20, b"recovered"), m.FLAG_RECOVERY_ADD))
        assert conn.recv() == m.AddResponse(E.EOK, 5, 20)
        conn.send(m.ListEntriesRequest(1, 5))
        assert conn.recv() == m.ListEntriesResponse(1, E.EOK, 5, ((0, 20),))
    finally:
        conn.close()


def test_wrong_master_key_is_refused(cluster: LocalCluster) -> None:
    conn = RawConnection(cluster.bookie_ids[0])
    try:
        conn.send(m.AddRequest(master_key(b"right"), _entry(9, 0, b"x", b"right")))
        assert conn.recv() == m.AddResponse(E.EOK, 9, 0)
        conn.send(m.AddRequest(master_key(b"wrong"), _entry(9, 1, b"x", b"wrong")))
        assert conn.recv() == m.AddResponse(E.EUA, 9, 1)
        conn.send(m.ReadRequest(9, -1, m.FLAG_DO_FENCING, master_key(b"wrong")))
        assert conn.recv() == m.ReadResponse(E.EUA, 9, -1)
    finally:
        conn.close()


def test_malformed_frames(cluster: LocalCluster) -> None:
    key = master_key(b"pw")
    bystander = RawConnection(cluster.bookie_ids[0])
    bad = RawConnection(cluster.bookie_ids[0])
    try:
        # Intact framing, unknown opcode: an error answer and the connection keeps serving.
        body = struct.pack(">i", m.header_int(42)) + b"junk"
        bad.send_raw(struct.pack(">i", len(body)) + body)
        answer = bad.recv()
        assert isinstance(answer, m.ErrorResponse) and answer.status == E.EBADREQ
        # An ADD whose entry is too short: answered EBADREQ for those ids if recoverable.
        body = struct.pack(">i", m.header_int(m.OP_ADD)) + key + b"\x00" * 8
        bad.send_raw(struct.pack(">i", len(body)) + body)
        answer = bad.recv()
        assert getattr(answer, "status", None) == E.EBADREQ
        bad.send(m.AddRequest(key, _entry(11, 0, b"still served")))
        assert bad.recv() == m.AddResponse(E.EOK, 11, 0)
        # Broken framing (negative length): that connection is closed ...
        bad.send_raw(struct.pack(">i", -5) + b"xxxx")
        assert bad.closed_by_peer()
        # ... and the bookie still serves others.
        bystander.send(m.ReadRequest(11, 0))
        resp = bystander.recv()
        assert isinstance(resp, m.ReadResponse) and resp.status == E.EOK
    finally:
        bad.close()
        bystander.close()


def test_admin_http_and_clean_shutdown(cluster: LocalCluster) -> None:
    assert cluster.http_get(0, "/heartbeat").strip() == "OK"
    info = cluster.http_get(0, "/api/v1/bookie/info")
    assert info["totalSpace"] >= info["freeSpace"] > 0
    assert cluster.http_get(0, "/api/v1/bookie/state") == {
        "running": True, "readOnly": False, "shuttingDown": False, "availableForHighPriorityWrites": True,
    }
    assert cluster.http_get(0, "/api/v1/bookie/list_bookies?type=rw") == {cluster.bookie_ids[0]: None}
    metrics = cluster.http_get(0, "/metrics")
    assert "bookie_SERVER_STATUS 1.0" in metrics
    files = cluster.http_get(0, "/api/v1/bookie/list_disk_file?file_type=journal")
    assert files["journal files"].endswith(".txn")
    rw, _ro = cluster.registered()
    assert rw == {cluster.bookie_ids[0]}
    cluster.terminate(0)
    rw, ro = cluster.registered()
    assert not rw and not ro, "a clean shutdown deregisters the bookie"
    assert not (cluster.ledger_dir(0) / "current" / "DIRTY").exists(), "clean shutdown removes DIRTY"


def test_restart_replays_and_keeps_entries(cluster: LocalCluster) -> None:
    key = master_key(b"pw")
    conn = RawConnection(cluster.bookie_ids[0])
    for i in range(50):
        conn.send(m.AddRequest(key, _entry(3, i, b"x" * i)))
    assert all(conn.recv() == m.AddResponse(E.EOK, 3, i) for i in range(50))
    conn.close()
    cluster.kill(0)
    cluster.restart(0)
    conn = RawConnection(cluster.bookie_ids[0])
    try:
        for i in (0, 25, 49):
            conn.send(m.ReadRequest(3, i))
            resp = conn.recv()
            assert isinstance(resp, m.ReadResponse) and resp.status == E.EOK
            assert DigestManager(3, DigestType.CRC32C, b"pw").verify(resp.entry).payload == b"x" * i
    finally:
        conn.close()
    assert "unclean" in cluster.log_text(0)


def test_wiped_ledger_dir_is_refused(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "c", bookies=1) as c:
        c.terminate(0)
        import shutil

        shutil.rmtree(c.ledger_dir(0))
        c.restart(0, wait=False)
        c.wait_until(lambda: c._bookies[0].proc is not None and c._bookies[0].proc.poll() is not None,
                     timeout_s=30, what="bookie with a wiped dir exits")
        assert "cookie" in c.log_text(0).lower()


def test_admin_can_force_read_only(cluster: LocalCluster) -> None:
    import json
    import urllib.error
    import urllib.request

    bid = cluster.bookie_ids[0]
    req = urllib.request.Request(cluster.http_url(0) + "/api/v1/bookie/state/readonly",
                                 data=json.dumps({"readOnly": True}).encode(), method="PUT")
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert json.loads(resp.read()) == {"readOnly": True}
    cluster.wait_until(lambda: bid in cluster.registered()[1], what="read-only registration")
    req = urllib.request.Request(cluster.http_url(0) + "/api/v1/bookie/state/readonly",
                                 data=b'{"readOnly": "maybe"}', method="PUT")
    try:
        urllib.request.urlopen(req, timeout=10)
        raise AssertionError("a bad value must be refused")
    except urllib.error.HTTPError as e:
        assert e.code == 400 and "readOnly" in e.read().decode()
    try:
        cluster.http_get(0, "/api/v1/ledger/metadata?ledger_id=12345")
        raise AssertionError("an unknown ledger must be a 404")
    except urllib.error.HTTPError as e:
        assert e.code == 404


def test_a_failed_cluster_start_leaves_no_bookie_running(tmp_path: Path) -> None:
    """Two bookies given one port (what a port handed out twice did in CI): the second cannot
    start; the context manager raises and the first is stopped, not left running."""
    import pytest

    cluster = LocalCluster(tmp_path / "c", bookies=2)
    cluster._bookies[1].spec.port = cluster._bookies[0].spec.port
    with pytest.raises(RuntimeError, match="bookie"), cluster:
        pass
    procs = [b.proc for b in cluster._bookies if b.proc is not None]
    assert procs and all(p.poll() is not None for p in procs)


def test_bookie_with_every_disk_wiped_is_refused_and_recovery_keeps_acked_entries(tmp_path: Path) -> None:
    """Defect D1 of docs/correctness.md. E3 W3 A2 on 3 bookies: the last 22 acknowledged entries reached only
    two bookies, the writer died, and one of those two lost all its disks. Restarted on the same
    address it must refuse to start (the metadata store holds its cookie, its disks hold none),
    every time, so that recovery never takes its empty answers as proof that entries are absent."""
    import asyncio
    import shutil

    from vellum.aio import BookKeeper
    from vellum.config import ClientConfig

    cfg = ClientConfig(add_entry_timeout_s=2.0, read_entry_timeout_s=2.0)
    with LocalCluster(tmp_path / "c", bookies=3) as c:

        async def write() -> tuple[int, str, str]:
            async with BookKeeper(c.metadata_uri, config=cfg) as bk:
                lh = await bk.create_ledger(ensemble_size=3, write_quorum_size=3, ack_quorum_size=2, password=b"pw")
                for i in range(20):
                    await lh.append(b"e%d" % i)
                # The writer's last adds reach two bookies only, then it dies (never closes).
                b1, b2, _b3 = lh.metadata.ensembles[0]
                dm = DigestManager(lh.ledger_id, DigestType.CRC32C, b"pw")
                length = sum(len(b"e%d" % i) for i in range(20))
                for i in range(20, 42):
                    length += len(b"e%d" % i)
                    entry = dm.compute(i, i - 1, length, b"e%d" % i)
                    for b in (b1, b2):
                        await bk.bookie_client.add(b, master_key(b"pw"), entry, timeout_s=5)
                return lh.ledger_id, b1, b2

        ledger_id, wiped_id, _ = asyncio.run(write())
        wiped = c.bookie_ids.index(wiped_id)
        c.terminate(wiped)
        shutil.rmtree(c.journal_dir(wiped))
        shutil.rmtree(c.ledger_dir(wiped))
        for attempt in range(2):  # refused again: the first refusal stamped nothing
            c.restart(wiped, wait=False)
            c.wait_until(lambda: c._bookies[wiped].proc is not None and c._bookies[wiped].proc.poll() is not None,
                         timeout_s=30, what=f"wiped bookie exits (start {attempt + 1})")
            assert c._bookies[wiped].proc is not None and c._bookies[wiped].proc.returncode != 0
            assert "none of its directories" in c.log_text(wiped), c.log_text(wiped)[-2000:]
        assert not (c.ledger_dir(wiped) / "current" / "VERSION").exists()
        assert wiped_id not in c.registered()[0]

        async def recover() -> None:
            async with BookKeeper(c.metadata_uri, config=cfg) as bk:
                rh = await bk.open_ledger(ledger_id, password=b"pw")
                assert rh.metadata.last_entry_id == 41, "recovery kept every acknowledged entry"
                got = await rh.read(0, 41)
                assert [g.payload for g in got] == [b"e%d" % i for i in range(42)]

        asyncio.run(recover())
