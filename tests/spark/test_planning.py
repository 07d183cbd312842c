"""Read planning without Spark: ranges split by maxEntriesPerPartition, then packed into tasks
by maxBytesPerPartition (and minPartitions), never above maxEntriesPerPartition per task."""

from __future__ import annotations

from typing import Any

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


def test_admission_and_data_loss_options() -> None:
    import pytest

    from vellum.spark.options import OptionError

    def parse(streaming: bool = True, **opts: str) -> Any:
        return parse_read_options({"metadataServiceUri": "sqlite:///x.db", "ledgers": "1", **opts}, streaming=streaming)

    o = parse(minEntriesPerTrigger="50")
    assert o.min_entries_per_trigger == 50 and o.max_trigger_delay_ms == 15 * 60_000  # Kafka's default 15m
    for raw, ms in (("2s", 2000), ("500ms", 500), ("15m", 900_000), ("1h", 3_600_000), ("250", 250)):
        assert parse(minEntriesPerTrigger="5", maxTriggerDelay=raw).max_trigger_delay_ms == ms
    with pytest.raises(OptionError, match=r"maxTriggerDelay must be a duration"):
        parse(minEntriesPerTrigger="5", maxTriggerDelay="soon")
    with pytest.raises(OptionError, match=r"give minEntriesPerTrigger too"):
        parse(maxTriggerDelay="1m")
    with pytest.raises(OptionError, match=r"minEntriesPerTrigger \(50\) is above maxEntriesPerTrigger \(10\)"):
        parse(minEntriesPerTrigger="50", maxEntriesPerTrigger="10")
    with pytest.raises(OptionError, match=r"minEntriesPerTrigger is for streaming reads only"):
        parse(streaming=False, minEntriesPerTrigger="5")
    assert parse(dataLossLocation="/tmp/x").data_loss_location == "/tmp/x"
    assert parse(dataLossLocation="file:///tmp/x").data_loss_location == "/tmp/x"
    with pytest.raises(OptionError, match=r"dataLossLocation must be an absolute"):
        parse(dataLossLocation="x")


def test_loss_rows_round_trip(tmp_path: Any) -> None:
    """Each writer makes its own whole file; the report counts a row written twice (a retried
    task) once and names the file and line of anything that is not a row."""
    import pytest

    from vellum.spark.loss import Loss, LossFileError, TaskIds, read_losses, write_losses

    gap = Loss(None, 7, 10, 19, "gap", "no bookie has them")
    shrunk = Loss("a/b", None, 30, 44, "shrunk", "the first readable entry is now 45")
    ids = TaskIds("qid", "q", 3, 1, 0, 0)
    write_losses(str(tmp_path), [gap, shrunk], ids)
    write_losses(str(tmp_path), [gap], TaskIds("qid", "q", 3, 1, 0, 1))  # the retried attempt
    assert len(list(tmp_path.iterdir())) == 2
    rows = read_losses(str(tmp_path))
    assert [(r["name"], r["ledgerId"], r["firstEntry"], r["lastEntry"], r["reason"], r["batchId"]) for r in rows] \
        == [(None, 7, 10, 19, "gap", 3), ("a/b", None, 30, 44, "shrunk", 3)]
    assert gap.describe() == "ledger 7: entries 10..19 lost (gap: no bookie has them)"
    (tmp_path / ".half-written.jsonl.tmp").write_text("{")
    assert len(read_losses(str(tmp_path))) == 2
    (tmp_path / "bad.jsonl").write_text('{"name": null}\n')
    with pytest.raises(LossFileError, match=r"bad\.jsonl:1: not a loss row"):
        read_losses(str(tmp_path))


def test_data_loss_error_pickles() -> None:
    import pickle

    from vellum.spark.catalog import DataLossError
    from vellum.spark.loss import Loss

    err = pickle.loads(pickle.dumps(DataLossError(Loss("n", None, 1, 2, "shrunk", "x"))))
    assert err.loss.first == 1 and str(err).startswith("[LEDGER_DATA_LOSS] named ledger 'n': entries 1..2 lost")


def test_loss_report_errors_name_the_problem(tmp_path: Any) -> None:
    from click.testing import CliRunner

    from vellum.cli.main import cli

    res = CliRunner().invoke(cli, ["spark", "loss-report", "--location", str(tmp_path / "nope")])
    assert res.exit_code != 0 and "no such directory" in res.output
    (tmp_path / "x.jsonl").write_text("not json\n")
    res = CliRunner().invoke(cli, ["spark", "loss-report", "--location", str(tmp_path)])
    assert res.exit_code != 0 and "x.jsonl:1: not a JSON line" in res.output
    (tmp_path / "x.jsonl").unlink()
    res = CliRunner().invoke(cli, ["spark", "loss-report", "--location", str(tmp_path), "--json"])
    assert res.exit_code == 0 and '"lostRanges": 0' in res.output
