"""BookieClient against real in-process bookies and against fake servers that misbehave.

Every test is bounded (``run`` has a 60 s cap; most finish in well under a second) and none
asserts on elapsed time: timeouts are observed as exceptions, not measured.
"""

from __future__ import annotations

import asyncio
import struct
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import cast

import pytest
from client_testkit import MASTER_KEY, InProcessBookie, inprocess_bookies, make_entry, run

from vellum.client.bookie_client import BookieClient
from vellum.client.bookie_connection import Pending
from vellum.errors import (
    EOK,
    EUA,
    BookieHandleNotAvailableError,
    ClientClosedError,
    IncorrectParameterError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    TimeoutError_,
    UnauthorizedAccessError,
)
from vellum.format.entry import DigestManager, DigestType, master_key
from vellum.proto import codec
from vellum.proto import messages as m

LEDGER = 7


async def _with_bookie(
    tmp_path: Path, body: Callable[[BookieClient, InProcessBookie], Awaitable[None]], **client_kw: float
) -> None:
    async with inprocess_bookies(tmp_path, 1) as bookies:
        client = BookieClient(**client_kw)  # type: ignore[arg-type]
        try:
            await body(client, bookies[0])
        finally:
            await client.close()


def test_add_and_read_back(tmp_path: Path) -> None:
    async def body(client: BookieClient, bookie: InProcessBookie) -> None:
        bid = bookie.bookie_id
        entries = [make_entry(LEDGER, i, f"payload {i}".encode(), lac=i - 1) for i in range(3)]
        for entry in entries:
            await client.add(bid, MASTER_KEY, entry, timeout_s=5)
        for i, entry in enumerate(entries):
            assert await client.read(bid, LEDGER, i, timeout_s=5) == entry
        # entry id -1: the last entry the bookie has
        assert await client.read(bid, LEDGER, -1, timeout_s=5) == entries[-1]
        assert client.is_connected(bid)

    run(_with_bookie(tmp_path, body))


def test_pipelined_adds_all_answered(tmp_path: Path) -> None:
    async def body(client: BookieClient, bookie: InProcessBookie) -> None:
        bid = bookie.bookie_id
        n = 1000
        results: dict[int, BaseException | None] = {}
        all_done = asyncio.get_running_loop().create_future()

        def callback_for(entry_id: int) -> Callable[[BaseException | None], None]:
            def done(exc: BaseException | None) -> None:
                assert entry_id not in results, "callback ran twice"
                results[entry_id] = exc
                if len(results) == n and not all_done.done():
                    all_done.set_result(None)

            return done

        # callback fast path: 1,000 adds in flight on one connection
        for i in range(n):
            client.add_cb(bid, MASTER_KEY, make_entry(LEDGER, i, b"x" * 100), False, callback_for(i), 30)
        await all_done
        assert results == dict.fromkeys(range(n))

        # coroutine path, concurrently, on a second ledger
        await asyncio.gather(
            *(client.add(bid, MASTER_KEY, make_entry(LEDGER + 1, i, b"y"), timeout_s=30) for i in range(n))
        )
        assert await client.list_entries(bid, LEDGER, timeout_s=5) == ((0, n - 1),)
        assert await client.list_entries(bid, LEDGER + 1, timeout_s=5) == ((0, n - 1),)
        # concurrent reads, including several of the same entry (same v2 key in flight)
        reads = await asyncio.gather(*(client.read(bid, LEDGER, i % 10, timeout_s=5) for i in range(200)))
        assert reads == [make_entry(LEDGER, i % 10, b"x" * 100) for i in range(200)]

    run(_with_bookie(tmp_path, body))


def test_read_errors(tmp_path: Path) -> None:
    async def body(client: BookieClient, bookie: InProcessBookie) -> None:
        bid = bookie.bookie_id
        await client.add(bid, MASTER_KEY, make_entry(LEDGER, 0, b"a"), timeout_s=5)
        with pytest.raises(NoSuchEntryError) as info:
            await client.read(bid, LEDGER, 5, timeout_s=5)
        assert f"READ {LEDGER}:5 on {bid}" in str(info.value)
        with pytest.raises((NoSuchLedgerError, NoSuchEntryError)):
            await client.read(bid, 999, 0, timeout_s=5)
        # the connection survives error answers
        assert await client.read(bid, LEDGER, 0, timeout_s=5) == make_entry(LEDGER, 0, b"a")

    run(_with_bookie(tmp_path, body))


