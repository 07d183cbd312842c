"""Read planning without Spark: ranges split by maxEntriesPerPartition, then packed into tasks
by maxBytesPerPartition (and minPartitions), never above maxEntriesPerPartition per task."""

from __future__ import annotations

from vellum.spark.catalog import Span
from vellum.spark.options import parse_read_options
from vellum.spark.reader import ReadPartition, plan_partitions


class _Segments:
    """A catalog whose keys are names made of equal segments (one ledger per segment)."""

    def __init__(self, segments: dict[str, list[int]]) -> None:
        self._segments = segments

    def spans(self, key: str, first: int, end: int) -> list[Span]:
        out, base = [], 0
        for i, n in enumerate(self._segments[key]):
            lo, hi = max(first, base), min(end - 1, base + n - 1)
            if lo <= hi:
                out.append(Span(1000 * (ord(key[0]) - 96) + i, base, lo, hi, b""))
            base += n
        return out


def _plan(opts: dict[str, str], segments: dict[str, list[int]], avg: dict[str, int]) -> list[ReadPartition]:
    ro = parse_read_options({"metadataServiceUri": "sqlite:///x.db", "names": ",".join(segments), **opts},
                            streaming=False)
    ranges = {k: (0, sum(v)) for k, v in segments.items()}
    return plan_partitions(ro, _Segments(segments), ranges, avg)  # type: ignore[arg-type]


def _shape(parts: list[ReadPartition]) -> list[list[tuple[int, int, int]]]:
    return [[(r.ledger_id, r.first, r.last) for r in p.ranges] for p in parts]


def test_small_segments_share_tasks_by_bytes() -> None:
    # 4 segments of 400 entries of 128 KiB (~50 MiB each): 200 MiB -> 2 tasks of 2 segments
    parts = _plan({}, {"a": [400] * 4}, {"a": 128 << 10})
    assert _shape(parts) == [[(1000, 0, 399), (1001, 400, 799)], [(1002, 800, 1199), (1003, 1200, 1599)]]
    # every entry exactly once, in order
    flat = [(r.first, r.last) for p in parts for r in p.ranges]
    assert flat == [(0, 399), (400, 799), (800, 1199), (1200, 1599)]


def test_limits_still_apply() -> None:
    # maxEntriesPerPartition caps a task even when bytes would allow more
    parts = _plan({"maxEntriesPerPartition": "500"}, {"a": [400] * 4}, {"a": 10})
    assert all(sum(r.last - r.first + 1 for r in p.ranges) <= 500 for p in parts)
    assert len(parts) == 4
    # minPartitions asks for parallelism: at least that many tasks
    parts = _plan({"minPartitions": "4"}, {"a": [400] * 4}, {"a": 10})
    assert len(parts) >= 4
    # maxBytesPerPartition splits big keys; keys never mix inside a range
    parts = _plan({"maxBytesPerPartition": str(1 << 20)}, {"a": [100], "b": [100]}, {"a": 20_000, "b": 20_000})
    assert len(parts) == 4
    assert all(len({r.key for r in p.ranges}) == 1 for p in parts)
