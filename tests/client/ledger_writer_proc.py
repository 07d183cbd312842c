"""Child process: creates a ledger (E=3, W=2, A=2), prints ``LEDGER <id>``, then appends with 64
in flight and prints ``ACK <entry id>`` for every acknowledged append until it is killed."""

from __future__ import annotations

import sys
import threading

from vellum.client.blocking import BookKeeper


def payload(i: int) -> bytes:
    return (b"entry-%d;" % i) * (1 + i % 17)


def main() -> None:
    out = threading.Lock()

    def say(line: str) -> None:
        with out:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    with BookKeeper(sys.argv[1]) as bk:
        lh = bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2, password=b"pw")
        say(f"LEDGER {lh.ledger_id}")
        window = threading.Semaphore(64)
        for i in range(1_000_000):
            window.acquire()
            fut = lh.append_async(payload(i))

            def acked(f, i: int = i) -> None:  # type: ignore[no-untyped-def]
                window.release()
                if f.exception() is None:
                    say(f"ACK {f.result()}")

            fut.add_done_callback(acked)


if __name__ == "__main__":
    main()
