"""The simulator's parts alone: the virtual-time loop, the network's faults, the simulated
bookie's durability and fencing (what the seeds rely on)."""

from __future__ import annotations

import asyncio
import contextvars
import random
import struct

import pytest

from vellum.errors import LedgerFencedError, NoSuchEntryError, NoSuchLedgerError, UnauthorizedAccessError
from vellum.format.entry import master_key
from vellum.proto.messages import AddBatch
from vellum.sim.bookie import SimBookie, SimDisk
from vellum.sim.history import Digests, Event, describe_rows, digest
from vellum.sim.loop import SimLoop, SimQuiescent
from vellum.sim.network import NetFaults, SimNetwork


def test_virtual_time_jumps_to_the_next_timer() -> None:
    loop = SimLoop()
    start = loop.time()

    async def main() -> float:
        await asyncio.sleep(3600.0)
        return loop.time()

    assert loop.run_until_complete(main()) - start >= 3600.0
    loop.close()


def test_a_world_with_nothing_to_do_is_quiescent() -> None:
    loop = SimLoop()
    with pytest.raises(SimQuiescent):
        loop.run_until_complete(loop.create_future())
    loop.close()


def test_executor_calls_run_on_the_loop_thread() -> None:
    loop = SimLoop()
    assert loop.run_until_complete(asyncio.to_thread(lambda: 41 + 1)) == 42
    loop.close()


class _Sink(asyncio.BufferedProtocol):
    def __init__(self) -> None:
        self.data = bytearray()
        self.buf = bytearray(7)
        self.lost: list[Exception | None] = []

    def get_buffer(self, sizehint: int) -> memoryview:
        return memoryview(self.buf)

    def buffer_updated(self, nbytes: int) -> None:
        self.data += self.buf[:nbytes]

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.append(exc)


class _Server:
    def __init__(self, name: str) -> None:
        self.name = name
        self.up = True
        self.accepted: list[_Sink] = []
        self.links: list[object] = []

    def accept(self) -> _Sink:
        self.accepted.append(_Sink())
        return self.accepted[-1]

    def attach(self, link: object) -> None:
        self.links.append(link)


def _net(faults: NetFaults) -> tuple[SimLoop, SimNetwork, _Server]:
    loop = SimLoop()
    net = SimNetwork(loop, random.Random(7), faults)
    server = _Server("b:1")
    net.add_server(server)
    return loop, net, server


def test_one_direction_is_fifo_in_any_chunking_and_a_partition_loses_writes() -> None:
    loop, net, server = _net(NetFaults(delay_min_s=0.001, delay_max_s=0.05))

    async def main() -> bytes:
        transport, _client = await net.connect(_Sink, "b", 1)
        for i in range(50):
            transport.write(bytes([i]) * 13)
        await asyncio.sleep(1.0)
        net.partition("client", "b:1", one_way=True)
        transport.write(b"lost")
        await asyncio.sleep(1.0)
        return bytes(server.accepted[0].data)

    got = loop.run_until_complete(main())
    assert got == b"".join(bytes([i]) * 13 for i in range(50))
    assert net.counts["partitioned"] == 1
    loop.close()


class _OddSink(_Sink):
    """Offers its receive buffer as a view of another format, of two dimensions, or as the
    bytearray itself (the network casts each to a view of bytes)."""

    kind = "signed"

    def __init__(self) -> None:
        super().__init__()
        self.buf = bytearray(64)

    def get_buffer(self, sizehint: int) -> memoryview:
        raw = memoryview(self.buf)
        if self.kind == "signed":
            return raw.cast("b")
        if self.kind == "2-d":
            return raw.cast("B", shape=[8, 8])
        return self.buf  # type: ignore[return-value]


