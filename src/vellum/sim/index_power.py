"""The real bookie's RocksDB indexes as a simulated power loss sees them (docs/verification.md,
"The real bookie").

Responsibility: ``UnsyncedIndex``, the ``IndexOps`` (``storage/index.py``) a simulated real
bookie's indexes write through. It passes every call on to RocksDB and remembers, per database,
what each write since the database's last WAL sync overwrote (the old value of every key it put
or deleted, ``None`` for a key that was absent); ``lose`` puts those old values back after the
process died, as a power loss would take the writes back.

RocksDB's guarantees, which this follows: a write (``sync=False``, what the indexes do) is in
the WAL's file before the call returns, so a killed process keeps it (a crash loses nothing
here); a power loss keeps what a WAL sync (``flush_wal(True)``), a synced write or a clean close
covered, and of the writes after it a prefix in write order (point-in-time WAL recovery; a write
batch is one record: all of it or none). ``lose`` keeps a seeded prefix of each database's
unsynced writes (none without a generator) and takes the rest back. A memtable flush would make
writes durable too; none is counted on, so the model may lose more than RocksDB would, never
less. With a disk that lies about fsync (``lies``) a sync forgets nothing, so a power loss takes
back what it acknowledged.

Invariants: one per bookie, across its restarts (the page cache outlives the process); ``lose``
runs only while no incarnation of the bookie holds a database open.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from pathlib import Path

import rocksdict

from vellum.storage.index import OS_INDEX_OPS, IndexOps

#: one write's undo: (key, the value it held before, None if absent), in write order
_Undo = list[tuple[bytes, bytes | None]]


class UnsyncedIndex(IndexOps):
    """See the module docstring."""

    def __init__(self, lies: Callable[[], bool] = lambda: False) -> None:
        self._lies = lies
        #: database path -> undo of each write since its last WAL sync, oldest first
        self._undo: dict[str, list[_Undo]] = {}
        #: databases a sync was acknowledged for without persisting (``lies``)
        self._lied: set[str] = set()
        #: writes ``lose`` took back, over the bookie's life
        self.lost_writes = 0

    def _note(self, db: rocksdict.Rdict, path: Path, keys: Iterable[bytes]) -> None:
        self._undo.setdefault(str(path), []).append([(key, db.get(key)) for key in keys])

    def _synced(self, path: Path) -> None:
        if self._lies():
            if str(path) in self._undo:
                self._lied.add(str(path))
            return
        self._undo.pop(str(path), None)

    def put_many(self, db: rocksdict.Rdict, path: Path, pairs: Iterable[tuple[bytes, bytes]]) -> None:
        pairs = list(pairs)
        self._note(db, path, [key for key, _ in pairs])
        super().put_many(db, path, pairs)

    def put(self, db: rocksdict.Rdict, path: Path, key: bytes, value: bytes, *, sync: bool = False) -> None:
        self._note(db, path, [key])
        super().put(db, path, key, value, sync=sync)
        if sync:
            self._synced(path)

    def delete(self, db: rocksdict.Rdict, path: Path, key: bytes) -> None:
        self._note(db, path, [key])
        super().delete(db, path, key)

    def delete_range(self, db: rocksdict.Rdict, path: Path, begin: bytes, end: bytes) -> None:
        keys: list[bytes] = []
        it = db.iter()
        try:
            it.seek(begin)
            while it.valid() and it.key() < end:
                keys.append(it.key())
                it.next()
        finally:
            del it
        self._note(db, path, keys)
        super().delete_range(db, path, begin, end)

    def sync(self, db: rocksdict.Rdict, path: Path) -> None:
        super().sync(db, path)
        self._synced(path)

    def close(self, db: rocksdict.Rdict, path: Path, *, sync: bool) -> None:
        super().close(db, path, sync=sync)
        if sync:
            self._synced(path)

    @property
    def unsynced(self) -> int:
        """Writes a power loss could take back now."""
        return sum(len(writes) for writes in self._undo.values())

    @property
    def lied_databases(self) -> int:
        """Databases holding writes a WAL sync acknowledged that a power loss would take back."""
        return sum(1 for path in self._lied if self._undo.get(path))

    def lose(self, rng: random.Random | None = None) -> int:
        """The power goes (the process is dead already): each database keeps a prefix of its
        unsynced writes (drawn from ``rng``; none without it) and gets the old values of the rest
        back, newest first. Returns the writes taken back."""
        lost = 0
        for path, writes in sorted(self._undo.items()):
            keep = rng.randint(0, len(writes)) if rng is not None else 0
            gone = writes[keep:]
            if not gone or not Path(path).is_dir():  # a wiped disk took the database with it
                continue
            db = OS_INDEX_OPS.open(Path(path))
            try:
                for undo in reversed(gone):
                    for key, old in reversed(undo):
                        if old is None:
                            db.delete(key)
                        else:
                            db.put(key, old)
            finally:
                OS_INDEX_OPS.close(db, Path(path), sync=True)  # what the disk holds after the loss
            lost += len(gone)
        self._undo.clear()
        self._lied.clear()
        self.lost_writes += lost
        return lost


__all__ = ["UnsyncedIndex"]
