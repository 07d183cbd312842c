"""Pages of the current journal file around the writer: zeroed ahead of it, dropped behind
the sync mark.

- ``ZeroFiller`` keeps about two ``journalPreAllocSizeMB`` steps past the writer zeroed (or,
  for fast or big-batch journals, ``fallocate``d) and fdatasynced, on a thread of its own, so
  neither the zeros nor their fsync land on the add path.
- ``SyncProgress`` follows where each group-commit fsync left the file: it measures the bytes
  per fsync (the filler's zeros-or-fallocate choice) and, with ``journalRemoveFromPageCache``,
  drops fsynced pages from the OS page cache.

Invariants:
- The writer only writes below the filler's published end (bytes zeroed *and* synced), the
  filler only at or above it: they never touch the same bytes.
- The filler writes through a ``dup`` of the journal's descriptor that it closes itself, so a
  roll that closes the writer's descriptor never makes it write into a file that reused the
  number. A filler error (ENOSPC...) is raised to the writer at its next ``extend``.
- Only fsynced pages are dropped, never the MiB the writer is appending into.
- The zeros come from page-aligned memory in MiB chunks at offsets that are multiples of the
  preallocation step, so the filler works through a descriptor opened with ``O_DIRECT`` too.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

_MB = 1 << 20
#: a MiB of zeros in page-aligned memory (so a journal opened with O_DIRECT can write it too);
#: slices of it are not copies
ZERO_CHUNK = memoryview(mmap.mmap(-1, _MB, prot=mmap.PROT_READ))


def write_zeros(fd: int, start: int, end: int) -> None:
    """Overwrite ``[start, end)`` of ``fd`` with zeros (raises OSError)."""
    pos = start
    while pos < end:
        pos += os.pwrite(fd, ZERO_CHUNK[: min(len(ZERO_CHUNK), end - pos)], pos)


class ZeroFiller:
    """Zero-fills the current journal file ahead of the writer, on a thread of its own.

    The writer only writes below ``end`` (bytes already zeroed *and* fdatasynced), the filler
    only at or above it, so they never touch the same bytes. Filling and syncing ahead keeps
    both off the add path: without it every ``journalPreAllocSizeMB`` of journal the writer
    stopped to write the zeros, and the next group commit's fdatasync flushed them (tens of
    ms for 16 MB), a latency spike for every add waiting on that fsync.

    The filler works on its own ``dup`` of the file descriptor, so a roll that closes the
    writer's descriptor can never make it write into another file that reused the number.

    Zeros or ``fallocate``: overwriting written blocks makes each fdatasync cheaper (1 KiB adds,
    64 in flight: p50 1.50 vs 1.62 ms, p99 3.6 vs 3.7 ms, 5% more adds/s), but writing the zeros
    costs as much as the data. Past ``FALLOCATE_ABOVE_BYTES_PER_S`` of journal (big entries:
    128 KiB adds ran 20% faster on 25% less bookie CPU), or when group commits average
    ``FALLOCATE_ABOVE_BYTES_PER_SYNC`` (the extent conversion is then a small part of each
    fsync; a Spark sink's 128 KiB entries at ~90 MB/s made the zeros a fifth of the bookie's
    write cost), the filler allocates instead.
    """

    #: journal write rate above which space is allocated rather than zero-filled
    FALLOCATE_ABOVE_BYTES_PER_S = 96 * _MB
    #: average bytes per group commit above which space is allocated rather than zero-filled
    FALLOCATE_ABOVE_BYTES_PER_SYNC = 512 * 1024

    def __init__(self, name: str, step: int, fsync: Callable[[int], None]) -> None:
        self._step = step
        self._fsync = fsync
        self._cond = threading.Condition()
        self._fd = -1
        self._end = 0  # zeroed and synced up to here (filler publishes, writer reads)
        self._want = 0
        self._error: OSError | None = None
        self._stop = False
        self._retired: list[int] = []
        self._rate_mark = (time.monotonic(), 0)  # (when, wanted end) of the last rate sample
        self.rate_bytes_per_s = 0.0
        self.bytes_per_sync = 0.0  # smoothed group-commit size, kept by the force-write thread
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def reset(self, fd: int, end: int) -> None:
        """Follow a new file whose bytes below ``end`` are already zeroed and synced."""
        new_fd = os.dup(fd)
        with self._cond:
            old, self._fd = self._fd, new_fd
            self._end = self._want = end
            self._error = None
            self._cond.notify_all()
        if old >= 0:
            self._close_later(old)

    def _close_later(self, fd: int) -> None:
        # The filler may be writing through ``fd`` right now (outside the lock): it closes
        # descriptors it no longer follows itself, after its current chunk.
        with self._cond:
            self._retired.append(fd)
            self._cond.notify_all()

    def extend(self, upto: int) -> int:
        """Ask for zeros two steps past ``upto``; wait only until ``upto`` itself is covered.

        Returns the covered end. Raises the filler's ``OSError`` (ENOSPC...) if it failed.
        """
        step = self._step
        with self._cond:
            want = (upto + step - 1) // step * step + step
            if want > self._want:
                self._want = want
                self._cond.notify_all()
            while self._end < upto and self._error is None and not self._stop:
                self._cond.wait()
            if self._error is not None:
                raise self._error
            if self._end < upto:
                raise OSError(f"journal zero-filler stopped before offset {upto}")
            return self._end

    def _sample_rate(self, want: int) -> None:
        """How fast the writer asks for space (bytes/s, smoothed). Caller holds the lock."""
        now = time.monotonic()
        when, wanted = self._rate_mark
        if want < wanted:  # a new file: start over
            self._rate_mark = (now, want)
            return
        if now - when >= 0.05 and want > wanted:
            rate = (want - wanted) / (now - when)
            self.rate_bytes_per_s = rate if self.rate_bytes_per_s == 0 else 0.5 * (self.rate_bytes_per_s + rate)
            self._rate_mark = (now, want)

    def allocates(self) -> bool:
        """Whether the space ahead is allocated (``fallocate``) rather than zero-filled."""
        return (self.rate_bytes_per_s > self.FALLOCATE_ABOVE_BYTES_PER_S
                or self.bytes_per_sync > self.FALLOCATE_ABOVE_BYTES_PER_SYNC)

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join()

    def _run(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while not self._stop and not self._retired and (self._want <= self._end or self._error):
                    cond.wait()
                retired, self._retired = self._retired, []
                if self._stop:
                    retired.append(self._fd)
                    self._fd = -1
                fd, start, want, failed = self._fd, self._end, self._want, self._error is not None
                self._sample_rate(want)
            for old in retired:
                if old >= 0:
                    os.close(old)
            if fd < 0 and self._stop:
                return
            if fd < 0 or failed:
                continue  # nothing to follow, or failed until the next reset
            # 1 MB at a time, each synced before the next: a 16 MB burst of dirty zeros in the
            # device queue delayed the journal's own fdatasync by tens of ms.
            pos = start
            while pos < want:
                end = min(want, pos + len(ZERO_CHUNK))
                try:
                    if self.allocates():
                        os.posix_fallocate(fd, pos, end - pos)
                    else:
                        write_zeros(fd, pos, end)
                    self._fsync(fd)
                except OSError as e:
                    with cond:
                        if fd == self._fd:
                            self._error = e
                        cond.notify_all()
                    break
                pos = end
                with cond:
                    if fd != self._fd or self._stop:
                        break
                    self._end = pos
                    cond.notify_all()


class SyncProgress:
    """Where each fdatasync left the current journal file (force-write thread only).

    It measures the group commits (bytes covered per fsync, smoothed, for the zero filler's
    choice) and, with ``journalRemoveFromPageCache``, drops the fsynced pages from the OS page
    cache a MiB at a time. Dropped clean pages are freed at once, so the next journal (and entry
    log) writes reuse them rather than taking never-touched memory, which on a VM can cost ten
    times the copy (the host backs it on first touch). The MiB below the mark stays: the writer
    appends into its last page.
    """

    _STEP = 1 << 20

    def __init__(self, drop_pages: bool) -> None:
        self._drop = drop_pages
        self._file = (-1, -1)  # (fd, journal id): a new file may reuse the old one's fd
        self._end = 0
        self._dropped = 0
        self.bytes_per_sync = 0.0

    def synced(self, fd: int, journal_id: int, end: int) -> None:
        if (fd, journal_id) != self._file:
            self._file, self._dropped = (fd, journal_id), 0
        else:
            size = end - self._end
            bps = self.bytes_per_sync
            self.bytes_per_sync = float(size) if bps == 0 else 0.8 * bps + 0.2 * size
        self._end = end
        upto = (end // self._STEP - 1) * self._STEP
        if self._drop and upto > self._dropped:
            try:
                os.posix_fadvise(fd, self._dropped, upto - self._dropped, os.POSIX_FADV_DONTNEED)
            except OSError as e:  # advisory: the journal is intact whatever the cache holds
                log.debug("journal page-cache drop failed on fd %d: %s", fd, e)
            self._dropped = upto
