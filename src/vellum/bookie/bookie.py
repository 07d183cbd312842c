"""Bookie semantics over the storage engine: add, read, fence, LAC, explicit LAC, trim.

A ``Bookie`` composes parts that are testable alone: one ``Journal`` per journal dir, one
``LedgerStorage`` per ledger dir, a ``LedgerDirsManager`` and a ``Checkpointer``. A ledger maps
to journal ``ledger_id % len(journals)`` and to storage ``ledger_id % len(storages)``.

Invariants (design.md rules 1, 3, 4, 7):
- an add is acknowledged (its callback called without error) only after the journal fsync that
  covers it; the entry is put in the write cache before it is journaled, so a checkpoint mark
  taken after the journal write never skips it;
- the master key of a ledger is fixed by its first add or fence; a different key is refused;
- a fence is acknowledged only after the fence record is durable in the journal; once fenced,
  normal adds are refused (recovery adds are still accepted);
- a read-only bookie refuses normal adds but serves reads, fences and recovery adds;
- "no such entry" is answered only by the storage, which knows what it holds.

All methods are synchronous and thread-safe; durability is reported through callbacks that run
on journal threads. ``bookie/executor.py`` is the only place where results cross to asyncio.
"""

from __future__ import annotations

import logging
import shutil
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from vellum.config import ServerConfig
from vellum.errors import (
    IncorrectParameterError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnauthorizedAccessError,
    WriteOnReadOnlyBookieError,
)
from vellum.format.cookie import Cookie
from vellum.format.entry import BytesLike
from vellum.format.journal import JournalRecord, RecordKind
from vellum.format.lastmark import LogMark
from vellum.ids import INVALID_ENTRY_ID, LAST_ADD_CONFIRMED
from vellum.stats import callback_metric, gauge
from vellum.storage.checkpoint import Checkpointer, read_last_marks
from vellum.storage.cookies import check_or_stamp_cookies
from vellum.storage.dirs import LedgerDirsListener, LedgerDirsManager
from vellum.storage.gc import DiskState, GarbageCollectorThread, GcSettings, LedgerLister
from vellum.storage.journal import Journal
from vellum.storage.ledger_storage import LedgerStorage
from vellum.storage.markers import DirLock, acquire_dir_locks, mark_clean, mark_dirty

log = logging.getLogger(__name__)

Callback = Callable[[BaseException | None], None]
_IDS = struct.Struct(">qqq")  # ledgerId, entryId, lac: the first 24 bytes of a stored entry

_server_status = gauge("bookie_SERVER_STATUS", "1 = writable, 0 = read-only")


class _LedgerState:
    """What every add checks, cached so the hot path does one dict lookup: the master key and
    the fenced flag (both also persisted by ledger storage and the journal)."""

    __slots__ = ("fenced", "master_key")

    def __init__(self, master_key: bytes, fenced: bool) -> None:
        self.master_key = master_key
        self.fenced = fenced


@dataclass(frozen=True, slots=True)
class BookieInfo:
    total_disk_bytes: int
    free_disk_bytes: int


