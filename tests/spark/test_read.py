"""Batch reads of ledgers through ``spark.read.format("vellum")``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vellum.testing.local_cluster import LocalCluster


def _ledger(bk: Any, n: int, prefix: bytes, *, close: bool = True) -> int:
    lh = bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
    futures = [lh.append_async(prefix + b"-%d" % i) for i in range(n)]
    for f in futures:
        f.result(30)
    if close:
        lh.close()
    return int(lh.ledger_id)


def test_batch_read_of_several_ledgers(spark: Any, cluster: LocalCluster, bk: Any) -> None:
    a = _ledger(bk, 250, b"a")
    b = _ledger(bk, 130, b"b")
    df = (spark.read.format("vellum").option("metadataServiceUri", cluster.metadata_uri)
          .option("ledgers", f"{a},{b}").option("maxEntriesPerPartition", 100).load())
    assert df.rdd.getNumPartitions() == 3 + 2
    rows = df.collect()
    assert len(rows) == 380
    got = {(r.ledgerId, r.entryId): bytes(r.payload) for r in rows}
    assert got[(a, 0)] == b"a-0" and got[(a, 249)] == b"a-249" and got[(b, 129)] == b"b-129"
    assert {r.name for r in rows} == {None}
    # offsets: JSON per ledger, and minPartitions
    df2 = (spark.read.format("vellum").option("metadataServiceUri", cluster.metadata_uri)
           .option("ledgers", f"{a},{b}").option("startingOffsets", f'{{"{a}": 200}}')
           .option("endingOffsets", f'{{"{b}": 10}}').option("minPartitions", 4).load())
    ids = sorted((r.ledgerId, r.entryId) for r in df2.select("ledgerId", "entryId").collect())
    assert ids == [(a, e) for e in range(200, 250)] + [(b, e) for e in range(10)]
    assert df2.rdd.getNumPartitions() >= 4


def test_metadata_only_scan_and_custom_metadata(spark: Any, cluster: LocalCluster, bk: Any) -> None:
    lh = bk.create_ledger(ensemble_size=3, write_quorum_size=3, ack_quorum_size=2,
                          custom_metadata={"app": b"orders"})
    for i in range(20):
        lh.append(b"%d" % i)
    # the open ledger: readable up to its LAC, never fenced by the reader
    df = (spark.read.format("vellum").option("metadataServiceUri", cluster.metadata_uri)
          .option("ledgers", str(lh.ledger_id)).option("includePayload", "false")
          .option("includeMetadata", "true").load())
    rows = df.collect()
    assert len(rows) >= 19  # the piggy-backed LAC lags the last add by one
    assert all(r.payload is None and r.customMetadata == {"app": bytearray(b"orders")} for r in rows)
    lh.append(b"still writable")  # the reader did not fence the writer
    lh.close()


def test_bad_options_fail_at_load(spark: Any, cluster: LocalCluster) -> None:
    from pyspark.errors import AnalysisException

    base = spark.read.format("vellum").option("metadataServiceUri", cluster.metadata_uri)
    with pytest.raises(AnalysisException, match=r"VELLUM_OPTION.*exactly one of"):
        base.load().collect()
    with pytest.raises(AnalysisException, match=r"did you mean 'maxEntriesPerPartition'"):
        base.option("ledgers", "1").option("maxEntriesPerPartitio", 3).load().collect()
    with pytest.raises(AnalysisException, match=r"startingOffsets"):
        base.option("ledgers", "1").option("startingOffsets", "[1]").load().collect()


def test_missing_ledger_is_data_loss(spark: Any, cluster: LocalCluster) -> None:
    from pyspark.errors import AnalysisException

    base = (spark.read.format("vellum").option("metadataServiceUri", cluster.metadata_uri)
            .option("ledgers", "987654"))
    with pytest.raises(AnalysisException, match=r"LEDGER_DATA_LOSS\] ledger 987654: all entries lost \(missing: "):
        base.load().collect()
    assert base.option("failOnDataLoss", "false").load().count() == 0


def _ledger_with_gap(bk: Any) -> int:
    """An open ledger (password ``gap``) whose entries 0..9 and 20..28 are readable and whose
    entries 10..19 are on no bookie."""
    from vellum.format.entry import DigestManager, DigestType, master_key
    from vellum.proto import messages as m
    from vellum.testing.wire import RawConnection

    lh = bk.create_ledger(ensemble_size=3, write_quorum_size=3, ack_quorum_size=3,
                          digest_type="CRC32C", password=b"gap")
    for i in range(10):
        lh.append(b"g-%d" % i)
    # Entries 20..29 reach every bookie straight over the wire; 10..19 never do. The last one
    # carries LAC 28, so a reader of this (open) ledger plans entries 0..28.
    dm = DigestManager(lh.ledger_id, DigestType.CRC32C, b"gap")
    for bookie in lh.metadata.ensembles[0]:
        with RawConnection(bookie) as conn:
            for i in range(20, 30):
                conn.send(m.AddRequest(master_key(b"gap"), dm.compute(i, i - 1, 0, b"g-%d" % i)))
                assert conn.recv().status == 0
    return int(lh.ledger_id)


_GAP_ROWS = [(i, b"g-%d" % i) for i in range(10)] + [(i, b"g-%d" % i) for i in range(20, 29)]


def test_gap_inside_a_ledger_loses_only_the_gap(spark: Any, cluster: LocalCluster, bk: Any) -> None:
    """Entries 10..19 of a ledger are on no bookie. With ``failOnDataLoss=false`` the reader
    returns every entry that remains (before and after the gap, in the same partition) and
    names the lost range; with ``true`` it fails naming exactly that range."""
    lid = _ledger_with_gap(bk)

    def reader() -> Any:  # a DataFrameReader's option() changes it in place: a new one each time
        return (spark.read.format("vellum").option("metadataServiceUri", cluster.metadata_uri)
                .option("ledgers", str(lid)).option("password", "gap")
                .option("maxEntriesPerPartition", 1000))

    rows = reader().option("failOnDataLoss", "false").load().collect()
    assert sorted((r.entryId, bytes(r.payload)) for r in rows) == _GAP_ROWS
    with pytest.raises(Exception, match=rf"LEDGER_DATA_LOSS\] ledger {lid}: entries 10\.\.19 lost \(gap: "):
        reader().load().collect()


def test_batch_read_records_lost_ranges_as_rows(spark: Any, cluster: LocalCluster, bk: Any, tmp_path: Path) -> None:
    """failOnDataLoss=false with dataLossLocation: a batch read of a ledger with a gap and of a
    deleted ledger returns what remains and writes one row per lost range (the gap found by an
    executor, the deleted ledger by the planner); loss-report counts and shows them; with true
    the error names the same facts."""
    import datetime

    from click.testing import CliRunner

    from vellum.cli.main import cli
    from vellum.spark.loss import read_losses

    lid = _ledger_with_gap(bk)
    gone = _ledger(bk, 5, b"d")
    bk.delete_ledger(gone)
    location = tmp_path / "losses"

    def reader(ledgers: str) -> Any:
        return (spark.read.format("vellum").option("metadataServiceUri", cluster.metadata_uri)
                .option("ledgers", ledgers).option("password", "gap").option("dataLossLocation", str(location)))

    rows = reader(f"{lid},{gone}").option("failOnDataLoss", "false").load().collect()
    assert sorted((r.entryId, bytes(r.payload)) for r in rows) == _GAP_ROWS
    got = read_losses(str(location))
    facts = sorted(((r["name"], r["ledgerId"], r["firstEntry"], r["lastEntry"], r["reason"], r["queryId"],
                     r["queryName"], r["batchId"]) for r in got), key=str)
    assert facts == sorted([(None, lid, 10, 19, "gap", None, None, None),
                            (None, gone, None, None, "missing", None, None, None)], key=str)
    now = datetime.datetime.now(datetime.UTC)
    for r in got:
        assert r["time"].endswith("Z")
        assert abs(datetime.datetime.fromisoformat(r["time"]) - now) < datetime.timedelta(hours=1)
    # whole files only (written under a hidden name, then renamed), one per task that lost data
    assert not [p for p in location.iterdir() if p.name.startswith(".")]

    res = CliRunner().invoke(cli, ["spark", "loss-report", "--location", str(location), "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.output)
    assert report["lostRanges"] == 2 and report["lostEntries"] == 10 and report["rangesOfUnknownSize"] == 1
    res = CliRunner().invoke(cli, ["spark", "loss-report", "--location", str(location)])
    assert res.exit_code == 0, res.output
    assert "2 lost ranges: 10 entries" in res.output and "10..19" in res.output and "missing" in res.output

    # failOnDataLoss=true (the default): the error names the same facts, and nothing is recorded
    with pytest.raises(Exception, match=rf"LEDGER_DATA_LOSS\] ledger {lid}: entries 10\.\.19 lost \(gap: "):
        reader(str(lid)).load().collect()
    with pytest.raises(Exception, match=rf"LEDGER_DATA_LOSS\] ledger {gone}: all entries lost \(missing: "):
        reader(str(gone)).load().collect()
    assert len(read_losses(str(location))) == 2


def test_data_loss_location_must_be_absolute(spark: Any, cluster: LocalCluster) -> None:
    from pyspark.errors import AnalysisException

    base = (spark.read.format("vellum").option("metadataServiceUri", cluster.metadata_uri)
            .option("ledgers", "1").option("dataLossLocation", "relative/dir"))
    with pytest.raises(AnalysisException, match=r"VELLUM_OPTION\] option dataLossLocation must be an absolute"):
        base.load().collect()


def test_batch_read_of_names_records_what_is_gone(spark: Any, cluster: LocalCluster, bk: Any, tmp_path: Path) -> None:
    """startingOffsets below a shrunk name's start (its segment still holds the entries, but they
    are no longer part of the name) and a deleted name: rows `beforeStart` and `missing`."""
    from vellum.client.named import NamedLedgers
    from vellum.spark.loss import read_losses
    from vellum.spark.names import _call

    named = NamedLedgers(bk.aio)
    for name in ("tests/batch-shrunk", "tests/batch-deleted"):
        h = _call(bk, named.open(name, "create_or_append"))
        for i in range(20):
            _call(bk, h.append(b"%d" % i))
        _call(bk, h.close())
    assert _call(bk, named.shrink("tests/batch-shrunk", 15)).start_entry_id == 15  # no force: the segment keeps 0..14
    _call(bk, named.delete("tests/batch-deleted"))
    location = tmp_path / "losses"
    rows = (spark.read.format("vellum").option("metadataServiceUri", cluster.metadata_uri)
            .option("names", "tests/batch-shrunk,tests/batch-deleted")
            .option("startingOffsets", '{"tests/batch-shrunk": 5, "tests/batch-deleted": 3}')
            .option("failOnDataLoss", "false").option("dataLossLocation", str(location)).load().collect())
    assert sorted((r.name, r.entryId) for r in rows) == [("tests/batch-shrunk", i) for i in range(15, 20)]
    assert sorted(((r["name"], r["firstEntry"], r["lastEntry"], r["reason"]) for r in read_losses(str(location))),
                  key=str) == [("tests/batch-deleted", 3, None, "missing"), ("tests/batch-shrunk", 5, 14, "beforeStart")]


def test_task_records_a_ledger_deleted_after_planning(cluster: LocalCluster, bk: Any, tmp_path: Path) -> None:
    """The executor side without Spark: a partition planned before its ledger was deleted is
    recorded by the task with the planned range."""
    from vellum.spark.datasource import read_schema
    from vellum.spark.loss import read_losses
    from vellum.spark.options import parse_read_options
    from vellum.spark.reader import VellumBatchReader, read_partition

    lid = _ledger(bk, 30, b"late")
    location = tmp_path / "losses"
    opts = parse_read_options({"metadataServiceUri": cluster.metadata_uri, "ledgers": str(lid),
                               "failOnDataLoss": "false", "dataLossLocation": str(location)}, streaming=False)
    reader = VellumBatchReader(opts, read_schema(False))
    parts = reader.partitions()
    bk.delete_ledger(lid)
    assert [b for p in parts for b in read_partition(opts, read_schema(False), p)] == []
    assert [(r["ledgerId"], r["firstEntry"], r["lastEntry"], r["reason"], r["queryId"])
            for r in read_losses(str(location))] == [(lid, 0, 29, "deleted", None)]
