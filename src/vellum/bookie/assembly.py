"""Building one bookie from its configuration: the composition of a ``Bookie`` (layer L3).

Responsibility: from a ``ServerConfig``, lock the journal, ledger and index dirs, check or
stamp the cookies, open one ``LedgerStorage`` per ledger dir and one ``Journal`` per journal
dir, replay every journal from its ``lastMark`` into storage, and start the bookie's threads
(journals, checkpoint, disk checks, one GC thread per ledger dir). Everything below this module
takes plain values; this is the one place that reads the configuration for them.

Invariants:
- journals are replayed into storage before the ``Bookie`` exists, so no add, read or fence
  is served from a storage that has not caught up with its journal (rule 1 of docs/correctness.md);
- a journaled entry or key of a ledger whose deletion is durable (its tombstone) is not brought
  back by replay; a fence or explicit LAC of a ledger no longer in storage is skipped;
- a bookie whose every disk lost its cookie, while the metadata store still has it, refuses to
  start (rule 6 of docs/correctness.md, ``store_cookie``), and so does one with a wiped dir, unless
  ``dataIntegrityChecking`` and ``dataIntegrityStampMissingCookies``: then the cookies are
  stamped over and ``OpenedBookie.integrity_check_needed`` says why; the composition root must
  mark the bookie's ledgers limbo (``bookie/integrity.py``) before it serves anything (rule 12 of docs/correctness.md).
  The need survives a crash (``INTEGRITY_CHECK_NEEDED`` in the ledger dirs); a bookie that
  finds it with ``dataIntegrityChecking=false`` refuses to start. With
  ``dataIntegrityChecking`` and ``journalSyncData=false``, an unclean shutdown is a need too
  (acknowledged entries may not have reached the disk);
- the dir locks are held from the start of ``open_bookie`` until ``OpenedBookie.close()``, and
  released if opening fails.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vellum.bookie.bookie import Bookie, MasterKeyCheck
from vellum.bookie.metrics import BookieMetrics, process_bookie_metrics
from vellum.bookie.routing import LedgerRouter
from vellum.config import ServerConfig
from vellum.errors import CookieError, IncorrectParameterError
from vellum.format.cookie import Cookie
from vellum.format.journal import JournalRecord, RecordKind
from vellum.format.lastmark import ZERO_MARK, LogMark
from vellum.storage.checkpoint import Checkpointer, read_last_marks
from vellum.storage.cookies import check_cookies
from vellum.storage.dirs import DiskUsageFn, LedgerDirsListener, LedgerDirsManager
from vellum.storage.durable import FileOps
from vellum.storage.gc import DiskState, GarbageCollectorThread, GcSettings, LedgerLister
from vellum.storage.index import IndexOps
from vellum.storage.journal import Journal
from vellum.storage.ledger_storage import LedgerStorage
from vellum.storage.markers import (
    DirLock,
    acquire_dir_locks,
    clear_integrity_check_needed,
    integrity_check_needed,
    mark_clean,
    mark_dirty,
    mark_integrity_check_needed,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BookieRuntime:
    """What a bookie's storage takes from its surroundings: its threads and its clocks.

    In production (``PRODUCTION``) every loop runs on its own thread (journal writer and
    force-write, write-cache flush, checkpoint, disk checks, GC) on the real clocks. The
    simulator opens the same bookie with ``threads=False`` and its loop's virtual clocks: then
    nothing runs by itself, and the caller drives the steps those threads would run
    (``Journal.commit``, ``Bookie.checkpoint``, ``LedgerDirsManager.check``,
    ``GarbageCollectorThread.run_once``) at times of its choosing. ``disk_usage`` (None: the
    file system's) fixes what the disk checks see; ``file_ops`` (None: the OS's) are the system
    calls the journals and entry logs write and fsync through, and ``index_ops`` (None:
    RocksDB's own) the writes and WAL syncs of the RocksDB indexes (the simulator's power loss)."""

    threads: bool = True
    monotonic: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    disk_usage: DiskUsageFn | None = None
    file_ops: FileOps | None = None
    index_ops: IndexOps | None = None


PRODUCTION = BookieRuntime()


@dataclass
class OpenedBookie:
    """A started bookie and what opening it found; ``close()`` is the clean shutdown."""

    bookie: Bookie
    cookie: Cookie
    unclean_shutdown: bool
    replayed_records: int
    _locks: list[DirLock]
    _ledger_dirs: list[Path]
    #: why this bookie may have lost data and must mark its ledgers limbo before it serves
    #: (None: nothing lost); ``integrity_marking_done()`` once the marking is durable
    integrity_check_needed: str | None = None

    def integrity_marking_done(self) -> None:
        """Every ledger the bookie may have held is limbo and durable: drop the marker."""
        clear_integrity_check_needed(self._ledger_dirs)
        self.integrity_check_needed = None

    def abandon(self) -> None:
        """kill -9 of a bookie opened with ``BookieRuntime(threads=False)``: nothing is flushed
        or marked clean (``Bookie.abandon``), and the dir locks go as the OS drops them."""
        try:
            self.bookie.abandon()
        finally:
            for lock in self._locks:
                lock.release()

    def close(self) -> None:
        try:
            self.bookie.shutdown()
            mark_clean(self._ledger_dirs)
        finally:
            for lock in self._locks:
                lock.release()


def journal_from_config(config: ServerConfig, journal_dir: Path, *, index: int = 0, **overrides: Any) -> Journal:
    """The journal of ``journal_dir`` as ``config`` sets it up (``overrides``: Journal keywords
    that win, e.g. for a benchmark); not started."""
    kwargs: dict[str, Any] = dict(
        index=index,
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
        sync_in_writer=not config.journal_force_write_thread,
        direct_io=config.journal_direct_io,
    )
    kwargs.update(overrides)
    return Journal(journal_dir, **kwargs)


def open_bookie(
    config: ServerConfig,
    *,
    bookie_id: str,
    instance_id: str | None = None,
    progress: Callable[[str], None] | None = None,
    ledger_lister: LedgerLister | None = None,
    gc_step_hook: Callable[[str], None] | None = None,
    store_cookie: Cookie | None = None,
    metrics: BookieMetrics | None = None,
    master_key_check: MasterKeyCheck | None = None,
    runtime: BookieRuntime = PRODUCTION,
) -> OpenedBookie:
    """Lock the dirs, check cookies, open storage, replay journals from ``lastMark``, start.

    ``ledger_lister`` gives GC its view of the metadata store (the composition root adapts
    ``meta``); without it GC never deletes ledgers but still collects entry logs of ledgers
    deleted locally. ``gc_step_hook`` is called at each compaction step (crash tests).
    ``store_cookie`` is the metadata store's copy of this bookie's cookie: with it, a bookie
    whose every disk lost its cookie refuses to start (rule 6 of docs/correctness.md). ``metrics`` exports the
    bookie's counts (default: the process's, on the registry the admin HTTP server exports).
    ``master_key_check`` checks the master key of a ledger the bookie has not seen against the
    ledger's metadata before it is set (``Bookie``; the composition root adapts ``meta``).
    ``runtime``: threads or driven steps, and the clocks (``BookieRuntime``)."""
    say = progress or (lambda _msg: None)
    journal_dirs = [Path(d) for d in config.journal_directories]
    ledger_dirs = [Path(d) for d in config.ledger_directories]
    index_dirs = [Path(d) for d in config.effective_index_directories]
    if len(index_dirs) != len(ledger_dirs):
        raise IncorrectParameterError("indexDirectories must list as many dirs as ledgerDirectories")
    all_dirs = list(dict.fromkeys(journal_dirs + ledger_dirs + index_dirs))
    for d in all_dirs:
        d.mkdir(parents=True, exist_ok=True)
    bookie_metrics = metrics if metrics is not None else process_bookie_metrics()
    bookie: Bookie | None = None
    locks = acquire_dir_locks(all_dirs)
    try:
        checked = check_cookies(
            bookie_id,
            journal_dirs,
            ledger_dirs,
            [Path(d) for d in config.index_directories],
            instance_id,
            allow_storage_expansion=config.allow_storage_expansion,
            store_cookie=store_cookie,
            stamp_missing=config.data_integrity_checking and config.data_integrity_stamp_missing_cookies,
        )
        cookie = checked.cookie
        unclean = mark_dirty(ledger_dirs)
        if config.data_integrity_checking and unclean and not config.journal_sync_data:
            mark_integrity_check_needed(
                ledger_dirs, "unclean shutdown with journalSyncData=false: acknowledged entries may be lost")
        integrity_need = integrity_check_needed(ledger_dirs)
        if integrity_need is not None and not config.data_integrity_checking:
            raise CookieError(
                f"this bookie may have lost acknowledged data ({integrity_need}) and has not yet marked its "
                "ledgers limbo (INTEGRITY_CHECK_NEEDED in its ledger dirs): start it with "
                "dataIntegrityChecking=true so that it answers 'unknown' for them and copies them back"
            )
        dirs = LedgerDirsManager(
            ledger_dirs,
            usage_threshold=config.disk_usage_threshold,
            warn_threshold=config.disk_usage_warn_threshold,
            lwm_threshold=config.disk_usage_lwm_threshold,
            **({"disk_usage": runtime.disk_usage} if runtime.disk_usage is not None else {}),
        )
        dirs.check()
        write_cache = config.write_cache_max_bytes(memory_limit_bytes())
        say(f"write cache {write_cache // (1024 * 1024)} MiB over {len(ledger_dirs)} ledger dir(s)")
        per_dir_cache = write_cache // len(ledger_dirs)
        per_dir_read = config.db_storage_read_ahead_cache_max_size_mb * 1024 * 1024 // len(ledger_dirs)
        per_dir_direct_buffer = (
            config.db_storage_direct_io_entry_logger_total_write_buffer_size_mb * 1024 * 1024 // len(ledger_dirs)
        )
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
                direct_io=config.db_storage_direct_io_entry_logger,
                direct_write_buffer_size=per_dir_direct_buffer,
                entry_log_clock=runtime.monotonic,
                flush_thread=runtime.threads,
                file_ops=runtime.file_ops,
                index_ops=runtime.index_ops,
            )
            for ld, idx in zip(ledger_dirs, index_dirs)
        ]
        stepped: dict[str, Any] = {} if runtime.threads else {"prealloc_zero": False}
        if runtime.file_ops is not None:
            stepped.update(file_ops=runtime.file_ops, fsync=runtime.file_ops.fsync)
        journals = [
            journal_from_config(config, jd, index=i, clock=runtime.monotonic, wall_clock=runtime.wall, **stepped)
            for i, jd in enumerate(journal_dirs)
        ]
        marks = read_last_marks(ledger_dirs, len(journals))
        # A journal dir stamped over lost its journals: nothing to replay there, and the marks
        # the ledger dirs keep for it name files that are gone.
        marks = [ZERO_MARK if str(jd) in checked.stamped_over else m for jd, m in zip(journal_dirs, marks)]
        replayed = 0
        router = LedgerRouter(storages, dirs.is_writable)
        for journal, mark in zip(journals, marks):
            say(f"replaying journal {journal.journal_dir} from {mark}")
            replayed += _replay_into(journal, mark, router)
        checkpointer = Checkpointer(journals, storages, dirs, initial_marks=marks, clock=runtime.monotonic)
        gc_threads = _make_gc_threads(config, storages, dirs, ledger_lister, gc_step_hook, runtime)
        bookie = Bookie(
            router=router,
            journals=journals,
            storages=storages,
            dirs=dirs,
            checkpointer=checkpointer,
            metrics=bookie_metrics,
            read_only_mode_enabled=config.read_only_mode_enabled,
            force_read_only=config.force_read_only_bookie,
            gc_threads=gc_threads,
            master_key_check=master_key_check,
        )
        dirs.add_listener(_DirsListener(bookie))
        dirs.add_listener(_EntryLogRotationOnFullDir(storages))
        for journal in journals:
            if runtime.threads:
                journal.start()
            else:
                journal.start(threads=False)
        if dirs.all_full():
            bookie.on_all_dirs_full()
        if runtime.threads:
            checkpointer.start(config.flush_interval_ms)
            dirs.start(config.disk_check_interval_ms)
            for gc in gc_threads:
                gc.start()
        say(f"bookie ready ({replayed} journal records replayed)")
        return OpenedBookie(bookie, cookie, unclean, replayed, locks, ledger_dirs, integrity_need)
    except BaseException:
        if bookie is not None:
            bookie_metrics.untrack(bookie)  # it never started: no metrics of a bookie that is not there
        for lock in locks:
            lock.release()
        raise


def memory_limit_bytes() -> int:
    """The memory this process may use: its cgroup's limit (v2, else v1) if one is set, else
    the machine's physical memory (the base of ``dbStorage_writeCacheMaxSizeMb=0``)."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            return min(physical, int(text))
    return physical


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
# GC wiring (docs/gc.md): one GC thread per ledger storage, plain config values


