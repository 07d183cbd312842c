"""Encoding messages into frames and decoding a byte stream back into messages (sans-IO).

Responsibility: the byte layout of every frame of docs/protocol.md, and the framing of a
stream of them. Pure: callers own sockets and buffers.

Frame: ``int32 frameLen`` then ``frameLen`` bytes of body; the body starts with the header int
``(version << 24) | (opcode << 16) | flags`` (version 2). Every integer is big-endian.

Body layouts (after the 4-byte header; ``key`` = 20-byte master key; docs/protocol.md has
the full tables)::

    op   request                                              response
    1    key entry                                            rc ledger entry
    2    ledger entry [key iff DO_FENCING]                    rc ledger entry [entry iff rc=EOK]
    7    ledger start reqId int:maxCount maxSize [key]        rc ledger start reqId {int:len entry}*
    64   reqId ledger previousLAC timeoutMs                   reqId rc ledger int:n lacBody int:m lastEntry
    65   reqId ledger                                         (as 64)
    66   reqId ledger lac key int:n lacBody                   reqId rc ledger
    67   reqId ledger                                         reqId rc ledger
    68   reqId ledger                                         reqId rc ledger int:n {first last}*n
    69   reqId                                                reqId rc totalDiskCapacity freeDiskSpace
    70   reqId ledger                                         (none: fire and forget)
    71   reqId ledger endEntryId key                          reqId rc ledger
    72   reqId ledger first int:stride int:maxCount maxSize   reqId rc ledger first {int:len entry}*
    73   reqId                                                reqId rc   (START_TLS; TLS follows EOK)
    74   reqId int:n pluginName int:m payload                 reqId rc int:n message (AUTH; UTF-8 texts)
    127  -                                                    reqId rc int:opcode ledger entry (flags =
                                                              mask of the known ids)

Fields are int64 unless marked ``int:`` (int32); ``rc`` is int32.

Invariants:
* ``FrameDecoder`` yields the same messages whatever the chunking of the stream, fed with
  ``feed`` or read into through ``get_buffer`` / ``buffer_updated``.
* Framing errors (negative length, length above ``max_frame_size``) raise
  :class:`~vellum.errors.FramingError`: the stream position is lost, the connection must close;
  the decoder stays failed.
* A well-framed body that cannot be used (unsupported version, unknown opcode, wrong size,
  inconsistent lengths) yields a :class:`BadFrame`; the stream stays in sync.
* Decoded byte fields are ``bytes`` copied exactly once out of the fed data; a message never
  holds a view of the caller's buffer, so receive buffers may be reused after ``feed`` returns.
  The exception is a frame the decoder received into a buffer of its own (``BIG_FRAME``): its
  entry payloads are views of that buffer, which nothing else ever writes.
* ``encode_parts`` never copies an entry payload; ``encode`` copies it once.
* There is an encoder and a decoder for exactly the message types of the registry
  (``messages.REQUEST_TYPES`` / ``RESPONSE_TYPES``), checked when the module loads; the opcode
  tables each side decodes with are built from the registry.

Size: this module is close to 1000 lines, and that size is earned. It is the byte layout of every
frame, both ways: an encoder and a decoder per message type (30 of them), each a few lines
against the struct table above, plus the stream framer (``FrameDecoder``) they share. Splitting
it by frame would scatter that table, splitting encoders from decoders would separate the two
halves of each layout that must be read together, and the framer's zero-copy ownership rules
(views only of buffers it owns) hang on the decoders' ``owned`` variants. What is not layout
(the messages, the registry) lives in ``messages.py``.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeAlias

from vellum.errors import EBADVERSION, EOK, FramingError, IncorrectParameterError
from vellum.proto.messages import (
    FLAG_DO_FENCING,
    MASTER_KEY_LENGTH,
    MAX_AUTH_MESSAGE,
    MAX_AUTH_NAME,
    MESSAGE_TYPES,
    MIN_ENTRY_SIZE,
    OP_ADD,
    OP_AUTH,
    OP_BATCH_READ,
    OP_COLLECT,
    OP_ERROR,
    OP_FORCE_LEDGER,
    OP_GET_BOOKIE_INFO,
    OP_LEDGER_CLOSED,
    OP_LIST_ENTRIES,
    OP_LONG_POLL_READ_LAC,
    OP_READ,
    OP_READ_LAC,
    OP_READ_STRIDED,
    OP_START_TLS,
    OP_TRIM,
    OP_WRITE_LAC,
    OPCODE_NAMES,
    PROTOCOL_VERSION,
    REQUEST_TYPES,
    RESPONSE_TYPES,
    AddBatch,
    AddRequest,
    AddResponse,
    AuthRequest,
    AuthResponse,
    BadFrame,
    BatchReadRequest,
    BatchReadResponse,
    BytesLike,
    CollectRequest,
    CollectResponse,
    ErrorResponse,
    ForceLedgerRequest,
    ForceLedgerResponse,
    GetBookieInfoRequest,
    GetBookieInfoResponse,
    LedgerClosedNote,
    ListEntriesRequest,
    ListEntriesResponse,
    LongPollReadLacRequest,
    LongPollReadLacResponse,
    Message,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    StartTlsRequest,
    StartTlsResponse,
    StridedReadRequest,
    StridedReadResponse,
    TrimRequest,
    TrimResponse,
    WriteLacRequest,
    WriteLacResponse,
)

Side: TypeAlias = Literal["server", "client"]
Decoded: TypeAlias = Message | BadFrame | AddBatch

_V = PROTOCOL_VERSION << 24

# Structs. Encoders pack the frame length and header together with the fixed fields;
# decoders read the fixed fields from offset 4 (just after the header, already parsed).
_INT = struct.Struct(">i")
_HEADER = struct.Struct(">I")
_LONG = struct.Struct(">q")
_ENTRY_IDS = struct.Struct(">qq")
_RANGE = struct.Struct(">qq")

_ADD_REQ = struct.Struct(">iI20s")  # + entry
#: an ADD frame's length, header, key and the entry's ledger id, entry id and LAC (batch decoding)
_ADD_FRAME = struct.Struct(">iI20sqqq")
_ADD_FRAME_MIN_BODY = 4 + MASTER_KEY_LENGTH + MIN_ENTRY_SIZE
_ADD_HEADER_MASK = 0xFFFF0000
_ADD_HEADER = _V | (OP_ADD << 16)
_ADD_RESP = struct.Struct(">iIiqq")
_READ_REQ = struct.Struct(">iIqq")
_READ_REQ_FENCE = struct.Struct(">iIqq20s")
_READ_RESP = _ADD_RESP  # + entry iff rc == EOK
_BATCH_REQ = struct.Struct(">iIqqqiq")
_BATCH_REQ_FENCE = struct.Struct(">iIqqqiq20s")
_BATCH_RESP = struct.Struct(">iIiqqq")  # + repeated [int len][entry]

_REQ_LEDGER = struct.Struct(">iIqq")  # requestId, ledgerId
_LP_READ_LAC_REQ = struct.Struct(">iIqqqq")  # requestId, ledgerId, previousLAC, timeoutMs
_LAC_RESP = struct.Struct(">iIqiqi")  # requestId, rc, ledgerId, lacLen + lac + [int len][entry]
_WRITE_LAC_REQ = struct.Struct(">iIqqq20si")  # requestId, ledgerId, lac, masterKey, bodyLen + body
_RESP_LEDGER = struct.Struct(">iIqiq")  # requestId, rc, ledgerId
_LIST_RESP = struct.Struct(">iIqiqi")  # requestId, rc, ledgerId, rangeCount + ranges
_INFO_REQ = struct.Struct(">iIq")
_INFO_RESP = struct.Struct(">iIqiqq")
_TRIM_REQ = struct.Struct(">iIqqq20s")
_COLLECT_REQ = _TRIM_REQ  # requestId, ledgerId, endEntryId, masterKey
_COLLECT_RESP = struct.Struct(">iIqiqqq")  # requestId, rc, ledgerId, reclaimedBytes, garbageBytes
_ERROR_RESP = struct.Struct(">iIqiiqq")  # requestId, rc, opcode, ledgerId, entryId
_STRIDED_REQ = struct.Struct(">iIqqqiiq")  # requestId, ledgerId, first, int stride, int count, maxSize
_STRIDED_RESP = struct.Struct(">iIqiqq")  # requestId, rc, ledgerId, first + repeated [int len][entry]
_START_TLS_REQ = _INFO_REQ  # requestId
_START_TLS_RESP = struct.Struct(">iIqi")  # requestId, rc
_AUTH_REQ = struct.Struct(">iIqi")  # requestId, nameLen + name + [int len][payload]
_AUTH_RESP = struct.Struct(">iIqii")  # requestId, rc, messageLen + message


def _body(frame: struct.Struct) -> struct.Struct:
    """The decoding twin of an encoding struct: the same fields without the frame length."""
    assert frame.format.startswith(">iI")
    return struct.Struct(">" + frame.format[2:])


# Decoding structs start at the header int (offset 0 of the body).
_ADD_RESP_B = _body(_ADD_RESP)
_BATCH_REQ_B = _body(_BATCH_REQ)
_BATCH_REQ_FENCE_B = _body(_BATCH_REQ_FENCE)
_BATCH_RESP_B = _body(_BATCH_RESP)
_ERROR_RESP_B = _body(_ERROR_RESP)
_INFO_REQ_B = _body(_INFO_REQ)
_INFO_RESP_B = _body(_INFO_RESP)
_LAC_RESP_B = _body(_LAC_RESP)
_LIST_RESP_B = _body(_LIST_RESP)
_LP_READ_LAC_REQ_B = _body(_LP_READ_LAC_REQ)
_READ_REQ_FENCE_B = _body(_READ_REQ_FENCE)
_READ_RESP_B = _body(_READ_RESP)
_REQ_LEDGER_B = _body(_REQ_LEDGER)
_RESP_LEDGER_B = _body(_RESP_LEDGER)
_TRIM_REQ_B = _body(_TRIM_REQ)
_COLLECT_RESP_B = _body(_COLLECT_RESP)
_WRITE_LAC_REQ_B = _body(_WRITE_LAC_REQ)
_STRIDED_REQ_B = _body(_STRIDED_REQ)
_STRIDED_RESP_B = _body(_STRIDED_RESP)
_START_TLS_RESP_B = _body(_START_TLS_RESP)
_AUTH_REQ_B = _body(_AUTH_REQ)
_AUTH_RESP_B = _body(_AUTH_RESP)

# Header flags of an ERROR response: which of its ids are known.
ERROR_HAS_REQUEST_ID = 0x1
ERROR_HAS_OPCODE = 0x2
ERROR_HAS_LEDGER_ID = 0x4
ERROR_HAS_ENTRY_ID = 0x8
_ERROR_MASK = ERROR_HAS_REQUEST_ID | ERROR_HAS_OPCODE | ERROR_HAS_LEDGER_ID | ERROR_HAS_ENTRY_ID


# ===========================================================================================
# Encoding


def _flags(flags: int) -> int:
    if flags & ~0xFFFF:
        raise IncorrectParameterError(f"header flags {flags:#x} do not fit in 16 bits")
    return flags


def _key(master_key: BytesLike | None, what: str) -> BytesLike:
    # struct's "20s" silently pads or truncates: check the length ourselves.
    if master_key is None or len(master_key) != MASTER_KEY_LENGTH:
        got = "none" if master_key is None else f"{len(master_key)} bytes"
        raise IncorrectParameterError(f"{what}: master key must be {MASTER_KEY_LENGTH} bytes, got {got}")
    return master_key


def _enc_add_req(m: AddRequest) -> list[BytesLike]:
    entry = m.entry
    if len(entry) < MIN_ENTRY_SIZE:
        raise IncorrectParameterError(f"ADD: entry of {len(entry)} bytes is shorter than its header")
    head = _ADD_REQ.pack(
        4 + MASTER_KEY_LENGTH + len(entry), _V | (OP_ADD << 16) | _flags(m.flags), _key(m.master_key, "ADD")
    )
    return [head, entry]


def _enc_add_resp(m: AddResponse) -> list[BytesLike]:
    return [_ADD_RESP.pack(24, _V | (OP_ADD << 16), m.status, m.ledger_id, m.entry_id)]


def _enc_read_req(m: ReadRequest) -> list[BytesLike]:
    header = _V | (OP_READ << 16) | _flags(m.flags)
    if m.flags & FLAG_DO_FENCING:
        return [_READ_REQ_FENCE.pack(40, header, m.ledger_id, m.entry_id, _key(m.master_key, "fencing READ"))]
    if m.master_key is not None:
        raise IncorrectParameterError("READ: a master key is only sent with FLAG_DO_FENCING")
    return [_READ_REQ.pack(20, header, m.ledger_id, m.entry_id)]


def _enc_read_resp(m: ReadResponse) -> list[BytesLike]:
    entry = m.entry
    if m.status != EOK and len(entry):
        raise IncorrectParameterError("READ response: an entry is only sent with EOK")
    head = _READ_RESP.pack(24 + len(entry), _V | (OP_READ << 16), m.status, m.ledger_id, m.entry_id)
    return [head, entry] if len(entry) else [head]


def _enc_batch_req(m: BatchReadRequest) -> list[BytesLike]:
    header = _V | (OP_BATCH_READ << 16) | _flags(m.flags)
    fields = (m.ledger_id, m.start_entry_id, m.request_id, m.max_count, m.max_size)
    if m.flags & FLAG_DO_FENCING:
        return [_BATCH_REQ_FENCE.pack(60, header, *fields, _key(m.master_key, "fencing BATCH_READ"))]
    if m.master_key is not None:
        raise IncorrectParameterError("BATCH_READ: a master key is only sent with FLAG_DO_FENCING")
    return [_BATCH_REQ.pack(40, header, *fields)]


def _enc_batch_resp(m: BatchReadResponse) -> list[BytesLike]:
    if m.status != EOK and m.entries:
        raise IncorrectParameterError("BATCH_READ response: entries are only sent with EOK")
    parts: list[BytesLike] = [b""]
    size = 32
    for entry in m.entries:
        parts.append(_INT.pack(len(entry)))
        parts.append(entry)
        size += 4 + len(entry)
    parts[0] = _BATCH_RESP.pack(
        size, _V | (OP_BATCH_READ << 16), m.status, m.ledger_id, m.entry_id, m.request_id
    )
    return parts


def _enc_lp_read_lac_req(m: LongPollReadLacRequest) -> list[BytesLike]:
    return [
        _LP_READ_LAC_REQ.pack(
            36, _V | (OP_LONG_POLL_READ_LAC << 16), m.request_id, m.ledger_id, m.previous_lac, m.timeout_ms
        )
    ]


def _lac_resp(opcode: int, m: LongPollReadLacResponse | ReadLacResponse) -> list[BytesLike]:
    lac_body, last_entry = m.lac_body, m.last_entry
    size = 32 + len(lac_body) + len(last_entry)
    head = _LAC_RESP.pack(size, _V | (opcode << 16), m.request_id, m.status, m.ledger_id, len(lac_body))
    # The LAC body is small: join it with the fixed fields; the entry goes out as it is.
    return [head + lac_body + _INT.pack(len(last_entry)), last_entry]


def _enc_lp_read_lac_resp(m: LongPollReadLacResponse) -> list[BytesLike]:
    return _lac_resp(OP_LONG_POLL_READ_LAC, m)


def _enc_read_lac_resp(m: ReadLacResponse) -> list[BytesLike]:
    return _lac_resp(OP_READ_LAC, m)


def _req_ledger(opcode: int, request_id: int, ledger_id: int) -> list[BytesLike]:
    return [_REQ_LEDGER.pack(20, _V | (opcode << 16), request_id, ledger_id)]


def _resp_ledger(opcode: int, request_id: int, status: int, ledger_id: int) -> list[BytesLike]:
    return [_RESP_LEDGER.pack(24, _V | (opcode << 16), request_id, status, ledger_id)]


def _enc_write_lac_req(m: WriteLacRequest) -> list[BytesLike]:
    body = m.lac_body
    head = _WRITE_LAC_REQ.pack(
        52 + len(body),
        _V | (OP_WRITE_LAC << 16),
        m.request_id,
        m.ledger_id,
        m.lac,
        _key(m.master_key, "WRITE_LAC"),
        len(body),
    )
    return [head + body]


def _enc_list_resp(m: ListEntriesResponse) -> list[BytesLike]:
    ranges = m.ranges
    head = _LIST_RESP.pack(
        28 + 16 * len(ranges), _V | (OP_LIST_ENTRIES << 16), m.request_id, m.status, m.ledger_id, len(ranges)
    )
    previous = None
    out = bytearray(head)
    for first, last in ranges:
        if first > last or (previous is not None and first <= previous):
            raise IncorrectParameterError(f"LIST_ENTRIES: ranges must be sorted and disjoint: {ranges!r}")
        out += _RANGE.pack(first, last)
        previous = last
    return [bytes(out)]


def _enc_trim_req(m: TrimRequest) -> list[BytesLike]:
    return [
        _TRIM_REQ.pack(
            48,
            _V | (OP_TRIM << 16),
            m.request_id,
            m.ledger_id,
            m.end_entry_id,
            _key(m.master_key, "TRIM"),
        )
    ]


def _enc_collect_req(m: CollectRequest) -> list[BytesLike]:
    return [
        _COLLECT_REQ.pack(
            48, _V | (OP_COLLECT << 16), m.request_id, m.ledger_id, m.end_entry_id, _key(m.master_key, "COLLECT")
        )
    ]


def _enc_collect_resp(m: CollectResponse) -> list[BytesLike]:
    return [
        _COLLECT_RESP.pack(
            40, _V | (OP_COLLECT << 16), m.request_id, m.status, m.ledger_id, m.reclaimed_bytes, m.garbage_bytes
        )
    ]


def _enc_error_resp(m: ErrorResponse) -> list[BytesLike]:
    mask = 0
    if m.request_id is not None:
        mask |= ERROR_HAS_REQUEST_ID
    if m.opcode is not None:
        mask |= ERROR_HAS_OPCODE
    if m.ledger_id is not None:
        mask |= ERROR_HAS_LEDGER_ID
    if m.entry_id is not None:
        mask |= ERROR_HAS_ENTRY_ID
    return [
        _ERROR_RESP.pack(
            36,
            _V | (OP_ERROR << 16) | mask,
            m.request_id if m.request_id is not None else -1,
            m.status,
            m.opcode if m.opcode is not None else -1,
            m.ledger_id if m.ledger_id is not None else -1,
            m.entry_id if m.entry_id is not None else -1,
        )
    ]


def _enc_read_lac_req(m: ReadLacRequest) -> list[BytesLike]:
    return _req_ledger(OP_READ_LAC, m.request_id, m.ledger_id)


def _enc_write_lac_resp(m: WriteLacResponse) -> list[BytesLike]:
    return _resp_ledger(OP_WRITE_LAC, m.request_id, m.status, m.ledger_id)


def _enc_force_req(m: ForceLedgerRequest) -> list[BytesLike]:
    return _req_ledger(OP_FORCE_LEDGER, m.request_id, m.ledger_id)


def _enc_force_resp(m: ForceLedgerResponse) -> list[BytesLike]:
    return _resp_ledger(OP_FORCE_LEDGER, m.request_id, m.status, m.ledger_id)


def _enc_list_req(m: ListEntriesRequest) -> list[BytesLike]:
    return _req_ledger(OP_LIST_ENTRIES, m.request_id, m.ledger_id)


def _enc_info_req(m: GetBookieInfoRequest) -> list[BytesLike]:
    return [_INFO_REQ.pack(12, _V | (OP_GET_BOOKIE_INFO << 16), m.request_id)]


def _enc_info_resp(m: GetBookieInfoResponse) -> list[BytesLike]:
    return [
        _INFO_RESP.pack(
            32,
            _V | (OP_GET_BOOKIE_INFO << 16),
            m.request_id,
            m.status,
            m.total_disk_capacity,
            m.free_disk_space,
        )
    ]


def _enc_ledger_closed(m: LedgerClosedNote) -> list[BytesLike]:
    return _req_ledger(OP_LEDGER_CLOSED, m.request_id, m.ledger_id)


def _enc_trim_resp(m: TrimResponse) -> list[BytesLike]:
    return _resp_ledger(OP_TRIM, m.request_id, m.status, m.ledger_id)


def _enc_strided_req(m: StridedReadRequest) -> list[BytesLike]:
    if m.stride < 1 or m.max_count < 1:
        raise IncorrectParameterError(f"READ_STRIDED: stride {m.stride} and count {m.max_count} must be >= 1")
    return [_STRIDED_REQ.pack(44, _V | (OP_READ_STRIDED << 16), m.request_id, m.ledger_id, m.first_entry_id,
                              m.stride, m.max_count, m.max_size)]


def _enc_strided_resp(m: StridedReadResponse) -> list[BytesLike]:
    if m.status != EOK and m.entries:
        raise IncorrectParameterError("READ_STRIDED response: entries are only sent with EOK")
    parts: list[BytesLike] = [b""]
    size = 32
    for entry in m.entries:
        parts.append(_INT.pack(len(entry)))
        parts.append(entry)
        size += 4 + len(entry)
    parts[0] = _STRIDED_RESP.pack(size, _V | (OP_READ_STRIDED << 16), m.request_id, m.status, m.ledger_id,
                                  m.first_entry_id)
    return parts


def _enc_start_tls_req(m: StartTlsRequest) -> list[BytesLike]:
    return [_START_TLS_REQ.pack(12, _V | (OP_START_TLS << 16), m.request_id)]


def _enc_start_tls_resp(m: StartTlsResponse) -> list[BytesLike]:
    return [_START_TLS_RESP.pack(16, _V | (OP_START_TLS << 16), m.request_id, m.status)]


def _utf8(text: str, limit: int, what: str) -> bytes:
    data = text.encode("utf-8")
    if len(data) > limit:
        raise IncorrectParameterError(f"AUTH {what} of {len(data)} bytes exceeds {limit}")
    return data


def _enc_auth_req(m: AuthRequest) -> list[BytesLike]:
    name = _utf8(m.auth_plugin_name, MAX_AUTH_NAME, "plugin name")
    payload = m.payload
    return [_AUTH_REQ.pack(20 + len(name) + len(payload), _V | (OP_AUTH << 16), m.request_id, len(name)),
            name, _INT.pack(len(payload)), payload]


def _enc_auth_resp(m: AuthResponse) -> list[BytesLike]:
    message = _utf8(m.message, MAX_AUTH_MESSAGE, "message")
    return [_AUTH_RESP.pack(20 + len(message), _V | (OP_AUTH << 16), m.request_id, m.status, len(message)), message]


# Keyed by exact type: messages are final dataclasses, and a dict lookup beats isinstance chains.
_ENCODERS: dict[type[Any], Callable[[Any], list[BytesLike]]] = {
    AddRequest: _enc_add_req,
    AddResponse: _enc_add_resp,
    ReadRequest: _enc_read_req,
    ReadResponse: _enc_read_resp,
    BatchReadRequest: _enc_batch_req,
    BatchReadResponse: _enc_batch_resp,
    LongPollReadLacRequest: _enc_lp_read_lac_req,
    LongPollReadLacResponse: _enc_lp_read_lac_resp,
    ReadLacRequest: _enc_read_lac_req,
    ReadLacResponse: _enc_read_lac_resp,
    WriteLacRequest: _enc_write_lac_req,
    WriteLacResponse: _enc_write_lac_resp,
    ForceLedgerRequest: _enc_force_req,
    ForceLedgerResponse: _enc_force_resp,
    ListEntriesRequest: _enc_list_req,
    ListEntriesResponse: _enc_list_resp,
    GetBookieInfoRequest: _enc_info_req,
    GetBookieInfoResponse: _enc_info_resp,
    LedgerClosedNote: _enc_ledger_closed,
    TrimRequest: _enc_trim_req,
    StridedReadRequest: _enc_strided_req,
    StridedReadResponse: _enc_strided_resp,
    TrimResponse: _enc_trim_resp,
    StartTlsRequest: _enc_start_tls_req,
    StartTlsResponse: _enc_start_tls_resp,
    AuthRequest: _enc_auth_req,
    AuthResponse: _enc_auth_resp,
    CollectRequest: _enc_collect_req,
    CollectResponse: _enc_collect_resp,
    ErrorResponse: _enc_error_resp,
}


def encode_parts(msg: Message) -> list[BytesLike]:
    """The frame of ``msg`` (length prefix included) as buffers to write in order.

    Entry payloads are returned as the very objects held by the message (no copy), which suits
    ``transport.writelines``. Raises :class:`IncorrectParameterError` for values that do not
    fit the layout (bad master key length, out-of-range integers, unknown message type).
    """
    encoder = _ENCODERS.get(type(msg))
    if encoder is None:
        raise IncorrectParameterError(f"not a wire message: {type(msg).__name__}")
    try:
        return encoder(msg)
    except struct.error as exc:
        raise IncorrectParameterError(f"cannot encode {msg!r:.200}: {exc}") from exc


#: ``coalesce`` joins buffers below this size; bigger ones (entry payloads) go out as they are
COALESCE_BELOW = 16 * 1024


def coalesce(parts: list[BytesLike]) -> list[BytesLike]:
    """``parts`` with every run of small buffers joined into one (big ones untouched, uncopied).
    For TLS transports, which make TLS records of each buffer they are given: a 1 KiB add is
    four parts, and four records cost far more than one."""
    out: list[BytesLike] = []
    run: list[BytesLike] = []
    for part in parts:
        if len(part) < COALESCE_BELOW:
            run.append(part)
            continue
        if run:
            out.append(b"".join(run) if len(run) > 1 else run[0])
            run = []
        out.append(part)
    if run:
        out.append(b"".join(run) if len(run) > 1 else run[0])
    return out


_ADD_RESP_HEADER = _V | (OP_ADD << 16)


def encode_add_responses(status: int, ledger_ids: Sequence[int], entry_ids: Sequence[int]) -> bytes:
    """The frames of ``AddResponse(status, ledger_id, entry_id)`` for each pair, joined: how a
    bookie answers a batch of pipelined ADDs at once (one buffer, no message objects)."""
    if len(ledger_ids) != len(entry_ids):
        raise IncorrectParameterError(
            f"cannot encode ADD responses: {len(ledger_ids)} ledger ids for {len(entry_ids)} entry ids")
    pack = _ADD_RESP.pack
    try:
        return b"".join([pack(24, _ADD_RESP_HEADER, status, lid, eid) for lid, eid in zip(ledger_ids, entry_ids)])
    except struct.error as exc:
        raise IncorrectParameterError(f"cannot encode ADD responses with status {status}: {exc}") from exc


def encode(msg: Message) -> bytes:
    """The frame of ``msg`` (length prefix included) as one ``bytes`` (payload copied once)."""
    parts = encode_parts(msg)
    if len(parts) == 1:
        return bytes(parts[0])
    return b"".join(parts)


# ===========================================================================================
# Decoding


class _Malformed(Exception):
    """A body does not match its opcode's layout (internal: becomes a BadFrame)."""


