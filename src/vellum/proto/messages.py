"""Wire messages between a client and a bookie: constants and one frozen dataclass per message.

Responsibility: name every frame of the protocol (docs/protocol.md) as a value object. No
encoding here (see ``codec.py``) and no I/O.

Invariants:
* Every frame's header int is ``(PROTOCOL_VERSION << 24) | (opcode << 16) | flags``.
* ADD, READ and BATCH_READ (opcodes 1, 2, 7) are BookKeeper v2's frames, byte for byte; they
  carry no request id: a v2 client matches answers by (op, ledger id, entry id).
* Vellum's own operations (opcodes >= 64) carry an int64 ``request_id`` right after the header
  in both directions; the answer repeats the request's id.
* ``status`` fields hold v2 wire status codes from :mod:`vellum.errors` (``EOK``, ``ENOLEDGER``...).
* Byte fields of decoded messages are ``bytes`` owned by the message (never views into a
  caller's receive buffer). Messages built by callers may hold any bytes-like value.
* ``LedgerClosedNote`` is fire-and-forget: a bookie never answers it.
* Every message class names its opcode (``OPCODE``) and is listed once, in ``Request`` or
  ``Response`` at the bottom: the registry everything else derives from (``REQUEST_TYPES``,
  ``RESPONSE_TYPES``); within a direction, opcodes are unique.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeAlias, get_args

from vellum.errors import EBADREQ
from vellum.frozen import builder
from vellum.proto.entry_lists import BytesLike as BytesLike
from vellum.proto.entry_lists import FrameEntries as FrameEntries
from vellum.proto.entry_lists import PackedEntries as PackedEntries

PROTOCOL_VERSION = 2
MASTER_KEY_LENGTH = 20
#: BookKeeper's nettyMaxFrameSizeBytes default (5 MiB)
DEFAULT_MAX_FRAME_SIZE = 5 * 1024 * 1024
#: A stored entry starts with ledgerId entryId lac length (format/entry.py ENTRY_HEADER_SIZE;
#: proto/ may not import format/, a test keeps the two equal).
MIN_ENTRY_SIZE = 32

# -- opcodes --------------------------------------------------------------------------------
# BookKeeper v2 (BookieProtocol): the byte layout of these frames is BookKeeper's.
OP_ADD = 1
OP_READ = 2
OP_BATCH_READ = 7
# Vellum's own operations. 3..6 are taken by v2 (AUTH, READ_LAC, WRITE_LAC, GET_BOOKIE_INFO,
# defined but sent over v3 by Java); Vellum's start at 64 so they can never collide with a
# future v2 opcode.
OP_LONG_POLL_READ_LAC = 64
OP_READ_LAC = 65
OP_WRITE_LAC = 66
OP_FORCE_LEDGER = 67
OP_LIST_ENTRIES = 68
OP_GET_BOOKIE_INFO = 69
OP_LEDGER_CLOSED = 70
OP_TRIM = 71
OP_READ_STRIDED = 72
#: BookKeeper's v3 START_TLS (OperationType 9) as a Vellum operation: upgrade the connection to
#: TLS after the (plaintext) answer
OP_START_TLS = 73
#: authenticate the connection (BookKeeper's AUTH: v2 opcode 3 / v3 OperationType 5, which carry
#: a protobuf ``AuthMessage{authPluginName, payload}``; Vellum carries the same two fields)
OP_AUTH = 74
#: trim a ledger and garbage-collect its ledger dir now, answered when the GC pass is done
#: (a named ledger's forced shrink)
OP_COLLECT = 75
#: response only: a request that could not be parsed or whose opcode is unknown
OP_ERROR = 127

OPCODE_NAMES: dict[int, str] = {
    OP_ADD: "ADD",
    OP_READ: "READ",
    OP_BATCH_READ: "BATCH_READ",
    OP_LONG_POLL_READ_LAC: "LONG_POLL_READ_LAC",
    OP_READ_LAC: "READ_LAC",
    OP_WRITE_LAC: "WRITE_LAC",
    OP_FORCE_LEDGER: "FORCE_LEDGER",
    OP_LIST_ENTRIES: "LIST_ENTRIES",
    OP_GET_BOOKIE_INFO: "GET_BOOKIE_INFO",
    OP_LEDGER_CLOSED: "LEDGER_CLOSED",
    OP_TRIM: "TRIM",
    OP_READ_STRIDED: "READ_STRIDED",
    OP_START_TLS: "START_TLS",
    OP_AUTH: "AUTH",
    OP_COLLECT: "COLLECT",
    OP_ERROR: "ERROR",
}

# -- flags (low 16 bits of the header; meaningful on v2 requests) ----------------------------
#: READ / BATCH_READ: fence the ledger before answering; the frame then carries the master key
FLAG_DO_FENCING = 0x1
#: ADD: a recovery add (allowed on a fenced ledger)
FLAG_RECOVERY_ADD = 0x2
#: serve ahead of normal traffic (recovery reads, LAC reads)
FLAG_HIGH_PRIORITY = 0x4


def header_int(opcode: int, flags: int = 0) -> int:
    """The packed header int ``(2 << 24) | (opcode << 16) | flags``."""
    return (PROTOCOL_VERSION << 24) | (opcode << 16) | flags


def split_header(header: int) -> tuple[int, int, int]:
    """``(version, opcode, flags)`` of a packed header int (read as unsigned 32 bits)."""
    return (header >> 24) & 0xFF, (header >> 16) & 0xFF, header & 0xFFFF


_ENTRY_IDS = struct.Struct(">qq")
#: ledgerId, entryId, lac: the first 24 bytes of a stored entry
_ADD_IDS = struct.Struct(">qqq")


# ===========================================================================================
# BookKeeper v2 frames


@dataclass(frozen=True, slots=True)
class AddRequest:
    """ADD (v2): store ``entry`` (a full stored entry, format/entry.py) under ``master_key``.

    The ledger and entry ids are not separate fields on the wire: they are read from the entry.
    """

    OPCODE: ClassVar[int] = OP_ADD

    master_key: BytesLike = field(repr=False)  # never in a log line or error message
    entry: BytesLike
    flags: int = 0

    @property
    def ledger_id(self) -> int:
        return int(_ENTRY_IDS.unpack_from(self.entry)[0])

    @property
    def entry_id(self) -> int:
        return int(_ENTRY_IDS.unpack_from(self.entry)[1])

    @property
    def is_recovery(self) -> bool:
        return bool(self.flags & FLAG_RECOVERY_ADD)


@dataclass(frozen=True, slots=True)
class AddResponse:
    """ADD response (v2)."""

    OPCODE: ClassVar[int] = OP_ADD

    status: int
    ledger_id: int
    entry_id: int


@dataclass(frozen=True, slots=True)
class ReadRequest:
    """READ (v2). ``entry_id == -1`` asks for the last entry (a v2 LAC read).

    With ``FLAG_DO_FENCING`` the bookie fences the ledger first and ``master_key`` is required;
    without it ``master_key`` must be ``None``.
    """

    OPCODE: ClassVar[int] = OP_READ

    ledger_id: int
    entry_id: int
    flags: int = 0
    master_key: BytesLike | None = field(default=None, repr=False)

    @property
    def is_fencing(self) -> bool:
        return bool(self.flags & FLAG_DO_FENCING)


@dataclass(frozen=True, slots=True)
class ReadResponse:
    """READ response (v2); ``entry`` is the stored entry, present only when ``status == EOK``."""

    OPCODE: ClassVar[int] = OP_READ

    status: int
    ledger_id: int
    entry_id: int
    entry: BytesLike = b""


@dataclass(frozen=True, slots=True)
class BatchReadRequest:
    """BATCH_READ (v2, BookKeeper 4.17): up to ``max_count`` entries / ``max_size`` bytes from
    ``start_entry_id``. ``master_key`` iff ``FLAG_DO_FENCING``, as for READ."""

    OPCODE: ClassVar[int] = OP_BATCH_READ

    ledger_id: int
    start_entry_id: int
    request_id: int
    max_count: int
    max_size: int
    flags: int = 0
    master_key: BytesLike | None = field(default=None, repr=False)

    @property
    def is_fencing(self) -> bool:
        return bool(self.flags & FLAG_DO_FENCING)


@dataclass(frozen=True, slots=True)
class BatchReadResponse:
    """BATCH_READ response (v2): consecutive stored entries from ``entry_id`` (the start id)."""

    OPCODE: ClassVar[int] = OP_BATCH_READ

    status: int
    ledger_id: int
    entry_id: int
    request_id: int
    entries: Sequence[BytesLike] = ()


# ===========================================================================================
# Vellum's own operations (request id right after the header)


@dataclass(frozen=True, slots=True)
class LongPollReadLacRequest:
    """Wait up to ``timeout_ms`` until the bookie's LAC for the ledger exceeds ``previous_lac``."""

    OPCODE: ClassVar[int] = OP_LONG_POLL_READ_LAC

    request_id: int
    ledger_id: int
    previous_lac: int
    timeout_ms: int


