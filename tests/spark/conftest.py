"""Fixtures of the Spark tests: one SparkSession (local[2]) and one real LocalCluster per session.

Spark costs ~8 s to start and ~1.2 GiB, so exactly one session serves every test here
(the settings Spark's own documentation gives for fast local tests): UI off, 2 shuffle partitions,
bound to 127.0.0.1. Without Java or pyspark the tests are skipped, except under ``CI=true`` where a
missing prerequisite is a failure (CI must not silently lose the Spark coverage).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vellum.testing.local_cluster import LocalCluster


def _require(condition: bool, reason: str) -> None:
    if condition:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true: {reason}", pytrace=False)
    pytest.skip(reason)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    _require(shutil.which("java") is not None, "Java is not installed (Spark needs Java 17 or 21)")
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        _require(False, "pyspark is not installed (pip install '.[spark]')")
        raise
    from vellum.spark import register

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    warehouse = tmp_path_factory.mktemp("warehouse")
    session = (
        SparkSession.builder.master("local[2]").appName("vellum-tests")
        .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2").config("spark.default.parallelism", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.warehouse.dir", str(warehouse))
        .config("spark.driver.extraJavaOptions", "-XX:+UseSerialGC -XX:TieredStopAtLevel=1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("cluster"), bookies=3) as c:
        yield c


@pytest.fixture(scope="session")
def bk(cluster: LocalCluster) -> Iterator[Any]:
    import vellum

    with vellum.BookKeeper(cluster.metadata_uri) as client:
        yield client
