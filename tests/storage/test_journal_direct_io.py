"""Journal with direct I/O (``journalDirectIO``): same bytes as buffered, aligned writes, torn
last blocks, the fallback when a filesystem refuses O_DIRECT, and the aligned appender itself.

(``test_journal.py`` runs every journal test in both modes too, including the one that fails if
a callback could run before the fsync covering it.)"""

from __future__ import annotations

import errno
import logging
import os
import random
import struct
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vellum.config import ServerConfig
from vellum.errors import ConfigError, StorageError
from vellum.format.journal import JournalRecord, RecordKind
from vellum.format.lastmark import ZERO_MARK
from vellum.storage import direct_io as dio
from vellum.storage.journal import Journal

WAIT = 10.0


def entry(ledger_id: int, entry_id: int, size: int) -> bytes:
    payload = bytes((entry_id * 7 + i) % 251 for i in range(size))
    return struct.pack(">qqqq", ledger_id, entry_id, entry_id - 1, size) + payload


def sizes(n: int) -> list[int]:
    """Small records, records across blocks, and 64 KiB entries (the target of direct I/O)."""
    return [(100, 3000, 65536, 7, 20000)[i % 5] for i in range(n)]


def make(base: Path, **kw: Any) -> Journal:
    kw.setdefault("prealloc_size_mb", 1)
    kw.setdefault("max_group_wait_ms", 1)
    return Journal(base / "journal", **kw)


def write_one_by_one(j: Journal, n: int) -> list[int]:
    """Each record acked before the next is logged: deterministic batches (one per record);
    returns the mark after each ack."""
    marks = []
    for i, size in enumerate(sizes(n)):
        done = threading.Event()
        errors: list[BaseException | None] = []

        def cb(exc: BaseException | None, errors: list[BaseException | None] = errors,
               done: threading.Event = done) -> None:
            errors.append(exc)
            done.set()

        if i == 3:
            j.log_master_key(1, b"k" * 20, cb)
        elif i == 6:
            j.log_fence(1, cb)
        elif i == 9:
            j.log_explicit_lac(1, b"lac-body", cb)
        else:
            j.log_entry(1, i, entry(1, i, size), cb)
        assert done.wait(WAIT) and errors == [None]
        marks.append(j.current_mark().offset)
    return marks


def replay(base: Path) -> list[JournalRecord]:
    out: list[JournalRecord] = []
    make(base).replay(ZERO_MARK, out.append)
    return out


@pytest.mark.parametrize("alignment", [512, 4096])
def test_direct_and_buffered_journals_are_byte_identical(direct_io_dir: Path, alignment: int) -> None:
    files = {}
    for direct in (False, True):
        base = direct_io_dir / f"direct-{direct}"
        j = make(base, buffered_entries_threshold=1, alignment=alignment, direct_io=direct)
        j.start()
        assert j.direct_io is direct
        marks = write_one_by_one(j, 40)
        assert all(m % alignment == 0 for m in marks), marks  # every flush ends aligned
        path = j.current_path
        j.shutdown()
        files[direct] = path.read_bytes()[: marks[-1]]
        records = replay(base)
        assert len(records) == 40
        assert [(r.kind, r.data) for r in records] == [(r.kind, r.data) for r in replay(direct_io_dir / "direct-False")]
    assert files[True] == files[False]


@pytest.mark.parametrize("direct", [False, True])
def test_preallocation_is_zero_filled_buffered_and_left_as_holes_with_direct_io(direct_io_dir: Path,
                                                                               direct: bool) -> None:
    """Buffered: the space ahead is zeros on disk (fdatasync then overwrites blocks). Direct:
    only the size is extended (the zeros would share the device queue with the journal's own
    writes), unless zeros are asked for; replay reads holes as the end of the journal either way."""
    for zero in (None, True):
        base = direct_io_dir / f"{direct}-{zero}"
        j = make(base, prealloc_size_mb=4, direct_io=direct, prealloc_zero=zero)
        j.start()
        write_one_by_one(j, 10)
        path = j.current_path
        j.shutdown()
        st = os.stat(path)
        assert st.st_size >= 4 << 20
        allocated = st.st_blocks * 512
        if direct and zero is None:
            assert allocated < st.st_size // 2, (allocated, st.st_size)  # holes ahead
        else:
            assert allocated >= st.st_size, (allocated, st.st_size)  # zeros written ahead
        assert len(replay(base)) == 10


