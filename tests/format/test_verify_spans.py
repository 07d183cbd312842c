"""``DigestManager.verify_spans``: entries checked where they lie in one buffer (a bulk read's
answer) give the payloads and LAC that ``verify`` gives each of them, and the first entry that
fails (wrong ledger id, wrong entry id, digest, too short) raises ``verify``'s own error, also
when the bytes after it in the buffer belong to the next entry."""

from __future__ import annotations

from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vellum.errors import DigestMismatchError
from vellum.format.entry import DigestManager, DigestType, PayloadSpans


def _frame(stored: list[bytes]) -> PayloadSpans:
    """The entries as an answer carries them: ``[int len][entry]`` after a 32-byte fixed part."""
    body = bytearray(32)
    starts, ends = array("q"), array("q")
    for s in stored:
        body += len(s).to_bytes(4, "big")
        starts.append(len(body))
        body += s
        ends.append(len(body))
    return PayloadSpans.in_one(memoryview(bytes(body)), starts, ends)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(max_size=200), max_size=12), st.sampled_from(list(DigestType)), st.integers(1, 4))
def test_spans_verify_as_verify_does_each(payloads: list[bytes], digest_type: DigestType, stride: int) -> None:
    dm = DigestManager(9, digest_type, b"pw")
    stored = [dm.compute(5 + stride * i, (i * 37) % 11 - 1, 100 + i, p) for i, p in enumerate(payloads)]
    got, lac = dm.verify_spans(_frame(stored), 5, stride)
    alone = [dm.verify(s, 5 + stride * i) for i, s in enumerate(stored)]
    assert [bytes(p) for p in got] == [e.payload for e in alone] == payloads
    assert lac == max((e.lac for e in alone), default=-1)
    assert got.buffers == _frame(stored).buffers or not stored  # the same buffer: no copies


@pytest.mark.parametrize("digest_type", [DigestType.CRC32C, DigestType.CRC32, DigestType.HMAC])
@pytest.mark.parametrize("what", ["ledger id", "entry id", "payload byte", "short"])
def test_a_bad_entry_in_the_middle_raises_what_verify_raises(digest_type: DigestType, what: str) -> None:
    dm = DigestManager(9, digest_type, b"pw")
    stored = [dm.compute(i, i - 1, 10 * i, bytes([i]) * (3 + 50 * (i % 3))) for i in range(7)]
    bad = stored[3]
    if what == "ledger id":
        bad = DigestManager(8, digest_type, b"pw").compute(3, 2, 30, bytes([3]) * 3)
    elif what == "entry id":
        bad = dm.compute(4, 2, 30, bytes([3]) * 3)
    elif what == "payload byte":
        flipped = bytearray(bad)
        flipped[-1] ^= 0x10
        bad = bytes(flipped)
    else:
        bad = bad[:30]  # shorter than the header: the next entry's bytes follow it in the buffer
    with pytest.raises(DigestMismatchError) as alone:
        dm.verify(bad, 3)
    with pytest.raises(DigestMismatchError) as spans:
        dm.verify_spans(_frame([*stored[:3], bad, *stored[4:]]), 0)
    assert str(spans.value) == str(alone.value)


def test_spans_interleave_and_concat_keep_order() -> None:
    a, b = _frame([b"a0", b"a1", b"a2"]), PayloadSpans.of([b"b0", b"b1"])
    assert list(map(bytes, PayloadSpans.concat([a, b]))) == [b"a0", b"a1", b"a2", b"b0", b"b1"]
    mixed = PayloadSpans.interleave(5, [(0, 2, a), (1, 2, b)])
    assert list(map(bytes, mixed)) == [b"a0", b"b0", b"a1", b"b1", b"a2"]
    with pytest.raises(ValueError, match="4 items given for 5 positions"):
        PayloadSpans.interleave(5, [(0, 2, a[:2]), (1, 2, b)])


@pytest.mark.parametrize("bad_at", [None, 1, 4])
def test_spans_of_several_answers_verify_as_each(bad_at: int | None) -> None:
    """Spans over several buffers (answers joined, or entries handed one by one) are checked
    entry by entry in their own buffer: the same payloads, and a bad entry in any of them
    raises what ``verify`` raises for it."""
    dm = DigestManager(9, DigestType.CRC32C)
    stored = [dm.compute(i, i - 1, 10 * i, bytes([i]) * (1 + 40 * (i % 3))) for i in range(6)]
    if bad_at is not None:
        flipped = bytearray(stored[bad_at])
        flipped[-1] ^= 0x01
        stored[bad_at] = bytes(flipped)
    spans = PayloadSpans.concat([_frame(stored[:2]), PayloadSpans.of(stored[2:4]), _frame(stored[4:])])
    assert len(spans.buffers) == 4
    if bad_at is None:
        got, lac = dm.verify_spans(spans, 0)
        assert [bytes(p) for p in got] == [dm.verify(s).payload for s in stored] and lac == 4
        return
    with pytest.raises(DigestMismatchError) as alone:
        dm.verify(stored[bad_at], bad_at)
    with pytest.raises(DigestMismatchError) as spanned:
        dm.verify_spans(spans, 0)
    assert str(spanned.value) == str(alone.value)