class _LacWaiters:
    """Per-ledger LAC as seen by this bookie, and callbacks waiting for it to pass a value."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lac: dict[int, int] = {}
        self._waiters: dict[int, list[tuple[int, Callable[[int], None]]]] = {}

    def get(self, ledger_id: int) -> int | None:
        return self._lac.get(ledger_id)

    def advance(self, ledger_id: int, lac: int) -> None:
        known = self._lac.get(ledger_id)
        if known is not None and lac <= known:
            return  # the common case (LAC unchanged or behind), without taking the lock
        fire: list[Callable[[int], None]] = []
        with self._lock:
            if lac <= self._lac.get(ledger_id, INVALID_ENTRY_ID - 1):
                return
            self._lac[ledger_id] = lac
            waiting = self._waiters.get(ledger_id)
            if waiting:
                keep = [(previous, fn) for previous, fn in waiting if lac <= previous]
                fire = [fn for previous, fn in waiting if lac > previous]
                if keep:
                    self._waiters[ledger_id] = keep
                else:
                    del self._waiters[ledger_id]
        for fn in fire:
            fn(lac)

    def watch(self, ledger_id: int, previous: int, fn: Callable[[int], None]) -> Callable[[], None]:
        """Call ``fn(lac)`` once the LAC passes ``previous`` (at once if it already has).
        Returns a function that cancels the watch."""
        with self._lock:
            current = self._lac.get(ledger_id, INVALID_ENTRY_ID - 1)
            if current <= previous:
                entry = (previous, fn)
                self._waiters.setdefault(ledger_id, []).append(entry)

                def cancel() -> None:
                    with self._lock:
                        lst = self._waiters.get(ledger_id)
                        if lst and entry in lst:
                            lst.remove(entry)
                            if not lst:
                                del self._waiters[ledger_id]

                return cancel
        fn(current)
        return lambda: None

    def forget(self, ledger_id: int) -> None:
        with self._lock:
            self._lac.pop(ledger_id, None)


class Bookie:
    """One bookie's semantics over journals + ledger storages. See the module docstring."""

    def __init__(
        self,
        *,
        journals: Sequence[Journal],
        storages: Sequence[LedgerStorage],
        dirs: LedgerDirsManager,
        checkpointer: Checkpointer,
        read_only_mode_enabled: bool = True,
        force_read_only: bool = False,
        gc_threads: Sequence[GarbageCollectorThread] = (),
    ) -> None:
        if not journals or not storages:
            raise IncorrectParameterError("a bookie needs at least one journal and one ledger storage")
        self._journals = list(journals)
        self._storages = list(storages)
        self._dirs = dirs
        self._checkpointer = checkpointer
        self._read_only_mode_enabled = read_only_mode_enabled
        self._forced_read_only = force_read_only
        self._disk_read_only = False
        self._key_lock = threading.Lock()
        self._ledger_state: dict[int, _LedgerState] = {}
        self._lacs = _LacWaiters()
        # Plain counters on the hot path, exported at scrape time.
        self.adds_total = 0
        self.reads_total = 0
        self.adds_rejected: dict[str, int] = {"readonly": 0, "fenced": 0, "deleted": 0}
        callback_metric("bookie_BOOKIE_ADD_ENTRY", "entries added to storage and journal",
                        lambda: {(): float(self.adds_total)})
        callback_metric("bookie_BOOKIE_READ_ENTRY", "entries read", lambda: {(): float(self.reads_total)})
        callback_metric("bookie_journal_JOURNAL_SYNC", "journal fsyncs",
                        lambda: {(str(j.index),): float(j.fsyncs_total) for j in self._journals},
                        labels=("journal",))
        callback_metric("bookie_journal_JOURNAL_SYNCED_RECORDS", "journal records covered by an fsync",
                        lambda: {(str(j.index),): float(j.records_synced_total) for j in self._journals},
                        labels=("journal",))
        callback_metric("bookie_BOOKIE_ADD_ENTRY_REJECTED", "adds refused",
                        lambda: {(k,): float(v) for k, v in self.adds_rejected.items()}, labels=("reason",))
        self._state_listeners: list[Callable[[bool], None]] = []
        self._gc_threads = list(gc_threads)  # one per ledger storage (issue 7)
        for gc in self._gc_threads:
            gc.on_ledger_deleted = self.forget_ledger
        self._update_read_only_gauge()

    # ----------------------------------------------------------------------------------- routing
    def _storage(self, ledger_id: int) -> LedgerStorage:
        return self._storages[ledger_id % len(self._storages)]

    def _journal(self, ledger_id: int) -> Journal:
        return self._journals[ledger_id % len(self._journals)]

    # ------------------------------------------------------------------------------------- state
    @property
    def is_read_only(self) -> bool:
        return self._forced_read_only or self._disk_read_only

    def set_forced_read_only(self, value: bool) -> None:
        """Admin switch (``/api/v1/bookie/state/readonly``)."""
        self._forced_read_only = value
        self._state_changed()

    def on_all_dirs_full(self) -> None:
        if not self._read_only_mode_enabled:
            # BookKeeper shuts the bookie down here; we fail stop on the next write instead.
            log.error("all ledger dirs are full and readOnlyModeEnabled=false")
        self._disk_read_only = True
        self._state_changed()

    def on_dir_writable(self) -> None:
        if self._disk_read_only and self._dirs.writable_dirs():
            self._disk_read_only = False
            self._state_changed()

    def add_state_listener(self, fn: Callable[[bool], None]) -> None:
        """``fn(read_only)`` is called whenever the bookie turns read-only or writable."""
        self._state_listeners.append(fn)

    def _state_changed(self) -> None:
        self._update_read_only_gauge()
        for fn in list(self._state_listeners):
            try:
                fn(self.is_read_only)
            except Exception:  # a listener must not break the storage path
                log.exception("bookie state listener failed")

    def _update_read_only_gauge(self) -> None:
        _server_status.set(0 if self.is_read_only else 1)

    # --------------------------------------------------------------------------------------- add
    def _ledger(self, ledger_id: int, master_key: bytes) -> _LedgerState:
        """The ledger's cached state after checking its master key. A ledger this bookie has
        not seen is created with that key, and the key is journaled, queued before anything
        else of the ledger so that replay always meets the key first."""
        state = self._ledger_state.get(ledger_id)
        if state is None:
            with self._key_lock:
                state = self._ledger_state.get(ledger_id)
                if state is None:
                    storage = self._storage(ledger_id)
                    stored = storage.get_master_key(ledger_id)
                    if stored is None:
                        storage.set_master_key(ledger_id, master_key)
                        self._journal(ledger_id).log_master_key(ledger_id, master_key, _ignore_ok)
                        stored = master_key
                    state = _LedgerState(stored, storage.is_fenced(ledger_id))
                    self._ledger_state[ledger_id] = state
        if state.master_key != master_key:
            raise UnauthorizedAccessError(f"wrong master key for ledger {ledger_id}")
        return state

    def _accept(self, entry: BytesLike, master_key: bytes, recovery: bool) -> tuple[Journal, int, int]:
        """Checks of an add and its write-cache put; returns (journal, ledger id, entry id).
        Raises for a refused add (nothing stored, nothing journaled)."""
        if len(entry) < 32:
            raise IncorrectParameterError(f"entry of {len(entry)} bytes is shorter than its 32-byte header")
        ledger_id, entry_id, lac = _IDS.unpack_from(entry)
        if ledger_id < 0 or entry_id < 0:
            raise IncorrectParameterError(f"invalid ids in add: ledger {ledger_id}, entry {entry_id}")
        if (self._forced_read_only or self._disk_read_only) and not recovery:
            self.adds_rejected["readonly"] += 1
            raise WriteOnReadOnlyBookieError(f"bookie is read-only; refused entry {ledger_id}:{entry_id}")
        try:
            state = self._ledger(ledger_id, master_key)
        except LedgerFencedError:
            # Only a deleted ledger (its tombstone) refuses here: logged, it is a writer that
            # has not learnt of the delete and would otherwise believe lost data durable.
            self.adds_rejected["deleted"] += 1
            log.warning("refused entry %d:%d: the ledger was deleted (fenced for good)", ledger_id, entry_id)
            raise
        if state.fenced and not recovery:
            self.adds_rejected["fenced"] += 1
            raise LedgerFencedError(f"ledger {ledger_id} is fenced; refused entry {entry_id}")
        journal = self._journals[ledger_id % len(self._journals)]
        # The write cache gets the entry before the journal does: a checkpoint mark taken after
        # the journal write can then never skip it.
        self._storages[ledger_id % len(self._storages)].add_entry(entry)
        self.adds_total += 1
        if lac >= 0:
            self._lacs.advance(ledger_id, lac)
        return journal, ledger_id, entry_id

    def add_entry(self, entry: bytes, master_key: bytes, callback: Callback, *, recovery: bool = False) -> None:
        """Add a stored entry (client entry bytes). Raises at once for refused adds; ``callback``
        runs after the journal fsync that covers the entry (or with the error that prevented it)."""
        journal, ledger_id, entry_id = self._accept(entry, master_key, recovery)
        journal.log_entry(ledger_id, entry_id, entry, callback)

    def add_entries(self, adds: Sequence[tuple[BytesLike, bytes, bool]], callback: Callback) -> list[BaseException | None]:
        """Add several entries ((entry, master key, recovery) each), as a connection delivers
        pipelined adds. Returns, per add, the error that refused it at once or None. ``callback``
        runs once, after the fsyncs covering every accepted add (with the first error if a
        journal failed), and not at all when every add was refused: one queue operation and one
        completion per batch and journal instead of one per entry."""
        refused: list[BaseException | None] = []
        per_journal: dict[int, list[BytesLike]] = {}
        for entry, master_key, recovery in adds:
            try:
                journal, _lid, _eid = self._accept(entry, master_key, recovery)
            except Exception as exc:
                refused.append(exc)
                continue
            refused.append(None)
            per_journal.setdefault(journal.index, []).append(entry)
        if not per_journal:
            return refused
        if len(per_journal) == 1:
            ((index, entries),) = per_journal.items()
            self._log_entries(self._journals[index], entries, callback)
            return refused
        # Several journals: the batch is durable when every journal's part is.
        remaining = [len(per_journal)]
        first_error: list[BaseException | None] = [None]
        lock = threading.Lock()

        def part_done(exc: BaseException | None) -> None:
            with lock:
                if exc is not None and first_error[0] is None:
                    first_error[0] = exc
                remaining[0] -= 1
                last = remaining[0] == 0
            if last:
                callback(first_error[0])

        for index, entries in per_journal.items():
            self._log_entries(self._journals[index], entries, part_done)
        return refused

    @staticmethod
    def _log_entries(journal: Journal, entries: list[BytesLike], callback: Callback) -> None:
        try:
            journal.log_entries(entries, callback)
        except Exception as exc:  # the journal took none of them (stopped or failed)
            callback(exc)

    # ------------------------------------------------------------------------------------- fence
    def fence_ledger(self, ledger_id: int, master_key: bytes, callback: Callback) -> None:
        """Fence a ledger; ``callback`` runs once the fence record is durable."""
        state = self._ledger(ledger_id, master_key)
        self._storage(ledger_id).set_fenced(ledger_id)
        state.fenced = True
        # Journal the fence even when it was fenced already: the earlier record may still be in
        # flight, and the answer must not come before a fence is durable.
        self._journal(ledger_id).log_fence(ledger_id, callback)

    def is_fenced(self, ledger_id: int) -> bool:
        state = self._ledger_state.get(ledger_id)
        return state.fenced if state is not None else self._storage(ledger_id).is_fenced(ledger_id)

    # -------------------------------------------------------------------------------------- read
    def read_entry(self, ledger_id: int, entry_id: int) -> bytes | memoryview:
        """Read one entry; ``entry_id == -1`` reads the last entry this bookie has."""
        storage = self._storage(ledger_id)
        self.reads_total += 1
        if entry_id == LAST_ADD_CONFIRMED:
            return storage.get_entry(ledger_id, LAST_ADD_CONFIRMED)
        return storage.get_entry(ledger_id, entry_id)

    def read_entries(self, ledger_id: int, first: int, max_count: int, max_bytes: int) -> list[bytes | memoryview]:
        """Consecutive entries from ``first`` until a gap or a bound (BATCH_READ; see
        ``LedgerStorage.get_entries``)."""
        got = self._storage(ledger_id).get_entries(ledger_id, first, max_count, max_bytes)
        self.reads_total += len(got)
        return got

    def read_strided(self, ledger_id: int, first: int, stride: int, max_count: int,
                     max_bytes: int) -> list[bytes | memoryview]:
        """Entries ``first, first + stride, ...`` until one is missing or a bound (READ_STRIDED;
        see ``LedgerStorage.get_strided``)."""
        got = self._storage(ledger_id).get_strided(ledger_id, first, stride, max_count, max_bytes)
        self.reads_total += len(got)
        return got

    def read_cached_entry(self, ledger_id: int, entry_id: int) -> bytes | memoryview | None:
        """The entry if it is in memory (write or read-ahead cache), without touching the disk."""
        if entry_id < 0:
            return None
        found = self._storages[ledger_id % len(self._storages)].get_cached_entry(ledger_id, entry_id)
        if found is not None:
            self.reads_total += 1
        return found

    def last_add_confirmed(self, ledger_id: int) -> int:
        """The LAC this bookie knows: the max of piggy-backed LACs and the explicit LAC."""
        lac = self._lacs.get(ledger_id)
        if lac is not None:
            return lac
        storage = self._storage(ledger_id)
        if not storage.ledger_exists(ledger_id):
            raise NoSuchLedgerError(f"ledger {ledger_id} not on this bookie")
        try:
            last = storage.get_entry(ledger_id, LAST_ADD_CONFIRMED)
            _lid, _eid, lac = _IDS.unpack_from(last)
        except NoSuchEntryError:
            lac = INVALID_ENTRY_ID
        self._lacs.advance(ledger_id, lac)
        return lac

    def watch_lac(self, ledger_id: int, previous_lac: int, fn: Callable[[int], None]) -> Callable[[], None]:
        """Long poll: ``fn(lac)`` once this bookie's LAC for the ledger passes ``previous_lac``."""
        try:
            self.last_add_confirmed(ledger_id)
        except NoSuchLedgerError:
            pass  # the writer may not have reached this bookie yet: wait for it
        return self._lacs.watch(ledger_id, previous_lac, fn)

    def entry_ids(self, ledger_id: int) -> list[int]:
        storage = self._storage(ledger_id)
        if not storage.ledger_exists(ledger_id):
            raise NoSuchLedgerError(f"ledger {ledger_id} not on this bookie")
        return list(storage.entry_ids(ledger_id))

    # ------------------------------------------------------------------------------ explicit LAC
    def write_explicit_lac(
        self, ledger_id: int, master_key: bytes, lac: int, lac_body: bytes, callback: Callback
    ) -> None:
        self._ledger(ledger_id, master_key)
        self._storage(ledger_id).set_explicit_lac(ledger_id, lac_body)
        if lac >= 0:
            self._lacs.advance(ledger_id, lac)
        self._journal(ledger_id).log_explicit_lac(ledger_id, lac_body, callback)

    def read_explicit_lac(self, ledger_id: int) -> bytes | None:
        storage = self._storage(ledger_id)
        if not storage.ledger_exists(ledger_id):
            raise NoSuchLedgerError(f"ledger {ledger_id} not on this bookie")
        return storage.get_explicit_lac(ledger_id)

    # ------------------------------------------------------------------------------ other ops
    def trim(self, ledger_id: int, master_key: bytes, end_entry_id: int) -> None:
        """Drop entries below ``end_entry_id`` from the index (named-ledger shrink with force)."""
        self._ledger(ledger_id, master_key)
        self._storage(ledger_id).trim(ledger_id, end_entry_id)

    def note_ledger_closed(self, ledger_id: int) -> None:
        """Advisory "ledger closed" from a client (seed 000: rotate its log at next checkpoint)."""
        self._storage(ledger_id).note_ledger_closed(ledger_id)

    @property
    def gc_threads(self) -> list[GarbageCollectorThread]:
        """The GC threads, one per ledger dir (admin: force GC, status, suspend/resume)."""
        return list(self._gc_threads)

    def delete_ledger(self, ledger_id: int) -> None:
        """Remove a ledger's entries and state (GC: the ledger is gone from metadata)."""
        with self._key_lock:
            self._ledger_state.pop(ledger_id, None)
            self._storage(ledger_id).delete_ledger(ledger_id)
        self._lacs.forget(ledger_id)

    def forget_ledger(self, ledger_id: int) -> None:
        """Drop the cached state of a ledger that GC removed from storage."""
        with self._key_lock:
            self._ledger_state.pop(ledger_id, None)
        self._lacs.forget(ledger_id)

    def ledgers(self) -> list[int]:
        out: set[int] = set()
        for storage in self._storages:
            out.update(storage.ledgers())
        return sorted(out)

    def info(self) -> BookieInfo:
        total = free = 0
        seen: set[int] = set()
        for d in self._dirs.dirs:
            usage = shutil.disk_usage(d)
            dev = Path(d).stat().st_dev
            if dev in seen:
                continue
            seen.add(dev)
            total += usage.total
            free += usage.free
        return BookieInfo(total, free)

    # ------------------------------------------------------------------------------- lifecycle
    def checkpoint(self) -> list[LogMark]:
        return self._checkpointer.checkpoint_now()

    def checkpoint_marks(self) -> list[LogMark]:
        """The journal marks most recently persisted in the ledger dirs."""
        return self._checkpointer.persisted_marks

    def shutdown(self) -> None:
        """Clean shutdown: stop checkpoints, drain journals, final checkpoint, close storages."""
        for gc in self._gc_threads:  # GC first: it writes entry logs and the index
            gc.stop()
        self._checkpointer.stop()
        self._dirs.stop()
        for journal in self._journals:
            journal.shutdown()
        try:
            self._checkpointer.checkpoint_now()
        finally:
            for storage in self._storages:
                storage.close()


