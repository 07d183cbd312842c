"""Ledger directories: the ``current/`` layout and the ``LedgerDirsManager`` disk checker
(usage thresholds, full / writable transitions, listeners). Durable file replacement lives in
``storage/durable.py``.

Directory layout: every configured journal, ledger and index directory keeps its files in a
``current/`` sub-directory (``<ledgerDir>/current/VERSION``, ``lastMark``, ``*.log``, ...).
``LedgerDirsManager`` works on the directories as configured (the roots); ``current_dir(root)``
gives the directory the files live in.

Disk checker (BookKeeper's ``LedgerDirsMonitor``):
- usage = ``1 - usable / total`` of the filesystem holding the dir, as BookKeeper measures it:
  *usable* is what the bookie's own (unprivileged) user can still write (``statvfs``
  ``f_bavail``), so blocks the filesystem reserves for root (ext4: 5 % by default) count as
  used. ``used / total`` would count them as free: such a disk fails writes with ENOSPC at
  "95 %" and never crosses a 0.95 threshold first;
- a writable dir whose usage is above ``usage_threshold`` becomes *full*: it takes no new entry
  logs; a full dir becomes writable again only when its usage drops below ``lwm_threshold``
  (hysteresis, ``lwm <= threshold``), so a dir hovering at the threshold does not flap;
- a dir above ``warn_threshold`` is in *warn* state (GC suspends major compaction);
- listeners hear ``on_dir_full`` / ``on_dir_writable`` per dir and ``on_all_full`` /
  ``on_any_writable`` when the bookie as a whole must turn read-only / may turn writable again.
  Listeners are called outside the state lock, in transition order (checks are serialised).
- a dir whose usage cannot be measured (I/O error, disk gone) is treated as full.
Thread-safe; ``check()`` is callable directly, ``start()``/``stop()`` run it periodically.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from vellum.errors import DiskFullError

log = logging.getLogger(__name__)

CURRENT_DIR = "current"

#: ``(total, unusable)`` bytes of the filesystem holding a dir: its size and what the bookie
#: can no longer write there (``total - usable``; see ``DiskSpace``)
DiskUsageFn = Callable[[Path], tuple[int, int]]


def current_dir(root: Path | str) -> Path:
    """``<root>/current``: where a journal, ledger or index dir keeps its files."""
    return Path(root) / CURRENT_DIR


@dataclass(frozen=True)
class DiskSpace:
    """The space of one filesystem as the disk checker sees it (bytes).

    ``total``: its size (``f_blocks``); ``usable``: what an unprivileged user, the bookie, can
    still write (``f_bavail``); ``used``: what files take (``f_blocks - f_bfree``). The blocks
    reserved for root (``f_bfree - f_bavail``) are neither used nor usable: ``usage`` counts
    them as taken, so a dir reaches usage 1.0 exactly when the bookie's writes fail with ENOSPC.
    """

    total: int
    usable: int
    used: int

    @classmethod
    def from_statvfs(cls, st: os.statvfs_result) -> DiskSpace:
        frsize = st.f_frsize or st.f_bsize
        return cls(total=st.f_blocks * frsize, usable=st.f_bavail * frsize,
                   used=(st.f_blocks - st.f_bfree) * frsize)

    @property
    def unusable(self) -> int:
        """What the bookie cannot write any more: used plus reserved."""
        return self.total - self.usable

    @property
    def usage(self) -> float:
        """``1 - usable / total`` (BookKeeper's definition); 1.0 for a filesystem of no size."""
        if self.total <= 0:
            return 1.0
        return self.unusable / self.total


def disk_space(path: Path | str) -> DiskSpace:
    """``DiskSpace`` of the filesystem holding ``path`` (raises ``OSError``)."""
    return DiskSpace.from_statvfs(os.statvfs(path))


def _statvfs_disk_usage(path: Path) -> tuple[int, int]:
    space = disk_space(path)
    return space.total, space.unusable


class LedgerDirsListener:
    """Receives disk-state transitions. Override only what you need (defaults do nothing)."""

    def on_dir_full(self, dir: Path) -> None:
        pass

    def on_dir_writable(self, dir: Path) -> None:
        pass

    def on_all_full(self) -> None:
        pass

    def on_any_writable(self) -> None:
        pass


@dataclass
class _DirState:
    usage: float = 0.0
    full: bool = False
    warn: bool = False


class LedgerDirsManager:
    """Tracks which ledger dirs may take new entry logs (see the module docstring)."""

    def __init__(
        self,
        dirs: Sequence[Path],
        *,
        usage_threshold: float = 0.95,
        warn_threshold: float = 0.90,
        lwm_threshold: float = 0.95,
        disk_usage: DiskUsageFn = _statvfs_disk_usage,
    ) -> None:
        if not dirs:
            raise ValueError("LedgerDirsManager needs at least one ledger dir")
        if not 0.0 < usage_threshold <= 1.0:
            raise ValueError(f"usage_threshold {usage_threshold} must be in (0, 1]")
        if warn_threshold > usage_threshold:
            raise ValueError(f"warn_threshold {warn_threshold} exceeds usage_threshold {usage_threshold}")
        if lwm_threshold > usage_threshold:
            raise ValueError(f"lwm_threshold {lwm_threshold} exceeds usage_threshold {usage_threshold}")
        self._dirs = tuple(Path(d) for d in dirs)
        if len(set(self._dirs)) != len(self._dirs):
            raise ValueError(f"ledger dirs listed twice: {[str(d) for d in self._dirs]}")
        self._usage_threshold = usage_threshold
        self._warn_threshold = warn_threshold
        self._lwm_threshold = lwm_threshold
        self._disk_usage = disk_usage
        self._lock = threading.Lock()  # guards _state and _listeners
        self._check_lock = threading.Lock()  # serialises check() so events keep their order
        self._state = {d: _DirState() for d in self._dirs}
        self._listeners: list[LedgerDirsListener] = []
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        # Initial evaluation: nobody listens yet, so the start state is simply recorded.
        self.check()

    # -- listeners -------------------------------------------------------------------------

    def add_listener(self, listener: LedgerDirsListener) -> None:
        with self._lock:
            self._listeners.append(listener)

    # -- checking --------------------------------------------------------------------------

    def _measure(self, d: Path) -> float:
        try:
            total, unusable = self._disk_usage(d)
        except OSError as e:
            log.error("cannot measure disk usage of ledger dir %s (%s); treating it as full", d, e)
            return 1.0
        if total <= 0:
            log.error("ledger dir %s reports a total size of %d; treating it as full", d, total)
            return 1.0
        return unusable / total

    def check(self) -> None:
        """Re-measure every dir, update states, then notify listeners of the transitions."""
        with self._check_lock:
            usages = {d: self._measure(d) for d in self._dirs}
            events: list[tuple[str, Path | None]] = []
            with self._lock:
                was_all_full = all(s.full for s in self._state.values())
                for d, u in usages.items():
                    st = self._state[d]
                    st.usage = u
                    st.warn = u > self._warn_threshold
                    if not st.full and u > self._usage_threshold:
                        st.full = True
                        log.warning(
                            "ledger dir %s is full (usage %.3f > %.3f): no new entry logs there",
                            d, u, self._usage_threshold,
                        )
                        events.append(("on_dir_full", d))
                    elif st.full and u < self._lwm_threshold:
                        st.full = False
                        log.info("ledger dir %s is writable again (usage %.3f < %.3f)", d, u, self._lwm_threshold)
                        events.append(("on_dir_writable", d))
                    elif st.warn and not st.full:
                        log.warning("ledger dir %s usage %.3f is above the warn threshold %.3f",
                                    d, u, self._warn_threshold)
                now_all_full = all(s.full for s in self._state.values())
                if now_all_full and not was_all_full:
                    log.error("all ledger dirs are full: the bookie must turn read-only")
                    events.append(("on_all_full", None))
                elif was_all_full and not now_all_full:
                    log.info("a ledger dir is writable again: the bookie may turn writable")
                    events.append(("on_any_writable", None))
                listeners = list(self._listeners)
            for name, dir in events:
                for listener in listeners:
                    hook = getattr(listener, name, None)
                    if hook is None:  # duck-typed listeners may implement only some hooks
                        continue
                    try:
                        hook(dir) if dir is not None else hook()
                    except Exception:
                        log.exception("ledger dirs listener %r failed in %s", listener, name)

    # -- queries ---------------------------------------------------------------------------

    @property
    def dirs(self) -> tuple[Path, ...]:
        return self._dirs

    def writable_dirs(self) -> list[Path]:
        with self._lock:
            return [d for d in self._dirs if not self._state[d].full]

    def full_dirs(self) -> list[Path]:
        with self._lock:
            return [d for d in self._dirs if self._state[d].full]

    def is_writable(self, dir: Path) -> bool:
        with self._lock:
            return not self._state[self._known(dir)].full

    def all_full(self) -> bool:
        with self._lock:
            return all(s.full for s in self._state.values())

    def any_above_warn(self) -> bool:
        with self._lock:
            return any(s.warn for s in self._state.values())

    def usage(self, dir: Path) -> float:
        """The usage fraction measured at the last check."""
        with self._lock:
            return self._state[self._known(dir)].usage

    def pick_writable_dir(self, prefer_fewest: Callable[[Path], int] | None = None) -> Path:
        """A writable dir for a new entry log: the one with the smallest ``prefer_fewest(dir)``
        (requirement R1 of docs/correctness.md: fewest active entry logs), else the least used; ties keep configuration
        order. Raises DiskFullError when every dir is full."""
        with self._lock:
            candidates = [(d, self._state[d].usage) for d in self._dirs if not self._state[d].full]
        if not candidates:
            raise DiskFullError(
                "no writable ledger dir: all of " + ", ".join(str(d) for d in self._dirs) + " are full"
            )
        if prefer_fewest is not None:
            return min(candidates, key=lambda c: prefer_fewest(c[0]))[0]
        return min(candidates, key=lambda c: c[1])[0]

    def _known(self, dir: Path) -> Path:
        d = Path(dir)
        if d not in self._state:
            raise ValueError(f"{d} is not a ledger dir of this bookie")
        return d

    # -- background checker ----------------------------------------------------------------

    def start(self, interval_ms: int) -> None:
        """Run ``check()`` every ``interval_ms`` (``diskCheckInterval``) on a daemon thread."""
        if interval_ms <= 0:
            raise ValueError(f"disk check interval {interval_ms} ms must be positive")
        with self._lock:
            if self._thread is not None:
                raise RuntimeError("the disk checker is already running")
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._run, args=(interval_ms / 1000.0,), name="ledger-dirs-monitor", daemon=True
            )
            self._thread.start()

    def _run(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                self.check()
            except Exception:
                log.exception("disk check failed")

    def stop(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join()
