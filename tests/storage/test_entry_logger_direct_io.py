"""EntryLogger with direct I/O (``dbStorage_directIOEntryLogger``): the same files as buffered,
aligned writes, reads of entries in a partly written block, crashes, refusal and failures."""

from __future__ import annotations

import errno
import logging
import shutil
import struct
from pathlib import Path
from typing import Any

import crc32c
import pytest

from vellum.errors import StorageError
from vellum.format import entrylog as fmt
from vellum.ids import location_log_id
from vellum.storage import direct_io as dio
from vellum.storage.entry_logger import EntryLogger, FileOps
from vellum.storage.ledger_storage import LedgerStorage


def make_entry(ledger_id: int, entry_id: int, size: int) -> bytes:
    ids = struct.pack(">qq", ledger_id, entry_id)
    payload = bytes((entry_id * 13 + i) % 251 for i in range(size))
    return ids + struct.pack(">I", crc32c.crc32c(ids + payload)) + payload


def sizes(n: int) -> list[int]:
    return [(10, 5000, 65536, 300, 9000, 0)[i % 6] for i in range(n)]


class AlignedWrites(FileOps):
    """Records the direct writes (pwrites through descriptors opened with O_DIRECT); can make
    the direct open refuse (EINVAL) or the n-th direct write fail (EIO)."""

    def __init__(self, *, refuse: bool = False, fail_write: int = -1) -> None:
        self.direct_fds: set[int] = set()
        self.writes: list[tuple[int, int]] = []
        self.refuse = refuse
        self.fail_write = fail_write

    def open(self, path: Path, flags: int, mode: int = 0o644) -> int:
        if flags & dio.O_DIRECT and self.refuse:
            raise OSError(errno.EINVAL, "Invalid argument")
        fd = super().open(path, flags, mode)
        if flags & dio.O_DIRECT:
            self.direct_fds.add(fd)
        else:
            self.direct_fds.discard(fd)
        return fd

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        if fd in self.direct_fds:
            if len(self.writes) == self.fail_write:
                self.fail_write = -1
                raise OSError(errno.EIO, "injected direct write failure")
            self.writes.append((offset, len(data)))
        return super().pwrite(fd, data, offset)


def fill(el: EntryLogger, n: int, *, read_every: int = 0) -> dict[tuple[int, int], int]:
    locs = {}
    for i, size in enumerate(sizes(n)):
        lid = 1 + i % 3
        locs[(lid, i)] = el.add_entry(lid, make_entry(lid, i, size))
        if read_every and i % read_every == 0:
            assert el.read_entry(lid, i, locs[(lid, i)]) == make_entry(lid, i, size)
    return locs


def logger(path: Path, **kw: Any) -> EntryLogger:
    kw.setdefault("log_size_limit", 300_000)
    kw.setdefault("preallocate", True)
    return EntryLogger(path, **kw)


def test_direct_logs_are_byte_identical_to_buffered_ones(direct_io_dir: Path) -> None:
    """Sealed logs (rotation) and the active log once closed: the same bytes either way."""
    files = {}
    for direct in (False, True):
        base = direct_io_dir / f"direct-{direct}"
        ops = AlignedWrites()
        with logger(base, direct_io=direct, direct_write_buffer_size=64 << 10, flush_entrylog_bytes=100_000,
                    file_ops=ops) as el:
            assert el.direct_io is direct
            locs = fill(el, 150, read_every=7)
            el.flush()
            for (lid, i), loc in locs.items():
                assert el.read_entry(lid, i, loc) == make_entry(lid, i, sizes(150)[i])
            assert el.rotations >= 2
        assert bool(ops.writes) is direct
        files[direct] = {p.name: p.read_bytes() for p in sorted((base / "current").glob("*.log"))}
    assert files[True] == files[False]


def test_every_direct_write_is_aligned(direct_io_dir: Path) -> None:
    ops = AlignedWrites()
    with logger(direct_io_dir, direct_io=True, direct_write_buffer_size=32 << 10, flush_entrylog_bytes=50_000,
                file_ops=ops) as el:
        fill(el, 120, read_every=5)
        el.flush()
    assert len(ops.writes) > 20
    for offset, length in ops.writes:
        assert offset % dio.ENTRY_LOG_ALIGNMENT == 0 and length % dio.ENTRY_LOG_ALIGNMENT == 0, (offset, length)


