"""A ledger GC deleted while some of its entries were still only in the journal: after a crash
the bookie must start (not refuse), and the ledger stays deleted: replay does not bring its
entries back, and a writer that still holds it cannot recreate it (defect D2 of docs/correctness.md)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from vellum.bookie.assembly import OpenedBookie, open_bookie
from vellum.config import ServerConfig
from vellum.errors import LedgerFencedError, NoSuchLedgerError
from vellum.format.entry import DigestManager, DigestType, master_key

KEY = master_key(b"k")


def _add(opened: OpenedBookie, lid: int, eid: int) -> bytes:
    data = DigestManager(lid, DigestType.CRC32C, b"k").compute(eid, eid - 1, 0, b"e%d" % eid)
    done = threading.Event()
    opened.bookie.add_entry(data, KEY, lambda exc: done.set())
    assert done.wait(10)
    return data


def _crash(opened: OpenedBookie) -> None:
    """Stop without a final checkpoint and drop the write caches (see the state machine test)."""
    bookie = opened.bookie
    bookie._checkpointer.stop()
    bookie._dirs.stop()
    for gc in bookie._gc_threads:
        gc.stop()
    for journal in bookie._journals:
        journal.shutdown()
    for storage in bookie._storages:
        storage.flush = lambda: None  # type: ignore[method-assign]
        storage.close()
    for lock in opened._locks:
        lock.release()


def test_crash_after_gc_deleted_a_journaled_ledger(tmp_path: Path) -> None:
    config = ServerConfig(journal_directories=(str(tmp_path / "j"),), ledger_directories=(str(tmp_path / "l"),),
                          flush_interval_ms=3_600_000, http_server_enabled=False)
    opened = open_bookie(config, bookie_id="b:1")
    _add(opened, 1, 0)
    opened.bookie.checkpoint()            # the key record of ledger 1 is now below the mark
    _add(opened, 1, 1)                    # journaled after the mark
    _add(opened, 2, 0)                    # a live ledger, journaled after the mark
    opened.bookie.delete_ledger(1)        # GC: gone from metadata
    _crash(opened)
    reopened = open_bookie(config, bookie_id="b:1")
    try:
        assert reopened.unclean_shutdown
        with pytest.raises(NoSuchLedgerError):
            reopened.bookie.read_entry(1, 1)
        with pytest.raises(LedgerFencedError, match="deleted"):
            _add(reopened, 1, 2)
        assert reopened.bookie.adds_rejected["deleted"] == 1
        assert _add(reopened, 2, 1)       # the bookie takes adds of live ledgers
        assert reopened.bookie.read_entry(2, 0)
    finally:
        reopened.close()