def _expect(body: memoryview, size: int, name: str) -> None:
    if len(body) != size:
        raise _Malformed(f"{name} frame body of {len(body)} bytes, expected {size}")


def _dec_add_req(body: memoryview, flags: int, *, owned: bool = False) -> Message:
    if len(body) < 4 + MASTER_KEY_LENGTH + MIN_ENTRY_SIZE:
        raise _Malformed(
            f"ADD frame body of {len(body)} bytes is shorter than a master key and an entry header"
        )
    return AddRequest(bytes(body[4:24]), body[24:] if owned else bytes(body[24:]), flags)


def _dec_read_req(body: memoryview, flags: int) -> Message:
    if flags & FLAG_DO_FENCING:
        _expect(body, 40, "fencing READ")
        _, ledger_id, entry_id, key = _READ_REQ_FENCE_B.unpack_from(body)
        return ReadRequest(ledger_id, entry_id, flags, key)
    _expect(body, 20, "READ")
    ledger_id, entry_id = _ENTRY_IDS.unpack_from(body, 4)
    return ReadRequest(ledger_id, entry_id, flags)


def _dec_batch_req(body: memoryview, flags: int) -> Message:
    if flags & FLAG_DO_FENCING:
        _expect(body, 60, "fencing BATCH_READ")
        _, lid, eid, rid, count, size, key = _BATCH_REQ_FENCE_B.unpack_from(body)
        return BatchReadRequest(lid, eid, rid, count, size, flags, key)
    _expect(body, 40, "BATCH_READ")
    _, lid, eid, rid, count, size = _BATCH_REQ_B.unpack_from(body)
    return BatchReadRequest(lid, eid, rid, count, size, flags)


