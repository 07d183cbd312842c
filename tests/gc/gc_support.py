"""Helpers shared by the GC tests (imported by path: tests/ has no packages)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from vellum.format import entrylog as fmt
from vellum.format.entry import DigestManager, DigestType
from vellum.storage.entry_logger import parse_log_file_name
from vellum.storage.ledger_storage import LedgerStorage

KEY = b"master-key"


def entry(ledger_id: int, entry_id: int) -> bytes:
    size = 100 + (ledger_id * 131 + entry_id * 17) % 400
    seed = f"{ledger_id}:{entry_id}:".encode()
    payload = (seed * (size // len(seed) + 1))[:size]
    return DigestManager(ledger_id, DigestType.CRC32C, b"pw").compute(entry_id, entry_id - 1, 0, payload)


def open_storage(path: Path, **kw: object) -> LedgerStorage:
    args: dict[str, object] = dict(
        log_size_limit=64 * 1024,
        write_cache_max_bytes=256 * 1024,
        read_cache_max_bytes=1 << 20,
        read_ahead_batch_size=10,
        max_throttle_time_ms=5000,
        preallocate=True,
    )
    args.update(kw)
    return LedgerStorage(path, **args)  # type: ignore[arg-type]


def write_ledgers(st: LedgerStorage, ledgers: Iterable[int], entries: int, start: int = 0) -> None:
    ids = list(ledgers)
    for lid in ids:
        st.set_master_key(lid, KEY)
    for eid in range(start, start + entries):
        for lid in ids:  # interleaved, like many writers sharing one bookie
            st.add_entry(entry(lid, eid))
    st.flush()


def log_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in (path / "current").glob("*.log"))


class FakeLister:
    """A metadata store view: ``live`` ids, optional failure after ``fail_after`` ranges."""

    def __init__(self, live: Iterable[int], *, range_size: int = 3) -> None:
        self.live = set(live)
        self.range_size = range_size
        self.fail_after: int | None = None
        self.exists_calls = 0

    def ledger_ranges(self) -> Iterable[list[int]]:
        ids = sorted(self.live)
        for n, i in enumerate(range(0, len(ids), self.range_size)):
            if self.fail_after is not None and n >= self.fail_after:
                raise ConnectionError("metadata store connection lost")
            yield ids[i : i + self.range_size]

    def ledger_exists(self, ledger_id: int) -> bool:
        self.exists_calls += 1
        return ledger_id in self.live


def sealed_logs(ledger_dir: Path) -> dict[int, set[int]]:
    """Ledgers of each sealed log (header points at a ledgers map), read from the files."""
    out: dict[int, set[int]] = {}
    for path in (ledger_dir / "current").glob("*.log"):
        log_id = parse_log_file_name(path.name)
        if log_id is None:
            continue
        data = path.read_bytes()
        try:
            header = fmt.decode_header(data[: fmt.HEADER_SIZE])
            sizes = fmt.read_ledgers_map(lambda off, n, d=data: d[off : off + n], len(data))
        except Exception:
            continue
        if header.has_ledgers_map and sizes:
            out[log_id] = set(sizes)
    return out


def live_entries_by_log(st: LedgerStorage, ledgers: Iterable[int]) -> dict[int, set[tuple[int, int]]]:
    """``{log id: {(ledger, entry)}}`` of the given ledgers' indexed entries: what compaction of
    each log must move."""
    out: dict[int, set[tuple[int, int]]] = {}
    for lid in ledgers:
        for eid in st.entry_ids(lid):
            loc = st.location_of(lid, eid)
            assert loc is not None, (lid, eid)
            out.setdefault(loc >> 32, set()).add((lid, eid))
    return out


def read_back_through_index(st: LedgerStorage, expected: Iterable[tuple[int, int]]) -> None:
    """Read every entry in reverse order without read-ahead: each read asks the location index
    (ascending reads with read-ahead are served the entries physically next in a log, so a stale
    index entry would go unnoticed). Use on a freshly opened storage (empty read cache)."""
    keys = sorted(expected, reverse=True)
    assert keys
    for lid, eid in keys:
        assert st.get_entry(lid, eid, read_ahead=False) == entry(lid, eid), (lid, eid)
        assert not st.read_cache_contains(lid, eid)
