"""A streaming sink that can run for a year, on real bookies: 2,000 micro-batch commits of the
sink's own code, and a stream through real Spark (60 micro-batches by default, merges at two levels: ~1 s each on
a loaded 2-core machine), each batch one new segment, leave a bounded number of segments and
ledgers, a name record of bounded size and few sink keys, because small segments are merged
(copies swapped in by CAS) and what they replaced is retired; every row is still there exactly
once, at the same entry ids, also for a stream reading the name meanwhile."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from vellum.client.named import NamedLedgers, serialize_record
from vellum.spark.names import _call
from vellum.testing.local_cluster import LocalCluster

#: micro-batches of the test through Spark (~1 s each on a loaded 2-core machine: the 2,000-batch
#: run is the commit-level test below; VELLUM_SINK_BATCHES=2000 runs it through Spark too)
BATCHES = int(os.environ.get("VELLUM_SINK_BATCHES", "60"))


def _sink_keys(bk: Any) -> set[str]:
    kv = bk.aio.store.kv
    return set(kv.list("spark/staging/")) | set(kv.list("spark/finished/"))


def _sizes(bk: Any, name: str, ledgers_before: int = 0, keys_before: frozenset[str] = frozenset()
           ) -> tuple[int, int, int, int]:
    """(segments, record bytes, ledgers in the store added since, keys under spark/ added since:
    the session's cluster keeps what earlier tests' sinks left)."""
    rec = _call(bk, NamedLedgers(bk.aio).record(name)).value
    return (len(rec.segments), len(serialize_record(rec)), len(bk.list_ledgers()) - ledgers_before,
            len(_sink_keys(bk) - keys_before))


@pytest.mark.timeout(1200)
def test_two_thousand_commits_stay_bounded(cluster: LocalCluster, bk: Any) -> None:
    """2,000 micro-batch commits of the streaming sink (its own code: a staging ledger written by
    ``write_task``, ``VellumStreamWriter.commit``), on real bookies: segments, the record, the
    ledgers and the sink's keys level off; every row is there once, in order; a replayed batch
    is still skipped."""
    import pyarrow as pa

    from vellum.spark.options import parse_write_options
    from vellum.spark.writer import VellumStreamWriter, write_task

    name = "tests/sink/commits"
    opts = parse_write_options({"metadataServiceUri": cluster.metadata_uri, "name": name, "entryMaxRows": "1",
                                "ensembleSize": "2", "writeQuorumSize": "2", "ackQuorumSize": "2",
                                "segmentMergeFactor": "4", "segmentRetireDelay": "300ms"})
    writer = VellumStreamWriter(opts, overwrite=False)
    ledgers_before = len(bk.list_ledgers())
    keys_before = frozenset(_sink_keys(bk))
    seen: list[tuple[int, tuple[int, int, int, int]]] = []
    started = time.monotonic()
    for batch_id in range(2000):
        assert time.monotonic() - started < 1100, f"only {batch_id} commits in 1100 s"
        rows = pa.RecordBatch.from_pydict({"payload": pa.array([b"%d" % batch_id], pa.binary())})
        job = f"s-q1.{batch_id}.{writer.run_token}"
        msg = write_task(opts, job, iter([rows]), "q1", batch_id)
        writer.commit([msg], batch_id)
        if batch_id % 200 == 199:
            seen.append((batch_id + 1, _sizes(bk, name, ledgers_before, keys_before)))
    # a replay of the last batch (Spark re-runs it after a crash before its commit log): skipped
    msg = write_task(opts, "s-q1.1999.again", iter([rows]), "q1", 1999)
    writer.commit([msg], 1999)
    time.sleep(0.5)
    writer.commit([write_task(opts, f"s-q1.2000.{writer.run_token}", iter([]), "q1", 2000)], 2000)  # retires
    seen.append((2000, _sizes(bk, name, ledgers_before, keys_before)))
    print("commits -> (segments, record bytes, ledgers, spark keys):", seen)
    # Without merging and retiring each would grow by one per commit (2,000 segments, ledgers,
    # finished markers); here they stay flat from the first samples on.
    later = [s for b, s in seen if b >= 600]
    assert max(s[0] for s in later) <= 3 * 6, seen  # factor 4: < 4 segments per level, 6 levels for 2,000
    assert max(s[1] for s in later) <= 4000, seen
    assert max(s[2] for s in later) <= 150, seen  # segments + what waits out the retire delay
    # staging registrations waiting out the retire delay and finished markers: how many depends
    # on how many commits fit in the delay (68-168 seen); unbounded it would pass 2,000
    assert max(s[3] for s in later) <= 400, seen
    assert seen[-1][1][2] == seen[-1][1][0]  # retired: only the segments' ledgers are left
    entries = _call(bk, NamedLedgers(bk.aio).record(name)).value
    from vellum.client.named_blocking import NamedLedgers as BlockingNamed

    named = BlockingNamed(bk)
    h = named.open(name, "read_only")
    got = [e.payload for e in h.read(0, h.last_add_confirmed)]
    h.close()
    assert got == [b"%d" % i for i in range(2000)], "a row lost, repeated or moved"
    assert entries.segments[0].first_entry_id == 0


@pytest.mark.timeout(max(900, BATCHES * 3))
def test_a_stream_through_spark_stays_bounded_while_read(spark: Any, cluster: LocalCluster, bk: Any, tmp_path: Path) -> None:
    """Through Spark: a rate source into the sink, one segment per micro-batch, merged as it
    goes, while a second query streams the name: it reads every entry once, at its id, across
    the swaps (failOnDataLoss=true: a planned read of a replaced ledger would fail it)."""
    name = "tests/sink/bounded"
    seen: list[tuple[int, tuple[int, int, int, int]]] = []
    read: list[tuple[int, int]] = []

    def collect(df: Any, _batch_id: int) -> None:
        read.extend((r.entryId, int(r.payload)) for r in df.select("entryId", "payload").collect())

    started = time.monotonic()
    ledgers_before = len(bk.list_ledgers())
    keys_before = frozenset(_sink_keys(bk))
    q = (spark.readStream.format("rate").option("rowsPerSecond", 200).option("numPartitions", 1).load()
         .selectExpr("CAST(value AS STRING) AS payload")
         .writeStream.format("vellum").option("metadataServiceUri", cluster.metadata_uri)
         .option("checkpointLocation", str(tmp_path / "cp")).option("entryMaxRows", 1)
         .option("segmentMergeFactor", 4).option("segmentRetireDelay", "10s")
         .trigger(processingTime="0 seconds").start(name))
    reader = None
    try:
        while True:
            p = q.lastProgress
            done = p["batchId"] + 1 if p else 0
            if reader is None and done >= 2:
                reader = (spark.readStream.format("vellum").option("metadataServiceUri", cluster.metadata_uri)
                          .option("name", name).option("startingOffsets", "earliest")
                          .option("lacPollIntervalMs", 200).load()
                          .writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp_path / "rcp"))
                          .trigger(processingTime="1 second").start())
            if done >= BATCHES:
                break
            assert q.exception() is None and q.isActive
            assert reader is None or (reader.exception() is None and reader.isActive), reader.exception()
            assert time.monotonic() - started < 120 + BATCHES * 2, f"only {done} micro-batches"  # a hang guard
            if p and (not seen or done - seen[-1][0] >= max(1, BATCHES // 10)):
                seen.append((done, _sizes(bk, name, ledgers_before, keys_before)))
            time.sleep(0.5)
    finally:
        q.stop()
    assert q.exception() is None
    final = _sizes(bk, name, ledgers_before, keys_before)
    seen.append((BATCHES, final))
    print("batches -> (segments, record bytes, ledgers, spark keys):", seen)
    # Levelled off: a factor-4 counter has at most 3 segments per level (< 6 levels up to 2,000
    # batches); ledgers: the segments, plus what waits out the retire delay.
    later = [s for b, s in seen if b >= BATCHES // 4]
    assert max(s[0] for s in later) <= 3 * 6, seen
    assert max(s[1] for s in later) <= 4000, seen
    assert max(s[2] for s in later) <= 150, seen
    assert max(s[3] for s in later) <= 400, seen  # timing-dependent: see the test above
    # exactly once, at continuous ids
    rows = (spark.read.format("vellum").option("metadataServiceUri", cluster.metadata_uri).load(name)
            .select("entryId", "payload").collect())
    ids = sorted(r.entryId for r in rows)
    assert ids == list(range(len(ids)))
    values = sorted(int(r.payload) for r in rows)
    assert values == list(range(len(values))), "a row lost or written twice"
    by_id = {r.entryId: int(r.payload) for r in rows}
    # the concurrent stream saw the same entries at the same ids, each once
    assert reader is not None
    total = len(rows)
    _deadline = time.monotonic() + 120
    while len(read) < total and time.monotonic() < _deadline:
        assert reader.exception() is None, reader.exception()
        time.sleep(0.5)
    reader.stop()
    assert reader.exception() is None
    assert sorted(i for i, _v in read) == list(range(total))
    assert all(by_id[i] == v for i, v in read)


def _segments_and_rows(bk: Any, name: str) -> tuple[list[int], list[bytes]]:
    from vellum.client.named_blocking import NamedLedgers as BlockingNamed

    named = BlockingNamed(bk)
    rec = named.record(name).value
    h = named.open(name, "read_only")
    rows = [e.payload for e in h.read(0, h.last_add_confirmed)]
    h.close()
    return [s.ledger_id for s in rec.segments], rows


def test_a_merge_cut_short_leaves_the_old_or_the_new_segments(cluster: LocalCluster, bk: Any, monkeypatch: Any) -> None:
    """A merge whose CAS fails, or whose process dies before or after its CAS (its cleanup never
    runs), leaves either the old segments or the copy; retiring then deletes exactly the
    ledger nothing references. Every row stays readable at its id throughout."""
    import pyarrow as pa

    from vellum.spark import merge
    from vellum.spark.options import parse_write_options
    from vellum.spark.writer import VellumStreamWriter, write_task

    name = "tests/sink/cut-short"
    base = {"metadataServiceUri": cluster.metadata_uri, "name": name, "entryMaxRows": "1", "ensembleSize": "2",
            "writeQuorumSize": "2", "ackQuorumSize": "2", "segmentRetireDelay": "1h"}
    writer = VellumStreamWriter(parse_write_options({**base, "segmentMergeFactor": "0"}), overwrite=False)
    for batch_id in range(4):
        rows = pa.RecordBatch.from_pydict({"payload": pa.array([b"%d" % batch_id, b"x"], pa.binary())})
        writer.commit([write_task(writer.opts, f"s-q.{batch_id}.t", iter([rows]), "q", batch_id)], batch_id)
    opts = parse_write_options({**base, "segmentMergeFactor": "4"})
    old, rows = _segments_and_rows(bk, name)
    assert len(old) == 4 and len(rows) == 8
    kv = bk.aio.store.kv

    def all_merge_keys() -> set[str]:
        return {k for k in kv.list("spark/staging/") if "/m-" in k or "/r-" in k or k.split("/")[2][:2] in ("m-", "r-")}

    earlier = all_merge_keys()  # other tests' sinks in this session's cluster (retire delay 1 h)

    def merge_keys() -> list[str]:
        return sorted(all_merge_keys() - earlier)

    ledgers = set(bk.list_ledgers())

    def refused(*_a: Any, **_k: Any) -> Any:
        raise RuntimeError("injected: the CAS was refused")

    # 1. the CAS fails: the copy is deleted, the old segments stay, nothing stays registered
    monkeypatch.setattr(merge.NamedLedgers, "merge_segments", refused)
    try:
        merge.merge_once(bk, opts)
        raise AssertionError("the injected failure must surface")
    except RuntimeError as exc:
        assert "injected" in str(exc)
    assert _segments_and_rows(bk, name) == (old, rows)
    assert set(bk.list_ledgers()) == ledgers and merge_keys() == []
    # 2. the process dies before the CAS (its cleanup never runs): the copy is left registered
    monkeypatch.setattr(merge, "_drop", refused)
    monkeypatch.setattr(bk, "delete_ledger", refused)
    try:
        merge.merge_once(bk, opts)
    except RuntimeError:
        pass
    monkeypatch.undo()
    assert _segments_and_rows(bk, name) == (old, rows)
    orphan = set(bk.list_ledgers()) - ledgers
    assert len(orphan) == 1 and merge_keys()
    merge.retire(bk, name, 0)  # (staging-gc does the same once its --older-than passed)
    assert set(bk.list_ledgers()) == ledgers and merge_keys() == []
    assert _segments_and_rows(bk, name) == (old, rows)
    # 3. the process dies after the CAS, before it unregisters the copy: the copy is a segment
    monkeypatch.setattr(merge, "_drop", refused)
    try:
        merge.merge_once(bk, opts)
    except RuntimeError:
        pass
    monkeypatch.undo()
    new, after = _segments_and_rows(bk, name)
    assert after == rows and len(new) == 1 and new[0] not in old
    assert set(old) <= set(bk.list_ledgers())  # replaced ledgers stay readable for in-flight reads ...
    merge.retire(bk, name, 0)
    assert not set(old) & set(bk.list_ledgers())  # ... until retired; the copy, referenced, is kept
    assert _segments_and_rows(bk, name) == (new, rows) and merge_keys() == []
