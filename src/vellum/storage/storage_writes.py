"""The write path of one ledger storage: adds into the active write cache.

``write_batch`` puts the bookie's admitted adds (an ``AddBatch``, judged once by
``Bookie.add_batch``) in the *active* write cache under one hold of the storage's ``cond``;
``add_entry`` / ``add_entries`` do the same for entries from outside the ADD path (journal
replay, tools), reading their ids themselves. A full active cache is swapped for a flush by
``StorageFlusher.make_room`` (``storage/storage_flush.py``), which also applies back-pressure.
An add to a ledger deleted here meanwhile is refused from its tombstone, decided under the lock
(defect D2 of docs/correctness.md). The adds also teach a ledger's keyless digest
(``storage/ledger_data.py``). Durable only after the next ``flush()``.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from vellum.errors import IncorrectParameterError, LedgerFencedError, OperationRejectedError
from vellum.format.entry import BytesLike
from vellum.format.ledger_index import LedgerData
from vellum.proto.messages import AddBatch
from vellum.storage.ledger_data import DIGEST_SAMPLE_ADDS, LedgerDataTable
from vellum.storage.storage_flush import StorageFlusher
from vellum.storage.storage_lock import StorageLock
from vellum.storage.write_cache import WriteCache, WriteCaches

_IDS = struct.Struct(">qq")


class StorageWriter:
    """The add path of one ledger storage (see the module docstring)."""

    def __init__(self, lock: StorageLock, caches: WriteCaches, data: LedgerDataTable,
                 flusher: StorageFlusher) -> None:
        self._lock = lock
        self._cond = lock.cond
        self._caches = caches
        self._data = data
        self._flusher = flusher

    def add_entry(self, entry: BytesLike) -> None:
        """Put a stored entry (ids from its first 16 bytes) in the write cache: for entries that
        do not come through the bookie's admission (journal replay, tools, tests), so its
        header is read and its ids checked here. See ``write_batch``.

        Waits up to ``max_throttle_time_ms`` while both caches are full, then raises
        ``OperationRejectedError``. Durable only after the next ``flush()``.
        """
        refused = self.add_entries((entry,))
        if refused[0] is not None:
            raise refused[0]

    def add_entries(self, entries: Sequence[BytesLike]) -> list[BaseException | None]:
        """``add_entry`` for several entries under one hold of the lock; returns per entry the
        error that refused it (no ledger/entry id header, a negative id, or as ``write_batch``)
        or None. Raises only if the storage is closed (nothing stored)."""
        refused: list[BaseException | None] = [None] * len(entries)
        good: list[int] = []
        unpack = _IDS.unpack_from
        for i, entry in enumerate(entries):
            if len(entry) < _IDS.size:
                refused[i] = IncorrectParameterError(f"entry of {len(entry)} bytes has no ledger/entry id header")
                continue
            ledger_id, entry_id = unpack(entry, 0)
            if ledger_id < 0 or entry_id < 0:
                refused[i] = IncorrectParameterError(f"cannot store ledger {ledger_id} entry {entry_id}: negative id")
                continue
            good.append(i)
        if good:
            batch = AddBatch()
            for i in good:
                entry = entries[i]
                if not (type(entry) is bytes or (isinstance(entry, memoryview) and entry.readonly)):
                    entry = bytes(entry)
                ledger_id, entry_id = unpack(entry, 0)
                batch.append(entry, b"", 0, ledger_id, entry_id, -1)
            for pos, why in self.write_batch(batch):
                refused[good[pos]] = why
        return refused

    def write_batch(self, batch: AddBatch) -> list[tuple[int, BaseException]]:
        """Put a batch of admitted adds in the write cache, in order, under one hold of the lock.

        The caller validated every add (``Bookie.add_batch``: size, ids, ledger state, master
        key, fence); nothing of that is judged again here, and ``batch.entries`` are kept as
        they are (``AddBatch``'s ownership rule: ``bytes`` or read-only views nobody writes).
        What this still refuses is storage's own state, per add: back-pressure past
        ``max_throttle_time_ms`` (``OperationRejectedError``, one deadline for the whole batch)
        and a ledger deleted here meanwhile (``LedgerFencedError`` from its tombstone, decided
        under the lock so that a delete racing an add never lets the add recreate the ledger:
        defect D2 of docs/correctness.md). Returns the refused adds as (position, error), empty
        when every add was stored; a refused add does not stop the others. Raises only if the
        storage is closed (nothing stored)."""
        ledger_ids, entry_ids, entries = batch.ledger_ids, batch.entry_ids, batch.entries
        # The ledgers' first adds teach their keyless digest (``LedgerDataTable.learn_digest``); checked here,
        # outside the lock: a CRC pass over the entry.
        samples = self._data.digest_samples
        seen: list[int | None] | None = None
        for pos, ledger_id in enumerate(ledger_ids):
            if samples.get(ledger_id, 0) < DIGEST_SAMPLE_ADDS:
                if seen is None:
                    seen = [None] * len(ledger_ids)
                seen[pos] = self._data.digest_seen(ledger_id, entries[pos])
        refused: list[tuple[int, BaseException]] = []
        deadline: float | None = None
        with self._cond:
            self._lock.check_open()
            caches = self._caches
            ledgers = self._data.by_id
            active = caches.active
            if seen is None and self._put_one_ledger(active, batch):
                return refused
            for pos, (ledger_id, entry_id, entry) in enumerate(zip(ledger_ids, entry_ids, entries)):
                size = len(entry)
                if active and active.size + size > active.max_bytes:
                    try:
                        deadline = self._flusher.make_room(size, ledger_id, entry_id, deadline)
                    except OperationRejectedError as e:
                        refused.append((pos, e))
                        continue
                    active = caches.active
                if ledger_id not in ledgers:
                    # Adds normally follow set_master_key; an entry still makes its ledger
                    # known, unless the ledger was deleted: that is final.
                    try:
                        self._data.refuse_if_deleted(ledger_id, f"entry {entry_id}")
                    except LedgerFencedError as e:
                        refused.append((pos, e))
                        continue
                    self._data.put_ledger(ledger_id, LedgerData(exists=True, fenced=False, master_key=b""))
                active.put(ledger_id, entry_id, entry)
                if seen is not None:
                    learnt = seen[pos]
                    if learnt is not None:
                        self._data.learn_digest(ledger_id, entry_id, learnt)
        return refused

    def _put_one_ledger(self, active: WriteCache, batch: AddBatch) -> bool:
        """``write_batch``'s fast path (caller holds the lock): the adds of one ledger known here,
        new to the write cache, that all fit in it, put at once; False (nothing put) for any
        other batch, which goes add by add."""
        ledger_ids = batch.ledger_ids
        if not ledger_ids:
            return True
        ledger_id = ledger_ids[0]
        if ledger_ids.count(ledger_id) != len(ledger_ids) or ledger_id not in self._data.by_id:
            return False
        entries = batch.entries
        nbytes = sum(map(len, entries))
        return active.size + nbytes <= active.max_bytes and active.put_new(ledger_id, batch.entry_ids, entries, nbytes)
