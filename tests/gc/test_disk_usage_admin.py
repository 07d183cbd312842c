"""GET /api/v1/bookie/disk_usage (``GcAdmin.disk_usage``) reports a dir's usage as the disk
checker measures it: blocks reserved for root count as taken, so what the console draws against
the thresholds is what turns the bookie read-only."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from vellum.admin.gc_admin import DiskThresholds, GcAdmin
from vellum.storage.dirs import LedgerDirsManager
from vellum.storage.gc import DiskState
from vellum.testing.loop_fs import LoopFsUnavailable, ext4_loop_mount


@pytest.fixture
def ext4_reserved_5(tmp_path: Path) -> Iterator[Path]:
    """A real ext4 filesystem with 5 % of its blocks reserved for root, on a loop device."""
    try:
        with ext4_loop_mount(tmp_path / "ext4", size_mb=64, reserved_percent=5) as mount:
            yield mount
    except LoopFsUnavailable as e:
        pytest.skip(f"no loop-mounted ext4 here: {e}")


def test_disk_usage_counts_reserved_blocks_like_the_disk_checker(ext4_reserved_5: Path) -> None:
    mount = ext4_reserved_5
    st = os.statvfs(mount)
    fd = os.open(mount / "filler", os.O_WRONLY | os.O_CREAT, 0o644)
    try:  # leave the bookie 3 % of the filesystem
        os.posix_fallocate(fd, 0, (st.f_bavail - st.f_blocks * 3 // 100) * st.f_frsize)
    finally:
        os.close(fd)
    # GcAdmin only reads the GC threads' dirs and states, and the journals: a stand-in bookie
    gc_thread = SimpleNamespace(storage=SimpleNamespace(ledger_dir=mount), disk_state=lambda: DiskState.FULL)
    bookie = cast(Any, SimpleNamespace(gc_threads=[gc_thread], journals=[]))
    report = GcAdmin(bookie=bookie, bookie_id="b", disk_thresholds=DiskThresholds(0.90, 0.95, 0.95)).disk_usage()
    (row,) = report["ledgerDirs"]
    st = os.statvfs(mount)
    assert row["totalBytes"] == st.f_blocks * st.f_frsize
    assert row["freeBytes"] == st.f_bavail * st.f_frsize  # what the bookie can still write
    assert row["usedBytes"] == (st.f_blocks - st.f_bfree) * st.f_frsize
    assert row["usage"] == round(1 - st.f_bavail / st.f_blocks, 4)
    assert row["usage"] == pytest.approx(LedgerDirsManager([mount]).usage(mount), abs=1e-4)
    assert row["usage"] > report["fullThreshold"] > row["usedBytes"] / row["totalBytes"]
