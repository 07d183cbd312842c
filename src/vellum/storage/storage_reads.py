"""The read path of one ledger storage: cache lookups, entry-log reads verified with the
ledger's keyless CRC, read-ahead, and the multi-entry reads of BATCH_READ and READ_STRIDED.

Order: write caches (active, then flushing, under the storage's ``cond``) -> read-ahead cache ->
location index -> entry log. An entry is in a write cache or in the location index at every
instant (the flush indexes it before the cache is dropped), so a reader never misses an added
entry. ``NoSuchEntryError`` is raised only for a known ledger whose entry is neither cached nor
indexed; an unknown ledger raises ``NoSuchLedgerError``; anything doubtful is a storage error.

One entry (``get_entry``): one pass, each step handing the entry to the next in the order it
travels: which entry (``-1``: the last one held), in memory (write caches, read-ahead cache),
else its location (index), its bytes (entry log, read once), verified once (the ledger's
digest, with the compaction re-check), then the read-ahead. Read-ahead: a miss that reads the
entry log also reads the window the read-ahead cache grants (``ReadAheadCache.claim``: up to
``read_ahead_batch_size`` following entries, at most ``read_ahead_max_bytes``) of the same
ledger (adjacent thanks to the sorted flush) and hands it back verified (``fill``), unless a
read-ahead of that ledger already covered the entry (pipelined readers miss on entries whose
read-ahead is still running: they must not each read the same range again).

Runs (``get_entries``, BATCH_READ; ``get_strided``, READ_STRIDED) are served at a cost per byte,
not per entry: cached runs are looked up under one lock hold and copied into one buffer; a run
stored one after the other in an entry log is read in few preads (``EntryLogReader.read_records``,
which checks the stored ledger and entry ids of every record), verified in one pass over the
read buffer (``format.entry.checksums_match``) and answered as slices of it. Nothing is cached:
the request names what is wanted, and a client spreading its chunks over the replicas would
make a read-ahead past the run wasted work.

Layout assumption of runs: an entry log record is ``[int32 size][entry]`` (big-endian,
``format/entrylog.py``) and a multi-entry reply carries each entry as ``[int32 len][entry]``
(``docs/protocol.md``): the same bytes. So records stored one after the other are answered as
the very bytes read (``proto.messages.PackedEntries``), and records with other entries between
them (a strided run) as those records joined.

Verification (defect D5 of docs/correctness.md): every entry of a ledger whose keyless digest
was learnt read from an entry log is verified before it is returned or enters the read-ahead
cache (the write cache holds what was received), with the digest the ledger data gives for reads
(``LedgerDataTable.read_digest``, ``storage/ledger_data.py``: the one place the simulator's
``serve-unchecked-reads`` regression turns the check off). A copy that fails raises
``CorruptEntryError`` (EIO, never "no such entry"), logged with its ledger, entry, log and
offset and counted in ``bookie_READ_ENTRY_CORRUPT`` where the copy is judged corrupt (in
``get_entry``, once); a multi-entry read returns the entries before it and stops, and the read
that starts at it gets the error (the client then reads that entry from another replica).
Compaction may move entries at any time: a single read whose copy fails locates the entry again
(the same loop: at most ``_LOCATE_ATTEMPTS`` lookups) and the copy is corrupt only if the index
still points there; a run is valid wherever it was read (the stored ids of each record are
checked, and compaction copies records as they are), and a run that cannot be read falls back to
``get_entry`` for its first entry.
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Iterator, Sequence

from vellum import stats
from vellum.errors import (
    CorruptEntryError,
    CorruptionError,
    IncorrectParameterError,
    NoSuchEntryError,
    NoSuchLedgerError,
    StorageError,
)
from vellum.format.entry import BytesLike, DigestType, checksum_matches, checksums_match
from vellum.format.entrylog import SIZE_FIELD
from vellum.ids import INVALID_ENTRY_ID, LAST_ADD_CONFIRMED, location_log_id, location_offset, make_location
from vellum.proto.messages import PackedEntries
from vellum.storage.entry_log_reader import RecordRun
from vellum.storage.entry_logger import EntryLogger
from vellum.storage.index import EntryLocationIndex
from vellum.storage.ledger_data import LedgerDataTable
from vellum.storage.read_ahead_cache import ReadAheadCache
from vellum.storage.storage_lock import StorageLock
from vellum.storage.write_cache import Stored, WriteCaches

# One ledger storage, one log name (what operators filter on), whichever part logs.
log = logging.getLogger("vellum.storage.ledger_storage")
_CORRUPT_READS = stats.counter(
    "bookie_READ_ENTRY_CORRUPT",
    "entries read back from an entry log that failed their checks (digest, stored ids, size): answered EIO",
    ("ledgerDir",),
)


#: lookups of an entry's location a single read makes at most: a copy that fails its checks is
#: located again (compaction may have moved it), and corrupt only where the index still points
_LOCATE_ATTEMPTS = 3


class StorageReader:
    """The read path of one ledger storage (see the module docstring)."""

    def __init__(self, lock: StorageLock, caches: WriteCaches, read_cache: ReadAheadCache,
                 entry_logger: EntryLogger, locations: EntryLocationIndex, data: LedgerDataTable) -> None:
        self._lock = lock
        self._cond = lock.cond
        self.ledger_dir = lock.ledger_dir
        self._caches = caches
        self._read_cache = read_cache
        self.entry_logger = entry_logger
        self.locations = locations
        self._data = data
        _CORRUPT_READS.labels(str(self.ledger_dir))  # exported as 0 from the start, not absent

    def get_entry(self, ledger_id: int, entry_id: int, *, read_ahead: bool = True,
                  report_corrupt: bool = True) -> Stored:
        """The stored entry; ``entry_id == -1`` means the last entry this storage holds.
        ``read_ahead=False``: a miss reads this entry only.

        One pass in the order the entry travels: which entry; in memory (a write cache, else
        the read-ahead cache); else where the index puts it, read from that entry log once and
        verified once (a copy that fails is located again: moved by compaction, it is read at
        its new place; still there, it is corrupt); then, for a forward reader, the run that
        follows it into the read-ahead cache. An entry read from an entry log that fails its
        checks (the ledger's learnt CRC digest, the stored ids, the size) raises
        ``CorruptEntryError`` (EIO, never "no such entry"), logged and counted in
        ``bookie_READ_ENTRY_CORRUPT`` unless ``report_corrupt=False`` (a multi-entry read that
        stops short before it: the entry is reported when asked for).
        """
        if entry_id == LAST_ADD_CONFIRMED:
            entry_id = self.get_last_entry_id(ledger_id)
            if entry_id == INVALID_ENTRY_ID:
                raise NoSuchEntryError(f"ledger {ledger_id} has no entry in {self.ledger_dir}")
        if entry_id < 0:
            raise IncorrectParameterError(f"entry id {entry_id} is not readable")
        # In memory.
        key = (ledger_id, entry_id)
        with self._cond:
            self._lock.check_open()
            found = self._caches.get(key)
            epoch = self._read_cache.epoch  # with the lookup: a delete after it drops the read-ahead
        if found is None:
            found = self._read_cache.get(key)
        if found is not None:
            return found
        # On disk: located, read once, checked once. A copy that fails its checks is located
        # again: compaction may have moved the entry (and deleted its old log) since the lookup.
        # Only a copy the index still points at is corrupt (rule 3 of docs/correctness.md).
        failed: int | None = None  # the location of the copy that failed its checks
        why = ""  # and why it failed
        for _attempt in range(_LOCATE_ATTEMPTS):
            location = self.locations.get_location(ledger_id, entry_id)
            if location is None:
                raise self._data.not_held(ledger_id, entry_id)
            if location == failed:
                path, offset = self.entry_logger.log_path(location_log_id(location)), location_offset(location)
                if report_corrupt:
                    _CORRUPT_READS.labels(str(self.ledger_dir)).inc()
                    log.error("corrupt entry: ledger %d entry %d in entry log %s at offset %d (location %d): %s; "
                              "answered EIO, another replica must serve it and re-replication replace this copy",
                              ledger_id, entry_id, path, offset, location, why,
                              extra={"ledger_id": ledger_id, "entry_id": entry_id})
                raise CorruptEntryError(f"ledger {ledger_id} entry {entry_id}: stored copy is corrupt ({why}) "
                                        f"in {path} at offset {offset}")
            try:
                entry = self.entry_logger.read_entry(ledger_id, entry_id, location)
            except CorruptionError as e:
                why = str(e)
            else:
                digest = self._data.read_digest(ledger_id)
                if digest is None or checksum_matches(entry, digest):
                    break
                why = f"{DigestType(digest).name} digest mismatch over {len(entry)} bytes"
            failed = location
        else:
            raise StorageError(f"ledger {ledger_id} entry {entry_id}: location kept changing")
        # Read ahead: the window the read-ahead cache grants a forward reader, read from right
        # after the entry and verified (only verified copies enter the cache: it is served
        # without checks, even on the loop); the run ends before a corrupt copy, which is
        # reported when asked for. A failed read-ahead reads nothing: it is an optimisation.
        window = self._read_cache.claim(ledger_id, entry_id) if read_ahead else None
        if window is not None:
            following: list[memoryview] = []
            try:
                run = self.entry_logger.read_records(
                    ledger_id, make_location(location_log_id(location),
                                             location_offset(location) + SIZE_FIELD + len(entry)),
                    first_entry_id=entry_id + 1, stride=1, max_entries=window[0], max_bytes=window[1],
                    first_counts=False)
            except (StorageError, CorruptionError):
                pass
            else:
                for buf, starts, ends, good in _verified(run, digest):
                    following.extend(buf[s:e] for s, e in zip(starts[:good], ends[:good]))
            self._read_cache.fill(ledger_id, entry_id, following, epoch)
        return entry

    def get_entries(self, ledger_id: int, first: int, max_count: int, max_bytes: int) -> PackedEntries:
        """Consecutive entries from ``first`` until a gap, ``max_count`` entries (``<= 0``: no
        bound) or ``max_bytes`` (``<= 0``: no bound; the first entry always counts): BATCH_READ.
        See ``get_strided``."""
        return self._multi_read(ledger_id, first, 1, max_count if max_count > 0 else 1 << 62, max_bytes)

    def get_strided(self, ledger_id: int, first: int, stride: int, max_count: int, max_bytes: int) -> PackedEntries:
        """Entries ``first, first + stride, ...`` (READ_STRIDED): at most ``max_count`` (at
        least one), within ``max_bytes`` (``<= 0``: no bound; the first always counts), until
        one is missing. Raises like ``get_entry`` for ``first`` (``NoSuchLedgerError``,
        ``NoSuchEntryError``, ``CorruptEntryError``); later misses and corrupt copies end the
        answer short (the client asks again from there and gets the error then).

        The answer is laid out as the reply frame carries it (``PackedEntries``, see the module
        docstring): runs of cached entries are copied into one buffer, runs stored one after
        the other in an entry log are served as slices of the read buffer. Nothing is read
        ahead or cached: the request names every entry it wants, and for a stride above 1 the
        ones in between are another bookie's to serve.
        """
        if stride < 1:
            raise IncorrectParameterError(f"READ_STRIDED of ledger {ledger_id}: stride {stride} must be >= 1")
        if max_count <= 0:  # a stride of 1 is a BATCH_READ: no bound
            max_count = 1 << 62 if stride == 1 else 1
        return self._multi_read(ledger_id, first, stride, max_count, max_bytes)

    def _multi_read(self, ledger_id: int, first: int, stride: int, limit: int, max_bytes: int) -> PackedEntries:
        """``get_entries`` and ``get_strided``: runs from the caches, then from the entry logs;
        where neither serves a run, one entry with ``get_entry``'s full checks and errors."""
        out = PackedEntries()
        eid = first
        while len(out) < limit:
            if len(out) and 0 < max_bytes <= out.entry_bytes:
                break
            took, full = self._cached_run(ledger_id, eid, stride, limit - len(out), max_bytes, out)
            if not took and not full:
                took, full = self._disk_run(ledger_id, eid, stride, limit - len(out), max_bytes, out)
            if full:
                break
            if took:
                eid += took * stride
                continue
            try:
                # A corrupt entry after others ends the answer short, unreported: the client
                # asks again from it and is answered EIO then (reported once).
                entry = self.get_entry(ledger_id, eid, read_ahead=False, report_corrupt=not len(out))
            except (NoSuchEntryError, NoSuchLedgerError, CorruptEntryError):
                if not len(out):
                    raise
                break
            if len(out) and 0 < max_bytes < out.entry_bytes + len(entry):
                break
            out.add(entry)
            eid += stride
        return out

    def _cached_run(self, ledger_id: int, entry_id: int, stride: int, most: int, max_bytes: int,
                    out: PackedEntries) -> tuple[int, bool]:
        """Entries ``entry_id, entry_id + stride, ...`` held by the write caches (looked up
        under one lock hold), else by the read-ahead cache, appended to ``out`` (copied after
        the lock is released): ``(how many, whether the byte bound stopped them)``."""
        found: Sequence[Stored]
        with self._cond:
            found = self._caches.get_run(ledger_id, entry_id, stride, most)
        if not found:
            found = self._read_cache.get_run(ledger_id, entry_id, stride, most)
            if not found:
                return 0, False
        full = False
        if max_bytes > 0:
            size = out.entry_bytes
            taken = 0
            for entry in found:
                if (len(out) or taken) and size + len(entry) > max_bytes:  # the first always counts
                    full = True
                    break
                size += len(entry)
                taken += 1
            found = found[:taken]
        out.add_all(found)
        return len(found), full

    def _disk_run(self, ledger_id: int, entry_id: int, stride: int, most: int, max_bytes: int,
                  out: PackedEntries) -> tuple[int, bool]:
        """Entries ``entry_id, entry_id + stride, ...`` stored one after the other in one entry
        log (with, for a stride above 1, only entries whose ids lie between them in between)
        from where the index puts ``entry_id``, verified and appended to ``out`` as slices of
        the read buffers: ``(how many, whether the byte bound stopped them)``. ``(0, False)``
        if it is not indexed or anything is off: the caller then reads that entry alone, with
        full checks. The run ends before an entry that fails the ledger's CRC digest
        (``get_entry`` reports it when a read starts there)."""
        with self._cond:
            self._lock.check_open()
        location = self.locations.get_location(ledger_id, entry_id)
        if location is None:
            return 0, False
        try:
            # The stored ids of every record are checked: a run read from a log compaction has
            # copied the entries out of since the lookup is still the ledger's entries.
            run = self.entry_logger.read_records(
                ledger_id, location, first_entry_id=entry_id, stride=stride, max_entries=most,
                max_bytes=max_bytes - out.entry_bytes if max_bytes > 0 else 0, first_counts=not len(out))
        except (StorageError, CorruptionError):
            return 0, False
        digest = self._data.read_digest(ledger_id)
        took = 0
        for buf, starts, ends, good in _verified(run, digest):
            if good:
                out.add_records(*_records_of(buf, starts, ends, good))
                took += good
            if good < len(starts):
                return took, False  # the run ends before a corrupt copy
        return took, run.full

    def get_cached_entry(self, ledger_id: int, entry_id: int) -> Stored | None:
        """The entry if a write cache or the read-ahead cache holds it, else None. Never touches
        the disk, so the server can answer it without a thread hop."""
        key = (ledger_id, entry_id)
        with self._cond:
            found = self._caches.get(key)
        if found is not None:
            return found
        return self._read_cache.get(key)

    def read_cache_contains(self, ledger_id: int, entry_id: int) -> bool:
        """Whether the read-ahead cache holds the entry (observability and tests)."""
        return self._read_cache.contains((ledger_id, entry_id))

    def get_last_entry_id(self, ledger_id: int) -> int:
        """Greatest entry id held (cached or indexed), -1 if none."""
        with self._cond:
            self._lock.check_open()
            last = self._caches.last_entry_id(ledger_id)
        indexed = self.locations.get_last_entry(ledger_id)
        if indexed is not None:
            last = max(last, indexed[0])
        return last

    def has_entry(self, ledger_id: int, entry_id: int) -> bool:
        key = (ledger_id, entry_id)
        with self._cond:
            if self._caches.contains(key):
                return True
        return self.locations.get_location(ledger_id, entry_id) is not None

    def entry_ids(self, ledger_id: int) -> list[int]:
        """Every entry id held for the ledger, ascending."""
        with self._cond:
            ids = self._caches.entry_ids(ledger_id)
        ids.update(self.locations.entry_ids(ledger_id))
        return sorted(ids)

    def entry_intact(self, ledger_id: int, entry: BytesLike) -> bool:
        """Whether a stored copy passes the checks reads apply (the ledger's learnt CRC digest;
        True when the ledger's entries are not checkable)."""
        digest = self._data.checked_digest(ledger_id)
        return digest is None or checksum_matches(entry, digest)


def _records_of(buf: memoryview, starts: array[int], ends: array[int], n: int) -> tuple[BytesLike, int, int]:
    """The first ``n`` records (size field and entry) at ``starts``/``ends`` of ``buf`` as one
    buffer, their count and their entries' bytes: a slice of ``buf`` where they lie one after
    the other (a BATCH_READ run), else a copy of each, joined (a strided run, with other
    entries between them)."""
    if n < len(starts):
        starts, ends = starts[:n], ends[:n]
    entry_bytes = sum(ends) - sum(starts)
    first, last = starts[0] - SIZE_FIELD, ends[-1]
    if last - first == entry_bytes + SIZE_FIELD * n:
        return buf[first:last], n, entry_bytes
    return b"".join([buf[s - SIZE_FIELD:e] for s, e in zip(starts, ends)]), n, entry_bytes


def _verified(run: RecordRun, digest: int | None) -> Iterator[tuple[memoryview, array[int], array[int], int]]:
    """The chunks of ``run`` with how many of their entries, from the first, pass the keyless
    ``digest`` check (all when it is None: not checkable): ``(buffer, starts, ends, good)``,
    ending with the chunk of the first entry that fails."""
    for buf, starts, ends in run.chunks:
        good = len(starts) if digest is None else checksums_match(buf, starts, ends, digest)
        yield buf, starts, ends, good
        if good < len(starts):
            return