@dataclass(frozen=True, slots=True)
class LongPollReadLacResponse:
    """The explicit LAC body (may be empty) and the last stored entry (may be empty)."""

    OPCODE: ClassVar[int] = OP_LONG_POLL_READ_LAC

    request_id: int
    status: int
    ledger_id: int
    lac_body: BytesLike = b""
    last_entry: BytesLike = b""


@dataclass(frozen=True, slots=True)
class ReadLacRequest:
    """Read the explicit LAC body and last entry of a ledger, without waiting."""

    OPCODE: ClassVar[int] = OP_READ_LAC

    request_id: int
    ledger_id: int


@dataclass(frozen=True, slots=True)
class ReadLacResponse:
    """Same shape as :class:`LongPollReadLacResponse`."""

    OPCODE: ClassVar[int] = OP_READ_LAC

    request_id: int
    status: int
    ledger_id: int
    lac_body: BytesLike = b""
    last_entry: BytesLike = b""


@dataclass(frozen=True, slots=True)
class WriteLacRequest:
    """Store an explicit LAC (``lac_body`` is the digested LAC body of format/entry.py)."""

    OPCODE: ClassVar[int] = OP_WRITE_LAC

    request_id: int
    ledger_id: int
    lac: int
    master_key: BytesLike = field(repr=False)  # never in a log line or error message
    lac_body: BytesLike