def _ignore_ok(exc: BaseException | None) -> None:
    if exc is not None:
        log.error("journal write of a ledger master key failed: %s", exc)


# ------------------------------------------------------------------------------------------------
# Building a bookie from its configuration


@dataclass
class OpenedBookie:
    """A started bookie and what opening it found; ``close()`` is the clean shutdown."""

    bookie: Bookie
    cookie: Cookie
    unclean_shutdown: bool
    replayed_records: int
    _locks: list[DirLock]
    _ledger_dirs: list[Path]

    def close(self) -> None:
        try:
            self.bookie.shutdown()
            mark_clean(self._ledger_dirs)
        finally:
            for lock in self._locks:
                lock.release()


def open_bookie(
    config: ServerConfig,
    *,
    bookie_id: str,
    instance_id: str | None = None,
    progress: Callable[[str], None] | None = None,
    ledger_lister: LedgerLister | None = None,
    gc_step_hook: Callable[[str], None] | None = None,
    store_cookie: Cookie | None = None,
) -> OpenedBookie:
    """Lock the dirs, check cookies, open storage, replay journals from ``lastMark``, start.

    ``ledger_lister`` gives GC its view of the metadata store (the composition root adapts
    ``meta``); without it GC never deletes ledgers but still collects entry logs of ledgers
    deleted locally. ``gc_step_hook`` is called at each compaction step (crash tests).
    ``store_cookie`` is the metadata store's copy of this bookie's cookie: with it, a bookie
    whose every disk lost its cookie refuses to start (design rule 6)."""
    say = progress or (lambda _msg: None)
    journal_dirs = [Path(d) for d in config.journal_directories]
    ledger_dirs = [Path(d) for d in config.ledger_directories]
    index_dirs = [Path(d) for d in config.effective_index_directories]
    if len(index_dirs) != len(ledger_dirs):
        raise IncorrectParameterError("indexDirectories must list as many dirs as ledgerDirectories")
    all_dirs = list(dict.fromkeys(journal_dirs + ledger_dirs + index_dirs))
    for d in all_dirs:
        d.mkdir(parents=True, exist_ok=True)
    locks = acquire_dir_locks(all_dirs)
    try:
        cookie = check_or_stamp_cookies(
            bookie_id,
            journal_dirs,
            ledger_dirs,
            [Path(d) for d in config.index_directories],
            instance_id,
            allow_storage_expansion=config.allow_storage_expansion,
            store_cookie=store_cookie,
        )
        unclean = mark_dirty(ledger_dirs)
        dirs = LedgerDirsManager(
            ledger_dirs,
            usage_threshold=config.disk_usage_threshold,
            warn_threshold=config.disk_usage_warn_threshold,
            lwm_threshold=config.disk_usage_lwm_threshold,
        )
        dirs.check()
        per_dir_cache = config.db_storage_write_cache_max_size_mb * 1024 * 1024 // len(ledger_dirs)
        per_dir_read = config.db_storage_read_ahead_cache_max_size_mb * 1024 * 1024 // len(ledger_dirs)
        storages = [
            LedgerStorage(
                ld,
                idx,
                log_size_limit=config.log_size_limit_bytes,
                write_cache_max_bytes=per_dir_cache,
                read_cache_max_bytes=per_dir_read,
                read_ahead_batch_size=config.db_storage_read_ahead_cache_batch_size,
                read_ahead_max_bytes=config.db_storage_read_ahead_cache_batch_bytes_size,
                max_throttle_time_ms=config.db_storage_max_throttle_time_ms,
                flush_entrylog_bytes=config.flush_entrylog_bytes,
                preallocate=config.entry_log_file_preallocation_enabled,
                entry_log_per_ledger=config.entry_log_per_ledger_enabled,
                max_active_entry_logs=config.maximum_number_of_active_entry_logs,
                entry_log_map_expiry_s=config.entrylog_map_access_expiry_time_s,
            )
            for ld, idx in zip(ledger_dirs, index_dirs)
        ]
        journals = [
            Journal(
                jd,
                index=i,
                max_group_wait_ms=config.journal_max_group_wait_ms,
                buffered_writes_threshold=config.journal_buffered_writes_threshold_bytes,
                buffered_entries_threshold=config.journal_buffered_entries_threshold,
                flush_when_queue_empty=config.journal_flush_when_queue_empty,
                max_size_mb=config.journal_max_size_mb,
                max_backups=config.journal_max_backups,
                prealloc_size_mb=config.journal_pre_alloc_size_mb,
                alignment=config.journal_alignment_size_bytes,
                format_version=config.journal_format_version_to_write,
                sync_data=config.journal_sync_data,
                queue_size=config.journal_queue_size,
                write_buffer_size_kb=config.journal_write_buffer_size_kb,
                remove_from_page_cache=config.journal_remove_from_page_cache,
            )
            for i, jd in enumerate(journal_dirs)
        ]
        marks = read_last_marks(ledger_dirs, len(journals))
        replayed = 0
        for journal, mark in zip(journals, marks):
            say(f"replaying journal {journal.journal_dir} from {mark}")
            replayed += _replay_into(journal, mark, storages)
        checkpointer = Checkpointer(journals, storages, dirs, initial_marks=marks)
        gc_threads = _make_gc_threads(config, storages, dirs, ledger_lister, gc_step_hook)
        bookie = Bookie(
            journals=journals,
            storages=storages,
            dirs=dirs,
            checkpointer=checkpointer,
            read_only_mode_enabled=config.read_only_mode_enabled,
            force_read_only=config.force_read_only_bookie,
            gc_threads=gc_threads,
        )
        dirs.add_listener(_DirsListener(bookie))
        dirs.add_listener(_EntryLogRotationOnFullDir(storages))
        for journal in journals:
            journal.start()
        if dirs.all_full():
            bookie.on_all_dirs_full()
        checkpointer.start(config.flush_interval_ms)
        dirs.start(config.disk_check_interval_ms)
        for gc in gc_threads:
            gc.start()
        say(f"bookie ready ({replayed} journal records replayed)")
        return OpenedBookie(bookie, cookie, unclean, replayed, locks, ledger_dirs)
    except BaseException:
        for lock in locks:
            lock.release()
        raise


