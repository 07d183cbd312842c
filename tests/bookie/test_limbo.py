"""Limbo ledgers (rule 12 of docs/correctness.md, ``bookie/integrity.py``): a bookie that may have lost data of a
ledger answers "unknown" (never "no such entry/ledger") for what it does not hold, serves what
it holds, refuses normal adds, stores recovery adds, and keeps the state across restarts until
it is cleared. Also the start-up side (``bookie/assembly.py``): wiped dirs stamped over with
``dataIntegrityChecking`` leave the "integrity check needed" marker, which survives a crash."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from vellum.bookie.assembly import OpenedBookie, open_bookie
from vellum.bookie.bookie import Bookie
from vellum.bookie.metrics import BookieMetrics
from vellum.config import ServerConfig
from vellum.errors import (
    CookieError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnknownLedgerStateError,
)
from vellum.format.entry import DigestManager, DigestType, master_key
from vellum.storage.cookies import read_cookie

KEY = master_key(b"pw")


def _config(base: Path, **kw: object) -> ServerConfig:
    return ServerConfig(journal_directories=(str(base / "j"),), ledger_directories=(str(base / "l"),),
                        http_server_enabled=False, **kw)  # type: ignore[arg-type]


def _entry(lid: int, eid: int) -> bytes:
    return DigestManager(lid, DigestType.CRC32C, b"pw").compute(eid, eid - 1, 0, b"%d:%d" % (lid, eid))


def _add(bookie: Bookie, lid: int, eid: int, *, recovery: bool = False) -> None:
    done = threading.Event()
    errors: list[BaseException | None] = []

    def cb(exc: BaseException | None) -> None:
        errors.append(exc)
        done.set()

    bookie.add_entry(_entry(lid, eid), KEY, cb, recovery=recovery)
    assert done.wait(10) and errors == [None]


def _assert_limbo_answers(bookie: Bookie, lid: int, held: list[int], missing: list[int]) -> None:
    for e in held:
        assert bytes(bookie.read_entry(lid, e)) == _entry(lid, e)
    for e in missing:
        with pytest.raises(UnknownLedgerStateError):
            bookie.read_entry(lid, e)
        with pytest.raises(UnknownLedgerStateError):
            bookie.read_entries(lid, e, 10, 0)
        with pytest.raises(UnknownLedgerStateError):
            bookie.read_strided(lid, e, 3, 10, 0)
    with pytest.raises(UnknownLedgerStateError):
        bookie.read_entry(lid, -1)
    with pytest.raises(UnknownLedgerStateError):
        bookie.last_add_confirmed(lid)
    with pytest.raises(UnknownLedgerStateError):
        bookie.read_explicit_lac(lid)
    with pytest.raises(UnknownLedgerStateError):
        bookie.entry_ids(lid)


def test_limbo_ledger_answers_unknown_for_what_it_lacks_and_survives_a_restart(tmp_path: Path) -> None:
    metrics = BookieMetrics(CollectorRegistry())
    opened = open_bookie(_config(tmp_path), bookie_id="b:1", metrics=metrics)
    try:
        bookie = opened.bookie
        for e in (0, 1, 2):
            _add(bookie, 7, e)
        # Before: the storage's own answers (what limbo must replace).
        with pytest.raises(NoSuchEntryError):
            bookie.read_entry(7, 5)
        with pytest.raises(NoSuchLedgerError):
            bookie.read_entry(8, 0)
        assert bookie.mark_limbo(7, KEY) and bookie.mark_limbo(8, KEY)  # 8: nothing held at all
        assert bookie.limbo.ids() == [7, 8] and bookie.limbo_ledger_count == 2
        assert metrics.samples("bookie_DATA_INTEGRITY_LIMBO_LEDGERS") == {(): 2.0}
        _assert_limbo_answers(bookie, 7, held=[0, 1, 2], missing=[3, 5])
        _assert_limbo_answers(bookie, 8, held=[], missing=[0, 1])
        assert [bytes(b) for b in bookie.read_entries(7, 0, 10, 0)] == [_entry(7, e) for e in (0, 1, 2)]
        # Fenced: normal adds refused, recovery adds stored (and then served).
        for lid in (7, 8):
            with pytest.raises(LedgerFencedError):
                bookie.add_entry(_entry(lid, 3), KEY, lambda _e: None)
        _add(bookie, 8, 0, recovery=True)
        assert bytes(bookie.read_entry(8, 0)) == _entry(8, 0)
        assert bookie.holds_entry(8, 0) and not bookie.holds_entry(8, 1)
        bookie.checkpoint()
    finally:
        opened.close()

    reopened = open_bookie(_config(tmp_path), bookie_id="b:1", metrics=BookieMetrics(CollectorRegistry()))
    try:
        bookie = reopened.bookie
        assert bookie.limbo.ids() == [7, 8]
        _assert_limbo_answers(bookie, 7, held=[0, 1, 2], missing=[3])
        bookie.clear_limbo(7)
        assert bookie.limbo.ids() == [8]
        with pytest.raises(NoSuchEntryError):  # cleared: the storage's answer again
            bookie.read_entry(7, 3)
        assert bookie.last_add_confirmed(7) == 1
        assert bookie.is_fenced(7)  # the fence stays
        bookie.checkpoint()
    finally:
        reopened.close()
    again = open_bookie(_config(tmp_path), bookie_id="b:1", metrics=BookieMetrics(CollectorRegistry()))
    try:
        assert again.bookie.limbo.ids() == [8]
        again.bookie.delete_ledger(8)  # GC: gone from the metadata, "no such ledger" is the truth
        assert again.bookie.limbo.ids() == []
        with pytest.raises(NoSuchLedgerError):
            again.bookie.read_entry(8, 0)
    finally:
        again.close()


def _wipe(base: Path) -> None:
    for d in ("j", "l"):
        shutil.rmtree(base / d)


def test_wiped_dirs_are_stamped_over_only_with_data_integrity_checking(tmp_path: Path) -> None:
    first = open_bookie(_config(tmp_path), bookie_id="b:1", metrics=BookieMetrics(CollectorRegistry()))
    store_cookie = first.cookie
    first.close()
    _wipe(tmp_path)
    for flags in ({}, {"data_integrity_checking": True}, {"data_integrity_stamp_missing_cookies": True}):
        with pytest.raises(CookieError, match="none of its directories"):
            open_bookie(_config(tmp_path, **flags), bookie_id="b:1", store_cookie=store_cookie,
                        metrics=BookieMetrics(CollectorRegistry()))
        assert read_cookie(tmp_path / "l") is None
    on = {"data_integrity_checking": True, "data_integrity_stamp_missing_cookies": True}
    opened = open_bookie(_config(tmp_path, **on), bookie_id="b:1", store_cookie=store_cookie,
                         metrics=BookieMetrics(CollectorRegistry()))
    try:
        assert opened.integrity_check_needed is not None and "lost their cookie" not in opened.integrity_check_needed
        assert "every directory lost its cookie" in opened.integrity_check_needed
        assert read_cookie(tmp_path / "l") == store_cookie
    finally:
        opened.close()  # a "crash" before the marking: the need survives
    with pytest.raises(CookieError, match="dataIntegrityChecking=true"):
        open_bookie(_config(tmp_path), bookie_id="b:1", store_cookie=store_cookie,
                    metrics=BookieMetrics(CollectorRegistry()))
    again: OpenedBookie = open_bookie(_config(tmp_path, **on), bookie_id="b:1", store_cookie=store_cookie,
                                      metrics=BookieMetrics(CollectorRegistry()))
    try:
        assert again.integrity_check_needed is not None
        again.integrity_marking_done()
    finally:
        again.close()
    done = open_bookie(_config(tmp_path), bookie_id="b:1", store_cookie=store_cookie,
                       metrics=BookieMetrics(CollectorRegistry()))
    try:
        assert done.integrity_check_needed is None
    finally:
        done.close()


def test_a_lost_journal_is_stamped_over_and_needs_the_check(tmp_path: Path) -> None:
    on = {"data_integrity_checking": True, "data_integrity_stamp_missing_cookies": True}
    opened = open_bookie(_config(tmp_path, **on), bookie_id="b:1", metrics=BookieMetrics(CollectorRegistry()))
    assert opened.integrity_check_needed is None  # a fresh bookie lost nothing
    opened.close()
    shutil.rmtree(tmp_path / "j")
    with pytest.raises(CookieError, match="wiped"):
        open_bookie(_config(tmp_path), bookie_id="b:1", metrics=BookieMetrics(CollectorRegistry()))
    opened = open_bookie(_config(tmp_path, **on), bookie_id="b:1", metrics=BookieMetrics(CollectorRegistry()))
    try:
        assert opened.integrity_check_needed is not None and str(tmp_path / "j") in opened.integrity_check_needed
        assert read_cookie(tmp_path / "j") is not None
    finally:
        opened.close()


def test_unclean_shutdown_without_journal_fsync_needs_the_check(tmp_path: Path) -> None:
    cfg = _config(tmp_path, data_integrity_checking=True, journal_sync_data=False)
    opened = open_bookie(cfg, bookie_id="b:1", metrics=BookieMetrics(CollectorRegistry()))
    opened.bookie.shutdown()  # no mark_clean: as after a crash
    for lock in opened._locks:
        lock.release()
    again = open_bookie(cfg, bookie_id="b:1", metrics=BookieMetrics(CollectorRegistry()))
    try:
        assert again.unclean_shutdown and again.integrity_check_needed is not None
        assert "journalSyncData=false" in again.integrity_check_needed
    finally:
        again.close()
