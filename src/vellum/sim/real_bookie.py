"""The real bookie in the simulator: ``bookie/bookie.py`` and its storage, driven by virtual time.

Responsibility: stand where ``bookie/executor.py``'s ``AsyncBookie`` stands (the processors'
only view of a bookie) with the real ``Bookie`` below it: the real ``Journal`` with group
commit, the real ``LedgerStorage`` (write cache, entry logs, the RocksDB index), checkpoints,
GC and compaction, cookies and journal replay at start, on real files in a directory of the
run. ``open_bookie`` opens it with ``BookieRuntime(threads=False)`` and the loop's clocks, so
no thread runs; what the threads would do, this adapter does from loop callbacks at seeded
virtual times:

- the journal's group commit (``Journal.commit``): ``group_wait_s`` plus a seeded fsync latency
  after the first record queued since the last commit (the writer thread's group wait);
- a checkpoint (``Bookie.checkpoint``: write caches flushed to entry logs and the index, the
  journal mark persisted, old journals removed) every ``checkpoint_s`` (the sync thread);
- a GC pass (``GarbageCollectorThread.run_once``, with compaction when its interval on the
  virtual wall clock is due) when the run asks for one (``gc_pass``); in a run that wall clock
  is the store's (``SimCluster.wall_s``), so the ``clock`` fault's steps reach the bookie as they
  reach the clients and AutoRecovery (compaction comes early after a step forward and is held
  after a step back, as BookKeeper's on a stepped host; a restart over wiped disks names its
  first journal by the stepped clock);
- reads answer after a seeded read latency (the reader pool); adds, fences and explicit LACs go
  to the bookie at once (the add thread) and are answered at the commit that makes them durable.

A crash (``crash``) is kill -9: ``OpenedBookie.abandon`` releases descriptors and locks and
writes nothing more, so what only the write cache, the journal queue or an entry log's buffer
held is gone, and what reached the files stays; the next incarnation is ``open_bookie`` again
over the same directory (cookies, journal replay from the persisted mark). A power loss
(``PageCache.lose`` after the crash) also takes back every byte the journals and entry logs
wrote since their file's last fsync: the bookie writes them through a ``PageCache`` (the
``FileOps`` seam). The journal's group commit is two steps here, as with its force-write
thread: the write at the end of the group wait (``Journal.commit``), the fsync after a seeded
latency (``Journal.force``), so a crash can fall between them. RocksDB writes its own files,
but its indexes write through the ``IndexOps`` seam, here ``PageCache.index``
(``sim/index_power.py``): a power loss takes back what no WAL sync covered but a seeded prefix.

The disk checks run when the run fills or frees a bookie's disk (the ``full`` fault:
``disk_usage`` says every byte is taken, ``Bookie.check_disks`` is the checker thread's pass, and
the bookie turns read-only through its own state path); otherwise the disk is large and empty.
With ``integrity`` (the ``limbo`` mode) the bookie runs with ``dataIntegrityChecking``: a start
that may have lost data (every dir wiped: the cookies are stamped over) marks the ledgers the
store places on it limbo before it serves (``admin/integrity_check.mark_ledgers_limbo``); the node
then runs the integrity check that copies them back. Without it a wiped bookie is refused (or,
with the ``start-wiped-bookie`` regression, starts empty).
Not run here: entry-log preallocation (off); COLLECT waits for a pass it runs itself.
Invariants: every choice comes from the run's generator and the loop's clock (file
and journal names included); nothing blocks (the journal queue and the write cache are sized so
that an add never waits, and a full write cache refuses at once).
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from vellum.admin.integrity_check import mark_ledgers_limbo
from vellum.bookie.assembly import BookieRuntime, OpenedBookie, open_bookie
from vellum.bookie.bookie import BookieInfo
from vellum.bookie.executor import CollectOutcome, lac_answer_last, watch_until
from vellum.bookie.metrics import BookieMetrics
from vellum.config import ServerConfig
from vellum.errors import NoSuchLedgerError, VellumError
from vellum.format.cookie import Cookie
from vellum.ids import BookieId, LedgerId
from vellum.meta.api import LedgerManager, RegistrationManager
from vellum.proto.messages import FLAG_RECOVERY_ADD, AddBatch
from vellum.sim.bookie import KeyCheck, LaterReads, completion
from vellum.sim.index_power import UnsyncedIndex
from vellum.sim.loop import SimLoop
from vellum.stats import CollectorRegistry
from vellum.storage.dirs import DiskUsageFn
from vellum.storage.durable import FileOps

#: the virtual wall clock's epoch (GC's compaction times and the first journal's name) when no
#: ``wall`` is given (the store's ``EPOCH_S``: the same instant)
_EPOCH_S = 1_700_000_000.0
#: what the disk checks see: a large, empty disk
_DISK = (1 << 40, 0)


def _fixed_usage(_path: Path) -> tuple[int, int]:
    return _DISK


def full_disk_usage(full: Callable[[], bool]) -> DiskUsageFn:
    """What the disk checks see when the run decides whether the disk is full (the ``full``
    fault): the large disk, empty, or with every byte taken."""
    def usage(_path: Path) -> tuple[int, int]:
        return (_DISK[0], _DISK[0]) if full() else _DISK
    return usage


def _no_sleep(_seconds: float) -> None:
    pass


def _quiet(_line: str) -> None:
    pass


def scratch_root() -> Path:
    """Where a run's bookies keep their files: a directory of this process on a tmpfs
    (``/dev/shm``) if there is one, else in the temp dir; the same path for every run of the
    process (the storage's metrics are labelled by dir), emptied at each run's end."""
    base = Path("/dev/shm")
    if not (base.is_dir() and os.access(base, os.W_OK)):
        base = Path(tempfile.gettempdir())
    return base / f"vellum-sim-{os.getpid()}"


class PageCache(FileOps):
    """The page cache as a power loss sees it: bytes written through these ops since their
    file's last fsync are taken back by ``lose()`` (the old bytes written back, the old size
    restored); what was fsynced stays. One per bookie, across its restarts (a process crash
    leaves the page cache as it was). ``index``: the same for the RocksDB indexes (their writes
    since the last WAL sync: ``sim/index_power.py``)."""

    def __init__(self, *, lies: bool = False) -> None:
        self.index = UnsyncedIndex(lambda: self.lies)
        self._paths: dict[int, str] = {}
        #: path -> (its size at the last fsync, [(offset, the bytes there before a write)])
        self._undo: dict[str, tuple[int, list[tuple[int, bytes]]]] = {}
        #: a disk that lies about fsync (the ``lying-fsync`` mode): an fsync forgets nothing, so a
        #: power loss takes back what was acknowledged as synced too
        self.lies = lies
        #: paths an fsync was acknowledged for without persisting them (``lies``)
        self._lied: set[str] = set()

    def _before(self, fd: int, offset: int, n: int) -> None:
        path = self._paths.get(fd)
        if path is None:
            return
        entry = self._undo.get(path)
        if entry is None:
            entry = self._undo[path] = (os.fstat(fd).st_size, [])
        if n:
            rfd = os.open(path, os.O_RDONLY)  # ``fd`` may be write-only (entry logs)
            try:
                entry[1].append((offset, os.pread(rfd, n, offset)))
            finally:
                os.close(rfd)

    @property
    def dirty_files(self) -> int:
        return len(self._undo)

    def open(self, path: Path, flags: int, mode: int = 0o644) -> int:
        fresh = not os.path.exists(path)
        fd = os.open(path, flags, mode)
        self._paths[fd] = str(path)
        if fresh:
            self._undo.setdefault(str(path), (0, []))  # a new file is empty until fsynced
        return fd

    def write(self, fd: int, data: bytes | memoryview) -> int:
        self._before(fd, os.lseek(fd, 0, os.SEEK_CUR), len(data))
        return os.write(fd, data)

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        self._before(fd, offset, len(data))
        return os.pwrite(fd, data, offset)

    def ftruncate(self, fd: int, length: int) -> None:
        size = os.fstat(fd).st_size
        self._before(fd, length, max(0, size - length))
        os.ftruncate(fd, length)

    def fsync(self, fd: int) -> None:
        path = self._paths.get(fd)
        if self.lies:
            if path is not None and path in self._undo:
                self._lied.add(path)
            return
        os.fsync(fd)
        if path is not None:
            self._undo.pop(path, None)

    @property
    def lied_files(self) -> int:
        """Files (and RocksDB databases) holding bytes an fsync acknowledged that a power loss
        would take back now."""
        return sum(1 for path in self._lied if path in self._undo) + self.index.lied_databases

    def close(self, fd: int) -> None:
        self._paths.pop(fd, None)
        os.close(fd)

    def rename(self, src: Path, dst: Path) -> None:
        os.replace(src, dst)
        self._moved(str(src), str(dst))

    def link(self, src: Path, dst: Path) -> None:
        os.link(src, dst)
        entry = self._undo.get(str(src))
        if entry is not None:
            self._undo[str(dst)] = (entry[0], list(entry[1]))

    def unlink(self, path: Path) -> None:
        os.unlink(path)
        self._undo.pop(str(path), None)
        self._lied.discard(str(path))

    def _moved(self, src: str, dst: str) -> None:
        entry = self._undo.pop(src, None)
        if entry is not None:
            self._undo[dst] = entry
        if src in self._lied:
            self._lied.discard(src)
            self._lied.add(dst)
        for fd, path in self._paths.items():
            if path == src:
                self._paths[fd] = dst

    def lose(self, rng: random.Random | None = None) -> int:
        """The power goes: every file written since its last fsync gets its old bytes and size
        back (the process is dead: no descriptor of it is used any more), and the indexes lose
        their unsynced writes but a prefix drawn from ``rng`` (all of them without it). Returns
        the files."""
        self.index.lose(rng)
        lost = 0
        for path, (size, changes) in sorted(self._undo.items()):
            try:
                fd = os.open(path, os.O_RDWR)
            except FileNotFoundError:
                continue
            try:
                for offset, old in reversed(changes):
                    os.pwrite(fd, old, offset)
                os.ftruncate(fd, size)
            finally:
                os.close(fd)
            lost += 1
        self._undo.clear()
        self._paths.clear()
        self._lied.clear()
        return lost


def remove_scratch(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)


def sim_config(home: Path, *, integrity: bool = False) -> ServerConfig:
    """The bookie's configuration in a run: small files (entry logs roll, compaction has work),
    GC and compaction intervals of seconds, caches that never make an add wait; ``integrity``:
    ``dataIntegrityChecking`` with ``dataIntegrityStampMissingCookies`` (a wiped bookie starts
    with its ledgers limbo instead of being refused)."""
    return ServerConfig(
        data_integrity_checking=integrity,
        data_integrity_stamp_missing_cookies=integrity,
        journal_directories=(str(home / "journal"),),
        ledger_directories=(str(home / "ledgers"),),
        http_server_enabled=False,
        db_storage_write_cache_max_size_mb=8,
        db_storage_read_ahead_cache_max_size_mb=1,
        db_storage_max_throttle_time_ms=0,
        entry_log_file_preallocation_enabled=False,
        log_size_limit_bytes=64 * 1024,
        journal_queue_size=1 << 20,
        journal_pre_alloc_size_mb=1,
        journal_max_size_mb=1,
        journal_remove_from_page_cache=False,
        journal_force_write_thread=True,  # the group commit's write and fsync are two steps
        gc_wait_time_ms=1000,
        minor_compaction_interval_s=2,
        major_compaction_interval_s=6,
    )


class _StoreLister:
    """GC's view of the simulated metadata store (``storage.gc.LedgerLister``)."""

    def __init__(self, ledgers: LedgerManager) -> None:
        self._ledgers = ledgers

    def ledger_ranges(self) -> Iterator[list[int]]:
        for r in self._ledgers.ledger_ranges():
            yield [int(i) for i in r.ledger_ids]

    def ledger_exists(self, ledger_id: int) -> bool:
        return self._ledgers.ledger_exists(LedgerId(ledger_id))