def gc_settings(config: ServerConfig) -> GcSettings:
    """The GC thread's settings: the configuration's GC and compaction keys, as plain values."""
    return GcSettings(
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


def _make_gc_threads(
    config: ServerConfig,
    storages: Sequence[LedgerStorage],
    dirs: LedgerDirsManager,
    lister: LedgerLister | None,
    step_hook: Callable[[str], None] | None,
    runtime: BookieRuntime,
) -> list[GarbageCollectorThread]:
    settings = gc_settings(config)
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
            clock=runtime.wall,
            monotonic=runtime.monotonic,
            sleep=runtime.sleep,
        )
        for i, storage in enumerate(storages)
    ]


class _EntryLogRotationOnFullDir(LedgerDirsListener):
    """Requirement R1 of docs/correctness.md: when a ledger dir fills, seal every active entry log in it."""

    def __init__(self, storages: Sequence[LedgerStorage]) -> None:
        self._storages = {s.ledger_dir: s for s in storages}

    def on_dir_full(self, dir: Path) -> None:
        storage = self._storages.get(Path(dir))
        if storage is not None and storage.entry_logger.entry_log_per_ledger:
            try:
                storage.rotate_entry_logs()
            except Exception:
                log.exception("sealing the entry logs of full ledger dir %s failed", dir)


