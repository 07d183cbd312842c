"""The sink's tasks write with the worker's heap frozen out of the cyclic garbage collector and
its young collections spaced out (``writer.heap_frozen``, ``writer.young_collections_spaced``),
and leave both as they were however they end (module docstring of
``vellum.spark.writer``, "Speed"). ``write_task`` runs here as a Spark Python worker runs it,
against the session's real bookies."""

from __future__ import annotations

import gc
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from vellum.testing.local_cluster import LocalCluster


def _rows(seen: list[int], *, fail: bool = False, thresholds: list[int] | None = None) -> Iterator[pa.RecordBatch]:
    for i in range(3):
        seen.append(gc.get_freeze_count())  # what the collector leaves out while the task reads rows
        if thresholds is not None:
            thresholds.append(gc.get_threshold()[0])
        yield pa.RecordBatch.from_pydict({"payload": pa.array([b"row %d.%d" % (i, j) for j in range(50)],
                                                              pa.binary())})
    if fail:
        raise RuntimeError("the task's input failed")


def test_a_task_writes_with_the_heap_frozen_and_unfreezes_it_however_it_ends(cluster: LocalCluster, bk: Any) -> None:
    from vellum.format.records import unpack
    from vellum.spark.options import parse_write_options
    from vellum.spark.writer import abort_job, write_task

    assert gc.get_freeze_count() == 0
    before = gc.get_threshold()
    opts = parse_write_options({"metadataServiceUri": cluster.metadata_uri, "name": f"tests/frozen-{uuid.uuid4().hex[:6]}"})
    jobs = [f"b-{uuid.uuid4().hex}", f"b-{uuid.uuid4().hex}"]
    try:
        seen: list[int] = []
        young: list[int] = []
        msg = write_task(opts, jobs[0], _rows(seen, thresholds=young))
        assert len(seen) == 3 and min(seen) > 0, "the task read its rows with nothing frozen"
        assert gc.get_freeze_count() == 0, "the task left the heap frozen"
        assert min(young) >= 20_000 > before[0], "the task wrote with Python's young-collection threshold"
        assert gc.get_threshold() == before, "the task left the collector's thresholds changed"
        handle = bk.open_ledger(msg.ledger_id)
        values = [r for e in handle.read(0, handle.last_add_confirmed) for r in unpack(e.payload)]
        assert values == [b"row %d.%d" % (i, j) for i in range(3) for j in range(50)] and msg.rows == 150

        failed: list[int] = []
        with pytest.raises(RuntimeError, match="input failed"):
            write_task(opts, jobs[1], _rows(failed, fail=True))
        assert min(failed) > 0 and gc.get_freeze_count() == 0, "a failed task left the heap frozen"
        assert gc.get_threshold() == before, "a failed task left the collector's thresholds changed"
    finally:
        # No driver commits these tasks: abort their jobs as the driver would, so that the
        # session's other sink tests find no staging left over
        for job in jobs:
            abort_job(opts, job, [])
    assert not [k for k in bk.aio.store.kv.list("spark/staging/") if k.split("/")[2] in jobs]


def test_a_freeze_made_by_someone_else_is_left_alone() -> None:
    from vellum.spark.writer import heap_frozen

    gc.freeze()
    try:
        with heap_frozen():
            assert gc.get_freeze_count() > 0
        assert gc.get_freeze_count() > 0, "the sink undid a freeze that was not its own"
    finally:
        gc.unfreeze()
    with pytest.raises(ValueError), heap_frozen():
        assert gc.get_freeze_count() > 0
        raise ValueError("inside")
    assert gc.get_freeze_count() == 0
