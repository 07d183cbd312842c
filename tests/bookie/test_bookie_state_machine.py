"""A hypothesis state machine drives a real Bookie (journal + ledger storage + checkpoint) with
adds, reads, fences, deletes, checkpoints, entry-log rotations (tiny logSizeLimit), clean
restarts and crashes, against an in-memory model of what was acknowledged.

A crash is emulated in-process: the journals are drained (every acknowledged record is already
fsynced; draining adds nothing that was not acknowledged) and the ledger storages are closed
WITHOUT flushing their write caches, so everything after the last checkpoint must come back
from journal replay. The kill -9 test (test_bookie_crash.py) covers real process death."""

from __future__ import annotations

import shutil
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, precondition, rule

from vellum.bookie.assembly import OpenedBookie, open_bookie
from vellum.config import ServerConfig
from vellum.errors import LedgerFencedError, NoSuchEntryError, NoSuchLedgerError
from vellum.format.entry import DigestManager, DigestType, master_key

KEY = master_key(b"sm")


def _config(base: Path) -> ServerConfig:
    return ServerConfig(
        journal_directories=(str(base / "journal"),),
        ledger_directories=(str(base / "l0"), str(base / "l1")),
        log_size_limit_bytes=4096,  # rotate entry logs every few entries
        db_storage_write_cache_max_size_mb=1,
        flush_interval_ms=3_600_000,  # checkpoints only when the machine asks
        http_server_enabled=False,
    )


def _wait_all(submit: list[tuple[int, int, bytes]], opened: OpenedBookie) -> list[BaseException | None]:
    results: list[BaseException | None] = [None] * len(submit)
    done = threading.Semaphore(0)

    def cb(i: int) -> object:
        def f(exc: BaseException | None) -> None:
            results[i] = exc
            done.release()

        return f

    issued = 0
    for i, (_lid, _eid, data) in enumerate(submit):
        try:
            opened.bookie.add_entry(data, KEY, cb(i))  # type: ignore[arg-type]
            issued += 1
        except Exception as e:
            results[i] = e
            done.release()
            issued += 1
    for _ in range(issued):
        assert done.acquire(timeout=30), "an add was never acknowledged"
    return results


class BookieMachine(RuleBasedStateMachine):
    ledgers = Bundle("ledgers")

    def __init__(self) -> None:
        super().__init__()
        self.base = Path(tempfile.mkdtemp(prefix="vellum-sm-"))
        self.opened = open_bookie(_config(self.base), bookie_id="sm:1")
        self.model: dict[int, dict[int, bytes]] = {}
        self.fenced: set[int] = set()
        self.deleted: set[int] = set()
        self.next_ledger = 1

    def _entry(self, lid: int, eid: int) -> bytes:
        payload = (b"%d/%d;" % (lid, eid)) * (1 + (lid * 7 + eid) % 40)
        return DigestManager(lid, DigestType.CRC32C, b"sm").compute(eid, eid - 1, 0, payload)

    @rule(target=ledgers)
    def new_ledger(self) -> int:
        lid = self.next_ledger
        self.next_ledger += 1
        self.model[lid] = {}
        return lid

    @rule(lid=ledgers, n=st.integers(1, 12))
    def add(self, lid: int, n: int) -> None:
        if lid in self.deleted:
            return
        start = max(self.model[lid], default=-1) + 1
        batch = [(lid, e, self._entry(lid, e)) for e in range(start, start + n)]
        results = _wait_all(batch, self.opened)
        for (_, eid, data), exc in zip(batch, results):
            if lid in self.fenced:
                assert isinstance(exc, LedgerFencedError), f"add to fenced ledger {lid} gave {exc!r}"
            else:
                assert exc is None, f"add {lid}:{eid} failed: {exc!r}"
                self.model[lid][eid] = data

    @rule(lid=ledgers)
    def fence(self, lid: int) -> None:
        if lid in self.deleted:
            return
        done = threading.Event()
        errors: list[BaseException | None] = []
        self.opened.bookie.fence_ledger(lid, KEY, lambda exc: (errors.append(exc), done.set()))
        assert done.wait(30)
        assert errors == [None]
        self.fenced.add(lid)

    @rule(lid=consumes(ledgers))
    def delete(self, lid: int) -> None:
        self.opened.bookie.delete_ledger(lid)
        self.deleted.add(lid)
        self.model.pop(lid, None)
        self.fenced.discard(lid)

    @rule()
    def checkpoint(self) -> None:
        self.opened.bookie.checkpoint()

    @rule()
    def clean_restart(self) -> None:
        self.opened.close()
        self.opened = open_bookie(_config(self.base), bookie_id="sm:1")
        assert not self.opened.unclean_shutdown

    @rule()
    def crash_and_reopen(self) -> None:
        bookie = self.opened.bookie
        for gc_thread in bookie.gc_threads:  # a crashed process's threads end with it
            gc_thread.stop()
        bookie._checkpointer.stop()
        bookie._dirs.stop()
        for journal in bookie._journals:
            journal.shutdown()
        for storage in bookie._storages:
            storage.flush = lambda: None  # type: ignore[method-assign]  # the write cache is lost
            storage.close()
        for lock in self.opened._locks:
            lock.release()
        self.opened = open_bookie(_config(self.base), bookie_id="sm:1")
        assert self.opened.unclean_shutdown
        # A ledger deleted after the last checkpoint may come back from the journal (as in
        # BookKeeper, GC deletes it again); it is not part of the model any more.

    @precondition(lambda self: any(self.model.values()))
    @rule(data=st.data())
    def read_one(self, data: st.DataObject) -> None:
        lid = data.draw(st.sampled_from(sorted(k for k, v in self.model.items() if v)))
        eid = data.draw(st.sampled_from(sorted(self.model[lid])))
        assert self.opened.bookie.read_entry(lid, eid) == self.model[lid][eid]

    @rule(lid=ledgers)
    def read_past_end(self, lid: int) -> None:
        if lid in self.deleted:
            return
        past = max(self.model[lid], default=-1) + 1
        try:
            self.opened.bookie.read_entry(lid, past)
            raise AssertionError(f"read of missing entry {lid}:{past} succeeded")
        except (NoSuchEntryError, NoSuchLedgerError):
            pass

    @invariant()
    def fenced_flags_hold(self) -> None:
        for lid in self.fenced:
            assert self.opened.bookie.is_fenced(lid), f"fence of ledger {lid} lost"

    def teardown(self) -> None:
        try:
            for lid, entries in self.model.items():
                for eid, data in entries.items():
                    assert self.opened.bookie.read_entry(lid, eid) == data, f"{lid}:{eid} differs at the end"
        finally:
            self.opened.close()
            shutil.rmtree(self.base, ignore_errors=True)


BookieMachine.TestCase.settings = settings(
    max_examples=30, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestBookieStateMachine = BookieMachine.TestCase


def test_replay_skips_records_of_a_deleted_ledger() -> None:
    """Found by the machine: a fence journaled after the last checkpoint, then a delete, then a
    crash. Replaying the fence must not fail the start (nor bring the ledger back)."""
    m = BookieMachine()
    try:
        lid = m.new_ledger()
        m.add(lid, 3)
        m.fence(lid)
        m.checkpoint()
        m.fence(lid)
        m.opened.bookie.write_explicit_lac(lid, KEY, 2, b"lac-body", lambda exc: None)
        m.delete(lid)
        m.crash_and_reopen()
        with pytest.raises(NoSuchLedgerError):
            m.opened.bookie.read_explicit_lac(lid)
    finally:
        m.teardown()
