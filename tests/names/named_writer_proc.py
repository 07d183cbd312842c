"""A named-ledger writer for crash tests: APPEND to NAME, print each acknowledged global id.

Usage: python named_writer_proc.py URI NAME COUNT. Prints ``READY <epoch>`` once the name is
acquired, then ``ACK <id>`` per acknowledged entry (flushed at once), pipelining up to 16 adds.
The parent kills it with SIGKILL mid-stream: everything it printed must survive.
"""

from __future__ import annotations

import asyncio
import sys

from vellum.client.bookkeeper import BookKeeper
from vellum.client.named import NamedLedgers, OpenMode


def payload(entry_id: int) -> bytes:
    return f"entry-{entry_id}".encode() * 8


async def main(uri: str, name: str, count: int) -> None:
    async with BookKeeper(uri) as bk:
        h = await NamedLedgers(bk).open(name, OpenMode.APPEND, ensemble_size=3, write_quorum_size=2,
                                        ack_quorum_size=2)
        print(f"READY {h.writer_epoch} {h.last_add_confirmed}", flush=True)
        next_id = h.last_add_confirmed + 1
        window: list[asyncio.Future[int]] = []
        for i in range(count):
            window.append(h.append_async(payload(next_id + i)))
            if len(window) >= 16:
                got = await window.pop(0)
                print(f"ACK {got}", flush=True)
        for f in window:
            print(f"ACK {await f}", flush=True)
        await asyncio.sleep(3600)  # stay alive until killed


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