def test_wrong_master_key_is_unauthorized(tmp_path: Path) -> None:
    async def body(client: BookieClient, bookie: InProcessBookie) -> None:
        bid = bookie.bookie_id
        await client.add(bid, MASTER_KEY, make_entry(LEDGER, 0, b"a"), timeout_s=5)
        with pytest.raises(UnauthorizedAccessError) as info:
            await client.add(bid, master_key(b"wrong"), make_entry(LEDGER, 1, b"b"), timeout_s=5)
        assert bid in str(info.value)
        with pytest.raises(UnauthorizedAccessError):
            await client.read(bid, LEDGER, 0, fence_master_key=master_key(b"wrong"), timeout_s=5)

    run(_with_bookie(tmp_path, body))


def test_fencing_read_then_add_is_fenced_but_recovery_add_accepted(tmp_path: Path) -> None:
    async def body(client: BookieClient, bookie: InProcessBookie) -> None:
        bid = bookie.bookie_id
        e0 = make_entry(LEDGER, 0, b"first")
        await client.add(bid, MASTER_KEY, e0, timeout_s=5)
        assert await client.read(bid, LEDGER, -1, fence_master_key=MASTER_KEY, timeout_s=5) == e0
        with pytest.raises(LedgerFencedError):
            await client.add(bid, MASTER_KEY, make_entry(LEDGER, 1, b"late"), timeout_s=5)
        # the same entry as a recovery add is accepted (the recovery writer re-replicates)
        e1 = make_entry(LEDGER, 1, b"recovered", lac=0)
        await client.add(bid, MASTER_KEY, e1, recovery=True, timeout_s=5)
        assert await client.read(bid, LEDGER, 1, timeout_s=5) == e1

        # the callback path reports the fence too
        got: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
        client.add_cb(bid, MASTER_KEY, make_entry(LEDGER, 2, b"x"), False, got.set_result, 5)
        assert isinstance(await got, LedgerFencedError)

    run(_with_bookie(tmp_path, body))


def test_batch_read(tmp_path: Path) -> None:
    async def body(client: BookieClient, bookie: InProcessBookie) -> None:
        bid = bookie.bookie_id
        entries = [make_entry(LEDGER, i, bytes([i]) * 50) for i in range(10)]
        await asyncio.gather(*(client.add(bid, MASTER_KEY, e, timeout_s=5) for e in entries))
        assert await client.batch_read(bid, LEDGER, 0, 100, 1 << 20, timeout_s=5) == entries
        assert await client.batch_read(bid, LEDGER, 3, 4, 1 << 20, timeout_s=5) == entries[3:7]
        # max_size bounds the answer but at least one entry comes back
        small = await client.batch_read(bid, LEDGER, 0, 100, len(entries[0]) * 2, timeout_s=5)
        assert 1 <= len(small) <= 2 and small == entries[: len(small)]
        with pytest.raises(NoSuchEntryError):
            await client.batch_read(bid, LEDGER, 50, 10, 1 << 20, timeout_s=5)

    run(_with_bookie(tmp_path, body))


