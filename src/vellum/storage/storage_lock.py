"""The lock protocol one ledger storage's parts share (``storage/ledger_storage.py``).

``cond`` guards the write caches, the ledger data held in memory and the closed flag: adds,
ledger-data changes and the read path's cache lookups are atomic with respect to each other
under it. ``flush_lock`` serialises flushes, deletes, trims and compaction's index updates, so a
flush never re-adds the locations of a ledger deleted while it ran. Lock order: ``flush_lock``
then ``cond``. The parts (writes, reads, flush, ledger data, upkeep) all hold this one object,
so the protocol stays one protocol however the code is divided.
"""

from __future__ import annotations

import threading
from pathlib import Path

from vellum.errors import StorageError


class StorageLock:
    """The two locks of one ledger storage and its closed flag (see the module docstring)."""

    __slots__ = ("closed", "cond", "flush_lock", "ledger_dir")

    def __init__(self, ledger_dir: Path) -> None:
        self.ledger_dir = ledger_dir
        self.cond = threading.Condition()
        self.flush_lock = threading.RLock()
        self.closed = False  # set under ``cond`` by ``LedgerStorage.close``; read without it too

    def check_open(self) -> None:
        if self.closed:
            raise StorageError(f"{self.ledger_dir}: ledger storage is closed")
