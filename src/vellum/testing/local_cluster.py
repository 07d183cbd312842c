"""A local cluster of real bookie processes on loopback, for tests and examples.

Each bookie is a ``vellum bookie --conf ...`` process with free ports (bookie, admin HTTP and
metrics port: ``metrics_url(i)``) and its own dirs under a
base directory; the metadata store is the embedded SQLite store (default) or any URI (e.g. the
real ZooKeeper from ``vellum.testing.zookeeper``). Faults: ``kill(i)`` (SIGKILL),
``pause(i)``/``resume(i)`` (SIGSTOP/SIGCONT), ``restart(i)`` (same ports and dirs, so the same
bookie id and cookie), and ``fill_ledger_dir(i)`` for bookies started with a small tmpfs ledger
dir (needs root to mount; ``tmpfs_available()`` tells).

Shipped with the package, never imported by the library itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vellum.client.metadata_security import open_configured_store
from vellum.config import ClientConfig, build_config
from vellum.standalone import BookieProcessSpec, bookie_command, format_if_needed, write_bookie_conf


def free_port(avoid: set[int] | None = None) -> int:
    """A loopback port nobody listens on now, not in ``avoid``. The OS may hand a port it just
    released out again, so a caller allocating several passes the ones it already has."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if avoid is None or port not in avoid:
            if avoid is not None:
                avoid.add(port)
            return port
    raise RuntimeError("no free loopback port outside the ones already taken")


def tmpfs_available() -> bool:
    """Can this process mount a tmpfs (root in a sandbox that allows it)?"""
    if os.geteuid() != 0:
        return False
    probe = Path(f"/tmp/vellum-tmpfs-probe-{os.getpid()}")
    probe.mkdir(exist_ok=True)
    try:
        ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(probe)],
                            capture_output=True).returncode == 0
        if ok:
            subprocess.run(["umount", str(probe)], capture_output=True)
        return ok
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()


@dataclass
class _Bookie:
    spec: BookieProcessSpec
    proc: subprocess.Popen[bytes] | None = None
    log: Any = None
    tmpfs: Path | None = None
    extra: dict[str, str] = field(default_factory=dict)