def _dec_add_resp(body: memoryview, flags: int) -> Message:
    _expect(body, 24, "ADD response")
    _, status, ledger_id, entry_id = _ADD_RESP_B.unpack_from(body)
    return AddResponse(status, ledger_id, entry_id)


def _dec_read_resp(body: memoryview, flags: int, *, owned: bool = False) -> Message:
    if len(body) < 24:
        raise _Malformed(f"READ response body of {len(body)} bytes, expected at least 24")
    _, status, ledger_id, entry_id = _READ_RESP_B.unpack_from(body)
    if status != EOK:
        _expect(body, 24, "READ error response")
        return ReadResponse(status, ledger_id, entry_id)
    return ReadResponse(status, ledger_id, entry_id, body[24:] if owned else bytes(body[24:]))


def _entries(body: memoryview, pos: int, what: str, owned: bool) -> tuple[BytesLike, ...]:
    """The ``[int len][entry]`` list filling ``body`` from ``pos``."""
    end = len(body)
    entries: list[BytesLike] = []
    while pos < end:
        if end - pos < 4:
            raise _Malformed(f"{what} response: {end - pos} trailing bytes after entry {len(entries)}")
        (size,) = _INT.unpack_from(body, pos)
        pos += 4
        if size < 0 or size > end - pos:
            raise _Malformed(f"{what} response: entry {len(entries)} claims {size} bytes, {end - pos} left")
        entries.append(body[pos : pos + size] if owned else bytes(body[pos : pos + size]))
        pos += size
    return tuple(entries)


