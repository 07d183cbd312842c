"""Strings of protobuf TextFormat as Java's ``TextFormat`` prints and reads them: the one home of
their escapes, shared by the cookie (``format/cookie.py``) and the under-replication records
(``meta/underreplication.py``), which BookKeeper both writes as TextFormat.

Printing escapes the C escapes, quotes and backslash, and writes every byte of the UTF-8 encoding
outside printable ASCII as a three-digit octal escape. Reading also takes ``\\?`` and octal and
hex escapes (each reader parses its own message layout).
"""

from __future__ import annotations

#: byte -> its escape when printed
ESCAPES_OUT = {
    0x07: "\\a", 0x08: "\\b", 0x0C: "\\f", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t", 0x0B: "\\v",
    0x5C: "\\\\", 0x27: "\\'", 0x22: '\\"',
}
#: the letter after a backslash -> the byte it stands for when read (octal and hex escapes aside)
ESCAPES_IN = {
    "a": 0x07, "b": 0x08, "f": 0x0C, "n": 0x0A, "r": 0x0D, "t": 0x09, "v": 0x0B,
    "\\": 0x5C, "'": 0x27, '"': 0x22, "?": 0x3F,
}


def escape_text(value: str) -> str:
    """The body of a TextFormat string literal for ``value`` (without the quotes)."""
    out = []
    for b in value.encode("utf-8"):
        if b in ESCAPES_OUT:
            out.append(ESCAPES_OUT[b])
        elif 0x20 <= b < 0x7F:
            out.append(chr(b))
        else:
            out.append(f"\\{b:03o}")
    return "".join(out)
