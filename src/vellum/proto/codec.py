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
* ``encode_parts`` never copies an entry payload; ``encode`` copies it once. A multi-entry
  response whose entries are ``messages.PackedEntries`` (a bookie's run: buffers already laid
  out as ``[int len][entry]`` records) is written as those buffers, with no part per entry.
* There is an encoder and a decoder for exactly the message types of the registry
  (``messages.REQUEST_TYPES`` / ``RESPONSE_TYPES``), checked when the module loads; the opcode
  tables each side decodes with are built from the registry.

Rooms: this module is the facade (the names callers import from it stay here) and the
encoding entry points. The layouts live by message family, each encoder beside its decoder so
that the two halves of a layout are read together: ``frames_v2.py`` (BookKeeper's ADD, READ,
BATCH_READ), ``frames_vellum.py`` (Vellum's operations, START_TLS, AUTH, ERROR); what they share is
``frame_parts.py``; decoding by opcode and the stream framer ``FrameDecoder`` are
``decoding.py``. What is not layout (the messages, the registry) lives in ``messages.py``.

The most frequent frames also have an encoder from their fields, for callers that need no
message object (the same bytes as ``encode_parts`` of the message): ``encode_add_request``,
``encode_read_response``, ``encode_add_responses`` (a batch), ``encode_read_request``,
``encode_read_lac_request`` and ``encode_strided_read_request``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from vellum.errors import IncorrectParameterError
from vellum.proto import frames_v2, frames_vellum

# Re-exported: the names callers import from ``vellum.proto.codec`` (this module is the facade).
from vellum.proto.decoding import (  # noqa: F401
    _DECODERS,
    _REQUEST_DECODERS,
    _RESPONSE_DECODERS,
    Decoded,
    FrameDecoder,
    decode_body,
)
from vellum.proto.frame_parts import Side  # noqa: F401
from vellum.proto.frames_v2 import (  # noqa: F401
    encode_add_head,
    encode_add_request,
    encode_add_responses,
    encode_read_request,
    encode_read_response,
)
from vellum.proto.frames_vellum import (  # noqa: F401
    ERROR_HAS_ENTRY_ID,
    ERROR_HAS_LEDGER_ID,
    ERROR_HAS_OPCODE,
    ERROR_HAS_REQUEST_ID,
    encode_read_lac_request,
    encode_strided_read_request,
)
from vellum.proto.messages import MESSAGE_TYPES, BytesLike, Message

# Keyed by exact type: messages are final dataclasses, and a dict lookup beats isinstance chains.
_ENCODERS: dict[type[Any], Callable[[Any], list[BytesLike]]] = {**frames_v2.ENCODERS, **frames_vellum.ENCODERS}


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


def encode(msg: Message) -> bytes:
    """The frame of ``msg`` (length prefix included) as one ``bytes`` (payload copied once)."""
    parts = encode_parts(msg)
    if len(parts) == 1:
        return bytes(parts[0])
    return b"".join(parts)


def _check_layouts() -> None:
    """Every registered message type has an encoder and a decoder, and nothing else has."""
    registered = set(MESSAGE_TYPES)
    if set(_ENCODERS) != registered or set(_DECODERS) != registered:
        odd = sorted(t.__name__ for t in (registered ^ set(_ENCODERS)) | (registered ^ set(_DECODERS)))
        raise ImportError(f"proto.codec's layouts do not match the message registry: {', '.join(odd)}")


_check_layouts()