def test_read_lac_write_lac_and_long_poll(tmp_path: Path) -> None:
    async def body(client: BookieClient, bookie: InProcessBookie) -> None:
        bid = bookie.bookie_id
        digest = DigestManager(LEDGER, DigestType.CRC32C, b"secret")
        e0 = make_entry(LEDGER, 0, b"zero")
        await client.add(bid, MASTER_KEY, e0, timeout_s=5)
        lac_body, last = await client.read_lac(bid, LEDGER, timeout_s=5)
        assert lac_body == b"" and last == e0

        # explicit LAC
        await client.write_lac(bid, LEDGER, MASTER_KEY, 0, digest.compute_lac(0), timeout_s=5)
        lac_body, last = await client.read_lac(bid, LEDGER, timeout_s=5)
        assert digest.verify_lac(lac_body) == 0 and last == e0

        # long poll: held until a later add carries a LAC past 0
        poll = asyncio.ensure_future(client.long_poll_lac(bid, LEDGER, 0, 20_000))
        await asyncio.sleep(0.05)
        assert not poll.done()
        e1 = make_entry(LEDGER, 1, b"one", lac=0)
        e2 = make_entry(LEDGER, 2, b"two", lac=1)
        await client.add(bid, MASTER_KEY, e1, timeout_s=5)
        await client.add(bid, MASTER_KEY, e2, timeout_s=5)
        _, last = await poll
        assert last in (e1, e2)

        # long poll whose wait expires: answered with what the bookie has
        _, last = await client.long_poll_lac(bid, LEDGER, 5, 100)
        assert last == e2

    run(_with_bookie(tmp_path, body))


def test_list_entries_force_info_trim_and_ledger_closed(tmp_path: Path) -> None:
    async def body(client: BookieClient, bookie: InProcessBookie) -> None:
        bid = bookie.bookie_id
        for i in (0, 1, 2, 5, 6):
            await client.add(bid, MASTER_KEY, make_entry(LEDGER, i, b"p"), timeout_s=5)
        assert await client.list_entries(bid, LEDGER, timeout_s=5) == ((0, 2), (5, 6))
        with pytest.raises(NoSuchLedgerError):
            await client.list_entries(bid, 4242, timeout_s=5)
        await client.force(bid, LEDGER, timeout_s=5)
        total, free = await client.bookie_info(bid, timeout_s=5)
        assert total > 0 and 0 <= free <= total

        client.ledger_closed(bid, LEDGER)  # fire and forget
        client.ledger_closed("127.0.0.1:1", LEDGER)  # unreachable bookie: silently dropped
        # the connection still works after the note (the bookie never answers it)
        assert await client.read(bid, LEDGER, 6, timeout_s=5) == make_entry(LEDGER, 6, b"p")

        await client.trim(bid, LEDGER, 2, MASTER_KEY, timeout_s=5)
        remaining = await client.list_entries(bid, LEDGER, timeout_s=5)
        assert remaining and remaining[0][0] >= 2 and remaining[-1] == (5, 6)

    run(_with_bookie(tmp_path, body))


def test_killed_bookie_fails_pending_and_restarted_one_is_reconnected(tmp_path: Path) -> None:
    async def body(client: BookieClient, bookie: InProcessBookie) -> None:
        bid = bookie.bookie_id
        await client.add(bid, MASTER_KEY, make_entry(LEDGER, 0, b"a"), timeout_s=5)
        # requests pending when the bookie goes away: a long poll and a few reads
        poll = asyncio.ensure_future(client.long_poll_lac(bid, LEDGER, 10, 30_000))
        await asyncio.sleep(0.05)
        await bookie.stop()
        with pytest.raises(BookieHandleNotAvailableError) as info:
            await poll
        assert bid in str(info.value)
        assert not client.is_connected(bid)

        # while it is down, requests fail fast (connect refused, then backoff)
        for _ in range(3):
            with pytest.raises(BookieHandleNotAvailableError):
                await client.read(bid, LEDGER, 0, timeout_s=5)

        await bookie.start()  # same port
        for _ in range(200):  # reconnect is lazy and waits out the backoff: retry, bounded
            try:
                entry = await client.read(bid, LEDGER, 0, timeout_s=5)
                break
            except BookieHandleNotAvailableError:
                await asyncio.sleep(0.05)
        else:
            pytest.fail("the restarted bookie was never reconnected to")
        assert entry == make_entry(LEDGER, 0, b"a")
        await client.add(bid, MASTER_KEY, make_entry(LEDGER, 1, b"b"), timeout_s=5)

        # a full restart (storage reopened, journal replayed) is also reconnected to
        await bookie.restart()
        for _ in range(200):
            try:
                assert await client.read(bid, LEDGER, 1, timeout_s=5) == make_entry(LEDGER, 1, b"b")
                break
            except BookieHandleNotAvailableError:
                await asyncio.sleep(0.05)
        else:
            pytest.fail("the restarted bookie was never reconnected to")

    run(_with_bookie(tmp_path, body))