@pytest.mark.parametrize("kind", ["signed", "2-d", "bytearray"])
@pytest.mark.parametrize("chunking", [False, True])
def test_writes_arrive_whole_in_a_receive_buffer_of_any_byte_layout(kind: str, chunking: bool) -> None:
    loop, net, server = _net(NetFaults(delay_min_s=0.001, delay_max_s=0.05, chunking=chunking))

    class Sink(_OddSink):
        pass

    Sink.kind = kind
    server.accept = lambda: server.accepted.append(Sink()) or server.accepted[-1]  # type: ignore[method-assign]

    async def main() -> bytes:
        transport, _client = await net.connect(_Sink, "b", 1)
        for i in range(30):
            transport.write(bytes([i]) * (10 + i))
        await asyncio.sleep(1.0)
        return bytes(server.accepted[0].data)

    got = loop.run_until_complete(main())
    assert got == b"".join(bytes([i]) * (10 + i) for i in range(30))
    loop.close()


def test_a_down_bookie_refuses_and_a_crash_resets_the_client_side() -> None:
    loop, net, server = _net(NetFaults())

    async def main() -> list[Exception | None]:
        _t, client = await net.connect(_Sink, "b", 1)
        assert isinstance(client, _Sink)
        link = server.links[0]
        link.reset(1)  # type: ignore[attr-defined]
        await asyncio.sleep(0.1)
        server.up = False
        with pytest.raises(ConnectionRefusedError):
            await net.connect(_Sink, "b", 1)
        return client.lost

    lost = loop.run_until_complete(main())
    assert len(lost) == 1 and isinstance(lost[0], ConnectionResetError)
    assert len(server.accepted[0].lost) == 1  # the dead process's side is closed too
    loop.close()


KEY = master_key(b"pw")


def _entry(ledger_id: int, entry_id: int, lac: int = -1) -> bytes:
    return struct.pack(">qqqq", ledger_id, entry_id, lac, 1) + b"x" * 8


def _bookie(loop: SimLoop, disk: SimDisk) -> SimBookie:
    return SimBookie("b", loop, random.Random(1), disk, lambda lid, key: lid != 99 and key == KEY,
                     group_wait_s=0.001, fsync_s=(0.001, 0.002), read_s=(0.0001, 0.0002))


def test_an_add_is_answered_after_its_sync_and_a_crash_loses_what_was_not_synced() -> None:
    loop = SimLoop()
    disk = SimDisk()
    b = _bookie(loop, disk)
    answers: list[tuple[list[BaseException | None], BaseException | None]] = []

    async def main() -> None:
        b.add_batch_cb(AddBatch.of_entries([(_entry(1, 0), KEY, False)]), lambda r, e: answers.append((r, e)))
        assert answers == [] and 0 not in disk.ledgers.get(1, SimDisk().record(1, KEY)).entries
        await asyncio.sleep(0.01)
        assert answers == [([None], None)] and 0 in disk.ledgers[1].entries
        b.add_batch_cb(AddBatch.of_entries([(_entry(1, 1), KEY, False)]), lambda r, e: answers.append((r, e)))
        assert await b.read_entry(1, 1)  # readable before it is durable (the write cache)
        b.crash()
        await asyncio.sleep(0.01)

    loop.run_until_complete(main())
    assert len(answers) == 1  # the unsynced add is never answered
    again = _bookie(loop, disk)

    async def reread() -> None:
        assert await again.read_entry(1, 0)
        with pytest.raises(NoSuchEntryError):
            await again.read_entry(1, 1)
        with pytest.raises(NoSuchLedgerError):
            await again.read_entry(2, 0)

    loop.run_until_complete(reread())
    loop.close()


