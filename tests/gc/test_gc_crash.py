"""kill -9 of a process running compaction at each step (rule 8 of docs/correctness.md), then restart and
compact again: nothing live is lost, nothing dead (deleted ledgers, trimmed entries) comes
back, and the leftovers of the interrupted compaction are gone after the next pass."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from gc_support import (  # noqa: E402
    FakeLister,
    live_entries_by_log,
    open_storage,
    read_back_through_index,
    write_ledgers,
)

from vellum.errors import NoSuchEntryError, NoSuchLedgerError  # noqa: E402
from vellum.storage.compaction import STEPS  # noqa: E402
from vellum.storage.gc import GarbageCollectorThread, GcSettings  # noqa: E402

LEDGERS = list(range(1, 21))
LIVE = LEDGERS[1::2]
DEAD = LEDGERS[::2]
ENTRIES = 30
TRIMMED_LEDGER, TRIM_TO = 2, 10


def _prepare(base: Path) -> None:
    st = open_storage(base)
    write_ledgers(st, LEDGERS, ENTRIES)
    st.entry_logger.rotate()
    st.trim(TRIMMED_LEDGER, TRIM_TO)
    st.flush()
    st.close()


def _live() -> list[tuple[int, int]]:
    return [(lid, e) for lid in LIVE for e in range(TRIM_TO if lid == TRIMMED_LEDGER else 0, ENTRIES)]


def _check(st) -> None:  # type: ignore[no-untyped-def]
    # Reverse order, no read-ahead: every entry is found through the index alone.
    read_back_through_index(st, _live())
    for eid in range(TRIM_TO):
        with pytest.raises(NoSuchEntryError):
            st.get_entry(TRIMMED_LEDGER, eid)


@pytest.mark.parametrize("nth", [1, 2])
@pytest.mark.parametrize("step", STEPS)
def test_crash_at_each_compaction_step(tmp_path: Path, step: str, nth: int) -> None:
    _prepare(tmp_path)
    env = dict(os.environ, VELLUM_GC_CRASH_AT=step, VELLUM_GC_CRASH_NTH=str(nth))
    proc = subprocess.run(
        [sys.executable, str(HERE / "gc_crash_child.py"), str(tmp_path), ",".join(map(str, LIVE))],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert f"CRASH {step}" in proc.stdout, proc.stdout + proc.stderr
    assert proc.returncode == -9
    st = open_storage(tmp_path)
    try:
        _check(st)  # readable right after the restart, before any recovery
        live_in = live_entries_by_log(st, LIVE)
        report = GarbageCollectorThread(st, GcSettings(), lister=FakeLister(LIVE)).run_once(force=True)
        # Each log compacted now moved exactly its live entries' index entries.
        for c in report.compactions:
            assert c.entries_moved == len(live_in.get(c.log_id, ())), c
        _check(st)
        names = os.listdir(tmp_path / "current")
        assert not [n for n in names if n.endswith((".compacting", ".compacted"))], names
        for lid in DEAD:
            with pytest.raises(NoSuchLedgerError):
                st.get_entry(lid, 0)
        # Every surviving log holds live data only: dead ledgers are in no ledgers map, and
        # each live entry is stored exactly once (no leaked copy from the interrupted pass).
        stored: list[tuple[int, int]] = []
        for log_id in st.entry_logger.log_ids():
            assert not set(st.entry_logger.ledgers_map(log_id)) & set(DEAD)
            stored.extend((rec.ledger_id, rec.entry_id) for rec in st.entry_logger.scan(log_id))
        assert sorted(stored) == sorted(_live())
        assert report.listing_error == ""
    finally:
        st.close()
    # A second restart changes nothing.
    st = open_storage(tmp_path)
    try:
        _check(st)
    finally:
        st.close()
