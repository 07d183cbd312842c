"""Decoding (sans-IO): the decoders of every frame by opcode, one direction at a time (built
from the message registry), ``decode_body`` for one frame body, and ``FrameDecoder``, the framer
of a byte stream with its zero-copy ownership rules (views only of buffers it owns) and its
batching of pipelined ADDs into ``AddBatch`` columns. ``codec.py`` is the facade that names
these."""

from __future__ import annotations

import functools
import struct
from itertools import repeat
from operator import itemgetter
from typing import Any, TypeAlias

from vellum.errors import EBADVERSION, FramingError, IncorrectParameterError
from vellum.proto import frames_v2, frames_vellum
from vellum.proto.frame_parts import (
    _ENTRY_IDS,
    _HEADER,
    _INT,
    _LONG,
    Side,
    _Decoder,
    _Malformed,
)
from vellum.proto.frames_v2 import (
    _ADD_FRAME,
    _ADD_FRAME_MIN_BODY,
    _ADD_HEADER,
    _ADD_HEADER_MASK,
    _ADD_RESP,
    _dec_add_req,
    _dec_batch_resp,
    _dec_read_resp,
)
from vellum.proto.frames_vellum import (
    _dec_strided_resp,
)
from vellum.proto.messages import (
    MASTER_KEY_LENGTH,
    OP_ADD,
    OP_BATCH_READ,
    OP_COLLECT,
    OP_ERROR,
    OP_FORCE_LEDGER,
    OP_LEDGER_CLOSED,
    OP_LIST_ENTRIES,
    OP_LONG_POLL_READ_LAC,
    OP_READ,
    OP_READ_LAC,
    OP_READ_STRIDED,
    OP_TRIM,
    OP_WRITE_LAC,
    OPCODE_NAMES,
    PROTOCOL_VERSION,
    REQUEST_TYPES,
    RESPONSE_TYPES,
    AddAnswers,
    AddBatch,
    BadFrame,
    BytesLike,
    Message,
)

Decoded: TypeAlias = Message | BadFrame | AddBatch | AddAnswers

#: the body size of a v2 ADD response (header, rc, ledger id, entry id)
_ADD_RESP_BODY = _ADD_RESP.size - 4
#: ADD answers decoded at once at most (a run is cut at the first frame unlike its first)
_ANSWER_RUN = 256
#: ADD frames decoded at once at most (the same), and the frame sizes whose structs a decoder keeps
_ADD_RUN = 256
_ADD_RUN_SIZES = 16
_first = itemgetter(0)
#: bound once: ``FrameDecoder.buffer_updated`` reads them as globals instead of binding a local
#: each call (most calls parse one or two frames)
_unpack_len = _INT.unpack_from
_unpack_add = _ADD_FRAME.unpack_from
_unpack_answer = _ADD_RESP.unpack_from
_iter_answers = _ADD_RESP.iter_unpack
_ADD_RESP_SIZE = _ADD_RESP.size
#: ``FrameDecoder.BIG_FRAME``
_BIG_FRAME = 16 * 1024


# Keyed by message type like the encoders; the opcode tables each side decodes with are built
# from the registry (messages.REQUEST_TYPES / RESPONSE_TYPES).
_DECODERS: dict[type[Any], _Decoder] = {**frames_v2.DECODERS, **frames_vellum.DECODERS}


