"""The bookie cookie: the text stamped in ``current/VERSION`` of every bookie directory and stored
in the metadata store at ``/ledgers/cookies/<bookieId>``.

A cookie ties a bookie id to its disks (rule 6 of docs/correctness.md): a wiped, swapped or foreign directory
shows up as a missing or different cookie and the bookie refuses to start.

Layout (UTF-8 text, what BookKeeper writes; current layout version 5)::

    5\\n
    bookieHost: "127.0.0.1:3181"\\n
    journalDir: "/data/j1,/data/j2"\\n
    ledgerDirs: "2\\t/data/l1\\t/data/l2"\\n
    instanceId: "6c7e...-..."\\n            (optional)
    indexDirs: "1\\t/data/idx"\\n           (optional)

- line 1: the layout version as a decimal integer;
- then protobuf TextFormat of ``CookieFormat`` (proto2; field numbers bookieHost=1, journalDir=2,
  ledgerDirs=3, instanceId=4, indexDirs=5), fields printed in field-number order, one per line,
  string values double-quoted with TextFormat escaping (the tab separators of the dir lists are
  therefore written as the two characters ``\\t``; non-ASCII bytes of the UTF-8 text as ``\\ooo``);
- ``journalDir``: the journal directories joined with ``,`` (BookKeeper's ``Joiner.on(',')``);
- ``ledgerDirs`` / ``indexDirs``: the directory count, then each directory, separated by TAB:
  ``"<n>\\t<dir1>\\t<dir2>"`` (BookKeeper's ``encodeDirPaths``); ``indexDirs`` is omitted when the
  index lives in the ledger directories;
- ``instanceId``: the cluster instance id (``/ledgers/INSTANCEID``), omitted when unknown.

Layout version 3 (read-only here) is four plain lines: version, bookie host, journal dirs, ledger
dirs (same encodings, no quoting). Version 4 is version 5 without ``indexDirs``. Vellum always
writes version 5. Pure: encoding, decoding and comparison only.
"""

from __future__ import annotations

from dataclasses import dataclass

from vellum.errors import CookieError, CorruptionError, UnknownFormatVersionError
from vellum.format.text_format import ESCAPES_IN, escape_text

CURRENT_COOKIE_LAYOUT_VERSION = 5
#: Oldest layout version a bookie can still read (and must then upgrade).
MIN_READABLE_COOKIE_LAYOUT_VERSION = 3
#: File name of the cookie inside each directory's ``current/``.
VERSION_FILENAME = "VERSION"

_DIR_SEPARATOR = "\t"
_JOURNAL_SEPARATOR = ","

# CookieFormat fields in field-number order (TextFormat prints them in this order).
_FIELDS = ("bookieHost", "journalDir", "ledgerDirs", "instanceId", "indexDirs")


