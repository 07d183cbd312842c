"""AutoRecovery end to end on real bookie processes (the acceptance test of docs/autorecovery.md).

1. Five bookies, 200 ledgers E3 W2 A2 (two left open by a writer that went away), re-replication
   switched off, a bookie killed and its disks deleted: nothing is marked before the (long)
   lostBookieRecoveryDelay; `triggeraudit` marks exactly the ledgers that had fragments on it;
   `autorecovery enable` lets the workers in the bookies heal every one of them, and every entry
   is again on a full write quorum. The shell and the admin HTTP API show the state on the way.
2. Decommission under load: a bookie is stopped while a writer keeps appending; `vellum shell
   decommissionbookie` moves every ledger off it with progress and deletes its cookie; every
   acknowledged entry reads back.
3. A replica corrupted on a bookie that stays up is found by the replicas check
   (auditorReplicasCheckInterval) and replaced; every replica then verifies.
4. The bookies' workers pick replacements with the placement policy of their file: rack-aware
   (write quorums stay on two racks) and zone-aware (E=6 WQ=3 on three zones stay on three).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from vellum.autorecovery.auditor import Auditor
from vellum.autorecovery.fragments import bookies_of, fragments
from vellum.autorecovery.settings import AutoRecoverySettings
from vellum.cli.main import cli
from vellum.client.bookkeeper import BookKeeper
from vellum.client.named import NamedLedgers, OpenMode
from vellum.config import ClientConfig, build_config
from vellum.format.entry import DigestManager, DigestType
from vellum.ids import BookieId
from vellum.meta import open_metadata_store
from vellum.meta.model import LedgerMetadata
from vellum.standalone import format_if_needed
from vellum.testing.local_cluster import LocalCluster

BASE = {"autoRecoveryDaemonEnabled": "true", "rereplicationEntryBatchSize": "50",
        "openLedgerRereplicationGracePeriod": "2000", "rwRereplicateBackoffMs": "500"}


def _payload(lid: int, eid: int) -> bytes:
    return f"{lid}:{eid}:".encode() * 20


async def _write(uri: str, ledgers: int, entries: int, *, leave_open: int = 0) -> list[int]:
    ids = []
    async with BookKeeper(uri) as bk:
        for n in range(ledgers):
            lh = await bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
            await asyncio.gather(*(lh.append_async(_payload(lh.ledger_id, e)) for e in range(entries)))
            if n >= leave_open:
                await lh.close()
            else:
                lh.abandon()  # a writer that went away without closing
            ids.append(lh.ledger_id)
    return ids


async def _named_sessions(uri: str, name: str, sessions: int, per_session: int) -> list[int]:
    """Three writer sessions of a named ledger, the last one left open (its writer went away)."""
    ledgers = []
    for n in range(sessions):
        async with BookKeeper(uri) as bk:
            names = NamedLedgers(bk)
            mode = OpenMode.CREATE if n == 0 else OpenMode.APPEND
            h = await names.open(name, mode, ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
            for i in range(per_session):
                await h.append(b"named %d" % (n * per_session + i))
            assert h.ledger_id is not None
            ledgers.append(h.ledger_id)
            if n < sessions - 1:
                await h.close()
            await names.drain()
    return ledgers


async def _named_read_and_append(uri: str, name: str, count: int) -> None:
    async with BookKeeper(uri) as bk:
        names = NamedLedgers(bk)
        h = await names.open(name, OpenMode.APPEND)  # fences and recovers the open segment
        got = await h.read(0, count - 1)
        assert [e.payload for e in got] == [b"named %d" % i for i in range(count)]
        await h.append(b"after healing")
        await h.close()
        await names.drain()


def _metadata(uri: str, ids: list[int]) -> dict[int, LedgerMetadata]:
    with open_metadata_store(uri) as store:
        return {lid: store.ledgers.read_ledger(lid).value for lid in ids}


def _on(uri: str, ids: list[int], bookie: str) -> set[int]:
    return {lid for lid, md in _metadata(uri, ids).items() if bookie in bookies_of(md)}


def _shell(*args: str) -> Any:
    result = CliRunner().invoke(cli, ["shell", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def _shell_json(*args: str) -> Any:
    out = _shell(*args, "--json")
    return json.loads(out[out.index("{") if out.lstrip().startswith("{") else out.index("["):])


def _wait(predicate: Any, timeout_s: float, what: str, cluster: LocalCluster) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- bookie {i}\n" + cluster.log_text(i)[-1500:] for i in range(len(cluster.bookie_ids)))
            raise AssertionError(f"{what} not reached within {timeout_s}s\n{logs}")
        time.sleep(0.25)


async def _check_replicas(uri: str, ids: list[int], last_entry: dict[int, int]) -> None:
    """Every entry is on every bookie of its write set, intact (read and verified there)."""
    async with BookKeeper(uri) as bk:
        bc = bk.context.bookie_client
        for lid in ids:
            await bk.open_ledger(lid)  # closes ledgers whose writer went away
            md = (await bk.context.read_metadata(lid)).value
            assert md.is_closed and md.last_entry_id == last_entry[lid], (lid, md)
            digest = DigestManager(lid, DigestType(int(md.digest_type)), md.password)
            for f in fragments(lid, md):
                for e in f.entries(md.write_quorum_size):
                    raw = await bc.read(f.bookie, lid, e)
                    assert digest.verify(raw, e).payload == _payload(lid, e), (lid, e, f.bookie)


def test_a_lost_bookie_is_marked_on_trigger_and_healed_when_enabled(tmp_path: Path) -> None:
    entries = 10
    conf = {**BASE, "lostBookieRecoveryDelay": "3600"}
    with LocalCluster(tmp_path / "c", bookies=5, bookie_conf=conf) as cluster:
        uri = cluster.metadata_uri
        ids = asyncio.run(_write(uri, 200, entries, leave_open=2))
        named = asyncio.run(_named_sessions(uri, "events", 3, 15))
        _shell("autorecovery", "disable", "--uri", uri)
        _wait(lambda: _shell_json("whoisauditor", "--uri", uri)["auditor"] is not None, 30, "an auditor", cluster)
        victim_index = 2
        victim = cluster.bookie_ids[victim_index]
        on_victim = _on(uri, ids + named, victim)
        assert len(on_victim) > 50
        cluster.kill(victim_index)
        shutil.rmtree(cluster.ledger_dir(victim_index))
        shutil.rmtree(cluster.journal_dir(victim_index))
        _wait(lambda: victim not in (cluster.registered()[0] | cluster.registered()[1]), 60, "the victim unregistered",
              cluster)
        time.sleep(2)  # several auditor ticks: the delay (1 h) holds the marking back
        assert _shell_json("listunderreplicated", "--uri", uri) == []

        _shell("triggeraudit", "--uri", uri)
        _wait(lambda: {r["ledgerId"] for r in _shell_json("listunderreplicated", "--uri", uri)} == on_victim, 30,
              "the victim's ledgers marked", cluster)
        rows = _shell_json("listunderreplicated", "--uri", uri, "--missingreplica", victim)
        assert {r["ledgerId"] for r in rows} == on_victim and all(r["missingReplicas"] == [victim] for r in rows)
        live = next(i for i in range(5) if i != victim_index)
        info = cluster.http_get(live, "/api/v1/bookie/cluster_info")
        assert info["clusterUnderReplicated"] is True and info["ledgerReplicationEnabled"] is False
        assert info["auditorElected"] is True
        assert cluster.http_get(live, "/api/v1/autorecovery/who_is_auditor")["Auditor"] == info["auditorId"]
        status = cluster.http_get(live, "/api/v1/autorecovery/status")
        assert (status["enabled"], status["clusterUnderReplicated"], status["ledgersThatCannotHeal"]) == (
            False, True, 0), status
        assert cluster.http_get(live, "/api/v1/autorecovery/lost_bookie_recovery_delay") == {
            "lostBookieRecoveryDelay": 3600}
        listed = cluster.http_get(live, f"/api/v1/autorecovery/list_under_replicated_ledger?missingreplica={victim}")
        assert {r["ledgerId"] for r in listed} == on_victim
        assert _on(uri, ids + named, victim) == on_victim  # switched off: nothing moved

        _shell("autorecovery", "enable", "--uri", uri)
        _wait(lambda: not _on(uri, ids + named, victim) and not _shell_json("listunderreplicated", "--uri", uri), 180,
              "every ledger healed", cluster)
        asyncio.run(_check_replicas(uri, ids, {lid: entries - 1 for lid in ids}))
        assert not _on(uri, named, victim)  # the named ledger's segments healed like any ledger
        asyncio.run(_named_read_and_append(uri, "events", 45))
        metrics = "".join(str(cluster.http_get(i, "/metrics")) for i in range(5) if i != victim_index)
        assert "replication_worker_NUM_ENTRIES_WRITTEN_total" in metrics


class _Writer:
    """Appends to three open ledgers from a thread of its own until stopped (bounded)."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.acked: dict[int, int] = {}
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        try:
            async with BookKeeper(self.uri) as bk:
                handles = [await bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
                           for _ in range(3)]
                deadline = time.monotonic() + 120
                n = 0
                while not self.stop.is_set() and time.monotonic() < deadline and n < 20000:
                    for h in handles:
                        eid = await h.append(_payload(h.ledger_id, n))
                        assert eid == n
                        self.acked[h.ledger_id] = eid
                    n += 1
                    await asyncio.sleep(0.005)
                for h in handles:
                    await h.close()
        except BaseException as e:
            self.error = e


