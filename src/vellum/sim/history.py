"""The history of one simulated run: what each actor saw, on virtual time.

Responsibility: one append-only list of ``Event`` rows, written by the workload and the fault
injector, read by ``checker``. Payloads are kept as short digests (equal bytes, equal digest).
An ``Event`` is a named tuple (immutable, and built in C: a run records thousands of them).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, NamedTuple


def digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=6).hexdigest()


class Event(NamedTuple):
    t: float
    actor: str
    kind: str
    ledger: int = -1
    entry: int = -1
    value: Any = None

    def describe(self) -> str:
        t, actor, kind, ledger, entry, value = self  # one unpacking, not a lookup a field
        where = ""
        if ledger >= 0:
            where = f" L{ledger}" + (f":{entry}" if entry >= 0 else "")
        text = "" if value is None else f" {value}"
        return f"t={t:9.4f} {actor:<10} {kind}{where}{text}"


_new_tuple = tuple.__new__


@dataclass
class History:
    events: list[Event] = field(default_factory=list)
    clock: Any = None  # () -> float

    def add(self, actor: str, kind: str, ledger: int = -1, entry: int = -1, value: Any = None) -> None:
        clock = self.clock
        # ``Event(...)`` as its generated ``__new__`` builds it, without that Python call
        self.events.append(_new_tuple(Event, (clock() if clock else 0.0, actor, kind, ledger, entry, value)))
