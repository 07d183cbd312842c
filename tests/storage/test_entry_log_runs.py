"""``EntryLogger.add_entries`` appends a run in slices: the same bytes, the
same locations, the same write-outs and the same seals as appending its entries one at a time."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import pytest

from vellum.format import entrylog as fmt
from vellum.ids import location_log_id
from vellum.storage.entry_logger import EntryLogger, FileOps


class _CountingOps(FileOps):
    def __init__(self) -> None:
        self.writes: list[int] = []

    def write(self, fd: int, data: bytes | memoryview) -> int:
        self.writes.append(len(data))
        return super().write(fd, data)


def _entry(ledger_id: int, entry_id: int, size: int) -> bytes:
    return struct.pack(">qq", ledger_id, entry_id) + bytes([entry_id % 251]) * (size - 16)


def _logs(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((root / "current").glob("*.log"))}


@pytest.mark.parametrize("same_size", [False, True], ids=["sizes", "one-size"])
@pytest.mark.parametrize("seed", range(6))
def test_a_run_is_written_as_one_entry_at_a_time(tmp_path: Path, seed: int, same_size: bool) -> None:
    rnd = random.Random(seed)
    limit = fmt.HEADER_SIZE + rnd.randrange(2_000, 6_000)
    wbs = rnd.choice((64, 700, 1_500, 4_096))
    if same_size:  # runs of entries of one size take a path of their own (one-row entries)
        size, count = ((16, 400), (rnd.randrange(17, 400), 200), (rnd.randrange(400, 1_600), 60),
                       (limit + 100, 6))[seed % 4]
        sizes = [size] * count
    else:
        # sizes around the write buffer and the log limit, one entry bigger than a whole log
        sizes = [rnd.choice((16, 17, rnd.randrange(16, 400), rnd.randrange(400, 1_600))) for _ in range(120)]
        sizes[rnd.randrange(len(sizes))] = limit + 100
    runs: list[tuple[int, list[bytes]]] = []
    eid = 0
    while eid < len(sizes):
        n = rnd.randrange(1, 40)
        lid = rnd.choice((3, 4))
        runs.append((lid, [_entry(lid, e, s) for e, s in zip(range(eid, eid + n), sizes[eid:eid + n])]))
        eid += n
    results = []
    for mode in ("one", "run"):
        ops = _CountingOps()
        root = tmp_path / mode
        with EntryLogger(root, log_size_limit=limit, write_buffer_size=wbs, preallocate=False, file_ops=ops) as el:
            locs: list[int] = []
            for lid, entries in runs:
                if mode == "run":
                    locs.extend(el.add_entries(lid, entries))
                else:
                    locs.extend(el.add_entry(lid, e) for e in entries)
            el.flush()
            read = [el.read_entry(lid, struct.unpack_from(">q", e, 8)[0], loc)
                    for (lid, entries), loc in zip(((lid, [e]) for lid, es in runs for e in es), locs)
                    for e in entries]
        results.append((locs, ops.writes, _logs(root), read))
    (locs_one, writes_one, logs_one, _), (locs_run, writes_run, logs_run, read_run) = results
    assert locs_run == locs_one
    assert writes_run == writes_one  # the buffer written out at the same points
    assert logs_run == logs_one
    assert read_run == [e for _lid, es in runs for e in es]
    assert len({location_log_id(loc) for loc in locs_run}) > 1  # the runs crossed logs


def test_a_short_entry_in_a_run_is_refused_whole(tmp_path: Path) -> None:
    with EntryLogger(tmp_path, log_size_limit=1 << 20, preallocate=False) as el:
        with pytest.raises(ValueError, match="entry of 15 bytes is shorter than 16"):
            el.add_entries(1, [_entry(1, 0, 40), b"x" * 15])
        assert el.add_entries(1, [_entry(1, 0, 40)])  # nothing of the refused run was buffered
        assert el.add_entries(1, []) == []
