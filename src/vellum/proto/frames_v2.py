"""The byte layouts of BookKeeper v2's frames, both ways (sans-IO): ADD (1), READ (2) and
BATCH_READ (7), byte for byte BookKeeper's (``docs/protocol.md``), with the batch encoding of ADD
answers and the structs ``FrameDecoder`` reads pipelined ADDs with. An encoder and a decoder per
message, side by side: the two halves of one layout are read together."""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any

from vellum.errors import EOK, IncorrectParameterError
from vellum.proto.frame_parts import (
    _ENTRY_IDS,
    _V,
    _body,
    _Decoder,
    _entries,
    _entry_parts,
    _expect,
    _flags,
    _key,
    _Malformed,
)
from vellum.proto.messages import (
    FLAG_DO_FENCING,
    MASTER_KEY_LENGTH,
    MIN_ENTRY_SIZE,
    OP_ADD,
    OP_BATCH_READ,
    OP_READ,
    AddRequest,
    AddResponse,
    BatchReadRequest,
    BatchReadResponse,
    BytesLike,
    Message,
    ReadRequest,
    ReadResponse,
    new_read_request,
    new_read_response,
)

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

_ADD_RESP_B = _body(_ADD_RESP)

_BATCH_REQ_B = _body(_BATCH_REQ)

_BATCH_REQ_FENCE_B = _body(_BATCH_REQ_FENCE)

_BATCH_RESP_B = _body(_BATCH_RESP)

_READ_REQ_FENCE_B = _body(_READ_REQ_FENCE)

_READ_RESP_B = _body(_READ_RESP)


def _enc_add_req(m: AddRequest) -> list[BytesLike]:
    return encode_add_request(m.master_key, m.entry, m.flags)


def encode_add_request(master_key: BytesLike, entry: BytesLike, flags: int) -> list[BytesLike]:
    """The frame of ``AddRequest(master_key, entry, flags)`` without building the message: the
    client's add path sends one entry to every bookie of its write set with the same parts
    (the entry itself is never copied)."""
    return [encode_add_head(master_key, len(entry), flags), entry]


def encode_add_head(master_key: BytesLike, entry_length: int, flags: int) -> bytes:
    """What precedes an entry of ``entry_length`` bytes in its ADD frame (``encode_add_request``
    is ``[head, entry]``): the same for every entry of that length, key and flags."""
    if entry_length < MIN_ENTRY_SIZE:
        raise IncorrectParameterError(f"ADD: entry of {entry_length} bytes is shorter than its header")
    try:
        return _ADD_REQ.pack(4 + MASTER_KEY_LENGTH + entry_length, _ADD_HEADER | _flags(flags), _key(master_key, "ADD"))
    except struct.error as exc:
        raise IncorrectParameterError(f"cannot encode an ADD with flags {flags!r}: {exc}") from exc


def _enc_add_resp(m: AddResponse) -> list[BytesLike]:
    return [_ADD_RESP.pack(24, _V | (OP_ADD << 16), m.status, m.ledger_id, m.entry_id)]


def _enc_read_req(m: ReadRequest) -> list[BytesLike]:
    return encode_read_request(m.ledger_id, m.entry_id, m.flags, m.master_key)


def encode_read_request(ledger_id: int, entry_id: int, flags: int = 0,
                        master_key: BytesLike | None = None) -> list[BytesLike]:
    """The frame of ``ReadRequest(ledger_id, entry_id, flags, master_key)`` without building the
    message: how a client asks a bookie for one entry, its most frequent request after ADD."""
    header = _V | (OP_READ << 16) | _flags(flags)
    try:
        if flags & FLAG_DO_FENCING:
            return [_READ_REQ_FENCE.pack(40, header, ledger_id, entry_id, _key(master_key, "fencing READ"))]
        if master_key is not None:
            raise IncorrectParameterError("READ: a master key is only sent with FLAG_DO_FENCING")
        return [_READ_REQ.pack(20, header, ledger_id, entry_id)]
    except struct.error as exc:
        raise IncorrectParameterError(f"cannot encode a READ request ({ledger_id}, {entry_id}): {exc}") from exc


def _enc_read_resp(m: ReadResponse) -> list[BytesLike]:
    return encode_read_response(m.status, m.ledger_id, m.entry_id, m.entry)


_READ_RESP_HEADER = _V | (OP_READ << 16)


