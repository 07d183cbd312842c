"""Child process for test_journal_crash.py: append entries to a Journal, print each acked id.

Usage: journal_writer_proc.py JOURNAL_DIR FIRST_ID REPLAY(0|1) [DIRECT_IO(0|1)]
Each line on stdout is an entry id whose callback reported success (after its fsync). The
parent SIGKILLs this process at a random moment.
"""

from __future__ import annotations

import struct
import sys
import threading
from pathlib import Path

from vellum.format.lastmark import ZERO_MARK
from vellum.storage.journal import Journal


def payload(entry_id: int) -> bytes:
    size = 50 + entry_id % 2000
    body = bytes((entry_id * 7 + i) % 256 for i in range(size))
    return struct.pack(">qqqq", 1, entry_id, entry_id - 1, size) + body


def main() -> None:
    journal_dir, first, replay = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
    direct = len(sys.argv) > 4 and sys.argv[4] == "1"
    journal = Journal(
        journal_dir, max_size_mb=1, prealloc_size_mb=1, max_group_wait_ms=1, flush_when_queue_empty=True,
        direct_io=direct,
    )
    if replay:
        journal.replay(ZERO_MARK, lambda record: None)
    journal.start()
    if direct and not journal.direct_io:
        raise SystemExit(f"{journal_dir}: the filesystem refused O_DIRECT")
    in_flight = threading.Semaphore(64)
    out = sys.stdout
    lock = threading.Lock()

    def acked(entry_id: int):  # type: ignore[no-untyped-def]
        def done(exc: BaseException | None) -> None:
            if exc is None:
                with lock:
                    out.write(f"{entry_id}\n")
                    out.flush()
            in_flight.release()

        return done

    entry_id = first
    while True:
        in_flight.acquire()
        journal.log_entry(1, entry_id, payload(entry_id), acked(entry_id))
        entry_id += 1


if __name__ == "__main__":
    main()
