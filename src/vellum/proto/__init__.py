"""The client <-> bookie wire protocol, sans-IO (layer L1): messages, frame encoding, decoding.

One protocol, documented byte by byte in ``docs/protocol.md``:

* a frame is ``int32 frameLen`` + body; the body starts with the header int
  ``(2 << 24) | (opcode << 16) | flags`` (BookKeeper v2 packing);
* ADD (1), READ (2) and BATCH_READ (7) keep BookKeeper v2's byte layout exactly;
* Vellum's own operations (64..74, ERROR 127) put an int64 request id right after the header.

Two modules: ``messages`` names every frame as a value object (constants, one dataclass per
message, and the registry of message types: ``REQUEST_TYPES`` / ``RESPONSE_TYPES``), and
``codec`` turns them into bytes and back. Import message classes from ``vellum.proto.messages``
(``from vellum.proto import messages as m``); this package re-exports only the codec's entry
points, so that the list of message types is kept in one place.

Use :func:`encode` / :func:`encode_parts` to produce frames and a :class:`FrameDecoder` per
connection to turn received bytes into messages. Framing errors raise
:class:`~vellum.errors.FramingError` (close the connection); unusable but well-framed bodies
come out as :class:`BadFrame` (answer ``bad.error_response()`` and keep serving).
No I/O anywhere in this package.
"""

from vellum.proto import codec, messages
from vellum.proto.codec import Decoded, FrameDecoder, Side, decode_body, encode, encode_parts
from vellum.proto.messages import (
    MESSAGE_TYPES,
    REQUEST_TYPES,
    RESPONSE_TYPES,
    BadFrame,
    Message,
    Request,
    Response,
)

__all__ = [
    "MESSAGE_TYPES",
    "REQUEST_TYPES",
    "RESPONSE_TYPES",
    "BadFrame",
    "Decoded",
    "FrameDecoder",
    "Message",
    "Request",
    "Response",
    "Side",
    "codec",
    "decode_body",
    "encode",
    "encode_parts",
    "messages",
]