def test_decommission_under_load_moves_every_ledger_and_deletes_the_cookie(tmp_path: Path) -> None:
    conf = {**BASE, "lostBookieRecoveryDelay": "3600"}
    with LocalCluster(tmp_path / "c", bookies=5, bookie_conf=conf) as cluster:
        uri = cluster.metadata_uri
        closed = asyncio.run(_write(uri, 30, 20))
        writer = _Writer(uri)
        writer.thread.start()
        _wait(lambda: len(writer.acked) == 3 and min(writer.acked.values()) > 50, 30, "the writer going", cluster)
        victim_index = 1
        victim = cluster.bookie_ids[victim_index]
        cluster.terminate(victim_index)  # a clean stop: the operator retires it
        _wait(lambda: victim not in (cluster.registered()[0] | cluster.registered()[1]), 60, "the victim unregistered",
              cluster)
        result = CliRunner().invoke(cli, ["shell", "decommissionbookie", "--uri", uri, "--bookieid", victim,
                                          "--timeout", "180"], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        assert "decommissioned" in result.output
        assert writer.error is None and writer.thread.is_alive()  # the writer kept writing meanwhile
        writer.stop.set()
        writer.thread.join(60)
        assert writer.error is None, writer.error
        ids = closed + sorted(writer.acked)
        assert not _on(uri, ids, victim)
        with open_metadata_store(uri) as store:
            assert store.registration.get_cookie(BookieId(victim)) is None
        last = {lid: 19 for lid in closed} | writer.acked
        asyncio.run(_check_replicas(uri, ids, last))


def _corrupt_one_entry(ledger_dir: Path, needle: bytes) -> None:
    for log in (ledger_dir / "current").glob("*.log"):
        data = bytearray(log.read_bytes())
        at = data.find(needle)
        if at >= 0:
            data[at + 3] ^= 0xFF
            log.write_bytes(bytes(data))
            return
    raise AssertionError(f"{needle!r} is in no entry log of {ledger_dir}")


def test_the_replicas_check_finds_a_corrupt_replica_on_a_live_bookie_and_it_is_replaced(tmp_path: Path) -> None:
    conf = {**BASE, "lostBookieRecoveryDelay": "3600", "auditorReplicasCheckInterval": "2", "flushInterval": "200"}
    with LocalCluster(tmp_path / "c", bookies=4, bookie_conf=conf) as cluster:
        uri = cluster.metadata_uri
        _shell("autorecovery", "disable", "--uri", uri)  # nothing checked or healed before the damage
        (lid,) = asyncio.run(_write(uri, 1, 30))
        md = _metadata(uri, [lid])[lid]
        bookie = str(md.ensembles[0][0])
        index = cluster.bookie_ids.index(bookie)
        time.sleep(1.0)  # several checkpoints: the entries are in the entry logs, not only cached
        cluster.terminate(index)
        _corrupt_one_entry(cluster.ledger_dir(index), _payload(lid, 0)[:40])  # entry 0 is on position 0
        cluster.restart(index)
        _wait(lambda: lid in {r["ledgerId"] for r in _shell_json("listunderreplicated", "--uri", uri)}, 60,
              "the corrupt replica found by the replicas check", cluster)
        _shell("autorecovery", "enable", "--uri", uri)
        _wait(lambda: bookie not in bookies_of(_metadata(uri, [lid])[lid])
              and not _shell_json("listunderreplicated", "--uri", uri), 60, "the replica replaced", cluster)
        asyncio.run(_check_replicas(uri, [lid], {lid: 29}))


def test_the_workers_in_the_bookies_pick_replacements_with_the_placement_policy_of_the_bookies_file(
        tmp_path: Path) -> None:
    """bk_server.conf's ensemblePlacementPolicy=rackaware governs the replacement bookies the
    bookies' own workers pick: a write quorum spread over two racks stays spread after healing."""
    racks = tmp_path / "racks.txt"
    conf = {**BASE, "lostBookieRecoveryDelay": "0", "ensemblePlacementPolicy": "rackaware",
            "enforceMinNumRacksPerWriteQuorum": "true"}
    cluster = LocalCluster(tmp_path / "c", bookies=4, bookie_conf=conf)
    rack_of = {b: "/a" if i < 2 else "/b" for i, b in enumerate(cluster.bookie_ids)}
    # every bookie is on 127.0.0.1 here, so the racks come from the stored mapping (by bookie id),
    # not from a topology script (by host)
    racks.write_text("".join(f"{b} {r}\n" for b, r in rack_of.items()))
    format_if_needed(cluster.metadata_uri)
    _shell("racks", "--uri", cluster.metadata_uri, "--file", str(racks))
    client = ClientConfig(ensemble_placement_policy="rackaware", enforce_min_num_racks_per_write_quorum=True)
    victim_index = 2
    victim = cluster.bookie_ids[victim_index]

    async def write() -> list[int]:
        ids = []
        async with BookKeeper(cluster.metadata_uri, config=client) as bk:
            while len(ids) < 12:
                lh = await bk.create_ledger(ensemble_size=2, write_quorum_size=2, ack_quorum_size=2)
                await asyncio.gather(*(lh.append_async(_payload(lh.ledger_id, e)) for e in range(5)))
                await lh.close()
                if victim in map(str, lh.metadata.ensembles[0]):
                    ids.append(lh.ledger_id)
        return ids

    with cluster:
        ids = asyncio.run(write())
        cluster.kill(victim_index)
        shutil.rmtree(cluster.ledger_dir(victim_index))
        shutil.rmtree(cluster.journal_dir(victim_index))
        _wait(lambda: not _on(cluster.metadata_uri, ids, victim), 120, "every ledger healed", cluster)
        for lid, md in _metadata(cluster.metadata_uri, ids).items():
            assert {rack_of[str(b)] for b in md.ensembles[0]} == {"/a", "/b"}, (lid, md.ensembles)
        asyncio.run(_check_replicas(cluster.metadata_uri, ids, {lid: 4 for lid in ids}))


def test_zoneaware_ledgers_keep_three_zones_in_every_write_quorum_after_autorecovery(tmp_path: Path) -> None:
    """Nine bookies in three zones (the mapping `vellum shell racks` stores, read by the bookies'
    AutoRecovery and by the client), ensemblePlacementPolicy=zoneaware with BookKeeper's class name
    and strict placement: ledgers E=6 WQ=3 have one bookie per zone in every write quorum; a bookie
    is lost and the bookies' workers replace it, after which every write quorum still spans three
    zones (only a bookie of the lost one's zone keeps that; two of the three candidates are not)."""
    policy = "org.apache.bookkeeper.client.ZoneawareEnsemblePlacementPolicy"
    conf = {**BASE, "lostBookieRecoveryDelay": "0", "ensemblePlacementPolicy": policy,
            "minNumZonesPerWriteQuorum": "2", "desiredNumZonesPerWriteQuorum": "3",
            "enforceStrictZoneawarePlacement": "true"}
    cluster = LocalCluster(tmp_path / "c", bookies=9, bookie_conf=conf)
    zone_of = {b: f"/zone{i % 3}" for i, b in enumerate(cluster.bookie_ids)}
    format_if_needed(cluster.metadata_uri)
    _shell("racks", "--uri", cluster.metadata_uri,
           *(arg for i, b in enumerate(cluster.bookie_ids) for arg in ("--set", f"{b}={zone_of[b]}/ud{i // 3}")))
    client = build_config(ClientConfig, {"ensemblePlacementPolicy": policy})
    victim_index = 0
    victim = cluster.bookie_ids[victim_index]

    def zones_per_write_quorum(ensemble: Any) -> set[int]:
        zones = [zone_of[str(b)] for b in ensemble]
        return {len({zones[(s + j) % 6] for j in range(3)}) for s in range(6)}

    async def write() -> list[int]:
        ids: list[int] = []
        async with BookKeeper(cluster.metadata_uri, config=client) as bk:
            for _ in range(40):
                if len(ids) >= 6:
                    break
                lh = await bk.create_ledger(ensemble_size=6, write_quorum_size=3, ack_quorum_size=2)
                await asyncio.gather(*(lh.append_async(_payload(lh.ledger_id, e)) for e in range(12)))
                await lh.close()
                assert zones_per_write_quorum(lh.metadata.ensembles[0]) == {3}, lh.metadata.ensembles
                if victim in map(str, lh.metadata.ensembles[0]):
                    ids.append(lh.ledger_id)
        return ids

    async def badly_placed() -> int:
        """A ledger the default (random) policy put with one write quorum in a single zone, not
        on the victim (healing it would replace a member and might mend its placement)."""
        async with BookKeeper(cluster.metadata_uri, config=ClientConfig()) as bk:
            for _ in range(200):
                lh = await bk.create_ledger(ensemble_size=6, write_quorum_size=3, ack_quorum_size=2)
                await lh.close()
                if 1 in zones_per_write_quorum(lh.metadata.ensembles[0]) and \
                        victim not in map(str, lh.metadata.ensembles[0]):
                    return lh.ledger_id
                await bk.delete_ledger(lh.ledger_id)
        raise AssertionError("no single-zone write quorum off the victim in 200 random ensembles")

    async def placement_check() -> int:
        """The auditor's placement check, with the zone-aware policy the bookies use."""
        async with BookKeeper(cluster.metadata_uri, config=client) as bk:
            return await Auditor(bk, AutoRecoverySettings()).placement_check()

    with cluster:
        ids = asyncio.run(write())
        assert len(ids) >= 6
        asyncio.run(badly_placed())
        assert asyncio.run(placement_check()) == 1
        cluster.kill(victim_index)
        shutil.rmtree(cluster.ledger_dir(victim_index))
        shutil.rmtree(cluster.journal_dir(victim_index))
        _wait(lambda: not _on(cluster.metadata_uri, ids, victim), 180, "every ledger healed", cluster)
        for lid, md in _metadata(cluster.metadata_uri, ids).items():
            assert list(md.ensembles) == [0], (lid, md.ensembles)
            assert zones_per_write_quorum(md.ensembles[0]) == {3}, (lid, md.ensembles)
        assert asyncio.run(placement_check()) == 1  # the replacements adhere, the random ledger still not
        asyncio.run(_check_replicas(cluster.metadata_uri, ids, {lid: 11 for lid in ids}))