@dataclass(frozen=True)
class Cookie:
    """One bookie's identity and directory set.

    ``journal_dirs``, ``ledger_dirs`` and ``index_dirs`` are the directory names as configured
    (compared as strings, in order for equality). ``index_dirs`` is None when the index lives in
    the ledger dirs. ``layout_version`` records what was read; ``encode`` always writes the
    current version.
    """

    bookie_id: str
    journal_dirs: tuple[str, ...]
    ledger_dirs: tuple[str, ...]
    instance_id: str | None = None
    index_dirs: tuple[str, ...] | None = None
    layout_version: int = CURRENT_COOKIE_LAYOUT_VERSION

    def __post_init__(self) -> None:
        if not self.bookie_id:
            raise CookieError("a cookie needs a bookie id")
        if not self.journal_dirs or not self.ledger_dirs:
            raise CookieError("a cookie needs at least one journal dir and one ledger dir")
        for d in self.journal_dirs:
            if _JOURNAL_SEPARATOR in d:
                raise CookieError(f"journal dir {d!r} contains ',' which the cookie cannot encode")
        for d in (*self.ledger_dirs, *(self.index_dirs or ())):
            if _DIR_SEPARATOR in d:
                raise CookieError(f"directory {d!r} contains a TAB which the cookie cannot encode")

    # -- encoding --------------------------------------------------------------------------

    def encode(self) -> bytes:
        """The cookie text in the current layout (version 5), UTF-8."""
        values: dict[str, str] = {
            "bookieHost": self.bookie_id,
            "journalDir": _JOURNAL_SEPARATOR.join(self.journal_dirs),
            "ledgerDirs": _encode_dir_paths(self.ledger_dirs),
        }
        if self.instance_id:
            values["instanceId"] = self.instance_id
        if self.index_dirs:
            values["indexDirs"] = _encode_dir_paths(self.index_dirs)
        lines = [str(CURRENT_COOKIE_LAYOUT_VERSION)]
        lines += [f'{name}: "{escape_text(values[name])}"' for name in _FIELDS if name in values]
        return ("\n".join(lines) + "\n").encode("utf-8")

    @classmethod
    def decode(cls, data: bytes, *, where: str = "cookie") -> Cookie:
        """Parse cookie text of layout version 3, 4 or 5; ``where`` names the file in errors."""
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise CorruptionError(f"{where}: cookie is not UTF-8 text ({e.reason} at byte {e.start})") from None
        lines = text.split("\n")
        first = lines[0].strip()
        if not first:
            raise CorruptionError(f"{where}: empty cookie (no layout version line)")
        try:
            version = int(first)
        except ValueError:
            raise CorruptionError(
                f"{where}: first line {first[:40]!r} is not a cookie layout version"
            ) from None
        if version > CURRENT_COOKIE_LAYOUT_VERSION:
            raise UnknownFormatVersionError(
                f"{where}: cookie layout version {version} is newer than this Vellum understands "
                f"(up to {CURRENT_COOKIE_LAYOUT_VERSION}); upgrade Vellum"
            )
        if version < MIN_READABLE_COOKIE_LAYOUT_VERSION:
            raise CookieError(
                f"{where}: cookie layout version {version} is too old "
                f"(oldest readable: {MIN_READABLE_COOKIE_LAYOUT_VERSION})"
            )
        if version == 3:
            return cls._decode_v3(lines[1:], where)
        fields = _parse_text_format("\n".join(lines[1:]), where)
        for required in ("bookieHost", "journalDir", "ledgerDirs"):
            if required not in fields:
                raise CorruptionError(f"{where}: cookie has no {required} field")
        try:
            return cls(
                bookie_id=fields["bookieHost"],
                journal_dirs=tuple(fields["journalDir"].split(_JOURNAL_SEPARATOR)),
                ledger_dirs=_decode_dir_paths(fields["ledgerDirs"], where, "ledgerDirs"),
                instance_id=fields.get("instanceId") or None,
                index_dirs=(
                    _decode_dir_paths(fields["indexDirs"], where, "indexDirs")
                    if fields.get("indexDirs")
                    else None
                ),
                layout_version=version,
            )
        except CookieError as e:
            raise CorruptionError(f"{where}: {e}") from None

    @classmethod
    def _decode_v3(cls, lines: list[str], where: str) -> Cookie:
        body = [line.rstrip("\r") for line in lines]
        while body and not body[-1]:
            body.pop()
        if len(body) != 3:
            raise CorruptionError(
                f"{where}: a version 3 cookie has 3 lines after the version, found {len(body)}"
            )
        host, journals, ledgers = body
        try:
            return cls(
                bookie_id=host,
                journal_dirs=tuple(journals.split(_JOURNAL_SEPARATOR)),
                ledger_dirs=_decode_dir_paths(ledgers, where, "ledgerDirs"),
                layout_version=3,
            )
        except CookieError as e:
            raise CorruptionError(f"{where}: {e}") from None

    # -- comparison ------------------------------------------------------------------------

    def with_dirs(self, ledger_dirs: tuple[str, ...], index_dirs: tuple[str, ...] | None) -> Cookie:
        """This cookie with another ledger/index dir set (storage expansion), current layout."""
        return Cookie(
            bookie_id=self.bookie_id,
            journal_dirs=self.journal_dirs,
            ledger_dirs=ledger_dirs,
            instance_id=self.instance_id,
            index_dirs=index_dirs,
        )

    def verify_matches(self, other: Cookie, *, allow_expansion: bool = False) -> None:
        """Check that ``other`` (a stored cookie) describes the same bookie and disks as ``self``
        (the expected cookie built from the configuration).

        With ``allow_expansion`` the configured ledger/index dirs may be a superset of the
        stored ones (new disks added); journal dirs must always be equal. Raises CookieError
        naming the first differing field and what to do about it.
        """
        if self.bookie_id != other.bookie_id:
            raise CookieError(
                f"bookie id differs: expected {self.bookie_id!r}, the cookie says {other.bookie_id!r}. "
                "The directory belongs to another bookie (swapped disk or changed bookieId/port); "
                "restore the original bookie id or give this bookie its own empty directories"
            )
        if self.journal_dirs != other.journal_dirs:
            raise CookieError(
                f"journal dirs differ: expected {list(self.journal_dirs)}, the cookie says "
                f"{list(other.journal_dirs)}. Restore journalDirectories to the stamped value; "
                "journal dirs cannot be changed on an existing bookie"
            )
        _verify_dir_set("ledger dirs", "ledgerDirectories", self.ledger_dirs, other.ledger_dirs, allow_expansion)
        mine = self.index_dirs or self.ledger_dirs
        theirs = other.index_dirs or other.ledger_dirs
        _verify_dir_set("index dirs", "indexDirectories", mine, theirs, allow_expansion)
        if (self.instance_id or None) != (other.instance_id or None):
            raise CookieError(
                f"instance id differs: expected {self.instance_id!r}, the cookie says "
                f"{other.instance_id!r}. The directory was stamped by a bookie of another cluster "
                "(or the metadata store was reformatted); wipe the bookie's directories "
                "(its data belongs to the other cluster) or point it at the right metadata store"
            )


