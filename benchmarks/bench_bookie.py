"""What the in-process storage benchmarks share (``storage_bench``, ``direct_io_bench``,
``gc_bench``): a real bookie on local dirs, entries made from one digested template, and the
loop that keeps a fixed number of adds in flight. Imported by path, like ``bench_common``."""

from __future__ import annotations

import functools
import os
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vellum.bookie.assembly import OpenedBookie, open_bookie
from vellum.config import ServerConfig
from vellum.format.entry import DigestManager, DigestType, master_key

_ENTRY_ID = struct.Struct(">q")

#: ``submit(entries, callback)``: hand a batch over; ``callback(exc)`` once it is durable
Submit = Callable[[list[bytes], Callable[[BaseException | None], None]], None]


def plain_slice(path: Path, size: int, batch: int, seconds: float) -> tuple[int, float]:
    """The bar: append ``batch`` entries' worth of bytes with one buffered ``write`` and one
    ``fdatasync``, repeat for ``seconds``. Returns (entries, elapsed); the file is removed."""
    buf = os.urandom(size) * batch
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o644)
    try:
        n = 0
        t0 = time.perf_counter()
        deadline = t0 + seconds
        while time.perf_counter() < deadline:
            os.write(fd, buf)
            os.fdatasync(fd)
            n += batch
        return n, time.perf_counter() - t0
    finally:
        os.close(fd)
        os.unlink(path)


def local_bookie(base: Path, **overrides: Any) -> OpenedBookie:
    """A bookie (journal + ledger storage, no server, no HTTP) on ``base``/journal and
    ``base``/ledgers, with ``overrides`` of ``ServerConfig``."""
    config = ServerConfig(
        journal_directories=(str(base / "journal"),),
        ledger_directories=(str(base / "ledgers"),),
        http_server_enabled=False,
        **overrides,
    )
    return open_bookie(config, bookie_id="bench:0")


class Entries:
    """Stored entries of one ledger: a digested template with the entry id patched in (the
    bookie and the journal store entries as given; digests are the client's business)."""

    def __init__(self, size: int, ledger_id: int = 1) -> None:
        template = DigestManager(ledger_id, DigestType.CRC32C, b"").compute(0, -1, 0, os.urandom(size))
        self.head, self.tail = template[:8], template[16:]
        self.next_entry = 0

    def take(self, k: int) -> list[bytes]:
        # one copy per entry (a 64 KiB entry built in two copies made the producer the bottleneck)
        head, tail, pack = self.head, self.tail, _ENTRY_ID.pack
        first = self.next_entry
        self.next_entry += k
        return [b"".join((head, pack(e), tail)) for e in range(first, first + k)]


def run_window(submit: Submit, entries: Entries, inflight: int, seconds: float) -> tuple[int, float]:
    """Keep ``inflight`` entries outstanding for ``seconds``; freed slots are refilled as one
    batch (as the server hands over the pipelined adds of one socket read). Drains at the end.
    Returns (entries acknowledged, seconds)."""
    cond = threading.Condition()
    free = inflight
    acked = 0
    errors: list[BaseException] = []

    def done(k: int, exc: BaseException | None) -> None:
        nonlocal free, acked
        with cond:
            if exc is not None:
                errors.append(exc)
            else:
                acked += k
            free += k
            cond.notify()

    t0 = time.perf_counter()
    deadline = t0 + seconds
    while time.perf_counter() < deadline:
        with cond:
            while free == 0:
                cond.wait()
            k, free = free, 0
        submit(entries.take(k), functools.partial(done, k))
    with cond:
        while free < inflight:
            cond.wait()
    elapsed = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return acked, elapsed


class AddPath:
    """A real bookie (journal + ledger storage) driven with ``inflight`` adds in flight, each
    acknowledged after the journal fsync that covers it."""

    def __init__(self, base: Path, size: int, inflight: int, overrides: dict[str, Any]) -> None:
        self.opened = local_bookie(base, **overrides)
        self.key = master_key(b"")
        self.entries = Entries(size)
        self.inflight = inflight

    def _submit(self, batch: list[bytes], callback: Callable[[BaseException | None], None]) -> None:
        refused = self.opened.bookie.add_entries([(e, self.key, False) for e in batch], callback)
        for r in refused:
            if r is not None:
                raise r

    def slice(self, seconds: float) -> tuple[int, float]:
        return run_window(self._submit, self.entries, self.inflight, seconds)

    def close(self) -> None:
        self.opened.close()
