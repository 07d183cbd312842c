"""Staging cleanup never deletes published data (defect D6 of docs/correctness.md).

A streaming driver is killed with SIGKILL at each step of the sink's commit (a real process, see
``sink_commit_proc.py``); ``vellum spark staging-gc --older-than 0`` runs; the query restarts
(replays the batch); then a full batch read must return every committed row exactly once, and
every staging ledger that no name references must be gone. Also: a commit whose CAS was applied
but reported an error, and a name record the cleanup cannot read.
"""

from __future__ import annotations

import collections
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from click.testing import CliRunner

from vellum.testing.local_cluster import LocalCluster

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from sink_commit_proc import STEPS, FakeTaskContext, rows, run_task  # noqa: E402

#: steps after which the batch's compare-and-set has been applied
_PUBLISHED = ("published", "forgotten", "cleaned")


def _staging_gc(uri: str) -> Any:
    from vellum.cli.main import cli

    return CliRunner().invoke(cli, ["spark", "staging-gc", "--metadata-uri", uri, "--older-than", "0"])


def _registrations(bk: Any) -> dict[str, int]:
    """``{registration key: ledger id}`` of every staging registration in the store."""
    return {key: int(key.rsplit(".", 1)[1]) for key in bk.aio.store.kv.list("spark/staging/")}


def _record(bk: Any, name: str) -> Any:
    from vellum.spark.names import NameReader

    got = NameReader(bk).record(name)
    assert got is not None, name
    return got.value


def _kill_at_steps(uri: str, names: dict[str, str], queries: dict[str, str]) -> dict[str, list[int]]:
    """Run one sink driver per step (all at once: they are independent), SIGKILL each when it
    reports its step; ``{step: staging ledgers it registered}``."""
    procs = {step: subprocess.Popen([sys.executable, str(HERE / "sink_commit_proc.py"), uri, names[step],
                                     queries[step], step], stdout=subprocess.PIPE, text=True)
             for step in names}
    staged: dict[str, list[int]] = {step: [] for step in names}
    try:
        for step, proc in procs.items():
            watchdog = threading.Timer(120, proc.kill)  # a hung driver must not hang the suite
            watchdog.start()
            try:
                assert proc.stdout is not None
                reached = False
                for line in proc.stdout:
                    if line.startswith("STAGED "):
                        staged[step].append(int(line.split()[1]))
                    elif line.startswith("AT "):
                        reached = True
                        break
                assert reached, f"the driver for step {step!r} ended without reaching it (rc {proc.wait()})"
                proc.send_signal(signal.SIGKILL)
                assert proc.wait(timeout=30) == -signal.SIGKILL
            finally:
                watchdog.cancel()
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
    return staged


