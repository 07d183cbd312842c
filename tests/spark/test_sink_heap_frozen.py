"""The sink's tasks write with the worker's heap frozen out of the cyclic garbage collector
(``writer.heap_frozen``), and leave it unfrozen however they end (module docstring of
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


def _rows(seen: list[int], *, fail: bool = False) -> Iterator[pa.RecordBatch]:
    for i in range(3):
        seen.append(gc.get_freeze_count())  # what the collector leaves out while the task reads rows
        yield pa.RecordBatch.from_pydict({"payload": pa.array([b"row %d.%d" % (i, j) for j in range(50)],
                                                              pa.binary())})
    if fail:
        raise RuntimeError("the task's input failed")


def test_a_task_writes_with_the_heap_frozen_and_unfreezes_it_however_it_ends(cluster: LocalCluster, bk: Any) -> None:
    from vellum.format.records import unpack
    from vellum.spark.options import parse_write_options
    from vellum.spark.writer import abort_job, write_task

    assert gc.get_freeze_count() == 0
    opts = parse_write_options({"metadataServiceUri": cluster.metadata_uri, "name": f"tests/frozen-{uuid.uuid4().hex[:6]}"})
    jobs = [f"b-{uuid.uuid4().hex}", f"b-{uuid.uuid4().hex}"]
    try:
        seen: list[int] = []
        msg = write_task(opts, jobs[0], _rows(seen))
        assert len(seen) == 3 and min(seen) > 0, "the task read its rows with nothing frozen"
        assert gc.get_freeze_count() == 0, "the task left the heap frozen"
        handle = bk.open_ledger(msg.ledger_id)
        values = [r for e in handle.read(0, handle.last_add_confirmed) for r in unpack(e.payload)]
        assert values == [b"row %d.%d" % (i, j) for i in range(3) for j in range(50)] and msg.rows == 150

        failed: list[int] = []
        with pytest.raises(RuntimeError, match="input failed"):
            write_task(opts, jobs[1], _rows(failed, fail=True))
        assert min(failed) > 0 and gc.get_freeze_count() == 0, "a failed task left the heap frozen"
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