class _DirsListener(LedgerDirsListener):
    def __init__(self, bookie: Bookie) -> None:
        self._bookie = bookie

    def on_dir_full(self, _dir: Path) -> None:
        pass

    def on_dir_writable(self, _dir: Path) -> None:
        self._bookie.on_dir_writable()

    def on_all_full(self) -> None:
        self._bookie.on_all_dirs_full()

    def on_any_writable(self) -> None:
        self._bookie.on_dir_writable()


# ------------------------------------------------------------------------------------------------
# GC wiring (issue 7): one GC thread per ledger storage, plain config values


def _make_gc_threads(
    config: ServerConfig,
    storages: Sequence[LedgerStorage],
    dirs: LedgerDirsManager,
    lister: LedgerLister | None,
    step_hook: Callable[[str], None] | None,
) -> list[GarbageCollectorThread]:
    settings = GcSettings(
        gc_wait_time_ms=config.gc_wait_time_ms,
        minor_compaction_interval_s=config.minor_compaction_interval_s,
        minor_compaction_threshold=config.minor_compaction_threshold,
        major_compaction_interval_s=config.major_compaction_interval_s,
        major_compaction_threshold=config.major_compaction_threshold,
        minor_compaction_max_time_ms=config.minor_compaction_max_time_ms,
        major_compaction_max_time_ms=config.major_compaction_max_time_ms,
        compaction_rate_by_entries=config.compaction_rate_by_entries,
        compaction_rate_by_bytes=config.compaction_rate_by_bytes,
        is_throttle_by_bytes=config.is_throttle_by_bytes,
        is_force_gc_allow_when_no_space=config.is_force_gc_allow_when_no_space,
        force_allow_compaction=config.force_allow_compaction,
    )
    warn = config.disk_usage_warn_threshold

    def disk_state_of(ledger_dir: Path) -> Callable[[], DiskState]:
        def state() -> DiskState:
            if not dirs.is_writable(ledger_dir):
                return DiskState.FULL
            return DiskState.WARN if dirs.usage(ledger_dir) > warn else DiskState.OK

        return state

    return [
        GarbageCollectorThread(
            storage,
            settings,
            lister=lister,
            disk_state=disk_state_of(storage.ledger_dir),
            index=i,
            dir_count=len(storages),
            step_hook=step_hook,
        )
        for i, storage in enumerate(storages)
    ]


