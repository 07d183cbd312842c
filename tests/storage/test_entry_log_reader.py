"""EntryLogReader alone, over a log written byte by byte here: reads by location, runs, the
readable end of an active log, ledgers maps, descriptors of deleted logs."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from vellum.errors import CorruptionError
from vellum.format import entrylog as fmt
from vellum.ids import make_location
from vellum.storage.entry_log_reader import EntryLogReader, RecordRun


def entry(ledger_id: int, entry_id: int, size: int = 40) -> bytes:
    return struct.pack(">qq", ledger_id, entry_id) + bytes([entry_id % 256]) * (size - 16)


def write_log(current: Path, log_id: int, entries: list[bytes], *, with_map: bool) -> list[int]:
    """A log file as the entry logger writes it; returns each entry's location."""
    body = bytearray()
    locations = []
    sizes: dict[int, int] = {}
    for e in entries:
        locations.append(make_location(log_id, fmt.HEADER_SIZE + len(body) + fmt.SIZE_FIELD))
        body += fmt.encode_record(e)
        lid = struct.unpack_from(">q", e)[0]
        sizes[lid] = sizes.get(lid, 0) + fmt.SIZE_FIELD + len(e)
    map_offset = fmt.HEADER_SIZE + len(body)
    if with_map:
        body += fmt.encode_ledgers_map(sizes)
        header = fmt.encode_header(map_offset, len(sizes))
    else:
        header = fmt.encode_header()
    current.mkdir(parents=True, exist_ok=True)
    (current / f"{log_id:x}.log").write_bytes(header + bytes(body))
    return locations


class Tail:
    """The writer's side as the reader sees it: what was made readable, where the file ends."""

    def __init__(self, end: int | None = None) -> None:
        self.end = end
        self.made_readable: list[tuple[int, int]] = []

    def make_readable(self, log_id: int, end: int) -> None:
        self.made_readable.append((log_id, end))

    def readable_end(self, log_id: int) -> int | None:
        return self.end


def reader(current: Path, tail: Tail) -> EntryLogReader:
    return EntryLogReader(current, make_readable=tail.make_readable, readable_end=tail.readable_end)


def test_read_entry_checks_the_stored_ids_and_asks_for_the_bytes_first(tmp_path: Path) -> None:
    entries = [entry(1, e) for e in range(5)]
    locs = write_log(tmp_path, 0, entries, with_map=True)
    tail = Tail()
    r = reader(tmp_path, tail)
    assert r.read_entry(1, 3, locs[3]) == entries[3]
    assert tail.made_readable and all(log_id == 0 for log_id, _ in tail.made_readable)
    with pytest.raises(CorruptionError, match="expected ledger 1 entry 2"):
        r.read_entry(1, 2, locs[3])
    with pytest.raises(CorruptionError, match="header"):
        r.read_entry(1, 0, make_location(0, 8))
    with pytest.raises(CorruptionError, match="does not exist"):
        r.read_entry(1, 0, make_location(7, fmt.HEADER_SIZE + 4))
    assert r.record_size(locs[0]) == fmt.SIZE_FIELD + 40
    assert r.record_size(make_location(7, fmt.HEADER_SIZE + 4)) is None
    r.close()


def test_a_run_stops_at_another_ledger_the_bounds_and_the_readable_end(tmp_path: Path) -> None:
    entries = [entry(1, e) for e in range(6)] + [entry(2, 0)]
    locs = write_log(tmp_path, 0, entries, with_map=False)
    r = reader(tmp_path, Tail())

    def ids(run: RecordRun, first: int, stride: int = 1) -> list[int]:
        got = [bytes(v) for v in run.views()]
        assert got == entries[first::stride][:len(got)] and run.count == len(got)
        assert run.entry_bytes == sum(map(len, got))
        return list(range(first, first + stride * len(got), stride))

    def records(first: int, **kw: int) -> RecordRun:
        args = {"stride": 1, "max_entries": 100, "max_bytes": 0, "first_counts": True, **kw}
        return r.read_records(1, locs[first], first_entry_id=first, **args)  # type: ignore[arg-type]

    assert ids(records(0), 0) == [0, 1, 2, 3, 4, 5]  # not ledger 2's record
    assert ids(records(0, max_entries=3), 0) == [0, 1, 2]
    bounded = records(1, max_entries=9, max_bytes=80)
    assert ids(bounded, 1) == [1, 2] and bounded.full
    assert ids(records(1, max_bytes=1), 1) == [1] and ids(records(1, max_bytes=1, first_counts=False), 1) == []
    assert ids(records(0, stride=2), 0, 2) == [0, 2, 4]  # the ones between are skipped
    # The stored entry ids are checked: a location that holds another entry is no run of it.
    assert r.read_records(1, locs[2], first_entry_id=1, stride=1, max_entries=9, max_bytes=0,
                          first_counts=True).count == 0
    # An active log: nothing past what the writer handed to the file.
    end_of_entry_3 = locs[3] + 40 - make_location(0, 0)
    active = reader(tmp_path, Tail(end=end_of_entry_3))
    assert ids(active.read_records(1, locs[0], first_entry_id=0, stride=1, max_entries=100, max_bytes=0,
                                   first_counts=True), 0) == [0, 1, 2, 3]
    r.close()
    active.close()


@pytest.mark.parametrize("with_map", [True, False])
def test_ledgers_come_from_the_map_else_from_a_scan(tmp_path: Path, with_map: bool) -> None:
    entries = [entry(1, 0), entry(2, 0, 100), entry(1, 1)]
    write_log(tmp_path, 0, entries, with_map=with_map)
    r = reader(tmp_path, Tail())
    sizes, from_map = r.ledgers_in(0, r.file_size(0))
    assert sizes == {1: 2 * (fmt.SIZE_FIELD + 40), 2: fmt.SIZE_FIELD + 100}
    assert from_map is with_map
    r.close()


def test_a_deleted_logs_descriptor_closes_when_its_last_scan_ends(tmp_path: Path) -> None:
    write_log(tmp_path, 0, [entry(1, e) for e in range(3)], with_map=True)
    r = reader(tmp_path, Tail())
    scanner = r.scanner(0, r.file_size(0))
    it = iter(scanner)
    first = next(it)
    r.close_log(0)  # GC deletes the log while the scan still reads it
    (tmp_path / "0.log").unlink()
    assert [first.entry_id, *(rec.entry_id for rec in it)] == [0, 1, 2]
    assert r.log_ids() == []
    r.close()
