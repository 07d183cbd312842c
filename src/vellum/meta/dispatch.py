"""One thread that runs metadata callbacks in order, outside every driver lock.

Responsibility: decouple the threads that detect events (kazoo's connection thread, the SQLite
heartbeat and poll threads) from user callbacks, so a slow or failing callback can neither
block session handling nor break the driver.

Invariants: callbacks run one at a time in submission order; an exception in a callback is
logged and swallowed; ``close()`` waits (bounded) for the thread to finish.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

_STOP = object()


class CallbackDispatcher:
    def __init__(self, name: str) -> None:
        self._q: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], None]) -> None:
        self._q.put(fn)

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is _STOP:
                return
            try:
                item()  # type: ignore[operator]
            except Exception:  # a user callback failed; keep serving the others
                log.exception("metadata callback failed")

    def close(self, timeout_s: float = 5.0) -> None:
        self._q.put(_STOP)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)