def _verify_dir_set(
    what: str, key: str, expected: tuple[str, ...], stored: tuple[str, ...], allow_expansion: bool
) -> None:
    if allow_expansion:
        missing = [d for d in stored if d not in expected]
        if missing:
            raise CookieError(
                f"{what} differ: the cookie lists {missing} which the configuration no longer has "
                f"(configured {list(expected)}). Removing a directory loses its data; put it back "
                f"in {key}"
            )
    elif expected != stored:
        raise CookieError(
            f"{what} differ: expected {list(expected)}, the cookie says {list(stored)}. "
            f"Restore {key} to the stamped value, or set allowStorageExpansion=true to add "
            "new directories"
        )


def _encode_dir_paths(dirs: tuple[str, ...]) -> str:
    return _DIR_SEPARATOR.join([str(len(dirs)), *dirs])


def _decode_dir_paths(value: str, where: str, field: str) -> tuple[str, ...]:
    parts = value.split(_DIR_SEPARATOR)
    try:
        count = int(parts[0])
    except ValueError:
        raise CorruptionError(f"{where}: {field} {value[:60]!r} does not start with a count") from None
    dirs = tuple(parts[1:])
    if count != len(dirs):
        raise CorruptionError(f"{where}: {field} says {count} dirs but lists {len(dirs)}")
    return dirs


# -- protobuf TextFormat (the subset a CookieFormat message needs) ------------------------


def _parse_text_format(text: str, where: str) -> dict[str, str]:
    """Parse ``name: "string"`` pairs (TextFormat), with comments and adjacent-literal
    concatenation; unknown field names are errors (a cookie with extra fields is not ours)."""
    fields: dict[str, str] = {}
    i, n = 0, len(text)
    while True:
        i = _skip_blank(text, i)
        if i >= n:
            return fields
        start = i
        while i < n and (text[i].isalnum() or text[i] == "_"):
            i += 1
        name = text[start:i]
        if not name:
            raise CorruptionError(f"{where}: unexpected {text[i:i + 20]!r} in cookie body")
        if name not in _FIELDS:
            raise CorruptionError(f"{where}: unknown cookie field {name!r}")
        if name in fields:
            raise CorruptionError(f"{where}: cookie field {name!r} appears twice")
        i = _skip_blank(text, i)
        if i >= n or text[i] != ":":
            raise CorruptionError(f"{where}: expected ':' after cookie field {name!r}")
        i = _skip_blank(text, i + 1)
        if i >= n or text[i] not in "\"'":
            raise CorruptionError(f"{where}: cookie field {name!r} is not a quoted string")
        raw = bytearray()
        while i < n and text[i] in "\"'":
            i = _read_literal(text, i, raw, where, name)
            i = _skip_blank(text, i)
        try:
            fields[name] = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise CorruptionError(f"{where}: cookie field {name!r} is not valid UTF-8") from None


def _skip_blank(text: str, i: int) -> int:
    n = len(text)
    while i < n:
        if text[i].isspace():
            i += 1
        elif text[i] == "#":
            while i < n and text[i] != "\n":
                i += 1
        else:
            break
    return i


def _read_literal(text: str, i: int, out: bytearray, where: str, name: str) -> int:
    quote = text[i]
    i += 1
    n = len(text)
    while True:
        if i >= n or text[i] == "\n":
            raise CorruptionError(f"{where}: unterminated string in cookie field {name!r}")
        c = text[i]
        if c == quote:
            return i + 1
        if c != "\\":
            out += c.encode("utf-8")
            i += 1
            continue
        if i + 1 >= n:
            raise CorruptionError(f"{where}: dangling escape in cookie field {name!r}")
        e = text[i + 1]
        if e in ESCAPES_IN:
            out.append(ESCAPES_IN[e])
            i += 2
        elif e in "01234567":
            j = i + 1
            while j < n and j < i + 4 and text[j] in "01234567":
                j += 1
            value = int(text[i + 1 : j], 8)
            if value > 0xFF:
                raise CorruptionError(f"{where}: octal escape out of range in cookie field {name!r}")
            out.append(value)
            i = j
        elif e == "x":
            j = i + 2
            while j < n and j < i + 4 and text[j] in "0123456789abcdefABCDEF":
                j += 1
            if j == i + 2:
                raise CorruptionError(f"{where}: bad \\x escape in cookie field {name!r}")
            out.append(int(text[i + 2 : j], 16))
            i = j
        else:
            raise CorruptionError(f"{where}: unknown escape \\{e} in cookie field {name!r}")
