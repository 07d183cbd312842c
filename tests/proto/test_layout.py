"""Byte-exact layouts of every frame, as tabled in docs/protocol.md.

The expected bytes are written out by hand (hex for BookKeeper v2 frames, explicit struct
formats for Vellum's own), independently of the codec's structs, so a layout change fails here.
"""

from __future__ import annotations

import struct

import pytest

from vellum.errors import EBADREQ, EFENCED, ENOENTRY, EOK, EUA
from vellum.proto import Side, decode_body, encode
from vellum.proto.messages import (
    FLAG_DO_FENCING,
    FLAG_HIGH_PRIORITY,
    FLAG_RECOVERY_ADD,
    MESSAGE_TYPES,
    RESPONSE_TYPES,
    AddRequest,
    AddResponse,
    AuthRequest,
    AuthResponse,
    BatchReadRequest,
    BatchReadResponse,
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

KEY = bytes(range(20))
# ledger 1, entry 0, LAC -1, length 5, CRC32C digest, "hello" (bookkeeper.md §2.1)
ENTRY = bytes.fromhex("00000000000000010000000000000000ffffffffffffffff0000000000000005e3a5f74d") + b"hello"
L = "0000000000000001"  # ledger 1
E = "0000000000000000"  # entry 0


def h(*parts: str) -> bytes:
    return bytes.fromhex("".join(parts))


V2_CASES: list[tuple[Message, bytes]] = [
    # ADD: [len][02 01 flags][masterKey][entry]
    (AddRequest(KEY, ENTRY), h("00000041", "02010000", KEY.hex()) + ENTRY),
    (AddRequest(KEY, ENTRY, FLAG_RECOVERY_ADD), h("00000041", "02010002", KEY.hex()) + ENTRY),
    (AddResponse(EOK, 1, 0), h("00000018", "02010000", "00000000", L, E)),
    (AddResponse(EFENCED, 1, 0), h("00000018", "02010000", "00000068", L, E)),
    # READ: [len][02 02 flags][ledger][entry] (+ masterKey iff fencing)
    (ReadRequest(1, 0), h("00000014", "02020000", L, E)),
    (ReadRequest(1, -1, FLAG_HIGH_PRIORITY), h("00000014", "02020004", L, "ffffffffffffffff")),
    (ReadRequest(1, 0, FLAG_DO_FENCING, KEY), h("00000028", "02020001", L, E, KEY.hex())),
    (ReadResponse(EOK, 1, 0, ENTRY), h("00000041", "02020000", "00000000", L, E) + ENTRY),
    (ReadResponse(ENOENTRY, 1, 0), h("00000018", "02020000", "00000002", L, E)),
    # BATCH_READ: [ledger][startEntry][requestId][int maxCount][long maxSize] (+ key)
    (
        BatchReadRequest(1, 0, 7, 100, 65536),
        h("00000028", "02070000", L, E, "0000000000000007", "00000064", "0000000000010000"),
    ),
    (
        BatchReadRequest(1, 0, 7, 100, 65536, FLAG_DO_FENCING, KEY),
        h("0000003c", "02070001", L, E, "0000000000000007", "00000064", "0000000000010000", KEY.hex()),
    ),
    (
        BatchReadResponse(EOK, 1, 0, 7, (ENTRY, b"")),
        h("00000051", "02070000", "00000000", L, E, "0000000000000007", "00000029") + ENTRY + h("00000000"),
    ),
    (BatchReadResponse(EBADREQ, 1, 0, 7), h("00000020", "02070000", "00000064", L, E, "0000000000000007")),
]


def vellum(opcode: int, fmt: str, *fields: object, tail: bytes = b"", flags: int = 0) -> bytes:
    body = struct.pack(">I" + fmt, (2 << 24) | (opcode << 16) | flags, *fields) + tail
    return struct.pack(">i", len(body)) + body


VELLUM_REQUESTS: list[tuple[Message, bytes]] = [
    (LongPollReadLacRequest(9, 1, 4, 3000), vellum(64, "qqqq", 9, 1, 4, 3000)),
    (ReadLacRequest(9, 1), vellum(65, "qq", 9, 1)),
    (WriteLacRequest(9, 1, 4, KEY, b"lacbody"), vellum(66, "qqq20si", 9, 1, 4, KEY, 7, tail=b"lacbody")),
    (ForceLedgerRequest(9, 1), vellum(67, "qq", 9, 1)),
    (ListEntriesRequest(9, 1), vellum(68, "qq", 9, 1)),
    (GetBookieInfoRequest(9), vellum(69, "q", 9)),
    (LedgerClosedNote(9, 1), vellum(70, "qq", 9, 1)),
    (TrimRequest(9, 1, 100, KEY), vellum(71, "qqq20s", 9, 1, 100, KEY)),
    (StridedReadRequest(9, 1, 0, 3, 10, 65536), vellum(72, "qqqiiq", 9, 1, 0, 3, 10, 65536)),
    (StartTlsRequest(9), vellum(73, "q", 9)),
    (AuthRequest(9, "token", b"abc"), vellum(74, "qi5si", 9, 5, b"token", 3, tail=b"abc")),
    (CollectRequest(9, 1, 100, KEY), vellum(75, "qqq20s", 9, 1, 100, KEY)),
]

VELLUM_RESPONSES: list[tuple[Message, bytes]] = [
    (
        LongPollReadLacResponse(9, EOK, 1, b"lac", ENTRY),
        vellum(64, "qiqi", 9, EOK, 1, 3, tail=b"lac" + struct.pack(">i", len(ENTRY)) + ENTRY),
    ),
    (ReadLacResponse(9, ENOENTRY, 1), vellum(65, "qiqii", 9, ENOENTRY, 1, 0, 0)),
    (WriteLacResponse(9, EOK, 1), vellum(66, "qiq", 9, EOK, 1)),
    (ForceLedgerResponse(9, EOK, 1), vellum(67, "qiq", 9, EOK, 1)),
    (
        ListEntriesResponse(9, EOK, 1, ((0, 9), (12, 12))),
        vellum(68, "qiqiqqqq", 9, EOK, 1, 2, 0, 9, 12, 12),
    ),
    (GetBookieInfoResponse(9, EOK, 1000, 400), vellum(69, "qiqq", 9, EOK, 1000, 400)),
    (TrimResponse(9, EOK, 1), vellum(71, "qiq", 9, EOK, 1)),
    (
        StridedReadResponse(9, EOK, 1, 0, (ENTRY,)),
        vellum(72, "qiqq", 9, EOK, 1, 0, tail=struct.pack(">i", len(ENTRY)) + ENTRY),
    ),
    (StridedReadResponse(9, ENOENTRY, 1, 3), vellum(72, "qiqq", 9, ENOENTRY, 1, 3)),
    (StartTlsResponse(9, EOK), vellum(73, "qi", 9, EOK)),
    (StartTlsResponse(9, EBADREQ), vellum(73, "qi", 9, EBADREQ)),
    (AuthResponse(9, EUA, "no"), vellum(74, "qii", 9, EUA, 2, tail=b"no")),
    (CollectResponse(9, EOK, 1, 4096, 512), vellum(75, "qiqqq", 9, EOK, 1, 4096, 512)),
    (ErrorResponse(EBADREQ), vellum(127, "qiiqq", -1, EBADREQ, -1, -1, -1)),
    (
        ErrorResponse(EBADREQ, 9, 68, 1, None),
        vellum(127, "qiiqq", 9, EBADREQ, 68, 1, -1, flags=0x7),
    ),
]


ALL_CASES = V2_CASES + VELLUM_REQUESTS + VELLUM_RESPONSES


@pytest.mark.parametrize(
    ("msg", "expected"), ALL_CASES, ids=[f"{i}-{type(m).__name__}" for i, (m, _) in enumerate(ALL_CASES)]
)
def test_layout(msg: Message, expected: bytes) -> None:
    assert encode(msg) == expected
    side: Side = "client" if type(msg) in RESPONSE_TYPES else "server"
    assert decode_body(expected[4:], side=side) == msg


def test_every_message_type_has_a_layout_case() -> None:
    # The registry is the list of frames: each one's bytes are pinned here.
    assert {type(m) for m, _ in ALL_CASES} == set(MESSAGE_TYPES)


def test_entry_fixture_is_the_worked_example() -> None:
    from vellum.format.entry import DigestManager, DigestType

    assert DigestManager(1, DigestType.CRC32C).compute(0, -1, 5, b"hello") == ENTRY
