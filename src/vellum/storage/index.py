"""DbLedgerStorage's RocksDB indexes: entry locations and ledger data (``rocksdict``).

``<index_dir>/current/locations``: (ledgerId, entryId) -> location, BookKeeper's
``EntryLocationIndex``. ``<index_dir>/current/ledgers``: ledgerId -> ``LedgerData`` (exists,
fenced, master key, explicit LAC, limbo), BookKeeper's ``LedgerMetadataIndex``. Key/value bytes
are in ``vellum.format.ledger_index``.

Invariants:
- Writes are not synced one by one (the journal covers them); ``sync()`` makes everything
  written before it durable (WAL flush + fsync). LedgerStorage calls it at the end of a flush.
- The default bytewise comparator sorts negative ids after every non-negative one; only
  non-negative ledger ids are real, so iterations stop at the first negative id and the last
  entry of a ledger is the floor of ``(ledgerId, Long.MAX)``.
- An iterator keeps its database open; every iterator is dropped before ``close()``.
- Failing to open (corrupt files, another process holding the lock) raises a ``StorageError``
  or ``CorruptionError`` naming the path.
- Every write, WAL sync and close goes through an ``IndexOps`` (``OS_INDEX_OPS``: RocksDB's own
  calls), as the entry logs' and journals' system calls go through a ``FileOps``: the
  simulator substitutes one that remembers what no WAL sync covered yet, which a simulated
  power loss takes back (docs/verification.md, "The real bookie").
"""

from __future__ import annotations

import collections
import itertools
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import rocksdict

from vellum.errors import CorruptionError, StorageError
from vellum.format.ledger_index import (
    STORAGE_FLAGS_KEY,
    LedgerData,
    decode_ledger_key,
    decode_location,
    decode_location_key,
    decode_storage_flags,
    encode_location,
    encode_locations,
    encode_storage_flags,
    ledger_key,
    ledger_upper_key,
    location_key,
    location_keys,
)
from vellum.ids import INT64_MAX

LOCATIONS_DB = "locations"
LEDGERS_DB = "ledgers"


def _open_db(path: Path) -> rocksdict.Rdict:
    path.parent.mkdir(parents=True, exist_ok=True)
    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    try:
        return rocksdict.Rdict(str(path), options)
    except Exception as e:  # rocksdict raises plain Exception carrying RocksDB's status text
        text = str(e)
        if "Corruption" in text:
            raise CorruptionError(f"{path}: RocksDB database is corrupt: {text}") from None
        if "lock" in text.lower():
            raise StorageError(f"{path}: RocksDB database is in use (is a bookie running?): {text}") from None
        raise StorageError(f"{path}: cannot open RocksDB database: {text}") from None


def _sync_options() -> rocksdict.WriteOptions:
    opts = rocksdict.WriteOptions()
    opts.sync = True
    return opts


class IndexOps:
    """The RocksDB calls the indexes write through (RocksDB's guarantees: a write is in the
    WAL, so a killed process keeps it; only what a WAL sync, a synced write or a clean close
    covered survives a power loss). Subclasses record or lose what was not synced."""

    def open(self, path: Path) -> rocksdict.Rdict:
        return _open_db(path)

    def put_many(self, db: rocksdict.Rdict, path: Path, pairs: Iterable[tuple[bytes, bytes]]) -> None:
        """One write batch of puts (atomic: all of it or none survives)."""
        batch = rocksdict.WriteBatch(raw_mode=True)
        collections.deque(itertools.starmap(batch.put, pairs), maxlen=0)  # no Python call per pair
        db.write(batch)

    def put(self, db: rocksdict.Rdict, path: Path, key: bytes, value: bytes, *, sync: bool = False) -> None:
        """``sync``: the write and everything written before it are durable when it returns."""
        if sync:
            db.put(key, value, _sync_options())
        else:
            db.put(key, value)

    def delete(self, db: rocksdict.Rdict, path: Path, key: bytes) -> None:
        db.delete(key)

    def delete_range(self, db: rocksdict.Rdict, path: Path, begin: bytes, end: bytes) -> None:
        db.delete_range(begin, end)

    def sync(self, db: rocksdict.Rdict, path: Path) -> None:
        """Everything written before this call is durable when it returns (WAL flush + fsync)."""
        db.flush_wal(True)

    def close(self, db: rocksdict.Rdict, path: Path, *, sync: bool) -> None:
        """``sync``: a clean close (WAL synced first); without it, what a killed process leaves."""
        if sync:
            db.flush_wal(True)
        db.close()