@dataclass(frozen=True, slots=True)
class WriteLacResponse:
    OPCODE: ClassVar[int] = OP_WRITE_LAC

    request_id: int
    status: int
    ledger_id: int


@dataclass(frozen=True, slots=True)
class ForceLedgerRequest:
    """Answer once everything added to the ledger so far is durable on the bookie."""

    OPCODE: ClassVar[int] = OP_FORCE_LEDGER

    request_id: int
    ledger_id: int


@dataclass(frozen=True, slots=True)
class ForceLedgerResponse:
    OPCODE: ClassVar[int] = OP_FORCE_LEDGER

    request_id: int
    status: int
    ledger_id: int


@dataclass(frozen=True, slots=True)
class ListEntriesRequest:
    """Which entries of the ledger does the bookie hold?"""

    OPCODE: ClassVar[int] = OP_LIST_ENTRIES

    request_id: int
    ledger_id: int


@dataclass(frozen=True, slots=True)
class ListEntriesResponse:
    """The entry ids held, as sorted disjoint inclusive ranges ``((first, last), ...)``.

    Build ``ranges`` with :func:`entry_ranges`; iterate ids with :meth:`entry_ids`.
    """

    OPCODE: ClassVar[int] = OP_LIST_ENTRIES

    request_id: int
    status: int
    ledger_id: int
    ranges: tuple[tuple[int, int], ...] = ()

    def entry_ids(self) -> Iterator[int]:
        for first, last in self.ranges:
            yield from range(first, last + 1)

    @property
    def entry_count(self) -> int:
        """Number of entry ids held."""
        return sum(last - first + 1 for first, last in self.ranges)


def entry_ranges(entry_ids: Iterable[int]) -> tuple[tuple[int, int], ...]:
    """Compress entry ids (any order, duplicates allowed) into sorted disjoint inclusive ranges
    with no two ranges adjacent: ``[0, 1, 2, 5]`` -> ``((0, 2), (5, 5))``."""
    ranges: list[tuple[int, int]] = []
    first = last = None
    for entry_id in sorted(set(entry_ids)):
        if last is not None and entry_id == last + 1:
            last = entry_id
            continue
        if first is not None and last is not None:
            ranges.append((first, last))
        first = last = entry_id
    if first is not None and last is not None:
        ranges.append((first, last))
    return tuple(ranges)


@dataclass(frozen=True, slots=True)
class GetBookieInfoRequest:
    OPCODE: ClassVar[int] = OP_GET_BOOKIE_INFO

    request_id: int


