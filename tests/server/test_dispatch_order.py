"""``Processors.dispatch`` (server/processors.py) hands a connection's requests on in arrival
order: single ADDs gathered into one batch up to the next other request, each other operation
to its processor (made at its first request, then kept), a type no processor takes answered
EBADREQ where it stands. A unit test of the one layer, with a stand-in bookie that records what
it is handed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vellum.errors import EBADREQ
from vellum.format.entry import DigestManager, DigestType
from vellum.proto import FrameDecoder
from vellum.proto import messages as m
from vellum.server.processors import Channel, Counters, Processors
from vellum.server.replies import ReplyWriter

KEY = bytes(20)
DIGEST = DigestManager(5, DigestType.CRC32C)


class Loop:
    """What the reply writer asks of its loop: ``call_soon`` (run by the test)."""

    def __init__(self) -> None:
        self.ready: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        self.ready.append((fn, args))


class Transport:
    def __init__(self) -> None:
        self.written = b""

    def writelines(self, parts: list[bytes]) -> None:
        self.written += b"".join(parts)


class RecordingBookie:
    """Records each hand-down; answers nothing (the order handed down is what is tested)."""

    def __init__(self) -> None:
        self.handed: list[tuple[Any, ...]] = []

    def add_batch_cb(self, batch: m.AddBatch, on_result: Any) -> None:
        self.handed.append(("add", tuple(batch.entry_ids)))

    def read_cb(self, ledger_id: int, entry_id: int, key: bytes | None, done: Any) -> None:
        self.handed.append(("read", entry_id))

    def note_ledger_closed(self, ledger_id: int) -> None:
        self.handed.append(("closed", ledger_id))


def _add(entry_id: int) -> m.AddRequest:
    return m.AddRequest(KEY, DIGEST.compute(entry_id, entry_id - 1, 10 * (entry_id + 1), b"0123456789"))


def test_requests_are_handed_on_in_order_with_single_adds_batched_up_to_the_next_other_request() -> None:
    loop, transport, bookie = Loop(), Transport(), RecordingBookie()
    replies = ReplyWriter(loop, coalesce=False)  # type: ignore[arg-type]  # a stand-in loop
    replies.attach(transport)  # type: ignore[arg-type]  # a stand-in transport
    channel = Channel(bookie, Counters(max_adds=0, max_reads=0, max_frame_size=1 << 20), replies,  # type: ignore[arg-type]
                      loop, lambda: "peer")  # type: ignore[arg-type]
    processors = Processors(channel)
    batch = m.AddBatch.of_requests([_add(7), _add(8)])
    processors.dispatch([_add(0), _add(1), m.ReadRequest(5, 0), m.LedgerClosedNote(1, 5), _add(2),
                         m.AddResponse(0, 5, 2), _add(3), batch, m.ReadRequest(5, 1)])
    assert bookie.handed == [("add", (0, 1)), ("read", 0), ("closed", 5), ("add", (2,)), ("add", (3,)),
                             ("add", (7, 8)), ("read", 1)]
    # A response is no request: answered EBADREQ, once, between the adds around it.
    for fn, args in loop.ready:
        fn(*args)
    answers = FrameDecoder(1 << 20, side="client").feed(transport.written)
    assert answers == [m.ErrorResponse(EBADREQ)]

    # Each operation's processor was made at its first request and is kept.
    reader = processors._by_type[m.ReadRequest]
    assert set(processors._by_type) == {m.ReadRequest, m.LedgerClosedNote}
    processors.dispatch([m.ReadRequest(5, 2)])
    assert processors._by_type[m.ReadRequest] is reader and bookie.handed[-1] == ("read", 2)