def _opcode_table(types: tuple[type[Any], ...]) -> dict[int, _Decoder]:
    """The decoders of one direction (requests or responses) by opcode."""
    table = {t.OPCODE: _DECODERS[t] for t in types}
    if len(table) != len(types):
        raise ImportError("two message types of one direction share an opcode")
    return table

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
    responses. With ``batch_adds``, consecutive well-formed v2 ADD frames of one read come out
    as one batch of columns: on the server side one :class:`AddBatch` instead of one
    ``AddRequest`` each (a big ADD frame received into its own buffer stays an ``AddRequest``),
    on the client side one :class:`AddAnswers` instead of one ``AddResponse`` each (an ADD
    response of another size is malformed and stays the ``BadFrame`` it decodes to). Two ways
    in, one decoder:

    - ``feed(data)``: the messages the data completes, in order; partial frames are kept until
      the rest arrives. Never keeps a view of ``data``.
    - ``get_buffer()`` / ``buffer_updated(n)``: the ``asyncio.BufferedProtocol`` pair. The
      socket is read straight into the decoder's buffers: small frames into a reused scratch
      buffer (decoded with copies), a frame of ``BIG_FRAME`` bytes or more into a buffer of its
      own, whose entry payloads the messages then hold as views (no copy at all). After a big
      frame the decoder asks for just the next frame's length first, so that a big body is
      never read into scratch and moved.

    By default memory follows the bytes received, never the lengths announced: the scratch
    buffer is made at the first read, and a big frame's buffer starts at ``BIG_START`` bytes (or
    the frame's size, if smaller) and doubles as it fills, so a peer that announces a big frame
    and sends little costs little (what a bookie needs against its peers). With
    ``allocate_announced`` a big frame's buffer is made once, at the size its length announces,
    and the socket is read straight into it: no doubling, no copy of what came, one zero-fill.
    That is for a client reading the answers to its own requests, whose sizes it asked for; the
    announced length is checked against ``max_frame_size`` before anything is allocated, so a
    corrupt or hostile length costs at most that. ``max_frame_size`` may be changed between
    reads (a server accepts only small frames from a peer that has not authenticated yet, then
    raises it).

    Big frames' buffers are never reused: the messages keep views of them for as long as their
    holders like.

    A :class:`FramingError` (negative or oversized length) is raised from ``feed`` /
    ``buffer_updated`` and again from every later call.
    """

    #: frames at least this big get a buffer of their own
    BIG_FRAME = _BIG_FRAME
    #: the reused receive buffer for smaller frames (holds any partial small frame)
    SCRATCH = 64 * 1024
    #: a big frame's buffer starts this big (at most) and doubles as the frame's bytes arrive
    #: (unless ``allocate_announced``)
    BIG_START = 64 * 1024

    __slots__ = ("_add_answers", "_add_requests", "_add_runs", "_allocate_announced", "_big", "_big_fill", "_big_size", "_decoders", "_end", "_failure", "_max",
                 "_owned_decoders", "_peek", "_scratch", "_scratch_size", "_side", "_start", "_view")

    def __init__(self, max_frame_size: int, *, side: Side, batch_adds: bool = False,
                 allocate_announced: bool = False) -> None:
        if max_frame_size < 4:
            raise IncorrectParameterError(f"max_frame_size {max_frame_size} is below a frame header")
        if side not in ("server", "client"):
            raise IncorrectParameterError(f"side must be 'server' or 'client', not {side!r}")
        self._max = max_frame_size
        self._side: Side = side
        self._add_requests = batch_adds and side == "server"  # ADD frames come out as an AddBatch
        self._add_answers = batch_adds and side == "client"  # ADD answers come out as AddAnswers
        self._allocate_announced = allocate_announced
        self._decoders = _REQUEST_DECODERS if side == "server" else _RESPONSE_DECODERS
        self._owned_decoders = _REQUEST_DECODERS_OWNED if side == "server" else _RESPONSE_DECODERS_OWNED
        # Made at the first read (an idle connection costs none), then never resized: views
        # of it may be out.
        self._scratch = bytearray()
        self._scratch_size = 0  # len(_scratch), kept with it (get_buffer compares without a call)
        self._view = memoryview(self._scratch)  # of the scratch buffer, made with it (one view, not one a read)
        self._start = 0  # unparsed bytes are _scratch[_start:_end]
        self._end = 0
        self._big: bytearray | None = None  # body of the big frame being received, as far as it came
        self._big_fill = 0
        self._big_size = 0  # the big frame's announced body size (len(_big) grows towards it)
        self._peek = False  # the last frame was big: read the next length on its own
        self._failure: str | None = None
        self._add_runs: dict[int, tuple[struct.Struct, struct.Struct]] = {}  # by ADD body size

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
        end = self._end
        if end == self._scratch_size or (self._peek and self._start):
            if not self._scratch_size:
                self._scratch = bytearray(self.SCRATCH)
                self._scratch_size = self.SCRATCH
                self._view = memoryview(self._scratch)
            self._compact()
            end = self._end
        if self._peek and end < 4:
            return self._view[end:4]
        # a view of the decoder's own view (its caller may release it)
        return self._view[end:]

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
        end = self._end = self._end + nbytes
        # The scratch buffer's parse, inline (one call a read less): every frame complete in
        # _scratch[_start:_end], in order. (Most reads complete one or two frames: what a frame
        # does not use is not bound to a local first.)
        out: list[Decoded] = []
        view = self._view
        pos = self._start
        adds: AddBatch | None = None
        answers: AddAnswers | None = None
        while end - pos >= 4:
            (size,) = _unpack_len(view, pos)
            if size < 0 or size > self._max:
                limit = self._max
                self._failure = (
                    f"frame length {size} outside 0..{limit} (max frame size): stream out of sync"
                )
                raise FramingError(self._failure)
            start = pos + 4
            stop = start + size
            if stop <= end:
                if self._add_requests and size >= _ADD_FRAME_MIN_BODY:
                    _size, header, key, ledger_id, entry_id, lac = _unpack_add(view, pos)
                    if header & _ADD_HEADER_MASK == _ADD_HEADER:
                        if adds is None:
                            adds = AddBatch()
                            out.append(adds)
                        if end - stop >= size + 4 and size < _BIG_FRAME:  # a whole frame as big follows
                            # This ADD and those that follow it, as many whole frames as are
                            # like it (same size and header), decoded as columns at once.
                            run = min((end - pos) // (size + 4), _ADD_RUN)
                            stop = pos + run * (size + 4)
                            ids_of, entries_of = self._add_run_structs(size)
                            sizes, headers, keys, ledger_ids, entry_ids, lacs = zip(
                                *ids_of.iter_unpack(view[pos:stop]))
                            if sizes.count(size) != run or headers.count(header) != run:
                                run = next(k for k, (z, h) in enumerate(zip(sizes, headers))
                                           if z != size or h != header)
                                stop = pos + run * (size + 4)
                                keys, ledger_ids, entry_ids, lacs = (
                                    keys[:run], ledger_ids[:run], entry_ids[:run], lacs[:run])
                            # The columns the whole ADD path uses; each entry's one copy.
                            adds.entries.extend(map(_first, entries_of.iter_unpack(view[pos:stop])))
                            adds.keys.extend(keys)
                            adds.flags.extend(repeat(header & 0xFFFF, run))
                            adds.ledger_ids.extend(ledger_ids)
                            adds.entry_ids.extend(entry_ids)
                            adds.lacs.extend(lacs)
                            pos = stop
                            self._peek = False
                            continue
                        # The columns the whole ADD path uses; the entry's one copy.
                        adds.append(bytes(view[start + 24 : stop]), key, header & 0xFFFF,
                                    ledger_id, entry_id, lac)
                        pos = stop
                        self._peek = size >= _BIG_FRAME
                        continue
                elif self._add_answers and size == _ADD_RESP_BODY:
                    _size, header, status, ledger_id, entry_id = _unpack_answer(view, pos)
                    if header & _ADD_HEADER_MASK == _ADD_HEADER:
                        if answers is None:
                            answers = AddAnswers()
                            out.append(answers)
                        self._peek = False
                        if end - stop >= _ADD_RESP_SIZE:  # a whole answer follows
                            # The answers that follow this one, decoded as columns at once:
                            # as many whole frames as are like it (same size and header).
                            run = min((end - pos) // _ADD_RESP_SIZE, _ANSWER_RUN)
                            stop = pos + run * _ADD_RESP_SIZE
                            sizes, headers, statuses, ledger_ids, entry_ids = zip(
                                *_iter_answers(view[pos:stop]))
                            if sizes.count(size) != run or headers.count(header) != run:
                                run = next(k for k, (z, h) in enumerate(zip(sizes, headers))
                                           if z != size or h != header)
                                stop = pos + run * _ADD_RESP_SIZE
                                statuses, ledger_ids, entry_ids = (
                                    statuses[:run], ledger_ids[:run], entry_ids[:run])
                            answers.statuses.extend(statuses)
                            answers.ledger_ids.extend(ledger_ids)
                            answers.entry_ids.extend(entry_ids)
                            pos = stop
                            continue
                        answers.statuses.append(status)
                        answers.ledger_ids.append(ledger_id)
                        answers.entry_ids.append(entry_id)
                        pos = stop
                        continue
                adds = None
                answers = None
                out.append(_decode(view[start:stop], self._decoders, self._side))  # copies what it keeps
                pos = stop
                self._peek = size >= _BIG_FRAME
                continue
            if size >= _BIG_FRAME:
                have = end - start
                # ``size`` is within ``limit`` (checked above). By default never the announced
                # size up front: what came, and room for as much again.
                big = bytearray(size if self._allocate_announced else min(size, max(self.BIG_START, 2 * have)))
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
        return out

    def _add_run_structs(self, size: int) -> tuple[struct.Struct, struct.Struct]:
        """For a run of ADD frames of body ``size``: the struct of one whole frame's length,
        header, master key and the entry's ids (the rest skipped), and that of its entry."""
        found = self._add_runs.get(size)
        if found is None:
            if len(self._add_runs) >= _ADD_RUN_SIZES:
                self._add_runs.clear()
            entry = size - 4 - MASTER_KEY_LENGTH
            found = self._add_runs[size] = (
                struct.Struct(f">iI{MASTER_KEY_LENGTH}sqqq{entry - 24}x"),
                struct.Struct(f">{8 + MASTER_KEY_LENGTH}x{entry}s"),
            )
        return found

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
