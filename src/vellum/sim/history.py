"""The history of one simulated run: what each actor saw, on virtual time.

Responsibility: one append-only list of ``Event`` rows, written by the workload and the fault
injector, read by ``checker``. Payloads are kept as short digests (equal bytes, equal digest).
An ``Event`` is a named tuple (immutable, and built in C: a run records thousands of them).
``describe_rows`` writes the rows of many events at once (what a run's fingerprint digests, every
event of every seed): one loop, each row one ``%`` format (one C call where an f-string of several
parts builds each), the ``actor kind`` part formatted once per pair and the time once per run of
rows at one instant (a float's ``%f`` is thousands of instructions); ``Event.describe`` is a row
of one.

``Digests`` is a run's payload -> digest table: a payload is written once and read back many times
(the reader, the recoverer, the final read), and each digest is worth a few thousand instructions
where a look-up of its bytes is worth a few hundred, so each distinct payload is digested once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Container, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple


def digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=6).hexdigest()


class Digests(dict[bytes, str]):
    """``digests[data]`` is ``digest(data)``, computed at the first look-up of those bytes and
    kept (for one run: it holds every payload it was asked about)."""

    __slots__ = ()

    def __missing__(self, data: bytes) -> str:
        value = self[data] = digest(data)
        return value


class Event(NamedTuple):
    t: float
    actor: str
    kind: str
    ledger: int = -1
    entry: int = -1
    value: Any = None

    def describe(self) -> str:
        """``t=<time> <actor> <kind>``, then `` L<ledger>`` (and ``:<entry>``) and `` <value>``
        when the event has them."""
        return describe_rows((self,))


def describe_rows(events: Iterable[Event], leave_out: Container[str] = ()) -> str:
    """The rows of ``events`` (each one's ``describe()``) joined, without the events whose kind
    is in ``leave_out``."""
    heads: dict[tuple[str, str], str] = {}
    rows: list[str] = []
    append = rows.append
    last_t: object = None
    stamp = ""
    for t, actor, kind, ledger, entry, value in events:  # one unpacking, not a lookup a field
        if kind in leave_out:
            continue
        if t != last_t:
            # ``t=<time>`` formatted once for a run of rows at one instant (four rows in five: a
            # batch of reads or acks is recorded at one time), as a float's ``%f`` costs thousands
            # of instructions; equal times write the same text (a run's clock is never -0.0)
            last_t = t
            stamp = "t=%9.4f" % t  # noqa: UP031
        head = heads.get((actor, kind))
        if head is None:
            head = heads[(actor, kind)] = f"{actor:<10} {kind}"
        # ``%`` formats (UP031): one C call a row, where an f-string of several parts costs a
        # third more; ``%s`` writes what ``{}`` writes for the values a history holds
        if ledger < 0:
            if value is None:
                append("%s %s" % (stamp, head))  # noqa: UP031
            else:
                append("%s %s %s" % (stamp, head, value))  # noqa: UP031
        elif entry < 0:
            if value is None:
                append("%s %s L%s" % (stamp, head, ledger))  # noqa: UP031
            else:
                append("%s %s L%s %s" % (stamp, head, ledger, value))  # noqa: UP031
        elif value is None:
            append("%s %s L%s:%s" % (stamp, head, ledger, entry))  # noqa: UP031
        else:
            append("%s %s L%s:%s %s" % (stamp, head, ledger, entry, value))  # noqa: UP031
    return "".join(rows)


_new_tuple = tuple.__new__


@dataclass
class History:
    events: list[Event] = field(default_factory=list)
    clock: Any = None  # () -> float

    def add(self, actor: str, kind: str, ledger: int = -1, entry: int = -1, value: Any = None) -> None:
        clock = self.clock
        # ``Event(...)`` as its generated ``__new__`` builds it, without that Python call
        self.events.append(_new_tuple(Event, (clock() if clock else 0.0, actor, kind, ledger, entry, value)))
