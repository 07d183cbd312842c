"""A fixed, bounded run of the add path to count instructions under valgrind (docs/benchmarks.md,
"Instructions per entry on the add path").

Instruction counts do not depend on the load of a shared machine; wall and CPU time do. Run a
mode twice under ``valgrind --tool=cachegrind --cache-sim=no``, once with ``--noop`` (the same
set-up, nothing added), and divide the difference by ``--entries``:

- ``client``: a LocalCluster of 3 bookies (their processes are not traced: run valgrind with
  ``--trace-children=no``), one ledger (3,2,2) and ``--entries`` entries of ``--size`` bytes
  appended the way the Spark sink's tasks append (``append_batch_async`` slices of ``--batch``,
  at most ``--window`` in flight, with the garbage collector set as the sink's tasks set it:
  ``heap_frozen`` and ``young_collections_spaced`` of ``vellum.spark.writer``), then the ledger
  closed. Counts the client's work per entry:
  the stored entry and its digest, the ADD frames, the answers and the quorum bookkeeping.
- ``storage``: one bookie in this process; the ADD frames are made and decoded beforehand (the
  set-up, also done by ``--noop``), then each decoded batch goes to ``Bookie.add_batch`` with
  the journal fsynced, and at the end a checkpoint writes the write cache out to the entry log
  and the index. Counts one stored copy: admission, journal record and group commit, write
  cache, flush to the entry log and the RocksDB index.
- ``decode``: the bookie's decoding of ``--entries`` ADD frames, ``--per-read`` to a read.
- ``journal``: a journal alone, the entries given to ``log_entries`` ``--per-read`` at a time
  (at most ``--window`` batches waiting for their fsync).
- ``flush``: a write cache of ``--entries`` entries of one ledger written out to an entry log and
  a RocksDB locations index (``write_out``), the index then closed.

    valgrind --tool=cachegrind --cache-sim=no --trace-children=no \\
        --cachegrind-out-file=/dev/null python benchmarks/add_instructions.py storage --entries 20000
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from bench_common import append_in_slices


def run_client(args: argparse.Namespace) -> None:
    from vellum.client.blocking import BookKeeper
    from vellum.config import ClientConfig, build_config
    from vellum.spark.writer import heap_frozen, young_collections_spaced
    from vellum.testing.local_cluster import LocalCluster

    payloads = [os.urandom(args.size) for _ in range(args.entries)]

    async def append_all(handle: Any) -> None:
        await append_in_slices(handle, payloads, args.batch, args.window)

    base = Path(tempfile.mkdtemp(prefix="vellum-add-instructions-"))
    try:
        with LocalCluster(base / "cluster", bookies=3) as cluster:
            bk = BookKeeper(config=build_config(ClientConfig, {"metadataServiceUri": cluster.metadata_uri},
                                                source="add_instructions"))
            try:
                handle = bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
                with heap_frozen(), young_collections_spaced():
                    if not args.noop:
                        bk.run(append_all(handle.aio))
                handle.close()
            finally:
                bk.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)


class _InFlight:
    """At most ``limit`` operations waiting for their callback: ``issue(start)`` calls
    ``start(done)`` and returns once there is room again; ``drain()`` waits for every one."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._waiting = 0
        self._cond = threading.Condition()

    def _done(self, exc: BaseException | None) -> None:
        with self._cond:
            self._waiting -= 1
            self._cond.notify()

    def issue(self, start: Callable[[Callable[[BaseException | None], None]], object]) -> None:
        with self._cond:
            self._waiting += 1
        start(self._done)
        with self._cond:
            self._cond.wait_for(lambda: self._waiting <= self._limit)

    def drain(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._waiting == 0)


def _stored_entries(args: argparse.Namespace) -> list[bytes]:
    from vellum.format.entry import DigestManager, DigestType

    dm = DigestManager(1, DigestType.CRC32C, b"k")
    payload = os.urandom(args.size)
    return [dm.compute(e, e - 1, 0, payload) for e in range(args.entries)]


