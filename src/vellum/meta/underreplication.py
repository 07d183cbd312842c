"""AutoRecovery records shared by the metadata drivers: BookKeeper's encodings, and the state of
one auditor candidate.

Responsibility: encode and decode what BookKeeper keeps under ``{ledgers}/underreplication``
so that both drivers store, and BookKeeper's tools read, the same bytes; and the leadership
flag and callbacks of an auditor candidate, which both drivers' elections share.

Encodings (BookKeeper's ``DataFormats.proto``):

- protobuf *text* format (``TextFormat``, what Java's ``message.toString()`` prints), one field
  per line, strings double-quoted with C escapes (bytes outside printable ASCII as ``\\ooo``)::

      UnderreplicatedLedgerFormat  replica: "host:3181"   (repeated, field 1)
                                   ctime: 1700000000000   (ms since the epoch, field 2)
      LockDataFormat               bookieId: "worker-host"
      AuditorVoteFormat            bookieId: "host:3181"
      LedgerRereplicationLayoutFormat  type: "BASIC" / version: 1

- protobuf *binary* format for the audit timestamps (``CheckAllLedgersFormat``,
  ``PlacementPolicyCheckFormat``, ``ReplicasCheckFormat``): one optional int64, field 1, so the
  bytes are ``0x08`` followed by the value as a varint (10 bytes for a negative value).

Invariants:
- ``decode_*(encode_*(x)) == x``; decoders accept any field order, ``#`` comments, ``:``-less
  fields and unknown fields (ignored, for forward compatibility), and reject anything else
  with ``MetaStoreError`` naming where the bytes came from;
- an under-replicated record's replicas are written sorted and without duplicates;
- ``ElectionState`` never calls a callback while holding its lock, calls ``on_leader`` once per
  won term and ``on_lost`` only for a term that ended without ``close()``.
No I/O here.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable

from vellum.errors import MetaStoreError
from vellum.format.text_format import ESCAPES_IN, escape_text
from vellum.ids import BookieId
from vellum.meta.api import AuditorElection

UNASSIGNED_CTIME = -1
"""``ctime_ms`` of a record written without one (BookKeeper's ``UNASSIGNED_CTIME``)."""

LAYOUT_TYPE = "BASIC"
LAYOUT_VERSION = 1

TextValue = str | int


# -- protobuf text format ---------------------------------------------------------------------


def _quote(s: str) -> str:
    return '"' + escape_text(s) + '"'


def _unquote(body: str, where: str) -> str:
    out = bytearray()
    i = 0
    while i < len(body):
        ch = body[i]
        if ch != "\\":
            out += ch.encode("utf-8")
            i += 1
            continue
        i += 1
        if i >= len(body):
            raise MetaStoreError(f"{where}: a string ends in a lone backslash")
        ch = body[i]
        if ch in ESCAPES_IN:
            out.append(ESCAPES_IN[ch])
            i += 1
        elif ch in "01234567":
            m = re.match(r"[0-7]{1,3}", body[i:])
            assert m is not None
            out.append(int(m.group(), 8) & 0xFF)
            i += len(m.group())
        elif ch in "xX":
            m = re.match(r"[0-9A-Fa-f]{1,2}", body[i + 1:])
            if m is None:
                raise MetaStoreError(f"{where}: bad \\x escape in a string")
            out.append(int(m.group(), 16))
            i += 1 + len(m.group())
        else:
            raise MetaStoreError(f"{where}: unknown escape \\{ch} in a string")
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError:
        raise MetaStoreError(f"{where}: a string is not UTF-8") from None


def format_text_proto(fields: Iterable[tuple[str, TextValue]]) -> bytes:
    """``name: value`` lines as Java's ``TextFormat`` prints them (strings quoted, ints bare)."""
    lines = []
    for name, value in fields:
        lines.append(f"{name}: {_quote(value) if isinstance(value, str) else int(value)}\n")
    return "".join(lines).encode("ascii")


_TOKEN = re.compile(
    r"""\s*(?:
        (?P<comment>\#[^\n]*)
      | (?P<name>[A-Za-z_][A-Za-z0-9_]*)\s*:?\s*
        (?:(?P<strings>(?:"(?:[^"\\\n]|\\.)*"\s*|'(?:[^'\\\n]|\\.)*'\s*)+)
          |(?P<number>[-+]?(?:0[xX][0-9A-Fa-f]+|[0-9]+))
          |(?P<ident>[A-Za-z_][A-Za-z0-9_]*))
        \s*[;,]?
    )""",
    re.VERBOSE,
)
_STRING = re.compile(r""""((?:[^"\\\n]|\\.)*)"|'((?:[^'\\\n]|\\.)*)'""")


def parse_text_proto(data: bytes, *, where: str) -> list[tuple[str, TextValue]]:
    """The ``(name, value)`` pairs of a flat text-format message, in order (repeated fields repeat)."""
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError:
        raise MetaStoreError(f"{where}: not protobuf text (not UTF-8): {bytes(data)[:40]!r}") from None
    fields: list[tuple[str, TextValue]] = []
    pos = 0
    while pos < len(text):
        if not text[pos:].strip():
            break
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise MetaStoreError(f"{where}: not protobuf text at offset {pos}: {text[pos:pos + 40]!r}")
        pos = m.end()
        if m.group("comment") is not None:
            continue
        name = m.group("name")
        if m.group("strings") is not None:
            parts = [
                s.group(1) if s.group(1) is not None else s.group(2) for s in _STRING.finditer(m.group("strings"))
            ]
            fields.append((name, "".join(_unquote(p, where) for p in parts)))
        elif m.group("number") is not None:
            fields.append((name, int(m.group("number"), 0)))
        else:
            fields.append((name, m.group("ident")))  # an enum value or true/false
    return fields


def _one(fields: list[tuple[str, TextValue]], name: str, kind: type, where: str) -> TextValue | None:
    found = [v for n, v in fields if n == name]
    if not found:
        return None
    if not isinstance(found[-1], kind):
        raise MetaStoreError(f"{where}: field {name} must be {kind.__name__}, got {found[-1]!r}")
    return found[-1]  # protobuf text: a repeated optional field keeps the last value


# -- under-replicated ledger record -----------------------------------------------------------

def encode_under_replicated(replicas: Iterable[str], ctime_ms: int | None) -> bytes:
    """``UnderreplicatedLedgerFormat`` text: sorted distinct replicas, then the ctime if known."""
    fields: list[tuple[str, TextValue]] = [("replica", str(r)) for r in sorted(set(replicas))]
    if ctime_ms is not None and ctime_ms != UNASSIGNED_CTIME:
        fields.append(("ctime", int(ctime_ms)))
    return format_text_proto(fields)


def decode_under_replicated(data: bytes, *, where: str) -> tuple[tuple[str, ...], int]:
    """(replicas sorted and distinct, ctime in ms or ``UNASSIGNED_CTIME``)."""
    fields = parse_text_proto(data, where=where)
    replicas = []
    for name, value in fields:
        if name == "replica":
            if not isinstance(value, str):
                raise MetaStoreError(f"{where}: replica must be a string, got {value!r}")
            replicas.append(value)
    ctime = _one(fields, "ctime", int, where)
    return tuple(sorted(set(replicas))), UNASSIGNED_CTIME if ctime is None else int(ctime)


def merge_replicas(current: Iterable[str], missing: Iterable[str]) -> tuple[str, ...] | None:
    """The merged replica set, or None when ``missing`` adds nothing (no write needed)."""
    have = set(current)
    merged = have | {str(m) for m in missing}
    return None if merged == have else tuple(sorted(merged))


def now_ms() -> int:
    return int(time.time() * 1000)


# -- lock data, auditor vote, layout ----------------------------------------------------------

def encode_bookie_id_record(bookie_id: str) -> bytes:
    """``LockDataFormat`` / ``AuditorVoteFormat``: ``bookieId: "<id>"`` (empty id: no field)."""
    return format_text_proto([("bookieId", bookie_id)] if bookie_id else [])


def decode_bookie_id_record(data: bytes, *, where: str) -> str:
    """The ``bookieId`` of a lock or vote record ("" when the field is absent, as BookKeeper allows)."""
    value = _one(parse_text_proto(data, where=where), "bookieId", str, where)
    return "" if value is None else str(value)


def encode_layout() -> bytes:
    return format_text_proto([("type", LAYOUT_TYPE), ("version", LAYOUT_VERSION)])


def check_layout(data: bytes, *, where: str) -> None:
    """``MetaStoreError`` unless ``data`` is BookKeeper's ``BASIC:1`` re-replication layout."""
    fields = parse_text_proto(data, where=where)
    kind, version = _one(fields, "type", str, where), _one(fields, "version", int, where)
    if kind != LAYOUT_TYPE or version != LAYOUT_VERSION:
        raise MetaStoreError(
            f"{where}: incompatible re-replication layout {kind}:{version} (expected {LAYOUT_TYPE}:{LAYOUT_VERSION})"
        )


# -- audit timestamps (binary protobuf, one int64 field 1) ------------------------------------

def encode_ctime(ctime_ms: int) -> bytes:
    value = int(ctime_ms) & 0xFFFF_FFFF_FFFF_FFFF  # int64 varints are two's complement
    out = bytearray(b"\x08")
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _varint(data: bytes, pos: int, where: str) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise MetaStoreError(f"{where}: truncated or overlong varint in protobuf bytes {data[:40]!r}")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return result, pos


def decode_ctime(data: bytes, *, where: str) -> int | None:
    """Field 1 of an audit-timestamp message in ms, or None when it is absent."""
    data = bytes(data)
    pos = 0
    found: int | None = None
    while pos < len(data):
        key, pos = _varint(data, pos, where)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos, where)
            if field == 1:
                found = value - (1 << 64) if value >= 1 << 63 else value
        elif wire == 1:
            pos += 8
        elif wire == 2:
            length, pos = _varint(data, pos, where)
            pos += length
        elif wire == 5:
            pos += 4
        else:
            raise MetaStoreError(f"{where}: unsupported protobuf wire type {wire} in {data[:40]!r}")
        if pos > len(data):
            raise MetaStoreError(f"{where}: truncated protobuf bytes {data[:40]!r}")
    return found


