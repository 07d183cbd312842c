"""Spark layer (L6): the ``vellum`` PySpark data source and offline bookie jobs.

``vellum.spark.register(spark)`` registers ``format("vellum")`` with a SparkSession (see
docs/spark.md). Importing this package does not import pyspark: the data-source modules are
loaded on first use, so ``vellum`` commands that never touch Spark stay light.
"""

from __future__ import annotations

from typing import Any

__all__ = ["register"]


def register(spark: Any, *, check_executors: bool = True) -> None:
    """Register the ``vellum`` data source with ``spark`` (a SparkSession); on a cluster, first
    check that the executors can import Vellum (see ``vellum.spark.executors``)."""
    from vellum.spark.datasource import register as _register

    _register(spark, check_executors=check_executors)