def _add_reads(args: argparse.Namespace) -> list[bytes]:
    """The stored entries as ADD frames, ``--per-read`` frames to a read of the socket."""
    from vellum.format.entry import master_key
    from vellum.proto import encode
    from vellum.proto.messages import AddRequest

    key = master_key(b"k")
    frames = [encode(AddRequest(key, e)) for e in _stored_entries(args)]
    return [b"".join(frames[i:i + args.per_read]) for i in range(0, args.entries, args.per_read)]


def run_storage(args: argparse.Namespace) -> None:
    from vellum.bookie.assembly import open_bookie
    from vellum.config import ServerConfig
    from vellum.proto import FrameDecoder

    decoder = FrameDecoder(5 << 20, side="server", batch_adds=True)
    batches = [batch for data in _add_reads(args) for batch in decoder.feed(data)]
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        config = ServerConfig(journal_directories=(tmp + "/j",), ledger_directories=(tmp + "/l",),
                              http_server_enabled=False)
        opened = open_bookie(config, bookie_id="bench:1")
        bookie: Any = opened.bookie
        try:
            if not args.noop:
                in_flight = _InFlight(args.window)
                for batch in batches:
                    in_flight.issue(functools.partial(bookie.add_batch, batch))
                in_flight.drain()
            bookie.checkpoint()
        finally:
            opened.close()


def run_decode(args: argparse.Namespace) -> None:
    from vellum.proto import FrameDecoder

    reads = _add_reads(args)
    decoder = FrameDecoder(5 << 20, side="server", batch_adds=True)
    if not args.noop:
        decoded = sum(len(b.entries) for data in reads for b in decoder.feed(data))
        assert decoded == args.entries, decoded


def run_journal(args: argparse.Namespace) -> None:
    from vellum.storage.journal import Journal

    entries = _stored_entries(args)
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        journal = Journal(Path(tmp) / "j")
        journal.start()
        try:
            if not args.noop:
                in_flight = _InFlight(args.window)
                for i in range(0, args.entries, args.per_read):
                    in_flight.issue(functools.partial(journal.log_entries, entries[i:i + args.per_read]))
                in_flight.drain()
        finally:
            journal.shutdown()


def run_flush(args: argparse.Namespace) -> None:
    from vellum.storage.entry_logger import EntryLogger
    from vellum.storage.index import EntryLocationIndex
    from vellum.storage.write_cache import WriteCaches, write_out

    entries = _stored_entries(args)
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        caches = WriteCaches(1 << 40)
        if not args.noop:
            for i in range(0, args.entries, args.per_read):
                chunk = entries[i:i + args.per_read]
                caches.active.put_new(1, list(range(i, i + len(chunk))), chunk, sum(map(len, chunk)))
        caches.swap()
        assert caches.flushing is not None
        index = EntryLocationIndex(Path(tmp) / "index")
        try:
            with EntryLogger(Path(tmp) / "ledgers", log_size_limit=1 << 30) as logger:
                if not args.noop:
                    write_out(caches.flushing, logger, index)
        finally:
            index.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("client", "storage", "decode", "journal", "flush"))
    ap.add_argument("--entries", type=int, default=20_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=250, help="client: append_batch_async slice")
    ap.add_argument("--window", type=int, default=None,
                    help="client: appends in flight at most (1000); storage: batches waiting for their fsync (8)")
    ap.add_argument("--per-read", type=int, default=64, help="storage, decode, journal, flush: entries per batch")
    ap.add_argument("--dir", default="data/bench", help="where the bookie's directories go")
    ap.add_argument("--noop", action="store_true", help="the same set-up, nothing appended or added")
    args = ap.parse_args()
    if args.window is None:
        args.window = 1000 if args.mode == "client" else 8
    {"client": run_client, "storage": run_storage, "decode": run_decode, "journal": run_journal,
     "flush": run_flush}[args.mode](args)


if __name__ == "__main__":
    main()
