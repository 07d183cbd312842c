"""A ledger GC deleted while some of its entries were still only in the journal: after a crash
the bookie must start (not refuse), restore those entries, and accept the ledger's next adds."""

from __future__ import annotations

import threading
from pathlib import Path

from vellum.bookie.bookie import OpenedBookie, open_bookie
from vellum.config import ServerConfig
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
    late = _add(opened, 1, 1)             # journaled after the mark
    opened.bookie.delete_ledger(1)        # GC: gone from metadata
    _crash(opened)
    reopened = open_bookie(config, bookie_id="b:1")
    try:
        assert reopened.unclean_shutdown
        assert reopened.bookie.read_entry(1, 1) == late   # restored; GC will delete it again
        assert _add(reopened, 1, 2)                       # and the bookie takes adds
    finally:
        reopened.close()
