"""A corrupted entry in a bookie's entry log, with real bookie processes (defect D5 of docs/correctness.md).

One payload byte of a synced entry is flipped on disk while its bookie is down. Restarted, the
bookie must answer that entry with an I/O error (EIO: not EOK with the bad bytes, not "no such
entry"), log it and count it; a client reading the ledger still gets every entry right, from
another replica, and the replica check names the bad copy.
"""

from __future__ import annotations

from pathlib import Path

from vellum import errors as E
from vellum.client.blocking import BookKeeper
from vellum.config import ClientConfig
from vellum.format.entry import DigestManager, DigestType
from vellum.proto import messages as m
from vellum.spark.jobs import check_ledger
from vellum.testing.local_cluster import LocalCluster
from vellum.testing.wire import RawConnection

CFG = ClientConfig(read_entry_timeout_s=5.0, speculative_read_timeout_ms=2000)
PASSWORD = b"pw"
ENTRIES = 30
BAD = 12  # BAD % ensemble == 0: the write set of BAD starts at ensemble index 0, the victim


def payload(i: int) -> bytes:
    return b"corrupt-entry-test-%04d|" % i + bytes(range(200))


def corrupt_reads(cluster: LocalCluster, i: int) -> float:
    text = cluster.http_get(i, "/metrics")
    total = 0.0
    for line in text.splitlines():
        if line.startswith("bookie_READ_ENTRY_CORRUPT_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def flip_payload_byte(ledger_dir: Path, needle: bytes) -> Path:
    """Flip a byte inside ``needle`` (a payload) in the one entry log holding it."""
    hits = []
    for log in sorted(ledger_dir.rglob("*.log")):
        data = log.read_bytes()
        at = data.find(needle)
        if at >= 0:
            assert data.find(needle, at + 1) < 0
            hits.append((log, at))
    assert len(hits) == 1, hits
    log, at = hits[0]
    with open(log, "r+b") as f:
        f.seek(at + 3)
        byte = f.read(1)
        f.seek(at + 3)
        f.write(bytes([byte[0] ^ 0x01]))
    return log


def test_corrupt_entry_is_an_io_error_and_the_client_reads_another_replica(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "cluster", bookies=3) as cluster:
        with BookKeeper(cluster.metadata_uri, config=CFG) as bk:
            lh = bk.create_ledger(ensemble_size=3, write_quorum_size=3, ack_quorum_size=3,
                                  digest_type="CRC32C", password=PASSWORD)
            for i in range(ENTRIES):
                lh.append(payload(i))
            lh.close()
            ledger_id = lh.ledger_id
            victim = cluster.bookie_ids.index(lh.metadata.ensembles[0][0])

        # A clean shutdown ends with a checkpoint: every entry is in the synced entry log and
        # the journal has nothing to replay over it at the restart.
        cluster.terminate(victim)
        log_file = flip_payload_byte(cluster.ledger_dir(victim), payload(BAD))
        cluster.restart(victim)

        dm = DigestManager(ledger_id, DigestType.CRC32C, PASSWORD)
        with RawConnection(cluster.bookie_ids[victim]) as conn:
            conn.send(m.ReadRequest(ledger_id, BAD))
            answer = conn.recv()
            assert isinstance(answer, m.ReadResponse)
            assert answer.status == E.EIO, E.WIRE_STATUS_NAMES.get(answer.status)
            # Its neighbours are served; a batch stops short before the corrupt entry, and a
            # batch starting at it is refused the same way.
            conn.send(m.ReadRequest(ledger_id, BAD - 1))
            answer = conn.recv()
            assert answer.status == E.EOK and dm.verify(answer.entry).payload == payload(BAD - 1)
            conn.send(m.BatchReadRequest(ledger_id, 0, 1, ENTRIES, 0))
            batch = conn.recv()
            assert isinstance(batch, m.BatchReadResponse) and batch.status == E.EOK
            assert [dm.verify(e).payload for e in batch.entries] == [payload(i) for i in range(BAD)]
            conn.send(m.BatchReadRequest(ledger_id, BAD, 2, ENTRIES, 0))
            batch = conn.recv()
            assert batch.status == E.EIO, E.WIRE_STATUS_NAMES.get(batch.status)
            # READ_STRIDED likewise (stride 3 from 0: 0, 3, 6, 9, then BAD).
            conn.send(m.StridedReadRequest(3, ledger_id, 0, 3, ENTRIES, 0))
            strided = conn.recv()
            assert isinstance(strided, m.StridedReadResponse) and strided.status == E.EOK
            assert [dm.verify(e).payload for e in strided.entries] == [payload(i) for i in range(0, BAD, 3)]
            conn.send(m.StridedReadRequest(4, ledger_id, BAD, 3, ENTRIES, 0))
            strided = conn.recv()
            assert strided.status == E.EIO, E.WIRE_STATUS_NAMES.get(strided.status)
        assert corrupt_reads(cluster, victim) == 3
        logged = [line for line in cluster.log_text(victim).splitlines() if "corrupt entry:" in line]
        assert len(logged) == 3
        assert f"ledger {ledger_id} entry {BAD} in entry log {log_file} at offset " in logged[0]
        assert "CRC32C digest mismatch" in logged[0]

        # A normal read of the ledger: the victim heads the write set of the whole batch and of
        # BAD, it answers EIO for BAD, and the client takes that entry from another replica.
        with BookKeeper(cluster.metadata_uri, config=CFG) as bk:
            rh = bk.open_ledger(ledger_id, password=PASSWORD, recovery=False)
            assert [e.payload for e in rh.read(0, ENTRIES - 1)] == [payload(i) for i in range(ENTRIES)]
            assert [e.payload for e in rh.read(BAD, BAD)] == [payload(BAD)]
            assert corrupt_reads(cluster, victim) >= 4  # the client did ask the victim
            # The replica check (``vellum spark replica-check --digests``) names the bad copy.
            rows = check_ledger(bk, ledger_id, digests=True)
        bad_rows = {r["bookie"]: r["digestMismatches"] for r in rows if r["digestMismatches"]}
        assert bad_rows == {cluster.bookie_ids[victim]: 1}
        assert all(r["missing"] == 0 for r in rows)
