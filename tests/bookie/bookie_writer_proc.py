"""Child process for the crash test: runs a real bookie on the given dirs and adds entries,
printing ``ACK <ledger> <entry>`` only after the add's durability callback and
``FENCED <ledger>`` after a fence is durable. The parent kills it with SIGKILL at random."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from vellum.bookie.assembly import open_bookie
from vellum.config import ServerConfig
from vellum.format.entry import DigestManager, DigestType, master_key


def payload_for(ledger_id: int, entry_id: int) -> bytes:
    seed = f"{ledger_id}:{entry_id}:".encode()
    return (seed * (1 + (entry_id * 37 + ledger_id) % 300))[: 10 + (entry_id * 131 + ledger_id) % 3000]


def main() -> None:
    base = Path(sys.argv[1])
    ledgers = int(sys.argv[2])
    start_ledger = int(sys.argv[3])
    config = ServerConfig(
        journal_directories=(str(base / "journal"),),
        ledger_directories=(str(base / "ledgers0"), str(base / "ledgers1")),
        flush_interval_ms=50,  # checkpoint often: marks move and journals roll while we write
        journal_max_size_mb=1,
        journal_max_backups=1,
        db_storage_write_cache_max_size_mb=1,
        log_size_limit_bytes=256 * 1024,
        http_server_enabled=False,
    )
    opened = open_bookie(config, bookie_id="127.0.0.1:3181")
    bookie = opened.bookie
    out_lock = threading.Lock()

    def say(line: str) -> None:
        with out_lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    say("READY")
    key = master_key(b"pw")
    inflight = threading.Semaphore(64)
    for round_no in range(10_000):
        for ledger_id in range(start_ledger, start_ledger + ledgers):
            dm = DigestManager(ledger_id, DigestType.CRC32C, b"pw")
            entry_id = round_no
            data = dm.compute(entry_id, entry_id - 1, 0, payload_for(ledger_id, entry_id))
            inflight.acquire()

            def done(exc: BaseException | None, lid: int = ledger_id, eid: int = entry_id) -> None:
                inflight.release()
                if exc is None:
                    say(f"ACK {lid} {eid}")

            bookie.add_entry(data, key, done)
        if round_no == 50:
            fenced = start_ledger

            def fenced_cb(exc: BaseException | None, lid: int = fenced) -> None:
                if exc is None:
                    say(f"FENCED {lid}")

            bookie.fence_ledger(fenced, key, fenced_cb)
            ledgers_left = [lid for lid in range(start_ledger + 1, start_ledger + ledgers)]
            start_ledger, ledgers = ledgers_left[0], len(ledgers_left)


if __name__ == "__main__":
    main()
