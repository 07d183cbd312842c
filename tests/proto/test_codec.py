"""Round trips, every chunking, framing errors and bad frames of the wire codec (proto/codec.py)."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from proto_strategies import REQUESTS, RESPONSES

from vellum.errors import (
    EBADREQ,
    EBADVERSION,
    ENOENTRY,
    EOK,
    ETOOMANYREQUESTS,
    FramingError,
    IncorrectParameterError,
)
from vellum.format.entry import ENTRY_HEADER_SIZE, DigestManager, DigestType, master_key
from vellum.proto import FrameDecoder, decode_body, encode, encode_parts
from vellum.proto.codec import (
    encode_add_request,
    encode_add_responses,
    encode_read_lac_request,
    encode_read_request,
    encode_read_response,
    encode_strided_read_request,
)
from vellum.proto.messages import (
    FLAG_DO_FENCING,
    MIN_ENTRY_SIZE,
    OP_ADD,
    OP_ERROR,
    OP_LEDGER_CLOSED,
    OP_READ,
    OP_TRIM,
    V2_OPCODES,
    AddAnswers,
    AddBatch,
    AddRequest,
    AddResponse,
    BadFrame,
    BatchReadRequest,
    BatchReadResponse,
    ErrorResponse,
    ForceLedgerRequest,
    LedgerClosedNote,
    ListEntriesResponse,
    Message,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    StridedReadRequest,
    TrimRequest,
    entry_ranges,
    header_int,
    split_header,
)

KEY = master_key(b"pw")
ENTRY = DigestManager(3, DigestType.CRC32C).compute(5, 4, 10, b"0123456789")
MAX = 1 << 20


def frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def server(data: bytes) -> list[object]:
    return list(FrameDecoder(MAX, side="server").feed(data))


def client(data: bytes) -> list[object]:
    return list(FrameDecoder(MAX, side="client").feed(data))


# -- round trips ------------------------------------------------------------------------------


@given(REQUESTS)
def test_request_round_trip(msg: Message) -> None:
    data = encode(msg)
    assert isinstance(data, bytes)
    assert struct.unpack_from(">i", data)[0] == len(data) - 4
    assert b"".join(encode_parts(msg)) == data
    assert server(data) == [msg]
    assert decode_body(data[4:], side="server") == msg


@given(RESPONSES)
def test_response_round_trip(msg: Message) -> None:
    data = encode(msg)
    assert struct.unpack_from(">i", data)[0] == len(data) - 4
    assert b"".join(encode_parts(msg)) == data
    assert client(data) == [msg]
    assert decode_body(memoryview(data)[4:], side="client") == msg


def test_decoded_byte_fields_are_owned_bytes() -> None:
    (msg,) = server(encode(AddRequest(KEY, ENTRY)))
    assert isinstance(msg, AddRequest)
    assert type(msg.entry) is bytes and type(msg.master_key) is bytes
    assert (msg.ledger_id, msg.entry_id) == (3, 5)


def test_encode_parts_does_not_copy_the_entry() -> None:
    payload = memoryview(bytearray(ENTRY))
    parts = encode_parts(AddRequest(KEY, payload))
    assert parts[-1] is payload
    resp_parts = encode_parts(ReadResponse(EOK, 3, 5, ENTRY))
    assert resp_parts[-1] is ENTRY


@given(st.sampled_from([EOK, EBADREQ, 199]),
       st.lists(st.tuples(st.integers(0, 2**63 - 1), st.integers(-1, 2**63 - 1)), max_size=20))
def test_a_batch_of_add_responses_is_the_frames_of_its_add_responses(status: int, ids: list[tuple[int, int]]) -> None:
    ledger_ids, entry_ids = [i[0] for i in ids], [i[1] for i in ids]
    assert encode_add_responses(status, ledger_ids, entry_ids) == b"".join(
        encode(AddResponse(status, lid, eid)) for lid, eid in ids)


@given(st.lists(st.tuples(st.sampled_from([EOK, EBADREQ, 199]), st.integers(0, 2**63 - 1),
                          st.integers(-1, 2**63 - 1)), max_size=20))
def test_a_batch_of_add_responses_may_carry_a_status_per_add(rows: list[tuple[int, int, int]]) -> None:
    statuses, ledger_ids, entry_ids = [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]
    assert encode_add_responses(statuses, ledger_ids, entry_ids) == b"".join(
        encode(AddResponse(status, lid, eid)) for status, lid, eid in rows)


@given(st.sampled_from([EOK, EBADREQ, 199]), st.integers(0, 2**63 - 1), st.integers(-1, 2**63 - 1),
       st.sampled_from([b"", ENTRY, memoryview(ENTRY)]))
def test_a_read_response_from_its_fields_is_the_frame_of_its_message(status: int, ledger_id: int, entry_id: int,
                                                                      entry: bytes | memoryview) -> None:
    if status != EOK and entry:
        entry = b""
    parts = encode_read_response(status, ledger_id, entry_id, entry)
    assert parts == encode_parts(ReadResponse(status, ledger_id, entry_id, entry))
    assert FrameDecoder(MAX, side="client").feed(b"".join(parts)) == [ReadResponse(status, ledger_id, entry_id, entry)]
    assert len(parts) == 1 or parts[-1] is entry  # the entry is not copied


def test_a_read_response_from_its_fields_is_checked() -> None:
    with pytest.raises(IncorrectParameterError, match="an entry is only sent with EOK"):
        encode_read_response(EBADREQ, 1, 2, ENTRY)
    with pytest.raises(IncorrectParameterError, match="cannot encode a READ response"):
        encode_read_response(EOK, 2**63, 2, ENTRY)


@given(st.integers(0, 2**63 - 1), st.integers(-1, 2**63 - 1), st.sampled_from([0, FLAG_DO_FENCING, 4, 5]))
def test_a_read_request_from_its_fields_is_the_frame_of_its_message(ledger_id: int, entry_id: int,
                                                                     flags: int) -> None:
    key = KEY if flags & FLAG_DO_FENCING else None
    parts = encode_read_request(ledger_id, entry_id, flags, key)
    assert parts == encode_parts(ReadRequest(ledger_id, entry_id, flags, key))
    assert FrameDecoder(MAX, side="server").feed(b"".join(parts)) == [ReadRequest(ledger_id, entry_id, flags, key)]


@given(st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1))
def test_a_read_lac_request_from_its_fields_is_the_frame_of_its_message(request_id: int, ledger_id: int) -> None:
    parts = encode_read_lac_request(request_id, ledger_id)
    assert parts == encode_parts(ReadLacRequest(request_id, ledger_id))
    assert FrameDecoder(MAX, side="server").feed(b"".join(parts)) == [ReadLacRequest(request_id, ledger_id)]


@given(st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1), st.integers(-1, 2**63 - 1),
       st.integers(1, 2**31 - 1), st.integers(1, 2**31 - 1), st.integers(0, 2**63 - 1))
def test_a_strided_read_request_from_its_fields_is_the_frame_of_its_message(
        request_id: int, ledger_id: int, first: int, stride: int, count: int, max_size: int) -> None:
    parts = encode_strided_read_request(request_id, ledger_id, first, stride, count, max_size)
    msg = StridedReadRequest(request_id, ledger_id, first, stride, count, max_size)
    assert parts == encode_parts(msg)
    assert FrameDecoder(MAX, side="server").feed(b"".join(parts)) == [msg]


def test_read_requests_from_their_fields_are_checked() -> None:
    with pytest.raises(IncorrectParameterError, match="master key must be 20 bytes, got none"):
        encode_read_request(1, 2, FLAG_DO_FENCING)
    with pytest.raises(IncorrectParameterError, match="only sent with FLAG_DO_FENCING"):
        encode_read_request(1, 2, 0, KEY)
    with pytest.raises(IncorrectParameterError, match="do not fit in 16 bits"):
        encode_read_request(1, 2, 0x10000)
    with pytest.raises(IncorrectParameterError, match="cannot encode a READ request"):
        encode_read_request(2**63, 2)
    with pytest.raises(IncorrectParameterError, match="cannot encode a READ_LAC request"):
        encode_read_lac_request(1, -2**63 - 1)
    with pytest.raises(IncorrectParameterError, match="stride 0 and count 3 must be >= 1"):
        encode_strided_read_request(1, 2, 0, 0, 3, 0)
    with pytest.raises(IncorrectParameterError, match="cannot encode a READ_STRIDED request"):
        encode_strided_read_request(1, 2, 0, 2**31, 3, 0)


def test_a_batch_of_add_responses_is_checked() -> None:
    with pytest.raises(IncorrectParameterError, match="cannot encode ADD responses"):
        encode_add_responses(EOK, [1, 2], [0])
    with pytest.raises(IncorrectParameterError, match="cannot encode ADD responses"):
        encode_add_responses(EOK, [2**63], [0])
    with pytest.raises(IncorrectParameterError, match="1 statuses, 2 ledger ids"):
        encode_add_responses([EOK], [1, 2], [0, 1])


def test_min_entry_size_matches_the_entry_format() -> None:
    assert MIN_ENTRY_SIZE == ENTRY_HEADER_SIZE


def test_header_int_packing() -> None:
    assert header_int(OP_ADD) == 0x02010000
    assert header_int(OP_READ, FLAG_DO_FENCING) == 0x02020001
    assert split_header(0x02010002) == (2, OP_ADD, 2)


@given(st.lists(st.integers(min_value=-3, max_value=300), max_size=60))
def test_entry_ranges_compress_ids(ids: list[int]) -> None:
    ranges = entry_ranges(ids)
    resp = ListEntriesResponse(1, EOK, 2, ranges)
    assert list(resp.entry_ids()) == sorted(set(ids))
    assert resp.entry_count == len(set(ids))
    # canonical: sorted, disjoint and never adjacent
    for (_, last), (first, _) in itertools.pairwise(ranges):
        assert first > last + 1


def test_entry_ranges_example() -> None:
    assert entry_ranges([5, 0, 2, 1, 2]) == ((0, 2), (5, 5))
    assert entry_ranges([]) == ()


# -- every chunking ---------------------------------------------------------------------------


@given(
    msgs=st.lists(REQUESTS, min_size=1, max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=20),
    kind=st.sampled_from(["bytes", "memoryview", "reused-bytearray"]),
)
def test_server_decoder_is_chunking_independent(msgs: list[Message], cuts: list[int], kind: str) -> None:
    stream = b"".join(encode(m) for m in msgs)
    _check_chunking(stream, cuts, kind, "server", msgs)


@given(
    msgs=st.lists(RESPONSES, min_size=1, max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=20),
    kind=st.sampled_from(["bytes", "memoryview", "reused-bytearray"]),
    allocate_announced=st.booleans(),
)
def test_client_decoder_is_chunking_independent(msgs: list[Message], cuts: list[int], kind: str,
                                                allocate_announced: bool) -> None:
    stream = b"".join(encode(m) for m in msgs)
    _check_chunking(stream, cuts, kind, "client", msgs, allocate_announced=allocate_announced)


@given(
    msgs=st.lists(REQUESTS, min_size=1, max_size=8),
    adds=st.lists(st.integers(min_value=0, max_value=3), max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=20),
    kind=st.sampled_from(["bytes", "memoryview", "reused-bytearray"]),
)
def test_batching_server_decoder_gives_the_same_requests(msgs: list[Message], adds: list[int], cuts: list[int],
                                                         kind: str) -> None:
    """``batch_adds``: runs of ADDs come as ``AddBatch``es, whose requests are exactly the
    frames' (any chunking), with the other requests in between in order."""
    mixed: list[Message] = []
    for i, msg in enumerate(msgs):
        mixed.append(msg)
        for e in range(adds[i] if i < len(adds) else 0):  # runs of pipelined ADDs
            entry = DigestManager(7, DigestType.CRC32C).compute(e, e - 1, 0, b"x" * (e * 100))
            mixed.append(AddRequest(KEY, entry, flags=2 if e == 1 else 0))
    stream = b"".join(encode(m) for m in mixed)
    _check_chunking(stream, cuts, kind, "server", mixed, batch_adds=True)