@dataclass(frozen=True, slots=True)
class GetBookieInfoResponse:
    """Disk capacity and free space of the bookie's ledger dirs, in bytes."""

    OPCODE: ClassVar[int] = OP_GET_BOOKIE_INFO

    request_id: int
    status: int
    total_disk_capacity: int
    free_disk_space: int


@dataclass(frozen=True, slots=True)
class LedgerClosedNote:
    """Advisory: the writer closed the ledger (the bookie may finish it early). No response."""

    OPCODE: ClassVar[int] = OP_LEDGER_CLOSED

    request_id: int
    ledger_id: int


@dataclass(frozen=True, slots=True)
class TrimRequest:
    """Drop the ledger's entries below ``end_entry_id`` (named-ledger shrink with force)."""

    OPCODE: ClassVar[int] = OP_TRIM

    request_id: int
    ledger_id: int
    end_entry_id: int
    master_key: BytesLike = field(repr=False)  # never in a log line or error message


@dataclass(frozen=True, slots=True)
class TrimResponse:
    OPCODE: ClassVar[int] = OP_TRIM

    request_id: int
    status: int
    ledger_id: int


@dataclass(frozen=True, slots=True)
class CollectRequest:
    """TRIM the ledger below ``end_entry_id`` (0: trim nothing), seal the active entry logs
    holding its records, and run a garbage collection pass on the ledger dir(s) holding it;
    answered once a pass that started after the request is done (a forced shrink)."""

    OPCODE: ClassVar[int] = OP_COLLECT

    request_id: int
    ledger_id: int
    end_entry_id: int
    master_key: BytesLike = field(repr=False)  # never in a log line or error message


@dataclass(frozen=True, slots=True)
class CollectResponse:
    """``reclaimed_bytes``: what the pass freed in those dirs; ``garbage_bytes``: dead bytes it
    left there (logs above the compaction threshold, compaction suspended or disabled)."""

    OPCODE: ClassVar[int] = OP_COLLECT

    request_id: int
    status: int
    ledger_id: int
    reclaimed_bytes: int = 0
    garbage_bytes: int = 0


@dataclass(frozen=True, slots=True)
class StridedReadRequest:
    """Entries ``first, first + stride, first + 2 * stride, ...``: at most ``max_count`` of them
    and about ``max_size`` bytes (0 = no bound; the first entry always counts), stopping at the
    first one the bookie does not hold. A striped ledger (ensemble > write quorum) is read with
    one such request per bookie for the entries whose write set it heads (stride = ensemble
    size): BATCH_READ needs consecutive entries, which no bookie of a striped ledger holds."""

    OPCODE: ClassVar[int] = OP_READ_STRIDED

    request_id: int
    ledger_id: int
    first_entry_id: int
    stride: int
    max_count: int
    max_size: int


@dataclass(frozen=True, slots=True)
class StridedReadResponse:
    """The stored entries of a READ_STRIDED, in order (entries only with ``status == EOK``)."""

    OPCODE: ClassVar[int] = OP_READ_STRIDED

    request_id: int
    status: int
    ledger_id: int
    first_entry_id: int
    entries: Sequence[BytesLike] = ()


@dataclass(frozen=True, slots=True)
class StartTlsRequest:
    """Ask the bookie to upgrade this connection to TLS (BookKeeper's v3 START_TLS).

    The client sends it first on a new connection and nothing else until the answer; after an
    ``EOK`` answer the next bytes either way are the TLS handshake, and every later frame
    travels inside TLS."""

    OPCODE: ClassVar[int] = OP_START_TLS

    request_id: int


@dataclass(frozen=True, slots=True)
class StartTlsResponse:
    """``EOK``: the bookie starts the TLS handshake right after this frame; ``EBADREQ``: it
    does not offer TLS (as BookKeeper answers when TLS is not configured)."""

    OPCODE: ClassVar[int] = OP_START_TLS

    request_id: int
    status: int


#: the longest ``auth_plugin_name`` / ``AuthResponse.message`` (UTF-8 bytes) a frame may carry
MAX_AUTH_NAME = 255
MAX_AUTH_MESSAGE = 4096
#: ``AuthResponse.request_id`` of a bookie's unsolicited refusal notice (clients number from 1)
AUTH_NOTICE_ID = 0


