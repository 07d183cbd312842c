"""What the ZooKeeper driver's parts share (``meta/zk.py``, ``meta/zk_underreplication.py``):
the translation of connection problems into ``MetadataStoreUnavailableError``, reading a znode
that may not exist, the retry budget
of an operation whose reply may be lost, and the cancellable watch handle.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NoReturn

from kazoo.client import KazooClient
from kazoo.exceptions import (
    ConnectionClosedError,
    ConnectionLoss,
    NoNodeError,
    OperationTimeoutError,
    SessionExpiredError,
    SessionMovedError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import ZnodeStat

from vellum.errors import MetadataStoreUnavailableError
from vellum.meta.api import Watch

#: attempts of a create/election step that keeps racing with other sessions
CREATE_RETRIES = 100
RETRY_FIRST_DELAY_S = 0.01
RETRY_MAX_DELAY_S = 1.0


def unavailable(e: Exception, what: str) -> NoReturn:
    raise MetadataStoreUnavailableError(f"ZooKeeper unavailable while {what}: {type(e).__name__}") from e


# Errors after which the request may or may not have been applied by the server: the reply was
# lost with the connection, or the session ended or moved while the request was in flight.
TRANSIENT = (ConnectionLoss, SessionExpiredError, SessionMovedError, OperationTimeoutError, KazooTimeoutError)


def read_znode(client: KazooClient, path: str, what: str = "") -> tuple[bytes, ZnodeStat] | None:
    """The data and stat of ``path``, None when it does not exist; a connection problem raises
    ``MetadataStoreUnavailableError`` ("reading ``what``", default the path)."""
    try:
        data, stat = client.get(path)
    except NoNodeError:
        return None
    except TRANSIENT as e:
        unavailable(e, f"reading {what or path}")
    return bytes(data), stat


def delete_znode(client: KazooClient, path: str) -> None:
    """Delete ``path``; already absent is fine; a connection problem raises
    ``MetadataStoreUnavailableError``."""
    try:
        client.delete(path)
    except NoNodeError:
        pass
    except TRANSIENT as e:
        unavailable(e, f"deleting {path}")


class Retry:
    """The retry budget of one operation whose replies may be lost.

    ``failed(e)`` counts an attempt of unknown outcome, then sleeps (10 ms doubling to 1 s) or,
    once the budget is spent or the store is closed, raises ``MetadataStoreUnavailableError``.
    """

    def __init__(self, budget_s: float, what: str) -> None:
        self._deadline = time.monotonic() + budget_s
        self._delay = RETRY_FIRST_DELAY_S
        self._what = what
        self.unknown = 0  # attempts whose outcome is unknown

    def failed(self, e: Exception, advice: str = "") -> None:
        self.unknown += 1
        if isinstance(e, ConnectionClosedError) or time.monotonic() + self._delay > self._deadline:
            raise MetadataStoreUnavailableError(
                f"ZooKeeper unavailable while {self._what}: {type(e).__name__} "
                f"({self.unknown} attempt(s) without an answer){advice}"
            ) from e
        time.sleep(self._delay)
        self._delay = min(2 * self._delay, RETRY_MAX_DELAY_S)


class Flag(Watch):
    def __init__(self, on_cancel: Callable[[], None] | None = None) -> None:
        self.cancelled = False
        self._on_cancel = on_cancel

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            if self._on_cancel:
                self._on_cancel()
