"""Ledger metadata: the model and its versioned, human-readable serialization.

Responsibility: ``LedgerMetadata`` (BookKeeper's ``LedgerMetadataFormat`` fields) and the bytes a
metadata store keeps for it, plus the cluster layout record (``/ledgers/LAYOUT``).

Serialized form (format version 1)::

    VellumLedgerMetadata\\t1\\n
    {"ensembleSize": 3, "writeQuorumSize": 2, "ackQuorumSize": 2, "state": "OPEN", ...}

The first line names the format and its version; the rest is one JSON object whose bytes
fields (``password``, ``customMetadata`` values) are base64.  A person can read it with
``zkCli.sh get`` or ``sqlite3``.  The password is stored in clear, as BookKeeper stores it
(field 8 of ``LedgerMetadataFormat``): whoever can read the metadata store can write to ledgers.

Invariants:
- ``ensemble_size >= write_quorum_size >= ack_quorum_size >= 1``;
- ``ensembles`` is non-empty, keyed by first entry id, starts at entry 0, keys strictly
  increasing, each ensemble has exactly ``ensemble_size`` distinct bookies;
- decoding rejects a newer format version, a foreign header (e.g. BookKeeper's binary v3) and
  malformed JSON with a ``MetaStoreError`` that names where the bytes came from.
No I/O here.
"""

from __future__ import annotations

import base64
import binascii
import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vellum.errors import IncorrectParameterError, MetaStoreError
from vellum.format.entry import DigestType  # BookKeeper's numbers (DataFormats.proto field 7)
from vellum.ids import BookieId

METADATA_FORMAT_NAME = "VellumLedgerMetadata"
METADATA_FORMAT_VERSION = 1
_HEADER_PREFIX = (METADATA_FORMAT_NAME + "\t").encode()
_BK_HEADER = b"BookieMetadataFormatVersion\t"


class LedgerState(enum.IntEnum):
    """BookKeeper's ledger states (DataFormats.proto field 5)."""

    OPEN = 1
    IN_RECOVERY = 2
    CLOSED = 3