#: RocksDB's own calls
OS_INDEX_OPS = IndexOps()


class _Db:
    def __init__(self, path: Path, ops: IndexOps | None = None) -> None:
        self.path = path
        self._ops = ops if ops is not None else OS_INDEX_OPS
        self._db = self._ops.open(path)
        self._closed = False
        self._lock = threading.Lock()  # guards close against concurrent use

    def _store(self) -> rocksdict.Rdict:
        if self._closed:
            raise StorageError(f"{self.path}: index is closed")
        return self._db

    def _fail(self, e: Exception, what: str) -> StorageError:
        return StorageError(f"{self.path}: {what} failed: {e}")

    def sync(self) -> None:
        """Everything written before this call is durable when it returns."""
        try:
            self._ops.sync(self._store(), self.path)
        except StorageError:
            raise
        except Exception as e:
            raise self._fail(e, "WAL sync") from None

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._ops.close(self._db, self.path, sync=True)
            except Exception as e:
                raise self._fail(e, "close") from None

    def abandon(self) -> None:
        """What a killed process leaves: what RocksDB already wrote to its files (its WAL
        included) stays, nothing more is synced; the handle is released so that the next
        incarnation in this process can open the database. Unusable afterwards."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._ops.close(self._db, self.path, sync=False)
            except Exception as e:
                raise self._fail(e, "close") from None


class EntryLocationIndex(_Db):
    """``locations``: BE(ledgerId)||BE(entryId) -> BE(location)."""

    def __init__(self, index_dir: Path, *, name: str = LOCATIONS_DB, ops: IndexOps | None = None) -> None:
        super().__init__(Path(index_dir) / "current" / name, ops)

    def put_locations(self, items: Iterable[tuple[int, int, int]]) -> None:
        """One write batch of ``(ledger_id, entry_id, location)``; durable after ``sync()``."""
        self._put_pairs((location_key(lid, eid), encode_location(loc)) for lid, eid, loc in items)

    def put_run(self, ledger_id: int, entry_ids: Sequence[int], locations: Sequence[int]) -> None:
        """``put_locations`` of one ledger's entries (a flush's run), its keys and values made
        and put without a Python call per entry; durable after ``sync()``."""
        if len(entry_ids) != len(locations):
            raise ValueError(f"ledger {ledger_id}: {len(entry_ids)} entry ids for {len(locations)} locations")
        self._put_pairs(zip(location_keys(ledger_id, entry_ids), encode_locations(locations)))

    def _put_pairs(self, pairs: Iterable[tuple[bytes, bytes]]) -> None:
        try:
            self._ops.put_many(self._store(), self.path, pairs)
        except StorageError:
            raise
        except Exception as e:
            raise self._fail(e, "batch write") from None

    def put_location(self, ledger_id: int, entry_id: int, location: int) -> None:
        self.put_locations([(ledger_id, entry_id, location)])

    def get_location(self, ledger_id: int, entry_id: int) -> int | None:
        value = self._store().get(location_key(ledger_id, entry_id))
        if value is None:
            return None
        try:
            return decode_location(value)
        except CorruptionError as e:
            raise CorruptionError(f"{self.path} key ({ledger_id}, {entry_id}): {e}") from None

    def get_last_entry(self, ledger_id: int) -> tuple[int, int] | None:
        """``(entry_id, location)`` of the ledger's greatest non-negative entry id, or None."""
        it = self._store().iter()
        try:
            it.seek_for_prev(ledger_upper_key(ledger_id))
            if not it.valid():
                return None
            lid, eid = decode_location_key(it.key())
            if lid != ledger_id or eid < 0:
                return None
            return eid, decode_location(it.value())
        finally:
            del it

    def iter_ledger(self, ledger_id: int, start_entry_id: int = 0) -> Iterator[tuple[int, int]]:
        """``(entry_id, location)`` of a ledger in entry order, from ``start_entry_id``."""
        it = self._store().iter()
        try:
            it.seek(location_key(ledger_id, max(0, start_entry_id)))
            while it.valid():
                lid, eid = decode_location_key(it.key())
                if lid != ledger_id or eid < 0:
                    return
                yield eid, decode_location(it.value())
                it.next()
        finally:
            del it

    def entry_ids(self, ledger_id: int) -> list[int]:
        return [eid for eid, _ in self.iter_ledger(ledger_id)]

    def items(self) -> Iterator[tuple[int, int, int]]:
        """Every ``(ledger_id, entry_id, location)`` with non-negative ids, in key order."""
        it = self._store().iter()
        try:
            it.seek_to_first()
            while it.valid():
                lid, eid = decode_location_key(it.key())
                if lid < 0:
                    return
                if eid >= 0:
                    yield lid, eid, decode_location(it.value())
                it.next()
        finally:
            del it

    def delete_range(self, ledger_id: int, start_entry_id: int, end_entry_id: int) -> None:
        """Drop the entries ``start_entry_id <= id < end_entry_id`` of a ledger."""
        if end_entry_id <= start_entry_id:
            return
        try:
            self._ops.delete_range(self._store(), self.path, location_key(ledger_id, start_entry_id),
                                   location_key(ledger_id, end_entry_id))
        except StorageError:
            raise
        except Exception as e:
            raise self._fail(e, f"delete range of ledger {ledger_id}") from None

    def delete_ledger(self, ledger_id: int) -> None:
        """Drop every key of the ledger (negative entry ids included)."""
        begin = location_key(ledger_id, 0)
        end = location_key(ledger_id + 1, 0) if ledger_id < INT64_MAX else None
        try:
            self._ops.delete_range(self._store(), self.path, begin,
                                   ledger_upper_key(ledger_id) if end is None else end)
        except StorageError:
            raise
        except Exception as e:
            raise self._fail(e, f"delete of ledger {ledger_id}") from None