def _dec_batch_resp(body: memoryview, flags: int, *, owned: bool = False) -> Message:
    end = len(body)
    if end < 32:
        raise _Malformed(f"BATCH_READ response body of {end} bytes, expected at least 32")
    _, status, ledger_id, entry_id, request_id = _BATCH_RESP_B.unpack_from(body)
    if status != EOK:
        _expect(body, 32, "BATCH_READ error response")
        return BatchReadResponse(status, ledger_id, entry_id, request_id)
    return BatchReadResponse(status, ledger_id, entry_id, request_id, _entries(body, 32, "BATCH_READ", owned))


def _dec_strided_req(body: memoryview, flags: int) -> Message:
    _expect(body, 44, "READ_STRIDED")
    _, request_id, ledger_id, first, stride, count, max_size = _STRIDED_REQ_B.unpack_from(body)
    if stride < 1 or count < 1:
        raise _Malformed(f"READ_STRIDED with stride {stride} and count {count} (both must be >= 1)")
    return StridedReadRequest(request_id, ledger_id, first, stride, count, max_size)


def _dec_strided_resp(body: memoryview, flags: int, *, owned: bool = False) -> Message:
    end = len(body)
    if end < 32:
        raise _Malformed(f"READ_STRIDED response body of {end} bytes, expected at least 32")
    _, request_id, status, ledger_id, first = _STRIDED_RESP_B.unpack_from(body)
    if status != EOK:
        _expect(body, 32, "READ_STRIDED error response")
        return StridedReadResponse(request_id, status, ledger_id, first)
    return StridedReadResponse(request_id, status, ledger_id, first, _entries(body, 32, "READ_STRIDED", owned))


