"""A stream's lag and its cursor: each micro-batch reports per name the entries (and estimated
bytes) it ends behind the readable end, in the query's progress; with ``cursorName`` the
committed position is stored as a position cursor in the name's record (only after Spark
committed the batch), and with ``cursorRetain`` a shrink refuses to pass it."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from vellum.client.named import NamedLedgers, PositionCursor
from vellum.errors import IncorrectParameterError
from vellum.spark.names import _call
from vellum.testing.local_cluster import LocalCluster


def _fill(bk: Any, name: str, count: int, size: int = 100) -> None:
    """``count`` more entries of ``size`` bytes, in a writer session closed afterwards."""
    import asyncio

    async def go() -> None:
        h = await NamedLedgers(bk.aio).open(name, "create_or_append")
        await asyncio.gather(*[h.append_async(b"x" * size) for _ in range(count)])
        await h.close()

    _call(bk, go())


def _wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _cursor(bk: Any, name: str, key: str) -> PositionCursor | None:
    rec = _call(bk, NamedLedgers(bk.aio).record(name)).value
    return PositionCursor.decode(rec.cursors.get(key))


def test_progress_reports_lag_per_name(spark: Any, cluster: LocalCluster, bk: Any, tmp_path: Path) -> None:
    name = "tests/lag/progress"
    _fill(bk, name, 100)
    q = (spark.readStream.format("vellum").option("metadataServiceUri", cluster.metadata_uri).option("name", name)
         .option("startingOffsets", "earliest").option("maxEntriesPerTrigger", 30).load()
         .writeStream.foreachBatch(lambda df, _b: df.count()).option("checkpointLocation", str(tmp_path / "cp"))
         .trigger(availableNow=True).start())
    assert q.awaitTermination(120) and q.exception() is None
    reports = []
    for p in q.recentProgress:
        src = p["sources"][0]
        if p["numInputRows"]:
            reports.append((json.loads(src["endOffset"])[name], json.loads(src["latestOffset"])[name]))
    assert [end for end, _r in reports] == [30, 60, 90, 100]
    for end, r in reports:
        assert r["latest"] == 100 and r["entriesBehind"] == 100 - end
        assert r["bytesBehind"] == r["entriesBehind"] * 100  # 100-byte entries


def test_cursor_follows_committed_batches_and_retains_only_when_asked(
        spark: Any, cluster: LocalCluster, bk: Any, tmp_path: Path) -> None:
    name = "tests/lag/cursor"
    _fill(bk, name, 50)
    named = NamedLedgers(bk.aio)
    batches: list[int] = []

    def collect(df: Any, _batch_id: int) -> None:
        n = df.count()
        if n:
            batches.append(n)

    def start(retain: bool, cp: str) -> Any:
        return (spark.readStream.format("vellum").option("metadataServiceUri", cluster.metadata_uri)
                .option("name", name).option("startingOffsets", "earliest").option("maxEntriesPerTrigger", 20)
                .option("cursorName", "reader").option("cursorRetain", str(retain).lower())
                .option("lacPollIntervalMs", 100).load()
                .writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp_path / cp))
                .trigger(processingTime="300 milliseconds").start())

    q = start(True, "cp1")
    try:
        _wait_until(lambda: sum(batches) >= 50, "the 50 entries to be read")
        # written at commit only, after the batch: a position never past what the query read
        _wait_until(lambda: (c := _cursor(bk, name, "reader")) is not None and c.next_entry_id == 50,
                    "the cursor to reach the end")
        cur = _cursor(bk, name, "reader")
        assert cur is not None and cur.retain
        # a shrink past the retaining cursor is refused, naming it; up to it is fine
        _fill(bk, name, 10)  # entries 50..59, not read yet... until the query reads them
        with pytest.raises(IncorrectParameterError, match=r"cursor 'reader' retains the entries from"):
            _call(bk, named.shrink(name, 60))
        assert _call(bk, named.shrink(name, 50)).start_entry_id == 50
        _wait_until(lambda: (c := _cursor(bk, name, "reader")) is not None and c.next_entry_id == 60,
                    "the cursor to follow the new entries")
    finally:
        q.stop()
    assert q.exception() is None
    # the same query without retain: the cursor holds nothing back
    q = start(False, "cp1")
    try:
        _fill(bk, name, 5)
        _wait_until(lambda: (c := _cursor(bk, name, "reader")) is not None and not c.retain
                    and c.next_entry_id == 65, "the cursor stored without retain")
        _fill(bk, name, 5)  # 65..69: not read when the shrink passes them? the shrink is not refused
        assert _call(bk, named.shrink(name, 70)).start_entry_id == 70
    finally:
        q.stop()


def test_cursor_options_are_validated() -> None:
    from vellum.spark.options import OptionError, parse_read_options

    base = {"metadataServiceUri": "sqlite:///nowhere.db"}
    opts = parse_read_options({**base, "name": "t/a", "cursorName": "r", "cursorRetain": "true"}, streaming=True)
    assert (opts.cursor_name, opts.cursor_retain) == ("r", True)
    with pytest.raises(OptionError, match=r"cursorName is for streaming reads of named ledgers"):
        parse_read_options({**base, "ledgers": "1", "cursorName": "r"}, streaming=True)
    with pytest.raises(OptionError, match=r"cursorName is for streaming reads of named ledgers"):
        parse_read_options({**base, "name": "t/a", "cursorName": "r"}, streaming=False)
    with pytest.raises(OptionError, match=r"cursorRetain applies to the cursor of option cursorName"):
        parse_read_options({**base, "name": "t/a", "cursorRetain": "true"}, streaming=True)
