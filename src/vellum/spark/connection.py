"""One blocking Vellum client per Python worker process, shared by the tasks it runs.

Responsibility: hand Spark planner/executor/committer code a ``vellum.BookKeeper`` for a
metadata URI and client settings, creating it lazily *inside* the worker (never pickled, never
inherited across ``fork``), and build the ``ClientConfig`` from ``bookkeeper.*`` options.

Invariants:
- a client is reused only in the process that created it (the pid is part of the cache key):
  pyspark forks workers from a daemon, and a client's loop thread does not survive a fork;
- clients are closed at interpreter exit; a failed client is dropped from the cache so the
  next task gets a fresh one;
- option keys arrive lower-cased from Spark, so ``bookkeeper.<key>`` is matched to
  ``ClientConfig`` keys case-insensitively; unknown keys are errors.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from vellum.client.blocking import BookKeeper
from vellum.config import ClientConfig, build_config
from vellum.spark.options import OptionError

_lock = threading.Lock()
#: (pid, metadata URI, bookkeeper.* options) or (pid, a whole ClientConfig) -> client
_clients: dict[tuple[object, ...], BookKeeper] = {}


def client_config(metadata_uri: str, properties: tuple[tuple[str, str], ...]) -> ClientConfig:
    """``ClientConfig`` from ``bookkeeper.<key>`` options (keys matched case-insensitively)."""
    keys: dict[str, str] = {}
    for f in dataclasses.fields(ClientConfig):
        keys[f.name.lower()] = f.metadata.get("key", f.name)
        keys[str(f.metadata.get("key", f.name)).lower()] = f.metadata.get("key", f.name)
    values: dict[str, str] = {"metadataServiceUri": metadata_uri}
    for key, value in properties:
        real = keys.get(key.lower())
        if real is None:
            raise OptionError(f"unknown client option bookkeeper.{key} (ClientConfig keys: "
                              f"{', '.join(sorted({str(v) for v in keys.values()}))})")
        values[real] = value
    return build_config(ClientConfig, values, source="bookkeeper.* options")


def shared_client(metadata_uri: str, properties: tuple[tuple[str, str], ...] = ()) -> BookKeeper:
    """The process-wide client for these settings (created on first use)."""
    key = (os.getpid(), metadata_uri, properties)
    with _lock:
        bk = _clients.get(key)
        if bk is not None and not _is_closed(bk):
            return bk
        bk = BookKeeper(config=client_config(metadata_uri, properties))
        _clients[key] = bk
        return bk


def shared_client_for(config: ClientConfig) -> BookKeeper:
    """The process-wide client for a whole ``ClientConfig`` (the offline jobs ship the settings
    of ``--client-conf`` to their tasks this way; the config carries the metadata URI)."""
    key = (os.getpid(), config)
    with _lock:
        bk = _clients.get(key)
        if bk is not None and not _is_closed(bk):
            return bk
        bk = BookKeeper(config=config)
        _clients[key] = bk
        return bk


def drop_client(metadata_uri: str, properties: tuple[tuple[str, str], ...] = ()) -> None:
    """Forget (and close) the cached client, e.g. after an error that may have broken it."""
    key = (os.getpid(), metadata_uri, properties)
    with _lock:
        bk = _clients.pop(key, None)
    if bk is not None:
        try:
            bk.close()
        except Exception:  # closing a broken client must not hide the original error
            pass


@contextmanager
def client(metadata_uri: str, properties: tuple[tuple[str, str], ...] = ()) -> Iterator[BookKeeper]:
    """A short-lived client of its own (driver-side planning and commits)."""
    bk = BookKeeper(config=client_config(metadata_uri, properties))
    try:
        yield bk
    finally:
        bk.close()


def _is_closed(bk: BookKeeper) -> bool:
    return bool(getattr(getattr(bk, "_lt", None), "stopped", False))


@atexit.register
def _close_all() -> None:
    with _lock:
        mine = [bk for key, bk in _clients.items() if key[0] == os.getpid()]
        _clients.clear()
    for bk in mine:
        try:
            bk.close()
        except Exception:
            pass
