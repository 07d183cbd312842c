"""Direct I/O (``O_DIRECT``) appends: aligned buffers at aligned offsets, and the test whether a
directory's filesystem takes them at all.

Responsibility: write a growing file through a descriptor opened with ``O_DIRECT`` (the
journal with ``journalDirectIO``, entry logs with ``dbStorage_directIOEntryLogger``) while its
callers keep appending bytes of any length, and tell them, with the reason, when the
filesystem refuses direct I/O so they can fall back to buffered writes.

``AlignedAppender`` holds the file's bytes from ``base`` (a multiple of the alignment) to
``end`` in a page-aligned buffer (an anonymous ``mmap``, reused for the life of the appender).
``append`` copies bytes in and writes every full buffer; ``write_blocks`` writes the whole
blocks it holds and keeps the partial last block; ``write_all`` also writes that partial block,
zero-padded to the alignment, and keeps it in memory: the next write rewrites that block with
the same leading bytes and more after them.

Invariants:
- Every write starts at a file offset that is a multiple of ``alignment``, its length is a
  multiple of ``alignment``, and it comes from the page-aligned buffer: what ``O_DIRECT``
  demands (the alignment must be at least the device's logical block size; ``probe`` checks).
- Bytes below ``written_end`` are in the file as appended; bytes between it and ``end`` are only
  in memory. Padding written past ``written_end`` is zeros and is overwritten by later appends.
- A short or failed write raises ``OSError`` (a short direct write is ``EIO``: continuing it
  would be unaligned); the appender's content is then undefined and its caller abandons the
  file (journal: fail-stop; entry logger: the log is abandoned), never retries into it.
- ``O_DIRECT`` bypasses the page cache, it does not make data durable: callers still
  ``fdatasync`` before they acknowledge (rule 1 of docs/correctness.md).
"""

from __future__ import annotations

import errno
import mmap
import os
from collections.abc import Callable
from pathlib import Path

#: ``os.O_DIRECT`` where the platform has it (Linux); 0 elsewhere (direct I/O unavailable)
O_DIRECT: int = getattr(os, "O_DIRECT", 0)
#: alignment of entry-log direct writes: BookKeeper's DirectEntryLogger aligns to 4 KiB too
ENTRY_LOG_ALIGNMENT = 4096

#: ``pwrite(fd, data, offset) -> bytes written``
PwriteFn = Callable[[int, memoryview, int], int]


def open_direct(path: Path, flags: int) -> int:
    """``os.open(path, flags | O_DIRECT)``; raises ``OSError`` (``EINVAL``: the filesystem
    refuses direct I/O). Module-level so tests can make it refuse."""
    if not O_DIRECT:
        raise OSError(errno.EINVAL, "O_DIRECT is not available on this platform")
    return os.open(path, flags | O_DIRECT)


def refusal(e: OSError) -> str | None:
    """Why ``e`` means "no direct I/O here" (fall back to buffered writes), or None when it is a
    real I/O error that must fail the write (EIO, ENOSPC...)."""
    if e.errno in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
        return f"{errno.errorcode.get(e.errno or 0, e.errno)}: {e.strerror or e}"
    return None


def align_down(n: int, alignment: int) -> int:
    return n - n % alignment


