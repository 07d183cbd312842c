"""Micro-benchmark of the wire codec: encode + decode of 1 KiB ADD requests and ADD responses.

Prints frames/s for each direction; no assertions (a number to watch, not a test).
Run: ``.venv/bin/python benchmarks/proto_codec.py [--frames N] [--batch B]``.
The decoder is fed ``B`` frames per ``feed`` call, as a socket read of a pipelined stream would.

``--big`` instead decodes big BATCH_READ and READ_STRIDED answers (about 2 MiB: 2,000 entries
of 1 KiB, or 16 packed entries of 127 KiB) read 64 KiB at a time through ``get_buffer`` /
``buffer_updated`` (what the client's transport does), with the big frame's buffer grown as its
bytes arrive (the default, what every decoder did before ``allocate_announced``) and made once
at the announced size (``allocate_announced``), alternating A B B A in one process; prints ns
per KiB of answer for each.
"""

from __future__ import annotations

import argparse
import time

from vellum.errors import EOK
from vellum.format.entry import DigestManager, DigestType, master_key
from vellum.proto import FrameDecoder, Message, Side, encode
from vellum.proto.messages import (
    DEFAULT_MAX_FRAME_SIZE,
    AddRequest,
    AddResponse,
    BatchReadResponse,
    StridedReadResponse,
)

#: the most a transport reads at once in the ``--big`` case
READ_SIZE = 64 * 1024


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


def read_big(stream: bytes, frames: int, allocate_announced: bool) -> float:
    """Seconds to decode ``stream`` (``frames`` big answers) read ``READ_SIZE`` bytes at a time."""
    decoder = FrameDecoder(DEFAULT_MAX_FRAME_SIZE, side="client", allocate_announced=allocate_announced)
    src = memoryview(stream)
    count = pos = 0
    t0 = time.perf_counter()
    while pos < len(src):
        buf = decoder.get_buffer(READ_SIZE)
        n = min(len(buf), READ_SIZE, len(src) - pos)
        buf[:n] = src[pos : pos + n]  # recv_into
        buf.release()
        count += len(decoder.buffer_updated(n))  # the messages are dropped: their buffers are freed
        pos += n
    elapsed = time.perf_counter() - t0
    assert count == frames
    return elapsed


def bench_big(repeat: int) -> None:
    dm = DigestManager(42, DigestType.CRC32C)
    row = b"r" * 1024
    batch = BatchReadResponse(EOK, 42, 0, 7, [dm.compute(i, i - 1, 0, row) for i in range(2000)])
    packed = StridedReadResponse(7, EOK, 42, 0, [dm.compute(i, i - 1, 0, row * 127) for i in range(16)])
    for label, msg in (("BATCH_READ 2000 x 1 KiB", batch), ("READ_STRIDED 16 x 127 KiB", packed)):
        frames = 8
        stream = encode(msg) * frames
        kib = len(stream) / 1024
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(repeat):
            for mode in (False, True, True, False):  # A B B A
                times[mode].append(read_big(stream, frames, mode))
        grown, once = (sorted(t)[len(t) // 2] / kib * 1e9 for t in (times[False], times[True]))
        print(f"{label:<28} grown as bytes arrive {grown:>8,.1f} ns/KiB   "
              f"allocated at the announced size {once:>8,.1f} ns/KiB   ({len(stream) // frames:,} B a frame, "
              f"median of {2 * repeat})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--frames", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=32, help="frames per decoder feed")
    parser.add_argument("--big", action="store_true", help="big answers read 64 KiB at a time (see above)")
    parser.add_argument("--repeat", type=int, default=10, help="A B B A rounds of --big")
    args = parser.parse_args()
    if args.big:
        bench_big(args.repeat)
        return

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
