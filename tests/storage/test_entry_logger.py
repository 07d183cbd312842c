"""EntryLogger on real files: allocation, rotation with the ledgers map, reads, scans, failures."""

from __future__ import annotations

import errno
import os
import struct
import threading
from pathlib import Path

import crc32c
import pytest
from file_ops_recorder import RecordingOps

from vellum.errors import CorruptionError, DiskFullError, StorageError
from vellum.format import entrylog as fmt
from vellum.ids import location_log_id, location_offset, make_location
from vellum.storage.entry_log_reader import RecordRun
from vellum.storage.entry_logger import EntryLogger, FileOps, log_file_name


def make_entry(ledger_id: int, entry_id: int, payload: bytes = b"") -> bytes:
    ids = struct.pack(">qq", ledger_id, entry_id)
    return ids + struct.pack(">I", crc32c.crc32c(ids + payload)) + payload


def verify(entry: bytes) -> bool:
    (crc,) = struct.unpack_from(">I", entry, 16)
    return crc == crc32c.crc32c(entry[:16] + entry[20:])


def test_round_trip_and_lastid(tmp_path: Path) -> None:
    with EntryLogger(tmp_path, log_size_limit=1 << 20, preallocate=False) as el:
        locs = {
            (lid, e): el.add_entry(lid, make_entry(lid, e, b"p%d" % e)) for lid in (1, 2) for e in range(10)
        }
        el.flush()
        for (lid, e), loc in locs.items():
            assert el.read_entry(lid, e, loc) == make_entry(lid, e, b"p%d" % e)
        assert location_offset(locs[(1, 0)]) == 1028
        assert el.log_ids() == [0]
    assert (tmp_path / "current" / "lastId").read_text() == "0\n"
    # reopen: old locations still readable, a new log is allocated for new writes
    with EntryLogger(tmp_path, log_size_limit=1 << 20, preallocate=False) as el:
        assert el.read_entry(2, 9, locs[(2, 9)]) == make_entry(2, 9, b"p9")
        loc = el.add_entry(3, make_entry(3, 0))
        assert location_log_id(loc) == 1
        el.flush()
    assert (tmp_path / "current" / "lastId").read_text() == "1\n"


def test_read_before_flush_sees_buffered_records(tmp_path: Path) -> None:
    with EntryLogger(tmp_path, log_size_limit=1 << 20, preallocate=False) as el:
        loc = el.add_entry(7, make_entry(7, 0, b"buffered"))
        assert el.read_entry(7, 0, loc) == make_entry(7, 0, b"buffered")


def test_rotation_writes_ledgers_map_and_header(tmp_path: Path) -> None:
    entry_len = len(make_entry(1, 0, b"x" * 100))
    limit = 1024 + 5 * (4 + entry_len)
    with EntryLogger(tmp_path, log_size_limit=limit, preallocate=True) as el:
        locs = []
        for e in range(12):
            lid = 1 + e % 3
            locs.append((lid, e, el.add_entry(lid, make_entry(lid, e, b"x" * 100))))
        el.flush()
        assert {location_log_id(loc) for _, _, loc in locs} == {0, 1, 2}
        assert el.least_unflushed_log_id() == 2
        # sealed log 0: header points at the map, map = per-ledger sums
        raw = (tmp_path / "current" / log_file_name(0)).read_bytes()
        header = fmt.decode_header(raw)
        assert header.ledgers_map_offset == 1024 + 5 * (4 + entry_len)
        assert header.ledgers_count == 3
        expected = {1: 2 * (4 + entry_len), 2: 2 * (4 + entry_len), 3: 4 + entry_len}
        assert el.ledgers_map(0) == expected
        assert el.log_info(0).from_map
        for lid, e, loc in locs:
            assert el.read_entry(lid, e, loc) == make_entry(lid, e, b"x" * 100)
        # the active log answers from memory
        assert el.ledgers_map(2) == {2: 4 + entry_len, 3: 4 + entry_len}
    # close removed the spare preallocated log and left the active log unsealed
    assert sorted(p.name for p in (tmp_path / "current").glob("*.log")) == ["0.log", "1.log", "2.log"]


def test_map_missing_falls_back_to_scan(tmp_path: Path) -> None:
    with EntryLogger(tmp_path, log_size_limit=1 << 20, preallocate=False) as el:
        for e in range(4):
            el.add_entry(5, make_entry(5, e, b"abc"))
        el.rotate()
    path = tmp_path / "current" / "0.log"
    raw = bytearray(path.read_bytes())
    map_offset = fmt.decode_header(bytes(raw)).ledgers_map_offset
    path.write_bytes(bytes(raw[:map_offset]))  # map cut off, header still points at it
    with EntryLogger(tmp_path, log_size_limit=1 << 20, preallocate=False) as el:
        info = el.log_info(0)
        assert not info.from_map
        assert info.ledgers == {5: 4 * (4 + 23)}