def align_up(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def aligned_buffer(size: int) -> mmap.mmap:
    """A zeroed, page-aligned, writable buffer of ``size`` bytes (anonymous memory, touched
    lazily by the kernel: unused capacity costs no RSS)."""
    return mmap.mmap(-1, size)


class AlignedAppender:
    """Appends to a file opened with ``O_DIRECT`` (see the module docstring)."""

    def __init__(self, capacity: int, alignment: int, *, pwrite: PwriteFn = os.pwrite) -> None:
        if alignment < 512 or alignment & (alignment - 1):
            raise ValueError(f"direct I/O alignment {alignment} must be a power of two of at least 512")
        if alignment > mmap.PAGESIZE and alignment % mmap.PAGESIZE:
            raise ValueError(f"direct I/O alignment {alignment} must be a multiple of the page size")
        self.alignment = alignment
        self.capacity = max(align_up(capacity, alignment), 2 * alignment)
        self._mm: mmap.mmap | None = aligned_buffer(self.capacity)
        self._view = memoryview(self._mm)
        self._pwrite = pwrite
        self.fd = -1
        self.base = 0  # file offset of the buffer's first byte (a multiple of alignment)
        self.length = 0  # bytes held
        self.written_end = 0  # bytes below this are in the file
        self.writes = 0  # direct writes issued (observability, tests)

    @property
    def end(self) -> int:
        """The logical end of the file: everything appended so far."""
        return self.base + self.length

    def reset(self, fd: int, end: int, head: bytes | bytearray | memoryview = b"") -> None:
        """Follow ``fd`` whose content up to ``end`` is known; ``head`` is that content from
        ``align_down(end)`` (the partial block the next write rewrites), so it must be
        ``end % alignment`` bytes long."""
        base = align_down(end, self.alignment)
        if len(head) != end - base:
            raise ValueError(f"head of {len(head)} bytes for end {end}: need the {end - base} bytes from {base}")
        self._view[: len(head)] = head
        self.fd = fd
        self.base = base
        self.length = len(head)
        self.written_end = end

    def append(self, data: bytes | bytearray | memoryview) -> None:
        """Copy ``data`` in; every time the buffer fills, write it whole (raises OSError)."""
        view = self._view
        cap = self.capacity
        # Views of ``data`` are released on the way out, also when a write raises: a live one
        # would keep the caller from resizing its buffer.
        with memoryview(data) as raw, raw.cast("B") as src:
            pos, total = 0, len(src)
            while pos < total:
                n = min(total - pos, cap - self.length)
                view[self.length : self.length + n] = src[pos : pos + n]
                self.length += n
                pos += n
                if self.length == cap:
                    self._write(cap, cap)

    def write_blocks(self) -> None:
        """Write the whole blocks held; keep the partial last block (raises OSError)."""
        full = align_down(self.length, self.alignment)
        if full:
            self._write(full, full)

    def write_all(self) -> None:
        """Write everything held, the partial last block zero-padded; keep that block in memory
        for the next write (raises OSError)."""
        if self.written_end >= self.end:
            return
        padded = align_up(self.length, self.alignment)
        if padded > self.length:
            self._view[self.length : padded] = bytes(padded - self.length)
        self._write(padded, align_down(self.length, self.alignment))

    def _write(self, size: int, consumed: int) -> None:
        """Write ``buffer[:size]`` at ``base`` and drop its first ``consumed`` bytes."""
        with self._view[:size] as chunk:  # released even if the write raises (see ``close``)
            n = self._pwrite(self.fd, chunk, self.base)
        self.writes += 1
        if n != size:
            raise OSError(errno.EIO, f"short direct write ({n} of {size} bytes at offset {self.base})")
        self.written_end = max(self.written_end, min(self.base + size, self.end))
        if consumed:
            rest = self.length - consumed
            if rest:
                assert self._mm is not None
                self._mm.move(0, consumed, rest)
            self.base += consumed
            self.length = rest

    def close(self) -> None:
        """Release the buffer (the descriptor is the caller's). Every view handed to ``pwrite``
        was released when it returned or raised, so a traceback still held cannot pin it."""
        if self._mm is not None:
            self._view.release()
            self._mm.close()
            self._mm = None


def probe(fd: int, head: bytes | bytearray | memoryview, alignment: int) -> None:
    """Write the file's first block again (``head`` zero-padded to ``alignment``) through the
    direct descriptor ``fd``: the filesystem and the device accept this alignment, or
    ``OSError`` says why not (``refusal`` tells a refusal from an I/O error)."""
    buf = aligned_buffer(align_up(max(len(head), 1), alignment))
    try:
        view = memoryview(buf)
        view[: len(head)] = head
        n = os.pwrite(fd, view, 0)
        view.release()
        if n != len(buf):
            raise OSError(errno.EIO, f"short direct write ({n} of {len(buf)} bytes at offset 0)")
    finally:
        buf.close()


class Refused(Exception):
    """The filesystem refuses direct I/O ``what`` (``"open"`` or an aligned write): ``why``."""

    def __init__(self, why: str, what: str) -> None:
        super().__init__(f"direct I/O refused at {what}: {why}")
        self.why = why
        self.what = what


def open_probed(path: Path, flags: int, head: bytes | bytearray | memoryview, alignment: int, *,
                opener: Callable[[Path, int], int] | None = None,
                close: Callable[[int], None] = os.close) -> int:
    """A second descriptor of ``path`` (whose first bytes, ``head``, are written and synced
    through a buffered one) opened with ``O_DIRECT`` and probed with one aligned write of its
    first block. Raises ``Refused`` when the filesystem will not take direct I/O here (the
    caller falls back to buffered writes), ``OSError`` for a real I/O error. ``opener(path,
    flags)`` opens (default ``open_direct``; a ``FileOps.open`` adds ``O_DIRECT`` itself)."""
    try:
        dfd = opener(path, flags | O_DIRECT) if opener is not None else open_direct(path, flags)
    except OSError as e:
        why = refusal(e)
        if why is None:
            raise
        raise Refused(why, "open") from None
    try:
        probe(dfd, head[:alignment], alignment)
    except OSError as e:
        close(dfd)
        why = refusal(e)
        if why is None:
            raise
        raise Refused(why, f"a {alignment}-byte aligned write") from None
    return dfd
