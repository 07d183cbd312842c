"""What every frame layout shares (sans-IO): the header and integer structs, the checks of
master keys, flags and texts, and ``_Malformed``, how a decoder says a body does not match its
layout. The layouts themselves are ``frames_v2.py`` and ``frames_vellum.py``; ``codec.py`` is the
facade. Package-private: only the ``proto`` modules import these names.

The decoders of the frames of every read (READ, READ_STRIDED and READ_LAC answers, READ and
READ_STRIDED requests) make their message through its positional constructor in
``messages`` (``new_read_response`` and the like, made by ``vellum.frozen.builder``): the same
message at about half the cost of its own ``__init__``."""

from __future__ import annotations

import struct
from array import array
from collections.abc import Callable, Sequence
from typing import Literal, TypeAlias

from vellum.errors import EOK, IncorrectParameterError
from vellum.proto.messages import (
    MASTER_KEY_LENGTH,
    PROTOCOL_VERSION,
    BytesLike,
    FrameEntries,
    Message,
    PackedEntries,
)

Side: TypeAlias = Literal["server", "client"]

_V = PROTOCOL_VERSION << 24

# Structs. Encoders pack the frame length and header together with the fixed fields;
# decoders read the fixed fields from offset 4 (just after the header, already parsed).
_INT = struct.Struct(">i")

_HEADER = struct.Struct(">I")

_LONG = struct.Struct(">q")

_ENTRY_IDS = struct.Struct(">qq")

_RANGE = struct.Struct(">qq")


def _body(frame: struct.Struct) -> struct.Struct:
    """The decoding twin of an encoding struct: the same fields without the frame length."""
    assert frame.format.startswith(">iI")
    return struct.Struct(">" + frame.format[2:])


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


class _Malformed(Exception):
    """A body does not match its opcode's layout (internal: becomes a BadFrame)."""


def _expect(body: memoryview, size: int, name: str) -> None:
    if len(body) != size:
        raise _Malformed(f"{name} frame body of {len(body)} bytes, expected {size}")


def _entry_parts(status: int, entries: Sequence[BytesLike], what: str) -> tuple[list[BytesLike], int]:
    """The ``[int len][entry]`` list of a multi-entry response as buffers after an empty slot
    for the fixed part (filled by the caller), and the frame size with a 32-byte fixed part;
    the encoding twin of ``_entries``. ``PackedEntries`` are written as their parts (no
    length field packed, no part per entry)."""
    if status != EOK and entries:
        raise IncorrectParameterError(f"{what} response: entries are only sent with EOK")
    if type(entries) is PackedEntries:
        # Already laid out as the frame carries them (a bookie's run): written as they are.
        return [b"", *entries.parts], 32 + entries.wire_bytes
    parts: list[BytesLike] = [b""]
    size = 32
    for entry in entries:
        parts.append(_INT.pack(len(entry)))
        parts.append(entry)
        size += 4 + len(entry)
    return parts, size


def _entries(body: memoryview, pos: int, what: str, owned: bool) -> FrameEntries:
    """The ``[int len][entry]`` list filling ``body`` from ``pos``, as offsets into one buffer:
    ``body`` itself when the frame owns its buffer, else one copy of the list (the decoder's
    buffer is reused for the next frames)."""
    if not owned:
        body = memoryview(bytes(body[pos:]))
        pos = 0
    end = len(body)
    starts: list[int] = []  # lists, made arrays once: list.append is the cheaper per entry
    ends: list[int] = []
    add_start, add_end = starts.append, ends.append
    unpack = _INT.unpack_from
    while pos < end:
        if end - pos < 4:
            raise _Malformed(f"{what} response: {end - pos} trailing bytes after entry {len(starts)}")
        (size,) = unpack(body, pos)
        pos += 4
        if size < 0 or size > end - pos:
            raise _Malformed(f"{what} response: entry {len(starts)} claims {size} bytes, {end - pos} left")
        add_start(pos)
        pos += size
        add_end(pos)
    return FrameEntries(body, array("q", starts), array("q", ends))


def _utf8(text: str, limit: int, what: str) -> bytes:
    data = text.encode("utf-8")
    if len(data) > limit:
        raise IncorrectParameterError(f"AUTH {what} of {len(data)} bytes exceeds {limit}")
    return data


def _text(data: memoryview, limit: int, what: str) -> str:
    if len(data) > limit:
        raise _Malformed(f"AUTH {what} of {len(data)} bytes exceeds {limit}")
    try:
        return str(bytes(data), "utf-8")
    except UnicodeDecodeError:
        raise _Malformed(f"AUTH {what} is not UTF-8") from None

_Decoder: TypeAlias = Callable[[memoryview, int], Message]