def test_scan_reports_truncated_tail(tmp_path: Path) -> None:
    with EntryLogger(tmp_path, log_size_limit=1 << 20, preallocate=False) as el:
        for e in range(3):
            el.add_entry(1, make_entry(1, e, b"data"))
        el.flush()
    path = tmp_path / "current" / "0.log"
    with open(path, "ab") as f:
        f.write(struct.pack(">i", 100) + b"partial")
    with EntryLogger(tmp_path, log_size_limit=1 << 20, preallocate=False) as el:
        scanner = el.scanner(0, verify=verify)
        assert [r.entry_id for r in scanner] == [0, 1, 2]
        assert scanner.report.stop is fmt.ScanStop.TRUNCATED
        assert str(path) in scanner.describe_stop()


def test_read_entry_validates(tmp_path: Path) -> None:
    with EntryLogger(tmp_path, log_size_limit=1 << 20, preallocate=False) as el:
        loc = el.add_entry(1, make_entry(1, 0, b"abc"))
        el.flush()
        with pytest.raises(CorruptionError, match=r"0\.log offset 1028: expected ledger 1 entry 1"):
            el.read_entry(1, 1, loc)
        with pytest.raises(CorruptionError, match=r"past the end|insane"):
            el.read_entry(1, 0, loc + 10)
        with pytest.raises(CorruptionError, match="does not exist"):
            el.read_entry(1, 0, (9 << 32) | 1028)
        # a corrupt size field is reported with file and offset
        path = tmp_path / "current" / "0.log"
        fd = os.open(path, os.O_WRONLY)
        os.pwrite(fd, struct.pack(">i", 3), 1024)
        os.close(fd)
        with pytest.raises(CorruptionError, match=r"0\.log offset 1024: insane entry size 3"):
            el.read_entry(1, 0, loc)


def test_read_records_of_the_same_ledger(tmp_path: Path) -> None:
    with EntryLogger(tmp_path, log_size_limit=1 << 20, preallocate=False) as el:
        locs = [el.add_entry(1, make_entry(1, e)) for e in range(5)] + [el.add_entry(2, make_entry(2, 0))]
        el.flush()
        got = el.read_records(1, locs[2], first_entry_id=2, stride=1, max_entries=10, max_bytes=0, first_counts=True)
        assert [bytes(v) for v in got.views()] == [make_entry(1, e) for e in range(2, 5)]
        assert el.read_records(1, locs[0], first_entry_id=0, stride=1, max_entries=2, max_bytes=0,
                               first_counts=True).count == 2


def test_delete_log(tmp_path: Path) -> None:
    with EntryLogger(tmp_path, log_size_limit=1 << 20, preallocate=False) as el:
        loc = el.add_entry(1, make_entry(1, 0))
        with pytest.raises(StorageError, match="active"):
            el.delete_log(0)
        el.rotate()
        assert el.read_entry(1, 0, loc)
        el.delete_log(0)
        assert el.log_ids() == []
        with pytest.raises(CorruptionError):
            el.read_entry(1, 0, loc)


def test_log_ids_continue_after_lost_lastid(tmp_path: Path) -> None:
    with EntryLogger(tmp_path, log_size_limit=1 << 20, preallocate=False) as el:
        el.add_entry(1, make_entry(1, 0))
        el.rotate()
        el.add_entry(1, make_entry(1, 1))
        el.flush()
    (tmp_path / "current" / "lastId").unlink()
    with EntryLogger(tmp_path, log_size_limit=1 << 20, preallocate=False) as el:
        assert location_log_id(el.add_entry(1, make_entry(1, 2))) == 2


class FailingOps(FileOps):
    def __init__(self) -> None:
        self.fail_write: int | None = None  # errno to raise on the next data write
        self.fail_fsync = False
        self.partial = 0

    def write(self, fd: int, data: bytes | memoryview) -> int:
        if self.fail_write is not None and len(data) > 20:
            code, self.fail_write = self.fail_write, None
            if self.partial:
                os.write(fd, bytes(data[: self.partial]))  # a torn write reached the file
            raise OSError(code, os.strerror(code))
        return super().write(fd, data)

    def fsync(self, fd: int) -> None:
        if self.fail_fsync:
            self.fail_fsync = False
            raise OSError(errno.EIO, "Input/output error")
        super().fsync(fd)


