"""The simulated network: connections between the real client and the real server request path.

Responsibility: carry the bytes one side's transport writes to the other side's protocol after
a delay drawn from the run's random generator, and apply the run's network faults:

- delay: every write is delivered after ``delay_min_s``..``delay_max_s`` (one direction of a
  connection is FIFO, as on TCP, unless reordering is on);
- drop: a write (whole frames: both the client and the server write complete frames) is lost;
- duplication: a write is delivered twice;
- reordering: a write may overtake earlier writes of the same direction;
- slow links: one direction between two nodes delivers many times slower for a while;
- partitions, one-way or both ways: writes from A to B are lost, and new connections between
  them fail, while the partition lasts;
- a crashed bookie resets its connections: its side vanishes at once, the client side sees
  ``connection_lost`` after a delay.

Writes are handed over in chunks of random sizes (``get_buffer`` / ``buffer_updated`` of the
receiving ``BufferedProtocol``), so the decoders see arbitrary chunking. Which simulated node
opened a connection is the context variable ``current_node`` (each client actor sets it).

What a side receives runs in one context per direction of a connection, copied when the
connection is made, as a selector loop runs every read of a socket through the one reader
handle it registered when the transport was made (and so in that handle's context); one copy
a connection rather than one a write is also a copy less per message.

Invariants: a protocol's ``connection_lost`` is called exactly once and nothing is delivered to
it afterwards; every random choice comes from the run's generator.
"""

from __future__ import annotations

import asyncio
import contextvars
import random
from collections.abc import Callable
from contextvars import copy_context
from dataclasses import dataclass
from typing import Any, Protocol

from vellum.sim.loop import SimLoop

#: the smallest step between two deliveries of one direction (keeps them in order)
_TICK = 1e-7

#: the simulated node (client name) the current task acts for
current_node: contextvars.ContextVar[str] = contextvars.ContextVar("vellum_sim_node", default="client")


@dataclass(frozen=True)
class NetFaults:
    """Network faults of a run (probabilities per write)."""

    delay_min_s: float = 0.0002
    delay_max_s: float = 0.002
    drop: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    #: probability that a write is slow (its delay times ``slow_factor``): a heavy tail
    slow: float = 0.0
    slow_factor: float = 10.0
    #: split deliveries into random chunks (exercises every decoder's chunking)
    chunking: bool = True


class Server(Protocol):
    """A simulated listener (a bookie node)."""

    name: str

    @property
    def up(self) -> bool: ...

    def accept(self) -> asyncio.BufferedProtocol:
        """A new server-side protocol for an accepted connection."""

    def attach(self, link: Link) -> None:
        """Track ``link`` so that a crash can reset it."""


class SimTransport(asyncio.Transport):
    """One side of a ``Link``: what a protocol writes through (it sends to the other side)."""

    def __init__(self, link: Link, side: int) -> None:
        super().__init__()
        self._link = link
        self._side = side
        self._dst = 1 - side
        #: (from, to): the direction this side sends, as partitions and slow links name it
        self._route = (link.names[side], link.names[1 - side])
        # bound once: one delivery timer per message, pushed as ``SimLoop.later`` pushes it
        self._net = link.net
        self._loop = loop = link.net.loop
        self._push = loop.push_timer
        self._next_seq = loop.next_seq
        self._deliver = link._deliver
        #: the context the other side's deliveries run in (see the module docstring)
        self._delivery_run = copy_context().run

    def write(self, data: Any) -> None:
        self.writelines((bytes(data),))

    def writelines(self, list_of_data: Any) -> None:
        """Send one write (the whole of ``list_of_data``, joined: the caller may reuse its
        buffers) to the other side, through the run's faults.

        Hot (one call per message; the body of what was ``Link.send``, one Python call less):
        the random draws are made in one fixed order, ``uniform`` is inlined as
        ``random.uniform`` computes it (``a + (b - a) * random()``), and the delivery timer is
        pushed as ``SimLoop.later`` would push it (a plain list), without the call, to run in the
        direction's delivery context."""
        link = self._link
        if link.closing[self._side]:
            return
        data = b"".join(list_of_data)
        if not data:
            return
        net = self._net
        blocked = net._blocked
        if blocked and self._route in blocked:
            net.count("partitioned")
            net.lossy[link.link_id] = link
            return
        random = net.random
        drop, duplicate, delay_min, spread, slow, slow_factor, reorder, _chunking = net.fault_params
        if drop and random() < drop:
            net.count("dropped")
            net.lossy[link.link_id] = link
            return
        if duplicate and random() < duplicate:
            net.count("duplicated")
            copies = 2
        else:
            copies = 1
        loop = self._loop
        if loop._closed:  # type: ignore[attr-defined]  # as call_at
            raise RuntimeError("Event loop is closed")
        now = loop._now
        dst = self._dst
        last_of = link._last
        while copies:
            copies -= 1
            delay = delay_min + spread * random()
            if slow and random() < slow:
                delay *= slow_factor
            if net.slow_links:
                delay *= net.slow_links.get(self._route, 1.0)
            when = now + delay
            if not (reorder and random() < reorder):
                # strictly after the previous delivery: timers due at the same instant are not
                # run in the order they were scheduled (asyncio's heap is not stable)
                last = last_of[dst] + _TICK
                if when < last:
                    when = last
                last_of[dst] = when
            else:
                net.count("reordered")
            deliver = self._deliver
            self._push([when, self._next_seq(), deliver, (deliver, dst, data), self._delivery_run, False, True, loop])

    def close(self) -> None:
        self._link.close(self._side)

    def abort(self) -> None:
        self._link.close(self._side)

    def is_closing(self) -> bool:
        return self._link.closing[self._side]

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "peername":
            return (self._link.names[1 - self._side], self._link.link_id)
        if name == "sockname":
            return (self._link.names[self._side], self._link.link_id)
        return default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_reading(self) -> bool:
        return True

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def can_write_eof(self) -> bool:
        return False


