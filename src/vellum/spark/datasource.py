"""The ``vellum`` data source (PySpark Python Data Source API) and its ``register(spark)`` entry point.

Responsibility: the fixed read schema, option validation at ``load()`` / ``save()`` time, and
handing out the batch/stream readers and writers.

Invariants:
- this module has no import-time side effects (Spark workers import it by reference);
- options are parsed into frozen dataclasses here, in the planner, so a bad option fails the
  ``load()`` / ``save()`` call with ``[VELLUM_OPTION] ...`` in the AnalysisException;
- the read schema is fixed (``key, value, name, ledgerId, entryId, batchIndex, timestamp,
  timestampType`` [+ ``payload``] [+ ``headers``] [+ ``customMetadata``], see ``read_schema``);
  a user schema is accepted only if it is that schema.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from vellum.spark.options import (
    OptionError,
    ReadOptions,
    WriteOptions,
    parse_read_options,
    parse_write_options,
)
from vellum.spark.reader import VellumBatchReader, VellumStreamReader
from vellum.spark.writer import VellumBatchWriter, VellumStreamWriter

FORMAT = "vellum"
#: Kafka's header shape (includeHeaders=true)
HEADERS_TYPE = ArrayType(StructType([StructField("key", StringType(), True),
                                     StructField("value", BinaryType(), True)]), True)


def read_schema(include_metadata: bool, include_headers: bool = False, payload_column: bool = True) -> StructType:
    """``key, value, name, ledgerId, entryId, batchIndex, timestamp, timestampType`` (Kafka's
    names where they mean the same), then ``payload`` (the alias of ``value``, unless
    payloadColumn=false), ``headers`` (includeHeaders=true), ``customMetadata`` (includeMetadata=true)."""
    # Built by hand: DDL parsing needs a SparkContext, which planner workers do not have.
    fields = [
        StructField("key", BinaryType(), True),
        StructField("value", BinaryType(), True),
        StructField("name", StringType(), True),
        StructField("ledgerId", LongType(), True),
        StructField("entryId", LongType(), True),
        StructField("batchIndex", IntegerType(), True),
        StructField("timestamp", TimestampType(), True),
        StructField("timestampType", IntegerType(), True),
    ]
    if payload_column:
        fields.append(StructField("payload", BinaryType(), True))
    if include_headers:
        fields.append(StructField("headers", HEADERS_TYPE, True))
    if include_metadata:
        fields.append(StructField("customMetadata", MapType(StringType(), BinaryType(), True), True))
    return StructType(fields)


def _check_read_schema(schema: StructType, opts: ReadOptions) -> None:
    expected = read_schema(opts.include_metadata, opts.include_headers, opts.payload_column)
    if [(f.name, f.dataType) for f in schema.fields] != [(f.name, f.dataType) for f in expected.fields]:
        raise OptionError(f"the vellum source has a fixed schema {expected.simpleString()}; "
                          f"got {schema.simpleString()} (select/cast columns after load() instead)")


#: columns the sink takes (Kafka's sink: key, value, headers, topic -> name); payload = value
WRITE_COLUMNS = ("value", "payload", "key", "timestamp", "headers", "name")


def _check_write_schema(schema: StructType) -> tuple[str, ...]:
    """The DataFrame's columns if the sink can write them, else ``OptionError`` naming the column."""
    names = [f.name for f in schema.fields]
    extra = [n for n in names if n not in WRITE_COLUMNS]
    if extra:
        raise OptionError(f"the vellum sink writes the columns value (or its alias payload), key, timestamp, "
                          f"headers and name; select them first (other columns: {extra})")
    if "value" in names and "payload" in names:
        raise OptionError("the DataFrame has both 'value' and 'payload' (its alias): keep one")
    if "value" not in names and "payload" not in names:
        raise OptionError(f"the DataFrame to write needs a 'value' column (binary or string; 'payload' is accepted "
                          f"as its alias); it has {names}")
    column = "value" if "value" in names else "payload"
    want: dict[str, tuple[tuple[type, ...], str]] = {
        column: ((BinaryType, StringType), "binary or string"),
        "key": ((BinaryType, StringType), "binary or string"),
        "timestamp": ((TimestampType,), "timestamp (cast a long of milliseconds with timestamp_millis())"),
        "name": ((StringType,), "string"),
    }
    for col, (types, what) in want.items():
        if col in names and not isinstance(schema[col].dataType, types):
            raise OptionError(f"column '{col}' must be {what}, not {schema[col].dataType.simpleString()}")
    if "headers" in names:
        ht = schema["headers"].dataType
        ok = (isinstance(ht, ArrayType) and isinstance(ht.elementType, StructType)
              and [f.name for f in ht.elementType.fields] == ["key", "value"]
              and isinstance(ht.elementType["key"].dataType, StringType)
              and isinstance(ht.elementType["value"].dataType, (BinaryType, StringType)))
        if not ok:
            raise OptionError(f"column 'headers' must be array<struct<key: string, value: binary>> (Kafka's "
                              f"shape), not {ht.simpleString()}")
    return tuple(names)


class VellumDataSource(DataSource):  # type: ignore[misc]
    """``format("vellum")``: ledgers and named ledgers as DataFrames and streams."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def _flag(self, key: str, default: bool) -> bool:
        raw = next((str(v) for k, v in self.options.items() if k.lower() == key.lower()), None)
        return default if raw is None else raw.strip().lower() in ("true", "1", "yes")

    def schema(self) -> StructType:
        return read_schema(self._flag("includeMetadata", False), self._flag("includeHeaders", False),
                           self._flag("payloadColumn", True))

    def reader(self, schema: StructType) -> DataSourceReader:
        opts = parse_read_options(dict(self.options), streaming=False)
        _check_read_schema(schema, opts)
        return VellumBatchReader(opts, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        opts = parse_read_options(dict(self.options), streaming=True)
        _check_read_schema(schema, opts)
        return VellumStreamReader(opts, schema)

    def _write_options(self, schema: StructType) -> WriteOptions:
        from vellum.client.named import validate_name
        from vellum.spark.connection import client
        from vellum.spark.names import resolve_write_settings

        columns = _check_write_schema(schema)
        opts = parse_write_options(dict(self.options), name_column="name" in columns)
        opts = dataclasses.replace(opts, columns=columns, value_column="value" if "value" in columns else "payload")
        if opts.name_from_column:
            return opts  # each name is checked where its first row is written (the task)
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
