"""A bookie whose journal fails turns read-only until restarted (docs/operations.md, "A failed
journal"): the journal sits on a real ext4 filesystem that dies (ext4's shutdown ioctl: every
write and fsync answers EIO). Normal adds, recovery adds and fences fail (never success), reads
are served, the state listeners hear it once, and the admin switch cannot undo it."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from vellum.bookie.assembly import open_bookie
from vellum.config import ServerConfig
from vellum.format.entry import DigestManager, DigestType, master_key
from vellum.testing.loop_fs import LoopFsUnavailable, ext4_loop_mount, shut_down

KEY = master_key(b"k")


@pytest.fixture
def ext4_mount(tmp_path: Path) -> Iterator[Path]:
    try:
        with ext4_loop_mount(tmp_path / "ext4", size_mb=64) as mount:
            yield mount
    except LoopFsUnavailable as e:
        pytest.skip(f"no loop-mounted ext4 here: {e}")


def _entry(lid: int, eid: int) -> bytes:
    return DigestManager(lid, DigestType.CRC32C, b"k").compute(eid, eid - 1, 0, b"%d:%d" % (lid, eid))


def _answer(start) -> BaseException | None:  # type: ignore[no-untyped-def]
    got: list[BaseException | None] = []
    done = threading.Event()

    def cb(exc: BaseException | None) -> None:
        got.append(exc)
        done.set()

    start(cb)
    assert done.wait(10), "no answer"
    return got[0]


def test_a_failed_journal_turns_the_bookie_read_only_for_good(tmp_path: Path, ext4_mount: Path) -> None:
    config = ServerConfig(journal_directories=(str(ext4_mount / "journal"),),
                          ledger_directories=(str(tmp_path / "ledgers"),), http_server_enabled=False)
    opened = open_bookie(config, bookie_id="b:1")
    bookie = opened.bookie
    heard: list[bool] = []
    bookie.add_state_listener(heard.append)
    try:
        assert _answer(lambda cb: bookie.add_entry(_entry(1, 0), KEY, cb)) is None
        assert not bookie.is_read_only and bookie.read_only_reason is None

        shut_down(ext4_mount)
        failed = _answer(lambda cb: bookie.add_entry(_entry(1, 1), KEY, cb))
        assert failed is not None
        assert bookie.is_read_only
        reason = bookie.read_only_reason
        assert reason is not None and reason.startswith("journal failed: ") and "Input/output error" in reason
        assert reason.endswith("restart the bookie after checking the journal disk")
        assert heard == [True]  # told once, at the failure
        # what needs the journal keeps failing, never success
        assert _answer(lambda cb: bookie.add_entry(_entry(2, 0), KEY, cb, recovery=True)) is not None
        assert _answer(lambda cb: bookie.fence_ledger(1, KEY, cb)) is not None
        # reads are served
        assert bytes(bookie.read_entry(1, 0)) == _entry(1, 0)
        # the admin switch cannot make it writable: only a restart does
        bookie.set_forced_read_only(False)
        assert bookie.is_read_only and bookie.read_only_reason == reason
    finally:
        with contextlib.suppress(Exception):  # the journal's disk is gone: a clean shutdown may fail
            opened.close()
