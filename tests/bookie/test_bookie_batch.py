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
