"""The buffers of big frames (``FrameDecoder`` in proto/decoding.py): with ``allocate_announced``
(the client) a big frame's buffer is made once at its announced size, after the length was
checked against ``max_frame_size``; without it (a bookie) the buffer grows with the bytes that
arrive. Either way: the same messages whatever the chunking, entries as views of the frame's
own buffer, and an oversized length refused before anything of its size is allocated."""

from __future__ import annotations

import struct
import tracemalloc

import pytest

from vellum.errors import EOK, FramingError
from vellum.format.entry import DigestManager, DigestType
from vellum.proto import FrameDecoder, encode
from vellum.proto.messages import (
    AddResponse,
    BatchReadResponse,
    FrameEntries,
    Message,
    ReadLacResponse,
    ReadResponse,
    StridedReadResponse,
)

MAX = 1 << 20
DM = DigestManager(3, DigestType.CRC32C)
SMALL = DM.compute(6, 5, 10, b"0123456789")


def _big_batch() -> BatchReadResponse:
    """A BATCH_READ answer just over ``BIG_FRAME``: 16 entries of 1 KiB."""
    return BatchReadResponse(EOK, 3, 0, 11, tuple(DM.compute(i, i - 1, 0, bytes([i]) * 1024) for i in range(16)))


def _big_strided() -> StridedReadResponse:
    """A READ_STRIDED answer of two entries of 8,300 bytes."""
    return StridedReadResponse(12, EOK, 3, 0, tuple(DM.compute(i, i - 1, 0, bytes([65 + i]) * 8300) for i in range(2)))


def _stream() -> list[Message]:
    """Big frames, then small ones, then a big one after small ones."""
    return [_big_batch(), ReadResponse(EOK, 3, 5, SMALL), AddResponse(EOK, 3, 5),
            ReadLacResponse(13, EOK, 3, b"lac", b"last"), _big_strided(), ReadResponse(EOK, 3, 6, SMALL)]


def _read_into(decoder: FrameDecoder, stream: bytes, cut: int) -> list[object]:
    """What a BufferedProtocol transport does (recv_into what ``get_buffer`` returns), with the
    bytes arriving as two reads split at ``cut``."""
    out: list[object] = []
    pos = 0
    for stop in (cut, len(stream)):
        while pos < stop:
            buf = decoder.get_buffer(-1)
            assert len(buf) > 0
            n = min(len(buf), stop - pos)
            buf[:n] = stream[pos:pos + n]
            buf.release()
            out += decoder.buffer_updated(n)
            pos += n
    return out


@pytest.mark.parametrize("allocate_announced", [False, True], ids=["grown", "announced"])
def test_a_stream_split_at_every_byte_decodes_the_same(allocate_announced: bool) -> None:
    msgs = _stream()
    stream = b"".join(encode(m) for m in msgs)
    assert min(len(encode(msgs[0])), len(encode(msgs[4]))) - 4 >= FrameDecoder.BIG_FRAME  # two big frames
    for cut in range(len(stream) + 1):
        fed = FrameDecoder(MAX, side="client", allocate_announced=allocate_announced)
        assert fed.feed(stream[:cut]) + fed.feed(stream[cut:]) == msgs, f"fed, split at {cut}"
        assert fed.buffered == 0
        read = FrameDecoder(MAX, side="client", allocate_announced=allocate_announced)
        assert _read_into(read, stream, cut) == msgs, f"read into, split at {cut}"
        assert read.buffered == 0


@pytest.mark.parametrize("allocate_announced", [False, True], ids=["grown", "announced"])
def test_many_frames_in_one_chunk(allocate_announced: bool) -> None:
    msgs = _stream() * 5
    stream = b"".join(encode(m) for m in msgs)
    decoder = FrameDecoder(MAX, side="client", allocate_announced=allocate_announced)
    assert decoder.feed(stream) == msgs
    assert decoder.buffered == 0


def test_a_big_frame_gets_its_announced_size_at_once_and_entries_are_views_of_it() -> None:
    big = _big_batch()
    frame = encode(big)
    decoder = FrameDecoder(MAX, side="client", allocate_announced=True)
    buf = decoder.get_buffer(-1)
    buf[:8] = frame[:8]  # the length and the header
    buf.release()
    assert decoder.buffer_updated(8) == []
    room = decoder.get_buffer(-1)
    assert len(room) == len(frame) - 8  # the rest of the frame, in one buffer made once
    room[:] = frame[8:]
    room.release()
    (msg,) = decoder.buffer_updated(len(frame) - 8)
    assert msg == big
    assert isinstance(msg, BatchReadResponse) and isinstance(msg.entries, FrameEntries)
    body = msg.entries.body
    assert body.readonly and isinstance(body.obj, bytearray) and len(body.obj) == len(frame) - 4
    assert all(isinstance(e, memoryview) and e.obj is body.obj for e in msg.entries)
    # The next frame is read into a buffer of its own: the views stay as they were.
    nxt = encode(_big_strided())
    assert decoder.feed(nxt) == [_big_strided()]
    assert msg == big


def test_without_allocate_announced_memory_follows_the_bytes() -> None:
    decoder = FrameDecoder(MAX, side="client")
    buf = decoder.get_buffer(-1)
    buf[:8] = struct.pack(">iI", MAX, 0)  # 1 MiB announced, 4 bytes of it sent
    buf.release()
    assert decoder.buffer_updated(8) == []
    assert 0 < len(decoder.get_buffer(-1)) <= FrameDecoder.BIG_START


@pytest.mark.parametrize("allocate_announced", [False, True], ids=["grown", "announced"])
@pytest.mark.parametrize("path", ["feed", "read_into"])
@pytest.mark.parametrize("length", [(8 << 20) + 1, (1 << 31) - 1])
def test_a_length_over_the_bound_is_refused_before_anything_of_its_size_is_allocated(
        allocate_announced: bool, path: str, length: int) -> None:
    limit = 8 << 20
    decoder = FrameDecoder(limit, side="client", allocate_announced=allocate_announced)
    data = encode(ReadResponse(EOK, 3, 5, SMALL)) + struct.pack(">iI", length, 0)
    tracemalloc.start()
    try:
        with pytest.raises(FramingError, match=rf"^frame length {length} outside 0\.\.{limit} \(max frame size\): "
                                               r"stream out of sync$"):
            if path == "feed":
                decoder.feed(data)
            else:
                _read_into(decoder, data, len(data))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"{peak} bytes allocated for a refused frame"  # the 64 KiB scratch, not 8 MiB
    assert len(decoder.get_buffer(-1)) <= FrameDecoder.SCRATCH
    with pytest.raises(FramingError, match="outside"):  # and it sticks
        decoder.feed(b"\x00")


@pytest.mark.parametrize("allocate_announced", [False, True], ids=["grown", "announced"])
def test_a_frame_of_exactly_the_bound_is_accepted(allocate_announced: bool) -> None:
    msg = ReadResponse(EOK, 1, 2, b"e" * (FrameDecoder.BIG_FRAME + 100))
    limit = len(encode(msg)) - 4
    assert FrameDecoder(limit, side="client", allocate_announced=allocate_announced).feed(encode(msg)) == [msg]
    with pytest.raises(FramingError, match=rf"outside 0\.\.{limit - 1} \(max frame size\)"):
        FrameDecoder(limit - 1, side="client", allocate_announced=allocate_announced).feed(encode(msg))