@dataclass(frozen=True, slots=True)
class AuthRequest:
    """Authenticate this connection with the bookie's ``auth_plugin_name`` provider
    (``token``: ``payload`` is a signed token; ``tls``: empty payload, "check the identity of
    my client certificate"). Sent after START_TLS (if any) and before any other request."""

    OPCODE: ClassVar[int] = OP_AUTH

    request_id: int
    auth_plugin_name: str
    payload: BytesLike = field(default=b"", repr=False)  # a token: never in a log line


@dataclass(frozen=True, slots=True)
class AuthResponse:
    """``EOK``: authenticated and authorized, ``message`` names the principal; ``EUA``: refused,
    ``message`` says why, and the bookie closes the connection. With ``request_id ==
    AUTH_NOTICE_ID`` it is the notice a bookie sends before refusing a request on a connection
    that has not authenticated (then it closes)."""

    OPCODE: ClassVar[int] = OP_AUTH

    request_id: int
    status: int
    message: str = ""


@dataclass(frozen=True, slots=True)
class ErrorResponse:
    """Answer to a request that could not be parsed or has an unknown opcode/version.

    ``None`` marks an id the bookie could not recover from the bad frame. ``opcode`` is the
    request's opcode if its header was readable.
    """

    OPCODE: ClassVar[int] = OP_ERROR

    status: int
    request_id: int | None = None
    opcode: int | None = None
    ledger_id: int | None = None
    entry_id: int | None = None


# ===========================================================================================
# Pipelined ADDs decoded together (not a wire message of its own)


class AddBatch:
    """The ADD path's one batch type: pipelined adds as columns, one item per add, in arrival
    order. The server's ``FrameDecoder(batch_adds=True)`` decodes the consecutive well-formed v2
    ADD frames of one read straight into one; the bookie, its write caches and its journals
    take the same object (``Bookie.add_batch``, ``LedgerStorage.write_batch``,
    ``Journal.log_batch``), narrowed with ``take`` only where some adds were refused or the
    batch spans several ledger dirs or journals. Nothing converts it to rows and back.

    Columns: ``entries`` (stored entries, format/entry.py: ``ledgerId entryId lac length ...``),
    ``keys`` (master keys), ``flags`` (wire flags), and the ids read once from each entry's
    first 24 bytes: ``ledger_ids``, ``entry_ids``, ``lacs``.

    Invariants (what every holder may assume; nothing here judges an add):
    - the columns have equal lengths, and ``ledger_ids[i]``, ``entry_ids[i]``, ``lacs[i]`` are
      the first 24 bytes of ``entries[i]`` when it holds a whole ``MIN_ENTRY_SIZE`` header
      (always, for adds decoded from the wire: a shorter ADD frame is a ``BadFrame``); -1
      otherwise, an entry only ``of_entries`` lets in and the bookie's admission refuses;
    - every entry is ``bytes`` or a read-only ``memoryview`` nobody writes again (the decoder
      copies out of its receive buffer once; ``of_entries`` copies other buffers), so a write
      cache may keep it as it is;
    - whether an add is *valid* (its size, ids, ledger state, master key, fence, read-only
      bookie) is decided once, by the bookie's admission (``Bookie.add_batch``); a batch that
      reaches ledger storage or a journal holds admitted adds only.
    """

    __slots__ = ("entries", "entry_ids", "flags", "keys", "lacs", "ledger_ids")

    def __init__(self) -> None:
        self.entries: list[bytes | memoryview] = []
        self.keys: list[bytes] = []
        self.flags: list[int] = []
        self.ledger_ids: list[int] = []
        self.entry_ids: list[int] = []
        self.lacs: list[int] = []

    @classmethod
    def of_requests(cls, requests: Iterable[AddRequest]) -> AddBatch:
        """The batch of single ``AddRequest``s (frames decoded one by one)."""
        return cls.of_entries((r.entry, bytes(r.master_key), r.flags) for r in requests)

    @classmethod
    def of_entries(cls, adds: Iterable[tuple[BytesLike, BytesLike, int | bool]]) -> AddBatch:
        """The batch of ``(entry, master key, flags)`` rows, as tools and tests hand adds over
        (``True``/``False`` for flags: a recovery add or not). Copies an entry only if it is
        neither ``bytes`` nor a read-only view (the ownership invariant)."""
        batch = cls()
        unpack = _ADD_IDS.unpack_from
        for entry, key, flags in adds:
            if not (type(entry) is bytes or (isinstance(entry, memoryview) and entry.readonly)):
                entry = bytes(entry)
            if len(entry) >= MIN_ENTRY_SIZE:
                ledger_id, entry_id, lac = unpack(entry)
            else:
                ledger_id = entry_id = lac = -1
            batch.append(entry, bytes(key), FLAG_RECOVERY_ADD if flags is True else int(flags),
                         ledger_id, entry_id, lac)
        return batch

    @classmethod
    def concat(cls, batches: Sequence[AddBatch]) -> AddBatch:
        """One batch of several, in order (the add thread takes the batches queued meanwhile
        together)."""
        if len(batches) == 1:
            return batches[0]
        out = cls()
        for b in batches:
            out.entries += b.entries
            out.keys += b.keys
            out.flags += b.flags
            out.ledger_ids += b.ledger_ids
            out.entry_ids += b.entry_ids
            out.lacs += b.lacs
        return out

    def append(self, entry: bytes | memoryview, key: bytes, flags: int, ledger_id: int, entry_id: int,
               lac: int) -> None:
        self.entries.append(entry)
        self.keys.append(key)
        self.flags.append(flags)
        self.ledger_ids.append(ledger_id)
        self.entry_ids.append(entry_id)
        self.lacs.append(lac)

    def take(self, indices: Sequence[int]) -> AddBatch:
        """The adds at ``indices`` (in that order), as a batch of their own."""
        out = AddBatch()
        entries, keys, flags = self.entries, self.keys, self.flags
        lids, eids, lacs = self.ledger_ids, self.entry_ids, self.lacs
        out.entries = [entries[i] for i in indices]
        out.keys = [keys[i] for i in indices]
        out.flags = [flags[i] for i in indices]
        out.ledger_ids = [lids[i] for i in indices]
        out.entry_ids = [eids[i] for i in indices]
        out.lacs = [lacs[i] for i in indices]
        return out

    def __len__(self) -> int:
        return len(self.entries)

    def recovery(self) -> list[bool]:
        """Per add: is it a recovery add (``FLAG_RECOVERY_ADD``)?"""
        if not any(self.flags):
            return [False] * len(self.flags)
        return [bool(f & FLAG_RECOVERY_ADD) for f in self.flags]

    def requests(self) -> list[AddRequest]:
        """The same adds as single ``AddRequest``s (the session's slow paths)."""
        return [AddRequest(k, e, f) for k, e, f in zip(self.keys, self.entries, self.flags)]

    def __repr__(self) -> str:
        return f"AddBatch({len(self)} adds)"


