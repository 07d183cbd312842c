"""Journal: group commit, callbacks after fsync, replay, roll, GC, torn tails and fail-stop.

Every test runs with buffered writes and with direct I/O (``journalDirectIO``), and with both
fsync structures."""

from __future__ import annotations

import os
import random
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from direct_io_support import takes_direct_io

from vellum.errors import CorruptionError, StorageError, UnknownFormatVersionError
from vellum.format.journal import JournalRecord, RecordKind, StopReason, encode_header
from vellum.format.lastmark import ZERO_MARK, LogMark
from vellum.storage.journal import Journal, journal_file_name

WAIT = 10.0  # generous bound for events in tests (not a speed assertion)


def entry(ledger_id: int, entry_id: int, size: int = 100) -> bytes:
    payload = bytes((entry_id + i) % 251 for i in range(size))
    return struct.pack(">qqqq", ledger_id, entry_id, entry_id - 1, size) + payload


@pytest.fixture(autouse=True, params=["sync-in-writer", "force-write-thread"])
def _sync_mode(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test runs with both structures: the writer fsyncs itself, or hands the fsync to
    a force-write thread (``journalForceWriteThread``)."""
    global _SYNC_IN_WRITER
    _SYNC_IN_WRITER = request.param == "sync-in-writer"
    yield
    _SYNC_IN_WRITER = True


_SYNC_IN_WRITER = True


@pytest.fixture(autouse=True, params=["buffered", "direct-io"])
def _io_mode(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[None]:
    """Every test runs with buffered writes and with O_DIRECT (``journalDirectIO``)."""
    global _DIRECT
    if request.param == "direct-io":
        why = takes_direct_io(tmp_path)
        if why is not None:
            pytest.skip(f"direct I/O variant: {why} (test_journal_direct_io.py covers it elsewhere)")
    _DIRECT = request.param == "direct-io"
    yield
    _DIRECT = False


_DIRECT = False


def make(tmp_path: Path, **kw: Any) -> Journal:
    kw.setdefault("prealloc_size_mb", 1)
    kw.setdefault("max_group_wait_ms", 1)
    kw.setdefault("sync_in_writer", _SYNC_IN_WRITER)
    kw.setdefault("direct_io", _DIRECT and kw.get("format_version", 6) >= 5)
    j = Journal(tmp_path / "journal", **kw)
    assert j.direct_io == kw["direct_io"]
    return j


class Acks:
    """Collects callback results; wait(n) blocks until n callbacks ran."""

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


def replay_all(j: Journal, mark: LogMark = ZERO_MARK) -> list[JournalRecord]:
    out: list[JournalRecord] = []
    j.replay(mark, out.append)
    return out


def test_replay_returns_exactly_the_acked_records_in_order(tmp_path: Path) -> None:
    j = make(tmp_path)
    j.start()
    acks = Acks()
    for i in range(200):
        j.log_entry(1, i, entry(1, i), acks.cb(i))
    j.log_master_key(1, b"k" * 20, acks.cb(1000))
    j.log_fence(1, acks.cb(1001))
    j.log_explicit_lac(1, b"lacbody", acks.cb(1002))
    results = acks.wait(203)
    assert all(exc is None for _, exc in results)
    assert sorted(k for k, _ in results) == [*range(200), 1000, 1001, 1002]
    j.shutdown()
    records = replay_all(make(tmp_path))
    assert [r.data for r in records[:200]] == [entry(1, i) for i in range(200)]
    assert [(r.kind, r.data) for r in records[200:]] == [
        (RecordKind.MASTER_KEY, b"k" * 20),
        (RecordKind.FENCE, b""),
        (RecordKind.EXPLICIT_LAC, b"lacbody"),
    ]


def test_callbacks_never_run_before_their_fsync(tmp_path: Path) -> None:
    gate = threading.Event()
    synced_upto: list[int] = []  # size of the file at each completed fsync
    calls: list[str] = []

    def fsync(fd: int) -> None:
        calls.append("fsync-start")
        assert gate.wait(WAIT)
        os.fdatasync(fd)
        synced_upto.append(os.fstat(fd).st_size)
        calls.append("fsync-done")

    j = make(tmp_path, fsync=fsync, buffered_entries_threshold=1)
    j.start()
    assert j.direct_io == _DIRECT  # the direct variant really writes with O_DIRECT
    acks = Acks()
    j.log_entry(1, 0, entry(1, 0), acks.cb(0))
    # the writer wrote the batch and the force-write thread sits in fsync: no ack yet
    for _ in range(100):
        if calls:
            break
        threading.Event().wait(0.01)
    assert calls == ["fsync-start"]
    assert acks.results == []
    gate.set()
    acks.wait(1)
    assert calls[:2] == ["fsync-start", "fsync-done"]
    mark = j.current_mark()
    assert mark.offset > 512
    j.shutdown()


def test_entries_threshold_one_acks_a_single_entry_despite_a_huge_wait(tmp_path: Path) -> None:
    j = make(tmp_path, max_group_wait_ms=10**7, buffered_entries_threshold=1)
    j.start()
    acks = Acks()
    j.log_entry(1, 0, entry(1, 0), acks.cb(0))
    assert acks.wait(1) == [(0, None)]
    j.shutdown()


def test_flush_when_queue_empty_acks_without_waiting(tmp_path: Path) -> None:
    j = make(tmp_path, max_group_wait_ms=10**7, flush_when_queue_empty=True)
    j.start()
    acks = Acks()
    j.log_fence(3, acks.cb(0))
    assert acks.wait(1) == [(0, None)]
    j.shutdown()


def test_bytes_threshold_flushes(tmp_path: Path) -> None:
    j = make(tmp_path, max_group_wait_ms=10**7, buffered_writes_threshold=3000)
    j.start()
    acks = Acks()
    for i in range(3):  # 3 x ~1 KiB crosses 3000 bytes
        j.log_entry(1, i, entry(1, i, 1000), acks.cb(i))
    assert sorted(acks.wait(3)) == [(0, None), (1, None), (2, None)]
    j.shutdown()


def _one_take(tmp_path: Path, n: int, size: int, **kw: Any) -> tuple[Journal, Acks, Callable[[], None]]:
    """A journal whose writer sits in its first fsync while ``n`` records of ``size`` bytes are
    queued, so that its next take holds all of them; returns it, the acks and the gate opener."""
    gate = threading.Event()
    in_fsync = threading.Event()
    fail_after = kw.pop("fail_after", None)
    calls = [0]

    def fsync(fd: int) -> None:
        calls[0] += 1
        if calls[0] == 1:
            in_fsync.set()
            assert gate.wait(WAIT)
        if fail_after is not None and calls[0] > fail_after:
            raise OSError(5, "Input/output error")
        os.fdatasync(fd)

    j = make(tmp_path, fsync=fsync, max_group_wait_ms=10**7, buffered_entries_threshold=1, **kw)
    j.start()
    acks = Acks()
    j.log_entry(1, 0, entry(1, 0), acks.cb(0))
    assert in_fsync.wait(WAIT)
    for i in range(1, n + 1):
        j.log_entry(1, i, entry(1, i, size), acks.cb(i))
    return j, acks, gate.set


def test_the_batches_a_threshold_cuts_out_of_one_take_share_one_fsync(tmp_path: Path) -> None:
    """Twenty records queued while the writer fsyncs are one take; the entries threshold (1)
    cuts it into twenty batches, each written as it fills, all acknowledged only after an fsync
    that covers them: with the writer fsyncing itself, one fsync for the whole take."""
    j, acks, open_gate = _one_take(tmp_path, 20, 100)
    assert j.fsyncs_total == 0
    open_gate()
    assert sorted(acks.wait(21)) == [(i, None) for i in range(21)]
    if _SYNC_IN_WRITER:
        assert j.fsyncs_total == 2, "the threshold's batches of one take were fsynced one by one"
    j.shutdown()
    assert [r.entry_id for r in replay_all(make(tmp_path))] == list(range(21))


def test_a_failed_fsync_of_a_take_fails_every_batch_a_threshold_cut_from_it(tmp_path: Path) -> None:
    j, acks, open_gate = _one_take(tmp_path, 20, 100, fail_after=1)
    open_gate()
    results = dict(acks.wait(21))
    assert results.pop(0) is None
    assert all(isinstance(exc, StorageError) for exc in results.values()), results
    assert j.current_mark().offset > 0 and j.failed is not None
    j.shutdown()


def test_a_roll_inside_a_take_forces_what_the_threshold_cut_before_it(tmp_path: Path) -> None:
    """A take of ~2.4 MiB into 1 MiB journals: the journal rolls in the middle of the take,
    after the batches cut before the roll are fsynced; everything replays in order."""
    j, acks, open_gate = _one_take(tmp_path, 40, 60 * 1024, max_size_mb=1)
    first = j.current_journal_id
    open_gate()
    assert sorted(acks.wait(41)) == [(i, None) for i in range(41)]
    j.shutdown()
    assert len(j.journal_ids()) >= 3 and j.journal_ids()[0] == first
    assert [r.entry_id for r in replay_all(make(tmp_path))] == list(range(41))


def test_below_every_threshold_nothing_is_acked_until_shutdown(tmp_path: Path) -> None:
    # the negative control for the trigger tests above: they can fail
    j = make(tmp_path, max_group_wait_ms=10**7, buffered_writes_threshold=10**6)
    j.start()
    acks = Acks()
    j.log_entry(1, 0, entry(1, 0), acks.cb(0))
    with acks.cond:
        assert not acks.cond.wait_for(lambda: bool(acks.results), 0.3)
    j.shutdown()  # flushes what is queued
    assert acks.results == [(0, None)]
    assert [r.entry_id for r in replay_all(make(tmp_path))] == [0]


def test_max_group_wait_flushes(tmp_path: Path) -> None:
    j = make(tmp_path, max_group_wait_ms=5, buffered_writes_threshold=10**6)
    j.start()
    acks = Acks()
    j.log_entry(1, 0, entry(1, 0), acks.cb(0))
    assert acks.wait(1) == [(0, None)]
    j.shutdown()


def test_roll_and_gc_keep_max_backups(tmp_path: Path) -> None:
    j = make(tmp_path, max_size_mb=1, max_backups=2, buffered_entries_threshold=1)
    j.start()
    first = j.current_journal_id
    acks = Acks()
    n = 5 * 1024 // 60  # ~5 MiB of 60 KiB entries
    for i in range(n):
        j.log_entry(1, i, entry(1, i, 60 * 1024), acks.cb(i))
    acks.wait(n)
    j.shutdown()  # lets a roll that follows the last flush finish
    ids = j.journal_ids()
    assert len(ids) >= 5 and ids == list(range(first, first + len(ids)))
    assert j.current_journal_id == ids[-1]
    assert j.current_mark().journal_id in ids[-2:]
    # everything is replayable across the rolled files
    assert [r.entry_id for r in replay_all(make(tmp_path))] == list(range(n))
    deleted = j.gc_journals(LogMark(ids[-2], 0))
    left = j.journal_ids()
    assert [p.name for p in deleted] == [journal_file_name(i) for i in ids[: len(ids) - 2 - 2]]
    assert left == ids[-4:]  # 2 backups below the mark, the marked one, the current one
    assert j.gc_journals(LogMark(ids[-1] + 5, 0)) and j.current_journal_id in j.journal_ids()


def test_replay_from_a_mark_skips_what_is_before_it(tmp_path: Path) -> None:
    j = make(tmp_path, buffered_entries_threshold=1)
    j.start()
    acks = Acks()
    j.log_entry(1, 0, entry(1, 0), acks.cb(0))
    acks.wait(1)
    mark = j.current_mark()
    j.log_entry(1, 1, entry(1, 1), acks.cb(1))
    acks.wait(2)
    j.shutdown()
    assert [r.entry_id for r in replay_all(make(tmp_path), mark)] == [1]


def _write_some(tmp_path: Path, n: int) -> tuple[Journal, list[int]]:
    j = make(tmp_path, buffered_entries_threshold=3)
    j.start()
    acks = Acks()
    for i in range(n):
        j.log_entry(1, i, entry(1, i, 200), acks.cb(i))
    acks.wait(n)
    j.shutdown()
    return j, list(range(n))


def test_torn_tail_after_truncation_at_random_points(tmp_path: Path) -> None:
    j, ids = _write_some(tmp_path, 30)
    path = j.current_path
    data = path.read_bytes()
    end = j.current_mark().offset
    rng = random.Random(7)
    for cut in [rng.randrange(0, end + 1) for _ in range(25)] + [end, 512, 0]:
        path.write_bytes(data[:cut])
        got = [r.entry_id for r in replay_all(make(tmp_path))]
        assert got == ids[: len(got)]
    path.write_bytes(data)
    assert [r.entry_id for r in replay_all(make(tmp_path))] == ids


def test_flipped_byte_in_last_batch_is_a_torn_tail(tmp_path: Path) -> None:
    j, ids = _write_some(tmp_path, 9)  # 3 batches of 3
    path = j.current_path
    data = bytearray(path.read_bytes())
    records = replay_all(make(tmp_path))
    data[records[-1].offset + 50] ^= 0x01
    path.write_bytes(bytes(data))
    fresh = make(tmp_path)
    out: list[JournalRecord] = []
    result = fresh.replay(ZERO_MARK, out.append)
    assert [r.entry_id for r in out] == ids[:6]
    assert result.torn_tail and result.journals[-1].stop.reason is StopReason.CHECKSUM_MISMATCH
    # starting a new journal seals the old one: it becomes a clean non-last journal
    fresh.start()
    acks = Acks()
    fresh.log_entry(2, 0, entry(2, 0), acks.cb(0))
    fresh.shutdown()
    assert [(r.ledger_id, r.entry_id) for r in replay_all(make(tmp_path))] == [
        *[(1, i) for i in ids[:6]],
        (2, 0),
    ]


def test_corruption_in_a_non_last_journal_is_an_error(tmp_path: Path) -> None:
    j, _ = _write_some(tmp_path, 9)
    first = j.current_path
    j2 = make(tmp_path, buffered_entries_threshold=1)
    j2.start()
    acks = Acks()
    j2.log_entry(2, 0, entry(2, 0), acks.cb(0))
    acks.wait(1)
    j2.shutdown()
    data = bytearray(first.read_bytes())
    data[600] ^= 0xFF
    first.write_bytes(bytes(data))
    with pytest.raises(CorruptionError, match=rf"{first.name}.*offset \d+"):
        replay_all(make(tmp_path))


def test_missing_marked_journal_is_fail_stop(tmp_path: Path) -> None:
    j, _ = _write_some(tmp_path, 3)
    with pytest.raises(CorruptionError, match=r"named by lastMark .* is missing"):
        replay_all(make(tmp_path), LogMark(j.current_journal_id - 1, 512))
    j.current_path.unlink()
    with pytest.raises(CorruptionError, match="is missing"):
        replay_all(make(tmp_path), LogMark(j.current_journal_id, 512))
    assert replay_all(make(tmp_path)) == []  # a fresh bookie: nothing to replay


def test_unknown_version_error(tmp_path: Path) -> None:
    current = tmp_path / "journal" / "current"
    current.mkdir(parents=True)
    (current / "10.txn").write_bytes(b"BKLG" + struct.pack(">i", 9) + bytes(504))
    with pytest.raises(UnknownFormatVersionError, match="version 9"):
        replay_all(make(tmp_path))
    with pytest.raises(UnknownFormatVersionError):
        make(tmp_path, format_version=7)


def test_fsync_failure_fails_pending_and_later_records(tmp_path: Path) -> None:
    def fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    j = make(tmp_path, fsync=fsync, buffered_entries_threshold=1)
    j.start()
    start_mark = j.current_mark()
    acks = Acks()
    j.log_entry(1, 0, entry(1, 0), acks.cb(0))
    j.log_entry(1, 1, entry(1, 1), acks.cb(1))
    results = acks.wait(2)
    assert all(isinstance(exc, StorageError) for _, exc in results)
    assert str(j.current_path) in str(results[0][1])
    j.log_entry(1, 2, entry(1, 2), acks.cb(2))  # a later record fails too, never acked
    later = acks.wait(3)[2]
    assert later[0] == 2 and isinstance(later[1], StorageError)
    assert j.current_mark() == start_mark and j.failed is not None
    j.shutdown()


def test_write_failure_is_fail_stop(tmp_path: Path) -> None:
    j = make(tmp_path, buffered_entries_threshold=1)
    j.start()
    acks = Acks()
    j.log_entry(1, 0, entry(1, 0), acks.cb(0))
    acks.wait(1)
    os.close(j._file.fd)  # the next pwrite fails with EBADF
    j.log_entry(1, 1, entry(1, 1), acks.cb(1))
    res = acks.wait(2)[1]
    assert isinstance(res[1], StorageError) and "write of journal" in str(res[1])
    j._file.fd = -1  # already closed above
    j.shutdown()


def test_several_journals_are_independent(tmp_path: Path) -> None:
    js = [Journal(tmp_path / f"j{i}", i, prealloc_size_mb=1, buffered_entries_threshold=1) for i in range(2)]
    acks = Acks()
    for j in js:
        j.start()
    for i in range(10):
        js[i % 2].log_entry(i, 0, entry(i, 0), acks.cb(i))
    acks.wait(10)
    for j in js:
        j.shutdown()
    assert [r.ledger_id for r in replay_all(js[0])] == [0, 2, 4, 6, 8]
    assert [r.ledger_id for r in replay_all(js[1])] == [1, 3, 5, 7, 9]


def test_v4_journal_writes_without_padding(tmp_path: Path) -> None:
    j = make(tmp_path, format_version=4, buffered_entries_threshold=1)
    j.start()
    acks = Acks()
    j.log_entry(1, 0, entry(1, 0), acks.cb(0))
    j.log_explicit_lac(1, b"dropped below v6", acks.cb(1))
    assert sorted(acks.wait(2)) == [(0, None), (1, None)]
    j.shutdown()
    assert j.current_path.read_bytes()[:8] == encode_header(4)
    assert [r.kind for r in replay_all(make(tmp_path))] == [RecordKind.ENTRY]


def test_log_after_shutdown_raises(tmp_path: Path) -> None:
    j = make(tmp_path)
    j.start()
    j.shutdown()
    with pytest.raises(StorageError):
        j.log_fence(1, lambda exc: None)


def test_zero_filler_stays_ahead_of_the_writer(tmp_path: Path) -> None:
    """Several preallocation steps of records: the file is zeroed ahead of the last write (by
    the filler thread), and replay still returns exactly the records, in order. (Direct I/O
    leaves holes ahead by default; zeros asked for go through the direct descriptor.)"""
    j = make(tmp_path, prealloc_size_mb=1, prealloc_zero=True)
    j.start()
    acks = Acks()
    n = 600  # ~2.5 MB of 4 KiB entries: more than two 1 MB steps
    for i in range(n):
        j.log_entry(1, i, entry(1, i, 4096), acks.cb(i))
    assert all(exc is None for _, exc in acks.wait(n))
    written = j.current_mark().offset
    # The filler works asynchronously: it reaches a step past the last write soon after, with
    # no writer waiting for it.
    deadline = time.monotonic() + 10
    while os.stat(j.current_path).st_size < written + (1 << 20):
        assert time.monotonic() < deadline, "the zero filler never got a step ahead of the writer"
        time.sleep(0.01)
    j.shutdown()
    assert [r.data for r in replay_all(make(tmp_path))] == [entry(1, i, 4096) for i in range(n)]


def test_zero_filler_failure_is_raised_to_the_writer(tmp_path: Path) -> None:
    from vellum.storage.journal_pages import ZeroFiller

    path = tmp_path / "f"
    path.write_bytes(b"")
    fd = os.open(path, os.O_RDONLY)  # pwrite fails with EBADF, as a full disk would with ENOSPC
    filler = ZeroFiller("test-zero-fill", 4096, os.fdatasync)
    try:
        filler.reset(fd, 0)
        with pytest.raises(OSError):
            filler.extend(1)
    finally:
        filler.stop()
        os.close(fd)


@pytest.mark.parametrize("fast_writer", [False, True])
def test_zero_filler_zeroes_or_allocates_ahead(tmp_path: Path, fast_writer: bool) -> None:
    """Slow journals get written zeros, fast ones allocated space: either way the space ahead
    reads as zeros (the end of the records) and is on disk before the writer gets there."""
    from vellum.storage.journal_pages import ZeroFiller

    path = tmp_path / "f"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    filler = ZeroFiller("test-zero-fill", 1 << 20, os.fdatasync)
    try:
        filler.reset(fd, 0)
        if fast_writer:
            filler.rate_bytes_per_s = 10 * ZeroFiller.FALLOCATE_ABOVE_BYTES_PER_S
            filler._rate_mark = (float("inf"), 0)  # keep the forced rate (no new sample)
        end = filler.extend(3 << 20)
        assert end >= 3 << 20
        st = os.stat(path)
        assert st.st_size >= 3 << 20 and st.st_blocks * 512 >= 3 << 20  # allocated, not a hole
        assert os.pread(fd, 3 << 20, 0) == bytes(3 << 20)
    finally:
        filler.stop()
        os.close(fd)


def _resident_pages(path: Path, start: int, end: int) -> int:
    """Pages of ``path`` in ``[start, end)`` that the OS page cache holds (mincore)."""
    import ctypes
    import mmap

    page = mmap.PAGESIZE
    libc = ctypes.CDLL(None, use_errno=True)
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), end, access=mmap.ACCESS_COPY)
        try:
            addr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
            pages = (end + page - 1) // page
            vec = (ctypes.c_ubyte * pages)()
            if libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(end), vec) != 0:
                pytest.skip(f"mincore failed: errno {ctypes.get_errno()}")
            return sum(1 for i in range(start // page, pages) if vec[i] & 1)
        finally:
            del addr
            mm.close()


@pytest.mark.parametrize("remove", [True, False])
def test_synced_pages_leave_the_page_cache_only_when_asked(tmp_path: Path, remove: bool) -> None:
    """journalRemoveFromPageCache: once fsynced, journal pages are dropped from the cache (only
    replay reads them); the MiB the writer still appends into stays. Off, they stay cached."""
    j = make(tmp_path, remove_from_page_cache=remove)
    j.start()
    acks = Acks()
    body = 64 * 1024
    for i in range(96):  # 6 MiB in many group commits
        j.log_entry(1, i, entry(1, i, body), acks.cb(i))
        if i % 8 == 7:
            acks.wait(i + 1)
    assert all(exc is None for _k, exc in acks.wait(96))
    path = j.current_path
    early = 4 << 20  # well below the last synced MiB
    resident = _resident_pages(path, 0, early)
    j.shutdown()
    total = early // 4096
    if remove or _DIRECT:  # direct writes never leave pages in the cache
        assert resident == 0, f"{resident} of {total} synced pages still cached"
    else:
        assert resident > total // 2, f"only {resident} of {total} pages cached without the option"
    assert [r.entry_id for r in replay_all(make(tmp_path)) if r.kind == RecordKind.ENTRY] == list(range(96))


def test_big_group_commits_switch_the_filler_to_allocation(tmp_path: Path) -> None:
    """Zeros pay off for small group commits only: the journal tells the filler how big its
    fsynced batches are, and batches of MBs make it allocate instead."""
    from vellum.storage.journal_pages import ZeroFiller

    small = make(tmp_path / "small", prealloc_size_mb=1, prealloc_zero=True)  # a filler with direct I/O too
    small.start()
    acks = Acks()
    for i in range(20):
        small.log_entry(1, i, entry(1, i, 100), acks.cb(i))
        acks.wait(i + 1)  # one small record per fsync
    assert small._file.filler is not None and not small._file.filler.allocates()
    small.shutdown()

    big = make(tmp_path / "big", prealloc_size_mb=1, max_group_wait_ms=50, buffered_writes_threshold=4 << 20,
               prealloc_zero=True)
    big.start()
    acks = Acks()
    # Built first: building a 128 KiB entry inside the loop took long enough on a slow VM that
    # the 50 ms group wait cut each intended batch in two.
    entries = [entry(1, i, 128 * 1024) for i in range(48)]
    for i in range(48):  # 6 MiB in batches of 1 MiB
        big.log_entry(1, i, entries[i], acks.cb(i))
        if i % 8 == 7:
            acks.wait(i + 1)
    assert big._file.filler is not None
    assert big._file.filler.bytes_per_sync > ZeroFiller.FALLOCATE_ABOVE_BYTES_PER_SYNC
    assert big._file.filler.allocates()
    big.shutdown()
