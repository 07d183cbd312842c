"""The decoded ADD batch flows down unchanged: ``Bookie.add_batch`` validates it once and hands
the write cache and the journal the very same ``AddBatch`` when every add is admitted (one
ledger dir, one journal); refused adds are left out of what reaches them, and nothing refused is
stored or journaled."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from vellum.bookie.assembly import open_bookie
from vellum.config import ServerConfig
from vellum.errors import IncorrectParameterError, UnauthorizedAccessError
from vellum.format.entry import DigestManager, DigestType, master_key
from vellum.proto.messages import AddBatch


def test_the_same_batch_reaches_the_write_cache_and_the_journal(tmp_path: Path) -> None:
    config = ServerConfig(journal_directories=(str(tmp_path / "j"),), ledger_directories=(str(tmp_path / "l"),),
                          http_server_enabled=False)
    key, other = master_key(b"k"), master_key(b"other")
    dm = DigestManager(1, DigestType.CRC32C, b"k")
    opened = open_bookie(config, bookie_id="b:1")
    seen: dict[str, list[Any]] = {"storage": [], "journal": []}
    storage = opened.bookie._storages[0]
    journal = opened.bookie.journals[0]
    store, log = storage.write_batch, journal.log_batch

    def spy_store(batch: AddBatch) -> Any:
        seen["storage"].append(batch)
        return store(batch)

    def spy_log(batch: AddBatch, callback: Any) -> None:
        seen["journal"].append(batch)
        log(batch, callback)

    storage.write_batch = spy_store  # type: ignore[method-assign]
    journal.log_batch = spy_log  # type: ignore[method-assign]
    try:
        bookie = opened.bookie
        done = threading.Event()
        assert bookie.add_batch(AddBatch.of_entries([(dm.compute(0, -1, 0, b"a"), key, False)]),
                                lambda exc: done.set()) == [None]  # the ledger is created here
        assert done.wait(10)
        seen["storage"].clear()
        seen["journal"].clear()

        batch = AddBatch.of_entries([(dm.compute(e, e - 1, 0, b"e%d" % e), key, False) for e in range(1, 6)])
        done.clear()
        assert bookie.add_batch(batch, lambda exc: done.set()) == [None] * 5
        assert done.wait(10)
        assert seen["storage"] == [batch] and seen["storage"][0] is batch
        assert seen["journal"] == [batch] and seen["journal"][0] is batch
        assert bookie.last_add_confirmed(1) == 4  # the LAC column moved the ledger's LAC

        # A refused add (wrong key, an entry too short for its header) never reaches them.
        mixed = AddBatch.of_entries([(dm.compute(6, 5, 0, b"f"), key, False), (dm.compute(7, 6, 0, b"g"), other, False),
                                     (b"\x00" * 20, key, False), (dm.compute(8, 7, 0, b"h"), key, False)])
        done.clear()
        refused = bookie.add_batch(mixed, lambda exc: done.set())
        assert refused is not None and refused[0] is None and refused[3] is None
        assert isinstance(refused[1], UnauthorizedAccessError) and isinstance(refused[2], IncorrectParameterError)
        assert done.wait(10)
        assert seen["storage"][-1].entry_ids == [6, 8] and seen["journal"][-1].entry_ids == [6, 8]
        assert bookie.read_entry(1, 8) == mixed.entries[3]
        assert bookie.read_cached_entry(1, 7) is None
    finally:
        opened.close()