def test_close_fails_pending_with_client_closed(tmp_path: Path) -> None:
    async def body(client: BookieClient, bookie: InProcessBookie) -> None:
        bid = bookie.bookie_id
        await client.add(bid, MASTER_KEY, make_entry(LEDGER, 0, b"a"), timeout_s=5)
        poll = asyncio.ensure_future(client.long_poll_lac(bid, LEDGER, 10, 30_000))
        await asyncio.sleep(0.05)
        await client.close()
        with pytest.raises(ClientClosedError):
            await poll
        with pytest.raises(ClientClosedError):
            await client.read(bid, LEDGER, 0, timeout_s=5)
        got: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
        client.add_cb(bid, MASTER_KEY, make_entry(LEDGER, 1, b"b"), False, got.set_result, 5)
        assert isinstance(await got, ClientClosedError)
        client.ledger_closed(bid, LEDGER)  # never raises
        await client.close()  # idempotent

    run(_with_bookie(tmp_path, body))


# ---------------------------------------------------------------------------------------------
# Fake servers


class _FakeBookie:
    """A raw asyncio server on 127.0.0.1; ``on_data(data, writer)`` decides what to answer."""

    def __init__(self, on_data: Callable[[bytes, asyncio.StreamWriter], None]) -> None:
        self.on_data = on_data
        self.server: asyncio.AbstractServer | None = None
        self.writers: list[asyncio.StreamWriter] = []
        self.received = bytearray()

    async def __aenter__(self) -> str:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.writers.append(writer)
            try:
                while data := await reader.read(65536):
                    self.received += data
                    self.on_data(data, writer)
            except ConnectionError:
                pass
            finally:
                writer.close()

        self.server = await asyncio.start_server(handle, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        for w in self.writers:
            w.close()
        await self.server.wait_closed()


def test_silent_bookie_times_out_and_late_answers_are_dropped() -> None:
    held: list[bytes] = []

    def never_answer(data: bytes, writer: asyncio.StreamWriter) -> None:
        held.append(data)

    async def main() -> None:
        fake = _FakeBookie(never_answer)
        async with fake as bid:
            client = BookieClient()
            try:
                with pytest.raises(TimeoutError_) as info:
                    await client.add(bid, MASTER_KEY, make_entry(LEDGER, 0, b"a"), timeout_s=0.2)
                assert f"ADD {LEDGER}:0 on {bid}" in str(info.value)
                with pytest.raises(TimeoutError_):
                    await client.read(bid, LEDGER, 0, timeout_s=0.2)
                with pytest.raises(TimeoutError_):
                    await client.bookie_info(bid, timeout_s=0.2)
                got: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
                client.add_cb(bid, MASTER_KEY, make_entry(LEDGER, 1, b"b"), False, got.set_result, 0.2)
                assert isinstance(await got, TimeoutError_)

                # Late answers now arrive; then the same (op, ledger, entry) is asked again and
                # must get its own answer, not the stale one.
                writer = fake.writers[0]
                fake.on_data = lambda data, w: w.write(
                    codec.encode(m.ReadResponse(EOK, LEDGER, 0, make_entry(LEDGER, 0, b"fresh")))
                )
                writer.write(codec.encode(m.AddResponse(EOK, LEDGER, 0)))
                writer.write(codec.encode(m.ReadResponse(EOK, LEDGER, 0, make_entry(LEDGER, 0, b"stale"))))
                writer.write(codec.encode(m.GetBookieInfoResponse(3, EOK, 1, 1)))
                assert await client.read(bid, LEDGER, 0, timeout_s=5) == make_entry(LEDGER, 0, b"fresh")
                assert client.is_connected(bid)
            finally:
                await client.close()

    run(main(), use_uvloop=True)


@pytest.mark.parametrize(
    "garbage",
    [
        struct.pack(">i", -5) + b"junk",  # broken framing
        struct.pack(">i", 8) + b"\x07\x01\x00\x00abcd",  # framed, unknown version
        struct.pack(">i", 6) + struct.pack(">I", m.header_int(m.OP_ADD)) + b"xy",  # framed, truncated body
    ],
    ids=["bad-length", "bad-version", "truncated"],
)
def test_garbage_answer_closes_connection_with_clear_error(garbage: bytes) -> None:
    async def main() -> None:
        async with _FakeBookie(lambda data, w: w.write(garbage)) as bid:
            client = BookieClient()
            try:
                with pytest.raises(BookieHandleNotAvailableError) as info:
                    await client.add(bid, MASTER_KEY, make_entry(LEDGER, 0, b"a"), timeout_s=5)
                assert "malformed answer" in str(info.value) and bid in str(info.value)
                assert not client.is_connected(bid)
            finally:
                await client.close()

    run(main(), use_uvloop=True)


def test_error_response_fails_the_matching_request() -> None:
    def answer(data: bytes, writer: asyncio.StreamWriter) -> None:
        for msg in codec.FrameDecoder(1 << 20, side="server").feed(data):
            if isinstance(msg, m.GetBookieInfoRequest):
                writer.write(codec.encode(m.ErrorResponse(m.EBADREQ, msg.request_id, m.OP_GET_BOOKIE_INFO)))

    async def main() -> None:
        async with _FakeBookie(answer) as bid:
            client = BookieClient()
            try:
                with pytest.raises(Exception) as info:
                    await client.bookie_info(bid, timeout_s=5)
                assert "EBADREQ" in str(info.value)
            finally:
                await client.close()

    run(main(), use_uvloop=True)


def test_unreachable_bookie_and_backoff() -> None:
    async def main() -> None:
        # a port nobody listens on
        probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = probe.sockets[0].getsockname()[1]
        probe.close()
        await probe.wait_closed()
        bid = f"127.0.0.1:{port}"
        client = BookieClient(connect_timeout_s=2.0, reconnect_backoff_s=30.0)
        try:
            with pytest.raises(BookieHandleNotAvailableError) as info:
                await client.read(bid, LEDGER, 0, timeout_s=5)
            assert "cannot connect" in str(info.value) and bid in str(info.value)
            # inside the backoff window: refused at once, without a new connect
            with pytest.raises(BookieHandleNotAvailableError) as info:
                await client.read(bid, LEDGER, 0, timeout_s=5)
            assert "retrying in" in str(info.value)
            with pytest.raises(IncorrectParameterError):
                await client.read("no-port", LEDGER, 0, timeout_s=5)
        finally:
            await client.close()

    run(main(), use_uvloop=True)


def test_requests_made_while_connecting_are_sent_once_connected(tmp_path: Path) -> None:
    async def body(client: BookieClient, bookie: InProcessBookie) -> None:
        bid = bookie.bookie_id
        assert not client.is_connected(bid)
        # all issued in the same loop iteration, before the connection is up
        await asyncio.gather(
            *(client.add(bid, MASTER_KEY, make_entry(LEDGER, i, b"q"), timeout_s=5) for i in range(50)),
            client.bookie_info(bid, timeout_s=5),
        )
        assert await client.list_entries(bid, LEDGER, timeout_s=5) == ((0, 49),)

    run(_with_bookie(tmp_path, body))


def test_multi_entry_answers_always_fit_a_frame(tmp_path: Path) -> None:
    """BATCH_READ and READ_STRIDED without a size bound (or a bigger one) are cut by the bookie
    to what fits its nettyMaxFrameSizeBytes, never an answer the client would have to refuse."""
    async def body(client: BookieClient, bookie: InProcessBookie) -> None:
        bid = bookie.bookie_id
        entries = [make_entry(LEDGER, i, bytes([i]) * 1000) for i in range(100)]  # ~100 KiB
        await asyncio.gather(*(client.add(bid, MASTER_KEY, e, timeout_s=5) for e in entries))
        for max_size in (0, 1 << 20):
            got = await client.batch_read(bid, LEDGER, 0, 100, max_size, timeout_s=5)
            assert 30 <= len(got) < 100 and got == entries[: len(got)]
            assert sum(4 + len(e) for e in got) + 32 <= 64 * 1024
            strided = await client.read_strided(bid, LEDGER, 0, 1, 100, max_size, timeout_s=5)
            assert strided == got
        assert await client.read_strided(bid, LEDGER, 1, 3, 5, 0, timeout_s=5) == entries[1:16:3]

    async def run_it() -> None:
        async with inprocess_bookies(tmp_path, 1, netty_max_frame_size_bytes=64 * 1024) as bookies:
            client = BookieClient()
            try:
                await body(client, bookies[0])
            finally:
                await client.close()

    run(run_it())


def test_one_add_to_a_write_set_answers_each_bookie_on_its_own(tmp_path: Path) -> None:
    """``add_quorum_cb``: one frame for the write set; each callback answers for its bookie.
    A bookie that cannot be asked (reconnect backoff) fails only its own callback, and an entry
    without a header fails every callback, all through ``call_soon``, never from the call."""

    async def main() -> None:
        probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        dead = f"127.0.0.1:{probe.sockets[0].getsockname()[1]}"
        probe.close()
        await probe.wait_closed()
        async with inprocess_bookies(tmp_path, 2) as bookies:
            client = BookieClient(connect_timeout_s=2.0, reconnect_backoff_s=30.0)
            try:
                with pytest.raises(BookieHandleNotAvailableError):
                    await client.read(dead, LEDGER, 0, timeout_s=5)  # now in its backoff window
                loop = asyncio.get_running_loop()
                ids = [b.bookie_id for b in bookies] + [dead]
                n = 50
                got: list[dict[str, BaseException | None]] = [{} for _ in range(n)]
                done = loop.create_future()

                def answer(i: int, idx: int, bid: str, exc: BaseException | None) -> None:
                    assert bid == ids[idx] and bid not in got[i], "answered twice, or for the wrong bookie"
                    got[i][bid] = exc
                    if all(len(g) == len(ids) for g in got) and not done.done():
                        done.set_result(None)

                for i in range(n):
                    client.add_quorum_cb(ids, range(len(ids)), MASTER_KEY, make_entry(LEDGER, i, b"q%d" % i, lac=i - 1),
                                         False, answer, i, 30)
                assert not any(got), "a failure known at once was delivered from inside the call"
                await asyncio.wait_for(done, 30)
                for g in got:
                    assert g[ids[0]] is None and g[ids[1]] is None
                    assert isinstance(g[dead], BookieHandleNotAvailableError) and "retrying in" in str(g[dead])
                for b in ids[:2]:  # both live bookies hold every entry, byte for byte
                    assert await client.list_entries(b, LEDGER, timeout_s=5) == ((0, n - 1),)
                    assert await client.read(b, LEDGER, 7, timeout_s=5) == make_entry(LEDGER, 7, b"q7", lac=6)

                short: list[tuple[object, int, str, BaseException | None]] = []
                client.add_quorum_cb(ids, (0, 1), MASTER_KEY, b"short", False, lambda *a: short.append(a), "t", 5)
                assert short == []
                await asyncio.sleep(0)
                assert [(t, i, b) for t, i, b, _e in short] == [("t", 0, ids[0]), ("t", 1, ids[1])]
                assert all(isinstance(e, IncorrectParameterError) for *_x, e in short)
                assert "5 bytes" in str(short[0][3]) and "no header" in str(short[0][3])
            finally:
                await client.close()

    run(main())


def test_a_batch_of_adds_answers_each_entry_and_bookie_once_whatever_each_bookie_says() -> None:
    """``add_quorum_batch_cb``: one ADD request per entry and bookie on the wire, in entry order;
    each (entry, bookie) answered once with its own outcome: acked, refused, timed out (the
    bookie never answers some entries of the batch while it answers the others), or failed at
    once (a bookie in reconnect backoff, an entry without a header: through ``call_soon``)."""
    n = 24
    decoders: dict[int, codec.FrameDecoder] = {}
    seen: dict[int, list[int]] = {}

    def answering(policy: Callable[[int], int | None]) -> Callable[[bytes, asyncio.StreamWriter], None]:
        key = len(decoders)
        decoders[key] = codec.FrameDecoder(1 << 20, side="server")
        seen[key] = []

        def on_data(data: bytes, writer: asyncio.StreamWriter) -> None:
            for msg in decoders[key].feed(data):
                assert isinstance(msg, m.AddRequest) and msg.master_key == MASTER_KEY
                entry_id = struct.unpack_from(">qq", msg.entry)[1]
                seen[key].append(entry_id)
                status = policy(entry_id)
                if status is not None:
                    writer.write(codec.encode(m.AddResponse(status, LEDGER, entry_id)))

        return on_data

    # bookie A acks every entry; bookie B acks the even ones, refuses 1 mod 4, never answers 3 mod 4
    def b_policy(e: int) -> int | None:
        return EOK if e % 2 == 0 else (EUA if e % 4 == 1 else None)

    async def main() -> None:
        probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        dead = f"127.0.0.1:{probe.sockets[0].getsockname()[1]}"
        probe.close()
        await probe.wait_closed()
        async with _FakeBookie(answering(lambda e: EOK)) as a, _FakeBookie(answering(b_policy)) as b:
            client = BookieClient(connect_timeout_s=2.0, reconnect_backoff_s=30.0)
            try:
                with pytest.raises(BookieHandleNotAvailableError):
                    await client.read(dead, LEDGER, 0, timeout_s=5)  # now in its backoff window
                loop = asyncio.get_running_loop()
                ids = [a, b, dead]
                got: list[dict[int, BaseException | None]] = [{} for _ in range(n)]
                done = loop.create_future()
                expected = [{0, 1, 2} for _ in range(n)]
                expected[5] = {0, 2}  # a write set without bookie B

                def answer(k: int, idx: int, bid: str, exc: BaseException | None) -> None:
                    assert bid == ids[idx] and idx not in got[k], "answered twice, or for the wrong bookie"
                    got[k][idx] = exc
                    if all(set(g) == e for g, e in zip(got, expected, strict=True)) and not done.done():
                        done.set_result(None)

                entries = [make_entry(LEDGER, k, b"b%d" % k, lac=k - 1) for k in range(n)]
                entries[9] = b"short"
                client.add_quorum_batch_cb(ids, [tuple(sorted(e)) for e in expected], MASTER_KEY, entries, False,
                                           answer, range(n), 0.5)
                assert not any(got), "a failure known at once was delivered from inside the call"
                await asyncio.wait_for(done, 30)
                for k, g in enumerate(got):
                    if k == 9:
                        assert all(isinstance(e, IncorrectParameterError) and "no header" in str(e)
                                   for e in g.values())
                        continue
                    assert isinstance(g[2], BookieHandleNotAvailableError), k
                    assert g[0] is None, k
                    if k == 5:
                        continue
                    if k % 2 == 0:
                        assert g[1] is None, k
                    elif k % 4 == 1:
                        assert isinstance(g[1], UnauthorizedAccessError), k
                    else:
                        assert isinstance(g[1], TimeoutError_) and f"ADD {LEDGER}:{k} on {b}" in str(g[1]), k
                sent = [k for k in range(n) if k != 9]
                assert seen[0] == sent, "bookie A got one ADD per entry, in entry order"
                assert seen[1] == [k for k in sent if k != 5]
                assert client.is_connected(a) and client.is_connected(b)
            finally:
                await client.close()

    run(main(), use_uvloop=True)


def test_a_batch_of_adds_makes_each_request_as_its_constructor_would() -> None:
    """``add_quorum_batch_cb`` sets each request's slots itself (the constructor's call is a
    third of a request's cost there): every slot is set, to what ``Pending(...)`` sets."""

    def answer(token: object, index: int, bookie: str, exc: BaseException | None) -> None:
        pass

    async def main() -> None:
        async with _FakeBookie(lambda data, w: None) as bid:
            client = BookieClient()
            try:
                client.add_quorum_batch_cb([bid], [(0,), (0,)], MASTER_KEY,
                                           [make_entry(LEDGER, 0, b"a"), make_entry(LEDGER, 0, b"b")],
                                           False, answer, ["t0", "t1"], 5)
                conn = client._connection(bid)
                first = conn.adds[(LEDGER, 0)]
                second = first.next
                assert second is not None  # the same key twice: chained in order
                for p, token, nxt in ((first, "t0", second), (second, "t1", None)):
                    made = Pending(conn, m.OP_ADD, (LEDGER, 0), 0, answer, None, p.deadline, token, 0)
                    made.next = nxt
                    assert {s: getattr(p, s) for s in Pending.__slots__} == {
                        s: getattr(made, s) for s in Pending.__slots__}
            finally:
                await client.close()

    run(main(), use_uvloop=True)


@pytest.mark.parametrize("answered", [0, 3, 40, 97, 100])
def test_the_sweep_drops_answered_requests_and_expires_only_overdue_ones(answered: int) -> None:
    """The sweep drops the answered requests at a deadline deque's head at once (a few or most
    of them), then expires the overdue ones in order and keeps the rest, answered or not."""

    async def main() -> None:
        async with _FakeBookie(lambda data, w: None) as bid:
            client = BookieClient()
            try:
                conn = client._connection(bid)
                expired: list[int] = []

                def cb(token: object, index: int, bookie: str, exc: BaseException | None) -> None:
                    assert isinstance(exc, TimeoutError_)
                    expired.append(cast(int, token))

                requests = [Pending(conn, m.OP_ADD, (LEDGER, k), 0, cb, None, 10.0 if k < 90 else 30.0, k, 0)
                            for k in range(100)]
                for k, p in enumerate(requests):
                    p.done = k < answered or k % 7 == 3  # the head answered, then some here and there
                conn.timeouts[5.0] = deque(requests)
                assert conn.sweep(20.0) is (answered < 100)
                overdue = [k for k in range(answered, 90) if k % 7 != 3]
                assert expired == overdue
                left = list(conn.timeouts.get(5.0, ()))
                assert [p.token for p in left if not p.done] == [k for k in range(max(answered, 90), 100) if k % 7 != 3]
                assert left == requests[max(answered, 90):len(requests)] if answered < 100 else left == []
            finally:
                await client.close()

    run(main(), use_uvloop=True)


def test_a_batch_add_queues_behind_a_timed_out_request_for_the_same_entry() -> None:
    """A batch that re-sends an entry whose earlier ADD to the same bookie timed out: the late
    answer of the old request is absorbed by its spent placeholder (here a refusal), and the
    next answer for that entry is the batch's, not the other way round."""

    async def main() -> None:
        fake = _FakeBookie(lambda data, w: None)
        async with fake as bid:
            client = BookieClient()
            try:
                loop = asyncio.get_running_loop()
                first: asyncio.Future[BaseException | None] = loop.create_future()
                client.add_cb(bid, MASTER_KEY, make_entry(LEDGER, 0, b"a"), False, first.set_result, 0.2)
                assert isinstance(await first, TimeoutError_)
                got: dict[int, BaseException | None] = {}
                done = loop.create_future()

                def answer(k: int, idx: int, b: str, exc: BaseException | None) -> None:
                    assert k not in got
                    got[k] = exc
                    if len(got) == 2:
                        done.set_result(None)

                client.add_quorum_batch_cb([bid], [(0,), (0,)], MASTER_KEY,
                                           [make_entry(LEDGER, 0, b"a"), make_entry(LEDGER, 1, b"b")],
                                           False, answer, [0, 1], 5)
                writer = fake.writers[0]
                writer.write(codec.encode(m.AddResponse(EUA, LEDGER, 0)))  # the timed-out request's
                writer.write(codec.encode(m.AddResponse(EOK, LEDGER, 0)))  # the batch's
                writer.write(codec.encode(m.AddResponse(EOK, LEDGER, 1)))
                await asyncio.wait_for(done, 10)
                assert got == {0: None, 1: None}
            finally:
                await client.close()

    run(main(), use_uvloop=True)