def test_batching_decoder_batches_the_adds_of_one_read() -> None:
    entries = [DigestManager(7, DigestType.CRC32C).compute(e, e - 1, 0, b"p%d" % e) for e in range(5)]
    read = ReadRequest(7, 1)
    stream = b"".join(encode(AddRequest(KEY, e)) for e in entries[:3]) + encode(read) + b"".join(
        encode(AddRequest(KEY, e, flags=2)) for e in entries[3:])
    out = FrameDecoder(MAX, side="server", batch_adds=True).feed(stream)
    assert [type(m).__name__ for m in out] == ["AddBatch", "ReadRequest", "AddBatch"]
    first, _, second = out
    assert isinstance(first, AddBatch) and isinstance(second, AddBatch)
    assert first.entries == entries[:3] and all(type(e) is bytes for e in first.entries)
    assert first.ledger_ids == [7, 7, 7] and first.entry_ids == [0, 1, 2] and first.keys == [KEY] * 3
    assert first.lacs == [-1, 0, 1] and second.lacs == [2, 3]  # each entry's piggy-backed LAC, decoded once
    assert first.recovery() == [False] * 3 and second.recovery() == [True, True]
    assert second.requests() == [AddRequest(KEY, e, flags=2) for e in entries[3:]]


@given(
    msgs=st.lists(RESPONSES, min_size=1, max_size=8),
    adds=st.lists(st.integers(min_value=0, max_value=3), max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=20),
    kind=st.sampled_from(["bytes", "memoryview", "reused-bytearray"]),
)
def test_batching_client_decoder_gives_the_same_responses(msgs: list[Message], adds: list[int], cuts: list[int],
                                                          kind: str) -> None:
    """``batch_adds`` on the client side: runs of ADD answers come as ``AddAnswers``, whose
    responses are exactly the frames' (any chunking), with the other answers in between in order."""
    mixed: list[Message] = []
    for i, msg in enumerate(msgs):
        mixed.append(msg)
        for e in range(adds[i] if i < len(adds) else 0):  # runs of pipelined ADD answers
            mixed.append(AddResponse(EOK if e != 1 else ETOOMANYREQUESTS, 7, e))
    stream = b"".join(encode(m) for m in mixed)
    _check_chunking(stream, cuts, kind, "client", mixed, batch_adds=True)