class AddAnswers:
    """Pipelined ADD answers decoded together, as columns (the client's side of ``AddBatch``):
    a client's ``FrameDecoder(batch_adds=True)`` decodes the consecutive well-formed v2 ADD
    responses of one read straight into one, so a connection matches a thousand answers
    without building a thousand ``AddResponse`` objects. Not a wire message of its own: each
    item is exactly the ``AddResponse(statuses[i], ledger_ids[i], entry_ids[i])`` its frame
    holds (``responses`` gives them as such).

    Invariant: the three columns have equal lengths, in arrival order.
    """

    __slots__ = ("entry_ids", "ledger_ids", "statuses")

    def __init__(self) -> None:
        self.statuses: list[int] = []
        self.ledger_ids: list[int] = []
        self.entry_ids: list[int] = []

    def __len__(self) -> int:
        return len(self.statuses)

    def responses(self) -> list[AddResponse]:
        """The same answers as single ``AddResponse`` messages."""
        return [AddResponse(s, lid, eid) for s, lid, eid in zip(self.statuses, self.ledger_ids, self.entry_ids)]

    def __repr__(self) -> str:
        return f"AddAnswers({len(self)} answers)"


# ===========================================================================================
# A well-framed frame whose contents cannot be used


@dataclass(frozen=True, slots=True)
class BadFrame:
    """A frame with intact framing but an unknown version/opcode or a malformed body.

    Yielded by the decoder instead of raising, so a bookie can answer (see
    :meth:`error_response`) and keep serving the connection. Ids are ``None`` when they could
    not be recovered. ``status`` is the wire status to answer: ``EBADVERSION`` for an
    unsupported protocol version, ``EBADREQ`` otherwise.
    """

    reason: str
    status: int = EBADREQ
    version: int | None = None
    opcode: int | None = None
    flags: int = 0
    request_id: int | None = None
    ledger_id: int | None = None
    entry_id: int | None = None

    def error_response(self) -> Response | None:
        """The response a bookie sends for this bad request frame (``None``: send nothing).

        A v2 op whose ids were recovered gets its own response type with the error status, so
        a v2 client (matching by op, ledger, entry) can fail exactly that request; every other
        bad frame gets an :class:`ErrorResponse`. A bad LEDGER_CLOSED note gets nothing, as a
        good one would.
        """
        if self.version == PROTOCOL_VERSION:
            if self.opcode == OP_LEDGER_CLOSED:
                return None
            if self.ledger_id is not None and self.entry_id is not None:
                if self.opcode == OP_ADD:
                    return AddResponse(self.status, self.ledger_id, self.entry_id)
                if self.opcode == OP_READ:
                    return ReadResponse(self.status, self.ledger_id, self.entry_id)
                if self.opcode == OP_BATCH_READ and self.request_id is not None:
                    return BatchReadResponse(self.status, self.ledger_id, self.entry_id, self.request_id)
        return ErrorResponse(self.status, self.request_id, self.opcode, self.ledger_id, self.entry_id)