def encode_delay(seconds: int) -> bytes:
    """``lostBookieRecoveryDelay``: the number as decimal text (``Integer.toString``)."""
    return str(int(seconds)).encode("ascii")


def decode_delay(data: bytes, *, where: str) -> int:
    try:
        return int(bytes(data).decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        raise MetaStoreError(f"{where}: lost bookie recovery delay is not a number: {bytes(data)[:40]!r}") from None


# -- auditor candidate state ------------------------------------------------------------------

class ElectionState:
    """Whether one candidate leads, and its callbacks (run through ``submit``, never under a lock).

    ``won()`` starts a term (``on_leader``), ``lost()`` ends one that ``close()`` did not end
    (``on_lost``); both are idempotent. ``wait()`` returns as soon as the candidate leads, and
    False once it is closed.
    """

    def __init__(
        self,
        on_leader: Callable[[], None] | None,
        on_lost: Callable[[], None] | None,
        submit: Callable[[Callable[[], None]], None],
    ) -> None:
        self._on_leader = on_leader
        self._on_lost = on_lost
        self._submit = submit
        self._cond = threading.Condition()
        self._leader = False
        self.closed = False

    @property
    def is_leader(self) -> bool:
        return self._leader

    def won(self) -> None:
        with self._cond:
            if self.closed or self._leader:
                return
            self._leader = True
            self._cond.notify_all()
        if self._on_leader is not None:
            self._submit(self._on_leader)

    def lost(self) -> None:
        with self._cond:
            if not self._leader:
                return
            self._leader = False
            notify = not self.closed
        if notify and self._on_lost is not None:
            self._submit(self._on_lost)

    def close(self) -> bool:
        """End the candidacy; returns False if it had ended already."""
        with self._cond:
            if self.closed:
                return False
            self.closed = True
            self._leader = False
            self._cond.notify_all()
            return True

    def wait(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not self._leader and not self.closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return self._leader


class Candidacy(AuditorElection):
    """What every driver's candidacy shares: the candidate's id, its ``ElectionState`` and the
    reads on them (``leader`` asks the store). A driver adds voting and ``resign``."""

    def __init__(
        self,
        bookie_id: BookieId,
        current_auditor: Callable[[], BookieId | None],
        on_leader: Callable[[], None] | None,
        on_lost: Callable[[], None] | None,
        submit: Callable[[Callable[[], None]], None],
    ) -> None:
        self._bookie_id = bookie_id
        self._current_auditor = current_auditor
        self.state = ElectionState(on_leader, on_lost, submit)
        self._lock = threading.RLock()

    @property
    def bookie_id(self) -> BookieId:
        return self._bookie_id

    @property
    def is_leader(self) -> bool:
        return self.state.is_leader

    def leader(self) -> BookieId | None:
        return self._current_auditor()

    def wait_leader(self, timeout_s: float) -> bool:
        return self.state.wait(timeout_s)
