"""Hypothesis strategies for every wire message (shared by the proto tests).

``STRATEGIES`` gives one strategy per message type; ``REQUESTS`` and ``RESPONSES`` draw from
every type of the protocol's registry (``messages.REQUEST_TYPES`` / ``RESPONSE_TYPES``), so a
message added to the registry without a strategy here fails at import.
"""

from __future__ import annotations

from hypothesis import strategies as st

from vellum.errors import EBADREQ, EFENCED, EIO, ENOENTRY, ENOLEDGER, EOK, EUA
from vellum.proto.messages import (
    FLAG_DO_FENCING,
    REQUEST_TYPES,
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
    entry_ranges,
)

INT64 = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
INT32 = st.integers(min_value=-(1 << 31), max_value=(1 << 31) - 1)
FLAGS = st.integers(min_value=0, max_value=0xFFFF)
KEYS = st.binary(min_size=20, max_size=20)
ENTRIES = st.binary(min_size=32, max_size=120)
STATUS = st.sampled_from([EOK, ENOLEDGER, ENOENTRY, EBADREQ, EIO, EUA, EFENCED])
ERROR_STATUS = st.sampled_from([ENOLEDGER, ENOENTRY, EBADREQ, EIO, EUA, EFENCED])
SMALL_BYTES = st.binary(max_size=60)


@st.composite
def read_requests(draw: st.DrawFn) -> ReadRequest:
    flags = draw(FLAGS)
    key = draw(KEYS) if flags & FLAG_DO_FENCING else None
    return ReadRequest(draw(INT64), draw(INT64), flags, key)


@st.composite
def batch_read_requests(draw: st.DrawFn) -> BatchReadRequest:
    flags = draw(FLAGS)
    key = draw(KEYS) if flags & FLAG_DO_FENCING else None
    return BatchReadRequest(draw(INT64), draw(INT64), draw(INT64), draw(INT32), draw(INT64), flags, key)


@st.composite
def read_responses(draw: st.DrawFn) -> ReadResponse:
    if draw(st.booleans()):
        return ReadResponse(EOK, draw(INT64), draw(INT64), draw(ENTRIES))
    return ReadResponse(draw(ERROR_STATUS), draw(INT64), draw(INT64))


@st.composite
def batch_read_responses(draw: st.DrawFn) -> BatchReadResponse:
    if draw(st.booleans()):
        entries = tuple(draw(st.lists(st.binary(max_size=80), max_size=4)))
        return BatchReadResponse(EOK, draw(INT64), draw(INT64), draw(INT64), entries)
    return BatchReadResponse(draw(ERROR_STATUS), draw(INT64), draw(INT64), draw(INT64))


@st.composite
def strided_read_responses(draw: st.DrawFn) -> StridedReadResponse:
    if draw(st.booleans()):
        entries = tuple(draw(st.lists(st.binary(max_size=80), max_size=4)))
        return StridedReadResponse(draw(INT64), EOK, draw(INT64), draw(INT64), entries)
    return StridedReadResponse(draw(INT64), draw(ERROR_STATUS), draw(INT64), draw(INT64))


POSITIVE_INT32 = st.integers(min_value=1, max_value=(1 << 31) - 1)


@st.composite
def list_entries_responses(draw: st.DrawFn) -> ListEntriesResponse:
    ids = draw(st.lists(st.integers(min_value=-5, max_value=200), max_size=40))
    return ListEntriesResponse(draw(INT64), draw(STATUS), draw(INT64), entry_ranges(ids))


def _optional(strategy: st.SearchStrategy[int]) -> st.SearchStrategy[int | None]:
    return st.none() | strategy


STRATEGIES: dict[type[Message], st.SearchStrategy[Message]] = {
    # requests
    AddRequest: st.builds(AddRequest, KEYS, ENTRIES, FLAGS),
    ReadRequest: read_requests(),
    BatchReadRequest: batch_read_requests(),
    LongPollReadLacRequest: st.builds(LongPollReadLacRequest, INT64, INT64, INT64, INT64),
    ReadLacRequest: st.builds(ReadLacRequest, INT64, INT64),
    WriteLacRequest: st.builds(WriteLacRequest, INT64, INT64, INT64, KEYS, SMALL_BYTES),
    ForceLedgerRequest: st.builds(ForceLedgerRequest, INT64, INT64),
    ListEntriesRequest: st.builds(ListEntriesRequest, INT64, INT64),
    GetBookieInfoRequest: st.builds(GetBookieInfoRequest, INT64),
    LedgerClosedNote: st.builds(LedgerClosedNote, INT64, INT64),
    TrimRequest: st.builds(TrimRequest, INT64, INT64, INT64, KEYS),
    StridedReadRequest: st.builds(StridedReadRequest, INT64, INT64, INT64, POSITIVE_INT32, POSITIVE_INT32, INT64),
    StartTlsRequest: st.builds(StartTlsRequest, INT64),
    AuthRequest: st.builds(AuthRequest, INT64, st.text(max_size=20), SMALL_BYTES),
    CollectRequest: st.builds(CollectRequest, INT64, INT64, INT64, KEYS),
    # responses
    AddResponse: st.builds(AddResponse, STATUS, INT64, INT64),
    ReadResponse: read_responses(),
    BatchReadResponse: batch_read_responses(),
    LongPollReadLacResponse: st.builds(LongPollReadLacResponse, INT64, STATUS, INT64, SMALL_BYTES, SMALL_BYTES),
    ReadLacResponse: st.builds(ReadLacResponse, INT64, STATUS, INT64, SMALL_BYTES, SMALL_BYTES),
    WriteLacResponse: st.builds(WriteLacResponse, INT64, STATUS, INT64),
    ForceLedgerResponse: st.builds(ForceLedgerResponse, INT64, STATUS, INT64),
    ListEntriesResponse: list_entries_responses(),
    GetBookieInfoResponse: st.builds(GetBookieInfoResponse, INT64, STATUS, INT64, INT64),
    TrimResponse: st.builds(TrimResponse, INT64, STATUS, INT64),
    StridedReadResponse: strided_read_responses(),
    StartTlsResponse: st.builds(StartTlsResponse, INT64, STATUS),
    AuthResponse: st.builds(AuthResponse, INT64, STATUS, st.text(max_size=40)),
    CollectResponse: st.builds(CollectResponse, INT64, STATUS, INT64, INT64, INT64),
    ErrorResponse: st.builds(
        ErrorResponse,
        STATUS,
        _optional(INT64),
        _optional(st.integers(min_value=0, max_value=255)),
        _optional(INT64),
        _optional(INT64),
    ),
}

REQUESTS: st.SearchStrategy[Message] = st.one_of([STRATEGIES[t] for t in REQUEST_TYPES])
RESPONSES: st.SearchStrategy[Message] = st.one_of([STRATEGIES[t] for t in RESPONSE_TYPES])