def test_enospc_truncates_and_reports_once(tmp_path: Path) -> None:
    ops = FailingOps()
    with EntryLogger(tmp_path, log_size_limit=1 << 20, preallocate=False, file_ops=ops) as el:
        good = el.add_entry(1, make_entry(1, 0, b"good"))
        el.flush()
        el.add_entry(1, make_entry(1, 1, b"lost"))
        ops.fail_write, ops.partial = errno.ENOSPC, 9
        with pytest.raises(DiskFullError, match=r"0\.log offset \d+: no space"):
            el.flush()
        # nothing half-written remains: the file ends after the good record
        assert (tmp_path / "current" / "0.log").stat().st_size == 1024 + 4 + len(make_entry(1, 0, b"good"))
        assert el.ledgers_map(0) == {1: 4 + len(make_entry(1, 0, b"good"))}
        # the next round writes again at the same place and succeeds
        again = el.add_entry(1, make_entry(1, 1, b"lost"))
        el.flush()
        assert el.read_entry(1, 1, again) == make_entry(1, 1, b"lost")
        assert el.read_entry(1, 0, good) == make_entry(1, 0, b"good")


def test_failed_write_in_add_is_counted(tmp_path: Path) -> None:
    ops = FailingOps()
    with EntryLogger(
        tmp_path, log_size_limit=1 << 20, preallocate=False, write_buffer_size=64, file_ops=ops
    ) as el:
        el.add_entry(1, make_entry(1, 0, b"a" * 30))
        before = el.failure_count
        ops.fail_write = errno.ENOSPC
        with pytest.raises(DiskFullError):
            el.add_entry(1, make_entry(1, 1, b"b" * 30))
        assert el.failure_count == before + 1  # the earlier, buffered record was dropped too
        el.flush()
        assert el.ledgers_map(0) == {}


def test_failed_fsync_abandons_the_log(tmp_path: Path) -> None:
    ops = FailingOps()
    with EntryLogger(tmp_path, log_size_limit=1 << 20, preallocate=False, file_ops=ops) as el:
        el.add_entry(1, make_entry(1, 0))
        ops.fail_fsync = True
        with pytest.raises(StorageError, match=r"0\.log: fsync"):
            el.flush()
        loc = el.add_entry(1, make_entry(1, 0))
        assert location_log_id(loc) == 1  # never appends after an fsync failure
        el.flush()
        assert el.read_entry(1, 0, loc) == make_entry(1, 0)


def test_concurrent_reads_during_writes(tmp_path: Path) -> None:
    with EntryLogger(tmp_path, log_size_limit=64 * 1024, preallocate=True) as el:
        written: list[tuple[int, int]] = []
        stop = threading.Event()
        errors: list[BaseException] = []

        def reader() -> None:
            while not stop.is_set():
                for e, loc in list(written):
                    try:
                        assert el.read_entry(1, e, loc) == make_entry(1, e, b"z" * 50)
                    except BaseException as ex:
                        errors.append(ex)
                        return

        t = threading.Thread(target=reader)
        t.start()
        for e in range(2000):
            written.append((e, el.add_entry(1, make_entry(1, e, b"z" * 50))))
            if e % 100 == 0:
                el.flush()
        stop.set()
        t.join()
        assert errors == []
        assert len(el.log_ids()) > 1


def test_flush_entrylog_bytes_syncs_while_writing(tmp_path: Path) -> None:
    class CountingOps(FileOps):
        fsyncs = 0

        def fsync(self, fd: int) -> None:
            CountingOps.fsyncs += 1
            super().fsync(fd)

    ops = CountingOps()
    with EntryLogger(
        tmp_path,
        log_size_limit=1 << 20,
        preallocate=False,
        flush_entrylog_bytes=256,
        write_buffer_size=128,
        file_ops=ops,
    ) as el:
        el.add_entry(1, make_entry(1, 0))
        after_allocation = CountingOps.fsyncs
        for e in range(1, 40):
            el.add_entry(1, make_entry(1, e, b"q" * 20))
        assert CountingOps.fsyncs >= after_allocation + 3  # synced without any flush() call


@pytest.mark.parametrize("per_ledger", [False, True])
def test_add_entries_matches_add_entry_across_rotations(tmp_path: Path, per_ledger: bool) -> None:
    """The batch append of a ledger's run writes the same records at the same locations as
    one add_entry per entry, including when the run crosses a rotation and buffer flushes."""
    runs = [(lid, [make_entry(lid, e, bytes([e % 251]) * (100 + e)) for e in range(120)]) for lid in (5, 6, 5)]
    locations: list[list[int]] = []
    for mode, sub in (("one", "a"), ("batch", "b")):
        with EntryLogger(tmp_path / sub, log_size_limit=8 << 10, preallocate=False,
                         entry_log_per_ledger=per_ledger) as el:
            got: list[int] = []
            for lid, entries in runs:
                if mode == "one":
                    got.extend(el.add_entry(lid, e) for e in entries)
                else:
                    got.extend(el.add_entries(lid, entries))
            el.flush()
            for (lid, entries), chunk in zip(runs, [got[i * 120:(i + 1) * 120] for i in range(3)], strict=True):
                assert [el.read_entry(lid, e, loc) for e, loc in zip(range(120), chunk, strict=True)] == entries
            assert len({location_log_id(x) for x in got}) > 3  # the runs crossed rotations
            locations.append(got)
    assert locations[0] == locations[1]
    with EntryLogger(tmp_path / "c", log_size_limit=1 << 20, preallocate=False) as el, \
            pytest.raises(ValueError, match="shorter than"):
        el.add_entries(1, [make_entry(1, 0), b"short"])


