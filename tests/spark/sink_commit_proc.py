"""A Spark streaming driver for crash tests: the ``vellum`` sink's micro-batches, stopped at a STEP.

Usage: python sink_commit_proc.py URI NAME QUERY_ID STEP

Runs what Spark runs for the sink, through the data source's own objects (``streamWriter``,
``write`` per task attempt, ``commit``), without a JVM: batch 0 is written and committed in
full, then batch 1's partitions 0 and 1 are written, plus a speculative duplicate attempt of
partition 1 that Spark does not commit. During batch 1 the process prints ``AT <step>`` and
waits for the parent's SIGKILL at STEP:

- ``registered``: partition 1 registered its staging ledger (open, empty);
- ``written``: partition 1 appended its rows (ledger still open);
- ``closed``: every task attempt finished (ledgers closed), the commit not started;
- ``published``: right after the compare-and-set that publishes the batch;
- ``forgotten``: after the commit removed the published ledgers' registrations;
- ``cleaned``: after the commit's cleanup (Spark's commit log would be written next).

Every staging ledger is printed as ``STAGED <ledger id>`` once registered. ``rows()`` is what
the test expects each partition of each batch to hold.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import pyarrow as pa

STEPS = ("registered", "written", "closed", "published", "forgotten", "cleaned")


def rows(name: str, batch: int, partition: int) -> list[bytes]:
    return [f"{name}|{batch}|{partition}|{i}".encode() for i in range(50 + 10 * partition)]


class FakeTaskContext:
    """What ``TaskContext.get()`` gives the sink's ``write`` inside a Spark task."""

    current: FakeTaskContext | None = None

    def __init__(self, partition: int, attempt: int, query_id: str, batch: int) -> None:
        self._p, self._a = partition, attempt
        self._props = {"sql.streaming.queryId": query_id, "streaming.sql.batchId": str(batch)}

    @classmethod
    def get(cls) -> FakeTaskContext | None:
        return cls.current

    def partitionId(self) -> int:
        return self._p

    def attemptNumber(self) -> int:
        return self._a

    def getLocalProperty(self, key: str) -> str | None:
        return self._props.get(key)


def run_task(sink: Any, query_id: str, batch: int, partition: int, attempt: int, data: list[bytes]) -> Any:
    """One task attempt of the micro-batch (executor side)."""
    FakeTaskContext.current = FakeTaskContext(partition, attempt, query_id, batch)
    try:
        return sink.write(iter([pa.RecordBatch.from_pydict({"payload": pa.array(data, pa.binary())})]))
    finally:
        FakeTaskContext.current = None


def main(uri: str, name: str, query_id: str, step: str) -> None:
    from pyspark.sql.types import BinaryType, StructField, StructType

    from vellum.spark import names, writer
    from vellum.spark.datasource import VellumDataSource

    assert step in STEPS, step
    armed = False  # the stop is armed for batch 1 only

    def at(this: str) -> None:
        if armed and this == step:
            print(f"AT {step}", flush=True)
            while True:  # the parent's SIGKILL ends us here, mid-commit
                time.sleep(60)

    writer.TaskContext = FakeTaskContext  # type: ignore[assignment,misc]
    register, finish, forget, cleanup = (writer._register_staging, writer._Appender.finish,
                                         writer._forget_published, writer.cleanup_staging)
    publish = names.NameWriter.publish

    def register_hook(bk: Any, job: str, partition: int, attempt: int, ledger_id: int) -> None:
        register(bk, job, partition, attempt, ledger_id)
        print(f"STAGED {ledger_id}", flush=True)
        if partition == 1 and attempt == 0:
            at("registered")

    def finish_hook(self: Any) -> None:
        finish(self)  # every row of the task appended and acknowledged, the ledger not closed yet
        ctx = FakeTaskContext.current
        if ctx is not None and ctx.partitionId() == 1:
            at("written")

    def publish_hook(self: Any, *args: Any, **kwargs: Any) -> bool:
        done = publish(self, *args, **kwargs)
        at("published")
        return done

    def forget_hook(*args: Any) -> None:
        forget(*args)
        at("forgotten")

    def cleanup_hook(*args: Any, **kwargs: Any) -> Any:
        result = cleanup(*args, **kwargs)
        at("cleaned")
        return result

    writer._register_staging = register_hook  # type: ignore[assignment]
    writer._Appender.finish = finish_hook  # type: ignore[method-assign]
    writer._forget_published = forget_hook  # type: ignore[assignment]
    writer.cleanup_staging = cleanup_hook  # type: ignore[assignment]
    names.NameWriter.publish = publish_hook  # type: ignore[method-assign]

    schema = StructType([StructField("payload", BinaryType())])
    sink = VellumDataSource({"metadataServiceUri": uri, "name": name}).streamWriter(schema, False)
    for batch in (0, 1):
        armed = batch == 1
        msgs = [run_task(sink, query_id, batch, p, 0, rows(name, batch, p)) for p in (0, 1)]
        if batch == 1:
            run_task(sink, query_id, batch, 1, 1, rows(name, batch, 1))  # speculative, not committed
            at("closed")
        sink.commit(msgs, batch)
    print("DONE", flush=True)  # the step was never reached: the parent fails the test


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4])
