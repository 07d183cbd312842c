"""The one writer of a connection's replies: every answer is encoded by the codec, here.

Invariants:
- replies leave in the order they were handed over;
- everything handed over in one loop iteration leaves in one ``writelines`` (coalesced);
  on a TLS transport small buffers are joined first (each buffer becomes a TLS record);
- entry payloads are written as the buffers the messages hold (no copy);
- once detached (connection lost), replies are dropped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from vellum.proto import codec
from vellum.proto import messages as m

_encode_add_responses = codec.encode_add_responses  # bound once: called per answered batch
_encode_parts = codec.encode_parts  # bound once: called per reply
_encode_read_response = codec.encode_read_response  # bound once: called per READ answered


class ReplyWriter:
    """Queues encoded replies and writes them once per loop iteration."""

    __slots__ = ("_coalesce", "_loop", "_out", "_scheduled", "_transport", "wrote")

    def __init__(self, loop: asyncio.AbstractEventLoop, *, coalesce: bool) -> None:
        """``coalesce``: join small buffers before writing (for TLS transports)."""
        self._loop = loop
        self._coalesce = coalesce
        self._transport: asyncio.Transport | None = None
        self._out: list[Any] = []
        self._scheduled = False
        #: replies were written since the connection last looked (its idle timeout)
        self.wrote = False

    def attach(self, transport: asyncio.Transport) -> None:
        """Write to ``transport`` from now on (a connection's, or the TLS one after START_TLS)."""
        self._transport = transport

    def detach(self) -> None:
        self._transport = None
        self._out = []

    def send(self, msg: Any) -> None:
        """Queue ``msg`` (a response message)."""
        if self._transport is None:
            return
        self._out.extend(_encode_parts(msg))
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.flush)

    def send_read(self, status: int, ledger_id: int, entry_id: int, entry: m.BytesLike = b"") -> None:
        """Queue ``ReadResponse(status, ledger_id, entry_id, entry)``, encoded from its fields
        (a READ's answer, without the message object)."""
        if self._transport is None:
            return
        self._out.extend(_encode_read_response(status, ledger_id, entry_id, entry))
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.flush)

    def send_adds(self, status: int | Sequence[int], ledger_ids: Sequence[int], entry_ids: Sequence[int]) -> None:
        """Queue one ADD response per (ledger id, entry id), all with ``status`` or each with
        its own (``status`` a sequence)."""
        if self._transport is None:
            return
        self._out.append(_encode_add_responses(status, ledger_ids, entry_ids))
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.flush)

    def send_now(self, msg: Any) -> None:
        """Write what is queued, then ``msg``, at once (the START_TLS answer must leave in
        clear before the first TLS record)."""
        self.flush()
        if self._transport is not None:
            self._transport.write(codec.encode(msg))

    def flush(self) -> None:
        self._scheduled = False
        if self._out and self._transport is not None:
            self.wrote = True
            out, self._out = self._out, []
            self._transport.writelines(codec.coalesce(out) if self._coalesce else out)