def _dec_lp_read_lac_req(body: memoryview, flags: int) -> Message:
    _expect(body, 36, "LONG_POLL_READ_LAC")
    _, request_id, ledger_id, previous_lac, timeout_ms = _LP_READ_LAC_REQ_B.unpack_from(body)
    return LongPollReadLacRequest(request_id, ledger_id, previous_lac, timeout_ms)


def _lac_resp_fields(body: memoryview, name: str) -> tuple[int, int, int, bytes, bytes]:
    end = len(body)
    if end < 32:
        raise _Malformed(f"{name} response body of {end} bytes, expected at least 32")
    _, request_id, status, ledger_id, lac_len = _LAC_RESP_B.unpack_from(body)
    pos = 28
    if lac_len < 0 or lac_len > end - pos - 4:
        raise _Malformed(f"{name} response: LAC body of {lac_len} bytes does not fit")
    lac_body = bytes(body[pos : pos + lac_len])
    pos += lac_len
    (entry_len,) = _INT.unpack_from(body, pos)
    pos += 4
    if entry_len != end - pos:
        raise _Malformed(f"{name} response: last entry of {entry_len} bytes, {end - pos} left")
    return request_id, status, ledger_id, lac_body, bytes(body[pos:])


def _dec_lp_read_lac_resp(body: memoryview, flags: int) -> Message:
    return LongPollReadLacResponse(*_lac_resp_fields(body, "LONG_POLL_READ_LAC"))


def _dec_read_lac_resp(body: memoryview, flags: int) -> Message:
    return ReadLacResponse(*_lac_resp_fields(body, "READ_LAC"))


def _req_ledger_decoder(
    cls: Callable[[int, int], Message], name: str
) -> Callable[[memoryview, int], Message]:
    def decode(body: memoryview, flags: int) -> Message:
        _expect(body, 20, name)
        _, request_id, ledger_id = _REQ_LEDGER_B.unpack_from(body)
        return cls(request_id, ledger_id)

    return decode


def _resp_ledger_decoder(
    cls: Callable[[int, int, int], Message], name: str
) -> Callable[[memoryview, int], Message]:
    def decode(body: memoryview, flags: int) -> Message:
        _expect(body, 24, name)
        _, request_id, status, ledger_id = _RESP_LEDGER_B.unpack_from(body)
        return cls(request_id, status, ledger_id)

    return decode


def _dec_write_lac_req(body: memoryview, flags: int) -> Message:
    end = len(body)
    if end < 52:
        raise _Malformed(f"WRITE_LAC frame body of {end} bytes, expected at least 52")
    _, request_id, ledger_id, lac, key, size = _WRITE_LAC_REQ_B.unpack_from(body)
    if size != end - 52:
        raise _Malformed(f"WRITE_LAC: LAC body claims {size} bytes, {end - 52} present")
    return WriteLacRequest(request_id, ledger_id, lac, key, bytes(body[52:]))


