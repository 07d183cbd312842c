"""A new ledger's master key against its metadata (``Bookie``'s ``master_key_check``), on a real
bookie (journal, ledger storage, restart):

* a key the check refuses is never stored: the ledger stays unknown and its owner's key is then
  accepted (ADD, fence and explicit LAC alike);
* the check runs once per ledger per bookie process: later adds pay no metadata read, and a
  restarted bookie knows the key from its storage;
* a check that cannot be made (metadata store unreachable) refuses that add as retryable
  back-pressure (``OperationRejectedError``, answered ETOOMANYREQUESTS) and stores nothing;
* an empty password is a password: its key passes like any other.
The composition root's check itself (``service.MetadataMasterKeys``) against a real metadata
store (SQLite): absent ledger, wrong key, right key, empty password.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from vellum.bookie.assembly import OpenedBookie, open_bookie
from vellum.bookie.bookie import Bookie
from vellum.bookie.metrics import BookieMetrics
from vellum.config import ServerConfig
from vellum.errors import (
    ETOOMANYREQUESTS,
    MetadataStoreUnavailableError,
    NoSuchLedgerError,
    OperationRejectedError,
    UnauthorizedAccessError,
    wire_status_for,
)
from vellum.format.entry import DigestManager, DigestType, master_key

OWNER = master_key(b"owner")
SQUATTER = master_key(b"squatter")


class Metadata:
    """What the check sees: ledger id -> password; ``down`` makes it raise like a lost store."""

    def __init__(self) -> None:
        self.passwords: dict[int, bytes] = {}
        self.down = False
        self.calls: list[int] = []

    def check(self, ledger_id: int, key: bytes) -> bool:
        self.calls.append(ledger_id)
        if self.down:
            raise MetadataStoreUnavailableError("ZooKeeper connection lost")
        password = self.passwords.get(ledger_id)
        return password is not None and master_key(password) == key


def _open(base: Path, metadata: Metadata) -> OpenedBookie:
    cfg = ServerConfig(journal_directories=(str(base / "j"),), ledger_directories=(str(base / "l"),),
                       http_server_enabled=False)
    return open_bookie(cfg, bookie_id="127.0.0.1:3181", metrics=BookieMetrics(CollectorRegistry()),
                       master_key_check=metadata.check)


def _entry(lid: int, eid: int) -> bytes:
    return DigestManager(lid, DigestType.CRC32C).compute(eid, eid - 1, 1, b"x")


def _add(bookie: Bookie, lid: int, eid: int, key: bytes) -> None:
    done = threading.Event()
    errors: list[BaseException | None] = []

    def cb(exc: BaseException | None) -> None:
        errors.append(exc)
        done.set()

    bookie.add_entry(_entry(lid, eid), key, cb)
    assert done.wait(10) and errors == [None]


def _fence(bookie: Bookie, lid: int, key: bytes) -> None:
    done = threading.Event()
    bookie.fence_ledger(lid, key, lambda _exc: done.set())
    assert done.wait(10)


def test_a_refused_key_is_never_stored_and_the_owner_gets_the_ledger(tmp_path: Path) -> None:
    metadata = Metadata()
    opened = _open(tmp_path, metadata)
    bookie = opened.bookie
    try:
        for lid in (7, 8, 9):  # the squatter comes first, before the owner's metadata exists
            with pytest.raises(UnauthorizedAccessError, match=f"master key refused for ledger {lid}"):
                bookie.add_entry(_entry(lid, 0), SQUATTER, lambda _e: None)
        with pytest.raises(UnauthorizedAccessError):
            bookie.fence_ledger(8, SQUATTER, lambda _e: None)
        with pytest.raises(UnauthorizedAccessError):
            bookie.write_explicit_lac(9, SQUATTER, 0, b"lac", lambda _e: None)
        assert bookie.ledgers() == []  # nothing of theirs, not even a key
        metadata.passwords.update({7: b"owner", 8: b"owner", 9: b""})
        metadata.calls.clear()
        for eid in range(5):
            _add(bookie, 7, eid, OWNER)
        assert metadata.calls == [7]  # once per ledger: later adds compare with the known key
        _fence(bookie, 8, OWNER)
        assert bookie.is_fenced(8)
        empty = master_key(b"")
        _add(bookie, 9, 0, empty)
        with pytest.raises(UnauthorizedAccessError, match="wrong master key for ledger 7"):
            bookie.add_entry(_entry(7, 5), SQUATTER, lambda _e: None)
        calls = len(metadata.calls)
    finally:
        opened.close()
    opened = _open(tmp_path, metadata)  # a restarted bookie knows the keys from its storage
    try:
        _add(opened.bookie, 7, 5, OWNER)
        assert len(metadata.calls) == calls
    finally:
        opened.close()


def test_an_unreachable_metadata_store_refuses_as_retryable_and_sets_nothing(tmp_path: Path) -> None:
    metadata = Metadata()
    metadata.passwords[3] = b"owner"
    metadata.down = True
    opened = _open(tmp_path, metadata)
    bookie = opened.bookie
    try:
        with pytest.raises(OperationRejectedError, match="cannot check the master key of ledger 3") as refused:
            bookie.add_entry(_entry(3, 0), SQUATTER, lambda _e: None)
        assert refused.value.retryable and wire_status_for(refused.value) == ETOOMANYREQUESTS
        refused_batch = bookie.add_entries([(_entry(3, 0), OWNER, False)], lambda _e: None)
        assert refused_batch is not None and isinstance(refused_batch[0], OperationRejectedError)
        assert bookie.ledgers() == []
        metadata.down = False
        _add(bookie, 3, 0, OWNER)
        with pytest.raises(UnauthorizedAccessError):
            bookie.add_entry(_entry(3, 1), SQUATTER, lambda _e: None)
    finally:
        opened.close()


def test_the_composition_roots_check_reads_the_ledgers_metadata(tmp_path: Path) -> None:
    from vellum.ids import BookieId
    from vellum.meta import open_metadata_store
    from vellum.meta.model import LedgerMetadata
    from vellum.service import MetadataMasterKeys

    with open_metadata_store(f"sqlite:///{tmp_path / 'metadata.db'}") as store:
        store.format()

        def create(password: bytes) -> int:
            md = LedgerMetadata(1, 1, 1, {0: (BookieId("127.0.0.1:3181"),)}, password=password)
            return int(store.ledgers.create_ledger(md)[0])

        owned, empty = create(b"owner"), create(b"")
        check = MetadataMasterKeys(store.ledgers).matches
        assert check(owned, OWNER) and not check(owned, SQUATTER)
        assert check(empty, master_key(b"")) and not check(empty, OWNER)
        assert not check(empty + 1, OWNER)  # no metadata: nobody's ledger yet
        with pytest.raises(NoSuchLedgerError):
            store.ledgers.read_ledger(empty + 1)  # the check did not create it either
