"""Bookie semantics over the storage engine: add, read, fence, LAC, explicit LAC, trim.

A ``Bookie`` composes parts that are testable alone: one ``Journal`` per journal dir, one
``LedgerStorage`` per ledger dir, a ``LedgerDirsManager`` and a ``Checkpointer``. A ledger maps
to journal ``ledger_id % len(journals)`` (journal dirs never change: the cookie fixes them) and
to the storage that holds it (``bookie/routing.py``: where its data is, so that added ledger
dirs never reroute an existing ledger, rule 13 of docs/correctness.md).

Invariants (rules 1, 3, 4, 7 of docs/correctness.md):
- an add is judged once, here (``_admit`` / ``_judge``: entry size, ids, read-only bookie,
  master key, deleted or fenced ledger); ledger storage and the journal take the admitted
  ``AddBatch`` (the codec's columns, the same object in the common case) without judging it
  again, and refuse only for their own state (back-pressure, a delete racing the add);
- an add is acknowledged (its callback called without error) only after the journal fsync that
  covers it; the entry is put in the write cache before it is journaled, so a checkpoint mark
  taken after the journal write never skips it;
- the master key of a ledger is fixed by its first add, fence or explicit LAC; a different key
  is refused, and a ledger new here gets a key only once its metadata gives it
  (``master_key_check``): ``bookie/ledger_keys.py`` (``LedgerKeys``) keeps that role;
- a fence is acknowledged only after the fence record is durable in the journal; once fenced,
  normal adds are refused (recovery adds are still accepted);
- a read-only bookie refuses normal adds but serves reads, fences and recovery adds;
- a failed journal (fail-stop) turns the bookie read-only until it is restarted; its adds,
  recovery adds and fences keep failing in the journal (EIO), reads are still served;
- "no such entry" is answered only by the storage, which knows what it holds, and never for a
  *limbo* ledger (one whose data this bookie may have lost, ``bookie/integrity.py``): there a
  missing entry, the last entry and the LAC are "unknown" (rule 12 of docs/correctness.md).

All methods are synchronous and thread-safe; durability is reported through callbacks that run
on journal threads. ``bookie/executor.py`` is the only place where results cross to asyncio.
Building a bookie from its configuration (dirs, cookies, replay, threads) is
``bookie/assembly.py``'s job; what it counts is exported by ``bookie/metrics.py``.
"""

from __future__ import annotations

import hmac
import logging
import shutil
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from vellum.bookie.integrity import LimboLedgers, unknown_state
from vellum.bookie.ledger_keys import LedgerKeys, LedgerState, MasterKeyCheck
from vellum.bookie.metrics import BookieMetrics
from vellum.bookie.routing import LedgerRouter
from vellum.bookie.spanned_ledger import LedgerView
from vellum.errors import (
    IncorrectParameterError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    StorageError,
    UnknownLedgerStateError,
    VellumError,
    WriteOnReadOnlyBookieError,
)
from vellum.format.entry import ENTRY_HEADER_SIZE, BytesLike
from vellum.format.lastmark import LogMark
from vellum.ids import INVALID_ENTRY_ID, LAST_ADD_CONFIRMED
from vellum.proto.messages import FLAG_RECOVERY_ADD, AddBatch, PackedEntries
from vellum.storage.checkpoint import Checkpointer
from vellum.storage.dirs import LedgerDirsManager
from vellum.storage.gc import GarbageCollectorThread
from vellum.storage.journal import Journal
from vellum.storage.ledger_storage import LedgerStorage

log = logging.getLogger(__name__)