def _dec_list_resp(body: memoryview, flags: int) -> Message:
    end = len(body)
    if end < 28:
        raise _Malformed(f"LIST_ENTRIES response body of {end} bytes, expected at least 28")
    _, request_id, status, ledger_id, count = _LIST_RESP_B.unpack_from(body)
    if count < 0 or count * 16 != end - 28:
        raise _Malformed(f"LIST_ENTRIES response: {count} ranges in {end - 28} bytes")
    ranges = tuple(_RANGE.iter_unpack(body[28:]))
    previous = None
    for first, last in ranges:
        if first > last or (previous is not None and first <= previous):
            raise _Malformed("LIST_ENTRIES response: ranges are not sorted and disjoint")
        previous = last
    return ListEntriesResponse(request_id, status, ledger_id, ranges)


def _dec_info_req(body: memoryview, flags: int) -> Message:
    _expect(body, 12, "GET_BOOKIE_INFO")
    _, request_id = _INFO_REQ_B.unpack_from(body)
    return GetBookieInfoRequest(request_id)


def _dec_info_resp(body: memoryview, flags: int) -> Message:
    _expect(body, 32, "GET_BOOKIE_INFO response")
    _, request_id, status, total, free = _INFO_RESP_B.unpack_from(body)
    return GetBookieInfoResponse(request_id, status, total, free)


def _dec_trim_req(body: memoryview, flags: int) -> Message:
    _expect(body, 48, "TRIM")
    _, request_id, ledger_id, end_entry_id, key = _TRIM_REQ_B.unpack_from(body)
    return TrimRequest(request_id, ledger_id, end_entry_id, key)


def _dec_collect_req(body: memoryview, flags: int) -> Message:
    _expect(body, 48, "COLLECT")
    _, request_id, ledger_id, end_entry_id, key = _TRIM_REQ_B.unpack_from(body)
    return CollectRequest(request_id, ledger_id, end_entry_id, key)


def _dec_collect_resp(body: memoryview, flags: int) -> Message:
    _expect(body, 40, "COLLECT response")
    _, request_id, status, ledger_id, reclaimed, garbage = _COLLECT_RESP_B.unpack_from(body)
    return CollectResponse(request_id, status, ledger_id, reclaimed, garbage)


def _dec_error_resp(body: memoryview, flags: int) -> Message:
    _expect(body, 36, "ERROR response")
    if flags & ~_ERROR_MASK:
        raise _Malformed(f"ERROR response with unknown flags {flags:#x}")
    _, request_id, status, opcode, ledger_id, entry_id = _ERROR_RESP_B.unpack_from(body)
    return ErrorResponse(
        status,
        request_id if flags & ERROR_HAS_REQUEST_ID else None,
        opcode if flags & ERROR_HAS_OPCODE else None,
        ledger_id if flags & ERROR_HAS_LEDGER_ID else None,
        entry_id if flags & ERROR_HAS_ENTRY_ID else None,
    )


def _dec_start_tls_req(body: memoryview, flags: int) -> Message:
    _expect(body, 12, "START_TLS")
    _, request_id = _INFO_REQ_B.unpack_from(body)
    return StartTlsRequest(request_id)


def _dec_start_tls_resp(body: memoryview, flags: int) -> Message:
    _expect(body, 16, "START_TLS response")
    _, request_id, status = _START_TLS_RESP_B.unpack_from(body)
    return StartTlsResponse(request_id, status)


def _text(data: memoryview, limit: int, what: str) -> str:
    if len(data) > limit:
        raise _Malformed(f"AUTH {what} of {len(data)} bytes exceeds {limit}")
    try:
        return str(bytes(data), "utf-8")
    except UnicodeDecodeError:
        raise _Malformed(f"AUTH {what} is not UTF-8") from None


def _dec_auth_req(body: memoryview, flags: int) -> Message:
    if len(body) < 20:
        raise _Malformed(f"AUTH frame body of {len(body)} bytes, expected at least 20")
    _, request_id, name_len = _AUTH_REQ_B.unpack_from(body)
    if name_len < 0 or 16 + name_len + 4 > len(body):
        raise _Malformed(f"AUTH plugin name length {name_len} does not fit the frame")
    name = _text(body[16:16 + name_len], MAX_AUTH_NAME, "plugin name")
    (payload_len,) = _INT.unpack_from(body, 16 + name_len)
    if payload_len != len(body) - 20 - name_len:
        raise _Malformed(f"AUTH payload length {payload_len} does not match the frame")
    return AuthRequest(request_id, name, bytes(body[20 + name_len:]))


def _dec_auth_resp(body: memoryview, flags: int) -> Message:
    if len(body) < 20:
        raise _Malformed(f"AUTH response body of {len(body)} bytes, expected at least 20")
    _, request_id, status, length = _AUTH_RESP_B.unpack_from(body)
    if length != len(body) - 20:
        raise _Malformed(f"AUTH response message length {length} does not match the frame")
    return AuthResponse(request_id, status, _text(body[20:], MAX_AUTH_MESSAGE, "message"))


_Decoder: TypeAlias = Callable[[memoryview, int], Message]

# Keyed by message type like the encoders; the opcode tables each side decodes with are built
# from the registry (messages.REQUEST_TYPES / RESPONSE_TYPES).
_DECODERS: dict[type[Any], _Decoder] = {
    AddRequest: _dec_add_req,
    AddResponse: _dec_add_resp,
    ReadRequest: _dec_read_req,
    ReadResponse: _dec_read_resp,
    BatchReadRequest: _dec_batch_req,
    BatchReadResponse: _dec_batch_resp,
    LongPollReadLacRequest: _dec_lp_read_lac_req,
    LongPollReadLacResponse: _dec_lp_read_lac_resp,
    ReadLacRequest: _req_ledger_decoder(ReadLacRequest, "READ_LAC"),
    ReadLacResponse: _dec_read_lac_resp,
    WriteLacRequest: _dec_write_lac_req,
    WriteLacResponse: _resp_ledger_decoder(WriteLacResponse, "WRITE_LAC response"),
    ForceLedgerRequest: _req_ledger_decoder(ForceLedgerRequest, "FORCE_LEDGER"),
    ForceLedgerResponse: _resp_ledger_decoder(ForceLedgerResponse, "FORCE_LEDGER response"),
    ListEntriesRequest: _req_ledger_decoder(ListEntriesRequest, "LIST_ENTRIES"),
    ListEntriesResponse: _dec_list_resp,
    GetBookieInfoRequest: _dec_info_req,
    GetBookieInfoResponse: _dec_info_resp,
    LedgerClosedNote: _req_ledger_decoder(LedgerClosedNote, "LEDGER_CLOSED"),
    TrimRequest: _dec_trim_req,
    TrimResponse: _resp_ledger_decoder(TrimResponse, "TRIM response"),
    StridedReadRequest: _dec_strided_req,
    StridedReadResponse: _dec_strided_resp,
    StartTlsRequest: _dec_start_tls_req,
    StartTlsResponse: _dec_start_tls_resp,
    AuthRequest: _dec_auth_req,
    AuthResponse: _dec_auth_resp,
    CollectRequest: _dec_collect_req,
    CollectResponse: _dec_collect_resp,
    ErrorResponse: _dec_error_resp,
}


