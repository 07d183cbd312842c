"""Micro-benchmark of the wire codec: encode + decode of 1 KiB ADD requests and ADD responses.

Prints frames/s for each direction; no assertions (a number to watch, not a test).
Run: ``.venv/bin/python benchmarks/proto_codec.py [--frames N] [--batch B]``.
The decoder is fed ``B`` frames per ``feed`` call, as a socket read of a pipelined stream would.
"""

from __future__ import annotations

import argparse
import time

from vellum.errors import EOK
from vellum.format.entry import DigestManager, DigestType, master_key
from vellum.proto import FrameDecoder, Message, Side, encode
from vellum.proto.messages import DEFAULT_MAX_FRAME_SIZE, AddRequest, AddResponse


def bench(label: str, msgs: list[Message], side: Side, batch: int) -> None:
    # encode
    t0 = time.perf_counter()
    frames = [encode(m) for m in msgs]
    t1 = time.perf_counter()
    # decode, `batch` frames per feed
    chunks = [b"".join(frames[i : i + batch]) for i in range(0, len(frames), batch)]
    decoder = FrameDecoder(DEFAULT_MAX_FRAME_SIZE, side=side)
    t2 = time.perf_counter()
    count = 0
    for chunk in chunks:
        count += len(decoder.feed(chunk))
    t3 = time.perf_counter()
    assert count == len(msgs)
    n = len(msgs)
    enc, dec = n / (t1 - t0), n / (t3 - t2)
    both = n / ((t1 - t0) + (t3 - t2))
    print(f"{label:<28} encode {enc:>10,.0f}/s   decode {dec:>10,.0f}/s   encode+decode {both:>10,.0f}/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--frames", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=32, help="frames per decoder feed")
    args = parser.parse_args()

    dm = DigestManager(42, DigestType.CRC32C)
    key = master_key(b"")
    payload = b"x" * 1024
    t0 = time.perf_counter()
    entries = [dm.compute(i, i - 1, (i + 1) * 1024, payload) for i in range(args.frames)]
    t1 = time.perf_counter()
    print(f"{'DigestManager.compute 1KiB':<28} {args.frames / (t1 - t0):>10,.0f}/s (CRC32C)")
    bench("ADD request (1 KiB entry)", [AddRequest(key, e) for e in entries], "server", args.batch)
    bench("ADD response", [AddResponse(EOK, 42, i) for i in range(args.frames)], "client", args.batch)
    # Decoding a byte stream that arrives one frame per feed (no pipelining).
    bench("ADD request, 1 frame/feed", [AddRequest(key, e) for e in entries], "server", 1)


if __name__ == "__main__":
    main()
