"""A multi-entry answer (BATCH_READ, READ_STRIDED) decodes to one buffer and its entries'
offsets (``FrameEntries``): the same entries as before, mixed sizes and empty answers included,
and a truncated list is a bad frame naming the entry and what was wrong."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vellum.errors import EOK
from vellum.proto import FrameDecoder, decode_body, encode
from vellum.proto.messages import BadFrame, BatchReadResponse, FrameEntries, StridedReadResponse

entries = st.lists(st.binary(max_size=300), max_size=20)


def _answers(got: list[bytes]) -> list[BatchReadResponse | StridedReadResponse]:
    return [BatchReadResponse(EOK, 5, 7, 11, tuple(got)), StridedReadResponse(11, EOK, 5, 7, tuple(got))]


@settings(max_examples=60, deadline=None)
@given(entries, st.booleans())
def test_an_answer_is_its_entries_as_offsets_into_one_buffer(got: list[bytes], big: bool) -> None:
    for msg in _answers(got):
        data = encode(msg)
        # a frame in a buffer of its own (views) and one copied out of the decoder's buffer
        out = decode_body(memoryview(data)[4:], side="client") if big else FrameDecoder(1 << 20, side="client").feed(data)[0]
        assert out == msg
        es = out.entries  # type: ignore[union-attr]
        assert isinstance(es, FrameEntries) and len(es) == len(got)
        assert [bytes(es.body[s:e]) for s, e in zip(es.starts, es.ends)] == got
        assert [bytes(x) for x in es] == got and list(map(bytes, es[1:])) == got[1:]


def test_an_empty_answer_has_no_entries() -> None:
    for msg in _answers([]):
        out = decode_body(memoryview(encode(msg))[4:], side="client")
        assert len(out.entries) == 0 and out == msg  # type: ignore[union-attr]


@pytest.mark.parametrize("msg", _answers([b"a" * 10, b"", b"b" * 40]))
@pytest.mark.parametrize(("cut", "why"), [(1, "entry 2 claims 40 bytes, 39 left"),
                                          (41, "3 trailing bytes after entry 2"),
                                          (42, "entry 2 claims 0 bytes")])
def test_a_truncated_answer_is_a_bad_frame_naming_the_entry(msg: object, cut: int, why: str) -> None:
    body = bytearray(encode(msg)[4:])  # type: ignore[arg-type]
    if why.startswith("entry 2 claims 0"):  # entry 2's length field damaged, not cut
        struct.pack_into(">i", body, len(body) - 44, -1)
        why = "entry 2 claims -1 bytes"
    else:
        del body[len(body) - cut:]
    out = FrameDecoder(1 << 20, side="client").feed(struct.pack(">i", len(body)) + bytes(body))
    assert len(out) == 1 and isinstance(out[0], BadFrame)
    name = "BATCH_READ" if isinstance(msg, BatchReadResponse) else "READ_STRIDED"
    assert out[0].reason == f"{name} response: {why}" if "claims" not in why else out[0].reason.startswith(
        f"{name} response: {why}")