OnAddResult = Callable[[list[BaseException | None], BaseException | None], None]


class RealSimBookie(LaterReads):
    """One incarnation of a real bookie on the simulated loop (a restart makes a new one over
    the same ``home``). The interface is ``AsyncBookie``'s, plus ``crash`` and ``gc_pass``."""

    def __init__(self, name: str, loop: SimLoop, rng: random.Random, home: Path,
                 ledgers: LedgerManager, key_check: KeyCheck, *, group_wait_s: float,
                 fsync_s: tuple[float, float], read_s: tuple[float, float],
                 checkpoint_s: tuple[float, float] = (0.2, 1.5), page_cache: PageCache | None = None,
                 registration: RegistrationManager | None = None, check_keys: bool = True,
                 disk_usage: DiskUsageFn = _fixed_usage, integrity: bool = False,
                 wall: Callable[[], float] | None = None) -> None:
        """``wall``: the bookie's wall clock (None: ``_EPOCH_S`` + loop time, never stepped); a
        run gives the store's (``SimCluster.wall_s``), which the ``clock`` fault steps."""
        self.name = name
        self._loop = loop
        self._rng = rng
        self._group_wait_s = group_wait_s
        self._fsync_s = fsync_s
        self._read_s = read_s
        self._checkpoint_s = checkpoint_s
        runtime = BookieRuntime(threads=False, monotonic=loop.time, wall=wall or (lambda: _EPOCH_S + loop.time()),
                                sleep=_no_sleep, disk_usage=disk_usage, file_ops=page_cache,
                                index_ops=page_cache.index if page_cache is not None else None)
        # With ``registration``: the metadata store's copy of the cookie, as the service's start
        # (a bookie whose every disk was wiped is refused: ``CookieError``), stamped at first start.
        stored = registration.get_cookie(BookieId(name)) if registration is not None else None
        self.opened: OpenedBookie = open_bookie(
            sim_config(home, integrity=integrity), bookie_id=name, ledger_lister=_StoreLister(ledgers), master_key_check=key_check if check_keys else None,
            metrics=BookieMetrics(CollectorRegistry()), runtime=runtime,
            store_cookie=None if stored is None else Cookie.decode(stored.value, where=f"metadata cookie of {name}"))
        if registration is not None and stored is None:
            registration.put_cookie(BookieId(name), self.opened.cookie.encode(), None)
        self.bookie = self.opened.bookie
        #: journal records the start replayed into storage
        self.replayed = self.opened.replayed_records
        #: ledgers this start marked limbo (``dataIntegrityChecking``: a bookie that may have
        #: lost data marks every ledger the store places on it before it serves, as the service)
        self.limbo_marked = 0
        if self.opened.integrity_check_needed is not None:
            self.limbo_marked = mark_ledgers_limbo(self.opened, ledgers, name, say=_quiet)
        self.alive = True
        self.adds_accepted = 0
        #: failures of the storage's own steps (checkpoint, GC): the run reports them as errors
        self.errors: list[str] = []
        #: ``trace(kind, ledger, entry, value)``: bookie-side events for a replayed seed's history
        self.trace: Callable[[str, int, int, object], None] | None = None
        #: the last GC pass found the metadata store listing no ledger: real GC then deletes
        #: nothing (docs/gc.md: an empty listing is taken as a broken store)
        self.listing_empty = False
        self._commit: asyncio.TimerHandle | None = None
        self._force: asyncio.TimerHandle | None = None
        self._checkpoint: asyncio.TimerHandle | None = loop.call_later(rng.uniform(*checkpoint_s), self._run_checkpoint)

    # ------------------------------------------------------------------------- lifecycle
    def crash(self) -> None:
        """kill -9: nothing more is written, no callback runs (see the module docstring)."""
        if not self.alive:
            return
        self.alive = False
        for handle in (self._commit, self._force, self._checkpoint):
            if handle is not None:
                handle.cancel()
        self._commit = self._force = self._checkpoint = None
        self.opened.abandon()

    # ---------------------------------------------------------------------- the threads' steps
    def _kick(self) -> None:
        """Something was journaled: a group commit (the write) after the group wait."""
        if self._commit is None and self.alive:
            self._commit = self._loop.call_later(self._group_wait_s, self._run_commit)

    def _run_commit(self) -> None:
        self._commit = None
        if not self.alive:
            return
        for journal in self.bookie.journals:
            journal.commit()
        if self._force is None:
            self._force = self._loop.call_later(self._rng.uniform(*self._fsync_s), self._run_force)

    def _run_force(self) -> None:
        """The force-write thread's fsync of what the commits wrote: the adds become durable."""
        self._force = None
        if not self.alive:
            return
        for journal in self.bookie.journals:
            journal.force()

    def _run_checkpoint(self) -> None:
        self._checkpoint = None
        if not self.alive:
            return
        try:
            self.bookie.checkpoint()
        except Exception as e:
            self.errors.append(f"{self.name}: checkpoint failed: {type(e).__name__}: {e}")
        self._checkpoint = self._loop.call_later(self._rng.uniform(*self._checkpoint_s), self._run_checkpoint)

    def gc_pass(self) -> list[int]:
        """One GC pass of every ledger dir (what a GC thread runs each ``gcWaitTime``); the
        ledgers it deleted."""
        deleted: list[int] = []
        self.listing_empty = False
        for gc in self.bookie.gc_threads:
            try:
                report = gc.run_once()
            except Exception as e:
                self.errors.append(f"{self.name}: GC pass failed: {type(e).__name__}: {e}")
                continue
            self.listing_empty |= report.listing_error.startswith("metadata listing is empty")
            if report.error:
                self.errors.append(f"{self.name}: GC pass failed: {report.error}")
            deleted.extend(report.deleted_ledgers)
        return deleted

    # ------------------------------------------------------------------------ inspection
    def held_entries(self, ledger_id: int) -> frozenset[int]:
        """The entries of the ledger this bookie holds (write cache and storage)."""
        try:
            return frozenset(self.bookie.entry_ids(ledger_id))
        except NoSuchLedgerError:
            return frozenset()

    # ------------------------------------------------------------------ AsyncBookie's face
    def _answer(self, fn: Callable[..., None], *args: Any) -> None:
        """Answer on the loop, unless the process died meanwhile."""
        def run() -> None:
            if self.alive:
                fn(*args)
        self._loop.call_soon(run)

    def add_entries_cb(self, adds: list[tuple[bytes | memoryview, bytes, bool]], on_result: OnAddResult) -> None:
        """As ``AsyncBookie.add_entries_cb`` (the integrity check's copies): ``add_batch_cb`` of
        ``(entry, master key, recovery)`` rows."""
        self.add_batch_cb(AddBatch.of_entries(adds), on_result)

    def add_batch_cb(self, batch: AddBatch, on_result: OnAddResult) -> None:
        """As ``AsyncBookie.add_batch_cb``: ``on_result(refused per add, durability error)``
        once the accepted adds are durable (at a group commit)."""
        parts = [2]  # the refusals are known, and the accepted adds are durable
        outcome: list[BaseException | None] = [None]
        refused: list[BaseException | None] = []

        def part_done() -> None:
            parts[0] -= 1
            if parts[0] == 0:
                self._answer(on_result, refused, outcome[0])

        def durable(exc: BaseException | None) -> None:
            outcome[0] = exc
            part_done()

        try:
            result = self.bookie.add_batch(batch, durable)
        except Exception as exc:  # a bug, not a refusal: fail the whole batch
            refused[:] = [exc] * len(batch)
            parts[0] = 1
        else:
            assert result is not None  # wait=True always answers
            refused.extend(result)
            if refused.count(None) == 0:
                parts[0] -= 1  # nothing accepted: no durability callback will come
            else:
                self.adds_accepted += refused.count(None)
                self._kick()
        if self.trace is not None:
            for why, ledger_id, entry_id, flags in zip(refused, batch.ledger_ids, batch.entry_ids, batch.flags):
                kind = "add-refused" if why is not None else "recovery-add" if flags & FLAG_RECOVERY_ADD else "add"
                self.trace(kind, ledger_id, entry_id, type(why).__name__ if why is not None else None)
        part_done()

    def fence_cb(self, ledger_id: int, key: bytes, done: Callable[[BaseException | None], None]) -> None:
        try:
            self.bookie.fence_ledger(ledger_id, key, lambda exc: self._answer(done, exc))
        except Exception as e:
            self._answer(done, e)
            return
        if self.trace is not None:
            self.trace("fence", ledger_id, -1, None)
        self._kick()

    def _future(self) -> tuple[asyncio.Future[Any], Callable[[BaseException | None], None]]:
        return completion(self._loop)

    async def fence(self, ledger_id: int, key: bytes) -> None:
        fut, done = self._future()
        self.fence_cb(ledger_id, key, done)
        await fut

    def write_explicit_lac_cb(self, ledger_id: int, key: bytes, lac: int, body: bytes,
                              done: Callable[[BaseException | None], None]) -> None:
        """As ``AsyncBookie.write_explicit_lac_cb``: ``done`` once durable (a refusal at once)."""
        try:
            self.bookie.write_explicit_lac(ledger_id, key, lac, body, lambda exc: self._answer(done, exc))
        except Exception as e:
            done(e)
            return
        self._kick()

    def _later(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """A reader-pool call: run after a simulated read latency."""
        fut: asyncio.Future[Any] = self._loop.create_future()

        def run() -> None:
            if fut.done() or not self.alive:
                return
            try:
                fut.set_result(fn(*args))
            except Exception as e:
                fut.set_exception(e)

        self._loop.call_later(self._rng.uniform(*self._read_s), run)
        return fut

    def read_cb(self, ledger_id: int, entry_id: int, key: bytes | None,
                done: Callable[[bytes | memoryview | None, BaseException | None], None]) -> None:
        """As ``AsyncBookie.read_cb``: with ``key`` the ledger is fenced first and the READ
        follows once the fence is durable; an entry in memory (write or read-ahead cache) is
        answered at once; any other is read after the simulated read latency."""
        if key is not None:
            def fenced(exc: BaseException | None) -> None:
                if exc is not None:
                    done(None, exc)
                else:
                    self.read_cb(ledger_id, entry_id, None, done)

            self.fence_cb(ledger_id, key, fenced)
            return
        try:
            cached = self.bookie.read_cached_entry(ledger_id, entry_id)
        except Exception as exc:
            done(None, exc)
            return
        if cached is not None:
            done(cached, None)
            return

        def answer(fut: asyncio.Future[Any]) -> None:
            exc = fut.exception()
            if exc is not None:
                done(None, exc)
            else:
                done(fut.result(), None)

        self.read_entry(ledger_id, entry_id).add_done_callback(answer)

    def read_entry(self, ledger_id: int, entry_id: int) -> asyncio.Future[bytes | memoryview]:
        return self._later(self.bookie.read_entry, ledger_id, entry_id)

    def read_entries_cb(self, ledger_id: int, first: int, max_count: int, max_bytes: int, key: bytes | None,
                        done: Callable[[Any, BaseException | None], None]) -> None:
        """As ``AsyncBookie.read_entries_cb``: fenced first when ``key`` is given."""
        if key is None:
            self._later_cb(done, self.bookie.read_entries, ledger_id, first, max_count, max_bytes)
            return

        def fenced(exc: BaseException | None) -> None:
            if exc is not None:
                done(None, exc)
            else:
                self._later_cb(done, self.bookie.read_entries, ledger_id, first, max_count, max_bytes)

        self.fence_cb(ledger_id, key, fenced)

    def read_strided_cb(self, ledger_id: int, first: int, stride: int, max_count: int, max_bytes: int,
                        done: Callable[[Any, BaseException | None], None]) -> None:
        self._later_cb(done, self.bookie.read_strided, ledger_id, first, stride, max_count, max_bytes)

    def read_lac_cb(self, ledger_id: int, done: Callable[[Any, BaseException | None], None]) -> None:
        """As ``AsyncBookie.read_lac_cb``: the explicit LAC body, then the last entry: two storage
        reads, each after a read latency of its own (drawn when it starts)."""
        self._later_cb(done, self._lac_body, ledger_id, then=self._lac_last)

    def _lac_body(self, ledger_id: int) -> bytes:
        return self.bookie.read_explicit_lac(ledger_id) or b""

    def _lac_last(self, ledger_id: int, body: bytes) -> tuple[bytes, bytes | memoryview]:
        return body, lac_answer_last(self.bookie, ledger_id)

    def entry_ids(self, ledger_id: int) -> asyncio.Future[list[int]]:
        return self._later(self.bookie.entry_ids, ledger_id)

    def trim(self, ledger_id: int, key: bytes, end_entry_id: int) -> asyncio.Future[None]:
        return self._later(self.bookie.trim, ledger_id, key, end_entry_id)

    def collect_cb(self, ledger_id: int, key: bytes, end_entry_id: int,
                   done: Callable[[CollectOutcome | None, BaseException | None], None]) -> None:
        """As ``AsyncBookie.collect_cb``: trim and seal (``Bookie.prepare_collect``) after a read
        latency, then a GC pass of each dir holding the ledger, run here (there is no GC thread
        to wait for); ``done`` once."""
        def collect(threads: list[Any]) -> CollectOutcome:
            reports = [gc.run_once() for gc in threads]
            failed = [r.error for r in reports if r.error]
            if failed:
                raise VellumError(f"ledger {ledger_id}: the garbage collection pass failed: {'; '.join(failed)}")
            return CollectOutcome(sum(r.reclaimed_bytes for r in reports), sum(gc.garbage_bytes() for gc in threads))

        def prepared(fut: asyncio.Future[Any]) -> None:
            if fut.cancelled():
                return
            try:
                out = collect(fut.result())
            except Exception as e:
                done(None, e)
            else:
                done(out, None)

        self._later(self.bookie.prepare_collect, ledger_id, key, end_entry_id).add_done_callback(prepared)

    def note_ledger_closed(self, ledger_id: int) -> None:
        self.bookie.note_ledger_closed(ledger_id)

    def watch_lac_cb(self, ledger_id: int, previous_lac: int, timeout_s: float,
                     done: Callable[[], None]) -> Callable[[], None]:
        """As ``AsyncBookie.watch_lac_cb``, on virtual time."""
        loop = self._loop

        def watch(fire: Callable[[], None]) -> Callable[[], None]:
            def passed(_lac: int) -> None:
                loop.call_soon(fire)  # the bookie may call it inside watch_lac

            return self.bookie.watch_lac(ledger_id, previous_lac, passed)

        return watch_until(loop, timeout_s, done, watch)

    def info(self) -> asyncio.Future[BookieInfo]:
        return self._later(lambda: BookieInfo(_DISK[0], _DISK[0] - _DISK[1]))
