"""Hosts on a private LAN made of Linux network namespaces, for many-host tests.

Responsibility: create a switch (a namespace holding one Linux bridge) and hosts (one namespace
each, with ``lo`` up and ``eth0``, a veth whose peer is a port of the bridge) holding the
addresses the test names; run processes and Python calls inside a host; cut a host off the LAN
(its ``eth0`` down) and plug it back; kill every process of a host; remove it all.

Invariants:
- nothing is added to the caller's own namespace: the bridge lives in the switch namespace, so
  the LAN's addresses (e.g. 10.77.0.0/24) exist only inside namespaces this module made, and
  nothing the hosts send can leave them;
- namespace names carry the creating process id and a counter, so parallel runs never collide;
- ``close()`` kills every process still in a host (by the pids ``ip netns pids`` lists, which are
  only processes started there) and deletes every namespace, also after a failure half way;
- every command has a timeout.

``Host.call(fn)`` runs ``fn`` in a short-lived thread that joined the host's network namespace
(``setns(2)`` changes the calling thread only); sockets made there, and threads started from
there (kazoo's, an event loop's), stay in that namespace.

Needs root (``CAP_SYS_ADMIN``); ``unavailable_reason()`` says why a kernel or user cannot.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO, Any, TypeVar

T = TypeVar("T")

_CLONE_NEWNET = 0x40000000
_NETNS_DIR = "/var/run/netns"
_counter = itertools.count()


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=30)
    except subprocess.CalledProcessError as e:
        raise RuntimeError(f"ip {' '.join(args)} failed ({e.returncode}): {e.stderr.strip()}") from None


def unavailable_reason() -> str | None:
    """Why namespaces, veths and a bridge cannot be made here (None: they can). Makes and
    removes a throwaway namespace to find out."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    name = f"vellum-probe{os.getpid()}-{next(_counter)}"
    try:
        _ip("netns", "add", name)
    except (OSError, RuntimeError) as e:
        return f"the kernel refused a network namespace: {e}"
    try:
        _ip("-n", name, "link", "add", "br0", "type", "bridge")
        _ip("-n", name, "link", "add", "a0", "type", "veth", "peer", "name", "a1")
        _ip("-n", name, "link", "set", "a1", "master", "br0")
    except RuntimeError as e:
        return f"the kernel refused a bridge or a veth pair in a namespace: {e}"
    finally:
        _ip("netns", "del", name, check=False)
    return None


class Host:
    """One host: namespace ``ns`` with ``eth0`` holding ``address`` (/``prefix_len``)."""

    def __init__(self, lan: Lan, name: str, ns: str, address: str) -> None:
        self.lan = lan
        self.name = name
        self.ns = ns
        self.address = address

    def argv(self, command: Sequence[str]) -> list[str]:
        """``command`` as run inside this host."""
        return ["ip", "netns", "exec", self.ns, *command]

    def popen(self, command: Sequence[str], *, log: IO[bytes], env: dict[str, str] | None = None,
              ) -> subprocess.Popen[bytes]:
        """Start ``command`` in this host in a session of its own, output to ``log``."""
        return subprocess.Popen(self.argv(command), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env)

    def run(self, command: Sequence[str], *, timeout_s: float, env: dict[str, str] | None = None,
            ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(command), capture_output=True, text=True, timeout=timeout_s, env=env)

    def call(self, fn: Callable[..., T], *args: Any, timeout_s: float = 120.0) -> T:
        """``fn(*args)`` in a thread inside this host's network namespace; its result or its
        exception."""
        box: dict[str, Any] = {}

        def body() -> None:
            try:
                fd = os.open(f"{_NETNS_DIR}/{self.ns}", os.O_RDONLY)
                try:
                    libc = ctypes.CDLL(None, use_errno=True)
                    if libc.setns(fd, _CLONE_NEWNET) != 0:
                        err = ctypes.get_errno()
                        raise OSError(err, f"setns({self.ns}): {os.strerror(err)}")
                finally:
                    os.close(fd)
                box["result"] = fn(*args)
            except BaseException as e:  # handed to the caller below
                box["error"] = e

        t = threading.Thread(target=body, name=f"netns-{self.name}", daemon=True)
        t.start()
        t.join(timeout_s)
        if t.is_alive():
            raise TimeoutError(f"{getattr(fn, '__name__', fn)} in host {self.name} did not finish in {timeout_s}s")
        if "error" in box:
            raise box["error"]
        return box["result"]  # type: ignore[no-any-return]

    def pids(self) -> list[int]:
        """Every process in this host's namespace."""
        out = _ip("netns", "pids", self.ns, check=False).stdout
        return [int(p) for p in out.split() if p.isdigit()]

    def kill_all(self, timeout_s: float = 20.0) -> list[int]:
        """SIGKILL every process of this host (a host dying); returns their pids."""
        deadline = time.monotonic() + timeout_s
        killed: list[int] = []
        while time.monotonic() < deadline:
            pids = self.pids()
            if not pids:
                return killed
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        raise TimeoutError(f"processes of host {self.name} still alive after {timeout_s}s: {self.pids()}")

    def unplug(self) -> None:
        """A network partition: this host's ``eth0`` down (its processes keep running)."""
        _ip("-n", self.ns, "link", "set", "eth0", "down")

    def plug(self) -> None:
        _ip("-n", self.ns, "link", "set", "eth0", "up")

    def add_local_address(self, address: str) -> None:
        """One more address of this host only (on ``lo``), e.g. where a process behind a local
        proxy binds."""
        _ip("-n", self.ns, "addr", "add", f"{address}/32", "dev", "lo")


class Lan:
    """A switch and the hosts plugged into it; use as a context manager."""

    def __init__(self, prefix_len: int = 24) -> None:
        self.tag = f"vl{os.getpid()}x{next(_counter)}"
        self.prefix_len = prefix_len
        self.switch_ns = f"{self.tag}-sw"
        self.hosts: dict[str, Host] = {}
        self._namespaces: list[str] = []

    def __enter__(self) -> Lan:
        try:
            self._add_ns(self.switch_ns)
            _ip("-n", self.switch_ns, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch_ns, "link", "set", "br0", "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _add_ns(self, ns: str) -> None:
        _ip("netns", "add", ns)
        self._namespaces.append(ns)
        _ip("-n", ns, "link", "set", "lo", "up")

    def add_host(self, name: str, address: str) -> Host:
        """A new host ``name`` (short: it names the bridge port) with ``address`` on ``eth0``."""
        ns = f"{self.tag}-{name}"
        port = f"p{len(self.hosts)}"
        self._add_ns(ns)
        _ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", port)
        _ip("-n", ns, "link", "set", port, "netns", self.switch_ns)
        _ip("-n", self.switch_ns, "link", "set", port, "master", "br0")
        _ip("-n", self.switch_ns, "link", "set", port, "up")
        _ip("-n", ns, "addr", "add", f"{address}/{self.prefix_len}", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        host = Host(self, name, ns, address)
        self.hosts[name] = host
        return host

    def close(self) -> None:
        """Kill what still runs in the hosts, delete every namespace (idempotent)."""
        for host in self.hosts.values():
            try:
                host.kill_all()
            except (TimeoutError, RuntimeError):
                pass  # deleting the namespace below still unplugs it
        for ns in reversed(self._namespaces):
            _ip("netns", "del", ns, check=False)
        self._namespaces.clear()
        self.hosts.clear()
