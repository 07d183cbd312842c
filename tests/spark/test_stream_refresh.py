"""The stream source's LAC refreshes: ``lacPollIntervalMs`` throttles them only while the stream
is idle. While entries flow, each ``latestOffset`` plans up to the freshest LAC (a micro-batch
planned from bounds up to an interval old added that much latency to every row, and with
batches shorter than the interval left the next triggers empty).

Driver-side, on a real cluster: the stream reader is the object Spark's streaming source runner
calls; no SparkSession is needed to call it the same way.
"""

from __future__ import annotations

import asyncio
from typing import Any

from vellum.client.named import NamedLedgers
from vellum.spark.names import _call
from vellum.testing.local_cluster import LocalCluster


def test_lac_refresh_is_throttled_only_while_idle(cluster: LocalCluster, bk: Any) -> None:
    from pyspark.sql.datasource import ReadAllAvailable

    from vellum.spark.datasource import VellumDataSource

    name = "tests/refresh/flowing"
    handle = _call(bk, NamedLedgers(bk.aio).open(name, "create_or_append"))

    def append(count: int) -> None:
        async def go() -> None:
            await asyncio.gather(*[handle.append_async(b"x" * 10) for _ in range(count)])

        _call(bk, go())

    append(1)
    source = VellumDataSource({"metadataServiceUri": cluster.metadata_uri, "name": name,
                               "startingOffsets": "earliest", "lacPollIntervalMs": "600000"})
    reader = source.streamReader(source.schema())
    limit = ReadAllAvailable()
    try:
        start = reader.initialOffset()
        seen = [start[name]]
        for _ in range(3):  # entries keep coming: every call sees the newest LAC, not a 10-minute-old one
            append(2)  # the LAC travels on the next add: the first of the two becomes readable
            seen.append(reader.latestOffset({name: seen[-1]}, limit)[name])
        assert seen[1] > seen[0] and seen[2] > seen[1] and seen[3] > seen[2], seen
        # Nothing new: that refresh finds the same end, and the stream is idle from then on ...
        assert reader.latestOffset({name: seen[-1]}, limit)[name] == seen[-1]
        append(2)
        # ... so the next call is throttled by lacPollIntervalMs (here 10 minutes): same end.
        assert reader.latestOffset({name: seen[-1]}, limit)[name] == seen[-1]
    finally:
        _call(bk, handle.close())
