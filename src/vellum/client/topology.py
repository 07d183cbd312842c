"""Where bookies are: network locations (``/rack``, ``/region/rack``, ``/zone/upgradedomain``)
for the topology-aware placement policies (BookKeeper's DNSToSwitchMapping).

Responsibility: answer "what is the network location of bookie X?" from one of two sources, the
same for every policy:

* :class:`ScriptResolver` - BookKeeper's ``ScriptBasedMapping``: the executable
  ``networkTopologyScriptFileName`` is run with bookie host addresses as arguments, at most
  ``networkTopologyScriptNumberArgs`` per run, and prints one network location per argument
  (whitespace separated, in order). The host of a bookie id ``host:port`` is normalised to its IP
  address, as BookKeeper does, so every bookie of one host has one location.
* :class:`MappingResolver` - a ``bookie_id /location`` mapping (``vellum shell racks`` keeps one in
  the metadata store), keyed by bookie id.

Invariants:

* a resolver never raises for a bookie: a location it cannot learn is ``None``, and the policy
  puts the bookie in its default location (``/default-rack``, ``/default-zone/default-upgradedomain``,
  ``/default-region/default-rack``), as BookKeeper does;
* the script is run only from :meth:`ScriptResolver.resolve` for hosts not yet asked about (every
  answer, a failed one included, is cached per host); each failed run (non-zero exit, timeout,
  wrong number of answers, not executable) is logged once, with the script path and the error;
  :meth:`ScriptResolver.forget_failures` lets a later ``resolve`` ask again (the client calls it
  when the set of bookies changes);
* :meth:`ScriptResolver.check` is BookKeeper's start-up sanity check: the script run with no
  arguments must succeed.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import subprocess
import threading
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)

#: BookKeeper's default of ``networkTopologyScriptNumberArgs``
DEFAULT_SCRIPT_NUMBER_ARGS = 100


class TopologyResolver(Protocol):
    """Network location of a bookie, or ``None`` when unknown."""

    def location(self, bookie_id: str) -> str | None: ...

    def resolve(self, bookie_ids: Collection[str]) -> None:
        """Learn the locations of ``bookie_ids`` now (may block: call it off the event loop)."""


class MappingResolver:
    """Locations from a ``bookie id -> /location`` mapping, read at each lookup (a mutable
    mapping may be updated in place)."""

    def __init__(self, mapping: Mapping[str, str] | Callable[[str], str | None]) -> None:
        self._get: Callable[[str], str | None] = mapping.get if isinstance(mapping, Mapping) else mapping

    def location(self, bookie_id: str) -> str | None:
        try:
            return self._get(bookie_id) or None
        except KeyError:
            return None

    def resolve(self, bookie_ids: Collection[str]) -> None:
        """Nothing to learn: the mapping is in memory."""


def bookie_host(bookie_id: str) -> str:
    """The host part of a ``host:port`` bookie id (``[v6]:port`` too); the id itself otherwise."""
    host, sep, port = bookie_id.rpartition(":")
    if not sep or not port.isdigit():
        return bookie_id
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def normalize_host(host: str) -> str:
    """The IP address of ``host`` (BookKeeper's ``NetUtils.normalizeHostName``): an address
    stays as it is, a name is looked up, a name that does not resolve stays the name."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


class ScriptError(Exception):
    """One run of the topology script failed (the message says how)."""


class ScriptResolver:
    """BookKeeper's ``ScriptBasedMapping``, with a timeout per run and a cache per host."""

    def __init__(
        self,
        script: str | Path,
        *,
        number_args: int = DEFAULT_SCRIPT_NUMBER_ARGS,
        timeout_s: float = 5.0,
        normalize: Callable[[str], str] = normalize_host,
    ) -> None:
        if number_args < 1:
            raise ValueError(f"number_args must be >= 1, got {number_args}")
        self.script = str(script)
        self._number_args = number_args
        self._timeout_s = timeout_s
        self._normalize = normalize
        self._lock = threading.Lock()
        self._host_of: dict[str, str] = {}
        #: host -> location; ``None``: the script was asked and failed for it
        self._cache: dict[str, str | None] = {}

    # ---------------------------------------------------------------------------- running
    def run(self, args: list[str]) -> list[str]:
        """One run of the script with ``args``; its whitespace-separated answers. Raises
        :class:`ScriptError` on a failure (not executable, non-zero exit, timeout)."""
        try:
            done = subprocess.run(
                [self.script, *args], capture_output=True, timeout=self._timeout_s, check=False,
                cwd=os.getcwd(), stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise ScriptError(f"no answer within {self._timeout_s:g} s (killed)") from None
        except OSError as e:
            raise ScriptError(f"cannot run it: {e.strerror or e}") from None
        if done.returncode != 0:
            err = done.stderr.decode("utf-8", "replace").strip().splitlines()
            raise ScriptError(f"exit status {done.returncode}" + (f": {err[-1]}" if err else ""))
        return done.stdout.decode("utf-8", "replace").split()

    def check(self) -> None:
        """BookKeeper's sanity check at start: the script run with no argument succeeds."""
        self.run([])

    # --------------------------------------------------------------------------- resolving
    def _host(self, bookie_id: str) -> str:
        host = self._host_of.get(bookie_id)
        if host is None:
            host = self._host_of[bookie_id] = self._normalize(bookie_host(bookie_id))
        return host

    def resolve(self, bookie_ids: Collection[str]) -> None:
        """Run the script for the hosts of ``bookie_ids`` not asked about yet, in batches of
        ``networkTopologyScriptNumberArgs``; a failed batch leaves its hosts unknown (logged)."""
        with self._lock:
            hosts = list(dict.fromkeys(self._host(b) for b in bookie_ids))
            todo = [h for h in hosts if h not in self._cache]
            for start in range(0, len(todo), self._number_args):
                batch = todo[start:start + self._number_args]
                try:
                    answers = self.run(batch)
                    if len(answers) != len(batch):
                        raise ScriptError(f"printed {len(answers)} location(s) for {len(batch)} host(s)")
                    bad = [a for a in answers if not a.startswith("/")]
                    if bad:
                        raise ScriptError(f"printed {bad[0]!r}, which is not a network location (/rack, "
                                          "/region/rack or /zone/upgradedomain)")
                except ScriptError as e:
                    log.warning("network topology script %s failed for %s: %s; those bookies are placed in the "
                                "default location (networkTopologyScriptFileName)", self.script, " ".join(batch), e)
                    self._cache.update(dict.fromkeys(batch))
                    continue
                self._cache.update(zip(batch, answers, strict=True))

    def location(self, bookie_id: str) -> str | None:
        host = self._host(bookie_id)
        if host not in self._cache:
            self.resolve([bookie_id])
        return self._cache.get(host)

    def forget_failures(self) -> None:
        """Hosts whose run failed are asked again at their next lookup."""
        with self._lock:
            for host in [h for h, loc in self._cache.items() if loc is None]:
                del self._cache[host]
