"""``PackedEntries``: the entries of a multi-entry answer laid out as the frame carries them. Built
from single entries, joined lists and ready-made record buffers in any mix, the encoder writes
its parts as they are and the frame is byte for byte the one built from the entries one by one;
as a sequence it is those entries."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vellum.errors import EOK, IncorrectParameterError
from vellum.proto import decode_body, encode, encode_parts
from vellum.proto.messages import BatchReadResponse, PackedEntries, StridedReadResponse

# each step: how a slice of the entries is appended
steps = st.lists(st.tuples(st.sampled_from(["add", "add_all", "records", "extend"]),
                           st.lists(st.binary(max_size=120), max_size=5)), max_size=8)


def _records(entries: list[bytes]) -> bytes:
    return b"".join(struct.pack(">i", len(e)) + e for e in entries)


def build(plan: list[tuple[str, list[bytes]]]) -> tuple[PackedEntries, list[bytes]]:
    packed = PackedEntries()
    want: list[bytes] = []
    for how, entries in plan:
        if how == "add":
            for e in entries:
                packed.add(e)
        elif how == "add_all":
            packed.add_all(entries)
        elif how == "records":
            packed.add_records(memoryview(_records(entries)), len(entries), sum(map(len, entries)))
        else:
            other = PackedEntries()
            other.add_all(entries)
            packed.extend(other)
        want.extend(entries)
    return packed, want


@settings(max_examples=80, deadline=None)
@given(steps)
def test_the_frame_is_the_one_built_entry_by_entry_and_decodes_to_the_entries(
        plan: list[tuple[str, list[bytes]]]) -> None:
    packed, want = build(plan)
    assert len(packed) == len(want) and packed.entry_bytes == sum(map(len, want))
    for msg, plain in [(BatchReadResponse(EOK, 5, 7, 11, packed), BatchReadResponse(EOK, 5, 7, 11, tuple(want))),
                       (StridedReadResponse(11, EOK, 5, 7, packed), StridedReadResponse(11, EOK, 5, 7, tuple(want)))]:
        parts = encode_parts(msg)
        assert parts[1:] == packed.parts  # written as they are: no length field packed per entry
        assert encode(msg) == encode(plain)
        assert decode_body(memoryview(encode(msg))[4:], side="client") == plain
    # As a sequence: items, slices, iteration, equality.
    assert [bytes(x) for x in packed] == want and packed == want and want == packed
    if want:
        assert bytes(packed[-1]) == want[-1] and [bytes(x) for x in packed[1:3]] == want[1:3]
    packed.add(b"after-reading")  # appending after an item was handed out starts a new part
    assert [bytes(x) for x in packed] == [*want, b"after-reading"]


def test_records_that_do_not_add_up_are_refused() -> None:
    with pytest.raises(ValueError, match="cannot be 2 records of 5 entry bytes"):
        PackedEntries().add_records(_records([b"ab", b"cde"]) + b"x", 2, 5)


def test_an_error_answer_carries_no_entries() -> None:
    packed = PackedEntries()
    packed.add(b"x" * 40)
    with pytest.raises(IncorrectParameterError, match="entries are only sent with EOK"):
        encode(BatchReadResponse(1, 5, 7, 11, packed))
    assert encode(BatchReadResponse(1, 5, 7, 11, PackedEntries())) == encode(BatchReadResponse(1, 5, 7, 11))