@dataclass(frozen=True, eq=True)
class LedgerMetadata:
    """What the metadata store knows about one ledger (immutable; derive new values with the helpers)."""

    ensemble_size: int
    write_quorum_size: int
    ack_quorum_size: int
    ensembles: Mapping[int, tuple[BookieId, ...]]
    digest_type: DigestType = DigestType.CRC32C
    password: bytes = field(default=b"", repr=False)
    state: LedgerState = LedgerState.OPEN
    last_entry_id: int = -1
    length: int = 0
    custom_metadata: Mapping[str, bytes] = field(default_factory=dict)
    ctime_ms: int = 0
    creator_token: int = 0

    __hash__ = None  # type: ignore[assignment]  # holds mappings

    def __post_init__(self) -> None:
        # (BookieId is str at run time: map(str, ...) builds each tuple in C)
        ens: dict[int, tuple[str, ...]] = {int(k): tuple(map(str, v)) for k, v in sorted(self.ensembles.items())}
        object.__setattr__(self, "ensembles", ens)
        object.__setattr__(self, "custom_metadata", {str(k): bytes(v) for k, v in self.custom_metadata.items()})
        if type(self.digest_type) is not DigestType:
            object.__setattr__(self, "digest_type", DigestType(self.digest_type))
        if type(self.state) is not LedgerState:
            object.__setattr__(self, "state", LedgerState(self.state))
        if type(self.password) is not bytes:
            object.__setattr__(self, "password", bytes(self.password))
        if not self.ensemble_size >= self.write_quorum_size >= self.ack_quorum_size >= 1:
            raise IncorrectParameterError(
                "need ensembleSize >= writeQuorumSize >= ackQuorumSize >= 1, got "
                f"{self.ensemble_size} >= {self.write_quorum_size} >= {self.ack_quorum_size}"
            )
        if not ens:
            raise IncorrectParameterError("ledger metadata needs at least one ensemble")
        keys = list(ens)
        if keys[0] != 0:
            raise IncorrectParameterError(f"the first ensemble must start at entry 0, not {keys[0]}")
        for first, bookies in ens.items():
            if len(bookies) != self.ensemble_size or len(set(bookies)) != len(bookies):
                raise IncorrectParameterError(
                    f"ensemble at entry {first} must have {self.ensemble_size} distinct bookies, got {list(bookies)}"
                )
        if self.last_entry_id < -1 or self.length < 0:
            raise IncorrectParameterError(
                f"bad lastEntryId/length {self.last_entry_id}/{self.length}"
            )

    # -- derived views ------------------------------------------------------------------------

    @property
    def is_closed(self) -> bool:
        return self.state is LedgerState.CLOSED

    @property
    def last_ensemble(self) -> tuple[BookieId, ...]:
        return self.ensembles[max(self.ensembles)]

    def ensemble_for(self, entry_id: int) -> tuple[BookieId, ...]:
        """The ensemble that stores ``entry_id`` (the segment with the greatest first entry <= it)."""
        chosen = 0
        for first in self.ensembles:
            if first <= entry_id:
                chosen = first
            else:
                break
        return self.ensembles[chosen]

    # -- transitions (return new values) -------------------------------------------------------

    def with_ensemble(self, first_entry_id: int, ensemble: tuple[BookieId, ...] | list[BookieId]) -> LedgerMetadata:
        """Add (or replace the last) segment starting at ``first_entry_id`` (ensemble change)."""
        last = max(self.ensembles)
        if first_entry_id < last:
            raise IncorrectParameterError(
                f"new ensemble starts at entry {first_entry_id}, before the last one ({last})"
            )
        ens = dict(self.ensembles)
        ens[first_entry_id] = tuple(ensemble)
        return self._replace(ensembles=ens)

    def in_recovery(self) -> LedgerMetadata:
        return self._replace(state=LedgerState.IN_RECOVERY)

    def closed(self, last_entry_id: int, length: int) -> LedgerMetadata:
        return self._replace(state=LedgerState.CLOSED, last_entry_id=last_entry_id, length=length)

    def _replace(self, **changes: Any) -> LedgerMetadata:
        """``dataclasses.replace(self, **changes)``: the same fields, normalized and checked by
        ``__post_init__``, without ``replace``'s walk over the dataclass fields and the keyword
        call of ``__init__`` (about two thirds of its time; metadata changes at every
        ensemble change, recovery and close)."""
        new = object.__new__(type(self))
        fields = new.__dict__
        fields.update(self.__dict__)
        fields.update(changes)
        new.__post_init__()
        return new

    # -- serialization ------------------------------------------------------------------------

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "ensembleSize": self.ensemble_size,
            "writeQuorumSize": self.write_quorum_size,
            "ackQuorumSize": self.ack_quorum_size,
            "state": self.state.name,
            "lastEntryId": self.last_entry_id,
            "length": self.length,
            "digestType": self.digest_type.name,
            "password": _b64(self.password),
            "ensembles": [{"firstEntryId": k, "bookies": list(v)} for k, v in self.ensembles.items()],
            "customMetadata": {k: _b64(v) for k, v in sorted(self.custom_metadata.items())},
            "ctime": self.ctime_ms,
            "cToken": self.creator_token,
        }


_FIELDS = {
    "ensembleSize", "writeQuorumSize", "ackQuorumSize", "state", "lastEntryId", "length",
    "digestType", "password", "ensembles", "customMetadata", "ctime", "cToken",
}


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode("ascii")


_HEADER_LINE = f"{METADATA_FORMAT_NAME}\t{METADATA_FORMAT_VERSION}\n"
#: a string as ``json.dumps`` writes it (``ensure_ascii``: the C encoder)
_json_str = json.encoder.encode_basestring_ascii