def test_entries_in_a_partly_written_block_read_back(direct_io_dir: Path) -> None:
    """Reads of entries still in the aligned tail buffer write it (padded) first; later entries
    in the same block rewrite it, and every entry, old and new, reads back before and after."""
    with logger(direct_io_dir, direct_io=True, preallocate=False) as el:
        written: dict[int, tuple[int, bytes]] = {}
        for i in range(40):
            e = make_entry(7, i, 100 + 37 * i)
            written[i] = (el.add_entry(7, e), e)
            # read the newest and an older one: the newest sits in a partial block in memory
            for k in (i, i // 2):
                loc, want = written[k]
                assert el.read_entry(7, k, loc) == want
        log = el._policy.logs()[0]
        assert log.appender is not None and log.appender.writes >= 40  # the tail was rewritten
        el.flush()
        for k, (loc, want) in written.items():
            assert el.read_entry(7, k, loc) == want


def test_a_crash_after_flush_leaves_a_log_that_scans_to_every_flushed_entry(direct_io_dir: Path) -> None:
    """The file of an active direct log ends in the zero padding of its last block until it is
    closed or sealed; a crash there leaves that padding, which the scan skips."""
    src = direct_io_dir / "live"
    el = logger(src, direct_io=True, preallocate=False, log_size_limit=1 << 22)
    locs = fill(el, 50)
    el.flush()
    crashed = direct_io_dir / "crashed"
    shutil.copytree(src, crashed)  # the disk as a crash right now would leave it
    data = (crashed / "current" / "0.log").read_bytes()
    assert len(data) % dio.ENTRY_LOG_ALIGNMENT == 0 and data.endswith(b"\0")
    el.close()
    with logger(crashed, preallocate=False, log_size_limit=1 << 22) as reader:
        scanner = reader.scanner(0)
        got = {(r.ledger_id, r.entry_id) for r in scanner}
        assert scanner.report.stop is fmt.ScanStop.END
        assert got == set(locs)
        for (lid, i), loc in locs.items():
            assert reader.read_entry(lid, i, loc) == make_entry(lid, i, sizes(50)[i])
    # a clean close cut the padding off: the file ends at its last record
    closed = (src / "current" / "0.log").read_bytes()
    assert len(closed) < len(data) and data[: len(closed)] == closed and set(data[len(closed) :]) == {0}


def test_a_refused_o_direct_falls_back_to_buffered_logs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ops = AlignedWrites(refuse=True)
    with (
        caplog.at_level(logging.WARNING, logger="vellum.storage.entry_log_allocator"),
        logger(tmp_path, direct_io=True, file_ops=ops) as el,
    ):
        locs = fill(el, 60)
        el.flush()
        assert not el.direct_io
        for (lid, i), loc in locs.items():
            assert el.read_entry(lid, i, loc) == make_entry(lid, i, sizes(60)[i])
    message = " ".join(r.getMessage() for r in caplog.records)
    assert str(tmp_path / "current") in message and "EINVAL" in message and "buffered" in message
    assert ops.writes == []


def test_a_failed_direct_write_abandons_the_log(direct_io_dir: Path) -> None:
    ops = AlignedWrites(fail_write=3)
    with logger(direct_io_dir, direct_io=True, preallocate=False, direct_write_buffer_size=16 << 10,
                file_ops=ops) as el:
        before = el.failure_count
        good = {}
        with pytest.raises(StorageError, match="injected direct write failure"):
            for i in range(200):
                good[i] = el.add_entry(1, make_entry(1, i, 3000))
                if i % 3 == 2:
                    el.flush()
        assert el.failure_count == before + 1
        # the next add goes to a new log; entries flushed before the failure still read back
        loc = el.add_entry(2, make_entry(2, 0, 10))
        assert location_log_id(loc) == 1
        el.flush()
        assert el.read_entry(2, 0, loc) == make_entry(2, 0, 10)
        assert el.read_entry(1, 0, good[0]) == make_entry(1, 0, 3000)


def test_direct_io_and_entry_log_per_ledger_are_exclusive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="entry log per ledger"):
        EntryLogger(tmp_path, log_size_limit=1 << 20, direct_io=True, entry_log_per_ledger=True)


def test_ledger_storage_with_direct_entry_logs_survives_a_restart_in_either_mode(direct_io_dir: Path) -> None:
    def open_storage(direct: bool) -> LedgerStorage:
        return LedgerStorage(
            direct_io_dir, log_size_limit=200_000, write_cache_max_bytes=1 << 20, read_cache_max_bytes=1 << 20,
            read_ahead_batch_size=10, max_throttle_time_ms=10_000, preallocate=False, direct_io=direct,
            direct_write_buffer_size=64 << 10,
        )

    entries = {i: make_entry(5, i, sizes(80)[i]) for i in range(80)}
    storage = open_storage(True)
    storage.set_master_key(5, b"k" * 20)
    for e in entries.values():
        storage.add_entry(e)
    storage.flush()
    assert storage.entry_logger.direct_io
    for i, e in entries.items():
        assert storage.get_entry(5, i) == e
    storage.close()
    for direct in (False, True):
        storage = open_storage(direct)
        try:
            for i, e in entries.items():
                assert storage.get_entry(5, i) == e
        finally:
            storage.close()
