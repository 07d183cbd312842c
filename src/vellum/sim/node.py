"""A bookie process of a simulated run: the real request path (``BookieConnection`` and the
processors) on the simulated network, over the model bookie (``sim/bookie.py``) or the real
bookie and its storage (``sim/real_bookie.py``); its crashes, restarts, registration through
its own metadata session, and what it holds at the end of a run (docs/verification.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable
from pathlib import Path

from vellum.admin.integrity_check import IntegrityCheck
from vellum.client.bookkeeper import BookKeeper
from vellum.client.placement import DefaultPlacementPolicy
from vellum.config import ClientConfig
from vellum.errors import CookieError, CorruptionError
from vellum.format.entrylog import EntryLogScanner
from vellum.ids import BookieId, LedgerId
from vellum.server.bookie_server import BookieConnection, ServerLimits
from vellum.server.processors import Counters
from vellum.sim.bookie import SimBookie, SimDisk, key_check_for
from vellum.sim.history import History
from vellum.sim.loop import SimLoop
from vellum.sim.metadata import SimMetadataStore
from vellum.sim.network import Link, current_node
from vellum.sim.real_bookie import PageCache, RealSimBookie, full_disk_usage

#: seconds a crashed bookie's registration outlives it (its metadata session's timeout)
SESSION_TIMEOUT_S = 0.5


class BookieNode:
    """A bookie process on the simulated network: the real request path over a ``SimBookie``,
    or over the real bookie (``RealSimBookie``) when given a ``home`` directory for its files."""

    def __init__(self, name: str, loop: SimLoop, rng: random.Random, store: SimMetadataStore,
                 history: History | None, home: Path | None = None, *, check_keys: bool = True,
                 integrity: bool = False) -> None:
        self.name = name
        self.home = home
        self._real_errors: list[str] = []
        #: what a power loss takes back (the real bookie's files written since their last fsync)
        self.page_cache = PageCache() if home is not None else None
        self._history = history
        self._loop = loop
        self._rng = rng
        self._store = store
        self.disk = SimDisk()
        self._links: list[Link] = []
        self._counters = Counters(max_adds=10000, max_reads=10000, max_frame_size=ServerLimits().max_frame_size)
        self._limits = ServerLimits()
        self.bookie: SimBookie | RealSimBookie | None = None
        self._internal_before_crash = 0
        #: the metadata session that holds this bookie's registration (None while it has none)
        self.session: SimMetadataStore | None = None
        #: the real bookie checks a new ledger's master key against the store (``master_key_check``)
        self.check_keys = check_keys
        #: crashed for good (``lose_bookie``): never restarted
        self.lost = False
        #: why the real bookie refused to start (its cookie check: the ``wipe`` fault); it stays
        #: down for the rest of the run, as an operator would find it (``lost`` too)
        self.refused: str | None = None
        #: the real bookie's entries the ``corrupt`` fault damaged in its entry logs
        self.rotted: set[tuple[int, int]] = set()
        #: the entries a real bookie held when it was lost for good (its process is gone)
        self.lost_copies: frozenset[tuple[int, int]] = frozenset()
        #: the real bookie runs with ``dataIntegrityChecking`` (the ``limbo`` mode): a wiped one
        #: starts with its ledgers limbo and copies them back (``_integrity_check``)
        self.integrity = integrity
        self._integrity_task: asyncio.Task[None] | None = None
        #: ``report(kind, value)``: an event of this bookie for the run's history (the runner's)
        self.report: Callable[[str, str], None] | None = None
        self.start()

    def _password(self, ledger_id: int) -> bytes | None:
        return self._store.password_of(ledger_id)

    def start(self) -> None:
        if self.home is not None:
            if self.refused is not None:
                return
            if self.bookie is not None:
                self._real_errors += self.bookie.errors  # type: ignore[union-attr]
            try:
                bookie = RealSimBookie(self.name, self._loop, self._rng, self.home, self._store.ledgers,
                                       key_check_for(self._password), group_wait_s=0.001, fsync_s=(0.0002, 0.003),
                                       read_s=(0.00005, 0.0005), page_cache=self.page_cache,
                                       registration=self._store.registration, check_keys=self.check_keys,
                                       disk_usage=full_disk_usage(lambda: self.disk.full),
                                       integrity=self.integrity, wall=self._store.cluster.wall_s)
            except CookieError as e:  # the dead incarnation stays (not alive): the node is down
                self.refused = str(e)
                self.lost = True
                return
            self.bookie = bookie
            # the real bookie's state listener registers it read-only or writable, as the service's
            bookie.bookie.add_state_listener(lambda read_only: self.register_as(read_only=read_only))
            if bookie.bookie.is_read_only and self.session is not None:  # started on a full disk
                self.session.registration.register_bookie(BookieId(self.name), read_only=True)
            if bookie.bookie.limbo:
                self._integrity_task = self._loop.create_task(self._integrity_check(bookie))
        else:
            self.bookie = SimBookie(self.name, self._loop, self._rng, self.disk, key_check_for(self._password),
                                    group_wait_s=0.001, fsync_s=(0.0002, 0.003), read_s=(0.00005, 0.0005))
        history = self._history
        if history is not None:
            name = self.name
            self.bookie.trace = lambda kind, ledger, entry, value: history.add(name, kind, ledger, entry, value)
        if self.session is None:
            self._register()

    def _register(self) -> None:
        self.session = self._store.session(self.name)
        if isinstance(self.bookie, RealSimBookie) and self.bookie.bookie.is_read_only:
            self.session.registration.register_bookie(BookieId(self.name), read_only=True)
        else:
            self.session.registration.register_bookie(BookieId(self.name))

    async def _integrity_check(self, bookie: RealSimBookie) -> None:
        """The service's background integrity check (``admin/integrity_check.IntegrityCheck``)
        of a bookie that started with limbo ledgers: its own client (on this bookie's network
        node, its own metadata session) copies back what the metadata places here from the other
        replicas, and clears each ledger's limbo; it ends with the process."""
        current_node.set(self.name)
        session = self._store.session(f"{self.name}/integrity")
        client = BookKeeper(config=ClientConfig(add_entry_timeout_s=1.0, read_entry_timeout_s=1.0), store=session,
                            placement=DefaultPlacementPolicy(random.Random(self._rng.random())))
        try:
            await client.start()
            check = IntegrityCheck(bookie=bookie.bookie, async_bookie=bookie,  # type: ignore[arg-type]
                                   client=client, bookie_id=self.name, retry_interval_s=1.0)
            await check.run()
            if self.report is not None:
                self.report("integrity-done", f"{self.name}: no ledger limbo after {check.passes} pass(es)")
        finally:
            with contextlib.suppress(Exception):
                await client.close()
            session.close()

    def check_disks(self) -> None:
        """The real bookie's disk checker runs a pass (``Bookie.check_disks``): it sees the disk
        full or free (``disk.full``, the ``full`` fault) and turns read-only or writable."""
        if isinstance(self.bookie, RealSimBookie) and self.up:
            self.bookie.bookie.check_disks()

    def register_as(self, *, read_only: bool) -> None:
        """Register again, read-only or writable, through this process's own session (as the
        real bookie's state listener does); a process without a session (dead, or its session
        expired and not yet replaced) registers nothing: its registration must not outlive it."""
        if self.session is not None and self.up:
            self.session.registration.register_bookie(BookieId(self.name), read_only=read_only)

    def _session_timed_out(self, session: SimMetadataStore) -> None:
        """A crashed process's session ends after its timeout; a process that started again
        meanwhile registers through a new one (as the drivers' bookie start waits for the old
        registration to go)."""
        if session is not self.session:
            return
        session.close()
        self.session = None
        if self.up:
            self._register()

    def held(self, ledger_id: int) -> frozenset[int]:
        """The entries of a ledger this bookie holds durably and intact (what survives a crash)."""
        if isinstance(self.bookie, RealSimBookie):
            held = self.held_entries(ledger_id)
            return held - {e for lid, e in self.rotted if lid == ledger_id and e in held and not self._intact(lid, e)}
        rec = self.disk.ledgers.get(ledger_id)
        if rec is None or rec.deleted:
            return frozenset()
        bad = self.disk.corrupt
        return frozenset(e for e in rec.entries if (ledger_id, e) not in bad)

    def _intact(self, ledger_id: int, entry_id: int) -> bool:
        """Does the real bookie read this entry back without a corruption error (a later copy,
        a journal replay or compaction may have replaced the damaged one)?"""
        assert isinstance(self.bookie, RealSimBookie)
        try:
            self.bookie.bookie.read_entry(ledger_id, entry_id)
        except CorruptionError:
            return False
        return True

    def rot_entry(self, rng: random.Random, spare: Callable[[int, int], bool]) -> tuple[int, int] | None:
        """The ``corrupt`` fault on a crashed real bookie: one stored entry, drawn from those
        ``spare(ledger, entry)`` allows, gets a byte of its payload flipped in every entry-log
        record of it (a rotten sector). Returns it, or None if none was found."""
        assert self.home is not None
        records: dict[tuple[int, int], list[tuple[Path, int]]] = {}
        for path in sorted((self.home / "ledgers").rglob("*.log")):
            for rec in EntryLogScanner(path.read_bytes(), skip_corrupt=True):
                if rec.ledger_id >= 0 and rec.entry_id >= 0 and spare(rec.ledger_id, rec.entry_id):
                    # the entry's last byte (its payload's)
                    records.setdefault((rec.ledger_id, rec.entry_id), []).append((path, rec.offset + rec.size - 1))
        if not records:
            return None
        key = rng.choice(sorted(records))
        for path, at in records[key]:
            with path.open("r+b") as f:
                f.seek(at)
                byte = f.read(1)
                f.seek(at)
                f.write(bytes([byte[0] ^ 0x20]))
        self.rotted.add(key)
        return key

    @property
    def up(self) -> bool:
        return self.bookie is not None and self.bookie.alive

    def accept(self) -> asyncio.BufferedProtocol:
        assert self.bookie is not None
        return BookieConnection(self.bookie, self._counters, self._limits, lambda _c: None)  # type: ignore[arg-type]

    def attach(self, link: Link) -> None:
        self._links = [lk for lk in self._links if not all(lk.lost)]
        self._links.append(link)

    def crash(self, keep: int = 0, *, power_loss: bool = False) -> tuple[int, int]:
        """The process dies. Model: ``keep`` unsynced journal records survive (a torn crash);
        returns (records kept, records that were unsynced). Real bookie: ``power_loss``, the
        machine too, so what its files held only in the page cache is gone."""
        torn = (0, 0)
        if self._integrity_task is not None:  # the integrity check dies with its process
            self._integrity_task.cancel()
            self._integrity_task = None
        if isinstance(self.bookie, RealSimBookie):
            self.bookie.crash()
        elif self.bookie is not None:
            torn = self.bookie.crash(keep)
        if power_loss:
            assert self.page_cache is not None, "a power loss needs the real bookie"
            self.page_cache.lose(self._rng)
        if self.session is not None:
            self._loop.call_later(SESSION_TIMEOUT_S, self._session_timed_out, self.session)
        for link in self._links:
            link.reset(1)
        self._links = []
        # The processors' in-flight work belongs to the dead process: new counters.
        self._internal_before_crash += self._internal(self._counters)
        self._counters = Counters(max_adds=10000, max_reads=10000, max_frame_size=self._limits.max_frame_size)
        return torn

    @staticmethod
    def _internal(counters: Counters) -> int:
        return sum(n for (_op, status), n in counters.errors.items() if status == "EINTERNAL")

    @property
    def internal_errors(self) -> int:
        """Requests the real request path answered EINTERNAL (an unexpected exception: a bug of
        the code under test or of the model below it), over every life of this bookie."""
        return self._internal_before_crash + self._internal(self._counters)

    @property
    def storage_errors(self) -> list[str]:
        """Failures of the real storage's own steps (checkpoint, GC), over every life."""
        now = self.bookie.errors if isinstance(self.bookie, RealSimBookie) else []
        return self._real_errors + now

    def gc(self) -> list[int]:
        assert self.bookie is not None
        if isinstance(self.bookie, RealSimBookie):
            # a dead process (a bookie lost for good) runs no GC; its files stay as they are
            return self.bookie.gc_pass() if self.bookie.alive else []
        ledgers = self._store.ledgers
        return self.bookie.collect_deleted(lambda lid: ledgers.ledger_exists(LedgerId(lid)))

    def held_entries(self, ledger_id: int) -> frozenset[int]:
        """The entries of the ledger this bookie holds: on the model's disk, or in the real
        bookie's storage."""
        if isinstance(self.bookie, RealSimBookie):
            return self.bookie.held_entries(ledger_id) if self.bookie.alive else frozenset()
        rec = self.disk.ledgers.get(ledger_id)
        return frozenset(rec.entries) if rec is not None else frozenset()

    def holds_any(self, ledger_id: int) -> bool:
        """Does this bookie (alive) still hold an entry of the ledger after a GC pass that could
        delete it? The real GC deletes nothing while the metadata store lists no ledger at all
        (docs/gc.md: an empty listing is taken as a broken store), so after such a pass a real
        bookie is not asked."""
        if isinstance(self.bookie, RealSimBookie):
            return not self.bookie.listing_empty and bool(self.held_entries(ledger_id))
        assert self.bookie is not None
        rec = self.bookie.mem.get(ledger_id)
        return rec is not None and bool(rec.entries)

    @property
    def restarted(self) -> str:
        """How a restart is written in the history: the bookie's name, and for a real bookie the
        journal records its start replayed."""
        if self.refused is not None:
            return f"{self.name} refused to start (its cookie check): it stays down"
        if isinstance(self.bookie, RealSimBookie):
            limbo = f", {self.bookie.limbo_marked} ledgers marked limbo" if self.bookie.limbo_marked else ""
            return f"{self.name} (replayed {self.bookie.replayed} journal records{limbo})"
        return self.name

    def dispose(self) -> None:
        """The run is over: a real bookie releases its files (as a crash would)."""
        if self._integrity_task is not None:
            self._integrity_task.cancel()
        if isinstance(self.bookie, RealSimBookie):
            self.bookie.crash()


__all__ = ["SESSION_TIMEOUT_S", "BookieNode"]
