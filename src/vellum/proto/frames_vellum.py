"""The byte layouts of Vellum's own frames, both ways (sans-IO): the operations with a request
id (64..72: long-poll and plain READ_LAC, WRITE_LAC, FORCE_LEDGER, LIST_ENTRIES, GET_BOOKIE_INFO,
LEDGER_CLOSED, TRIM, READ_STRIDED, COLLECT), the session's START_TLS (73) and AUTH (74), and
ERROR (127) (``docs/protocol.md``). An encoder and a decoder per message, side by side."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from vellum.errors import EOK, IncorrectParameterError
from vellum.proto.frame_parts import (
    _INT,
    _RANGE,
    _V,
    _body,
    _Decoder,
    _entries,
    _entry_parts,
    _expect,
    _key,
    _Malformed,
    _text,
    _utf8,
)
from vellum.proto.messages import (
    MAX_AUTH_MESSAGE,
    MAX_AUTH_NAME,
    OP_AUTH,
    OP_COLLECT,
    OP_ERROR,
    OP_FORCE_LEDGER,
    OP_GET_BOOKIE_INFO,
    OP_LEDGER_CLOSED,
    OP_LIST_ENTRIES,
    OP_LONG_POLL_READ_LAC,
    OP_READ_LAC,
    OP_READ_STRIDED,
    OP_START_TLS,
    OP_TRIM,
    OP_WRITE_LAC,
    AuthRequest,
    AuthResponse,
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
    StartTlsRequest,
    StartTlsResponse,
    StridedReadRequest,
    StridedReadResponse,
    TrimRequest,
    TrimResponse,
    WriteLacRequest,
    WriteLacResponse,
    new_read_lac_response,
    new_strided_read_request,
    new_strided_read_response,
)

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

_ERROR_RESP_B = _body(_ERROR_RESP)

_INFO_REQ_B = _body(_INFO_REQ)

_INFO_RESP_B = _body(_INFO_RESP)

_LAC_RESP_B = _body(_LAC_RESP)

_LIST_RESP_B = _body(_LIST_RESP)

_LP_READ_LAC_REQ_B = _body(_LP_READ_LAC_REQ)

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
    return encode_read_lac_request(m.request_id, m.ledger_id)


def encode_read_lac_request(request_id: int, ledger_id: int) -> list[BytesLike]:
    """The frame of ``ReadLacRequest(request_id, ledger_id)`` without building the message (a
    reader asks each bookie of its ensemble for the LAC)."""
    try:
        return _req_ledger(OP_READ_LAC, request_id, ledger_id)
    except struct.error as exc:
        raise IncorrectParameterError(f"cannot encode a READ_LAC request ({request_id}, {ledger_id}): {exc}") from exc


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
    return encode_strided_read_request(m.request_id, m.ledger_id, m.first_entry_id, m.stride, m.max_count,
                                       m.max_size)


_STRIDED_REQ_HEADER = _V | (OP_READ_STRIDED << 16)


def encode_strided_read_request(request_id: int, ledger_id: int, first_entry_id: int, stride: int,
                                max_count: int, max_size: int) -> list[BytesLike]:
    """The frame of ``StridedReadRequest(request_id, ledger_id, first_entry_id, stride,
    max_count, max_size)`` without building the message (a reader's bulk read of one bookie's
    share of a run)."""
    if stride < 1 or max_count < 1:
        raise IncorrectParameterError(f"READ_STRIDED: stride {stride} and count {max_count} must be >= 1")
    try:
        return [_STRIDED_REQ.pack(44, _STRIDED_REQ_HEADER, request_id, ledger_id, first_entry_id,
                                  stride, max_count, max_size)]
    except struct.error as exc:
        raise IncorrectParameterError(
            f"cannot encode a READ_STRIDED request ({request_id}, {ledger_id}, {first_entry_id}, {stride}, "
            f"{max_count}, {max_size}): {exc}") from exc



def _enc_strided_resp(m: StridedReadResponse) -> list[BytesLike]:
    parts, size = _entry_parts(m.status, m.entries, "READ_STRIDED")
    parts[0] = _STRIDED_RESP.pack(size, _V | (OP_READ_STRIDED << 16), m.request_id, m.status, m.ledger_id,
                                  m.first_entry_id)
    return parts


def _enc_start_tls_req(m: StartTlsRequest) -> list[BytesLike]:
    return [_START_TLS_REQ.pack(12, _V | (OP_START_TLS << 16), m.request_id)]


def _enc_start_tls_resp(m: StartTlsResponse) -> list[BytesLike]:
    return [_START_TLS_RESP.pack(16, _V | (OP_START_TLS << 16), m.request_id, m.status)]


def _enc_auth_req(m: AuthRequest) -> list[BytesLike]:
    name = _utf8(m.auth_plugin_name, MAX_AUTH_NAME, "plugin name")
    payload = m.payload
    return [_AUTH_REQ.pack(20 + len(name) + len(payload), _V | (OP_AUTH << 16), m.request_id, len(name)),
            name, _INT.pack(len(payload)), payload]


def _enc_auth_resp(m: AuthResponse) -> list[BytesLike]:
    message = _utf8(m.message, MAX_AUTH_MESSAGE, "message")
    return [_AUTH_RESP.pack(20 + len(message), _V | (OP_AUTH << 16), m.request_id, m.status, len(message)), message]



def _dec_strided_req(body: memoryview, flags: int) -> Message:
    _expect(body, 44, "READ_STRIDED")
    _, request_id, ledger_id, first, stride, count, max_size = _STRIDED_REQ_B.unpack_from(body)
    if stride < 1 or count < 1:
        raise _Malformed(f"READ_STRIDED with stride {stride} and count {count} (both must be >= 1)")
    return new_strided_read_request(
        request_id, ledger_id, first, stride, count, max_size)


def _dec_strided_resp(body: memoryview, flags: int, *, owned: bool = False) -> Message:
    end = len(body)
    if end < 32:
        raise _Malformed(f"READ_STRIDED response body of {end} bytes, expected at least 32")
    _, request_id, status, ledger_id, first = _STRIDED_RESP_B.unpack_from(body)
    if status != EOK:
        _expect(body, 32, "READ_STRIDED error response")
        return new_strided_read_response(request_id, status, ledger_id, first, ())
    return new_strided_read_response(
        request_id, status, ledger_id, first, _entries(body, 32, "READ_STRIDED", owned))


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
    return new_read_lac_response(*_lac_resp_fields(body, "READ_LAC"))


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


#: this family's encoders, by message type (``codec.py`` merges the families)
ENCODERS: dict[type[Any], Callable[[Any], list[BytesLike]]] = {
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


#: this family's decoders, by message type (``decoding.py`` builds the opcode tables from them)
DECODERS: dict[type[Any], _Decoder] = {
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