class Link:
    """A connection: side 0 is the client, side 1 the bookie. Each side's transport sends."""

    def __init__(self, net: SimNetwork, link_id: int, names: tuple[str, str],
                 protocols: tuple[asyncio.BufferedProtocol, asyncio.BufferedProtocol]) -> None:
        self.net = net
        self.link_id = link_id
        self.names = names
        self.protocols = protocols
        self.closing = [False, False]
        self.lost = [False, False]
        # the last delivery time per receiving side (FIFO per direction)
        self._last = [0.0, 0.0]
        #: each side's receiving half, bound once: (get_buffer, buffer_updated)
        self._receivers = tuple((p.get_buffer, p.buffer_updated) for p in protocols)
        self.transports = (SimTransport(self, 0), SimTransport(self, 1))

    def _deliver(self, dst: int, data: bytes) -> None:
        # Hot (one call per delivery): a chunk's size is drawn as ``randint(1, want)`` would
        # draw it (``1 + _randbelow(want)``, what ``randrange`` computes), and a write taken
        # whole (the usual case) is copied into the receive buffer as given, without a view.
        lost = self.lost
        if lost[dst]:
            return
        get_buffer, buffer_updated = self._receivers[dst]
        net = self.net
        chunking = net.fault_params[7]
        size = len(data)
        want = size
        if want > 1 and chunking and net.random() < 0.2:
            want = 1 + net.randbelow(want)
        buf = get_buffer(want)
        if want == size and type(buf) is memoryview and len(buf) >= size:
            # Taken whole into a view of bytes (the decoders' buffers are): copied as given. A
            # view of another format or shape refuses the copy before writing anything and is
            # cast below, as it would have been (its format is not read here: each read of it
            # builds a string).
            try:
                buf[:size] = data
            except (ValueError, TypeError, NotImplementedError):
                pass
            else:
                buffer_updated(size)
                return
        if type(buf) is not memoryview or buf.format != "B" or buf.ndim != 1:
            buf = memoryview(buf).cast("B")
        view = memoryview(data)
        pos = 0
        while True:
            n = len(buf)
            if n > want:
                n = want
            if n <= 0:
                raise RuntimeError("a protocol offered an empty receive buffer")
            buf[:n] = view[pos:pos + n]
            pos += n
            buffer_updated(n)
            if pos >= size or lost[dst]:
                return
            want = size - pos
            if want > 1 and chunking and net.random() < 0.2:
                want = 1 + net.randbelow(want)
            buf = get_buffer(want)
            if type(buf) is not memoryview or buf.format != "B" or buf.ndim != 1:
                buf = memoryview(buf).cast("B")

    def close(self, side: int) -> None:
        """Orderly close by ``side``: what it wrote still arrives, then the peer sees EOF."""
        if self.closing[side]:
            return
        self.closing[side] = True
        loop = self.net.loop
        loop.call_soon(self._lose, side, None)
        dst = 1 - side
        when = max(loop.time() + self.net.faults.delay_max_s, self._last[dst] + _TICK)
        self._last[dst] = when
        loop.call_at(when, self._lose, dst, None)

    def reset(self, crashed_side: int) -> None:
        """``crashed_side``'s process died: nothing more from it; the peer learns after a delay."""
        self.closing = [True, True]
        if not self.lost[crashed_side]:  # its protocols die with the process
            self.lost[crashed_side] = True
            self.protocols[crashed_side].connection_lost(ConnectionResetError("the process died"))
        loop = self.net.loop
        loop.call_at(loop.time() + self.net.rng.uniform(self.net.faults.delay_min_s, self.net.faults.delay_max_s),
                     self._lose, 1 - crashed_side, ConnectionResetError("connection reset by peer"))

    def _lose(self, side: int, exc: Exception | None) -> None:
        if self.lost[side]:
            return
        self.lost[side] = True
        self.closing[side] = True
        self.protocols[side].connection_lost(exc)
        if not self.closing[1 - side]:
            self.close(1 - side)


