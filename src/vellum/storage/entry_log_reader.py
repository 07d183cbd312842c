"""Reads of the entry logs of one ledger directory: by location, runs, scans, ledgers maps.

Every read is an ``os.pread`` on a reference-counted read-only descriptor per log, so reads run
concurrently with each other and with appends. A log's descriptor stays open until the log is
deleted (``close_log``) or the reader closes; a deleted log's descriptor closes when its last
reader releases it.

Invariants:
- A record is returned only if its size field is sane and the ids stored in it are the ones
  asked for (``read_entry``, and each record of a run, ``read_records``); a run stops quietly
  at anything unexpected and the caller reads on entry by entry, with full checks.
- Nothing past what the writer handed to the file is read: an active log's buffered bytes are
  first handed to the file (``make_readable``, the entry logger's), and a run stops at the
  active log's written end (``readable_end``; None for a sealed log).
- Verifying an entry's digest is the caller's business (ledger storage knows the ledger's
  digest); a scan may be given a ``verify`` function.
"""

from __future__ import annotations

import os
import struct
import threading
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from vellum.errors import CorruptionError, StorageError
from vellum.format import entrylog as fmt
from vellum.ids import location_log_id, location_offset
from vellum.storage.entry_log_allocator import list_log_ids, log_file_name

#: largest single pread of ``read_records`` (longer runs take several)
_RUN_CHUNK_MAX = 16 << 20
#: first pread of a strided run, before the bytes per wanted entry are known
_STRIDED_FIRST_READ = 1 << 20

#: hands an active log's buffered bytes below ``end`` to the file: ``(log_id, end)``
MakeReadableFn = Callable[[int, int], None]
#: the bytes of an active log in the file; None for a sealed log
ReadableEndFn = Callable[[int], "int | None"]


@dataclass
class _Descriptor:
    fd: int
    users: int = 0
    closing: bool = False


#: a record's size field and the ledger id and entry id its entry starts with
_RECORD_HEAD = struct.Struct(">iqq")


class RecordRun:
    """Records of one ledger read by ``read_records``: the wanted entries, in order, as offsets
    into the read buffers (``chunks``: ``(buffer, starts, ends)``, entry i of a chunk is
    ``buffer[starts[i]:ends[i]]``, its size field the 4 bytes before it)."""

    __slots__ = ("chunks", "count", "entry_bytes", "full")

    def __init__(self) -> None:
        self.chunks: list[tuple[memoryview, array[int], array[int]]] = []
        self.count = 0
        #: bytes of the wanted entries
        self.entry_bytes = 0
        #: the byte bound stopped the run (the next wanted entry did not fit)
        self.full = False

    def add_chunk(self, buf: memoryview, starts: array[int], ends: array[int]) -> None:
        self.chunks.append((buf, starts, ends))
        self.count += len(starts)
        self.entry_bytes += sum(ends) - sum(starts)

    def views(self) -> list[memoryview]:
        """The entries as views of the read buffers (a view per entry: for tests and tools)."""
        return [buf[s:e] for buf, starts, ends in self.chunks for s, e in zip(starts, ends)]


