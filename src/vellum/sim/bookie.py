"""A simulated bookie: an in-memory store below the real request path.

Responsibility: stand in for ``bookie/executor.py``'s ``AsyncBookie`` (the processors' only
view of a bookie) with the semantics of ``bookie/bookie.py`` over a simulated disk, so that
the real ``BookieConnection`` (session, processors, reply writer) serves the simulated
network. What it keeps of the real bookie (rules 1, 3, 4 of docs/correctness.md):

- an add is accepted into memory (readable at once, like the write cache) and journaled; it is
  answered only when the journal's group commit (``group_wait_s`` plus an fsync latency drawn
  from the run's generator) made it durable;
- a fence is set in memory, journaled, and answered once durable; fenced ledgers refuse normal
  adds (``LedgerFencedError``) and accept recovery adds;
- the master key is fixed by a ledger's first add or fence; a different key is refused; a
  ledger this bookie has not seen gets a key only if its metadata exists (the composition
  root's ``master_key_check``);
- "no such entry" only for a ledger it holds without that entry; "no such ledger" for one it
  does not hold;
- the LAC it answers is the max of the LACs piggy-backed on the entries it accepted, and the
  explicit LAC; long polls wait for it on virtual time;
- a crash loses every journal record not yet synced, and what was only in memory; a torn crash
  (``crash(keep=...)``, the ``torn`` fault) keeps a prefix of the records written but not yet
  synced (a power cut that persisted part of a group; replay stops at the first bad record, so
  what survives is a prefix and a torn last record is discarded);
- a failed journal write or fsync is fail-stop (``fail_journal``, the ``eio`` fault; rule 1 of
  docs/correctness.md, as ``storage/journal.py``): every pending and every later record fails
  with ``StorageError`` (answered EIO), nothing is applied to the disk, reads are still served
  from memory, until the process restarts; a failing ledger-storage flush (``storage_failing``)
  refuses adds with back-pressure (``OperationRejectedError``: the write caches cannot be
  emptied, as ``storage/ledger_storage.py``), nothing is lost;
- a full disk (``SimDisk.full``, the ``full`` fault) makes the bookie read-only, as
  ``bookie/bookie.py`` does once every ledger dir passes ``diskUsageThreshold``: normal adds are
  refused (``WriteOnReadOnlyBookieError``, EREADONLY), recovery adds, fences and reads are served;
- a disk that lies about fsync (``SimDisk.lies``, the ``lying-fsync`` mode) acknowledges a sync
  and persists its records only at the next write-back; a crash before it loses acknowledged
  records (what the checker must catch);
- GC: a ledger whose metadata is gone (two reads, rule 9 of docs/correctness.md) leaves a tombstone: its entries are
  dropped and adds to it are refused (defect D2 of docs/correctness.md).

A stored entry can go bad on the disk (``SimDisk.corrupt``, the ``corrupt`` fault at a crash):
reading it is an I/O error (rule 2 of docs/correctness.md), a run of entries stops before it.

Not simulated: entry logs, the index, checkpoints, limbo, trim and COLLECT (a refusal); the
registration a read-only bookie rewrites is the nemesis's (``runner.World``). The class is the simulator's model of a bookie, not the bookie's code.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import random
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vellum.bookie.bookie import BookieInfo
from vellum.bookie.executor import watch_until
from vellum.errors import (
    CorruptEntryError,
    IncorrectParameterError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    OperationRejectedError,
    StorageError,
    UnauthorizedAccessError,
    VellumError,
    WriteOnReadOnlyBookieError,
)
from vellum.format.entry import master_key
from vellum.proto.messages import FLAG_RECOVERY_ADD, AddBatch
from vellum.sim.loop import SimLoop

_IDS = struct.Struct(">qqq")


def _nothing() -> None:
    pass


def completion(loop: asyncio.AbstractEventLoop) -> tuple[asyncio.Future[Any], Callable[[BaseException | None], None]]:
    """A future and the ``done(exc)`` callback that settles it once (the callback form the
    bookie's face answers fences and explicit LACs with), for the simulated bookies' awaitables."""
    fut: asyncio.Future[Any] = loop.create_future()

    def done(exc: BaseException | None) -> None:
        if not fut.done():
            if exc is None:
                fut.set_result(None)
            else:
                fut.set_exception(exc)

    return fut, done


@dataclass
class LedgerRecord:
    """One ledger on one bookie (in memory or on the simulated disk)."""

    master_key: bytes
    fenced: bool = False
    deleted: bool = False
    entries: dict[int, bytes] = field(default_factory=dict)
    explicit_lac: bytes | None = None

    def copy(self) -> LedgerRecord:
        return LedgerRecord(self.master_key, self.fenced, self.deleted, dict(self.entries), self.explicit_lac)


@dataclass
class SimDisk:
    """What survives a crash: the journal records that were synced, and which of the stored
    entries went bad on the disk (a torn or rotten record)."""

    ledgers: dict[int, LedgerRecord] = field(default_factory=dict)
    corrupt: set[tuple[int, int]] = field(default_factory=set)
    #: every ledger dir is past its usage threshold: a bookie on this disk is read-only
    full: bool = False
    #: the disk acknowledges fsync without persisting (``lying-fsync``): synced records wait in
    #: ``unwritten`` for the next write-back, and a crash loses them
    lies: bool = False
    unwritten: list[Callable[[SimDisk], None]] = field(default_factory=list)

    def record(self, ledger_id: int, key: bytes) -> LedgerRecord:
        rec = self.ledgers.get(ledger_id)
        if rec is None:
            rec = self.ledgers[ledger_id] = LedgerRecord(key)
        return rec


#: ``check(ledger_id, master_key)``: does the ledger's metadata exist and give this key?
KeyCheck = Callable[[int, bytes], bool]


class LaterReads:
    """Reads of a simulated bookie (the model or the real one) in callback form, each after a
    simulated read latency drawn from the run's seed: what a reader thread does in production.
    The bookie provides ``alive``, ``_loop``, ``_rng`` and ``_read_s``."""

    alive: bool
    _loop: SimLoop
    _rng: random.Random
    _read_s: tuple[float, float]

    def _later_cb(self, done: Callable[[Any, BaseException | None], None], fn: Callable[..., Any],
                  *args: Any, then: Callable[..., Any] | None = None) -> None:
        """A reader-pool call in callback form: ``done(result, None)`` or ``done(None, error)``
        after a simulated read latency (never, if the bookie died meanwhile). With ``then``, a
        second storage read follows after a latency of its own: ``then(*args, result)``."""
        low, high = self._read_s  # ``uniform`` inline, as ``random.uniform`` computes it: one call less
        self._loop.later(low + (high - low) * self._rng.random(), self._run_now, done, fn, args, then)

    def _run_now(self, done: Callable[[Any, BaseException | None], None], fn: Callable[..., Any],
                 args: tuple[Any, ...], then: Callable[..., Any] | None) -> None:
        if not self.alive:
            return
        try:
            out = fn(*args)
        except Exception as e:
            done(None, e)
            return
        if then is None:
            done(out, None)
        else:
            self._later_cb(done, then, *args, out)



class SimBookie(LaterReads):
    """One incarnation of a simulated bookie (a restart makes a new one over the same disk)."""

    def __init__(self, name: str, loop: SimLoop, rng: random.Random, disk: SimDisk,
                 key_check: KeyCheck, *, group_wait_s: float, fsync_s: tuple[float, float],
                 read_s: tuple[float, float], writeback_s: tuple[float, float] = (5.0, 30.0)) -> None:
        self.name = name
        self._loop = loop
        self._rng = rng
        self.disk = disk
        self._key_check = key_check
        self._group_wait_s = group_wait_s
        self._fsync_s = fsync_s
        self._read_s = read_s
        self._writeback_s = writeback_s
        self._writeback: asyncio.TimerHandle | None = None
        #: the journal failed (fail-stop until this process ends): every record gets this error
        self.journal_error: StorageError | None = None
        #: ledger-storage flushes fail: adds are refused with back-pressure while this is set
        self.storage_failing = False
        # memory starts as what the disk holds (journal replay)
        self.mem: dict[int, LedgerRecord] = {lid: rec.copy() for lid, rec in disk.ledgers.items()}
        self._lacs: dict[int, int] = {}
        for lid, rec in self.mem.items():
            self._lacs[lid] = self._lac_of(rec)
        self._waiters: dict[int, list[tuple[int, Callable[[int], None]]]] = {}
        self._pending: list[tuple[Callable[[SimDisk], None], Callable[[BaseException | None], None]]] = []
        self._flush: asyncio.TimerHandle | None = None
        self.alive = True
        self.adds_accepted = 0
        #: ``trace(kind, ledger, entry, value)``: bookie-side events for a replayed seed's history
        self.trace: Callable[[str, int, int, object], None] | None = None

    # ------------------------------------------------------------------------- lifecycle
    def crash(self, keep: int = 0) -> tuple[int, int]:
        """The process dies: memory is gone and no callback runs. Of the journal records written
        but not yet synced, the first ``keep`` survive (a torn crash; the default, none) and the
        rest are lost; on a lying disk, what it acknowledged but never wrote back is lost too.
        Returns (records kept, records that were pending)."""
        self.alive = False
        pending, self._pending = self._pending, []
        kept = min(max(keep, 0), len(pending))
        for apply, _done in pending[:kept]:
            apply(self.disk)
        for timer in (self._flush, self._writeback):
            if timer is not None:
                timer.cancel()
        self._flush = self._writeback = None
        self.disk.unwritten.clear()
        self._waiters.clear()
        return kept, len(pending)

    @property
    def pending_records(self) -> int:
        """Journal records written but not yet synced (what a torn crash may keep a prefix of)."""
        return len(self._pending)

    @property
    def unwritten_records(self) -> int:
        """Records a lying disk acknowledged but has not written back (a crash loses them)."""
        return len(self.disk.unwritten)

    def fail_journal(self, why: str) -> int:
        """A journal write or fsync fails: fail-stop (rule 1 of docs/correctness.md). Every
        pending record and every later one fails with ``StorageError``; nothing of them reaches
        the disk; the process goes on serving reads until it is restarted. Returns the records
        failed at once."""
        if self.journal_error is None:
            self.journal_error = StorageError(f"journal of {self.name}: {why}: [Errno 5] Input/output error")
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        pending, self._pending = self._pending, []
        for _apply, done in pending:
            self._loop.call_soon(done, self.journal_error)
        return len(pending)

    # --------------------------------------------------------------------------- journal
    def _journal(self, apply: Callable[[SimDisk], None], done: Callable[[BaseException | None], None]) -> None:
        if self.journal_error is not None:  # fail-stop: nothing is journaled any more
            self._loop.call_soon(done, self.journal_error)
            return
        self._pending.append((apply, done))
        if self._flush is None:
            low, high = self._fsync_s  # ``uniform`` inline, as ``random.uniform`` computes it: one call less
            delay = self._group_wait_s + (low + (high - low) * self._rng.random())
            self._flush = self._loop.call_later(delay, self._sync)

    def _sync(self) -> None:
        self._flush = None
        if not self.alive:
            return
        batch, self._pending = self._pending, []
        disk = self.disk
        if disk.lies:  # acknowledged now, persisted at the next write-back
            disk.unwritten.extend(apply for apply, _done in batch)
            if self._writeback is None:
                self._writeback = self._loop.call_later(self._rng.uniform(*self._writeback_s), self._write_back)
        else:
            for apply, _done in batch:
                apply(disk)
        for _apply, done in batch:
            done(None)

    def _write_back(self) -> None:
        """A lying disk finally writes what it acknowledged."""
        self._writeback = None
        if not self.alive:
            return
        unwritten, self.disk.unwritten = self.disk.unwritten, []
        for apply in unwritten:
            apply(self.disk)

    # ----------------------------------------------------------------------------- state
    @staticmethod
    def _lac_of(rec: LedgerRecord) -> int:
        lac = -1
        for entry in rec.entries.values():
            lac = max(lac, _IDS.unpack_from(entry)[2])
        if rec.explicit_lac is not None and len(rec.explicit_lac) >= 8:
            lac = max(lac, struct.unpack_from(">q", rec.explicit_lac)[0])
        return lac

    def _ledger(self, ledger_id: int, key: bytes) -> LedgerRecord:
        rec = self.mem.get(ledger_id)
        if rec is not None:
            if rec.deleted:
                raise LedgerFencedError(f"ledger {ledger_id} was deleted on {self.name} (fenced for good)")
            if not hmac.compare_digest(rec.master_key, key):
                raise UnauthorizedAccessError(f"ledger {ledger_id}: master key does not match on {self.name}")
            return rec
        if not self._key_check(ledger_id, key):
            raise UnauthorizedAccessError(f"ledger {ledger_id}: no metadata gives this master key")
        rec = self.mem[ledger_id] = LedgerRecord(key)
        return rec

    def _advance_lac(self, ledger_id: int, lac: int) -> None:
        if lac <= self._lacs.get(ledger_id, -1):
            return
        self._lacs[ledger_id] = lac
        waiting = self._waiters.get(ledger_id)
        if waiting:
            keep = []
            for previous, fn in waiting:
                if lac > previous:
                    self._loop.call_soon(fn, lac)
                else:
                    keep.append((previous, fn))
            self._waiters[ledger_id] = keep

    # ------------------------------------------------------------------ AsyncBookie's face
    def add_batch_cb(self, batch: AddBatch,
                     on_result: Callable[[list[BaseException | None], BaseException | None], None]) -> None:
        """As ``AsyncBookie.add_batch_cb``: ``on_result(refused per add, durability error)``.

        Hot (every add of a run): a held ledger with the add's key is taken from memory without
        ``_ledger``'s call (which judges the rest: a first add, a deleted ledger, another key),
        and ``_advance_lac`` is called only for an add that raises the LAC."""
        refused: list[BaseException | None] = []
        accepted: list[tuple[int, int, bytes, bytes]] = []
        disk = self.disk
        trace = self.trace
        mem = self.mem
        lacs = self._lacs
        for entry, given_key, flags in zip(batch.entries, batch.keys, batch.flags):
            recovery = flags & FLAG_RECOVERY_ADD
            key = bytes(given_key)
            try:
                if len(entry) < 32:
                    raise IncorrectParameterError(f"entry of {len(entry)} bytes is shorter than its header")
                ledger_id, entry_id, lac = _IDS.unpack_from(entry)
                if disk.full and not recovery:  # as bookie/bookie.py's _judge: read-only before the key
                    raise WriteOnReadOnlyBookieError(
                        f"bookie {self.name} is read-only (disk full); refused entry {ledger_id}:{entry_id}")
                if self.storage_failing:
                    raise OperationRejectedError(
                        f"{self.name}: write cache full and the previous cache is still being flushed; "
                        f"rejecting ledger {ledger_id} entry {entry_id} (last flush failed: "
                        "[Errno 5] Input/output error)")
                rec = mem.get(ledger_id)
                if rec is None or rec.deleted or rec.master_key != key:
                    rec = self._ledger(ledger_id, key)  # a first add, or a refusal: as ``_ledger`` judges
                if rec.fenced and not recovery:
                    raise LedgerFencedError(f"ledger {ledger_id} is fenced; refused entry {entry_id}")
            except Exception as e:
                if trace is not None and len(entry) >= 32:
                    ids = _IDS.unpack_from(entry)
                    trace("add-refused", ids[0], ids[1], type(e).__name__)
                refused.append(e)
                continue
            data = bytes(entry)
            if trace is not None:
                trace("recovery-add" if recovery else "add", ledger_id, entry_id, "fenced" if rec.fenced else None)
            rec.entries[entry_id] = data
            if lac > lacs.get(ledger_id, -1):  # ``_advance_lac``'s own test first: most adds do not raise it
                self._advance_lac(ledger_id, lac)
            accepted.append((ledger_id, entry_id, data, key))
            refused.append(None)
        self.adds_accepted += len(accepted)
        if not accepted:
            self._loop.call_soon(on_result, refused, None)
            return

        def apply(disk: SimDisk) -> None:
            corrupt = disk.corrupt
            for ledger_id, entry_id, data, key in accepted:
                rec = disk.record(ledger_id, key)
                if not rec.deleted:
                    rec.entries[entry_id] = data
                    if corrupt:
                        corrupt.discard((ledger_id, entry_id))  # a new, good copy replaces a bad one

        self._journal(apply, functools.partial(on_result, refused))

    def fence_cb(self, ledger_id: int, key: bytes, done: Callable[[BaseException | None], None]) -> None:
        try:
            rec = self._ledger(ledger_id, key)
        except Exception as e:
            self._loop.call_soon(done, e)
            return
        rec.fenced = True
        if self.trace is not None:
            self.trace("fence", ledger_id, -1, None)

        def apply(disk: SimDisk) -> None:
            disk.record(ledger_id, key).fenced = True

        self._journal(apply, done)

    def _future(self) -> tuple[asyncio.Future[Any], Callable[[BaseException | None], None]]:
        return completion(self._loop)

    async def fence(self, ledger_id: int, key: bytes) -> None:
        fut, done = self._future()
        self.fence_cb(ledger_id, key, done)
        await fut

    def write_explicit_lac_cb(self, ledger_id: int, key: bytes, lac: int, body: bytes,
                              done: Callable[[BaseException | None], None]) -> None:
        """As ``AsyncBookie.write_explicit_lac_cb``: ``done`` once the write is journaled (a
        refusal answered at once)."""
        try:
            rec = self._ledger(ledger_id, key)
        except Exception as e:
            done(e)
            return
        rec.explicit_lac = bytes(body)
        self._advance_lac(ledger_id, lac)

        def apply(disk: SimDisk) -> None:
            disk.record(ledger_id, key).explicit_lac = bytes(body)

        self._journal(apply, done)

    def _later(self, fn: Callable[[], Any]) -> asyncio.Future[Any]:
        """A reader-pool call: answered after a simulated read latency."""
        fut: asyncio.Future[Any] = self._loop.create_future()

        def run() -> None:
            if fut.done() or not self.alive:
                return
            try:
                fut.set_result(fn())
            except Exception as e:
                fut.set_exception(e)

        self._loop.call_later(self._rng.uniform(*self._read_s), run)
        return fut

    def _held(self, ledger_id: int) -> LedgerRecord:
        rec = self.mem.get(ledger_id)
        if rec is None or rec.deleted:
            raise NoSuchLedgerError(f"ledger {ledger_id} not on {self.name}")
        return rec

    def _lookup(self, ledger_id: int, entry_id: int) -> bytes | VellumError:
        """A stored entry, or the error that answers its read (built, not raised: most reads of
        a run ask for an entry or a ledger this bookie does not hold)."""
        rec = self.mem.get(ledger_id)
        if rec is None or rec.deleted:
            return NoSuchLedgerError(f"ledger {ledger_id} not on {self.name}")
        entries = rec.entries
        if entry_id == -1:
            if not entries:
                return NoSuchEntryError(f"ledger {ledger_id} has no entry on {self.name}")
            entry_id = max(entries)
        found = entries.get(entry_id)
        if found is None:
            return NoSuchEntryError(f"ledger {ledger_id} entry {entry_id} is not on {self.name}")
        if (ledger_id, entry_id) in self.disk.corrupt:
            # rule 2 of docs/correctness.md: a bad copy is an I/O error, never served, never "no such entry"
            return CorruptEntryError(f"ledger {ledger_id} entry {entry_id} is corrupt on {self.name}")
        return found

    def _entry(self, ledger_id: int, entry_id: int) -> bytes:
        found = self._lookup(ledger_id, entry_id)
        if isinstance(found, VellumError):
            raise found
        return found

    def read_cb(self, ledger_id: int, entry_id: int, key: bytes | None,
                done: Callable[[bytes | None, BaseException | None], None]) -> None:
        """As ``AsyncBookie.read_cb``: fenced first when ``key`` is given, then read after the
        simulated read latency (nothing is served from memory at once). Each step starts on
        the loop's next turn, as the steps of a task awaiting the fence, then the read, would:
        a seed's schedule does not depend on which of the two the processor uses."""
        self._loop.soon(self._read_start, ledger_id, entry_id, key, done)

    # read_cb's steps are methods, not closures: a run reads thousands of entries
    def _read_start(self, ledger_id: int, entry_id: int, key: bytes | None,
                    done: Callable[[bytes | None, BaseException | None], None]) -> None:
        if key is None:  # ``_read_later``, inline (most reads)
            low, high = self._read_s
            self._loop.later(low + (high - low) * self._rng.random(), self._read_now, ledger_id, entry_id, done)
            return
        fut, fenced = self._future()
        self.fence_cb(ledger_id, key, fenced)
        fut.add_done_callback(lambda f: self._read_later(ledger_id, entry_id, done) if f.exception() is None
                              else done(None, f.exception()))

    def _read_later(self, ledger_id: int, entry_id: int,
                    done: Callable[[bytes | None, BaseException | None], None]) -> None:
        low, high = self._read_s  # ``uniform`` inline, as ``random.uniform`` computes it: one call less
        self._loop.later(low + (high - low) * self._rng.random(), self._read_now, ledger_id, entry_id, done)

    def _read_now(self, ledger_id: int, entry_id: int, done: Callable[[bytes | None, BaseException | None], None]) -> None:
        """``_later``'s timer without its future: the answer runs on the loop's next turn, as the
        future's done callback would (the same order of callbacks, fewer objects; at once when
        that is the same, ``SimLoop.call_last``)."""
        if not self.alive:
            return
        found = self._lookup(ledger_id, entry_id)
        if isinstance(found, VellumError):
            self._loop.call_last(done, None, found)
        else:
            self._loop.call_last(done, found, None)

    def read_entry(self, ledger_id: int, entry_id: int) -> asyncio.Future[bytes]:
        """One entry after the simulated read latency (the tests' direct read of the model)."""
        return self._later(lambda: self._entry(ledger_id, entry_id))

    def _run(self, ledger_id: int, first: int, stride: int, max_count: int, max_bytes: int) -> list[bytes]:
        got = [self._entry(ledger_id, first)]
        size = len(got[0])
        rec = self._held(ledger_id)
        e = first + stride
        while len(got) < max_count:
            nxt = rec.entries.get(e)
            if nxt is None or (max_bytes and size + len(nxt) > max_bytes) or (ledger_id, e) in self.disk.corrupt:
                break  # a run stops before a bad copy (which a read of it alone answers EIO)
            got.append(nxt)
            size += len(nxt)
            e += stride
        return got

    def read_entries_cb(self, ledger_id: int, first: int, max_count: int, max_bytes: int, key: bytes | None,
                        done: Callable[[Any, BaseException | None], None]) -> None:
        """As ``AsyncBookie.read_entries_cb``: fenced first when ``key`` is given."""
        if key is None:
            self._later_cb(done, self._run, ledger_id, first, 1, max_count, max_bytes)
            return

        def fenced(exc: BaseException | None) -> None:
            if exc is not None:
                done(None, exc)
            else:
                self._later_cb(done, self._run, ledger_id, first, 1, max_count, max_bytes)

        self.fence_cb(ledger_id, key, fenced)

    def read_strided_cb(self, ledger_id: int, first: int, stride: int, max_count: int, max_bytes: int,
                        done: Callable[[Any, BaseException | None], None]) -> None:
        self._later_cb(done, self._run, ledger_id, first, stride, max_count, max_bytes)

    def read_lac_cb(self, ledger_id: int, done: Callable[[Any, BaseException | None], None]) -> None:
        """As ``AsyncBookie.read_lac_cb``: the explicit LAC body, then the last entry: two storage
        reads, each after a read latency of its own (drawn when it starts, as two reader-pool
        calls one after the other would)."""
        self._later_cb(done, self._lac_body, ledger_id, then=self._lac_last)

    def _lac_body(self, ledger_id: int) -> bytes:
        return self._held(ledger_id).explicit_lac or b""

    def _lac_last(self, ledger_id: int, body: bytes) -> tuple[bytes, bytes]:
        try:
            last = self._entry(ledger_id, -1)
        except NoSuchEntryError:
            last = b""
        return body, last

    def entry_ids(self, ledger_id: int) -> asyncio.Future[list[int]]:
        return self._later(lambda: sorted(self._held(ledger_id).entries))

    def trim(self, ledger_id: int, key: bytes, end_entry_id: int) -> asyncio.Future[None]:
        def refuse() -> None:
            raise OperationRejectedError("trim is not simulated")
        return self._later(refuse)

    def collect_cb(self, ledger_id: int, key: bytes, end_entry_id: int,
                   done: Callable[[Any, BaseException | None], None]) -> None:
        done(None, OperationRejectedError("collect is not simulated"))

    def note_ledger_closed(self, ledger_id: int) -> None:
        pass

    def watch_lac_cb(self, ledger_id: int, previous_lac: int, timeout_s: float,
                     done: Callable[[], None]) -> Callable[[], None]:
        """As ``AsyncBookie.watch_lac_cb``: ``done()`` once the LAC passes ``previous_lac`` or
        after ``timeout_s`` of virtual time; returns the function that drops the wait."""
        def watch(fire: Callable[[], None]) -> Callable[[], None]:
            if self._lacs.get(ledger_id, -1) > previous_lac:
                self._loop.call_soon(fire)
                return _nothing
            entry = (previous_lac, lambda _lac: fire())
            self._waiters.setdefault(ledger_id, []).append(entry)

            def unwatch() -> None:
                waiting = self._waiters.get(ledger_id)
                if waiting and entry in waiting:
                    waiting.remove(entry)

            return unwatch

        return watch_until(self._loop, timeout_s, done, watch)

    def info(self) -> asyncio.Future[BookieInfo]:
        return self._later(lambda: BookieInfo(1 << 40, 1 << 39))

    # ------------------------------------------------------------------------------- GC
    def collect_deleted(self, exists: Callable[[int], bool]) -> list[int]:
        """One GC pass: tombstone every held ledger that two metadata reads say is gone."""
        gone = [lid for lid, rec in self.mem.items() if not rec.deleted and not exists(lid) and not exists(lid)]
        for lid in gone:
            for table in (self.mem, self.disk.ledgers):
                rec = table.get(lid)
                if rec is None:
                    rec = table[lid] = LedgerRecord(b"")
                rec.deleted, rec.fenced, rec.entries = True, True, {}
        return gone


def key_check_for(store_exists_with_key: Callable[[int], bytes | None]) -> KeyCheck:
    """``master_key_check`` over the simulated store: ``store_exists_with_key(ledger_id)``
    gives the ledger's password, None if it has no metadata."""
    def check(ledger_id: int, key: bytes) -> bool:
        password = store_exists_with_key(ledger_id)
        return password is not None and hmac.compare_digest(master_key(password), key)
    return check
