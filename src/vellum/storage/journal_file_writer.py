"""The journal file being written: ``JournalFileWriter``, the file role of ``storage/journal.py``.

Responsibility: create each ``<hex id>.txn`` atomically (header and first preallocation written
and fsynced as ``.txn.tmp``, then renamed and the directory fsynced by ``durable.publish``),
seal the torn tail of the previous last journal at start, keep the file preallocated ahead of
the writer (zero-filled on the zero-fill thread, or extended), and write bytes at the current
position, buffered or through ``O_DIRECT`` (``direct_io.AlignedAppender``: whole aligned blocks
only; a filesystem that refuses direct I/O is logged and written buffered from then on). The
group commit, the fsync and the marks stay with ``Journal``, which owns one of these and calls
it only from its writer (or the thread driving ``commit()``).

Invariants: ``pos`` only grows within a file and is where the next byte goes; a new file exists
under its final name only once its header is durable; the bytes on disk are the same in both
write modes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

from vellum.format.journal import ScanStop, encode_header
from vellum.storage import direct_io as dio
from vellum.storage.durable import OS_FILE_OPS, FileOps, publish, temp_path
from vellum.storage.journal_files import JournalFile, journal_file_name
from vellum.storage.journal_pages import ZeroFiller, write_zeros

log = logging.getLogger(__name__)


def _no_fsync(fd: int) -> None:
    del fd  # journalSyncData=false: the zero filler skips its fsyncs too


class JournalFileWriter:
    """The current journal file of one journal dir (see the module docstring). Not thread-safe:
    one writer at a time."""

    def __init__(self, current_dir: Path, index: int, *, format_version: int, alignment: int,
                 prealloc_step: int, write_buffer: int, prealloc_zero: bool | None, direct_io: bool,
                 sync_data: bool, file_ops: FileOps) -> None:
        self.current_dir = current_dir
        self.index = index
        self.format_version = format_version
        self.alignment = alignment
        self._prealloc_step = prealloc_step
        self._write_buffer = write_buffer
        #: None: zero-fill unless writing with direct I/O (see ``extend``)
        self._prealloc_zero_asked = prealloc_zero
        self.direct_io = direct_io
        self._sync_data = sync_data
        # the buffered writes' system calls (the simulator's power loss tracks them); the
        # plain function when they are the OS's, so the writer pays no extra call
        self._ops = file_ops
        self._pwrite: Callable[[int, memoryview, int], int] = (
            os.pwrite if file_ops is OS_FILE_OPS else file_ops.pwrite)
        self.appender: dio.AlignedAppender | None = None
        self._direct_active = False  # the current file is written through the appender
        self.filler: ZeroFiller | None = None
        self.fd = -1
        self.journal_id = -1
        self.path = Path()
        self.pos = 0
        self._prealloc_end = 0

    @property
    def zero_fill(self) -> bool:
        asked = self._prealloc_zero_asked
        return (not self.direct_io) if asked is None else asked

    def journal_path(self, journal_id: int) -> Path:
        return self.current_dir / journal_file_name(journal_id)

    # ------------------------------------------------------------------ files

    def seal(self, journal_id: int, known: ScanStop | None) -> None:
        """Cut the torn tail of the previous last journal so it ends cleanly as a non-last one
        (``known``: where replay stopped in it, if replay read it).

        The bytes after the last valid batch were never acknowledged (a batch is acked only
        after the fsync that covers its checksum).
        """
        path = self.journal_path(journal_id)
        if known is not None:
            stop = known
        else:
            with JournalFile(path) as jf:
                scanner = jf.scanner()
                for _ in scanner:
                    pass
                assert scanner.stop is not None
                stop = scanner.stop
        if stop.clean:
            return
        log.warning("journal %s: truncating torn tail: %s", path, stop.describe(str(path)))
        ops = self._ops
        fd = ops.open(path, os.O_RDWR)
        try:
            ops.ftruncate(fd, stop.valid_end)
            ops.fsync(fd)
        finally:
            ops.close(fd)

    def open_new(self, journal_id: int) -> None:
        """Create ``<hex id>.txn`` atomically: header + first preallocation, fsynced, renamed."""
        path = self.journal_path(journal_id)
        tmp = temp_path(path)
        header = encode_header(self.format_version)
        ops = self._ops
        fd = ops.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self._direct_active = False  # the header and first zeros go through ``fd``, buffered
        try:
            self.fd = fd
            self.pos = 0
            self._prealloc_end = 0
            self.write(header)
            self._fill_sync(len(header))
            ops.fsync(fd)
            if self.direct_io:
                fd = self.fd = self._reopen_direct(tmp, fd, header)
                self._direct_active = self.direct_io
            if self.zero_fill:
                if self.filler is None:
                    self.filler = ZeroFiller(f"journal-{self.index}-zero-fill", self._prealloc_step,
                                             os.fdatasync if self._sync_data else _no_fsync)
                self.filler.reset(fd, self._prealloc_end)
            publish(tmp, path, ops=ops)
        except BaseException:
            os.close(fd)
            self.fd = -1
            raise
        self.journal_id = journal_id
        self.path = path
        log.info("journal %d: writing %s", self.index, path)

    def _reopen_direct(self, tmp: Path, fd: int, header: bytes) -> int:
        """Reopen the new file ``tmp`` (header written and fsynced through ``fd``) with
        ``O_DIRECT`` and point the appender at it; returns the descriptor to write through:
        the direct one, or ``fd`` after a refusal (logged, buffered from then on)."""
        alignment = self.alignment
        try:
            dfd = dio.open_probed(tmp, os.O_RDWR, header, alignment)
        except dio.Refused as r:
            what = "open" if r.what == "open" else f"{r.what} (journalAlignmentSize)"
            return self._refused(fd, r.why, what)
        os.close(fd)
        if self.appender is None:
            capacity = 2 * dio.align_up(max(self._write_buffer, alignment), alignment)
            self.appender = dio.AlignedAppender(capacity, alignment)
        end = len(header)
        self.appender.reset(dfd, end, header[dio.align_down(end, alignment) :])
        return dfd

    def _refused(self, fd: int, why: str, what: str) -> int:
        log.warning(
            "journal %d: the filesystem of %s refused direct I/O at %s (%s); writing this journal "
            "buffered from now on (journalDirectIO=false avoids the attempt)",
            self.index, self.current_dir, what, why,
        )
        self.direct_io = False
        return fd

    def release(self) -> None:
        """Stop the zero filler and release the appender's buffer (the descriptor is closed by
        the last force-write request, or ``close_fd``)."""
        if self.filler is not None:
            self.filler.stop()
        if self.appender is not None:
            self.appender.close()
            self.appender = None

    def close_fd(self) -> None:
        """Close the current descriptor now (a journal driven by steps, abandoned or shut down)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    # ------------------------------------------------------------------ bytes

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Write ``data`` at the current position (raises OSError). Direct I/O: whole aligned
        blocks reach the file, a partial last block waits in the appender for the next write
        (a flush ends aligned, so after a flush nothing waits)."""
        appender = self.appender
        if appender is not None and self._direct_active:
            appender.append(data)
            appender.write_blocks()
            self.pos = appender.end
            return
        view = memoryview(data)
        pos = self.pos
        pwrite = self._pwrite
        while view:
            n = pwrite(self.fd, view, pos)
            pos += n
            view = view[n:]
        self.pos = pos

    def extend(self, upto: int) -> None:
        """Make sure the file is preallocated past ``upto`` before the writer writes there.

        Zero-filled by default for buffered writes: overwriting written blocks makes fdatasync
        cheaper than writing into holes or fallocated extents (benchmarking.md). The zero-filler
        thread keeps about two ``journalPreAllocSizeMB`` steps zeroed and synced ahead, so the
        writer waits only if it catches up. ``prealloc_zero=False`` extends the size only, as
        BookKeeper does; that is the default with direct I/O, where the zeros went through the
        same device queue as the journal's own writes and cost it more than the holes
        (docs/benchmarks.md, "Direct I/O": 1.38-1.41x the plain loop with zeros, 1.60-1.70x
        without, in the same runs).
        """
        if upto + self._prealloc_step <= self._prealloc_end:
            return
        if self.filler is not None:
            self._prealloc_end = self.filler.extend(upto)
            return
        self._fill_sync(upto)

    def _fill_sync(self, upto: int) -> None:
        """Preallocate past ``upto`` on the calling thread (journalPreAllocSizeMB steps)."""
        if upto <= self._prealloc_end:
            return
        new_end = self._prealloc_end + self._prealloc_step
        while new_end < upto:
            new_end += self._prealloc_step
        if self.zero_fill:
            write_zeros(self.fd, max(self._prealloc_end, self.pos), new_end)
        else:
            self._ops.ftruncate(self.fd, new_end)
        self._prealloc_end = new_end
