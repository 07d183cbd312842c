"""Streaming reads: availableNow with read limits over several batches, restart from checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vellum.testing.local_cluster import LocalCluster


def _run(spark: Any, uri: str, ledgers: str, checkpoint: Path, **options: Any) -> list[tuple[int, list[tuple[int, int]]]]:
    seen: list[tuple[int, list[tuple[int, int]]]] = []

    def collect(df: Any, batch_id: int) -> None:
        seen.append((batch_id, [(r.ledgerId, r.entryId) for r in df.select("ledgerId", "entryId").collect()]))

    reader = spark.readStream.format("vellum").option("metadataServiceUri", uri).option("ledgers", ledgers)
    for k, v in options.items():
        reader = reader.option(k, v)
    q = (reader.load().writeStream.foreachBatch(collect).option("checkpointLocation", str(checkpoint))
         .trigger(availableNow=True).start())
    assert q.awaitTermination(120)
    assert q.exception() is None
    return seen


def test_available_now_limits_then_restart(spark: Any, cluster: LocalCluster, bk: Any, tmp_path: Path) -> None:
    a = bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
    b = bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
    for f in [a.append_async(b"a%d" % i) for i in range(300)] + [b.append_async(b"b%d" % i) for i in range(200)]:
        f.result(30)
    # Pipelined adds all carry the LAC of when they were sent (-1): one more add after the burst
    # lets readers see entries 0..299 (BookKeeper's piggy-backed LAC; 300 stays unconfirmed).
    a.append(b"a300")
    b.close()  # b closed at 199
    ledgers = f"{a.ledger_id},{b.ledger_id}"
    cp = tmp_path / "cp"
    run1 = _run(spark, cluster.metadata_uri, ledgers, cp, startingOffsets="earliest", maxEntriesPerTrigger=150)
    sizes = [len(rows) for _bid, rows in run1 if rows]
    assert all(s <= 150 for s in sizes) and len(sizes) == 4, sizes
    got1 = [x for _b, rows in run1 for x in rows]
    assert len(got1) == len(set(got1))
    assert {x for x in got1 if x[0] == b.ledger_id} == {(b.ledger_id, e) for e in range(200)}
    a_seen = sorted(e for lid, e in got1 if lid == a.ledger_id)
    assert a_seen == list(range(300))

    # more entries, then the same query again: resumes exactly where the checkpoint says
    for f in [a.append_async(b"a%d" % i) for i in range(301, 400)]:
        f.result(30)
    a.close()
    run2 = _run(spark, cluster.metadata_uri, ledgers, cp, startingOffsets="earliest", maxEntriesPerTrigger=150)
    assert run2 and run2[0][0] > run1[-1][0]  # batch ids continue
    got2 = [x for _b, rows in run2 for x in rows]
    assert sorted(got1 + got2) == sorted([(a.ledger_id, e) for e in range(400)] + [(b.ledger_id, e) for e in range(200)])


def test_max_bytes_per_trigger(spark: Any, cluster: LocalCluster, bk: Any, tmp_path: Path) -> None:
    lh = bk.create_ledger(ensemble_size=3, write_quorum_size=3, ack_quorum_size=2)
    for f in [lh.append_async(b"x" * 1000) for _ in range(50)]:
        f.result(30)
    lh.close()
    run = _run(spark, cluster.metadata_uri, str(lh.ledger_id), tmp_path / "cp", startingOffsets="earliest",
               maxBytesPerTrigger=10_000)
    sizes = [len(rows) for _b, rows in run if rows]
    assert sum(sizes) == 50 and max(sizes) <= 10


def test_deleted_ledger_fails_with_data_loss(spark: Any, cluster: LocalCluster, bk: Any, tmp_path: Path) -> None:
    """A ledger deleted under a stream: true fails naming it; false records the loss as a row of
    the micro-batch that moved past it."""
    import pytest

    from vellum.spark.loss import read_losses

    lh = bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
    for i in range(10):
        lh.append(b"%d" % i)
    lh.close()
    cp = tmp_path / "cp"
    assert sum(len(r) for _b, r in _run(spark, cluster.metadata_uri, str(lh.ledger_id), cp,
                                         startingOffsets="earliest")) == 10
    bk.delete_ledger(lh.ledger_id)
    with pytest.raises(Exception, match=rf"LEDGER_DATA_LOSS\] ledger {lh.ledger_id}: entries from 10 on lost "
                                        r"\(deleted: "):
        _run(spark, cluster.metadata_uri, str(lh.ledger_id), cp)
    location = tmp_path / "losses"
    seen = _run(spark, cluster.metadata_uri, str(lh.ledger_id), cp, failOnDataLoss="false",
                dataLossLocation=str(location))
    rows = read_losses(str(location))
    assert [(r["name"], r["ledgerId"], r["firstEntry"], r["lastEntry"], r["reason"]) for r in rows] == [
        (None, lh.ledger_id, 10, None, "deleted")]
    assert rows[0]["queryId"] and rows[0]["batchId"] in [b for b, _r in seen]


def test_named_ledger_followed_across_writers(spark: Any, cluster: LocalCluster, bk: Any, tmp_path: Path) -> None:
    from vellum.client.named import NamedLedgers
    from vellum.spark.names import _call

    named = NamedLedgers(bk.aio)

    def write(values: range) -> None:
        # each call is a new writer session: it fences the previous one and opens a new segment
        h = _call(bk, named.open("tests/follow", "create_or_append"))
        for i in values:
            _call(bk, h.append(b"n%d" % i))
        _call(bk, h.close())

    write(range(0, 30))
    write(range(30, 50))
    seen: list[tuple[str, int, bytes]] = []

    def run() -> None:
        def collect(df: Any, _bid: int) -> None:
            seen.extend((r.name, r.entryId, bytes(r.payload)) for r in df.collect())

        q = (spark.readStream.format("vellum").option("metadataServiceUri", cluster.metadata_uri)
             .option("name", "tests/follow").option("startingOffsets", "earliest")
             .option("maxEntriesPerTrigger", 15).load()
             .writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(availableNow=True).start())
        assert q.awaitTermination(120)
        assert q.exception() is None

    run()
    write(range(50, 70))  # a third writer after the query stopped
    run()
    assert [(n, e, p) for n, e, p in seen] == [("tests/follow", i, b"n%d" % i) for i in range(70)]


def test_shrunk_name_records_lost_entries_as_rows(spark: Any, cluster: LocalCluster, bk: Any, tmp_path: Path) -> None:
    """A name shrunk past a stream's position: with failOnDataLoss=false the stream reads what
    remains and the micro-batch records the shrunk range (with the query's id, name and batch
    id); loss-report shows it; with true the query fails naming the same range."""
    import json

    import pytest
    from click.testing import CliRunner

    from vellum.cli.main import cli
    from vellum.client.named import NamedLedgers
    from vellum.spark.loss import read_losses
    from vellum.spark.names import _call

    named = NamedLedgers(bk.aio)
    name = "tests/shrunk-loss"

    def write(values: range) -> None:
        h = _call(bk, named.open(name, "create_or_append"))
        for i in values:
            _call(bk, h.append(b"s%d" % i))
        _call(bk, h.close())

    location = tmp_path / "losses"
    seen: dict[str, list[tuple[int, list[int]]]] = {}

    def run(cp: str, **options: str) -> Any:
        def collect(df: Any, batch_id: int) -> None:
            seen.setdefault(cp, []).append((batch_id, [r.entryId for r in df.select("entryId").collect()]))

        reader = (spark.readStream.format("vellum").option("metadataServiceUri", cluster.metadata_uri)
                  .option("name", name).option("startingOffsets", "earliest"))
        for k, v in options.items():
            reader = reader.option(k, v)
        q = (reader.load().writeStream.queryName(f"shrunk_{cp}").foreachBatch(collect)
             .option("checkpointLocation", str(tmp_path / cp)).trigger(availableNow=True).start())
        assert q.awaitTermination(120)
        return q

    write(range(0, 30))
    for cp in ("lenient", "strict"):
        q = run(cp)
        assert q.exception() is None
        assert sorted(e for _b, ids in seen[cp] for e in ids) == list(range(30))
    write(range(30, 60))  # a second segment, entries 30..59
    # No force: the second segment still holds 30..44, but they are no longer part of the name.
    assert _call(bk, named.shrink(name, 45)).start_entry_id == 45

    q = run("lenient", failOnDataLoss="false", dataLossLocation=str(location))
    assert q.exception() is None
    after = seen["lenient"][1:]
    assert sorted(e for _b, ids in after for e in ids) == list(range(45, 60))
    rows = read_losses(str(location))
    assert [(r["name"], r["ledgerId"], r["firstEntry"], r["lastEntry"], r["reason"]) for r in rows] == [
        (name, None, 30, 44, "shrunk")]
    assert rows[0]["queryId"] == str(q.id) and rows[0]["queryName"] == "shrunk_lenient"
    assert rows[0]["batchId"] in [b for b, ids in after if ids]

    res = CliRunner().invoke(cli, ["spark", "loss-report", "--location", str(location)])
    assert res.exit_code == 0, res.output
    assert "1 lost ranges: 15 entries" in res.output and "30..44" in res.output and "shrunk" in res.output
    res = CliRunner().invoke(cli, ["spark", "loss-report", "--location", str(location), "--json"])
    assert json.loads(res.output)["rows"] == rows

    with pytest.raises(Exception, match=rf"LEDGER_DATA_LOSS\] named ledger '{name}': entries 30\.\.44 lost "
                                        r"\(shrunk: "):
        run("strict")


def _wait_until(condition: Any, what: str, timeout_s: float = 90.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_min_entries_per_trigger(spark: Any, cluster: LocalCluster, bk: Any, tmp_path: Path) -> None:
    """minEntriesPerTrigger=50: 20 new entries start no micro-batch (though the source saw them),
    40 more start one; with a short maxTriggerDelay a few entries start one after the delay."""
    import json
    import time

    lh = bk.create_ledger(ensemble_size=3, write_quorum_size=3, ack_quorum_size=2)
    lid = lh.ledger_id
    batches: dict[str, list[tuple[int, list[int]]]] = {"min": [], "delay": []}

    def start(kind: str, **options: str) -> Any:
        def collect(df: Any, batch_id: int) -> None:
            rows = sorted(r.entryId for r in df.select("entryId").collect())
            if rows:  # Spark runs an empty batch 0 to record the initial offsets
                batches[kind].append((batch_id, rows))

        reader = (spark.readStream.format("vellum").option("metadataServiceUri", cluster.metadata_uri)
                  .option("ledgers", str(lid)).option("startingOffsets", f'{{"{lid}": 0}}')
                  .option("lacPollIntervalMs", 100))
        for k, v in options.items():
            reader = reader.option(k, v)
        return (reader.load().writeStream.foreachBatch(collect)
                .option("checkpointLocation", str(tmp_path / kind)).start())

    def source_saw(q: Any) -> int:
        """Entries the source reported available (reportLatestOffset) in the newest progress."""
        p = q.lastProgress
        raw = p["sources"][0].get("latestOffset") if p and p.get("sources") else None
        return int(json.loads(raw).get(str(lid), {}).get("latest", -1)) if raw else -1

    # Idle triggers report progress (with the source's latest offset) every 100 ms, not 10 s.
    spark.conf.set("spark.sql.streaming.noDataProgressEventInterval", "100")
    q = start("min", minEntriesPerTrigger="50")
    try:
        for i in range(21):
            lh.append(b"%d" % i)  # readers see entries 0..19 (the piggy-backed LAC lags one add)
        _wait_until(lambda: source_saw(q) >= 20, "the source to see 20 entries")
        assert batches["min"] == []  # 20 < 50: no micro-batch
        for i in range(21, 61):
            lh.append(b"%d" % i)  # now 0..59 are visible
        _wait_until(lambda: batches["min"], "a micro-batch once 60 entries wait")
        first = batches["min"][0][1]
        assert first[:20] == list(range(20)) and len(first) >= 50
        assert q.exception() is None
    finally:
        q.stop()

    # maxTriggerDelay: 5 entries (below the minimum) start a batch once the delay has passed.
    lh2 = bk.create_ledger(ensemble_size=3, write_quorum_size=3, ack_quorum_size=2)
    lid = lh2.ledger_id
    started = time.monotonic()
    q = start("delay", minEntriesPerTrigger="50", maxTriggerDelay="2s")
    try:
        for i in range(6):
            lh2.append(b"%d" % i)  # readers see 0..4
        _wait_until(lambda: batches["delay"], "a micro-batch after maxTriggerDelay")
        assert batches["delay"][0][1] == list(range(5))
        assert time.monotonic() - started >= 2.0  # not before the delay (its clock starts with the run)
        assert q.exception() is None
    finally:
        q.stop()
        spark.conf.unset("spark.sql.streaming.noDataProgressEventInterval")


def test_min_entries_per_trigger_with_available_now(spark: Any, cluster: LocalCluster, bk: Any,
                                                    tmp_path: Path) -> None:
    """availableNow ignores the minimum for what is left of its frozen end, so the run ends; the
    maximum still caps each batch."""
    lh = bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
    for f in [lh.append_async(b"x%d" % i) for i in range(38)]:
        f.result(30)
    lh.close()
    run = _run(spark, cluster.metadata_uri, str(lh.ledger_id), tmp_path / "cp", startingOffsets="earliest",
               minEntriesPerTrigger=10, maxEntriesPerTrigger=15)
    sizes = [len(rows) for _b, rows in run if rows]
    assert sizes == [15, 15, 8]


def test_stream_of_a_missing_ledger_records_it(spark: Any, cluster: LocalCluster, tmp_path: Path) -> None:
    """A stream whose ledger does not exist when it starts: a row `missing` from its first batch."""
    from vellum.spark.loss import read_losses

    location = tmp_path / "losses"
    seen = _run(spark, cluster.metadata_uri, "987655", tmp_path / "cp", failOnDataLoss="false",
                dataLossLocation=str(location))
    assert [rows for _b, rows in seen if rows] == []
    got = read_losses(str(location))
    assert [(r["ledgerId"], r["firstEntry"], r["lastEntry"], r["reason"]) for r in got] == [
        (987655, None, None, "missing")]
    assert got[0]["queryId"] and got[0]["batchId"] == 0
