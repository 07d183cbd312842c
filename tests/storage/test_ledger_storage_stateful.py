"""Hypothesis state machine: LedgerStorage against an in-memory model, with close-and-reopen;
run again with the direct-I/O entry logger (``dbStorage_directIOEntryLogger``).

A deleted ledger is deleted for good: its adds and master key are refused as fenced, across
reopens (defect D2 of docs/correctness.md)."""

from __future__ import annotations

import shutil
import struct
import tempfile
from pathlib import Path

import crc32c
import pytest
from direct_io_support import CHECKOUT_DIR, takes_direct_io
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from vellum.errors import LedgerFencedError, NoSuchEntryError, NoSuchLedgerError
from vellum.storage.ledger_storage import LedgerStorage

LEDGERS = st.integers(0, 5)
ENTRIES = st.integers(0, 12)


def make_entry(ledger_id: int, entry_id: int) -> bytes:
    # Entries are immutable in BookKeeper: the same (ledger, entry) always carries the same bytes
    # (and a deleted ledger is never re-created).
    payload = struct.pack(">q", ledger_id ^ entry_id) * (1 + (ledger_id * 7 + entry_id) % 9)
    ids = struct.pack(">qq", ledger_id, entry_id)
    return ids + struct.pack(">I", crc32c.crc32c(ids + payload)) + payload


class LedgerModel:
    def __init__(self) -> None:
        self.entries: dict[int, bytes] = {}
        self.fenced = False
        self.master_key = b""
        self.explicit_lac: bytes | None = None


class LedgerStorageMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="vellum-ls-"))
        self.storage = self._open()
        self.model: dict[int, LedgerModel] = {}
        self.deleted: set[int] = set()

    def _open(self) -> LedgerStorage:
        return LedgerStorage(
            self.dir,
            log_size_limit=4096,
            write_cache_max_bytes=600,
            read_cache_max_bytes=400,
            read_ahead_batch_size=4,
            max_throttle_time_ms=30_000,
            preallocate=False,
        )

    @rule(lid=LEDGERS, eid=ENTRIES)
    def add(self, lid: int, eid: int) -> None:
        entry = make_entry(lid, eid)
        if lid in self.deleted:
            with pytest.raises(LedgerFencedError):
                self.storage.add_entry(entry)
            return
        self.storage.add_entry(entry)
        self.model.setdefault(lid, LedgerModel()).entries[eid] = entry

    @rule(lid=LEDGERS, eid=ENTRIES)
    def read(self, lid: int, eid: int) -> None:
        ledger = self.model.get(lid)
        try:
            got = self.storage.get_entry(lid, eid)
        except NoSuchLedgerError:
            assert ledger is None
            return
        except NoSuchEntryError:
            assert ledger is not None and eid not in ledger.entries
            return
        assert ledger is not None and ledger.entries.get(eid) == got

    @rule(lid=LEDGERS)
    def read_last(self, lid: int) -> None:
        ledger = self.model.get(lid)
        expected = max(ledger.entries) if ledger and ledger.entries else -1
        assert self.storage.get_last_entry_id(lid) == expected
        if expected >= 0:
            assert ledger is not None
            assert self.storage.get_entry(lid, -1) == ledger.entries[expected]

    @rule(lid=LEDGERS, key=st.sampled_from([b"k1", b"k2"]))
    def set_master_key(self, lid: int, key: bytes) -> None:
        ledger = self.model.get(lid)
        if ledger is not None and ledger.master_key and ledger.master_key != key:
            return  # refusal is covered by the example tests
        if lid in self.deleted:
            with pytest.raises(LedgerFencedError):
                self.storage.set_master_key(lid, key)
            return
        self.storage.set_master_key(lid, key)
        self.model.setdefault(lid, LedgerModel()).master_key = key

    @rule(lid=LEDGERS)
    def fence(self, lid: int) -> None:
        ledger = self.model.get(lid)
        if ledger is None:
            return
        assert self.storage.set_fenced(lid) is (not ledger.fenced)
        ledger.fenced = True

    @rule(lid=LEDGERS, lac=st.binary(min_size=1, max_size=8))
    def explicit_lac(self, lid: int, lac: bytes) -> None:
        ledger = self.model.get(lid)
        if ledger is None:
            return
        self.storage.set_explicit_lac(lid, lac)
        ledger.explicit_lac = lac

    @rule(lid=LEDGERS)
    def delete(self, lid: int) -> None:
        self.storage.delete_ledger(lid)
        self.model.pop(lid, None)
        self.deleted.add(lid)

    @rule(lid=LEDGERS, end=ENTRIES)
    def trim(self, lid: int, end: int) -> None:
        ledger = self.model.get(lid)
        if ledger is None:
            return
        self.storage.trim(lid, end)
        ledger.entries = {e: v for e, v in ledger.entries.items() if e >= end}

    @rule()
    def flush(self) -> None:
        self.storage.flush()

    @precondition(lambda self: bool(self.model))
    @rule()
    def flush_close_reopen(self) -> None:
        self.storage.flush()
        self.storage.close()
        self.storage = self._open()
        self.check_everything()

    @invariant()
    def ledgers_match(self) -> None:
        assert list(self.storage.ledgers()) == sorted(self.model)

    def check_everything(self) -> None:
        for lid, ledger in self.model.items():
            assert self.storage.entry_ids(lid) == sorted(ledger.entries)
            for eid, entry in ledger.entries.items():
                assert self.storage.get_entry(lid, eid) == entry
            assert self.storage.is_fenced(lid) is ledger.fenced
            assert self.storage.get_master_key(lid) == (ledger.master_key or None)  # empty = not set yet
            assert self.storage.get_explicit_lac(lid) == ledger.explicit_lac
        for lid in self.deleted:
            assert self.storage.is_deleted(lid) and not self.storage.ledger_exists(lid)

    def teardown(self) -> None:
        try:
            self.check_everything()
        finally:
            self.storage.close()
            shutil.rmtree(self.dir, ignore_errors=True)


LedgerStorageMachine.TestCase.settings = settings(max_examples=30, stateful_step_count=40, deadline=None)
TestLedgerStorageMachine = LedgerStorageMachine.TestCase


class DirectIOLedgerStorageMachine(LedgerStorageMachine):
    """The same machine with entry logs written through O_DIRECT (a small aligned buffer, so
    reads, flushes and rotations land in partly written blocks); reopened alternately with and
    without direct I/O, since the files are the same."""

    def __init__(self) -> None:
        self.direct = True
        super().__init__()
        if takes_direct_io(self.dir) is not None:
            CHECKOUT_DIR.mkdir(exist_ok=True)
            if takes_direct_io(CHECKOUT_DIR) is not None:
                pytest.skip("no directory takes O_DIRECT")
            self.storage.close()
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = Path(tempfile.mkdtemp(prefix="vellum-ls-", dir=CHECKOUT_DIR))
            self.storage = self._open()

    def _open(self) -> LedgerStorage:
        storage = LedgerStorage(
            self.dir,
            log_size_limit=16384,
            write_cache_max_bytes=600,
            read_cache_max_bytes=400,
            read_ahead_batch_size=4,
            max_throttle_time_ms=30_000,
            preallocate=False,
            direct_io=self.direct,
            direct_write_buffer_size=8192,
        )
        self.direct = not self.direct
        return storage


DirectIOLedgerStorageMachine.TestCase.settings = settings(max_examples=15, stateful_step_count=40, deadline=None)
TestDirectIOLedgerStorageMachine = DirectIOLedgerStorageMachine.TestCase
