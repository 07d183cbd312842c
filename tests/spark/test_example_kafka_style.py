"""examples/kafka_style.py runs end to end on the shared Spark session and real bookies: keyed
records with event times and headers, a stream from startingTimestamp (the backlog before it is
skipped), an event-time window with a watermark, totals written as records and checked."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from vellum.testing.local_cluster import LocalCluster

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_kafka_style_example(spark: Any, cluster: LocalCluster, tmp_path: Path, capsys: Any) -> None:
    sys.path.insert(0, str(EXAMPLES))
    try:
        spec = importlib.util.spec_from_file_location("kafka_style_example", EXAMPLES / "kafka_style.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(EXAMPLES))
    assert module.run(spark, cluster.metadata_uri, tmp_path, backlog=100, orders=150) == 0
    out = capsys.readouterr().out
    assert "150 orders after the start (100 before it skipped)" in out and "kafka-style pipeline OK" in out