def _restart(uri: str, name: str, query_id: str, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The restarted query: Spark re-runs batch 1 (no commit-log entry) with a new sink; returns
    the staging ledgers the replay wrote."""
    from pyspark.sql.types import BinaryType, StructField, StructType

    from vellum.spark import writer
    from vellum.spark.datasource import VellumDataSource

    monkeypatch.setattr(writer, "TaskContext", FakeTaskContext)
    schema = StructType([StructField("payload", BinaryType())])
    sink = VellumDataSource({"metadataServiceUri": uri, "name": name}).streamWriter(schema, False)
    msgs = [run_task(sink, query_id, 1, p, 0, rows(name, 1, p)) for p in (0, 1)]
    sink.commit(msgs, 1)
    return [m.ledger_id for m in msgs]


def test_staging_gc_after_a_driver_killed_at_each_commit_step(
    spark: Any, cluster: LocalCluster, bk: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = cluster.metadata_uri
    tag = uuid.uuid4().hex[:6]
    names = {step: f"tests/crash-{step}-{tag}" for step in STEPS}
    queries = {step: str(uuid.uuid4()) for step in STEPS}  # Spark's query ids are UUIDs
    staged = _kill_at_steps(uri, names, queries)

    # What each kill left: batch 0 is published everywhere; batch 1 only once the CAS ran, and
    # its registrations until the commit removed them.
    left = _registrations(bk)
    for step, name in names.items():
        rec = _record(bk, name)
        segments = {s.ledger_id for s in rec.segments}
        assert len(segments) == (4 if step in _PUBLISHED else 2), step
        assert rec.cursors[f"spark.sink.{queries[step]}"] == (b"1" if step in _PUBLISHED else b"0"), step
        registered = {lid for lid in left.values() if lid in staged[step]}
        if step == "published":  # the defect's state: published ledgers still registered
            assert len(registered & segments) == 2 and len(registered - segments) == 1, registered
        elif step == "forgotten":  # only the speculative attempt is left
            assert not registered & segments and len(registered) == 1, registered
        elif step == "cleaned":
            assert not registered
        else:  # partition 0 closed, partition 1 open (registered, written) or closed, + speculative
            assert len(registered) == (3 if step == "closed" else 2), (step, registered)

    result = _staging_gc(uri)
    assert result.exit_code == 0, result.output
    assert _registrations(bk) == {}
    for step, name in names.items():
        segments = {s.ledger_id for s in _record(bk, name).segments}
        for lid in staged[step]:
            # published ledgers survive whatever their registrations said; the rest is gone
            assert bk.ledger_exists(lid) == (lid in segments), (step, lid, segments)

    replayed = {step: _restart(uri, name, queries[step], monkeypatch) for step, name in names.items()}
    assert _registrations(bk) == {}
    for step, name in names.items():
        rec = _record(bk, name)
        segments = {s.ledger_id for s in rec.segments}
        assert len(segments) == 4 and rec.cursors[f"spark.sink.{queries[step]}"] == b"1", step
        for lid in staged[step] + replayed[step]:
            assert bk.ledger_exists(lid) == (lid in segments), (step, lid, segments)

    # A full read of every output: no [LEDGER_DATA_LOSS], every committed row exactly once.
    df = spark.read.format("vellum").option("metadataServiceUri", uri) \
        .option("names", ",".join(names.values())).load()
    got: dict[str, collections.Counter[bytes]] = collections.defaultdict(collections.Counter)
    for r in df.select("name", "payload").collect():
        got[r.name][bytes(r.payload)] += 1
    for step, name in names.items():
        want = collections.Counter(row for b in (0, 1) for p in (0, 1) for row in rows(name, b, p))
        assert got[name] == want, step


def _batch(*values: bytes) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"payload": pa.array(list(values), pa.binary())})


@pytest.mark.parametrize("lost_reply", ["batch-timeout", "stream-conflict"])
def test_a_commit_applied_but_reported_failed_keeps_its_ledgers(
    cluster: LocalCluster, bk: Any, monkeypatch: pytest.MonkeyPatch, lost_reply: str
) -> None:
    """The CAS is applied but its reply is lost. A batch job's commit raises and Spark aborts
    it; a stream's commit retries, finds its own cursor and takes the batch for a replay. Either
    way the cleanup must keep the ledgers the record now references."""
    from vellum.errors import MetadataVersionError
    from vellum.format.records import unpack
    from vellum.spark import names as spark_names
    from vellum.spark.options import parse_write_options
    from vellum.spark.writer import abort_job, commit_job, write_task

    name = f"tests/lost-reply-{lost_reply}-{uuid.uuid4().hex[:6]}"
    opts = parse_write_options({"metadataServiceUri": cluster.metadata_uri, "name": name})
    job = f"b-{uuid.uuid4().hex}"
    msgs = [write_task(opts, job, iter([_batch(b"a", b"b")])), write_task(opts, job, iter([_batch(b"c")]))]
    publish = spark_names.NameWriter.publish
    lost = [True]

    def applied_then_failed(self: Any, *args: Any, **kwargs: Any) -> bool:
        done = publish(self, *args, **kwargs)
        if lost:
            lost.clear()
            if lost_reply == "batch-timeout":
                raise TimeoutError("no reply from the metadata store")
            raise MetadataVersionError("the store retried our applied CAS")
        return done

    monkeypatch.setattr(spark_names.NameWriter, "publish", applied_then_failed)
    if lost_reply == "batch-timeout":
        with pytest.raises(TimeoutError):
            commit_job(opts, job, msgs, overwrite=False)
        abort_job(opts, job, msgs)  # what Spark does when commit raises
    else:
        assert commit_job(opts, job, msgs, overwrite=False, cursor=("spark.sink.q-lost", 0)) is False
    segments = [s.ledger_id for s in _record(bk, name).segments]
    assert segments == [m.ledger_id for m in msgs]
    assert all(bk.ledger_exists(lid) for lid in segments), "a published segment was deleted"
    handles = [bk.open_ledger(lid) for lid in segments]
    assert [r for h in handles for e in h.read(0, h.last_add_confirmed) for r in unpack(e.payload)] == [b"a", b"b", b"c"]
    assert not [k for k in _registrations(bk) if job in k]


def test_staging_gc_deletes_nothing_while_a_name_record_is_unreadable(cluster: LocalCluster, bk: Any) -> None:
    from vellum.spark.options import parse_write_options
    from vellum.spark.writer import write_task

    uri = cluster.metadata_uri
    opts = parse_write_options({"metadataServiceUri": uri, "name": "tests/abandoned"})
    job = f"b-abandoned-{uuid.uuid4().hex}"
    msg = write_task(opts, job, iter([_batch(b"x")]))  # a task of a job whose driver died
    kv = bk.aio.store.kv
    kv.create("names/zz-unreadable", b"not a named-ledger record")
    try:
        result = _staging_gc(uri)
        assert result.exit_code != 0
        assert f"stopped at job {job} and deleted nothing of it" in result.output
        assert "zz-unreadable" in result.output and "run staging-gc again" in result.output
        assert bk.ledger_exists(msg.ledger_id)
        assert [k for k in _registrations(bk) if job in k]
    finally:
        kv.delete("names/zz-unreadable")
    result = _staging_gc(uri)
    assert result.exit_code == 0, result.output
    assert not bk.ledger_exists(msg.ledger_id)  # unpublished and abandoned: cleaned
    assert _registrations(bk) == {}
