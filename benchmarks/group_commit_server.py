"""The minimal group-commit server of docs/benchmarks.md: what Python plus this disk can do for durable
acknowledged appends, the bar a bookie is measured against.

It speaks just enough of BookKeeper's v2 protocol for an ADD client: length-prefixed frames in,
for each ADD (opcode 1) an AddResponse (rc 0, ledger id, entry id) out. Frames that arrive while
a flush runs form the next batch; a batch is appended to one file with one ``writev`` and one
``fdatasync`` (in a thread, so the loop keeps reading), and only then are its acks written, with
one ``writelines``. Nothing else: no index, no cache, no journal format, no checks.

    python benchmarks/group_commit_server.py --port 0 --file data/bench/gc.bin   # prints "READY <port>"
"""

from __future__ import annotations

import argparse
import asyncio
import os
import struct

import uvloop

_LEN = struct.Struct(">i")
_HEADER = struct.Struct(">i")
_IDS = struct.Struct(">qq")
_RESPONSE = struct.Struct(">iiiqq")  # frame length, header, rc, ledger, entry
_ADD_RESPONSE_HEADER = (2 << 24) | (1 << 16)
_KEY = 20


class GroupCommit(asyncio.Protocol):
    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buf = bytearray()
        self._batch: list[bytes] = []
        self._acks: list[bytes] = []
        self._flushing = False
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        pos = 0
        end = len(buf)
        while end - pos >= 4:
            (n,) = _LEN.unpack_from(buf, pos)
            if end - pos - 4 < n:
                break
            body = bytes(buf[pos + 4:pos + 4 + n])
            pos += 4 + n
            ledger, entry = _IDS.unpack_from(body, 4 + _KEY)
            self._batch.append(body)
            self._acks.append(_RESPONSE.pack(_RESPONSE.size - 4, _ADD_RESPONSE_HEADER, 0, ledger, entry))
        del buf[:pos]
        if self._batch and not self._flushing:
            self._flushing = True
            asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        while self._batch:
            batch, acks = self._batch, self._acks
            self._batch, self._acks = [], []
            await loop.run_in_executor(None, self._write_sync, batch)
            if self._transport is not None:
                self._transport.writelines(acks)
        self._flushing = False

    def _write_sync(self, batch: list[bytes]) -> None:
        os.writev(self._fd, batch)
        os.fdatasync(self._fd)


async def serve(port: int, path: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: GroupCommit(fd), "127.0.0.1", port)
    print(f"READY {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--file", required=True)
    args = ap.parse_args()
    uvloop.run(serve(args.port, args.file))


if __name__ == "__main__":
    main()