def test_batching_client_decoder_batches_the_add_answers_of_one_read() -> None:
    answers = [AddResponse(EOK, 7, e) for e in range(3)]
    stream = (b"".join(encode(a) for a in answers[:2]) + encode(ReadResponse(ENOENTRY, 7, 9))
              + encode(answers[2]) + encode_add_responses(EOK, [8, 8], [0, 1]))
    out = FrameDecoder(MAX, side="client", batch_adds=True).feed(stream)
    assert [type(m).__name__ for m in out] == ["AddAnswers", "ReadResponse", "AddAnswers"]
    first, _, second = out
    assert isinstance(first, AddAnswers) and isinstance(second, AddAnswers)
    assert first.statuses == [EOK, EOK] and first.ledger_ids == [7, 7] and first.entry_ids == [0, 1]
    assert second.responses() == [answers[2], AddResponse(EOK, 8, 0), AddResponse(EOK, 8, 1)]
    # An ADD answer of the wrong size is not an answer to match: it stays a BadFrame.
    bad = frame(struct.pack(">Iiqqq", (2 << 24) | (OP_ADD << 16), EOK, 7, 3, 0))
    out = FrameDecoder(MAX, side="client", batch_adds=True).feed(encode(answers[0]) + bad + encode(answers[1]))
    assert [type(m).__name__ for m in out] == ["AddAnswers", "BadFrame", "AddAnswers"]


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(min_value=2, max_value=700),
    odd=st.lists(st.tuples(st.integers(min_value=0, max_value=699),
                           st.sampled_from(["flags", "size", "opcode", "read", "key"])), max_size=4),
    cut=st.integers(min_value=0, max_value=67),  # the tail frame is 68 bytes
)
def test_a_long_run_of_adds_decodes_as_its_frames(n: int, odd: list[tuple[int, str]], cut: int) -> None:
    """Runs of ADD frames of one size are decoded as columns many frames at once: longer than
    one such step, cut where a frame is not like the first (other flags: still an ADD; another
    size; another opcode of the same size: not an ADD; another request), before a partial
    frame; master keys may differ within a run."""
    dm = DigestManager(3, DigestType.CRC32C)
    frames = [encode(AddRequest(KEY, dm.compute(e, e - 1, 10 * e, b"p%04d" % (e % 10_000)), 0)) for e in range(n)]
    for at, kind in odd:
        if at < n:
            entry = dm.compute(at, at - 1, 10 * at, b"p%04d" % at)
            if kind == "flags":
                frames[at] = encode(AddRequest(KEY, entry, 2))
            elif kind == "size":
                frames[at] = encode(AddRequest(KEY, entry + b"+", 0))
            elif kind == "opcode":  # an ADD's body under another opcode
                body = bytearray(frames[at][4:])
                body[1] = OP_READ
                frames[at] = frame(bytes(body))
            elif kind == "read":
                frames[at] = encode(ReadRequest(3, at))
            else:
                frames[at] = encode(AddRequest(master_key(b"other"), entry, 0))
    stream = b"".join(frames)
    tail = encode(AddRequest(KEY, dm.compute(9, 8, 0, b"tail"), 0))
    expected = FrameDecoder(MAX, side="server").feed(stream)
    decoder = FrameDecoder(MAX, side="server", batch_adds=True)
    out = decoder.feed(stream + tail[:cut])
    flat = [r for m in out for r in (m.requests() if isinstance(m, AddBatch) else [m])]
    assert flat == expected
    batches = [m for m in out if isinstance(m, AddBatch)]
    for b in batches:  # the id columns are the entries' first 24 bytes
        assert [struct.unpack_from(">qqq", e) for e in b.entries] == list(zip(b.ledger_ids, b.entry_ids, b.lacs))
        assert all(type(e) is bytes for e in b.entries)
    assert decoder.buffered == cut
    rest = decoder.feed(tail[cut:])
    assert [r for m in rest for r in m.requests()] == [AddRequest(KEY, dm.compute(9, 8, 0, b"tail"), 0)]  # type: ignore[union-attr]


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(min_value=2, max_value=700),
    odd=st.lists(st.tuples(st.integers(min_value=0, max_value=699), st.sampled_from(["flags", "opcode", "read"])),
                 max_size=4),
    cut=st.integers(min_value=0, max_value=27),
)
def test_a_long_run_of_add_answers_decodes_as_its_frames(n: int, odd: list[tuple[int, str]], cut: int) -> None:
    """Runs of ADD answers are decoded as columns many frames at once: longer than one such
    step, cut where a frame of the same size is not like its first (other flags: still an
    answer; another opcode: a BadFrame), before another response, and before a partial frame."""
    frames = [encode(AddResponse(EOK if e % 5 else ETOOMANYREQUESTS, 7 + e // 300, e)) for e in range(n)]
    for at, kind in odd:
        if at < n:
            if kind == "flags":  # the same answer with a flag set: matched as the others
                frames[at] = frame(struct.pack(">Iiqq", (2 << 24) | (OP_ADD << 16) | 1, EOK, 7, at))
            elif kind == "opcode":  # 24 bytes of body, but not an ADD
                frames[at] = frame(struct.pack(">Iiqq", (2 << 24) | (OP_READ << 16), EOK, 7, at))
            else:
                frames[at] = encode(ReadResponse(ENOENTRY, 7, at))
    stream = b"".join(frames)
    tail = encode(AddResponse(EOK, 9, 9))
    expected = FrameDecoder(MAX, side="client").feed(stream)
    decoder = FrameDecoder(MAX, side="client", batch_adds=True)
    out = decoder.feed(stream + tail[:cut])
    flat = [r for m in out for r in (m.responses() if isinstance(m, AddAnswers) else [m])]
    assert flat == expected
    assert decoder.buffered == cut
    assert decoder.feed(tail[cut:])[0].responses() == [AddResponse(EOK, 9, 9)]  # type: ignore[union-attr]


def test_an_add_frame_built_without_its_message_is_the_messages_frame() -> None:
    parts = encode_add_request(KEY, ENTRY, 2)
    assert parts[1] is ENTRY  # the entry is never copied
    assert b"".join(parts) == encode(AddRequest(KEY, ENTRY, flags=2))
    with pytest.raises(IncorrectParameterError, match="shorter than its header"):
        encode_add_request(KEY, ENTRY[:31], 0)
    with pytest.raises(IncorrectParameterError, match="master key must be 20 bytes"):
        encode_add_request(KEY[:19], ENTRY, 0)
    with pytest.raises(IncorrectParameterError, match="16 bits"):
        encode_add_request(KEY, ENTRY, 1 << 16)


def _check_chunking(stream: bytes, cuts: list[int], kind: str, side: str, msgs: list[Message], *,
                    batch_adds: bool = False, allocate_announced: bool = False) -> None:
    bounds = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    decoder = FrameDecoder(MAX, side=side, batch_adds=batch_adds,  # type: ignore[arg-type]
                           allocate_announced=allocate_announced)
    out: list[object] = []
    scratch = bytearray(len(stream))
    for a, b in itertools.pairwise(bounds):
        chunk = stream[a:b]
        if kind == "bytes":
            out += decoder.feed(chunk)
        elif kind == "memoryview":
            out += decoder.feed(memoryview(stream)[a:b])
        else:
            # A receive buffer the caller reuses: the decoder must not keep views of it.
            view = memoryview(scratch)[: b - a]
            view[:] = chunk
            out += decoder.feed(view)
            view[:] = b"\xa5" * (b - a)
    if batch_adds:
        out = [r for m in out for r in (m.requests() if isinstance(m, AddBatch) else
                                        m.responses() if isinstance(m, AddAnswers) else [m])]
    assert out == msgs
    assert decoder.buffered == 0


def test_partial_frame_is_kept_until_complete() -> None:
    data = encode(AddRequest(KEY, ENTRY))
    decoder = FrameDecoder(MAX, side="server")
    assert decoder.feed(data[:3]) == []
    assert decoder.feed(data[3:30]) == []
    assert decoder.buffered == 30
    assert decoder.feed(data[30:] + data[:10]) == [AddRequest(KEY, ENTRY)]
    assert decoder.buffered == 10
    assert decoder.feed(data[10:]) == [AddRequest(KEY, ENTRY)]
    assert decoder.feed(b"") == []


# -- framing errors ---------------------------------------------------------------------------


@pytest.mark.parametrize("length", [-1, -(1 << 31), 101])
def test_bad_frame_length_is_a_framing_error_and_sticks(length: int) -> None:
    decoder = FrameDecoder(100, side="server")
    good = encode(ForceLedgerRequest(1, 2))
    with pytest.raises(FramingError, match="frame length"):
        decoder.feed(good + struct.pack(">i", length) + b"\x00" * 8)
    with pytest.raises(FramingError):
        decoder.feed(good)


def test_framing_error_when_the_length_arrives_in_pieces() -> None:
    decoder = FrameDecoder(100, side="client")
    assert decoder.feed(b"\x00\x00") == []
    with pytest.raises(FramingError):
        decoder.feed(b"\x01\x00")  # 256 > 100


def test_frame_of_exactly_max_size_is_accepted() -> None:
    msg = ReadResponse(EOK, 1, 2, b"e" * 76)  # body = 24 + 76 = 100
    assert FrameDecoder(100, side="client").feed(encode(msg)) == [msg]
    with pytest.raises(FramingError):
        FrameDecoder(99, side="client").feed(encode(msg))


def test_decoder_arguments_are_checked() -> None:
    with pytest.raises(IncorrectParameterError):
        FrameDecoder(1024, side="both")  # type: ignore[arg-type]
    with pytest.raises(IncorrectParameterError):
        FrameDecoder(2, side="server")


# -- bad frames: framing intact, connection survives ------------------------------------------


def _then_good(bad_body: bytes, side: str = "server") -> BadFrame:
    """Feed a bad frame followed by a good one; the good one must still decode."""
    good: Message = ForceLedgerRequest(7, 8) if side == "server" else AddResponse(EOK, 1, 2)
    out = FrameDecoder(MAX, side=side).feed(frame(bad_body) + encode(good))  # type: ignore[arg-type]
    assert len(out) == 2 and out[1] == good
    assert isinstance(out[0], BadFrame)
    return out[0]


def test_unsupported_version_answers_ebadversion() -> None:
    body = encode(ReadRequest(1, 2))[4:]
    bad = _then_good(b"\x03" + body[1:])
    assert (bad.status, bad.version, bad.opcode) == (EBADVERSION, 3, OP_READ)
    assert bad.error_response() == ErrorResponse(EBADVERSION, None, OP_READ, None, None)


def test_unknown_opcode_in_vellums_range_keeps_the_request_id() -> None:
    bad = _then_good(struct.pack(">Iqq", header_int(99), 1234, 5))
    assert bad.status == EBADREQ and bad.opcode == 99 and bad.request_id == 1234
    assert bad.error_response() == ErrorResponse(EBADREQ, 1234, 99, None, None)


def test_unknown_opcode_outside_vellums_range_has_no_ids() -> None:
    bad = _then_good(struct.pack(">Iqq", header_int(3), 1, 2))  # v2 AUTH: not served
    assert bad.request_id is None and bad.ledger_id is None
    assert "opcode 3" in bad.reason


def test_body_without_header() -> None:
    bad = _then_good(b"\x02\x01")
    assert bad.opcode is None and "no header" in bad.reason
    assert bad.error_response() == ErrorResponse(EBADREQ)


def test_short_add_answers_with_an_add_response_when_ids_are_known() -> None:
    truncated = encode(AddRequest(KEY, ENTRY))[4 : 4 + 24 + 20]  # entry header cut short
    bad = _then_good(truncated)
    assert (bad.opcode, bad.ledger_id, bad.entry_id) == (OP_ADD, 3, 5)
    assert bad.error_response() == AddResponse(EBADREQ, 3, 5)
    bad = _then_good(truncated[:30])
    assert bad.ledger_id is None
    assert bad.error_response() == ErrorResponse(EBADREQ, None, OP_ADD, None, None)


def test_fencing_read_without_master_key() -> None:
    body = struct.pack(">Iqq", header_int(OP_READ, FLAG_DO_FENCING), 4, 6)
    bad = _then_good(body)
    assert "fencing READ" in bad.reason
    assert bad.error_response() == ReadResponse(EBADREQ, 4, 6)


def test_read_with_trailing_bytes_is_bad() -> None:
    bad = _then_good(encode(ReadRequest(4, 6))[4:] + b"\x00")
    assert bad.error_response() == ReadResponse(EBADREQ, 4, 6)


def test_bad_batch_read_answers_by_request_id() -> None:
    body = encode(BatchReadRequest(4, 6, 99, 10, 1000))[4:]
    bad = _then_good(body[:-1])
    assert bad.error_response() == BatchReadResponse(EBADREQ, 4, 6, 99)


def test_bad_trim_keeps_request_and_ledger_ids() -> None:
    body = encode(TrimRequest(11, 12, 13, KEY))[4:]
    bad = _then_good(body[:-3])
    assert (bad.opcode, bad.request_id, bad.ledger_id) == (OP_TRIM, 11, 12)
    assert bad.error_response() == ErrorResponse(EBADREQ, 11, OP_TRIM, 12, None)


def test_bad_ledger_closed_note_gets_no_answer() -> None:
    body = encode(LedgerClosedNote(1, 2))[4:]
    bad = _then_good(body + b"\x00")
    assert bad.opcode == OP_LEDGER_CLOSED
    assert bad.error_response() is None


def test_server_does_not_accept_responses_and_client_not_requests() -> None:
    bad = _then_good(encode(ErrorResponse(EBADREQ))[4:], side="server")
    assert bad.opcode == OP_ERROR and "not a known request" in bad.reason
    bad = _then_good(encode(LedgerClosedNote(1, 2))[4:], side="client")
    assert bad.opcode == OP_LEDGER_CLOSED and "not a known response" in bad.reason


def test_client_side_bad_frames() -> None:
    bad = _then_good(encode(ReadResponse(EBADREQ, 4, 6))[4:] + b"junk", side="client")
    assert (bad.ledger_id, bad.entry_id) == (4, 6)
    body = encode(BatchReadResponse(EOK, 1, 2, 3, (b"abc",)))[4:]
    bad = _then_good(body[:-1], side="client")  # entry claims more bytes than present
    assert "claims 3 bytes" in bad.reason and bad.request_id == 3
    body = encode(ReadLacResponse(5, EOK, 6, b"lac", b"entry"))[4:]
    bad = _then_good(body + b"x", side="client")
    assert (bad.request_id, bad.ledger_id) == (5, 6)
    body = encode(ListEntriesResponse(5, EOK, 6, ((1, 2),)))[4:]
    bad = _then_good(body[:-8] + struct.pack(">q", 0), side="client")  # (1, 0): first > last
    assert "sorted" in bad.reason


@given(body=st.binary(max_size=80), opcode=st.integers(min_value=0, max_value=255), flags=st.integers(0, 7))
def test_any_well_framed_body_decodes_without_raising(body: bytes, opcode: int, flags: int) -> None:
    # Random contents behind a valid header: a message or a BadFrame, never an exception.
    for side in ("server", "client"):
        for data in (body, struct.pack(">I", header_int(opcode, flags)) + body):
            out = FrameDecoder(MAX, side=side).feed(frame(data))  # type: ignore[arg-type]
            assert len(out) == 1
            msg = out[0]
            if isinstance(msg, BadFrame):
                reply = msg.error_response()
                assert reply is None or encode(reply)
            elif side == "server" or type(msg).OPCODE not in V2_OPCODES:
                assert encode(msg) == frame(data)  # whatever decodes is canonical
            else:
                # v2 responses ignore header flags (as BookKeeper does); the rest is canonical
                assert encode(msg)[8:] == data[4:]


# -- encode refuses what does not fit --------------------------------------------------------


@pytest.mark.parametrize(
    "msg",
    [
        AddRequest(b"short", ENTRY),
        AddRequest(KEY, ENTRY[:31]),
        AddRequest(KEY, ENTRY, flags=0x10000),
        AddRequest(KEY, ENTRY, flags=-1),
        ReadRequest(1, 2, FLAG_DO_FENCING),
        ReadRequest(1, 2, 0, KEY),
        BatchReadRequest(1, 2, 3, 4, 5, 0, KEY),
        ReadResponse(EBADREQ, 1, 2, ENTRY),
        BatchReadResponse(EBADREQ, 1, 2, 3, (ENTRY,)),
        AddResponse(EOK, 1 << 63, 0),
        BatchReadRequest(1, 2, 3, 1 << 31, 5),
        TrimRequest(1, 2, 3, KEY + b"x"),
        ListEntriesResponse(1, EOK, 2, ((5, 6), (1, 2))),
        ListEntriesResponse(1, EOK, 2, ((5, 4),)),
    ],
)
def test_encode_rejects_values_that_do_not_fit(msg: Message) -> None:
    with pytest.raises(IncorrectParameterError):
        encode(msg)


def test_encode_rejects_non_messages() -> None:
    with pytest.raises(IncorrectParameterError, match="BadFrame"):
        encode(BadFrame("x"))  # type: ignore[arg-type]


# -- the BufferedProtocol path (get_buffer / buffer_updated) -------------------------------------

BIG_ENTRY = DigestManager(3, DigestType.CRC32C).compute(6, 5, 70000, bytes(range(256)) * 160)  # ~40 KiB


def _big_requests() -> list[Message]:
    return [AddRequest(KEY, BIG_ENTRY), AddRequest(KEY, ENTRY), AddRequest(KEY, BIG_ENTRY),
            ForceLedgerRequest(1, 3), AddRequest(KEY, BIG_ENTRY)]


def _big_responses() -> list[Message]:
    return [ReadResponse(EOK, 3, 6, BIG_ENTRY), AddResponse(EOK, 3, 5),
            BatchReadResponse(EOK, 3, 6, 9, (BIG_ENTRY, ENTRY, BIG_ENTRY)), ReadResponse(EOK, 3, 5, ENTRY),
            ReadResponse(EOK, 3, 6, BIG_ENTRY)]


def _read_into(decoder: FrameDecoder, stream: bytes, sizes: list[int]) -> list[object]:
    """What a BufferedProtocol transport does: recv_into whatever get_buffer returns."""
    out: list[object] = []
    pos = 0
    k = 0
    while pos < len(stream):
        buf = decoder.get_buffer(-1)
        assert len(buf) > 0
        n = min(len(buf), len(stream) - pos, sizes[k % len(sizes)] if sizes else len(buf))
        k += 1
        buf[:n] = stream[pos:pos + n]
        buf.release()
        out += decoder.buffer_updated(n)
        pos += n
    return out


# No deadline: small read sizes cut the ~130 KiB stream into tens of thousands of reads, whose
# time depends on the machine's load, not on the decoder.
@settings(deadline=None)
@given(big_first=st.booleans(), sizes=st.lists(st.integers(min_value=1, max_value=70000), max_size=12),
       side=st.sampled_from(["server", "client"]), allocate_announced=st.booleans())
def test_buffered_reads_decode_the_same_messages(big_first: bool, sizes: list[int], side: str,
                                                 allocate_announced: bool) -> None:
    msgs = _big_requests() if side == "server" else _big_responses()
    if not big_first:
        msgs = msgs[1:] + msgs[:1]
    stream = b"".join(encode(m) for m in msgs)
    decoder = FrameDecoder(MAX, side=side, allocate_announced=allocate_announced)  # type: ignore[arg-type]
    assert _read_into(decoder, stream, sizes) == msgs
    assert decoder.buffered == 0


def test_a_big_frame_is_read_into_its_own_buffer_and_decoded_without_copies() -> None:
    decoder = FrameDecoder(MAX, side="server")
    first = encode(AddRequest(KEY, BIG_ENTRY))
    buf = decoder.get_buffer(-1)
    buf[:100] = first[:100]  # a length and the start of a big body land in scratch
    buf.release()
    assert decoder.buffer_updated(100) == []
    body = decoder.get_buffer(-1)
    assert len(body) == len(first) - 100  # the rest of the body, straight into its own buffer
    body[:] = first[100:]
    body.release()
    (msg,) = decoder.buffer_updated(len(first) - 100)
    assert isinstance(msg, AddRequest) and isinstance(msg.entry, memoryview)
    assert msg.entry == BIG_ENTRY
    # After a big frame only the next length is read, so a big body never lands in scratch.
    assert len(decoder.get_buffer(-1)) == 4


def test_small_frames_read_into_scratch_are_copies() -> None:
    decoder = FrameDecoder(MAX, side="client")
    stream = encode(ReadResponse(EOK, 3, 5, ENTRY)) * 3
    msgs = _read_into(decoder, stream, [])
    assert [type(m.entry) for m in msgs] == [bytes] * 3  # type: ignore[attr-defined]


def test_framing_error_through_buffered_reads_sticks() -> None:
    decoder = FrameDecoder(100, side="client")
    buf = decoder.get_buffer(-1)
    buf[:4] = struct.pack(">i", 1000)
    buf.release()
    with pytest.raises(FramingError):
        decoder.buffer_updated(4)
    assert len(decoder.get_buffer(-1)) > 0  # a closing connection may still read: nothing parsed
    with pytest.raises(FramingError):
        decoder.buffer_updated(1)


def test_a_strided_read_with_a_zero_stride_is_a_bad_frame_answered_by_request_id() -> None:
    from vellum.proto.messages import OP_READ_STRIDED, StridedReadRequest, StridedReadResponse

    good = encode(StridedReadRequest(9, 4, 0, 3, 10, 0))
    bad = bytearray(good)
    struct.pack_into(">i", bad, 4 + 4 + 24, 0)  # stride = 0
    (msg,) = server(bytes(bad))
    assert isinstance(msg, BadFrame) and msg.opcode == OP_READ_STRIDED
    assert msg.request_id == 9 and msg.ledger_id == 4 and "stride" in msg.reason
    assert msg.error_response() == ErrorResponse(EBADREQ, 9, OP_READ_STRIDED, 4, None)
    assert client(encode(StridedReadResponse(9, EOK, 4, 0, (ENTRY, ENTRY)))) == [
        StridedReadResponse(9, EOK, 4, 0, (ENTRY, ENTRY))]


# -- memory follows the bytes received, not the lengths announced -------------------------------

HUGE_ENTRY = DigestManager(3, DigestType.CRC32C).compute(6, 5, 70000, bytes(range(256)) * 1200)  # ~300 KiB


def test_an_announced_big_frame_gets_memory_only_as_its_bytes_arrive() -> None:
    decoder = FrameDecoder(MAX, side="server")
    buf = decoder.get_buffer(-1)
    buf[:8] = struct.pack(">iI", MAX, 0)  # a 5 MiB frame announced, 4 bytes of it sent
    buf.release()
    assert decoder.buffer_updated(8) == []
    room = decoder.get_buffer(-1)
    # Room for what came and about as much again, not the 5 MiB announced.
    assert 0 < len(room) <= FrameDecoder.BIG_START
    assert decoder.buffered == 8


@settings(deadline=None, max_examples=30)
@given(sizes=st.lists(st.integers(min_value=1, max_value=200000), min_size=1, max_size=8),
       hold_views=st.booleans(), allocate_announced=st.booleans())
def test_a_growing_big_frame_decodes_the_same_however_it_is_read(sizes: list[int], hold_views: bool,
                                                                  allocate_announced: bool) -> None:
    msgs = [AddRequest(KEY, HUGE_ENTRY), AddRequest(KEY, ENTRY), AddRequest(KEY, HUGE_ENTRY)]
    stream = b"".join(encode(m) for m in msgs)
    decoder = FrameDecoder(MAX, side="server", allocate_announced=allocate_announced)
    out: list[object] = []
    held: list[memoryview] = []  # a transport that keeps its views: the buffer must move, not resize
    pos = k = 0
    while pos < len(stream):
        buf = decoder.get_buffer(-1)
        n = min(len(buf), len(stream) - pos, sizes[k % len(sizes)])
        k += 1
        buf[:n] = stream[pos:pos + n]
        if hold_views:
            held.append(buf)
        else:
            buf.release()
        out += decoder.buffer_updated(n)
        pos += n
    assert out == msgs
    assert decoder.buffered == 0


def test_the_max_frame_size_may_be_raised_between_reads() -> None:
    decoder = FrameDecoder(64, side="server")
    small = encode(ForceLedgerRequest(1, 3))
    assert decoder.feed(small) == [ForceLedgerRequest(1, 3)]
    decoder.max_frame_size = MAX  # e.g. the peer authenticated
    assert decoder.feed(encode(AddRequest(KEY, BIG_ENTRY))) == [AddRequest(KEY, BIG_ENTRY)]
    decoder.max_frame_size = 64
    with pytest.raises(FramingError, match=r"outside 0\.\.64"):
        decoder.feed(encode(AddRequest(KEY, ENTRY)))
    with pytest.raises(IncorrectParameterError):
        FrameDecoder(64, side="server").max_frame_size = 3