class EntryLogReader:
    """Reads the entry logs of one ``current/`` directory (see the module docstring)."""

    def __init__(
        self, current_dir: Path, *, make_readable: MakeReadableFn, readable_end: ReadableEndFn
    ) -> None:
        self.current_dir = current_dir
        self._make_readable = make_readable
        self._readable_end = readable_end
        self._lock = threading.Lock()
        self._descriptors: dict[int, _Descriptor] = {}

    def log_path(self, log_id: int) -> Path:
        return self.current_dir / log_file_name(log_id)

    def log_ids(self) -> list[int]:
        """Ids of the ``.log`` files in ``current/``, ascending (compaction temporaries excluded)."""
        return list_log_ids(self.current_dir)

    def file_size(self, log_id: int) -> int:
        path = self.log_path(log_id)
        try:
            return path.stat().st_size
        except FileNotFoundError:
            raise CorruptionError(f"{path}: entry log does not exist") from None

    # ------------------------------------------------------------------ descriptors

    def _acquire(self, log_id: int) -> _Descriptor:
        with self._lock:
            desc = self._descriptors.get(log_id)
            if desc is None:
                path = self.log_path(log_id)
                try:
                    fd = os.open(path, os.O_RDONLY)
                except FileNotFoundError:
                    raise CorruptionError(f"{path}: entry log does not exist") from None
                except OSError as e:
                    raise StorageError(f"{path}: cannot open: {e.strerror}") from None
                desc = self._descriptors[log_id] = _Descriptor(fd)
            desc.users += 1
            return desc

    def _release(self, desc: _Descriptor) -> None:
        with self._lock:
            desc.users -= 1
            if desc.closing and desc.users == 0:
                os.close(desc.fd)

    def close_log(self, log_id: int) -> None:
        """The log is being deleted: close its descriptor once no read uses it."""
        with self._lock:
            desc = self._descriptors.pop(log_id, None)
            if desc is not None:
                desc.closing = True
                if desc.users == 0:
                    os.close(desc.fd)

    def close(self) -> None:
        with self._lock:
            for desc in self._descriptors.values():
                desc.closing = True
                if desc.users == 0:
                    os.close(desc.fd)
            self._descriptors.clear()

    def _pread(self, desc: _Descriptor, n: int, offset: int, log_id: int) -> bytes:
        try:
            return os.pread(desc.fd, n, offset)
        except OSError as e:
            raise StorageError(
                f"{self.log_path(log_id)} offset {offset}: read failed: {e.strerror}"
            ) from None

    def _read_fn(self, desc: _Descriptor, log_id: int) -> Callable[[int, int], bytes]:
        return lambda off, n: self._pread(desc, n, off, log_id)

    # ------------------------------------------------------------------ random reads

    def read_entry(self, ledger_id: int, entry_id: int, location: int) -> bytes:
        """The entry stored at ``location``; the size and ids there must match the request."""
        log_id, offset = location_log_id(location), location_offset(location)
        path = self.log_path(log_id)
        if offset < fmt.HEADER_SIZE + fmt.SIZE_FIELD:
            raise CorruptionError(f"{path} offset {offset}: location points into the header")
        self._make_readable(log_id, offset + fmt.MIN_SANE_ENTRY_SIZE)
        desc = self._acquire(log_id)
        try:
            head = self._pread(
                desc, fmt.SIZE_FIELD + fmt.MIN_SANE_ENTRY_SIZE, offset - fmt.SIZE_FIELD, log_id
            )
            if len(head) < fmt.SIZE_FIELD + fmt.MIN_SANE_ENTRY_SIZE:
                raise CorruptionError(f"{path} offset {offset}: entry runs past the end of the log")
            size = fmt.decode_size(head)
            if size < fmt.MIN_SANE_ENTRY_SIZE:
                raise CorruptionError(f"{path} offset {offset - fmt.SIZE_FIELD}: insane entry size {size}")
            lid, eid = fmt.entry_ids(head[fmt.SIZE_FIELD :])
            if (lid, eid) != (ledger_id, entry_id):
                raise CorruptionError(
                    f"{path} offset {offset}: expected ledger {ledger_id} entry {entry_id}, "
                    f"found ledger {lid} entry {eid}"
                )
            self._make_readable(log_id, offset + size)
            entry = self._pread(desc, size, offset, log_id)
            if len(entry) != size:
                raise CorruptionError(
                    f"{path} offset {offset}: entry of {size} bytes runs past the end of the log"
                )
            return entry
        finally:
            self._release(desc)

    def record_size(self, location: int) -> int | None:
        """Bytes the record at ``location`` occupies (size field included), or None if unreadable."""
        log_id, offset = location_log_id(location), location_offset(location)
        try:
            self._make_readable(log_id, offset)
            desc = self._acquire(log_id)
        except (CorruptionError, StorageError):
            return None
        try:
            head = self._pread(desc, fmt.SIZE_FIELD, offset - fmt.SIZE_FIELD, log_id)
        except StorageError:
            return None
        finally:
            self._release(desc)
        return fmt.SIZE_FIELD + fmt.decode_size(head) if len(head) == fmt.SIZE_FIELD else None

    # ------------------------------------------------------------------ runs

    def read_records(
        self, ledger_id: int, location: int, *, first_entry_id: int, stride: int, max_entries: int,
        max_bytes: int, first_counts: bool,
    ) -> RecordRun:
        """The records of entries ``first_entry_id, first_entry_id + stride, ...`` of
        ``ledger_id`` stored one after the other from ``location`` (the first one's), with, for
        a stride above 1, only records of this ledger whose entry ids lie between two wanted
        ones in between (skipped): READ_STRIDED and BATCH_READ runs.

        Reads in as few preads as the sizes allow (the first sized from the run's first record,
        later ones from what the run used so far) and returns offsets into the read buffers:
        no object per entry. The ledger id and entry id stored in each record are checked (the
        run is valid whatever moved since its first location was looked up: compaction copies
        records as they are). Stops at ``max_entries``, before the record that would take the
        entry bytes past ``max_bytes`` (``<= 0``: no bound; with ``first_counts`` the first is
        returned whatever its size; ``RecordRun.full`` says the bound stopped it), at the end of
        what is readable, or quietly at anything unexpected (the caller reads on entry by
        entry, with full checks). Digests are the caller's to verify.
        """
        log_id, offset = location_log_id(location), location_offset(location)
        run = RecordRun()
        if max_entries <= 0 or offset < fmt.HEADER_SIZE + fmt.SIZE_FIELD:
            return run
        desc = self._acquire(log_id)
        try:
            self._records(desc, log_id, offset - fmt.SIZE_FIELD, ledger_id, first_entry_id, max(1, stride),
                          max_entries, max_bytes, first_counts, run)
        finally:
            self._release(desc)
        return run

    def _records(self, desc: _Descriptor, log_id: int, pos: int, ledger_id: int, expected: int, stride: int,
                 max_entries: int, max_bytes: int, first_counts: bool, run: RecordRun) -> None:
        """``read_records``'s walk from the record whose size field is at ``pos``: one pread
        per chunk, then a walk over the chunk's records without leaving it."""
        limit = self._readable_end(log_id)
        end_of_data = limit if limit is not None else 1 << 62
        unpack = _RECORD_HEAD.unpack_from
        head_len = _RECORD_HEAD.size
        min_size = fmt.MIN_SANE_ENTRY_SIZE
        start = pos
        count = total = 0
        need = head_len  # bytes the next read must hold: a record head, or a whole record
        while True:
            if pos + head_len > end_of_data:
                return
            # Sized for the entries still wanted, at the bytes per wanted entry seen so far (the
            # first record's size, times the stride, before any), within the bounds.
            want = max_entries - count
            if count:
                per_entry = (pos - start) // count + 1
            else:
                head = self._pread(desc, fmt.SIZE_FIELD, pos, log_id)
                if len(head) < fmt.SIZE_FIELD:
                    return
                per_entry = (fmt.SIZE_FIELD + fmt.decode_size(head)) * stride
            n = want * per_entry * 5 // 4 + 4096  # entries vary in size: a second read costs more than slack
            if max_bytes > 0:
                n = min(n, (max(max_bytes - total, 0) + fmt.SIZE_FIELD * want) * stride + per_entry)
            if stride > 1 and not count:
                n = min(n, _STRIDED_FIRST_READ)  # how many records lie between is not known yet
            n = min(max(need, min(n, _RUN_CHUNK_MAX)), end_of_data - pos)
            if n < need:
                return
            buf = memoryview(self._pread(desc, n, pos, log_id))
            end = len(buf)
            if end < need:
                return
            starts: array[int] = array("q")
            ends: array[int] = array("q")
            add_start, add_end = starts.append, ends.append
            rel = 0
            need = head_len
            stop = False
            while count < max_entries and rel + head_len <= end:
                size, lid, eid = unpack(buf, rel)
                nxt = rel + fmt.SIZE_FIELD + size
                if size < min_size or lid != ledger_id:
                    stop = True
                    break
                if eid != expected:
                    if expected - stride < eid < expected:
                        rel = nxt  # an entry another replica serves, between two wanted ones
                        continue
                    stop = True
                    break
                if (count or not first_counts) and 0 < max_bytes < total + size:
                    run.full = True
                    stop = True
                    break
                if nxt > end:
                    need = fmt.SIZE_FIELD + size  # straddles the end of the buffer: read on from it
                    break
                add_start(rel + fmt.SIZE_FIELD)
                add_end(nxt)
                rel = nxt
                count += 1
                total += size
                expected += stride
            if starts:
                run.add_chunk(buf, starts, ends)
            if stop or count >= max_entries:
                return
            pos += rel

    # ------------------------------------------------------------------ whole logs

    def scanner(
        self, log_id: int, end: int, *, verify: fmt.VerifyFn | None = None, skip_corrupt: bool = False
    ) -> fmt.EntryLogScanner:
        """A scanner over one log's records below ``end``; the header is checked first. It
        keeps the log's descriptor until iteration ends (it reads lazily). ``skip_corrupt``:
        unreadable records are skipped, not the end of the scan (``fmt.EntryLogScanner``)."""
        path = self.log_path(log_id)
        desc = self._acquire(log_id)
        read = self._read_fn(desc, log_id)
        try:
            fmt.decode_header(read(0, fmt.HEADER_SIZE), where=str(path))
        except Exception:
            self._release(desc)
            raise
        return _OwningScanner(
            read, end=end, verify=verify, where=str(path), release=lambda: self._release(desc),
            skip_corrupt=skip_corrupt,
        )

    def ledgers_in(self, log_id: int, end: int) -> tuple[dict[int, int], bool]:
        """``({ledger_id: bytes}, from_map)`` of a sealed log: the ledgers map at its end, else a
        full scan (BookKeeper's rule)."""
        path = self.log_path(log_id)
        desc = self._acquire(log_id)
        try:
            sizes = fmt.read_ledgers_map(self._read_fn(desc, log_id), end, where=str(path))
        finally:
            self._release(desc)
        if sizes is not None:
            return sizes, True
        scanned: dict[int, int] = {}
        for rec in self.scanner(log_id, end):
            scanned[rec.ledger_id] = scanned.get(rec.ledger_id, 0) + fmt.SIZE_FIELD + rec.size
        return scanned, False


class _OwningScanner(fmt.EntryLogScanner):
    """A scanner that releases its read descriptor when iteration ends."""

    def __init__(
        self,
        read: fmt.ReadFn,
        *,
        end: int,
        verify: fmt.VerifyFn | None,
        where: str,
        release: Callable[[], None],
        skip_corrupt: bool = False,
    ) -> None:
        super().__init__(read, end=end, verify=verify, where=where, skip_corrupt=skip_corrupt)
        self._release = release
        self._released = False

    def __iter__(self) -> Iterator[fmt.LogRecord]:
        try:
            yield from super().__iter__()
        finally:
            if not self._released:
                self._released = True
                self._release()
