"""The record transitions of named-ledger operations (``named_record.py``), pure: acquisition,
writer close, ensemble change, shrink, cursors, publish / overwrite, and their invariants."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vellum.client import named, named_record
from vellum.client.named_record import (
    CUSTOM_EPOCH_KEY,
    CUSTOM_NAME_KEY,
    MAX_CURSOR_BYTES,
    NamedLedgerRecord,
    PositionCursor,
    Segment,
    append_segments,
    first_published,
    resolve_quorum,
)
from vellum.errors import IncorrectParameterError, UnauthorizedAccessError
from vellum.format.entry import DigestType
from vellum.ids import BookieId
from vellum.meta.model import LedgerMetadata, LedgerState

ENSEMBLES = {0: ("a:1", "b:1", "c:1"), 5: ("a:1", "d:1", "c:1")}


def _open(ledger_id: int, first: int, epoch: int) -> Segment:
    return Segment(ledger_id, first, None, 0, epoch, 3, 2, 2, ENSEMBLES)


def _record(segments: tuple[Segment, ...], **kw: object) -> NamedLedgerRecord:
    base: dict[str, object] = dict(
        name="t/ns/log", digest_type=DigestType.CRC32C, password=b"pw", ensemble_size=3, write_quorum_size=2,
        ack_quorum_size=2, segments=segments, writer_epoch=2, writer="h:1", cursors={"c": b"1"},
    )
    base.update(kw)
    return NamedLedgerRecord(**base)  # type: ignore[arg-type]


#: closed 0..9 (ledger 7), open from 10 (ledger 9, epoch 2)
REC = _record((Segment(7, 0, 9, 100, 1), _open(9, 10, 2)))


def _closed_md(last_entry_id: int, length: int, *, password: bytes = b"pw",
               digest: DigestType = DigestType.CRC32C) -> LedgerMetadata:
    return LedgerMetadata(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1, ensembles={0: (BookieId("a:1"),)},
                          digest_type=digest, password=password, state=LedgerState.CLOSED,
                          last_entry_id=last_entry_id, length=length)


def test_the_api_module_re_exports_the_record() -> None:
    for name in ("NamedLedgerRecord", "Segment", "NamedLedgerEntry", "NamedLedgerInfo", "serialize_record",
                 "deserialize_record", "validate_name", "record_key", "KEY_PREFIX"):
        assert getattr(named, name) is getattr(named_record, name)


def test_held_by_only_the_session_of_the_open_last_segment() -> None:
    mine = REC.segments[-1]
    assert REC.held_by(mine)
    assert not REC.replace(writer_epoch=3).held_by(mine)  # another writer acquired it
    assert not REC.held_by(_open(11, 10, 2))  # not its segment
    closed = REC.replace(segments=(REC.segments[0], mine.closed(4, 50)))
    assert not closed.held_by(mine)
    assert not REC.replace(segments=()).held_by(mine)


def test_check_password() -> None:
    REC.check_password(b"pw")
    with pytest.raises(UnauthorizedAccessError):
        REC.check_password(b"other")


def test_probe_metadata_comes_from_the_record_alone() -> None:
    md = REC.probe_metadata(REC.segments[-1])
    assert (md.ensemble_size, md.write_quorum_size, md.ack_quorum_size) == (3, 2, 2)
    assert md.ensembles == {k: tuple(BookieId(b) for b in v) for k, v in ENSEMBLES.items()}
    assert md.state is LedgerState.OPEN and md.password == b"pw" and md.digest_type == DigestType.CRC32C


def test_segment_ledger_metadata_is_stamped_with_name_and_epoch() -> None:
    md = REC.segment_ledger_metadata((2, 2, 1), ["x:1", "y:1"], 3, ctime_ms=5, creator_token=6)
    assert md.ensembles == {0: (BookieId("x:1"), BookieId("y:1"))}
    assert (md.ensemble_size, md.write_quorum_size, md.ack_quorum_size) == (2, 2, 1)
    assert md.custom_metadata == {CUSTOM_NAME_KEY: b"t/ns/log", CUSTOM_EPOCH_KEY: b"3"}
    assert (md.ctime_ms, md.creator_token, md.state) == (5, 6, LedgerState.OPEN)


def test_sealed_closes_the_open_segment_at_its_recovered_end() -> None:
    segments, nxt = REC.sealed((4, 50))
    assert segments == (REC.segments[0], Segment(9, 10, 14, 50, 2))
    assert nxt == 15
    # an empty session leaves no segment behind; the next one starts where it would have
    segments, nxt = REC.sealed((-1, 0))
    assert segments == (REC.segments[0],) and nxt == 10
    # no open segment: nothing to seal
    closed = REC.replace(segments=(REC.segments[0],))
    assert closed.sealed(None) == ((REC.segments[0],), 10)
    # never below the start (everything shrunk away)
    assert closed.replace(start_entry_id=10, segments=()).sealed(None) == ((), 10)
    with pytest.raises(ValueError):
        REC.sealed(None)
    with pytest.raises(ValueError):
        closed.sealed((1, 1))


def test_acquired_places_the_new_segment_and_bumps_the_epoch() -> None:
    new = _open(12, 0, 0)
    updated = REC.acquired((4, 50), new, "other:2")
    assert updated.writer_epoch == 3 and updated.writer == "other:2"
    assert updated.segments[:2] == (REC.segments[0], Segment(9, 10, 14, 50, 2))
    assert updated.segments[2] == Segment(12, 15, None, 0, 3, 3, 2, 2, ENSEMBLES)
    assert updated.held_by(updated.segments[2]) and not updated.held_by(REC.segments[-1])
    assert updated.cursors == REC.cursors and updated.start_entry_id == REC.start_entry_id


def test_ensemble_change_and_writer_close() -> None:
    changed = REC.with_open_ensembles({0: ("a:1", "b:1", "c:1"), 7: ("e:1", "b:1", "c:1")})
    assert changed.segments[-1].ensembles[7] == ("e:1", "b:1", "c:1")
    assert changed.segments[:-1] == REC.segments[:-1] and changed.held_by(changed.segments[-1])
    mine = REC.segments[-1]
    assert REC.with_writer_closed(mine.closed(2, 30)).segments == (REC.segments[0], Segment(9, 10, 12, 30, 2))
    assert REC.with_writer_closed(mine.closed(-1, 0)).segments == (REC.segments[0],)  # empty: dropped


def test_cursors() -> None:
    rec = REC.with_cursors({"d": b"2", "c": None})
    assert rec.cursors == {"d": b"2"} and REC.cursors == {"c": b"1"}
    assert REC.with_cursors({"big": b"x" * MAX_CURSOR_BYTES}).cursors["big"] == b"x" * MAX_CURSOR_BYTES
    for bad in ({"": b"1"}, {"k": b"x" * (MAX_CURSOR_BYTES + 1)}):
        with pytest.raises(IncorrectParameterError):
            REC.with_cursors(bad)


def test_shrunk() -> None:
    assert REC.shrunk(0, 20, force=False) == (REC, ())  # at the start: nothing changes
    rec, dropped = REC.shrunk(5, 20, force=False)
    assert (rec.start_entry_id, rec.segments, rec.trimmed_to, dropped) == (5, REC.segments, 0, ())
    with pytest.raises(IncorrectParameterError, match=r"its start is already 5.*backwards"):
        rec.shrunk(3, 20, force=False)  # never backwards: an error, not silently ignored
    with pytest.raises(IncorrectParameterError, match="backwards"):
        rec.shrunk(3, 20, force=True)
    assert rec.shrunk(5, 20, force=False) == (rec, ())  # the same point again: nothing changes
    rec, dropped = REC.shrunk(12, 20, force=True)  # whole closed segments below go, the open one stays
    assert rec.start_entry_id == 12 and rec.trimmed_to == 12
    assert rec.segments == REC.segments[1:] and dropped == REC.segments[:1]
    rec, dropped = REC.shrunk(9, 20, force=True)  # entry 9 still needs ledger 7
    assert rec.segments == REC.segments and dropped == () and rec.trimmed_to == 9
    assert REC.shrunk(21, 20, force=False)[0].start_entry_id == 21  # up to the last entry + 1
    with pytest.raises(IncorrectParameterError, match="the last entry is 20"):
        REC.shrunk(22, 20, force=False)


def test_position_cursor_round_trip_and_opaque_cursors() -> None:
    pos = PositionCursor(120, True, {"queryId": "q1", "batchId": 7})
    assert PositionCursor.decode(pos.encode()) == pos
    assert PositionCursor.decode(PositionCursor(5).encode()) == PositionCursor(5, False, {})
    # anything else is an opaque marker: never taken for a position
    for other in (b"21", b"batch-7", b"", None, b"{", b"[1]", b'{"nextEntryId": "7"}', b'{"nextEntryId": -1}',
                  b'{"nextEntryId": true}', b'{"nextEntryId": 3, "retain": "yes"}'):
        assert PositionCursor.decode(other) is None, other


def test_a_retaining_cursor_stops_a_shrink_past_it_others_hold_nothing_back() -> None:
    rec = REC.with_cursors({"free": PositionCursor(3).encode(), "opaque": b"1",
                            "reader": PositionCursor(8, retain=True).encode()})
    assert rec.shrunk(8, 20, force=False)[0].start_entry_id == 8  # up to the retaining cursor: fine
    for force in (False, True):
        with pytest.raises(IncorrectParameterError, match=r"cannot shrink to 9: cursor 'reader' retains the "
                                                          r"entries from 8 on.*at most 8.*remove the cursor"):
            rec.shrunk(9, 20, force=force)
    # the same start again moves nothing: allowed even with a retaining cursor below it
    behind = REC.replace(start_entry_id=10).with_cursors({"reader": PositionCursor(4, retain=True).encode()})
    assert behind.shrunk(10, 20, force=True)[0].start_entry_id == 10
    # without retain the cursor holds nothing back
    assert REC.with_cursors({"reader": PositionCursor(8).encode()}).shrunk(15, 20, force=False)[0].start_entry_id == 15


def test_published_appends_after_the_sealed_open_segment() -> None:
    mds = [_closed_md(4, 40), _closed_md(-1, 0), _closed_md(1, 5)]
    rec, replaced = REC.published((2, 30), [20, 21, 22], mds, {"c": b"9"}, overwrite=False)
    assert replaced == ()
    assert rec.segments == (REC.segments[0], Segment(9, 10, 12, 30, 2), Segment(20, 13, 17, 40, 3),
                            Segment(22, 18, 19, 5, 3))  # the empty ledger adds nothing
    assert rec.writer_epoch == 3 and rec.cursors == {"c": b"9"} and rec.start_entry_id == 0
    closed = REC.replace(segments=REC.segments[:1])
    rec, _ = closed.published(None, [20], mds[:1], {}, overwrite=False)
    assert rec.writer_epoch == 2 and rec.segments[-1] == Segment(20, 10, 14, 40, 2)  # no session ended


def test_overwrite_replaces_every_segment_and_never_reuses_ids() -> None:
    rec, replaced = REC.published((2, 30), [20], [_closed_md(4, 40)], {}, overwrite=True)
    assert replaced == (REC.segments[0], Segment(9, 10, 12, 30, 2))
    assert rec.segments == (Segment(20, 13, 17, 40, 3),)
    assert rec.start_entry_id == 13 and rec.trimmed_to == 13


def test_what_may_be_published() -> None:
    md = _closed_md(1, 1)
    with pytest.raises(IncorrectParameterError, match="repeated"):
        REC.published((2, 30), [20, 20], [md, md], {}, overwrite=False)
    with pytest.raises(IncorrectParameterError, match="already a segment"):
        REC.published((2, 30), [7], [md], {}, overwrite=False)
    for other in (_closed_md(1, 1, password=b"x"), _closed_md(1, 1, digest=DigestType.CRC32)):
        with pytest.raises(IncorrectParameterError, match="digest type and password"):
            REC.published((2, 30), [20], [other], {}, overwrite=False)


def test_first_published_takes_its_settings_from_the_first_ledger() -> None:
    md = LedgerMetadata(ensemble_size=3, write_quorum_size=3, ack_quorum_size=2,
                        ensembles={0: (BookieId("a:1"), BookieId("b:1"), BookieId("c:1"))},
                        digest_type=DigestType.CRC32, password=b"p", state=LedgerState.CLOSED, last_entry_id=2, length=9)
    rec = first_published("x/y", [5, 6], [md, _closed_md(0, 1, password=b"p", digest=DigestType.CRC32)],
                          {"k": b"v"}, ctime_ms=7)
    assert (rec.digest_type, rec.password, rec.ensemble_size, rec.write_quorum_size, rec.ack_quorum_size) == (
        DigestType.CRC32, b"p", 3, 3, 2)
    assert rec.segments == (Segment(5, 0, 2, 9, 0), Segment(6, 3, 3, 1, 0))
    assert rec.writer_epoch == 0 and rec.cursors == {"k": b"v"} and rec.ctime_ms == 7 and rec.open_segment is None
    with pytest.raises(IncorrectParameterError, match="at least one ledger"):
        first_published("x/y", [], [], {}, ctime_ms=7)


def test_append_segments_and_resolve_quorum() -> None:
    assert append_segments((), 5, [1, 2], [_closed_md(0, 3), _closed_md(2, 4)], 1) == (
        Segment(1, 5, 5, 3, 1), Segment(2, 6, 8, 4, 1))
    assert resolve_quorum((None, None, None), (3, 2, 2)) == (3, 2, 2)
    assert resolve_quorum((5, None, 1), (3, 2, 2)) == (5, 2, 1)
    for bad in ((2, 3, None), (None, None, 3), (1, 1, 0)):
        with pytest.raises(IncorrectParameterError, match="ensembleSize >= writeQuorumSize"):
            resolve_quorum(bad, (3, 2, 2))


# ------------------------------------------------------------------ invariants, any record


@st.composite
def records(draw: st.DrawFn) -> NamedLedgerRecord:
    """Contiguous closed segments, maybe an open last one, a start anywhere up to the end."""
    first = draw(st.integers(0, 50))
    segments: list[Segment] = []
    nxt = first
    for i in range(draw(st.integers(0, 4))):
        count = draw(st.integers(1, 10))
        segments.append(Segment(100 + i, nxt, nxt + count - 1, count, 1))
        nxt += count
    epoch = 2
    if draw(st.booleans()):
        segments.append(_open(200, nxt, epoch))
    start = draw(st.integers(first if segments else 0, nxt))
    return _record(tuple(segments), start_entry_id=start, writer_epoch=epoch)


def _assert_well_formed(rec: NamedLedgerRecord) -> None:
    for a, b in zip(rec.segments, rec.segments[1:]):
        assert not a.is_open and a.last_entry_id is not None and b.first_entry_id == a.last_entry_id + 1
        assert a.entry_count


@given(rec=records(), recovered_last=st.integers(-1, 8), data=st.data())
def test_transitions_keep_the_segments_contiguous(rec: NamedLedgerRecord, recovered_last: int,
                                                  data: st.DataObject) -> None:
    _assert_well_formed(rec)
    recovered = (recovered_last, recovered_last + 1) if rec.open_segment is not None else None
    segments, nxt = rec.sealed(recovered)
    assert all(not s.is_open for s in segments) and nxt >= rec.start_entry_id
    if segments:
        assert segments[-1].last_entry_id is not None and nxt >= segments[-1].last_entry_id + 1
    acquired = rec.acquired(recovered, _open(300, 0, 0), "w")
    _assert_well_formed(acquired)
    assert acquired.open_segment is not None and acquired.open_segment.first_entry_id == nxt
    published, _ = rec.published(recovered, [400], [_closed_md(2, 3)], {}, overwrite=data.draw(st.booleans()))
    _assert_well_formed(published)
    assert published.segments[-1].first_entry_id >= max(nxt, published.start_entry_id)  # ids never reused


@given(rec=records(), end=st.integers(0, 120), force=st.booleans())
def test_shrink_never_moves_the_start_back_nor_past_the_end(rec: NamedLedgerRecord, end: int, force: bool) -> None:
    last = rec.closed_end - 1 + (3 if rec.open_segment is not None else 0)
    if end > last + 1 or end < rec.start_entry_id:
        with pytest.raises(IncorrectParameterError):
            rec.shrunk(end, last, force=force)
        return
    shrunk, dropped = rec.shrunk(end, last, force=force)
    assert shrunk.start_entry_id == end
    assert shrunk.segments == rec.segments[len(dropped):]  # only whole segments, from the front
    assert all(s.last_entry_id is not None and s.last_entry_id < shrunk.start_entry_id for s in dropped)
    held = shrunk.segment_for(shrunk.start_entry_id)
    if shrunk.start_entry_id <= last:
        assert held is not None  # the entry at the start is still reachable
    _assert_well_formed(shrunk)


def _batches(n: int, *, size: int = 10, per: int = 2) -> tuple[Segment, ...]:
    """``n`` closed segments of ``per`` entries and ``size`` bytes each, as a sink publishes them."""
    return tuple(Segment(100 + i, i * per, i * per + per - 1, size, 1) for i in range(n))


def test_merged_swaps_a_run_for_its_copy_keeping_every_global_id() -> None:
    rec = _record((*_batches(5), _open(9, 10, 2)))
    out = rec.merged([101, 102, 103], 500, _closed_md(5, 30))
    assert [(s.ledger_id, s.first_entry_id, s.last_entry_id, s.level) for s in out.segments[:3]] == [
        (100, 0, 1, 0), (500, 2, 7, 1), (104, 8, 9, 0)]
    assert out.segments[3] == rec.segments[5] and out.segment_for(5) == out.segments[1]
    assert out.merged([100, 500, 104], 501, _closed_md(9, 50)).segments[0].level == 2
    from vellum.client.named_record import deserialize_record, serialize_record
    assert deserialize_record(serialize_record(out), where="t").segments == out.segments  # level kept
    bad = [([101, 103], _closed_md(3, 20), "not consecutive"), ([101, 9], _closed_md(3, 20), "not consecutive"),
           ([101], _closed_md(1, 10), "two or more"), ([101, 102], _closed_md(4, 20), "not a copy"),
           ([101, 102], _closed_md(3, 21), "not a copy"),
           ([101, 102], _closed_md(3, 20, password=b"x"), "digest type and password")]
    for ids, md, why in bad:
        with pytest.raises(IncorrectParameterError, match=why):
            rec.merged(ids, 500, md)
    with pytest.raises(IncorrectParameterError, match="already a segment"):
        rec.merged([101, 102], 104, _closed_md(3, 20))


def test_merge_windows_work_like_a_counter_and_keep_the_segment_count_logarithmic() -> None:
    """Publishing one segment per batch and merging the newest window after each: 2,000
    batches leave fewer than factor segments per level, every entry at its global id."""
    factor = 4
    rec = _record(())
    for i in range(2000):
        seg = Segment(10_000 + i, i * 2, i * 2 + 1, 10, 1)
        rec = rec.replace(segments=(*rec.segments, seg))
        windows = rec.merge_windows(factor, max_bytes=1 << 30)
        while windows:
            w = windows[0]
            entries = sum(s.entry_count or 0 for s in w)
            rec = rec.merged([s.ledger_id for s in w], 50_000 + i * 10 + w[0].level,
                             _closed_md(entries - 1, sum(s.length for s in w)))
            windows = rec.merge_windows(factor, max_bytes=1 << 30)
        assert len(rec.segments) <= (factor - 1) * 6, (i, len(rec.segments))
    assert rec.segments[0].first_entry_id == 0 and rec.segments[-1].last_entry_id == 3999
    assert all(a.last_entry_id + 1 == b.first_entry_id for a, b in zip(rec.segments, rec.segments[1:]))  # type: ignore[operator]
    assert sum(s.length for s in rec.segments) == 20_000
    # a byte cap stops the climb; segments below the start (maybe trimmed) are never copied
    capped = _record(_batches(8)).merge_windows(4, max_bytes=30)
    assert capped == []
    shrunk = _record(_batches(8), start_entry_id=3)
    assert [w[0].ledger_id for w in shrunk.merge_windows(4, max_bytes=100)] == [104, 103, 102]