def refusal_for(msg: Any, status: int) -> Response | None:
    """The answer refusing the request ``msg`` with ``status``: a v2 op gets its own response
    type (a v2 client matches those), a Vellum op an ``ErrorResponse`` with its ids, a bad frame
    its ``error_response``; a note gets none."""
    kind = type(msg)
    if kind is AddRequest:
        return AddResponse(status, msg.ledger_id, msg.entry_id)
    if kind is ReadRequest:
        return ReadResponse(status, msg.ledger_id, msg.entry_id)
    if kind is BatchReadRequest:
        return BatchReadResponse(status, msg.ledger_id, msg.start_entry_id, msg.request_id)
    if kind is LedgerClosedNote:
        return None
    if kind is BadFrame:
        return msg.error_response()  # type: ignore[no-any-return]
    return ErrorResponse(status, getattr(msg, "request_id", None), kind.OPCODE, getattr(msg, "ledger_id", None))


# ===========================================================================================
# The registry of wire messages: the two unions below are the one list of message types. The
# runtime tuples are derived from them; the codec builds its opcode tables from the tuples
# (and refuses to load if it lacks a layout for one), and the tests draw their examples from
# them, so a new message is added here, given its OPCODE, and nowhere else in a list.

Request: TypeAlias = (
    AddRequest
    | ReadRequest
    | BatchReadRequest
    | LongPollReadLacRequest
    | ReadLacRequest
    | WriteLacRequest
    | ForceLedgerRequest
    | ListEntriesRequest
    | GetBookieInfoRequest
    | LedgerClosedNote
    | TrimRequest
    | StridedReadRequest
    | StartTlsRequest
    | AuthRequest
    | CollectRequest
)
Response: TypeAlias = (
    AddResponse
    | ReadResponse
    | BatchReadResponse
    | LongPollReadLacResponse
    | ReadLacResponse
    | WriteLacResponse
    | ForceLedgerResponse
    | ListEntriesResponse
    | GetBookieInfoResponse
    | TrimResponse
    | StridedReadResponse
    | StartTlsResponse
    | AuthResponse
    | CollectResponse
    | ErrorResponse
)
Message: TypeAlias = Request | Response

#: Every message a client sends (decoded by a bookie), in opcode order.
REQUEST_TYPES: tuple[type[Request], ...] = get_args(Request)
#: Every message a bookie sends (decoded by a client), in opcode order.
RESPONSE_TYPES: tuple[type[Response], ...] = get_args(Response)
MESSAGE_TYPES: tuple[type[Message], ...] = REQUEST_TYPES + RESPONSE_TYPES
#: BookKeeper v2's frames (byte for byte): no request id, answers matched by (op, ledger, entry).
V2_OPCODES = frozenset({OP_ADD, OP_READ, OP_BATCH_READ})

# The messages made once per read (the read requests a bookie decodes, the answers a client
# decodes, a strided read's answer a bookie makes): positional constructors taking every field
# in field order, at about half the cost of the frozen classes' own ``__init__``
# (``vellum.frozen``). A client encodes its read requests from their fields (``codec``).
new_read_request = builder(ReadRequest)
new_read_response = builder(ReadResponse)
new_read_lac_response = builder(ReadLacResponse)
new_strided_read_request = builder(StridedReadRequest)
new_strided_read_response = builder(StridedReadResponse)
