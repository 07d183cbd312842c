"""Operator verbs on real bookie processes: bookieformat, bookiesanity, recoverbookie, and
replicationRateByBytes (through recoverbookie's --conf).

* bookieformat refuses a running bookie (registered; or holding its directories' lock, when
  the store named does not list it), wipes a stopped one's journal, ledger and index dirs as
  BookKeeper's format does; the stored cookie then keeps the empty bookie out (rule 6 of docs/correctness.md)
  until ``--delete-cookie``, after which it starts as a new bookie under its id;
* bookiesanity passes on a live bookie (and leaves no ledger behind), fails with a sentence on a
  stopped one;
* recoverbookie re-replicates a dead bookie's ledgers (an open one fenced and closed first):
  every entry reads back with the dead bookie gone, from every bookie of its write set, and no
  ensemble names it any more; with ``replicationRateByBytes`` the copy takes at least the time
  the bytes it copied (the worker's own counter) need at that rate.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from vellum.autorecovery import copier
from vellum.autorecovery.fragments import bookies_of, fragments
from vellum.cli.main import cli
from vellum.client.bookkeeper import BookKeeper
from vellum.format.entry import DigestManager, DigestType
from vellum.ids import BookieId
from vellum.meta import open_metadata_store
from vellum.testing.local_cluster import LocalCluster


def _shell(*args: str, ok: bool = True) -> Any:
    result = CliRunner().invoke(cli, ["shell", *args])
    if ok:
        assert result.exit_code == 0, result.output
    return result


def _conf(cluster: LocalCluster, i: int) -> str:
    return str(cluster.base_dir / f"bookie-{i}" / "bk_server.conf")


def _ledgers(uri: str) -> list[int]:
    with open_metadata_store(uri) as store:
        return [int(lid) for lid in store.ledgers.iter_ledger_ids()]


def _wait(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what} not reached within {timeout_s}s"
        time.sleep(0.2)


def _contents(d: Path) -> set[str]:
    return {str(p.relative_to(d)) for p in d.rglob("*") if p.is_file()}


def test_bookieformat_and_bookiesanity(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "c", bookies=3) as cluster:
        uri = cluster.metadata_uri
        victim = cluster.bookie_ids[2]
        before = _ledgers(uri)
        r = _shell("bookiesanity", "--uri", uri, "--bookieid", victim, "-n", "20")
        assert f"bookie {victim} passed the sanity check (20 entries" in r.output
        assert _ledgers(uri) == before  # its ledger is deleted
        _shell("simpletest", "--uri", uri, "-e", "3", "-w", "3", "-a", "3", "-n", "30")  # data on every bookie
        journal, ledgers = cluster.journal_dir(2), cluster.ledger_dir(2)
        assert any(n.endswith(".txn") for n in _contents(journal))

        r = _shell("bookieformat", "--conf", _conf(cluster, 2), "--force", ok=False)
        assert r.exit_code != 0 and f"bookie {victim} is running (registered" in r.output, r.output
        other = f"sqlite:///{tmp_path / 'other.db'}"  # a store that does not list it: the lock refuses
        _shell("metaformat", "--uri", other)
        r = _shell("bookieformat", "--conf", _conf(cluster, 2), "--uri", other, "--force", ok=False)
        assert r.exit_code != 0 and "is running" in r.output and "in use by process" in r.output, r.output
        assert any(n.endswith(".txn") for n in _contents(journal))  # nothing deleted

        cluster.terminate(2)
        _wait(lambda: victim not in cluster.registered()[0], 30, "the bookie unregistered")
        r = _shell("bookiesanity", "--uri", uri, "--bookieid", victim, ok=False)
        assert r.exit_code != 0 and f"bookie {victim} failed the sanity check" in r.output, r.output
        r = _shell("bookiesanity", "--uri", uri, "--bookieid", victim, "--json", ok=False)
        assert r.exit_code == 1 and json.loads(r.output)["passed"] is False

        r = _shell("bookieformat", "--conf", _conf(cluster, 2), "--force")
        assert "its cookie stays in the metadata store" in r.output
        for d in (journal, ledgers):
            assert _contents(d) <= {"current/.lock"}, (d, _contents(d))
        with open_metadata_store(uri) as store:
            assert store.registration.get_cookie(BookieId(victim)) is not None
        cluster.restart(2, wait=False)  # emptied disks, cookie in the store: refused (rule 6 of docs/correctness.md)

        def exited() -> bool:
            try:
                cluster.pid(2)
                return False
            except RuntimeError:
                return True
        _wait(exited, 60, "the formatted bookie refused")
        assert victim not in cluster.registered()[0]

        r = _shell("bookieformat", "--conf", _conf(cluster, 2), "--force", "--delete-cookie")
        assert "and its stored cookie deleted" in r.output
        cluster.restart(2)  # a new, empty bookie under its id
        _wait(lambda: victim in cluster.registered()[0], 30, "the formatted bookie registered")
        with open_metadata_store(uri) as store:
            assert store.registration.get_cookie(BookieId(victim)) is not None  # stamped anew
        _shell("bookiesanity", "--uri", uri, "--bookieid", victim)


def _payload(lid: int, eid: int) -> bytes:
    return f"{lid}:{eid}:".encode() * 100  # about 1 kB


async def _write(uri: str, ledgers: int, entries: int) -> tuple[list[int], int]:
    """Closed ledgers, and one more left open by a writer that went away."""
    ids = []
    async with BookKeeper(uri) as bk:
        for _ in range(ledgers):
            lh = await bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
            await asyncio.gather(*(lh.append_async(_payload(lh.ledger_id, e)) for e in range(entries)))
            await lh.close()
            ids.append(lh.ledger_id)
        lh = await bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
        await asyncio.gather(*(lh.append_async(_payload(lh.ledger_id, e)) for e in range(entries)))
        lh.abandon()
    return ids, lh.ledger_id


async def _check(uri: str, ids: list[int], entries: int, gone: str) -> None:
    async with BookKeeper(uri) as bk:
        bc = bk.context.bookie_client
        for lid in ids:
            md = (await bk.context.read_metadata(lid)).value
            assert md.is_closed and md.last_entry_id == entries - 1, (lid, md)
            assert gone not in bookies_of(md), (lid, md.ensembles)
            lh = await bk.open_ledger(lid)
            got = await lh.read(0, entries - 1)
            assert [e.payload for e in got] == [_payload(lid, e) for e in range(entries)]
            digest = DigestManager(lid, DigestType(int(md.digest_type)), md.password)
            for f in fragments(lid, md):  # every copy of every entry, on every bookie of its write set
                for e in f.entries(md.write_quorum_size):
                    assert digest.verify(await bc.read(f.bookie, lid, e), e).payload == _payload(lid, e)


def test_recoverbookie_heals_a_dead_bookies_ledgers_at_the_configured_rate(tmp_path: Path) -> None:
    entries, rate = 30, 20_000
    with LocalCluster(tmp_path / "c", bookies=4, bookie_conf={"zkTimeout": "4000"}) as cluster:
        uri = cluster.metadata_uri
        closed, open_id = asyncio.run(_write(uri, 6, entries))
        with open_metadata_store(uri) as store:
            victim = str(store.ledgers.read_ledger(open_id).value.ensembles[0][0])  # the open ledger is on it
            victim_index = cluster.bookie_ids.index(victim)
            on_victim = {lid for lid in [*closed, open_id]
                         if victim in bookies_of(store.ledgers.read_ledger(lid).value)}
        assert open_id in on_victim and len(on_victim) >= 3
        cluster.kill(victim_index)
        shutil.rmtree(cluster.ledger_dir(victim_index))
        shutil.rmtree(cluster.journal_dir(victim_index))
        _wait(lambda: victim not in cluster.registered()[0], 60, "the dead bookie unregistered")

        conf = tmp_path / "recover.conf"
        conf.write_text(f"replicationRateByBytes={rate}\n")
        copied_before = copier.BYTES_WRITTEN._value.get()
        t0 = time.monotonic()
        r = _shell("recoverbookie", "--uri", uri, "--conf", str(conf), victim, "--json")
        took = time.monotonic() - t0
        copied = copier.BYTES_WRITTEN._value.get() - copied_before
        out = r.output
        results = json.loads(out[out.index("{"):])["ledgers"]
        assert {int(k) for k in results} == on_victim and set(results.values()) == {"healed"}, results

        with open_metadata_store(uri) as store:  # the open ledger was fenced and closed by recoverbookie
            md = store.ledgers.read_ledger(open_id).value
            assert md.is_closed and md.last_entry_id == entries - 1, md
        asyncio.run(_check(uri, sorted([*closed, open_id]), entries, victim))
        # the bytes of every entry copied to a replacement, at most `rate` per second
        # (the first entry's bytes pass at once)
        assert copied >= len(_payload(0, 0)) * len(on_victim) * 10
        assert took >= (copied - 2 * len(_payload(999, 99))) / rate, (took, copied)
