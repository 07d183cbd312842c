"""A ``FileOps`` that records every system call by file name, and fails or "crashes" at a chosen
one (imported by path: tests/ has no packages)."""

from __future__ import annotations

import errno
from pathlib import Path

from vellum.storage.durable import FileOps


class Crash(BaseException):
    """The process died here: nothing after this call runs, no cleanup (not an OSError)."""


class RecordingOps(FileOps):
    """Records ``(op, name...)`` for each call; ``fail_at=(op, name)`` makes that call raise
    ``OSError(EIO)`` (or ``Crash`` with ``crash=True``) instead of running."""

    def __init__(self, fail_at: tuple[str, str] | None = None, *, crash: bool = False) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.fail_at = fail_at
        self.crash = crash
        self._names: dict[int, str] = {}

    def _step(self, op: str, *names: str) -> None:
        self.calls.append((op, *names))
        if self.fail_at == (op, names[0]):
            self.fail_at = None
            if self.crash:
                raise Crash(f"crash at {op} {names[0]}")
            raise OSError(errno.EIO, f"injected failure at {op} {names[0]}")

    def ops_on(self, name: str) -> list[str]:
        return [c[0] for c in self.calls if name in c[1:]]

    def open(self, path: Path, flags: int, mode: int = 0o644) -> int:
        self._step("open", path.name)
        fd = super().open(path, flags, mode)
        self._names[fd] = path.name
        return fd

    def write(self, fd: int, data: bytes | memoryview) -> int:
        self._step("write", self._names.get(fd, "?"))
        return super().write(fd, data)

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        self._step("pwrite", self._names.get(fd, "?"))
        return super().pwrite(fd, data, offset)

    def fsync(self, fd: int) -> None:
        self._step("fsync", self._names.get(fd, "?"))
        super().fsync(fd)

    def close(self, fd: int) -> None:
        try:
            self._step("close", self._names.pop(fd, "?"))
        finally:
            super().close(fd)  # close(2) releases the descriptor even when it reports an error

    def rename(self, src: Path, dst: Path) -> None:
        self._step("rename", src.name, dst.name)
        super().rename(src, dst)

    def link(self, src: Path, dst: Path) -> None:
        self._step("link", src.name, dst.name)
        super().link(src, dst)

    def unlink(self, path: Path) -> None:
        self._step("unlink", path.name)
        super().unlink(path)

    def fsync_dir(self, path: Path) -> None:
        self._step("fsync_dir", path.name)
        super().fsync_dir(path)