def serialize_ledger_metadata(md: LedgerMetadata) -> bytes:
    """Bytes for the store: the header line, then pretty JSON (stable key order).

    The body is ``json.dumps(md.to_json_dict(), indent=1)``, byte for byte; it is written here
    directly because ``json`` encodes indented output in Python, call by call (about five times
    the time; metadata is written at every ledger create, ensemble change, recovery and close).
    Numbers of another type than ``int`` (never made by this module) go through ``json.dumps``."""
    numbers = (md.ensemble_size, md.write_quorum_size, md.ack_quorum_size, md.last_entry_id, md.length,
               md.ctime_ms, md.creator_token)
    if any(type(n) is not int for n in numbers):
        body = json.dumps(md.to_json_dict(), indent=1, sort_keys=False)
        return f"{_HEADER_LINE}{body}\n".encode()
    segments = [f'  {{\n   "firstEntryId": {first},\n   "bookies": {_json_strings(bookies, "   ")}\n  }}'
                for first, bookies in md.ensembles.items()]
    custom = [f"  {_json_str(k)}: {_json_str(_b64(v))}" for k, v in sorted(md.custom_metadata.items())]
    return (
        f'{_HEADER_LINE}{{\n "ensembleSize": {md.ensemble_size},\n "writeQuorumSize": {md.write_quorum_size},\n'
        f' "ackQuorumSize": {md.ack_quorum_size},\n "state": {_json_str(md.state.name)},\n'
        f' "lastEntryId": {md.last_entry_id},\n "length": {md.length},\n'
        f' "digestType": {_json_str(md.digest_type.name)},\n "password": {_json_str(_b64(md.password))},\n'
        f' "ensembles": {_json_block("[", segments, "]")},\n "customMetadata": {_json_block("{", custom, "}")},\n'
        f' "ctime": {md.ctime_ms},\n "cToken": {md.creator_token}\n}}\n'
    ).encode()


def _json_block(opening: str, members: list[str], closing: str) -> str:
    """A top-level field's list or object of ``members`` (each already indented), as
    ``json.dumps(..., indent=1)`` writes it."""
    if not members:
        return opening + closing
    return opening + "\n" + ",\n".join(members) + "\n " + closing


def _json_strings(items: tuple[str, ...], indent: str) -> str:
    """A list of strings whose key is at ``indent``, as ``json.dumps(..., indent=1)`` writes it."""
    if not items:
        return "[]"
    return f"[\n{indent} " + f",\n{indent} ".join(map(_json_str, items)) + f"\n{indent}]"