class LocalCluster:
    """N bookie processes sharing one metadata store. Use as a context manager."""

    def __init__(
        self,
        base_dir: Path,
        bookies: int = 3,
        *,
        metadata_uri: str | None = None,
        bookie_conf: dict[str, str] | None = None,
        small_ledger_dir_mb: int | None = None,
    ) -> None:
        self.base_dir = Path(base_dir).resolve()
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.metadata_uri = metadata_uri or f"sqlite:///{self.base_dir / 'metadata.db'}"
        # The cluster's own embedded store gets a 4 s session (10 s by default): a bookie killed
        # and restarted waits for its old session's registration to expire before it serves
        # again (as a ZooKeeper bookie waits for its old ephemeral node), and tests do that often.
        own_store = {"zkTimeout": "4000"} if metadata_uri is None else {}
        self._conf = {"journalMaxGroupWaitMSec": "1", "flushInterval": "1000", "diskCheckInterval": "200",
                      **own_store, **(bookie_conf or {})}
        self._small_mb = small_ledger_dir_mb
        #: how this process opens the metadata store: the bookies' ZooKeeper identity and TLS
        #: (``zkEnableSecurity``, ``zkDigestAuthFile``, ``zkTls*`` of ``bookie_conf``)
        self.metadata_config = build_config(
            ClientConfig, {k: v for k, v in self._conf.items() if k.startswith(("zkEnableSecurity", "zkDigest", "zkTls"))},
            source="LocalCluster bookie_conf")
        self._bookies: list[_Bookie] = []
        taken: set[int] = set()  # two bookies on one port would share a bookie id (and cookie)
        for i in range(bookies):
            base = self.base_dir / f"bookie-{i}"
            spec = BookieProcessSpec(i, free_port(taken), free_port(taken), base, base / "bk_server.conf",
                                     dict(self._conf), metrics_port=free_port(taken))
            self._bookies.append(_Bookie(spec))

    # ------------------------------------------------------------------------------ lifecycle
    def __enter__(self) -> LocalCluster:
        try:
            self.start()
        except BaseException:
            self.stop()  # the bookies that did start must not outlive a failed start
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout_s: float = 60.0) -> None:
        format_if_needed(self.metadata_uri, self.metadata_config)
        for b in self._bookies:
            if self._small_mb:
                self._mount_small_ledger_dir(b)
            write_bookie_conf(b.spec, self.metadata_uri)
            self._spawn(b)
        self.wait_for_bookies(len(self._bookies), timeout_s=timeout_s)

    def _mount_small_ledger_dir(self, b: _Bookie) -> None:
        ledgers = b.spec.base / "ledgers"
        ledgers.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self._small_mb}m", "tmpfs", str(ledgers)], check=True)
        b.tmpfs = ledgers

    def _spawn(self, b: _Bookie) -> None:
        if b.log is None:
            b.log = open(b.spec.base / "bookie.log", "ab")  # noqa: SIM115 - kept open for the child's life
        b.proc = subprocess.Popen(bookie_command(b.spec.conf_file), stdout=b.log, stderr=subprocess.STDOUT,
                                  start_new_session=True)

    def stop(self) -> None:
        for b in self._bookies:
            if b.proc is not None and b.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(b.proc.pid, signal.SIGCONT)
                b.proc.send_signal(signal.SIGTERM)
        for b in self._bookies:
            if b.proc is not None:
                try:
                    b.proc.wait(20)
                except subprocess.TimeoutExpired:
                    b.proc.kill()
                    b.proc.wait()
            if b.log is not None:
                b.log.close()
                b.log = None
            if b.tmpfs is not None:
                subprocess.run(["umount", "-l", str(b.tmpfs)], capture_output=True)
                b.tmpfs = None

    # ------------------------------------------------------------------------------ queries
    @property
    def bookie_ids(self) -> list[str]:
        return [b.spec.bookie_id for b in self._bookies]

    def http_url(self, i: int) -> str:
        return f"http://127.0.0.1:{self._bookies[i].spec.http_port}"

    def metrics_url(self, i: int) -> str:
        """Bookie i's metrics port (``prometheusStatsHttpPort``, a free loopback port kept across
        restarts)."""
        return f"http://127.0.0.1:{self._bookies[i].spec.metrics_port}/metrics"

    def http_get(self, i: int, path: str) -> Any:
        with urllib.request.urlopen(self.http_url(i) + path, timeout=10) as resp:
            body = resp.read().decode()
        try:
            return json.loads(body)
        except json.JSONDecodeError:
            return body

    def pid(self, i: int) -> int:
        """The process id of bookie i (running)."""
        proc = self._bookies[i].proc
        if proc is None or proc.poll() is not None:
            raise RuntimeError(f"bookie {i} is not running")
        return proc.pid

    def ledger_dir(self, i: int) -> Path:
        return self._bookies[i].spec.base / "ledgers"

    def journal_dir(self, i: int) -> Path:
        return self._bookies[i].spec.base / "journal"

    def log_text(self, i: int) -> str:
        path = self._bookies[i].spec.base / "bookie.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def registered(self) -> tuple[frozenset[str], frozenset[str]]:
        """(writable, read-only) bookie ids registered in the metadata store."""
        with open_configured_store(self.metadata_uri, self.metadata_config) as store:
            return store.registration.list_bookies(), store.registration.list_bookies(read_only=True)

    def wait_for_bookies(self, count: int, *, read_only: bool | None = None, timeout_s: float = 60.0) -> None:
        """Wait until ``count`` bookies are registered (writable, read-only, or either)."""
        deadline = time.monotonic() + timeout_s
        while True:
            rw, ro = self.registered()
            n = len(rw) if read_only is False else len(ro) if read_only else len(rw | ro)
            if n >= count:
                return
            for b in self._bookies:
                if b.proc is not None and b.proc.poll() is not None and b.proc.returncode not in (0, -9):
                    raise RuntimeError(f"bookie {b.spec.index} exited with {b.proc.returncode}:\n"
                                       f"{self.log_text(b.spec.index)[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{n} of {count} bookies registered after {timeout_s}s")
            time.sleep(0.05)

    def wait_until(self, predicate: Any, *, timeout_s: float = 30.0, what: str = "condition") -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} not reached within {timeout_s}s")
            time.sleep(0.05)

    # ------------------------------------------------------------------------------ faults
    def kill(self, i: int) -> None:
        """SIGKILL bookie i (no clean shutdown)."""
        proc = self._bookies[i].proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def terminate(self, i: int) -> None:
        """SIGTERM bookie i and wait for its clean shutdown."""
        proc = self._bookies[i].proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)

    def pause(self, i: int) -> None:
        proc = self._bookies[i].proc
        assert proc is not None
        os.kill(proc.pid, signal.SIGSTOP)

    def resume(self, i: int) -> None:
        proc = self._bookies[i].proc
        assert proc is not None
        os.kill(proc.pid, signal.SIGCONT)

    def restart(self, i: int, *, wait: bool = True, timeout_s: float = 60.0) -> None:
        b = self._bookies[i]
        if b.proc is not None and b.proc.poll() is None:
            self.kill(i)
        ready_before = self.log_text(i).count("READY ")
        self._spawn(b)
        if wait:
            # A killed bookie's registration may linger until its session expires, so wait for
            # the new process itself to say it serves.
            def ready() -> bool:
                if b.proc is not None and b.proc.poll() is not None:
                    raise RuntimeError(f"bookie {i} exited with {b.proc.returncode}:\n{self.log_text(i)[-3000:]}")
                return self.log_text(i).count("READY ") > ready_before

            self.wait_until(ready, timeout_s=timeout_s, what=f"bookie {i} serving again")

    def fill_ledger_dir(self, i: int, *, leave_bytes: int = 64 * 1024) -> Path:
        """Fill bookie i's (tmpfs) ledger dir until ``leave_bytes`` remain; returns the filler
        file (delete it to free the space)."""
        b = self._bookies[i]
        if b.tmpfs is None:
            raise RuntimeError("start the cluster with small_ledger_dir_mb to fill a ledger dir")
        filler = b.tmpfs / "filler.bin"
        st = os.statvfs(b.tmpfs)
        free = st.f_bavail * st.f_frsize
        with open(filler, "ab") as f:
            f.write(b"\0" * max(0, free - leave_bytes))
        return filler
