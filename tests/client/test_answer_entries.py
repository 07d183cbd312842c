"""``answer_entries`` (client/replica_read.py) gives the entries a multi-entry answer holds, as
iterating it would, cut to a count: for a decoded frame (``FrameEntries``: views of its one
buffer, made without its Python iterator) and for any other sequence alike."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from vellum.client.replica_read import answer_entries
from vellum.errors import EOK
from vellum.proto import FrameDecoder, decode_body, encode
from vellum.proto.messages import BatchReadResponse, FrameEntries, StridedReadResponse


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(max_size=200), max_size=12), st.integers(0, 14), st.booleans(), st.booleans())
def test_the_entries_of_an_answer_as_iterating_it_gives_them(got: list[bytes], count: int, big: bool,
                                                              strided: bool) -> None:
    msg = StridedReadResponse(11, EOK, 5, 7, tuple(got)) if strided else BatchReadResponse(EOK, 5, 7, 11, tuple(got))
    data = encode(msg)
    out = decode_body(memoryview(data)[4:], side="client") if big else FrameDecoder(1 << 20, side="client").feed(data)[0]
    raws = out.entries  # type: ignore[union-attr]
    assert isinstance(raws, FrameEntries)
    for n, want in ((None, got), (count, got[:count])):
        views = answer_entries(raws, n)
        assert [bytes(v) for v in views] == want
        assert [bytes(v) for v in views] == [bytes(v) for v in (raws if n is None else raws[:n])]
        assert all(type(v) is type(w) for v, w in zip(views, raws, strict=False))  # views of its buffer, as its items
    # any other sequence: as it is, or cut
    assert answer_entries(got) is got
    assert answer_entries(got, count) == got[:count]