def deserialize_ledger_metadata(data: bytes, *, where: str) -> LedgerMetadata:
    """Parse stored bytes; ``where`` (a znode path or table/key) goes into every error message."""
    data = bytes(data)
    nl = data.find(b"\n")
    header = data[:nl] if nl >= 0 else data[:64]
    if data.startswith(_BK_HEADER):
        raise MetaStoreError(
            f"{where}: holds BookKeeper's own ledger metadata ({header!r}); Vellum expects "
            f"'{METADATA_FORMAT_NAME}\\t{METADATA_FORMAT_VERSION}' (foreign data: a BookKeeper cluster "
            "shares this path?)"
        )
    if not data.startswith(_HEADER_PREFIX) or nl < 0:
        raise MetaStoreError(
            f"{where}: not Vellum ledger metadata: expected a first line "
            f"'{METADATA_FORMAT_NAME}\\t<version>', got {header[:60]!r}"
        )
    try:
        version = int(data[len(_HEADER_PREFIX):nl])
    except ValueError:
        raise MetaStoreError(f"{where}: bad ledger metadata header {header!r}") from None
    if version > METADATA_FORMAT_VERSION:
        raise MetaStoreError(
            f"{where}: ledger metadata format version {version} is newer than this Vellum "
            f"understands (up to {METADATA_FORMAT_VERSION}); upgrade Vellum"
        )
    if version < 1:
        raise MetaStoreError(f"{where}: unknown ledger metadata format version {version}")
    try:
        obj = json.loads(data[nl + 1:].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MetaStoreError(f"{where}: ledger metadata body is not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise MetaStoreError(f"{where}: ledger metadata body must be a JSON object")
    unknown = set(obj) - _FIELDS
    missing = {"ensembleSize", "writeQuorumSize", "ackQuorumSize", "state", "ensembles"} - set(obj)
    if unknown or missing:
        raise MetaStoreError(
            f"{where}: ledger metadata has unknown fields {sorted(unknown)} / lacks {sorted(missing)}"
        )
    try:
        return LedgerMetadata(
            ensemble_size=int(obj["ensembleSize"]),
            write_quorum_size=int(obj["writeQuorumSize"]),
            ack_quorum_size=int(obj["ackQuorumSize"]),
            state=LedgerState[obj["state"]],
            last_entry_id=int(obj.get("lastEntryId", -1)),
            length=int(obj.get("length", 0)),
            digest_type=DigestType[obj.get("digestType", "CRC32")],
            password=base64.b64decode(obj.get("password", ""), validate=True),
            ensembles={int(s["firstEntryId"]): tuple(s["bookies"]) for s in obj["ensembles"]},
            custom_metadata={
                str(k): base64.b64decode(v, validate=True) for k, v in obj.get("customMetadata", {}).items()
            },
            ctime_ms=int(obj.get("ctime", 0)),
            creator_token=int(obj.get("cToken", 0)),
        )
    except (KeyError, TypeError, ValueError, binascii.Error, IncorrectParameterError) as e:
        raise MetaStoreError(f"{where}: invalid ledger metadata: {type(e).__name__}: {e}") from None


# ---------------------------------------------------------------------------------------------
# Layout (``/ledgers/LAYOUT``): BookKeeper's text "2\n<factoryClass>:<version>".

LAYOUT_FORMAT_VERSION = 2
LEDGER_MANAGER_FACTORIES = {
    "flat": "org.apache.bookkeeper.meta.FlatLedgerManagerFactory",
    "hierarchical": "org.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory",
    "longhierarchical": "org.apache.bookkeeper.meta.LongHierarchicalLedgerManagerFactory",
}
_FACTORY_TO_TYPE = {v: k for k, v in LEDGER_MANAGER_FACTORIES.items()}


@dataclass(frozen=True)
class LedgerLayout:
    """Which ledger manager a cluster uses; fixed when the cluster is formatted."""

    manager_type: str  # "flat" | "hierarchical" | "longhierarchical"
    manager_version: int = 1

    def __post_init__(self) -> None:
        if self.manager_type not in LEDGER_MANAGER_FACTORIES:
            raise IncorrectParameterError(
                f"unknown ledgerManagerType {self.manager_type!r}; expected one of "
                f"{', '.join(LEDGER_MANAGER_FACTORIES)}"
            )

    @property
    def factory_class(self) -> str:
        return LEDGER_MANAGER_FACTORIES[self.manager_type]

    def serialize(self) -> bytes:
        return f"{LAYOUT_FORMAT_VERSION}\n{self.factory_class}:{self.manager_version}".encode()

    @classmethod
    def parse(cls, data: bytes, *, where: str) -> LedgerLayout:
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            raise MetaStoreError(f"{where}: layout is not text: {bytes(data)[:40]!r}") from None
        lines = text.strip().split("\n")
        if len(lines) != 2 or not lines[0].strip().isdigit() or ":" not in lines[1]:
            raise MetaStoreError(
                f"{where}: bad layout {text[:80]!r}; expected '{LAYOUT_FORMAT_VERSION}\\n<factoryClass>:<version>'"
            )
        fmt = int(lines[0])
        if fmt > LAYOUT_FORMAT_VERSION:
            raise MetaStoreError(
                f"{where}: layout format version {fmt} is newer than supported ({LAYOUT_FORMAT_VERSION})"
            )
        factory, _, ver = lines[1].rpartition(":")
        mtype = _FACTORY_TO_TYPE.get(factory.strip())
        if mtype is None or not ver.strip().isdigit():
            raise MetaStoreError(
                f"{where}: layout names ledger manager {lines[1]!r}; Vellum supports "
                f"{', '.join(sorted(_FACTORY_TO_TYPE))}"
            )
        return cls(mtype, int(ver))
