"""What the side-by-side benchmarks share: percentiles, process CPU time, and printing or
emitting a report (``--json`` for scripts). Imported by path (``benchmarks/`` is not a package)."""

from __future__ import annotations

import asyncio
import collections
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def pct(values: list[float], p: float) -> float:
    """The ``p`` quantile (0..1) of ``values`` by nearest rank; 0.0 for none."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p * (len(s) - 1))))] if s else 0.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def emit(report: dict[str, Any], *, as_json: bool) -> None:
    """Print ``report``: JSON, or one line per figure with nested dicts indented."""
    if as_json:
        print(json.dumps(report, indent=2))
        return
    for key, value in report.items():
        if isinstance(value, dict):
            print(key)
            for k, v in value.items():
                print(f"  {k:26s} {v:,.3f}" if isinstance(v, float) else f"  {k:26s} {v}")
        else:
            print(f"{key}: {value:,.3f}" if isinstance(value, float) else f"{key}: {value}")


async def append_in_slices(handle: Any, payloads: Sequence[bytes], batch: int, window: int) -> None:
    """Append ``payloads`` to ``handle`` as a sink task does: slices of ``batch`` entries, one
    ``append_batch_async`` each, at most ``window`` entries in flight (the oldest slices
    awaited first), then every slice awaited."""
    slices: collections.deque[tuple[asyncio.Future[int], int]] = collections.deque()
    outstanding = 0
    for start in range(0, len(payloads), batch):
        part = payloads[start:start + batch]
        while slices and outstanding + len(part) > window:
            fut, n = slices.popleft()
            outstanding -= n
            await fut
        slices.append((handle.append_batch_async(part), len(part)))
        outstanding += len(part)
    while slices:
        await slices.popleft()[0]