def _check_layouts() -> None:
    """Every registered message type has an encoder and a decoder, and nothing else has."""
    registered = set(MESSAGE_TYPES)
    if set(_ENCODERS) != registered or set(_DECODERS) != registered:
        odd = sorted(t.__name__ for t in (registered ^ set(_ENCODERS)) | (registered ^ set(_DECODERS)))
        raise ImportError(f"proto.codec's layouts do not match the message registry: {', '.join(odd)}")


def _opcode_table(types: tuple[type[Any], ...]) -> dict[int, _Decoder]:
    """The decoders of one direction (requests or responses) by opcode."""
    table = {t.OPCODE: _DECODERS[t] for t in types}
    if len(table) != len(types):
        raise ImportError("two message types of one direction share an opcode")
    return table


_check_layouts()
_REQUEST_DECODERS = _opcode_table(REQUEST_TYPES)
_RESPONSE_DECODERS = _opcode_table(RESPONSE_TYPES)

#: For frames received into a buffer of their own (``FrameDecoder``'s big frames): entry
#: payloads become views of that buffer instead of copies.
_REQUEST_DECODERS_OWNED: dict[int, _Decoder] = {
    **_REQUEST_DECODERS, OP_ADD: functools.partial(_dec_add_req, owned=True),
}
_RESPONSE_DECODERS_OWNED: dict[int, _Decoder] = {
    **_RESPONSE_DECODERS,
    OP_READ: functools.partial(_dec_read_resp, owned=True),
    OP_BATCH_READ: functools.partial(_dec_batch_resp, owned=True),
    OP_READ_STRIDED: functools.partial(_dec_strided_resp, owned=True),
}

# Vellum opcodes whose request/response carries a ledger id right after the request id (+rc).
_VELLUM_LEDGER_OPS = frozenset(
    {
        OP_LONG_POLL_READ_LAC,
        OP_READ_LAC,
        OP_WRITE_LAC,
        OP_FORCE_LEDGER,
        OP_LIST_ENTRIES,
        OP_LEDGER_CLOSED,
        OP_TRIM,
        OP_READ_STRIDED,
        OP_COLLECT,
    }
)
# Opcodes 64..126 are Vellum's range: every frame there carries a request id after the header,
# so even an opcode this build does not know can be answered by request id.
_VELLUM_OP_RANGE = range(64, OP_ERROR)


def _recover_ids(body: memoryview, opcode: int, side: Side) -> tuple[int | None, int | None, int | None]:
    """Best-effort ``(request_id, ledger_id, entry_id)`` of a malformed body."""
    n = len(body)
    request_id = ledger_id = entry_id = None
    # v2 responses have the int rc before the ids; requests do not.
    rc = 4 if side == "client" else 0
    if opcode == OP_ADD:
        at = 4 + rc if side == "client" else 4 + MASTER_KEY_LENGTH
        if n >= at + 16:
            ledger_id, entry_id = _ENTRY_IDS.unpack_from(body, at)
    elif opcode in (OP_READ, OP_BATCH_READ):
        at = 4 + rc
        if n >= at + 16:
            ledger_id, entry_id = _ENTRY_IDS.unpack_from(body, at)
        if opcode == OP_BATCH_READ and n >= at + 24:
            (request_id,) = _LONG.unpack_from(body, at + 16)
    elif opcode in _VELLUM_OP_RANGE:
        if n >= 12:
            (request_id,) = _LONG.unpack_from(body, 4)
        if opcode in _VELLUM_LEDGER_OPS and n >= 20 + rc:
            (ledger_id,) = _LONG.unpack_from(body, 12 + rc)
    return request_id, ledger_id, entry_id


def decode_body(body: memoryview | bytes, *, side: Side) -> Decoded:
    """Decode one frame body (without its length prefix): requests if ``side == "server"``,
    responses if ``side == "client"``. Never raises for a bad body: returns a :class:`BadFrame`.
    """
    view = body if isinstance(body, memoryview) else memoryview(body)
    decoders = _REQUEST_DECODERS if side == "server" else _RESPONSE_DECODERS
    return _decode(view, decoders, side)


def _decode(body: memoryview, decoders: dict[int, _Decoder], side: Side) -> Decoded:
    if len(body) < 4:
        return BadFrame(f"frame body of {len(body)} bytes has no header")
    (header,) = _HEADER.unpack_from(body)
    version = header >> 24
    opcode = (header >> 16) & 0xFF
    flags = header & 0xFFFF
    if version != PROTOCOL_VERSION:
        return BadFrame(
            f"unsupported protocol version {version} (this bookie speaks {PROTOCOL_VERSION})",
            EBADVERSION,
            version,
            opcode,
            flags,
        )
    decoder = decoders.get(opcode)
    if decoder is not None:
        try:
            # Vellum's operations define no flags: refuse them rather than guess their meaning.
            # (ERROR uses its flags as a bit mask of known ids; v2 frames keep theirs.)
            if flags and opcode in _VELLUM_OP_RANGE:
                raise _Malformed(f"{OPCODE_NAMES[opcode]} frame with flags {flags:#x}; none are defined")
            return decoder(body, flags)
        except (_Malformed, struct.error) as exc:
            reason = str(exc)
    else:
        kind = "request" if side == "server" else "response"
        name = OPCODE_NAMES.get(opcode)
        reason = f"opcode {opcode}{f' ({name})' if name else ''} is not a known {kind}"
    request_id, ledger_id, entry_id = _recover_ids(body, opcode, side)
    return BadFrame(
        reason,
        version=version,
        opcode=opcode,
        flags=flags,
        request_id=request_id,
        ledger_id=ledger_id,
        entry_id=entry_id,
    )