class SimNetwork:
    """The simulated network of one run (see the module docstring)."""

    def __init__(self, loop: SimLoop, rng: random.Random, faults: NetFaults) -> None:
        self.loop = loop
        self.rng = rng
        #: ``rng.randint(1, n)`` is ``1 + randbelow(n)`` (what ``Random.randrange`` computes)
        self.randbelow: Callable[[int], int] = rng._randbelow  # type: ignore[attr-defined]
        self.random: Callable[[], float] = rng.random
        self.faults = faults  # and fault_params
        self.servers: dict[str, Server] = {}
        #: blocked directions (from, to)
        self._blocked: set[tuple[str, str]] = set()
        #: slowed directions (from, to) -> delay factor (a congested link)
        self.slow_links: dict[tuple[str, str], float] = {}
        self._next_link = 0
        self.counts: dict[str, int] = {}
        #: connections that lost a write (dropped, or to a partition), by link id
        self.lossy: dict[int, Link] = {}

    @property
    def faults(self) -> NetFaults:
        return self._faults

    @faults.setter
    def faults(self, faults: NetFaults) -> None:
        self._faults = faults
        #: what a write reads of the faults, in one tuple: drop, duplicate, delay_min_s, the delay's
        #: spread (delay_max_s - delay_min_s), slow, slow_factor, reorder, chunking
        self.fault_params = (faults.drop, faults.duplicate, faults.delay_min_s, faults.delay_max_s - faults.delay_min_s,
                             faults.slow, faults.slow_factor, faults.reorder, faults.chunking)

    def count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    # -------------------------------------------------------------------------- partitions
    def blocked(self, src: str, dst: str) -> bool:
        return bool(self._blocked) and (src, dst) in self._blocked

    def partition(self, a: str, b: str, *, one_way: bool = False) -> None:
        """Lose everything from ``a`` to ``b`` (and from ``b`` to ``a`` unless ``one_way``)."""
        self._blocked.add((a, b))
        if not one_way:
            self._blocked.add((b, a))

    def heal(self) -> None:
        self._blocked.clear()
        self.slow_links.clear()

    def reset_lossy(self) -> int:
        """Reset every live connection that lost a write: TCP would have delivered it late or
        reset the connection; a lost frame stands for that reset, which happens here at the
        latest (a v2 request never answered keeps its key busy on its connection). Returns how
        many were reset."""
        reset = 0
        for _lid, link in sorted(self.lossy.items()):
            if not any(link.lost):
                link.reset(1)
                reset += 1
        self.lossy.clear()
        return reset

    # ------------------------------------------------------------------------- connecting
    def add_server(self, server: Server) -> None:
        self.servers[server.name] = server

    async def connect(self, factory: Callable[[], asyncio.BaseProtocol], host: str,
                      port: int) -> tuple[asyncio.BaseTransport, asyncio.BaseProtocol]:
        """The loop's ``create_connection``: a refused connect to a bookie that is down, a
        connect that never completes across a partition (the caller's timeout ends it)."""
        name = f"{host}:{port}"
        client = current_node.get()
        await asyncio.sleep(self.rng.uniform(self.faults.delay_min_s, self.faults.delay_max_s) * 2)
        server = self.servers.get(name)
        if server is None or not server.up:
            raise ConnectionRefusedError(f"connection to {name} refused (simulated: the bookie is down)")
        if self.blocked(client, name) or self.blocked(name, client):
            await asyncio.sleep(3600.0)  # SYNs lost: the caller's connect timeout fires first
            raise TimeoutError(f"connect to {name} timed out (simulated partition)")
        client_proto = factory()
        if not isinstance(client_proto, asyncio.BufferedProtocol):
            raise TypeError("the simulated network carries buffered protocols only")
        server_proto = server.accept()
        self._next_link += 1
        link = Link(self, self._next_link, (client, name), (client_proto, server_proto))
        server.attach(link)
        server_proto.connection_made(link.transports[1])
        client_proto.connection_made(link.transports[0])
        return link.transports[0], client_proto
