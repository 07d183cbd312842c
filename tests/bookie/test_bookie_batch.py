"""Bookie.add_entries: a batch of pipelined adds (as a connection delivers them) goes to the
journal in one queue operation; refused adds are reported at once and never journaled, the
others are acknowledged after fsync and survive a restart."""

from __future__ import annotations

import threading
from pathlib import Path

from vellum.bookie.assembly import open_bookie
from vellum.config import ServerConfig
from vellum.errors import LedgerFencedError, UnauthorizedAccessError
from vellum.format.entry import DigestManager, DigestType, master_key


def test_batch_add_with_refusals(tmp_path: Path) -> None:
    config = ServerConfig(journal_directories=(str(tmp_path / "j1"), str(tmp_path / "j2")),
                          ledger_directories=(str(tmp_path / "l"),), http_server_enabled=False)
    key, other = master_key(b"k"), master_key(b"other")
    opened = open_bookie(config, bookie_id="b:1")
    results: list[BaseException | None] = []
    done = threading.Event()

    def cb(exc: BaseException | None) -> None:
        results.append(exc)
        done.set()

    def entry(lid: int, eid: int) -> bytes:
        return DigestManager(lid, DigestType.CRC32C, b"k").compute(eid, eid - 1, 0, b"%d:%d" % (lid, eid))

    try:
        fenced = threading.Event()
        opened.bookie.fence_ledger(3, key, lambda exc: fenced.set())
        assert fenced.wait(10)
        batch = [(entry(lid, e), key, False) for lid in (1, 2) for e in range(5)]
        batch.insert(3, (entry(3, 0), key, False))      # fenced ledger
        batch.insert(6, (entry(1, 9), other, False))    # wrong master key
        # Ledgers 1 and 2 map to different journals: one completion after both fsyncs.
        refused = opened.bookie.add_entries(batch, cb)
        assert isinstance(refused[3], LedgerFencedError)
        assert isinstance(refused[6], UnauthorizedAccessError)
        assert sum(r is None for r in refused) == 10
        assert done.wait(10)
        assert results == [None]
        # A batch refused entirely never calls back.
        done.clear()
        again = opened.bookie.add_entries([(entry(3, 1), key, False)], cb)
        assert isinstance(again[0], LedgerFencedError)
        assert not done.wait(0.5) and results == [None]
    finally:
        opened.close()
    reopened = open_bookie(config, bookie_id="b:1")
    try:
        for lid in (1, 2):
            for e in range(5):
                assert reopened.bookie.read_entry(lid, e) == entry(lid, e)
    finally:
        reopened.close()


def test_add_without_waiting_takes_only_what_needs_no_wait(tmp_path: Path) -> None:
    """``wait=False`` (the loop's inline add): a ledger not known yet, or a batch the write
    cache has no room for, is left alone (None: nothing stored, nothing journaled); a known
    ledger's batch that fits is added and acknowledged after fsync as usual."""
    config = ServerConfig(journal_directories=(str(tmp_path / "j"),), ledger_directories=(str(tmp_path / "l"),),
                          db_storage_write_cache_max_size_mb=1, http_server_enabled=False)
    key = master_key(b"k")
    dm = DigestManager(1, DigestType.CRC32C, b"k")
    opened = open_bookie(config, bookie_id="b:1")
    done = threading.Event()
    try:
        bookie = opened.bookie
        first = [(dm.compute(0, -1, 0, b"a"), key, False)]
        assert bookie.add_entries(first, lambda exc: None, wait=False) is None  # ledger 1 unknown
        assert bookie.read_cached_entry(1, 0) is None
        assert bookie.add_entries(first, lambda exc: None) == [None]
        big = [(dm.compute(e, e - 1, 0, bytes(64 * 1024)), key, False) for e in range(1, 20)]  # > 1 MiB
        assert bookie.add_entries(big, lambda exc: None, wait=False) is None
        assert bookie.read_cached_entry(1, 1) is None
        small = [(dm.compute(e, e - 1, 0, b"s"), key, False) for e in range(1, 4)]
        assert bookie.add_entries(small, lambda exc: done.set(), wait=False) == [None] * 3
        assert done.wait(10)
        assert bookie.read_cached_entry(1, 3) == small[2][0]
    finally:
        opened.close()


def test_one_ledger_batches_are_judged_as_each_add_would_be(tmp_path: Path) -> None:
    """The batch of one ledger known here is admitted at once (``_admit``'s fast path) only when
    each of its adds would be: a wrong key in it, a fenced ledger, a mix of recovery and
    normal adds on a fenced ledger, an entry re-sent, all are judged add by add."""
    config = ServerConfig(journal_directories=(str(tmp_path / "j"),), ledger_directories=(str(tmp_path / "l"),),
                          http_server_enabled=False)
    key, other = master_key(b"k"), master_key(b"other")
    opened = open_bookie(config, bookie_id="b:1")
    bookie = opened.bookie
    durable: list[BaseException | None] = []
    done = threading.Semaphore(0)

    def cb(exc: BaseException | None) -> None:
        durable.append(exc)
        done.release()

    def entry(eid: int, body: bytes = b"") -> bytes:
        return DigestManager(7, DigestType.CRC32C, b"k").compute(eid, eid - 1, 0, body or b"7:%d" % eid)

    try:
        assert bookie.add_entries([(entry(0), key, False)], cb) == [None]  # ledger 7 known from here
        refused = bookie.add_entries([(entry(e), other if e == 3 else key, False) for e in range(1, 6)], cb)
        assert [type(r).__name__ if r else None for r in refused] == [None, None, "UnauthorizedAccessError", None, None]
        # an entry sent again (a writer's re-send after an ensemble change) with a new one
        assert bookie.add_entries([(entry(2), key, False), (entry(6), key, False)], cb) == [None, None]
        fenced = threading.Event()
        bookie.fence_ledger(7, key, lambda exc: fenced.set())
        assert fenced.wait(10)
        refused = bookie.add_entries([(entry(e), key, False) for e in range(7, 10)], cb)
        assert all(isinstance(r, LedgerFencedError) for r in refused)
        refused = bookie.add_entries([(entry(e), key, e != 8) for e in range(7, 10)], cb)
        assert [r is None for r in refused] == [True, False, True]
        assert isinstance(refused[1], LedgerFencedError)
        assert bookie.add_entries([(entry(e), key, True) for e in (8, 10)], cb) == [None, None]
        for _ in range(5):
            assert done.acquire(timeout=10)
        assert durable == [None] * 5
        for e in (0, 1, 2, 4, 5, 6, 7, 8, 9, 10):
            assert bookie.read_entry(7, e) == entry(e)
    finally:
        opened.close()