def encode_read_response(status: int, ledger_id: int, entry_id: int, entry: BytesLike = b"") -> list[BytesLike]:
    """The frame of ``ReadResponse(status, ledger_id, entry_id, entry)`` without building the
    message: how a bookie answers a READ, its most frequent answer after ADD's (the entry is
    never copied)."""
    if status != EOK and len(entry):
        raise IncorrectParameterError("READ response: an entry is only sent with EOK")
    try:
        head = _READ_RESP.pack(24 + len(entry), _READ_RESP_HEADER, status, ledger_id, entry_id)
    except struct.error as exc:
        raise IncorrectParameterError(f"cannot encode a READ response ({status}, {ledger_id}, {entry_id}): {exc}") from exc
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
    parts, size = _entry_parts(m.status, m.entries, "BATCH_READ")
    parts[0] = _BATCH_RESP.pack(
        size, _V | (OP_BATCH_READ << 16), m.status, m.ledger_id, m.entry_id, m.request_id
    )
    return parts

_ADD_RESP_HEADER = _V | (OP_ADD << 16)


def encode_add_responses(status: int | Sequence[int], ledger_ids: Sequence[int], entry_ids: Sequence[int]) -> bytes:
    """The frames of ``AddResponse(status, ledger_id, entry_id)`` for each pair, joined: how a
    bookie answers a batch of pipelined ADDs at once (one buffer, no message objects).
    ``status``: one for all, or one per pair."""
    if len(ledger_ids) != len(entry_ids) or (not isinstance(status, int) and len(status) != len(ledger_ids)):
        counts = "" if isinstance(status, int) else f"{len(status)} statuses, "
        raise IncorrectParameterError(
            f"cannot encode ADD responses: {counts}{len(ledger_ids)} ledger ids for {len(entry_ids)} entry ids")
    pack = _ADD_RESP.pack
    try:
        if isinstance(status, int):
            if len(entry_ids) == 1:  # one add a read, the usual reply: its frame, no list to join
                return pack(24, _ADD_RESP_HEADER, status, ledger_ids[0], entry_ids[0])
            return b"".join([pack(24, _ADD_RESP_HEADER, status, lid, eid) for lid, eid in zip(ledger_ids, entry_ids)])
        return b"".join([pack(24, _ADD_RESP_HEADER, st, lid, eid)
                         for st, lid, eid in zip(status, ledger_ids, entry_ids)])
    except struct.error as exc:
        raise IncorrectParameterError(f"cannot encode ADD responses with status {status}: {exc}") from exc


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
        return new_read_request(ledger_id, entry_id, flags, key)
    _expect(body, 20, "READ")
    ledger_id, entry_id = _ENTRY_IDS.unpack_from(body, 4)
    return new_read_request(ledger_id, entry_id, flags, None)


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
        return new_read_response(status, ledger_id, entry_id, b"")
    return new_read_response(
        status, ledger_id, entry_id, body[24:] if owned else bytes(body[24:]))


def _dec_batch_resp(body: memoryview, flags: int, *, owned: bool = False) -> Message:
    end = len(body)
    if end < 32:
        raise _Malformed(f"BATCH_READ response body of {end} bytes, expected at least 32")
    _, status, ledger_id, entry_id, request_id = _BATCH_RESP_B.unpack_from(body)
    if status != EOK:
        _expect(body, 32, "BATCH_READ error response")
        return BatchReadResponse(status, ledger_id, entry_id, request_id)
    return BatchReadResponse(status, ledger_id, entry_id, request_id, _entries(body, 32, "BATCH_READ", owned))


#: this family's encoders, by message type (``codec.py`` merges the families)
ENCODERS: dict[type[Any], Callable[[Any], list[BytesLike]]] = {
    AddRequest: _enc_add_req,
    AddResponse: _enc_add_resp,
    ReadRequest: _enc_read_req,
    ReadResponse: _enc_read_resp,
    BatchReadRequest: _enc_batch_req,
    BatchReadResponse: _enc_batch_resp,
}


#: this family's decoders, by message type (``decoding.py`` builds the opcode tables from them)
DECODERS: dict[type[Any], _Decoder] = {
    AddRequest: _dec_add_req,
    AddResponse: _dec_add_resp,
    ReadRequest: _dec_read_req,
    ReadResponse: _dec_read_resp,
    BatchReadRequest: _dec_batch_req,
    BatchReadResponse: _dec_batch_resp,
}