def test_every_direct_write_is_aligned(direct_io_dir: Path) -> None:
    alignment = 4096
    j = make(direct_io_dir, alignment=alignment, direct_io=True, write_buffer_size_kb=64)
    j.start()
    appender = j._file.appender
    assert appender is not None and j.direct_io
    seen: list[tuple[int, int, int]] = []
    real = appender._pwrite

    def recording(fd: int, data: memoryview, offset: int) -> int:
        import ctypes

        address = ctypes.addressof(ctypes.c_char.from_buffer(data)) if not data.readonly else 0
        seen.append((offset, len(data), address))
        return real(fd, data, offset)

    appender._pwrite = recording
    done = threading.Semaphore(0)
    n, wave = 200, 10
    # waves of 10 adds, each acknowledged before the next is logged: at least one write per
    # wave whatever the group commit's timing (all 200 at once may fit in a handful of writes)
    for i, size in enumerate(sizes(n)):
        j.log_entry(1, i, entry(1, i, size), lambda exc: done.release())
        if (i + 1) % wave == 0:
            for _ in range(wave):
                assert done.acquire(timeout=WAIT)
    j.shutdown()
    assert len(seen) >= n // wave
    for offset, length, address in seen:
        assert offset % alignment == 0 and length % alignment == 0 and length > 0, (offset, length)
        assert address % 4096 == 0, address  # page-aligned memory
    assert [r.entry_id for r in replay(direct_io_dir)] == list(range(n))


def test_torn_last_block_replays_up_to_the_last_complete_batch(direct_io_dir: Path) -> None:
    """A crash can leave the last aligned block (or several) half written: replay stops at the
    last batch whose checksum holds, a prefix of what was acknowledged."""
    j = make(direct_io_dir, buffered_entries_threshold=1, alignment=4096, direct_io=True)
    j.start()
    marks = write_one_by_one(j, 25)
    path = j.current_path
    j.shutdown()
    data = path.read_bytes()
    expected = [(r.kind, r.data) for r in replay(direct_io_dir)]
    rng = random.Random(5)
    end = marks[-1]
    cuts = [end - 1, end - 100, end - 4096, end - 4097, marks[-2] + 1, marks[-2], *[rng.randrange(512, end) for _ in range(20)]]
    for cut in cuts:
        path.write_bytes(data[:cut])
        got = [(r.kind, r.data) for r in replay(direct_io_dir)]
        assert got == expected[: len(got)]
        complete = sum(1 for m in marks if m <= cut)  # batches wholly before the cut
        assert len(got) == complete, (cut, len(got), complete)
    # a block of garbage in place of the last batch: the same
    torn = bytearray(data)
    torn[marks[-2] : marks[-2] + 4096] = os.urandom(4096)
    path.write_bytes(bytes(torn))
    assert [(r.kind, r.data) for r in replay(direct_io_dir)] == expected[:-1]


def test_direct_journal_rolls_and_replays_across_files(direct_io_dir: Path) -> None:
    j = make(direct_io_dir, max_size_mb=1, direct_io=True)
    j.start()
    done = threading.Semaphore(0)
    n = 120  # ~2.4 MB: several files
    for i in range(n):
        j.log_entry(1, i, entry(1, i, 20000), lambda exc: done.release())
    for _ in range(n):
        assert done.acquire(timeout=WAIT)
    assert j.direct_io
    j.shutdown()
    assert len(j.journal_ids()) >= 2
    assert [r.data for r in replay(direct_io_dir)] == [entry(1, i, 20000) for i in range(n)]


def _refuse(*_args: object, **_kw: object) -> int:
    raise OSError(errno.EINVAL, "Invalid argument")


