"""The ledger data of one ledger storage: what the ``ledgers`` index holds per ledger, kept in
memory too (BookKeeper's LedgerMetadataIndex does the same), and the changes made to it.

Master key, fence, explicit LAC, limbo and the tombstone a delete leaves (``exists=false,
fenced=true``: defect D2 of docs/correctness.md) are written to the ``ledgers`` index without a
sync and become durable at the next flush (``storage/storage_flush.py`` syncs the index).
Tombstones are not kept in memory: they are read from the index when an unknown ledger shows
up (ledger ids are never reused, so they cost a few bytes of index per deleted ledger).

Verification (defect D5 of docs/correctness.md): the bookie knows no ledger's digest type or
password, so the table learns the keyless digest (CRC32 or CRC32C) from a ledger's first adds
(``digest_seen`` outside the lock, ``learn_digest`` under it), stored as
``LedgerData.digest_type``; ``read_digest`` tells the read path what to verify an entry read
from an entry log with (``checked_digest`` tells compaction). HMAC and DUMMY ledgers, and
ledgers not learnt, are never checked, so a good entry is never flagged. The simulator's
``serve-unchecked-reads`` regression (docs/verification.md) turns the read check off here, in
the one place every read path asks (``_check_reads``).

Every method takes the storage's ``cond`` itself, except those that say the caller holds it.
"""

from __future__ import annotations

import dataclasses
import hmac
import logging
from collections.abc import Iterator

from vellum.errors import LedgerFencedError, NoSuchEntryError, NoSuchLedgerError, UnauthorizedAccessError
from vellum.format.entry import BytesLike, DigestType, checksum_matches, sniff_checksum
from vellum.format.ledger_index import DIGEST_NOT_CHECKABLE, LedgerData
from vellum.storage.index import LedgerMetadataIndex
from vellum.storage.storage_lock import StorageLock

# One ledger storage, one log name (what operators filter on), whichever part logs.
log = logging.getLogger("vellum.storage.ledger_storage")
#: adds per ledger (per process) whose digest is checked to learn the ledger's keyless digest
DIGEST_SAMPLE_ADDS = 8
#: ``LedgerData.digest_type`` values whose entries are verified when read from an entry log
_CHECKED_DIGESTS = frozenset((int(DigestType.CRC32), int(DigestType.CRC32C)))

#: test flag (the simulator's ``serve-unchecked-reads`` regression, docs/verification.md, defect D5
#: of docs/correctness.md): False serves what is read from an entry log without its keyless CRC check
_check_reads = True