class _EntryLogRotationOnFullDir(LedgerDirsListener):
    """Seed 000: when a ledger dir fills, seal every active entry log in it."""

    def __init__(self, storages: Sequence[LedgerStorage]) -> None:
        self._storages = {s.ledger_dir: s for s in storages}

    def on_dir_full(self, dir: Path) -> None:
        storage = self._storages.get(Path(dir))
        if storage is not None and storage.entry_logger.entry_log_per_ledger:
            try:
                storage.rotate_entry_logs()
            except Exception:
                log.exception("sealing the entry logs of full ledger dir %s failed", dir)


def _replay_into(journal: Journal, mark: LogMark, storages: Sequence[LedgerStorage]) -> int:
    """Re-apply journal records after ``mark`` to ledger storage (idempotent)."""
    count = 0

    def apply(record: JournalRecord) -> None:
        nonlocal count
        storage = storages[record.ledger_id % len(storages)]
        kind = record.kind
        if kind in (RecordKind.ENTRY, RecordKind.MASTER_KEY) and storage.is_deleted(record.ledger_id):
            # GC deleted the ledger after these records were journaled, and its tombstone is
            # durable: the delete is final (the metadata is gone), and bringing the ledger back
            # would let a stale writer's next add recreate it.
            log.info("journal replay: %s record %d:%d of deleted ledger skipped",
                     kind.name, record.ledger_id, record.entry_id)
        elif kind is RecordKind.ENTRY:
            # A ledger's key record precedes its first entry in the journal; an entry whose
            # ledger has no key here lost its key record (an index rebuild, or a delete whose
            # tombstone never reached the disk before a machine crash). It is restored
            # all the same (never drop a journaled entry): the next add's key is adopted.
            if storage.get_master_key(record.ledger_id) is None:
                log.info("journal replay: entry %d:%d of a ledger with no master key (deleted by GC?)",
                         record.ledger_id, record.entry_id)
            storage.add_entry(bytes(record.data))
        elif kind is RecordKind.MASTER_KEY:
            if storage.get_master_key(record.ledger_id) is None:
                storage.set_master_key(record.ledger_id, bytes(record.data))
        elif kind in (RecordKind.FENCE, RecordKind.EXPLICIT_LAC):
            # The ledger's key record comes before these, so a ledger missing here was deleted
            # after them (the delete is durable in the index, the journal keeps no deletes).
            # Skipped, as BookKeeper skips deleted ledgers: fencing it again would fail the
            # start, and bringing it back would undo the delete.
            if not storage.ledger_exists(record.ledger_id):
                log.info("journal replay: %s record of deleted ledger %d skipped", kind.name, record.ledger_id)
            elif kind is RecordKind.FENCE:
                storage.set_fenced(record.ledger_id)
            else:
                storage.set_explicit_lac(record.ledger_id, bytes(record.data))
        count += 1

    journal.replay(mark, apply)
    return count
