"""Named ledgers on real bookie processes, on both metadata drivers (embedded store, ZooKeeper).

Covers the cases of docs/named-ledgers.md: CREATE/APPEND errors, two writers racing for APPEND, a writer killed
mid-stream then re-opened, a reader tailing across three writer sessions, shrink with and
without force while a reader tails, cursors by CAS, publish_segments atomicity, delete, and the
metadata-operation count of an APPEND acquisition.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from names_testkit import CountingStore, run, unique_name

from vellum.client.bookkeeper import BookKeeper
from vellum.client.named import (
    EntriesShrunkError,
    NamedLedgerEntry,
    NamedLedgerHandle,
    NamedLedgers,
    OpenMode,
)
from vellum.errors import (
    LedgerExistsError,
    LedgerFencedError,
    MetadataVersionError,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnauthorizedAccessError,
)
from vellum.meta import open_metadata_store
from vellum.testing.local_cluster import LocalCluster

QUORUM = {"ensemble_size": 3, "write_quorum_size": 2, "ack_quorum_size": 2}
HERE = Path(__file__).parent


def payload(entry_id: int) -> bytes:
    return f"entry-{entry_id}".encode() * 8


async def append_many(h: NamedLedgerHandle, count: int) -> list[int]:
    first = h.last_add_confirmed + 1
    return list(await asyncio.gather(*(h.append_async(payload(first + i)) for i in range(count))))


async def append_one_by_one(h: NamedLedgerHandle, count: int) -> None:
    # Sequential adds carry the advancing LAC, so tailing readers see them without a close.
    for _ in range(count):
        await h.append(payload(h.last_add_confirmed + 1))


def check_entries(entries: list[NamedLedgerEntry], first: int, last: int) -> None:
    assert [e.entry_id for e in entries] == list(range(first, last + 1))
    for e in entries:
        assert e.payload == payload(e.entry_id), e.entry_id


async def collect(h: NamedLedgerHandle, start: int, count: int, out: list[NamedLedgerEntry]) -> None:
    async for e in h.tail(start, poll_timeout_s=0.2):
        out.append(e)
        if len(out) >= count:
            return


def test_create_existing_and_append_missing_give_clear_errors(cluster: LocalCluster) -> None:
    async def main() -> None:
        async with BookKeeper(cluster.metadata_uri) as bk:
            named = NamedLedgers(bk)
            name = unique_name()
            with pytest.raises(NoSuchLedgerError, match="APPEND needs an existing name"):
                await named.open(name, OpenMode.APPEND)
            with pytest.raises(NoSuchLedgerError):
                await named.open(name, OpenMode.READ_ONLY)
            h = await named.open(name, OpenMode.CREATE, password=b"pw", **QUORUM)
            assert await append_many(h, 3) == [0, 1, 2]
            check_entries(await h.read(0, 2), 0, 2)  # a writer reads its own confirmed entries
            with pytest.raises(LedgerExistsError, match="already exists"):
                await named.open(name, OpenMode.CREATE, password=b"pw")
            with pytest.raises(UnauthorizedAccessError):
                await named.open(name, OpenMode.APPEND, password=b"wrong")
            await h.close()
            h2 = await named.open(name, OpenMode.CREATE_OR_APPEND, password=b"pw")
            assert await append_many(h2, 2) == [3, 4]
            await h2.close()
            assert name in await named.list(name.rsplit("/", 1)[0])
            r = await named.open(name, OpenMode.READ_ONLY, password=b"pw")
            check_entries(await r.read(0, 4), 0, 4)
            with pytest.raises(NoSuchLedgerError):  # nothing was created by the failed CREATE
                await named.open(unique_name(), OpenMode.APPEND)
            await named.drain()

    run(main())


def test_two_writers_race_for_append(cluster: LocalCluster) -> None:
    async def main() -> None:
        async with BookKeeper(cluster.metadata_uri) as bk1, BookKeeper(cluster.metadata_uri) as bk2:
            n1, n2 = NamedLedgers(bk1), NamedLedgers(bk2)
            name = unique_name()
            h = await n1.open(name, OpenMode.CREATE, **QUORUM)
            await append_many(h, 5)  # left open: the racers must fence it
            expected_last = 4
            for _round in range(3):
                opened = await asyncio.gather(n1.open(name, OpenMode.APPEND), n2.open(name, OpenMode.APPEND),
                                              return_exceptions=True)
                winners = []
                for o in opened:
                    if isinstance(o, BaseException):
                        assert isinstance(o, LedgerFencedError), o
                        continue
                    try:
                        await append_many(o, 5)
                        winners.append(o)
                    except LedgerFencedError:
                        pass  # acquired first, then fenced by the other one
                assert len(winners) == 1, opened
                w = winners[0]
                assert w.last_add_confirmed == expected_last + 5
                expected_last += 5
                # the loser (if it opened) stays fenced
                for o in opened:
                    if isinstance(o, NamedLedgerHandle) and o is not w:
                        with pytest.raises(LedgerFencedError):
                            await o.append(b"late")
                        await o.close()
            await w.close()
            r = await n2.open(name, OpenMode.READ_ONLY)
            assert r.last_add_confirmed == expected_last
            check_entries(await r.read(0, expected_last), 0, expected_last)
            await n1.drain()
            await n2.drain()

    run(main())


def test_writer_killed_mid_stream_then_reopened(cluster: LocalCluster) -> None:
    name = unique_name()

    async def create() -> None:
        async with BookKeeper(cluster.metadata_uri) as bk:
            h = await NamedLedgers(bk).open(name, OpenMode.CREATE, **QUORUM)
            await append_many(h, 10)
            await h.close()

    run(create())
    proc = subprocess.Popen([sys.executable, str(HERE / "named_writer_proc.py"), cluster.metadata_uri, name, "1000000"],
                            stdout=subprocess.PIPE, text=True)
    watchdog = threading.Timer(60, proc.kill)  # a hung writer must not hang the suite
    watchdog.start()
    acked: list[int] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("ACK "):
                acked.append(int(line.split()[1]))
                if len(acked) >= 300:
                    break
        proc.send_signal(signal.SIGKILL)
        # Read the rest through the same text stream: lines it already buffered would be lost to
        # communicate(timeout=...), which reads the pipe's fd directly.
        rest = proc.stdout.read()
        proc.stdout.close()
        proc.wait(timeout=30)
        acked += [int(x.split()[1]) for x in rest.splitlines() if x.startswith("ACK ")]
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert acked == list(range(10, 10 + len(acked)))

    async def reopen() -> None:
        async with BookKeeper(cluster.metadata_uri) as bk:
            named = NamedLedgers(bk)
            h = await named.open(name, OpenMode.APPEND)
            recovered = h.last_add_confirmed
            assert recovered >= acked[-1]  # no acknowledged entry lost
            ids = await append_many(h, 5)
            assert ids == list(range(recovered + 1, recovered + 6))  # ids continue, no gap
            await h.close()
            r = await named.open(name, OpenMode.READ_ONLY)
            check_entries(await r.read(0, recovered + 5), 0, recovered + 5)  # no gap visible
            await named.drain()

    run(reopen())


def test_tailing_reader_across_three_writer_sessions(cluster: LocalCluster) -> None:
    async def main() -> None:
        async with BookKeeper(cluster.metadata_uri) as bk, BookKeeper(cluster.metadata_uri) as rbk:
            named = NamedLedgers(bk)
            name = unique_name()
            await (await named.open(name, OpenMode.CREATE, **QUORUM)).close()  # empty: no segment left
            reader = await NamedLedgers(rbk).open(name, OpenMode.READ_ONLY)
            got: list[NamedLedgerEntry] = []
            tail = asyncio.ensure_future(collect(reader, 0, 60, got))
            s1 = await named.open(name, OpenMode.APPEND)
            await append_many(s1, 20)
            await s1.close()  # clean close
            s2 = await named.open(name, OpenMode.APPEND)
            await append_many(s2, 20)  # abandoned open: the next session fences and recovers it
            s3 = await named.open(name, OpenMode.APPEND)
            with pytest.raises(LedgerFencedError):
                await s2.append(b"stale")
            await append_many(s3, 20)
            await s3.close()
            await asyncio.wait_for(tail, 30)
            check_entries(got, 0, 59)
            assert len({e.ledger_id for e in got}) == 3
            await named.drain()

    run(main())


@pytest.mark.parametrize("force", [False, True], ids=["no-force", "force"])
def test_shrink_while_a_reader_tails(cluster: LocalCluster, force: bool) -> None:
    async def main() -> None:
        async with BookKeeper(cluster.metadata_uri) as bk, BookKeeper(cluster.metadata_uri) as rbk:
            named = NamedLedgers(bk)
            name = unique_name()
            s1 = await named.open(name, OpenMode.CREATE, **QUORUM)
            await append_many(s1, 30)
            await s1.close()
            w = await named.open(name, OpenMode.APPEND)
            await append_one_by_one(w, 30)
            first_ledger = (await named.record(name)).value.segments[0].ledger_id
            reader = await NamedLedgers(rbk).open(name, OpenMode.READ_ONLY)
            got: list[NamedLedgerEntry] = []
            tail = asyncio.ensure_future(collect(reader, 0, 80, got))
            for _ in range(300):
                if len(got) >= 40:
                    break
                await asyncio.sleep(0.05)
            assert len(got) >= 40
            shrunk = await w.shrink(35, force=force)
            assert shrunk.start_entry_id == 35 and shrunk.collected
            await append_many(w, 20)
            await w.close()
            await asyncio.wait_for(tail, 30)
            check_entries(got, 0, 79)  # the tailing reader, ahead of the shrink point, lost nothing

            fresh = await NamedLedgers(rbk).open(name, OpenMode.READ_ONLY)
            assert fresh.start_entry_id == 35
            with pytest.raises(EntriesShrunkError):
                await fresh.read(30, 40)
            check_entries(await fresh.read(35, 79), 35, 79)
            rec = (await named.record(name)).value
            second = rec.segment_for(35)
            assert second is not None
            raw = await bk.open_ledger(second.ledger_id, recovery=False)
            if force:
                assert rec.segments[0].ledger_id != first_ledger  # whole segment dropped
                assert not await bk.ledger_exists(first_ledger)
                assert rec.trimmed_to == 35
                with pytest.raises(NoSuchEntryError):  # trimmed on the bookies: 30..34 are local 0..4
                    await raw.read_unconfirmed(0, 0)
            else:
                assert rec.segments[0].ledger_id == first_ledger
                assert await bk.ledger_exists(first_ledger)
                assert (await raw.read_unconfirmed(0, 0))[0].payload == payload(30)
            assert (await raw.read_unconfirmed(5, 5))[0].payload == payload(35)  # never touched
            await named.drain()

    run(main())


def test_cursors_by_compare_and_set(cluster: LocalCluster) -> None:
    async def main() -> None:
        async with BookKeeper(cluster.metadata_uri) as bk, BookKeeper(cluster.metadata_uri) as bk2:
            named, other = NamedLedgers(bk), NamedLedgers(bk2)
            name = unique_name()
            w = await named.open(name, OpenMode.CREATE, **QUORUM)
            await append_many(w, 3)
            value, version = w.get_cursor("sink")
            assert value is None
            v2 = await w.set_cursor("sink", b"batch-1", version)
            with pytest.raises(MetadataVersionError):
                await other.set_cursor(name, "sink", b"batch-x", version)  # stale
            assert await other.get_cursor(name, "sink") == (b"batch-1", v2)
            v3 = await other.set_cursor(name, "sink", b"batch-2", v2)
            with pytest.raises(MetadataVersionError):
                await w.set_cursor("sink", b"batch-y", v2)
            # the writer keeps working on top of cursor changes made by others
            await append_many(w, 3)
            await w.close()
            rec = (await named.record(name)).value
            assert rec.cursors == {"sink": b"batch-2"}
            assert rec.state == "CLOSED" and rec.closed_end == 6
            v4 = (await named.record(name)).version
            assert v4 != v3
            await named.set_cursor(name, "sink", None, v4)
            assert (await named.get_cursor(name, "sink"))[0] is None
            await named.drain()

    run(main())


def test_publish_segments_is_atomic(cluster: LocalCluster) -> None:
    async def main() -> None:
        async with BookKeeper(cluster.metadata_uri) as bk, BookKeeper(cluster.metadata_uri) as bk2:
            named, other = NamedLedgers(bk), NamedLedgers(bk2)
            name = unique_name()
            w = await named.open(name, OpenMode.CREATE, password=b"pw", **QUORUM)
            await append_many(w, 5)  # an open writer segment: publish fences and closes it
            pre: list[int] = []
            for count, base in ((3, 5), (4, 8)):
                lh = await bk.create_ledger(password=b"pw", **QUORUM)
                for i in range(count):
                    await lh.append(payload(base + i))
                await lh.close()
                pre.append(lh.ledger_id)
            before = await named.record(name)
            await other.set_cursor(name, "other", b"x", before.version)  # a conflicting change
            with pytest.raises(MetadataVersionError):
                await named.publish_segments(name, pre, expected_version=before.version,
                                             cursor_updates={"sink": b"batch-1"})
            after = await named.record(name)
            assert after.value.segments == before.value.segments  # nothing visible
            assert "sink" not in after.value.cursors
            assert await append_many(w, 1) == [5]  # the writer was not fenced by the failed publish

            v = await named.publish_segments(name, pre, expected_version=after.version,
                                             cursor_updates={"sink": b"batch-1"})
            rec = (await named.record(name)).value
            assert (await named.record(name)).version == v
            assert [(s.first_entry_id, s.last_entry_id) for s in rec.segments] == [(0, 5), (6, 8), (9, 12)]
            assert rec.cursors["sink"] == b"batch-1"
            with pytest.raises(LedgerFencedError):
                await w.append(b"stale")
            r = await other.open(name, OpenMode.READ_ONLY, password=b"pw")
            entries = await r.read(0, 12)
            assert [e.entry_id for e in entries] == list(range(13))
            # publish renumbers: the pre-written ledgers' entries land at 6.. (they were written as 5..)
            assert [e.payload for e in entries[6:]] == [payload(5 + i) for i in range(7)]

            # overwrite: one CAS replaces every segment; ids keep growing, old ledgers are deleted
            lh = await bk.create_ledger(password=b"pw", **QUORUM)
            await lh.append(b"fresh-0")
            await lh.append(b"fresh-1")
            await lh.close()
            cur = await named.record(name)
            await named.overwrite(name, [lh.ledger_id], expected_version=cur.version)
            r2 = await other.open(name, OpenMode.READ_ONLY, password=b"pw")
            assert r2.start_entry_id == 13
            assert [e.payload for e in await r2.read(13, 14)] == [b"fresh-0", b"fresh-1"]
            with pytest.raises(EntriesShrunkError):
                await r2.read(0, 1)
            for s in cur.value.segments:
                assert not await bk.ledger_exists(s.ledger_id)

            # publishing to a new name creates it (expected_version=None), and only once
            fresh = unique_name()
            lh2 = await bk.create_ledger(password=b"pw", **QUORUM)
            await lh2.append(b"only")
            await lh2.close()
            await named.publish_segments(fresh, [lh2.ledger_id], expected_version=None,
                                         cursor_updates={"sink": b"b0"})
            with pytest.raises(MetadataVersionError):
                await named.publish_segments(fresh, [lh2.ledger_id], expected_version=None)
            r3 = await other.open(fresh, OpenMode.READ_ONLY, password=b"pw")
            assert [e.payload for e in await r3.read(0, 0)] == [b"only"]
            await named.drain()

    run(main())


def test_delete_fences_the_writer(cluster: LocalCluster) -> None:
    async def main() -> None:
        async with BookKeeper(cluster.metadata_uri) as bk, BookKeeper(cluster.metadata_uri) as bk2:
            named = NamedLedgers(bk)
            name = unique_name()
            w = await named.open(name, OpenMode.CREATE, **QUORUM)
            await append_many(w, 5)
            ledger_id = w.ledger_id
            await NamedLedgers(bk2).delete(name)
            with pytest.raises(LedgerFencedError):
                await w.append(b"after delete")
            assert name not in await named.list(name)
            assert ledger_id is not None and not await bk.ledger_exists(ledger_id)
            with pytest.raises(NoSuchLedgerError):
                await named.open(name, OpenMode.APPEND)
            await NamedLedgers(bk2).delete(name)  # idempotent

    run(main())


@pytest.mark.parametrize("previous", ["open", "closed"])
def test_append_acquisition_costs_one_read_and_three_writes(cluster: LocalCluster, previous: str) -> None:
    async def main() -> None:
        store = CountingStore(open_metadata_store(cluster.metadata_uri))
        try:
            async with BookKeeper(cluster.metadata_uri, store=store) as bk:  # type: ignore[arg-type]
                named = NamedLedgers(bk, close_fenced_ledgers=False)
                name = unique_name()
                store.reset()
                w = await named.open(name, OpenMode.CREATE, **QUORUM)
                assert (store.reads(), store.writes()) == (0, 3), store.counts  # id + ledger + record
                await append_many(w, 5)
                if previous == "closed":
                    await w.close()
                store.reset()
                w2 = await named.open(name, OpenMode.APPEND)
                assert dict(store.counts) == {
                    "kv.get": 1,  # the name record
                    "id_generator.generate_ledger_id": 1,  # the new segment's ledger id
                    "ledgers.create_ledger_with_id": 1,  # its metadata
                    "kv.cas": 1,  # close the old segment + add the new one + bump the epoch
                }
                assert (store.reads(), store.writes()) == (1, 3)
                assert await w2.append(b"x") == 5
                # off the acquisition path: closing the fenced ledger's own metadata (1 read + 1 write)
                closing = NamedLedgers(bk)
                store.reset()
                w3 = await closing.open(name, OpenMode.APPEND)
                assert (store.reads(), store.writes()) == (1, 3)
                await closing.drain()
                assert store.counts["ledgers.read_ledger"] == 1 and store.counts["ledgers.write_ledger"] == 1
                md = await bk.ledger_metadata(w2.ledger_id)  # type: ignore[arg-type]
                assert md.is_closed and md.last_entry_id == 0
                await w3.close()
        finally:
            store._inner.close()

    run(main())
