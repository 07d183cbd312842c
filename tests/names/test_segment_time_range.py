"""The append-time range a closed segment keeps in the name record (docs/formats.md "Segment time
range"): set where segments are published, joined by a merge, kept through serialization, absent
in older records (read as unknown), and dropped nowhere it is known."""

from __future__ import annotations

import json

import pytest

from vellum.client.named_record import (
    NamedLedgerRecord,
    Segment,
    append_segments,
    deserialize_record,
    first_published,
    joined_time_range,
    serialize_record,
)
from vellum.errors import IncorrectParameterError, MetaStoreError
from vellum.format.entry import DigestType
from vellum.ids import BookieId
from vellum.meta.model import LedgerMetadata, LedgerState


def _md(last_entry_id: int, length: int) -> LedgerMetadata:
    return LedgerMetadata(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1, ensembles={0: (BookieId("a:1"),)},
                          digest_type=DigestType.CRC32C, password=b"pw", state=LedgerState.CLOSED,
                          last_entry_id=last_entry_id, length=length)


def _record(segments: tuple[Segment, ...]) -> NamedLedgerRecord:
    return NamedLedgerRecord(name="t/ns/log", digest_type=DigestType.CRC32C, password=b"pw", ensemble_size=1,
                             write_quorum_size=1, ack_quorum_size=1, segments=segments, writer_epoch=0)


def test_published_segments_keep_their_ranges_and_serialize_them() -> None:
    rec = first_published("t/ns/log", [11, 12], [_md(4, 50), _md(2, 30)], {}, ctime_ms=1,
                          time_ranges={11: (1000, 1500)})
    assert [s.time_range for s in rec.segments] == [(1000, 1500), None]
    back = deserialize_record(serialize_record(rec), where="t")
    assert back.segments == rec.segments
    body = json.loads(serialize_record(rec).split(b"\n", 1)[1])
    assert body["segments"][0]["appendTimeMs"] == [1000, 1500] and "appendTimeMs" not in body["segments"][1]
    updated, _ = rec.published(None, [13], [_md(0, 5)], {}, overwrite=False, time_ranges={13: (7, 7)})
    assert [s.time_range for s in updated.segments] == [(1000, 1500), None, (7, 7)]


def test_an_older_record_without_ranges_reads_as_unknown_and_a_bad_range_is_refused() -> None:
    rec = _record(append_segments((), 0, [11], [_md(4, 50)], 0))
    raw = serialize_record(rec)
    assert b"appendTimeMs" not in raw
    assert deserialize_record(raw, where="t").segments[0].time_range is None
    broken = raw.replace(b'"length":50', b'"length":50,"appendTimeMs":[9,3]')
    with pytest.raises(MetaStoreError, match="appendTimeMs"):
        deserialize_record(broken, where="t")
    with pytest.raises(IncorrectParameterError, match="append-time range"):
        append_segments((), 0, [11], [_md(4, 50)], 0, {11: (5, 1)})


def test_a_merge_joins_the_ranges_only_when_all_are_known() -> None:
    segs = (Segment(1, 0, 1, 10, 0, time_range=(100, 200)), Segment(2, 2, 3, 10, 0, time_range=(50, 300)),
            Segment(3, 4, 5, 10, 0), Segment(4, 6, 7, 10, 0, time_range=(400, 500)))
    rec = _record(segs)
    assert rec.merged([1, 2], 9, _md(3, 20)).segments[0].time_range == (50, 300)
    assert rec.merged([2, 3, 4], 9, _md(5, 30)).segments[1].time_range is None
    assert joined_time_range(segs[:2]) == (50, 300) and joined_time_range(()) is None