class FrameDecoder:
    """Splits a byte stream into frames and decodes each (sans-IO).

    ``side="server"`` decodes requests (what a bookie reads); ``side="client"`` decodes
    responses. With ``batch_adds`` (server side), consecutive well-formed v2 ADD frames of one
    read come out as one :class:`AddBatch` instead of one ``AddRequest`` each (a big ADD frame
    received into its own buffer stays an ``AddRequest``). Two ways in, one decoder:

    - ``feed(data)``: the messages the data completes, in order; partial frames are kept until
      the rest arrives. Never keeps a view of ``data``.
    - ``get_buffer()`` / ``buffer_updated(n)``: the ``asyncio.BufferedProtocol`` pair. The
      socket is read straight into the decoder's buffers: small frames into a reused scratch
      buffer (decoded with copies), a frame of ``BIG_FRAME`` bytes or more into a buffer of its
      own, whose entry payloads the messages then hold as views (no copy at all). After a big
      frame the decoder asks for just the next frame's length first, so that a big body is
      never read into scratch and moved.

    Memory follows the bytes received, never the lengths announced: the scratch buffer is made
    at the first read, and a big frame's buffer starts at ``BIG_START`` bytes (or the frame's
    size, if smaller) and doubles as it fills, so a peer that announces a big frame and sends
    little costs little. ``max_frame_size`` may be changed between reads (a server accepts only
    small frames from a peer that has not authenticated yet, then raises it).

    A :class:`FramingError` (negative or oversized length) is raised from ``feed`` /
    ``buffer_updated`` and again from every later call.
    """

    #: frames at least this big get a buffer of their own
    BIG_FRAME = 16 * 1024
    #: the reused receive buffer for smaller frames (holds any partial small frame)
    SCRATCH = 64 * 1024
    #: a big frame's buffer starts this big (at most) and doubles as the frame's bytes arrive
    BIG_START = 64 * 1024

    __slots__ = ("_batch_adds", "_big", "_big_fill", "_big_size", "_decoders", "_end", "_failure", "_max",
                 "_owned_decoders", "_peek", "_scratch", "_side", "_start")

    def __init__(self, max_frame_size: int, *, side: Side, batch_adds: bool = False) -> None:
        if max_frame_size < 4:
            raise IncorrectParameterError(f"max_frame_size {max_frame_size} is below a frame header")
        if side not in ("server", "client"):
            raise IncorrectParameterError(f"side must be 'server' or 'client', not {side!r}")
        self._max = max_frame_size
        self._side: Side = side
        self._batch_adds = batch_adds and side == "server"
        self._decoders = _REQUEST_DECODERS if side == "server" else _RESPONSE_DECODERS
        self._owned_decoders = _REQUEST_DECODERS_OWNED if side == "server" else _RESPONSE_DECODERS_OWNED
        # Made at the first read (an idle connection costs none), then never resized: views
        # of it may be out.
        self._scratch = bytearray()
        self._start = 0  # unparsed bytes are _scratch[_start:_end]
        self._end = 0
        self._big: bytearray | None = None  # body of the big frame being received, as far as it came
        self._big_fill = 0
        self._big_size = 0  # the big frame's announced body size (len(_big) grows towards it)
        self._peek = False  # the last frame was big: read the next length on its own
        self._failure: str | None = None

    @property
    def max_frame_size(self) -> int:
        """The largest frame body accepted; a longer announced length is a framing error."""
        return self._max

    @max_frame_size.setter
    def max_frame_size(self, value: int) -> None:
        if value < 4:
            raise IncorrectParameterError(f"max_frame_size {value} is below a frame header")
        self._max = value

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a complete frame."""
        big = 4 + self._big_fill if self._big is not None else 0
        return self._end - self._start + big

    def feed(self, data: BytesLike) -> list[Decoded]:
        """Consume ``data``; return every message it completes. Never keeps a view of ``data``."""
        if self._failure is not None:
            raise FramingError(self._failure)
        out: list[Decoded] = []
        src = memoryview(data)
        try:
            while src:
                buf = self.get_buffer(len(src))
                n = min(len(buf), len(src))
                buf[:n] = src[:n]
                buf.release()
                out += self.buffer_updated(n)
                src = src[n:]
        finally:
            src.release()
        return out

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """Where the next received bytes go (never empty); then call ``buffer_updated``."""
        if self._failure is not None:
            return memoryview(bytearray(4))  # the connection is closing: swallow, parse nothing
        big = self._big
        if big is not None:
            if self._big_fill == len(big):
                big = self._grow_big(big)
            return memoryview(big)[self._big_fill :]
        if self._end == len(self._scratch) or (self._peek and self._start):
            if not self._scratch:
                self._scratch = bytearray(self.SCRATCH)
            self._compact()
        if self._peek and self._end < 4:
            return memoryview(self._scratch)[self._end : 4]
        return memoryview(self._scratch)[self._end :]

    def buffer_updated(self, nbytes: int) -> list[Decoded]:
        """``nbytes`` were written into the buffer ``get_buffer`` returned: the messages they
        complete, in order."""
        if self._failure is not None:
            raise FramingError(self._failure)
        big = self._big
        if big is not None:
            self._big_fill += nbytes
            if self._big_fill < self._big_size:
                return []
            self._big, self._big_fill = None, 0
            view = memoryview(big).toreadonly()  # handed over: the messages may keep views of it
            return [_decode(view, self._owned_decoders, self._side)]
        self._end += nbytes
        return self._parse()

    def _grow_big(self, big: bytearray) -> bytearray:
        """The big frame's buffer, full so far, doubled (at most to the frame's size)."""
        more = min(self._big_size, 2 * len(big)) - len(big)
        try:
            big.extend(bytes(more))  # in place where the allocator can (no copy)
        except BufferError:  # a view of it is still out: move it instead
            grown = bytearray(len(big) + more)
            grown[: len(big)] = big
            big = self._big = grown
        return big

    def _compact(self) -> None:
        n = self._end - self._start
        if self._start:
            self._scratch[:n] = self._scratch[self._start : self._end]
        self._start, self._end = 0, n

    def _parse(self) -> list[Decoded]:
        out: list[Decoded] = []
        view = memoryview(self._scratch)
        try:
            pos, end = self._start, self._end
            decoders, side, limit = self._decoders, self._side, self._max
            unpack_len = _INT.unpack_from
            batching = self._batch_adds
            unpack_add = _ADD_FRAME.unpack_from
            adds: AddBatch | None = None
            while end - pos >= 4:
                (size,) = unpack_len(view, pos)
                if size < 0 or size > limit:
                    self._failure = (
                        f"frame length {size} outside 0..{limit} (max frame size): stream out of sync"
                    )
                    raise FramingError(self._failure)
                start = pos + 4
                stop = start + size
                if stop <= end:
                    if batching and size >= _ADD_FRAME_MIN_BODY:
                        _size, header, key, ledger_id, entry_id, lac = unpack_add(view, pos)
                        if header & _ADD_HEADER_MASK == _ADD_HEADER:
                            if adds is None:
                                adds = AddBatch()
                                out.append(adds)
                            # The columns the whole ADD path uses; the entry's one copy.
                            adds.append(bytes(view[start + 24 : stop]), key, header & 0xFFFF,
                                        ledger_id, entry_id, lac)
                            pos = stop
                            self._peek = size >= self.BIG_FRAME
                            continue
                    adds = None
                    out.append(_decode(view[start:stop], decoders, side))  # copies what it keeps
                    pos = stop
                    self._peek = size >= self.BIG_FRAME
                    continue
                if size >= self.BIG_FRAME:
                    # Never the announced size up front: what came, and room for as much again.
                    have = end - start
                    big = bytearray(min(size, max(self.BIG_START, 2 * have)))
                    big[:have] = view[start:end]
                    self._big, self._big_fill, self._big_size = big, have, size
                    pos = end
                    self._peek = True
                else:
                    self._peek = False
                break
            if pos == end:
                pos = end = 0
            self._start, self._end = pos, end
        finally:
            view.release()  # the views die here (none escapes: decoders copy from scratch)
        return out