def _replay_into(journal: Journal, mark: LogMark, router: LedgerRouter) -> int:
    """Re-apply journal records after ``mark`` to ledger storage (idempotent), each to the
    storage that holds its ledger (rule 13 of docs/correctness.md: a ledger dir added since must not take them)."""
    count = 0

    def apply(record: JournalRecord) -> None:
        nonlocal count
        storage = router.storage_of(record.ledger_id)
        kind = record.kind
        if kind in (RecordKind.ENTRY, RecordKind.MASTER_KEY) and storage.is_deleted(record.ledger_id):
            # GC deleted the ledger after these records were journaled, and its tombstone is
            # durable: the delete is final (the metadata is gone), and bringing the ledger back
            # would let a stale writer's next add recreate it.
            log.info("journal replay: %s record %d:%d of deleted ledger skipped",
                     kind.name, record.ledger_id, record.entry_id,
                     extra={"ledger_id": record.ledger_id, "entry_id": record.entry_id})
        elif kind is RecordKind.ENTRY:
            # A ledger's key record precedes its first entry in the journal; an entry whose
            # ledger has no key here lost its key record (an index rebuild, or a delete whose
            # tombstone never reached the disk before a machine crash). It is restored
            # all the same (never drop a journaled entry): the next add's key is adopted.
            if storage.get_master_key(record.ledger_id) is None:
                log.info("journal replay: entry %d:%d of a ledger with no master key (deleted by GC?)",
                         record.ledger_id, record.entry_id,
                         extra={"ledger_id": record.ledger_id, "entry_id": record.entry_id})
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
                log.info("journal replay: %s record of deleted ledger %d skipped", kind.name, record.ledger_id,
                         extra={"ledger_id": record.ledger_id})
            elif kind is RecordKind.FENCE:
                storage.set_fenced(record.ledger_id)
            else:
                storage.set_explicit_lac(record.ledger_id, bytes(record.data))
        count += 1

    journal.replay(mark, apply)
    return count