def test_read_records_returns_offsets_into_one_read_within_its_bounds(tmp_path: Path) -> None:
    with EntryLogger(tmp_path, log_size_limit=1 << 20, preallocate=False) as el:
        body = b"p" * 1000
        locs = [el.add_entry(1, make_entry(1, e, body)) for e in range(6)] + [el.add_entry(2, make_entry(2, 0))]
        el.flush()

        def records(ledger_id: int, first: int, max_entries: int = 100, max_bytes: int = 0) -> RecordRun:
            return el.read_records(ledger_id, locs[first], first_entry_id=first, stride=1, max_entries=max_entries,
                                   max_bytes=max_bytes, first_counts=True)

        got = records(1, 1)
        assert [bytes(v) for v in got.views()] == [make_entry(1, e, body) for e in range(1, 6)]  # not ledger 2's
        assert len(got.chunks) == 1  # one pread
        size = len(make_entry(1, 0, body))
        assert records(1, 0, max_bytes=2 * size).count == 2
        assert records(1, 0, max_bytes=1).count == 1  # the first counts
        assert records(1, 0, max_entries=3).count == 3
        assert records(2, 0, max_entries=3).count == 0  # not that ledger's record


# ---------------------------------------------------------------------------------------------
# Order of durable operations (storage/durable.py through the logger's FileOps)


def test_a_new_log_is_durable_with_lastid_before_its_first_entry(tmp_path: Path) -> None:
    ops = RecordingOps()
    with EntryLogger(tmp_path, log_size_limit=1 << 20, preallocate=False, file_ops=ops) as el:
        el.add_entry(1, make_entry(1, 0))
        assert ops.calls == [
            ("open", "0.log"), ("write", "0.log"), ("fsync", "0.log"),  # header, fsynced
            ("open", "lastId.tmp"), ("write", "lastId.tmp"), ("fsync", "lastId.tmp"),
            ("close", "lastId.tmp"), ("rename", "lastId.tmp", "lastId"),
            ("fsync_dir", "current"),  # one directory fsync for both names
        ]
    assert (tmp_path / "current" / "lastId").read_text() == "0\n"


def test_a_failed_lastid_write_hands_out_no_log(tmp_path: Path) -> None:
    ops = RecordingOps(fail_at=("fsync", "lastId.tmp"))
    with EntryLogger(tmp_path, log_size_limit=1 << 20, preallocate=False, file_ops=ops) as el:
        with pytest.raises(StorageError, match="lastId"):
            el.add_entry(1, make_entry(1, 0))
        assert el.active_log_ids() == []
        assert not (tmp_path / "current" / "lastId").exists()
        loc = el.add_entry(1, make_entry(1, 0))  # the next allocation skips the id
        assert location_log_id(loc) == 1
        el.flush()
    assert (tmp_path / "current" / "lastId").read_text() == "1\n"


def test_compaction_output_is_fsynced_and_named_durably_before_finish_returns(tmp_path: Path) -> None:
    ops = RecordingOps()
    with EntryLogger(tmp_path, log_size_limit=1 << 20, preallocate=False, file_ops=ops) as el:
        el.add_entry(1, make_entry(1, 0))
        el.rotate()
        out = el.new_compaction_log(0)
        out.add_entry(1, make_entry(1, 0))
        del ops.calls[:]
        out.finish()
        assert ops.calls == [
            ("write", "1.log.compacting"), ("pwrite", "1.log.compacting"), ("fsync", "1.log.compacting"),
            ("close", "1.log.compacting"),
            ("rename", "1.log.compacting", "1.log.0.compacted"), ("link", "1.log.0.compacted", "1.log"),
            ("fsync_dir", "current"),
        ]
        del ops.calls[:]
        out.done()
        assert ops.calls == [("unlink", "1.log.0.compacted"), ("fsync_dir", "current")]
        assert el.read_entry(1, 0, make_location(1, fmt.HEADER_SIZE + fmt.SIZE_FIELD)) == make_entry(1, 0)