class LedgerMetadataIndex(_Db):
    """``ledgers``: BE(ledgerId) -> LedgerData, plus the storage-flags key."""

    def __init__(self, index_dir: Path, *, name: str = LEDGERS_DB, ops: IndexOps | None = None) -> None:
        super().__init__(Path(index_dir) / "current" / name, ops)

    def get(self, ledger_id: int) -> LedgerData | None:
        value = self._store().get(ledger_key(ledger_id))
        if value is None:
            return None
        return LedgerData.decode(value, where=f"{self.path} ledger {ledger_id}")

    def put(self, ledger_id: int, data: LedgerData) -> None:
        if ledger_id < 0:
            raise ValueError(f"ledger id {ledger_id} is negative")
        try:
            self._ops.put(self._store(), self.path, ledger_key(ledger_id), data.encode())
        except StorageError:
            raise
        except Exception as e:
            raise self._fail(e, f"put of ledger {ledger_id}") from None

    def delete(self, ledger_id: int) -> None:
        try:
            self._ops.delete(self._store(), self.path, ledger_key(ledger_id))
        except StorageError:
            raise
        except Exception as e:
            raise self._fail(e, f"delete of ledger {ledger_id}") from None

    def ledgers(self) -> Iterator[int]:
        """Ledger ids in ascending order (the flags key and any negative id are skipped)."""
        it = self._store().iter()
        try:
            it.seek_to_first()
            while it.valid():
                lid = decode_ledger_key(it.key())
                if lid < 0:
                    return
                yield lid
                it.next()
        finally:
            del it

    def get_storage_flags(self) -> int:
        value = self._store().get(STORAGE_FLAGS_KEY)
        return 0 if value is None else decode_storage_flags(value)

    def set_storage_flags(self, flags: int) -> None:
        self._ops.put(self._store(), self.path, STORAGE_FLAGS_KEY, encode_storage_flags(flags), sync=True)