class LedgerDataTable:
    """Per-ledger data of one ledger storage, in memory and in the ``ledgers`` index (see the
    module docstring)."""

    def __init__(self, lock: StorageLock, ledgers_index: LedgerMetadataIndex) -> None:
        self._lock = lock
        self._cond = lock.cond
        self.ledger_dir = lock.ledger_dir
        self.ledgers_index = ledgers_index
        #: ledger -> its data, for ledgers that exist; read under ``cond`` (the write path reads
        #: it directly), written only by this class
        self.by_id: dict[int, LedgerData] = {}
        # Tombstones of deleted ledgers stay on disk only (see ``is_deleted``).
        for lid in list(self.ledgers_index.ledgers()):
            data = self.ledgers_index.get(lid)
            if data is not None and data.exists:
                self.by_id[lid] = data
        #: ledger -> adds whose digest was checked since start (``learn_digest``); bounded;
        #: read without the lock by the write path
        self.digest_samples: dict[int, int] = {}

    def put_ledger(self, ledger_id: int, data: LedgerData) -> None:
        """Store the ledger's data (index without sync, and memory). Caller holds ``cond``."""
        self.ledgers_index.put(ledger_id, data)
        self.by_id[ledger_id] = data

    def known_ledger(self, ledger_id: int) -> LedgerData:
        """The data of a ledger that exists here, else ``NoSuchLedgerError``. Caller holds ``cond``."""
        data = self.by_id.get(ledger_id)
        if data is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} is not in {self.ledger_dir}")
        return data

    def ledger_exists(self, ledger_id: int) -> bool:
        with self._cond:
            return ledger_id in self.by_id

    def not_held(self, ledger_id: int, entry_id: int) -> NoSuchLedgerError | NoSuchEntryError:
        """The error for an entry this storage neither caches nor indexes: "no such ledger" if
        the ledger is unknown here, else "no such entry"."""
        if not self.ledger_exists(ledger_id):
            return NoSuchLedgerError(f"ledger {ledger_id} is not in {self.ledger_dir}")
        return NoSuchEntryError(f"ledger {ledger_id} entry {entry_id} is not in {self.ledger_dir}")

    def is_deleted(self, ledger_id: int) -> bool:
        """True if this storage deleted the ledger (its tombstone is in the index)."""
        with self._cond:
            if ledger_id in self.by_id:
                return False
        data = self.ledgers_index.get(ledger_id)
        return data is not None and not data.exists

    def record(self, ledger_id: int) -> LedgerData | None:
        """The ledger's data as this dir holds it: live, or its tombstone (``exists`` false);
        None if it holds nothing of the ledger."""
        with self._cond:
            data = self.by_id.get(ledger_id)
        return data if data is not None else self.ledgers_index.get(ledger_id)

    def refuse_if_deleted(self, ledger_id: int, what: str) -> None:
        if self.is_deleted(ledger_id):
            raise LedgerFencedError(
                f"ledger {ledger_id} was deleted (its metadata is gone and {self.ledger_dir} "
                f"garbage-collected it); refused {what}: a deleted ledger takes no more writes"
            )

    def ledgers(self) -> Iterator[int]:
        with self._cond:
            return iter(sorted(self.by_id))

    def set_master_key(self, ledger_id: int, master_key: bytes) -> None:
        """Create the ledger with its master key; a different key for a known ledger is refused."""
        with self._cond:
            self._lock.check_open()
            data = self.by_id.get(ledger_id)
            if data is None:
                self.refuse_if_deleted(ledger_id, "its master key")
                self.put_ledger(
                    ledger_id, LedgerData(exists=True, fenced=False, master_key=bytes(master_key))
                )
            elif not data.master_key:
                self.put_ledger(ledger_id, _replace(data, master_key=bytes(master_key)))
            elif not hmac.compare_digest(data.master_key, master_key):
                raise UnauthorizedAccessError(f"ledger {ledger_id}: master key does not match the stored one")

    def get_master_key(self, ledger_id: int) -> bytes | None:
        """The ledger's master key; None if unknown or not set yet (a ledger made known by an
        entry alone, e.g. by journal replay or index rebuild, adopts the next key it is given)."""
        with self._cond:
            data = self.by_id.get(ledger_id)
            return data.master_key if data is not None and data.master_key else None

    def set_fenced(self, ledger_id: int) -> bool:
        """Fence the ledger; True if it was not fenced before. Durable at the next ``flush()``."""
        with self._cond:
            self._lock.check_open()
            data = self.known_ledger(ledger_id)
            if data.fenced:
                return False
            self.put_ledger(ledger_id, _replace(data, fenced=True))
            return True

    def is_fenced(self, ledger_id: int) -> bool:
        with self._cond:
            return self.known_ledger(ledger_id).fenced

    def set_explicit_lac(self, ledger_id: int, body: bytes) -> None:
        with self._cond:
            self._lock.check_open()
            data = self.known_ledger(ledger_id)
            self.put_ledger(ledger_id, _replace(data, explicit_lac=bytes(body)))

    def get_explicit_lac(self, ledger_id: int) -> bytes | None:
        with self._cond:
            return self.known_ledger(ledger_id).explicit_lac

    def set_limbo(self, ledger_id: int, limbo: bool) -> None:
        """Mark (or clear) the ledger *limbo*: this bookie may have lost entries of it
        (``bookie/integrity.py``). Durable at the next ``flush()``."""
        with self._cond:
            self._lock.check_open()
            self.put_ledger(ledger_id, _replace(self.known_ledger(ledger_id), limbo=limbo))

    def limbo_ledgers(self) -> list[int]:
        """The ledgers marked limbo, ascending."""
        with self._cond:
            return sorted(lid for lid, data in self.by_id.items() if data.limbo)


    def digest_seen(self, ledger_id: int, entry: BytesLike) -> int | None:
        """The keyless digest type ``entry`` verifies with (``DIGEST_NOT_CHECKABLE`` if none);
        None if the ledger is known not to be checkable (nothing left to learn)."""
        data = self.by_id.get(ledger_id)
        known = data.digest_type if data is not None else None
        if known == DIGEST_NOT_CHECKABLE:
            return None
        if known in _CHECKED_DIGESTS:
            assert known is not None
            return known if checksum_matches(entry, known) else DIGEST_NOT_CHECKABLE
        found = sniff_checksum(entry)
        return DIGEST_NOT_CHECKABLE if found is None else int(found)

    def learn_digest(self, ledger_id: int, entry_id: int, seen: int) -> None:
        """Record what an add showed of the ledger's keyless digest. Caller holds ``_cond``.

        The first checked add sets ``LedgerData.digest_type`` (durable with the entry, at the
        next flush; journal replay teaches it again). A later add that disagrees makes the
        ledger not checkable for good: an HMAC or DUMMY entry that matches a CRC by chance
        (2**-32) must not turn every later read of its ledger into a false alarm. After
        ``DIGEST_SAMPLE_ADDS`` agreeing adds the add path checks no more.
        """
        data = self.by_id.get(ledger_id)
        if data is None:
            return
        known = data.digest_type
        learnt = seen if known is None or known == seen else DIGEST_NOT_CHECKABLE
        if len(self.digest_samples) > 100_000:
            self.digest_samples.clear()  # bounded: a ledger forgotten here is merely sampled again
        samples = self.digest_samples.get(ledger_id, 0) + 1
        self.digest_samples[ledger_id] = DIGEST_SAMPLE_ADDS if learnt == DIGEST_NOT_CHECKABLE else samples
        if learnt != known:
            if known is not None:
                log.info("ledger %d: entry %d does not verify with the %s digest of its earlier entries; "
                         "its entries are no longer checked on reads", ledger_id, entry_id,
                         DigestType(known).name if known in _CHECKED_DIGESTS else known,
                         extra={"ledger_id": ledger_id, "entry_id": entry_id})
            self.put_ledger(ledger_id, _replace(data, digest_type=learnt))

    def checked_digest(self, ledger_id: int) -> int | None:
        """The CRC digest type the ledger's stored entries are verified with; None if they are
        not verifiable (HMAC or DUMMY, or not learnt). Lock-free: a dict read."""
        data = self.by_id.get(ledger_id)
        if data is None or data.digest_type not in _CHECKED_DIGESTS:
            return None
        return data.digest_type

    def read_digest(self, ledger_id: int) -> int | None:
        """The CRC digest type what is read of the ledger from an entry log is verified with
        before it is served or cached (``checked_digest``); None: not checked (not verifiable,
        or the check turned off by the ``_check_reads`` test flag)."""
        return self.checked_digest(ledger_id) if _check_reads else None

    def forget(self, ledger_id: int) -> LedgerData | None:
        """Drop a deleted ledger from memory; its data (None if unknown). Caller holds ``cond``
        and writes the tombstone with ``put_tombstone`` next."""
        return self.by_id.pop(ledger_id, None)

    def put_tombstone(self, ledger_id: int, old: LedgerData | None) -> None:
        """The deleted ledger's data becomes a fenced tombstone, so no later add recreates it
        (durable at the next flush)."""
        self.ledgers_index.put(
            ledger_id,
            LedgerData(exists=False, fenced=True, master_key=old.master_key if old is not None else b""),
        )


def _replace(data: LedgerData, **changes: object) -> LedgerData:
    return dataclasses.replace(data, **changes)  # type: ignore[arg-type]