@pytest.mark.parametrize("where", ["open", "probe"])
def test_a_filesystem_refusing_o_direct_falls_back_to_buffered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, where: str
) -> None:
    """tmpfs (before Linux 6.6) and some network filesystems answer EINVAL: the journal says so,
    naming the directory and the reason, and writes buffered."""
    monkeypatch.setattr(dio, "open_direct" if where == "open" else "probe", _refuse)
    j = make(tmp_path, direct_io=True)
    with caplog.at_level(logging.WARNING, logger="vellum.storage.journal"):
        j.start()
    assert not j.direct_io
    message = " ".join(r.getMessage() for r in caplog.records)
    assert str(tmp_path / "journal" / "current") in message and "EINVAL" in message
    assert "buffered" in message
    done = threading.Semaphore(0)
    for i in range(30):
        j.log_entry(1, i, entry(1, i, 5000), lambda exc: done.release())
    for _ in range(30):
        assert done.acquire(timeout=WAIT)
    j.shutdown()
    assert [r.entry_id for r in replay(tmp_path) if r.kind is RecordKind.ENTRY] == list(range(30))


def test_an_io_error_at_the_direct_open_is_not_a_refusal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def eio(*_args: object) -> int:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(dio, "open_direct", eio)
    j = make(tmp_path, direct_io=True)
    with pytest.raises(StorageError, match="cannot start journal"):
        j.start()


def test_direct_io_needs_padding_records_and_a_sector_alignment(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="format version 5"):
        make(tmp_path, direct_io=True, format_version=4)
    with pytest.raises(ValueError, match="at least 512"):
        make(tmp_path, direct_io=True, alignment=256)
    with pytest.raises(ConfigError, match="journalDirectIO=true needs journalFormatVersionToWrite"):
        ServerConfig(journal_direct_io=True, journal_format_version_to_write=4)
    with pytest.raises(ConfigError, match="entryLogPerLedgerEnabled"):
        ServerConfig(db_storage_direct_io_entry_logger=True, entry_log_per_ledger_enabled=True)


# ------------------------------------------------------------------------ AlignedAppender


@settings(max_examples=40, deadline=None)
@given(
    chunks=st.lists(st.binary(min_size=0, max_size=20000), min_size=1, max_size=12),
    actions=st.lists(st.sampled_from(["none", "blocks", "all"]), min_size=12, max_size=12),
    head_len=st.integers(0, 4095),
)
def test_appender_file_holds_what_was_appended(
    tmp_path_factory: pytest.TempPathFactory, chunks: list[bytes], actions: list[str], head_len: int
) -> None:
    """Whatever the chunking and the mix of partial and full write-outs, the file below
    ``written_end`` is exactly the appended bytes, and after ``write_all`` all of them."""
    from direct_io_support import CHECKOUT_DIR, takes_direct_io

    base = tmp_path_factory.mktemp("appender")
    if takes_direct_io(base) is not None:
        CHECKOUT_DIR.mkdir(exist_ok=True)
        if takes_direct_io(CHECKOUT_DIR) is not None:
            pytest.skip("no directory takes O_DIRECT")
        base = CHECKOUT_DIR
    path = base / "appender.bin"
    head = bytes(range(256)) * 16
    head = head[:head_len]
    path.write_bytes(head)
    fd = dio.open_direct(path, os.O_RDWR)
    appender = dio.AlignedAppender(8192, 4096)
    try:
        appender.reset(fd, head_len, head)
        expected = bytearray(head)
        for chunk, action in zip(chunks, actions):
            appender.append(chunk)
            expected += chunk
            if action == "blocks":
                appender.write_blocks()
            elif action == "all":
                appender.write_all()
            assert appender.end == len(expected)
            with open(path, "rb") as f:
                assert f.read(appender.written_end) == bytes(expected[: appender.written_end])
        appender.write_all()
        with open(path, "rb") as f:
            data = f.read()
        assert data[: len(expected)] == bytes(expected)
        assert set(data[len(expected) :]) <= {0}  # the padding of the last block is zeros
    finally:
        appender.close()
        os.close(fd)
        path.unlink()


def test_appender_rejects_bad_alignment_and_heads() -> None:
    with pytest.raises(ValueError, match="power of two"):
        dio.AlignedAppender(4096, 1000)
    appender = dio.AlignedAppender(4096, 512)
    try:
        with pytest.raises(ValueError, match="head of 3 bytes"):
            appender.reset(-1, 600, b"abc")
    finally:
        appender.close()
