"""A userspace TCP proxy that behaves like a slow, lossy link: delay, jitter, dropped connections.

Responsibility: accept TCP connections on each route's listen address and relay the bytes to the
route's target, each chunk held back ``delay_ms`` plus a uniform jitter of up to
``jitter_ms`` either way (in each direction, so a request/answer pair pays the link twice), and
reset connections at random (each connection lives an exponentially distributed time with mean
``drop_mean_s``, then both of its sockets are reset, as when a middlebox or a flaky link gives
up). For kernels without ``tc netem``.

Invariants:
- bytes are never reordered, duplicated or altered within a connection: a chunk is released no
  earlier than the chunk before it (jitter only stretches the gaps);
- a dropped connection is reset on both sides (SO_LINGER 0, so the peers see RST, not a clean
  end), and one line is logged per drop;
- one ``random.Random(seed)`` decides everything, so a run can be replayed.

Run: ``python -m vellum.testing.delay_proxy --route LISTEN_HOST:PORT=TARGET_HOST:PORT ...
[--delay-ms 2 --jitter-ms 1 --drop-mean-s 20 --seed=1]``; it prints ``PROXY READY`` once every
route listens, and runs until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import signal
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("vellum.testing.delay_proxy")


@dataclass(frozen=True)
class Route:
    listen_host: str
    listen_port: int
    target_host: str
    target_port: int

    @classmethod
    def parse(cls, text: str) -> Route:
        """``LISTEN_HOST:PORT=TARGET_HOST:PORT``."""
        try:
            listen, target = text.split("=", 1)
            lh, lp = listen.rsplit(":", 1)
            th, tp = target.rsplit(":", 1)
            return cls(lh, int(lp), th, int(tp))
        except ValueError:
            raise ValueError(f"--route {text!r}: expected LISTEN_HOST:PORT=TARGET_HOST:PORT") from None


@dataclass(frozen=True)
class LinkModel:
    delay_ms: float = 2.0
    jitter_ms: float = 1.0
    drop_mean_s: float = 0.0  #: mean lifetime of a connection before it is reset; 0: never

    def __post_init__(self) -> None:
        if self.delay_ms < 0 or self.jitter_ms < 0 or self.drop_mean_s < 0:
            raise ValueError(f"delay, jitter and drop mean must not be negative: {self}")
        if self.jitter_ms > self.delay_ms:
            raise ValueError(f"jitter_ms={self.jitter_ms} exceeds delay_ms={self.delay_ms}")


class DelayProxy:
    """The proxy of some routes on the running event loop."""

    def __init__(self, routes: list[Route], model: LinkModel, seed: int = 0) -> None:
        self.routes = routes
        self.model = model
        self.rng = random.Random(seed)
        self.drops = 0
        self._servers: list[asyncio.Server] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        for route in self.routes:
            server = await asyncio.start_server(self._acceptor(route), route.listen_host, route.listen_port,
                                                reuse_address=True)
            self._servers.append(server)

    def _acceptor(self, route: Route) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], None]:
        def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.get_running_loop().create_task(self._connection(route, reader, writer))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return accept

    async def stop(self) -> None:
        for server in self._servers:
            server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _delay_s(self) -> float:
        m = self.model
        return max(0.0, m.delay_ms + self.rng.uniform(-m.jitter_ms, m.jitter_ms)) / 1000.0

    async def _connection(self, route: Route, c_reader: asyncio.StreamReader,
                          c_writer: asyncio.StreamWriter) -> None:
        peer = c_writer.get_extra_info("peername")
        try:
            t_reader, t_writer = await asyncio.wait_for(
                asyncio.open_connection(route.target_host, route.target_port), 10)
        except (TimeoutError, OSError) as e:
            log.info("%s -> %s:%d: target refused (%s); closing", peer, route.target_host, route.target_port, e)
            _reset(c_writer)
            return
        pumps = [asyncio.ensure_future(self._pump(c_reader, t_writer)),
                 asyncio.ensure_future(self._pump(t_reader, c_writer))]
        lifetime = self.rng.expovariate(1.0 / self.model.drop_mean_s) if self.model.drop_mean_s > 0 else None
        loop = asyncio.get_running_loop()
        deadline = None if lifetime is None else loop.time() + lifetime
        pending: set[asyncio.Future[bool]] = set(pumps)
        try:
            while pending:
                timeout = None if deadline is None else max(0.0, deadline - loop.time())
                done, pending = await asyncio.wait(pending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    self.drops += 1
                    log.info("dropping connection %s -> %s:%d after %.1fs (drop %d)", peer, route.target_host,
                             route.target_port, lifetime or 0.0, self.drops)
                    break
                if not all(t.result() for t in done):
                    break  # one side failed: the other side learns it as a reset
        finally:
            for p in pumps:
                p.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            _reset(c_writer)
            _reset(t_writer)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Relay ``reader`` to ``writer``, each chunk after the link's delay, in order; True at a
        clean end of stream, False when either side failed."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                at, data = await queue.get()
                wait = at - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()

        deliverer = asyncio.ensure_future(deliver())
        last = 0.0
        try:
            while True:
                data = await reader.read(65536)
                last = max(last, loop.time() + self._delay_s())  # never before the chunk before it
                queue.put_nowait((last, data))
                if not data:
                    break
            await deliverer
            return True
        except (OSError, ConnectionError):
            return False
        finally:
            deliverer.cancel()
            await asyncio.gather(deliverer, return_exceptions=True)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST (SO_LINGER on, timeout 0)."""
    sock = writer.get_extra_info("socket")
    try:
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    writer.transport.abort()


async def _main(args: argparse.Namespace) -> None:
    proxy = DelayProxy([Route.parse(r) for r in args.route],
                       LinkModel(args.delay_ms, args.jitter_ms, args.drop_mean_s), seed=args.seed)
    await proxy.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print("PROXY READY " + " ".join(args.route), flush=True)
    await stop.wait()
    await proxy.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m vellum.testing.delay_proxy", description=__doc__.split("\n")[0])
    parser.add_argument("--route", action="append", required=True, help="LISTEN_HOST:PORT=TARGET_HOST:PORT")
    parser.add_argument("--delay-ms", type=float, default=2.0)
    parser.add_argument("--jitter-ms", type=float, default=1.0)
    parser.add_argument("--drop-mean-s", type=float, default=0.0, help="mean connection lifetime; 0: no drops")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(_main(args))


if __name__ == "__main__":
    main()
