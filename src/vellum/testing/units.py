"""The command lines of the systemd units Vellum ships (``deploy/systemd/``), for tests that run
them where systemd does not.

Responsibility: read a unit file's ``[Service]`` section, take its ``ExecStart=`` line, load
``Environment=`` / ``EnvironmentFile=`` values, expand ``${VAR}`` / ``$VAR`` as systemd does (a
word that is exactly ``$VAR`` may not be split further here: the values used contain no
spaces), and map the absolute paths of an installed host (``/etc/vellum``, ``/var/lib/vellum``,
``/opt/vellum/bin/vellum``...) onto the directories a test gives each host.

Invariants: nothing but ``ExecStart`` is run; a unit without exactly one ``ExecStart=``, an
unknown variable or an ``ExecStart`` prefix (``-``, ``@``, ``+``...) is an error that names the
unit, so a unit the test cannot run as written fails the test rather than being replaced.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


@dataclass(frozen=True)
class Unit:
    path: Path
    service: dict[str, list[str]]  #: key -> values in order (keys may repeat)

    @classmethod
    def read(cls, path: Path) -> Unit:
        section = ""
        service: dict[str, list[str]] = {}
        lines = path.read_text().splitlines()
        i = 0
        while i < len(lines):
            line = lines[i].strip()
            while line.endswith("\\") and i + 1 < len(lines):  # systemd line continuation
                i += 1
                line = line[:-1] + " " + lines[i].strip()
            i += 1
            if not line or line.startswith(("#", ";")):
                continue
            if line.startswith("[") and line.endswith("]"):
                section = line[1:-1]
                continue
            key, sep, value = line.partition("=")
            if not sep:
                raise ValueError(f"{path}: not key=value: {line!r}")
            if section == "Service":
                service.setdefault(key.strip(), []).append(value.strip())
        return cls(path, service)

    def value(self, key: str) -> str | None:
        values = self.service.get(key)
        return values[-1] if values else None

    def environment(self, path_map: Mapping[str, str]) -> dict[str, str]:
        """``Environment=`` and ``EnvironmentFile=`` values (files read at their mapped paths)."""
        env: dict[str, str] = {}
        for item in self.service.get("Environment", []):
            for word in shlex.split(item):
                k, _, v = word.partition("=")
                env[k] = v
        for item in self.service.get("EnvironmentFile", []):
            optional = item.startswith("-")
            file = Path(map_path(item.lstrip("-"), path_map))
            if not file.exists():
                if optional:
                    continue
                raise FileNotFoundError(f"{self.path}: EnvironmentFile {item} ({file}) does not exist")
            for line in file.read_text().splitlines():
                line = line.strip()
                if line and not line.startswith(("#", ";")):
                    k, _, v = line.partition("=")
                    env[k.strip()] = v.strip().strip('"')
        return env

    def exec_start(self, path_map: Mapping[str, str], *, executables: Mapping[str, Sequence[str]] | None = None,
                   ) -> list[str]:
        """The ``ExecStart`` command line, variables expanded, paths mapped; ``executables``
        replaces a program (e.g. ``/opt/vellum/bin/vellum``) by a command line."""
        starts = self.service.get("ExecStart", [])
        if len(starts) != 1:
            raise ValueError(f"{self.path}: expected one ExecStart=, found {len(starts)}")
        line = starts[0]
        if line[:1] in "-@:+!":
            raise ValueError(f"{self.path}: ExecStart prefixes are not supported here: {line!r}")
        env = self.environment(path_map)

        def expand(m: re.Match[str]) -> str:
            name = m.group(1) or m.group(2)
            if name not in env:
                raise ValueError(f"{self.path}: ExecStart uses ${name}, which no Environment= sets")
            return env[name]

        argv = [map_path(_VAR.sub(expand, word), path_map) for word in shlex.split(line)]
        replacement = (executables or {}).get(argv[0])
        return [*replacement, *argv[1:]] if replacement is not None else argv


def map_path(word: str, path_map: Mapping[str, str]) -> str:
    """``word`` with a leading mapped prefix replaced, also inside ``-Dkey=file:/path`` style
    words and ``:``-joined lists; the longest prefix wins."""
    def one(p: str) -> str:
        for prefix in sorted(path_map, key=len, reverse=True):
            if p == prefix or p.startswith(prefix.rstrip("/") + "/"):
                return path_map[prefix] + p[len(prefix):]
        return p

    for marker in ("=file:", "="):
        if marker in word and word.startswith("-"):
            head, _, tail = word.partition(marker)
            return head + marker + one(tail)
    return ":".join(one(p) for p in word.split(":")) if word.startswith("/") else word
