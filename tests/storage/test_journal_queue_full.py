"""A full journal queue (``journalQueueSize``) pushes back on the adder instead of growing.

The journal sits on a real ext4 filesystem on a loop device; ``fsfreeze`` makes its disk stop
taking writes, as a stalled device would. The writer blocks in its write, the queue fills up to
``journalQueueSize`` records, and the next add waits (BookKeeper's journal queue is a blocking
queue too). Nothing is acknowledged while the disk is frozen; once it is thawed every record,
the waiting one included, is written, fsynced and acknowledged in order."""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from vellum.format.lastmark import ZERO_MARK
from vellum.storage.journal import Journal
from vellum.testing.loop_fs import LoopFsUnavailable, ext4_loop_mount, frozen

WAIT = 30.0  # generous bound for events (not a speed assertion)
QUEUE = 8


def entry(ledger_id: int, entry_id: int, size: int = 100) -> bytes:
    payload = bytes((entry_id + i) % 251 for i in range(size))
    return struct.pack(">qqqq", ledger_id, entry_id, entry_id - 1, size) + payload


@pytest.fixture
def ext4_mount(tmp_path: Path) -> Iterator[Path]:
    try:
        with ext4_loop_mount(tmp_path / "ext4", size_mb=64) as mount:
            yield mount
    except LoopFsUnavailable as e:
        pytest.skip(f"no loop-mounted ext4 here: {e}")


class Acks:
    def __init__(self) -> None:
        self.results: list[tuple[int, BaseException | None]] = []
        self.cond = threading.Condition()

    def cb(self, key: int) -> Callable[[BaseException | None], None]:
        def done(exc: BaseException | None) -> None:
            with self.cond:
                self.results.append((key, exc))
                self.cond.notify_all()

        return done

    def wait(self, n: int) -> list[tuple[int, BaseException | None]]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.results) >= n, WAIT), self.results
            return list(self.results)


@pytest.mark.parametrize("sync_in_writer", [True, False], ids=["sync-in-writer", "force-write-thread"])
def test_a_full_journal_queue_blocks_the_adder_until_the_disk_moves(ext4_mount: Path, sync_in_writer: bool) -> None:
    j = Journal(ext4_mount / "journal", queue_size=QUEUE, max_group_wait_ms=1, prealloc_size_mb=1,
                sync_in_writer=sync_in_writer)
    j.start()
    acks = Acks()
    j.log_entry(1, 0, entry(1, 0), acks.cb(0))
    acks.wait(1)  # the journal works
    blocked: threading.Thread | None = None
    try:
        with frozen(ext4_mount):
            # The writer takes what is queued and blocks writing it; later records stay queued
            # until the queue holds journalQueueSize of them.
            n = 1
            for _round in range(5):
                while j.can_take(1) and n < 50 * QUEUE:
                    j.log_entry(1, n, entry(1, n), acks.cb(n))
                    n += 1
                    time.sleep(0.005)  # let the writer take what it can before its write blocks
                time.sleep(0.2)  # a writer not yet blocked (a loaded machine) takes them now
                if not j.can_take(1):
                    break
            assert not j.can_take(1), f"{n - 1} records queued on a frozen disk and the queue is not full"
            assert n - 1 >= QUEUE
            # The next add waits for room: back-pressure, not a refusal and not a bigger queue.
            last = n
            blocked = threading.Thread(target=j.log_entry, args=(1, last, entry(1, last), acks.cb(last)))
            blocked.start()
            blocked.join(0.5)
            assert blocked.is_alive(), "an add into a full journal queue returned at once"
            assert [k for k, _ in acks.results] == [0], "acknowledged while the disk could not write"
        blocked.join(WAIT)
        assert not blocked.is_alive(), "the waiting add never entered the queue after the disk thawed"
        results = acks.wait(last + 1)
        assert [k for k, _ in results] == list(range(last + 1))
        assert all(exc is None for _, exc in results)
    finally:
        if blocked is not None:
            blocked.join(WAIT)
        j.shutdown()
    replayed: list[bytes] = []
    Journal(ext4_mount / "journal").replay(ZERO_MARK, lambda r: replayed.append(r.data))
    assert replayed == [entry(1, i) for i in range(last + 1)]
