"""The ``vellum`` data source (PySpark Python Data Source API) and its ``register(spark)`` entry point.

Responsibility: the fixed read schema, option validation at ``load()`` / ``save()`` time, and
handing out the batch/stream readers and writers.

Invariants:
- this module has no import-time side effects (Spark workers import it by reference);
- options are parsed into frozen dataclasses here, in the planner, so a bad option fails the
  ``load()`` / ``save()`` call with ``[VELLUM_OPTION] ...`` in the AnalysisException;
- the read schema is fixed (``name, ledgerId, entryId, batchIndex, payload`` [+ ``customMetadata``]); a
  user schema is accepted only if it is that schema.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import BinaryType, IntegerType, LongType, MapType, StringType, StructField, StructType

from vellum.spark.options import OptionError, WriteOptions, parse_read_options, parse_write_options
from vellum.spark.reader import VellumBatchReader, VellumStreamReader
from vellum.spark.writer import VellumBatchWriter, VellumStreamWriter

FORMAT = "vellum"
BASE_SCHEMA = "name STRING, ledgerId BIGINT, entryId BIGINT, batchIndex INT, payload BINARY"
METADATA_SCHEMA = BASE_SCHEMA + ", customMetadata MAP<STRING, BINARY>"


def read_schema(include_metadata: bool) -> StructType:
    # Built by hand: DDL parsing needs a SparkContext, which planner workers do not have.
    fields = [
        StructField("name", StringType(), True),
        StructField("ledgerId", LongType(), True),
        StructField("entryId", LongType(), True),
        StructField("batchIndex", IntegerType(), True),
        StructField("payload", BinaryType(), True),
    ]
    if include_metadata:
        fields.append(StructField("customMetadata", MapType(StringType(), BinaryType(), True), True))
    return StructType(fields)


def _check_read_schema(schema: StructType, include_metadata: bool) -> None:
    expected = read_schema(include_metadata)
    if [(f.name, f.dataType) for f in schema.fields] != [(f.name, f.dataType) for f in expected.fields]:
        raise OptionError(f"the vellum source has a fixed schema {expected.simpleString()}; "
                          f"got {schema.simpleString()} (select/cast columns after load() instead)")


def _check_write_schema(schema: StructType) -> None:
    names = [f.name for f in schema.fields]
    if "payload" not in names:
        raise OptionError(f"the DataFrame to write needs a 'payload' column (binary or string); it has {names}")
    extra = [n for n in names if n != "payload"]
    if extra:
        raise OptionError(f"the vellum sink writes only the 'payload' column; select it first "
                          f"(extra columns: {extra})")
    ptype = schema["payload"].dataType
    if not isinstance(ptype, (BinaryType, StringType)):
        raise OptionError(f"column 'payload' must be binary or string, not {ptype.simpleString()}")


class VellumDataSource(DataSource):  # type: ignore[misc]
    """``format("vellum")``: ledgers and named ledgers as DataFrames and streams."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def _include_metadata(self) -> bool:
        raw = str(self.options.get("includeMetadata", "false")).strip().lower()
        return raw in ("true", "1", "yes")

    def schema(self) -> StructType:
        return read_schema(self._include_metadata())

    def reader(self, schema: StructType) -> DataSourceReader:
        opts = parse_read_options(dict(self.options), streaming=False)
        _check_read_schema(schema, opts.include_metadata)
        return VellumBatchReader(opts, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        opts = parse_read_options(dict(self.options), streaming=True)
        _check_read_schema(schema, opts.include_metadata)
        return VellumStreamReader(opts, schema)

    def _write_options(self, schema: StructType) -> WriteOptions:
        from vellum.client.named import validate_name
        from vellum.spark.connection import client
        from vellum.spark.names import resolve_write_settings

        opts = parse_write_options(dict(self.options))
        _check_write_schema(schema)
        try:
            validate_name(opts.name)
        except ValueError as exc:
            raise OptionError(f"option name: {exc}") from None
        with client(opts.metadata_uri, opts.client_properties) as bk:
            return resolve_write_settings(bk, opts)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return VellumBatchWriter(self._write_options(schema), overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return VellumStreamWriter(self._write_options(schema), overwrite)


def register(spark: Any, *, check_executors: bool = True) -> None:
    """Register ``format("vellum")`` with a SparkSession (the one public entry point).

    On a cluster (any master but ``local``) one tiny task first checks that the executors'
    Python can import Vellum, and raises ``ExecutorSetupError`` saying how to fix it if not
    (``check_executors=False`` skips it). No ``pushFilters`` is implemented, so
    ``spark.sql.python.filterPushdown.enabled`` is left as it is (a source without pushFilters
    works with either value).
    """
    if check_executors:
        from vellum.spark.executors import check_executors as _check

        _check(spark)
    spark.dataSource.register(VellumDataSource)