def test_a_durable_fence_refuses_normal_adds_and_passes_recovery_adds_across_a_restart() -> None:
    loop = SimLoop()
    disk = SimDisk()
    b = _bookie(loop, disk)

    async def main() -> None:
        await b.fence(1, KEY)
        b.crash()
        b2 = _bookie(loop, disk)
        got: list[list[BaseException | None]] = []
        b2.add_batch_cb(AddBatch.of_entries([(_entry(1, 0), KEY, False), (_entry(1, 1), KEY, True)]), lambda r, _e: got.append(r))
        await asyncio.sleep(0.01)
        assert isinstance(got[0][0], LedgerFencedError) and got[0][1] is None
        with pytest.raises(UnauthorizedAccessError):
            await b2.fence(1, master_key(b"other"))
        with pytest.raises(UnauthorizedAccessError):  # no metadata gives a key for ledger 99
            await b2.fence(99, KEY)

    loop.run_until_complete(main())
    loop.close()


def test_history_rows_read_as_each_event_describes_itself() -> None:
    """``describe_rows`` (what a run's fingerprint digests) writes each event as its row: time,
    actor padded, kind, then the ledger and entry and the value where the event has them, and
    leaves out the kinds it is told to."""
    events = [Event(1.5, "writer", "ack", 3, 7, "abc"), Event(12.25, "nemesis", "crash", value="bookie-1:3181"),
              Event(2.0, "recoverer", "recover-start", 4), Event(0.0, "reader", "lac", 5, -1, ("h1", 9)),
              Event(3.0, "bookie-0", "add", 1, 2), Event(1234.56789, "gc", "gc"), Event(7.0, "final", "final-read", 2, 0),
              Event(7.0, "final", "final-read", 2, 1, "def"), Event(7.00001, "final", "final-read", 2, 2)]
    rows = ["t=   1.5000 writer     ack L3:7 abc", "t=  12.2500 nemesis    crash bookie-1:3181",
            "t=   2.0000 recoverer  recover-start L4", "t=   0.0000 reader     lac L5 ('h1', 9)",
            "t=   3.0000 bookie-0   add L1:2", "t=1234.5679 gc         gc", "t=   7.0000 final      final-read L2:0",
            "t=   7.0000 final      final-read L2:1 def", "t=   7.0000 final      final-read L2:2"]
    assert [e.describe() for e in events] == rows
    assert describe_rows(events) == "".join(rows)
    assert describe_rows(events, frozenset({"add", "gc"})) == "".join(r for r in rows if " add " not in r
                                                                        and not r.endswith(" gc"))


def test_a_runs_digest_table_digests_each_distinct_payload_once() -> None:
    """``Digests`` gives what ``digest`` gives, for any bytes object of the same content, and
    keeps the first digest of a payload: a read of it later is a look-up, not a digest."""
    digests = Digests()
    written = bytes(range(48))
    read_back = bytes(bytearray(written))  # another object, the same bytes
    first = digests[written]
    assert first == digest(written)
    assert digests[read_back] is first  # looked up, not digested again
    other = bytes(48)
    assert digests[other] == digest(other) != first
    assert len(digests) == 2


def test_a_connections_deliveries_run_in_one_context_copied_when_it_was_made() -> None:
    """Each direction's deliveries run in one context, copied when the connection was made: a
    value the writer sets afterwards is not seen, and one the receiver sets stays for its next
    delivery (as a selector loop's reader handle of a socket runs every read in its context)."""
    tag: contextvars.ContextVar[str] = contextvars.ContextVar("tag", default="none")
    loop, net, server = _net(NetFaults(chunking=False))
    seen: list[str] = []

    class Tagged(_Sink):
        def buffer_updated(self, nbytes: int) -> None:
            super().buffer_updated(nbytes)
            seen.append(tag.get())
            tag.set("set by the receiver")

    server.accept = lambda: server.accepted.append(Tagged()) or server.accepted[-1]  # type: ignore[method-assign]

    async def main() -> None:
        tag.set("when connected")
        transport, _client = await net.connect(_Sink, "b", 1)
        tag.set("when written")
        transport.write(b"one")
        await asyncio.sleep(0.1)
        transport.write(b"two")
        await asyncio.sleep(0.1)

    loop.run_until_complete(main())
    loop.close()
    assert seen == ["when connected", "set by the receiver"]