Callback = Callable[[BaseException | None], None]
_IDS = struct.Struct(">qqq")  # ledgerId, entryId, lac: the first 24 bytes of a stored entry


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
        metrics: BookieMetrics,
        read_only_mode_enabled: bool = True,
        force_read_only: bool = False,
        gc_threads: Sequence[GarbageCollectorThread] = (),
        router: LedgerRouter | None = None,
        master_key_check: MasterKeyCheck | None = None,
    ) -> None:
        if not journals or not storages:
            raise IncorrectParameterError("a bookie needs at least one journal and one ledger storage")
        self._journals = list(journals)
        self._storages = list(storages)
        self._router = router if router is not None else LedgerRouter(self._storages, dirs.is_writable)
        self._dirs = dirs
        self._checkpointer = checkpointer
        self._read_only_mode_enabled = read_only_mode_enabled
        self._forced_read_only = force_read_only
        self._disk_read_only = False
        #: why a failed journal made this bookie read-only for good (None: no journal failed)
        self._journal_failure: str | None = None
        #: the master key and fence flag of every ledger known here (one role: ``LedgerKeys``)
        self._keys = LedgerKeys(self._router, self._journal, master_key_check)
        self._lacs = _LacWaiters()
        #: ledgers whose data this bookie may have lost (rule 12 of docs/correctness.md), from the storages' flags
        self.limbo = LimboLedgers(self._router, self._storages)
        # Plain counters on the hot path, read by ``metrics`` at scrape time.
        self.adds_total = 0
        self.reads_total = 0
        self.adds_rejected: dict[str, int] = {"readonly": 0, "fenced": 0, "deleted": 0}
        self._state_listeners: list[Callable[[bool], None]] = []
        self._gc_threads = list(gc_threads)  # one per ledger storage (docs/gc.md)
        for gc in self._gc_threads:
            gc.on_ledger_deleted = self.forget_ledger
        for journal in self._journals:
            journal.add_failure_listener(self._on_journal_failed)
        self._metrics = metrics
        metrics.track(self)  # last: the collector may read this bookie from now on

    # ----------------------------------------------------------------------------------- routing
    def _storage(self, ledger_id: int) -> LedgerView:
        return self._router.view(ledger_id)

    def _held(self, ledger_id: int, what: str) -> LedgerView:
        """The storage of a ledger a request about ``what`` of it needs this bookie to hold: a
        ledger in limbo is of unknown state (rule 12 of docs/correctness.md), one no storage
        knows is ``NoSuchLedgerError``."""
        if ledger_id in self.limbo:
            raise unknown_state(ledger_id, what)
        storage = self._storage(ledger_id)
        if not storage.ledger_exists(ledger_id):
            raise NoSuchLedgerError(f"ledger {ledger_id} not on this bookie")
        return storage

    def _journal(self, ledger_id: int) -> Journal:
        return self._journals[ledger_id % len(self._journals)]

    # ------------------------------------------------------------------------------------- state
    @property
    def is_read_only(self) -> bool:
        return self._forced_read_only or self._disk_read_only or self._journal_failure is not None

    @property
    def read_only_reason(self) -> str | None:
        """Why this bookie is read-only (None when writable); a failed journal first, since
        only a restart ends it."""
        if self._journal_failure is not None:
            return self._journal_failure
        if self._disk_read_only:
            return "every ledger dir is full (diskUsageThreshold); free disk space"
        if self._forced_read_only:
            return "forced read-only (forceReadOnlyBookie or the admin switch)"
        return None

    def _on_journal_failed(self, error: StorageError) -> None:
        """A journal failed (fail-stop, rule 1 of docs/correctness.md): leave the writable set
        at once and for good (a journal never un-fails). Reads are still served; adds, recovery
        adds and fences keep failing in the journal (EIO). See docs/operations.md."""
        if self._journal_failure is not None:
            return
        self._journal_failure = f"journal failed: {error}; restart the bookie after checking the journal disk"
        log.error("bookie turned read-only until restarted: %s", self._journal_failure)
        self._state_changed()

    def set_forced_read_only(self, value: bool) -> None:
        """Admin switch (``/api/v1/bookie/state/readonly``)."""
        self._forced_read_only = value
        self._state_changed()

    def check_disks(self) -> None:
        """One pass of the disk checker (what its thread runs every ``diskCheckInterval``): every
        ledger dir measured again; a dir past the thresholds turns full or writable, and the
        bookie read-only or writable with it (``on_all_dirs_full``, ``on_dir_writable``). The
        simulator runs it when its disk fills or frees up (docs/verification.md)."""
        self._dirs.check()

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
        for fn in list(self._state_listeners):
            try:
                fn(self.is_read_only)
            except Exception:  # a listener must not break the storage path
                log.exception("bookie state listener failed")

    @property
    def journals(self) -> Sequence[Journal]:
        """The journals, one per journal dir (the metrics read their fsync counts)."""
        return tuple(self._journals)

    # --------------------------------------------------------------------------------------- add
    def _ledger(self, ledger_id: int, master_key: bytes) -> LedgerState:
        """The ledger's state after its master key check (``LedgerKeys.state``)."""
        return self._keys.state(ledger_id, master_key)

    def needs_key_check(self, ledger_id: int) -> bool:
        """Could a request for this ledger cost a metadata read (``master_key_check`` of a
        ledger not known in memory)? ``AsyncBookie`` then keeps it off the event loop."""
        return self._keys.needs_check(ledger_id)

    def _judge(self, entry: BytesLike, ledger_id: int, entry_id: int, master_key: bytes, recovery: bool) -> None:
        """Why an add is refused (raised), for an add the fast path of ``_admit`` did not take:
        its size, its ids, a read-only bookie, the ledger's master key (a ledger seen for the
        first time gets its key here), a deleted or fenced ledger. Stores nothing but a new
        ledger's key."""
        if len(entry) < ENTRY_HEADER_SIZE:
            raise IncorrectParameterError(
                f"entry of {len(entry)} bytes is shorter than its {ENTRY_HEADER_SIZE}-byte header")
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
            log.warning("refused entry %d:%d: the ledger was deleted (fenced for good)", ledger_id, entry_id,
                        extra={"ledger_id": ledger_id, "entry_id": entry_id})
            raise
        if state.fenced and not recovery:
            self.adds_rejected["fenced"] += 1
            # A writer that lost its ledger to a recovery: a few lines per such writer at most
            # (its handle fails at the first refusal), and the operator wants to see which.
            log.info("refused entry %d:%d: the ledger is fenced", ledger_id, entry_id,
                     extra={"ledger_id": ledger_id, "entry_id": entry_id})
            raise LedgerFencedError(f"ledger {ledger_id} is fenced; refused entry {entry_id}")

    def _admit(self, batch: AddBatch, wait: bool) -> tuple[list[int], list[BaseException | None]] | None:
        """The one validation of the ADD path: which adds of ``batch`` are valid (their
        positions, in order) and why each other one is refused. Fast path: a ledger known here,
        the right key, ids >= 0, not refused for read-only or fence (a recovery add passes
        both); anything else is ``_judge``d, which names the refusal. ``wait=False``: None as
        soon as an add would need ``_judge`` (a metadata read, a ledger to create)."""
        n = len(batch)
        refused: list[BaseException | None] = [None] * n
        read_only = self._forced_read_only or self._disk_read_only
        states = self._keys.states
        compare_digest = hmac.compare_digest
        keys, flags = batch.keys, batch.flags
        if self._admit_one_ledger(batch, read_only):
            return list(range(n)), refused
        accepted: list[int] = []
        for i, ledger_id, entry_id in zip(range(n), batch.ledger_ids, batch.entry_ids):
            state = states.get(ledger_id)
            if (state is not None and ledger_id >= 0 and entry_id >= 0
                    and compare_digest(state.master_key, keys[i])
                    and (not (read_only or state.fenced) or flags[i] & FLAG_RECOVERY_ADD)):
                accepted.append(i)
                continue
            if not wait:
                return None
            try:
                self._judge(batch.entries[i], ledger_id, entry_id, keys[i], bool(flags[i] & FLAG_RECOVERY_ADD))
            except Exception as exc:
                refused[i] = exc
                continue
            accepted.append(i)
        return accepted, refused

    def _admit_one_ledger(self, batch: AddBatch, read_only: bool) -> bool:
        """``_admit``'s fast path for the common batch, judged once rather than per add: every
        add of one ledger known here, with one master key, the right one, and ids >= 0, none
        refused for read-only or fence (else every add a recovery add). False: judge each."""
        ledger_ids, keys = batch.ledger_ids, batch.keys
        n = len(ledger_ids)
        if not n:
            return False
        ledger_id, key = ledger_ids[0], keys[0]
        state = self._keys.states.get(ledger_id)
        if (state is None or ledger_id < 0 or min(batch.entry_ids) < 0 or ledger_ids.count(ledger_id) != n
                or keys.count(key) != n or not hmac.compare_digest(state.master_key, key)):
            return False
        if read_only or state.fenced:
            return all(f & FLAG_RECOVERY_ADD for f in batch.flags)
        return True

    def add_entry(self, entry: bytes, master_key: bytes, callback: Callback, *, recovery: bool = False) -> None:
        """Add a stored entry (client entry bytes). Raises at once for a refused add; ``callback``
        runs after the journal fsync that covers the entry (or with the error that prevented it)."""
        refused = self.add_batch(AddBatch.of_entries(((entry, master_key, recovery),)), callback)
        assert refused is not None
        if refused[0] is not None:
            raise refused[0]

    def add_entries(self, adds: Sequence[tuple[BytesLike, bytes, bool]], callback: Callback, *,
                    wait: bool = True) -> list[BaseException | None] | None:
        """``add_batch`` of ``(entry, master key, recovery)`` rows (tools and tests)."""
        return self.add_batch(AddBatch.of_entries(adds), callback, wait=wait)

    def add_batch(self, batch: AddBatch, callback: Callback, *, wait: bool = True) -> list[BaseException | None] | None:
        """Add a batch of pipelined adds, as a connection delivers them (``AddBatch``: the
        columns the codec decoded). Returns, per add, the error that refused it at once or
        None. ``callback`` runs once, after the fsyncs covering every accepted add (with the
        first error if a journal failed), and not at all when every add was refused.

        Validated once, here (``_admit``); the write caches and journals take the admitted
        adds without judging them again: the same ``AddBatch`` object when every add was
        admitted and the batch has one ledger dir and one journal (the common case), else its
        parts (``AddBatch.take``). One write-cache lock hold per storage, one queue item and
        one completion per batch and journal. Every accepted entry is in its write cache
        before any of the batch is journaled (a checkpoint mark taken after the journal write
        never skips it).

        ``wait=False``: do nothing and return None unless the batch can be taken at once: every
        add of a ledger already known here, room in the write caches and the journal queues
        (nothing to wait for, no index write). The caller must then be the only adder."""
        admitted = self._admit(batch, wait)
        if admitted is None:
            return None
        accepted, refused = admitted
        if not accepted:
            return refused
        n = len(batch)
        # The write-cache puts, one batch per storage.
        router = self._router
        single = router.single
        groups: list[tuple[LedgerStorage, list[int]]]
        if single is not None:
            groups = [(single, accepted)]
        else:
            by_storage: dict[int, tuple[LedgerStorage, list[int]]] = {}
            ledger_ids = batch.ledger_ids
            for i in accepted:
                storage = router.storage_for_write(ledger_ids[i])
                by_storage.setdefault(id(storage), (storage, []))[1].append(i)
            groups = list(by_storage.values())
        if not wait:
            # Would the write caches and the journal queues take these adds without waiting?
            entries = batch.entries
            if not (all(storage.can_take(sum(map(len, entries)) if len(positions) == n
                                         else sum(len(entries[i]) for i in positions))
                        for storage, positions in groups)
                    and all(j.can_take(len(accepted)) for j in self._journals)):
                return None
        stored: list[int] = []
        for storage, positions in groups:
            try:
                put_refused = storage.write_batch(batch if len(positions) == n else batch.take(positions))
            except Exception as exc:  # closed: none of this group stored
                for i in positions:
                    refused[i] = exc
                continue
            if not put_refused:
                stored += positions
                continue
            held = dict(put_refused)
            for pos, i in enumerate(positions):
                why = held.get(pos)
                if why is None:
                    stored.append(i)
                else:
                    refused[i] = why
        if not stored:
            return refused
        if len(groups) > 1:
            stored.sort()  # journal in arrival order
        part = batch if len(stored) == n else batch.take(stored)
        self.adds_total += len(part)
        self._advance_lacs(part)
        self._log(part, callback)
        return refused

    def _advance_lacs(self, batch: AddBatch) -> None:
        """The piggy-backed LACs of stored adds move each ledger's LAC forward."""
        ledger_ids, lacs = batch.ledger_ids, batch.lacs
        first = ledger_ids[0]
        if ledger_ids.count(first) == len(ledger_ids):  # one ledger: the common case
            lac = max(lacs)
            if lac > -1:
                self._lacs.advance(first, lac)
            return
        best: dict[int, int] = {}
        for ledger_id, lac in zip(ledger_ids, lacs):
            if lac > best.get(ledger_id, -1):
                best[ledger_id] = lac
        for ledger_id, lac in best.items():
            self._lacs.advance(ledger_id, lac)

    def _log(self, batch: AddBatch, callback: Callback) -> None:
        """Journal stored adds: the batch as it is when one journal takes it all, else a part
        per journal, ``callback`` once every part is durable (with the first error)."""
        journals = self._journals
        if len(journals) == 1:
            self._log_part(journals[0], batch, callback)
            return
        count = len(journals)
        per_journal: dict[int, list[int]] = {}
        for pos, ledger_id in enumerate(batch.ledger_ids):
            per_journal.setdefault(ledger_id % count, []).append(pos)
        if len(per_journal) == 1:
            ((index, _positions),) = per_journal.items()
            self._log_part(journals[index], batch, callback)
            return
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

        for index, positions in per_journal.items():
            self._log_part(journals[index], batch.take(positions), part_done)

    @staticmethod
    def _log_part(journal: Journal, batch: AddBatch, callback: Callback) -> None:
        try:
            journal.log_batch(batch, callback)
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
        state = self._keys.states.get(ledger_id)
        return state.fenced if state is not None else self._storage(ledger_id).is_fenced(ledger_id)

    # ------------------------------------------------------------------------------------ limbo
    def mark_limbo(self, ledger_id: int, master_key: bytes) -> bool:
        """Make the ledger limbo and fenced (``bookie/integrity.py``); durable at the next
        checkpoint. False if it was deleted here."""
        with self._keys.lock:
            marked = self.limbo.mark(ledger_id, master_key)
            state = self._keys.states.get(ledger_id)
            if state is not None:
                state.fenced = True
        return marked

    def clear_limbo(self, ledger_id: int) -> None:
        """Every entry of the ledger this bookie should hold is back: answer normally again."""
        self.limbo.clear(ledger_id)

    def holds_entry(self, ledger_id: int, entry_id: int) -> bool:
        """Does this bookie hold the entry (whatever the ledger's limbo state)?"""
        return self.limbo.holds(ledger_id, entry_id)

    @property
    def limbo_ledger_count(self) -> int:
        return len(self.limbo)

    # -------------------------------------------------------------------------------------- read
    def read_entry(self, ledger_id: int, entry_id: int) -> bytes | memoryview:
        """Read one entry; ``entry_id == -1`` reads the last entry this bookie has."""
        storage = self._storage(ledger_id)
        self.reads_total += 1
        if ledger_id in self.limbo:
            return self.limbo.read_entry(storage, ledger_id, entry_id)
        return storage.get_entry(ledger_id, entry_id)

    def read_entries(self, ledger_id: int, first: int, max_count: int, max_bytes: int) -> PackedEntries:
        """Consecutive entries from ``first`` until a gap or a bound (BATCH_READ: a strided read
        with a stride of 1; see ``LedgerStorage.get_entries``)."""
        return self.read_strided(ledger_id, first, 1, max_count, max_bytes)

    def read_strided(self, ledger_id: int, first: int, stride: int, max_count: int,
                     max_bytes: int) -> PackedEntries:
        """Entries ``first, first + stride, ...`` until one is missing or a bound (READ_STRIDED;
        see ``LedgerStorage.get_strided``). A miss on the first entry of a limbo ledger is
        "unknown", never "no such entry" (this bookie may have lost it)."""
        try:
            got = self._storage(ledger_id).get_strided(ledger_id, first, stride, max_count, max_bytes)
        except (NoSuchEntryError, NoSuchLedgerError):
            if ledger_id in self.limbo:
                raise unknown_state(ledger_id, f"entry {first}") from None
            raise
        self.reads_total += len(got)
        return got

    def read_cached_entry(self, ledger_id: int, entry_id: int) -> bytes | memoryview | None:
        """The entry if it is in memory (write or read-ahead cache), without touching the disk."""
        if entry_id < 0:
            return None
        found = self._storage(ledger_id).get_cached_entry(ledger_id, entry_id)
        if found is not None:
            self.reads_total += 1
        return found

    def last_add_confirmed(self, ledger_id: int) -> int:
        """The LAC this bookie knows: the max of piggy-backed LACs and the explicit LAC."""
        if ledger_id in self.limbo:
            raise unknown_state(ledger_id, "its LAC")
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
        except (NoSuchLedgerError, UnknownLedgerStateError):
            pass  # the writer may not have reached this bookie yet (or it is limbo): wait for it
        return self._lacs.watch(ledger_id, previous_lac, fn)

    def entry_ids(self, ledger_id: int) -> list[int]:
        return list(self._held(ledger_id, "the list of its entries").entry_ids(ledger_id))

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
        return self._held(ledger_id, "its LAC").get_explicit_lac(ledger_id)

    # ------------------------------------------------------------------------------ other ops
    def trim(self, ledger_id: int, master_key: bytes, end_entry_id: int) -> None:
        """Drop entries below ``end_entry_id`` from the index (named-ledger shrink with force)."""
        self._ledger(ledger_id, master_key)
        self._storage(ledger_id).trim(ledger_id, end_entry_id)

    def prepare_collect(self, ledger_id: int, master_key: bytes, end_entry_id: int) -> list[GarbageCollectorThread]:
        """The bookie's part of COLLECT before the GC pass (named-ledger shrink with force):
        trim below ``end_entry_id`` (0: nothing), seal the active logs holding the ledger's
        records, and return the GC threads of the dirs holding it (the caller asks each for a
        pass). ``NoSuchLedgerError`` if this bookie does not hold the ledger (nothing to collect;
        a ledger is never created here)."""
        if ledger_id in self.limbo:
            raise unknown_state(ledger_id, "a collection")
        homes = self._router.homes(ledger_id)
        if not homes or not self._storage(ledger_id).ledger_exists(ledger_id):
            raise NoSuchLedgerError(f"ledger {ledger_id} not on this bookie: nothing to collect")
        self._ledger(ledger_id, master_key)  # the master key check
        if end_entry_id > 0:
            self._storage(ledger_id).trim(ledger_id, end_entry_id)
        threads: list[GarbageCollectorThread] = []
        for home in homes:
            home.seal_logs_holding(ledger_id)
            threads.extend(gc for gc in self._gc_threads if gc.storage is home)
        if not threads:
            raise VellumError(f"ledger {ledger_id}: no GC thread runs for its ledger dir(s): cannot collect")
        return threads

    def note_ledger_closed(self, ledger_id: int) -> None:
        """Advisory "ledger closed" from a client (requirement R1 of docs/correctness.md: rotate its log at next checkpoint)."""
        self._storage(ledger_id).note_ledger_closed(ledger_id)

    @property
    def gc_threads(self) -> list[GarbageCollectorThread]:
        """The GC threads, one per ledger dir (admin: force GC, status, suspend/resume)."""
        return list(self._gc_threads)

    def delete_ledger(self, ledger_id: int) -> None:
        """Remove a ledger's entries and state (GC: the ledger is gone from metadata)."""
        with self._keys.lock:
            self._keys.states.pop(ledger_id, None)
            self._storage(ledger_id).delete_ledger(ledger_id)
        self._lacs.forget(ledger_id)
        self.limbo.forget(ledger_id)

    def forget_ledger(self, ledger_id: int) -> None:
        """Drop the cached state of a ledger that GC removed from storage."""
        self._keys.forget(ledger_id)
        self._lacs.forget(ledger_id)
        self._router.forget(ledger_id)
        self.limbo.forget(ledger_id)

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

    def abandon(self) -> None:
        """What kill -9 leaves of a bookie whose storage runs without threads (a simulated
        crash): the bytes already in its files; the journals' queued records, the write caches
        and every buffer in memory are lost, no callback runs, descriptors are released."""
        self._metrics.untrack(self)
        for journal in self._journals:
            journal.abandon()
        for storage in self._storages:
            storage.abandon()

    def shutdown(self) -> None:
        """Clean shutdown: stop checkpoints, drain journals, final checkpoint, close storages."""
        self._metrics.untrack(self)  # a bookie going away no longer counts in the process's metrics
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

