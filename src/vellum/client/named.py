"""Named ledgers (seed 002): open a log by name, re-open it for appending after another writer,
shrink it from the front, keep small cursors next to it.

Responsibility: the named-ledger record and its serialization, and the asyncio API over a
:class:`~vellum.client.bookkeeper.BookKeeper`: :class:`NamedLedgers` (open / list / info / delete /
shrink / cursors / publish_segments / overwrite) and :class:`NamedLedgerHandle` (append, read,
tail, shrink, cursors, close with one continuous sequence of entry ids).

Mechanism (docs/named-ledgers.md): a named ledger is an ordered list of ledger *segments* kept in
one record of the metadata store's key-value area (``names/<name>``), changed only by
compare-and-set. Global entry id = segment's first global id + the entry's id in its ledger.
An APPEND acquisition reads the record (1 read), fences and recovers the open segment's tail on
the bookies named in the record (no metadata op), creates the next segment's ledger (2 writes:
ledger id + ledger metadata) and commits everything with one CAS of the record (1 write).

Invariants:
- only the last segment may be OPEN; segments are contiguous: ``seg[i+1].first == seg[i].last + 1``;
- the record is the truth for a name: a segment's last entry is the one in the record, even if
  its ledger's own metadata is still OPEN (its close is done off the acquisition path);
- every writer session has its own ``writer_epoch``; a writer touches the record only while the
  epoch and the open segment are still its own, so a fenced writer can never re-open the record;
- a named writer CASes the record *before* its ledger's metadata on an ensemble change, so the
  record always names every bookie the open segment may have acknowledged entries on: fencing
  the bookies the record names is enough (see ``_SegmentWriterContext``);
- entries below ``start_entry_id`` are never returned; shrink never touches entries at or after it;
- a record written by a newer format version is refused (``MetaStoreError``), never rewritten.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import dataclasses
import enum
import json
import logging
import os
import re
import socket
import time
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vellum.client.ledger import RECOVERY, WRITER, ClientContext, LedgerHandle
from vellum.client.recovery import fence_ledger, recover_ledger, recover_tail
from vellum.errors import (
    EntriesShrunkError,  # defined in vellum.errors; importable from here too (compatibility)
    IllegalOpError,
    IncorrectParameterError,
    LedgerClosedError,
    LedgerExistsError,
    LedgerFencedError,
    LedgerRecoveryError,
    MetadataVersionError,
    MetaStoreError,
    NoSuchEntryError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
    ReadError,
    UnauthorizedAccessError,
    VellumError,
)
from vellum.format.entry import DigestType, master_key
from vellum.ids import BookieId, LedgerId
from vellum.meta.api import Versioned
from vellum.meta.model import LedgerMetadata, LedgerState

if TYPE_CHECKING:
    from vellum.client.bookkeeper import BookKeeper

log = logging.getLogger(__name__)

RECORD_FORMAT_NAME = "VellumNamedLedger"
RECORD_FORMAT_VERSION = 1
_HEADER_PREFIX = (RECORD_FORMAT_NAME + "\t").encode()
#: key prefix of named-ledger records in the key-value area
KEY_PREFIX = "names/"
_NAME_SEGMENT = re.compile(r"^[A-Za-z0-9._~:@=+-]+$")
#: custom metadata keys stamped on every segment ledger (ops can tell which name owns a ledger)
CUSTOM_NAME_KEY = "vellum.name"
CUSTOM_EPOCH_KEY = "vellum.writerEpoch"
#: bounded retries of a CAS that keeps losing to unrelated record changes (cursors, shrink)
_CAS_RETRIES = 50


class OpenMode(enum.Enum):
    """How :meth:`NamedLedgers.open` treats the name (seed 002's ``O_CREATE/O_APPEND/O_RDONLY``).

    ``CREATE_OR_APPEND`` is Vellum's extra: APPEND, creating the name if it is missing.
    """

    CREATE = "create"
    APPEND = "append"
    READ_ONLY = "read_only"
    CREATE_OR_APPEND = "create_or_append"


# ============================================================================ the record


@dataclass(frozen=True)
class Segment:
    """One ledger of a named ledger. ``last_entry_id`` (global) is None while the segment is OPEN.

    An OPEN segment also carries what recovery needs without reading the ledger's metadata:
    its quorum sizes and every ensemble (keyed by first entry id *in the ledger*).
    """

    ledger_id: int
    first_entry_id: int
    last_entry_id: int | None = None
    length: int = 0
    epoch: int = 0
    ensemble_size: int = 0
    write_quorum_size: int = 0
    ack_quorum_size: int = 0
    ensembles: Mapping[int, tuple[str, ...]] = field(default_factory=dict)

    @property
    def is_open(self) -> bool:
        return self.last_entry_id is None

    @property
    def entry_count(self) -> int | None:
        return None if self.last_entry_id is None else self.last_entry_id - self.first_entry_id + 1

    def closed(self, last_local_entry_id: int, length: int) -> Segment:
        """This segment CLOSED at ``last_local_entry_id`` (its ensembles are no longer needed)."""
        return Segment(self.ledger_id, self.first_entry_id, self.first_entry_id + last_local_entry_id,
                       length, self.epoch)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"ledgerId": self.ledger_id, "firstEntryId": self.first_entry_id,
                             "state": "OPEN" if self.is_open else "CLOSED", "epoch": self.epoch}
        if self.is_open:
            d.update({
                "ensembleSize": self.ensemble_size, "writeQuorumSize": self.write_quorum_size,
                "ackQuorumSize": self.ack_quorum_size,
                "ensembles": {str(k): list(v) for k, v in sorted(self.ensembles.items())},
            })
        else:
            d.update({"lastEntryId": self.last_entry_id, "length": self.length})
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Segment:
        if d["state"] == "OPEN":
            return cls(int(d["ledgerId"]), int(d["firstEntryId"]), None, 0, int(d.get("epoch", 0)),
                       int(d["ensembleSize"]), int(d["writeQuorumSize"]), int(d["ackQuorumSize"]),
                       {int(k): tuple(str(b) for b in v) for k, v in d["ensembles"].items()})
        if d["state"] != "CLOSED":
            raise ValueError(f"unknown segment state {d['state']!r}")
        return cls(int(d["ledgerId"]), int(d["firstEntryId"]), int(d["lastEntryId"]), int(d.get("length", 0)),
                   int(d.get("epoch", 0)))


@dataclass(frozen=True)
class NamedLedgerRecord:
    """What the metadata store keeps for one name (``names/<name>``), see the module docstring."""

    name: str
    digest_type: DigestType
    password: bytes
    ensemble_size: int
    write_quorum_size: int
    ack_quorum_size: int
    segments: tuple[Segment, ...] = ()
    writer_epoch: int = 0
    writer: str = ""
    start_entry_id: int = 0
    trimmed_to: int = 0
    cursors: Mapping[str, bytes] = field(default_factory=dict)
    ctime_ms: int = 0
    custom_metadata: Mapping[str, bytes] = field(default_factory=dict)

    # -- derived views
    @property
    def open_segment(self) -> Segment | None:
        if self.segments and self.segments[-1].is_open:
            return self.segments[-1]
        return None

    @property
    def state(self) -> str:
        """OPEN while a writer session holds an open segment, else CLOSED."""
        return "OPEN" if self.open_segment is not None else "CLOSED"

    @property
    def closed_end(self) -> int:
        """Global id after the last entry of the closed segments (the next segment's first id)."""
        for seg in reversed(self.segments):
            if seg.last_entry_id is not None:
                return max(seg.last_entry_id + 1, self.start_entry_id)
        return self.start_entry_id if not self.segments else self.segments[0].first_entry_id

    def segment_for(self, entry_id: int) -> Segment | None:
        """The segment holding global ``entry_id`` (the open one for anything at or after its first)."""
        for seg in reversed(self.segments):
            if seg.first_entry_id <= entry_id:
                if seg.last_entry_id is None or entry_id <= seg.last_entry_id:
                    return seg
                return None
        return None

    def replace(self, **changes: Any) -> NamedLedgerRecord:
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "digestType": self.digest_type.name,
            "password": _b64(self.password),
            "ensembleSize": self.ensemble_size,
            "writeQuorumSize": self.write_quorum_size,
            "ackQuorumSize": self.ack_quorum_size,
            "writerEpoch": self.writer_epoch,
            "writer": self.writer,
            "startEntryId": self.start_entry_id,
            "trimmedTo": self.trimmed_to,
            "ctimeMs": self.ctime_ms,
            "cursors": {k: _b64(v) for k, v in sorted(self.cursors.items())},
            "customMetadata": {k: _b64(v) for k, v in sorted(self.custom_metadata.items())},
            "segments": [s.to_json() for s in self.segments],
        }


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode("ascii")


def _unb64(s: str) -> bytes:
    return base64.b64decode(s.encode("ascii"), validate=True)


def serialize_record(record: NamedLedgerRecord) -> bytes:
    """``VellumNamedLedger\\t1\\n`` + one JSON object (readable with ``zkCli.sh get``/``sqlite3``)."""
    body = json.dumps(record.to_json(), separators=(",", ":"), sort_keys=False)
    return _HEADER_PREFIX + str(RECORD_FORMAT_VERSION).encode() + b"\n" + body.encode()


def deserialize_record(data: bytes, *, where: str) -> NamedLedgerRecord:
    """Parse a record; a newer format version, a foreign header or bad JSON is a ``MetaStoreError``."""
    header, sep, body = data.partition(b"\n")
    if not sep or not header.startswith(_HEADER_PREFIX):
        raise MetaStoreError(f"{where}: not a named-ledger record (header {header[:40]!r})")
    try:
        version = int(header[len(_HEADER_PREFIX):])
    except ValueError:
        raise MetaStoreError(f"{where}: bad named-ledger record version {header!r}") from None
    if version > RECORD_FORMAT_VERSION:
        raise MetaStoreError(
            f"{where}: named-ledger record format version {version} is newer than this client's "
            f"({RECORD_FORMAT_VERSION}): upgrade the client"
        )
    try:
        d = json.loads(body)
        return NamedLedgerRecord(
            name=str(d["name"]),
            digest_type=DigestType.parse(d["digestType"]),
            password=_unb64(d["password"]),
            ensemble_size=int(d["ensembleSize"]),
            write_quorum_size=int(d["writeQuorumSize"]),
            ack_quorum_size=int(d["ackQuorumSize"]),
            segments=tuple(Segment.from_json(s) for s in d["segments"]),
            writer_epoch=int(d["writerEpoch"]),
            writer=str(d.get("writer", "")),
            start_entry_id=int(d["startEntryId"]),
            trimmed_to=int(d.get("trimmedTo", 0)),
            cursors={str(k): _unb64(v) for k, v in d.get("cursors", {}).items()},
            ctime_ms=int(d.get("ctimeMs", 0)),
            custom_metadata={str(k): _unb64(v) for k, v in d.get("customMetadata", {}).items()},
        )
    except (KeyError, TypeError, ValueError, binascii.Error, VellumError) as e:
        raise MetaStoreError(f"{where}: malformed named-ledger record: {e!r}") from None


def validate_name(name: str) -> str:
    """A name is a '/'-separated path of ``[A-Za-z0-9._~:@=+-]`` segments (``tenant/ns/log``)."""
    if not isinstance(name, str) or not name or len(name) > 900:
        raise IncorrectParameterError(f"bad ledger name {name!r}: 1..900 characters")
    for part in name.split("/"):
        if part in ("", ".", "..") or not _NAME_SEGMENT.match(part):
            raise IncorrectParameterError(
                f"bad ledger name {name!r}: '/'-separated segments of [A-Za-z0-9._~:@=+-], "
                "none empty, '.' or '..'"
            )
    return name


def record_key(name: str) -> str:
    return KEY_PREFIX + validate_name(name)


def _writer_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True, slots=True)
class NamedLedgerEntry:
    """One entry of a named ledger: its global ``entry_id`` and where it lives."""

    entry_id: int
    payload: bytes
    ledger_id: int
    ledger_entry_id: int


@dataclass(frozen=True)
class NamedLedgerInfo:
    """What :meth:`NamedLedgers.info` reports (``last_entry_id`` asks the bookies for an open segment)."""

    record: NamedLedgerRecord
    version: int
    last_entry_id: int

    @property
    def size(self) -> int:
        """Bytes of payload in the closed segments still in the record (the open one is unknown)."""
        return sum(s.length for s in self.record.segments if not s.is_open)


# ==================================================================== segment writer context


class _SegmentWriterContext(ClientContext):
    """The context of a named writer's segment ledger: an ensemble change is first written to the
    name record (so acquirers fence the new bookies too), then to the ledger's metadata.

    Shares the parent context's live state (bookie lists kept current by the client's watches).
    """

    def __init__(self, parent: ClientContext, on_ensemble_change: Callable[[LedgerMetadata], Any]) -> None:
        # No super().__init__: the bookie lists must be the parent's, not a snapshot.
        self._parent = parent
        self.store = parent.store
        self.bookie_client = parent.bookie_client
        self.placement = parent.placement
        self.config = parent.config
        self.max_adds_in_flight = parent.max_adds_in_flight
        self.writers = parent.writers  # the client's close() stops named writers' timers too
        self._on_ensemble_change = on_ensemble_change

    @property  # type: ignore[override]
    def writable_bookies(self) -> frozenset[str]:
        return self._parent.writable_bookies

    @writable_bookies.setter
    def writable_bookies(self, value: frozenset[str]) -> None:
        self._parent.writable_bookies = value

    @property  # type: ignore[override]
    def read_only_bookies(self) -> frozenset[str]:
        return self._parent.read_only_bookies

    @read_only_bookies.setter
    def read_only_bookies(self, value: frozenset[str]) -> None:
        self._parent.read_only_bookies = value

    async def write_metadata(self, ledger_id: int, md: LedgerMetadata, expected_version: int) -> int:
        if md.state is LedgerState.OPEN:
            # An ensemble change: the record must name the new bookies before any entry can be
            # acknowledged on them (the handle acknowledges only after this returns).
            await self._on_ensemble_change(md)
        return await super().write_metadata(ledger_id, md, expected_version)


class _ProbeContext(_SegmentWriterContext):
    """The context of fast recovery and fencing: no metadata write is allowed. A write-back that
    needs an ensemble change fails (``LedgerRecoveryError``) and the caller falls back to recovery
    through the ledger's metadata, which can CAS the change safely."""

    def __init__(self, parent: ClientContext) -> None:
        super().__init__(parent, _refuse_ensemble_change)

    async def write_metadata(self, ledger_id: int, md: LedgerMetadata, expected_version: int) -> int:
        raise LedgerRecoveryError(f"ledger {ledger_id}: fast recovery cannot change the metadata")


async def _refuse_ensemble_change(md: LedgerMetadata) -> None:
    raise LedgerRecoveryError("fast recovery cannot change the ensemble")


# =========================================================================== the API


class NamedLedgers:
    """Named ledgers over an asyncio :class:`BookKeeper` client (started).

    ``close_fenced_ledgers``: after an acquisition, close the previous segment's ledger metadata
    in the background (off the acquisition path; the record is the truth either way).
    """

    def __init__(self, bk: BookKeeper, *, close_fenced_ledgers: bool = True) -> None:
        self._bk = bk
        self._close_fenced = close_fenced_ledgers
        self._background: set[asyncio.Task[Any]] = set()

    # ------------------------------------------------------------------ plumbing
    @property
    def bookkeeper(self) -> BookKeeper:
        return self._bk

    def _ctx(self) -> ClientContext:
        # The client's shared context (store, bookie client, placement, live bookie lists).
        return self._bk.context

    async def _meta(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.to_thread(fn, *args)

    async def _get(self, name: str) -> Versioned[NamedLedgerRecord] | None:
        key = record_key(name)
        got = await self._meta(self._ctx().store.kv.get, key)
        if got is None:
            return None
        return Versioned(deserialize_record(got.value, where=f"named ledger {name!r} ({key})"), got.version)

    async def _get_existing(self, name: str) -> Versioned[NamedLedgerRecord]:
        got = await self._get(name)
        if got is None:
            raise NoSuchLedgerError(f"no named ledger {name!r}")
        return got

    async def _cas(self, record: NamedLedgerRecord, expected_version: int) -> int:
        version: int = await self._meta(self._ctx().store.kv.cas, record_key(record.name),
                                         serialize_record(record), expected_version)
        return version

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def drain(self) -> None:
        """Wait for background work (closing fenced ledgers' metadata, deleting dropped ledgers)."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    # ------------------------------------------------------------------ queries
    async def list(self, prefix: str = "") -> list[str]:
        """Names starting with ``prefix`` (a string prefix), sorted."""
        keys: list[str] = await self._meta(self._ctx().store.kv.list, KEY_PREFIX + prefix)
        return [k[len(KEY_PREFIX):] for k in keys]

    async def exists(self, name: str) -> bool:
        return await self._get(name) is not None

    async def record(self, name: str) -> Versioned[NamedLedgerRecord]:
        """The record and its version (``NoSuchLedgerError`` if the name does not exist)."""
        return await self._get_existing(name)

    async def info(self, name: str) -> NamedLedgerInfo:
        """The record plus the last entry id (asks the bookies for the LAC of an open segment)."""
        v = await self._get_existing(name)
        return NamedLedgerInfo(v.value, v.version, await self._last_entry_id(v.value))

    async def _last_entry_id(self, rec: NamedLedgerRecord) -> int:
        seg = rec.open_segment
        if seg is None:
            return rec.closed_end - 1
        h = await self._bk.open_ledger(seg.ledger_id, password=rec.password, recovery=False)
        return seg.first_entry_id + h.last_add_confirmed

    # ------------------------------------------------------------------ open
    async def open(
        self,
        name: str,
        mode: OpenMode | str = OpenMode.APPEND,
        *,
        digest_type: str | DigestType | None = None,
        password: bytes = b"",
        ensemble_size: int | None = None,
        write_quorum_size: int | None = None,
        ack_quorum_size: int | None = None,
        custom_metadata: dict[str, bytes] | None = None,
    ) -> NamedLedgerHandle:
        """Open ``name``: CREATE (``LedgerExistsError`` if it exists), APPEND (``NoSuchLedgerError``
        if missing; fences the previous writer session), READ_ONLY (changes nothing), or
        CREATE_OR_APPEND. The quorum sizes and digest apply to new segments (CREATE defaults them
        from the client configuration, APPEND from the record)."""
        mode = OpenMode(mode)
        validate_name(name)
        if not isinstance(password, (bytes, bytearray)):
            raise IncorrectParameterError("password must be bytes")
        password = bytes(password)
        quorum = (ensemble_size, write_quorum_size, ack_quorum_size)
        if mode is OpenMode.CREATE:
            return await self._create(name, digest_type, password, quorum, custom_metadata)
        if mode is OpenMode.READ_ONLY:
            v = await self._get_existing(name)
            _check_password(v.value, password)
            handle = NamedLedgerHandle(self, v, None)
            seg = v.value.open_segment
            if seg is not None:
                await handle._segment_reader(seg)  # learns the open segment's LAC (no fencing)
            return handle
        got = await self._get(name)
        if got is None:
            if mode is OpenMode.APPEND:
                raise NoSuchLedgerError(
                    f"no named ledger {name!r}: APPEND needs an existing name (use CREATE or CREATE_OR_APPEND)"
                )
            try:
                return await self._create(name, digest_type, password, quorum, custom_metadata)
            except LedgerExistsError:
                got = await self._get_existing(name)  # created meanwhile: append to it
        return await self._acquire(got, password, quorum)

    async def _create(
        self,
        name: str,
        digest_type: str | DigestType | None,
        password: bytes,
        quorum: tuple[int | None, int | None, int | None],
        custom_metadata: dict[str, bytes] | None,
    ) -> NamedLedgerHandle:
        cfg = self._bk.config
        e = cfg.ensemble_size if quorum[0] is None else quorum[0]
        wq = cfg.write_quorum_size if quorum[1] is None else quorum[1]
        aq = cfg.ack_quorum_size if quorum[2] is None else quorum[2]
        if not e >= wq >= aq >= 1:
            raise IncorrectParameterError(
                f"need ensembleSize >= writeQuorumSize >= ackQuorumSize >= 1, got {e} >= {wq} >= {aq}"
            )
        dt = _digest(digest_type if digest_type is not None else cfg.digest_type)
        rec = NamedLedgerRecord(
            name=name, digest_type=dt, password=password, ensemble_size=e, write_quorum_size=wq,
            ack_quorum_size=aq, writer_epoch=1, writer=_writer_identity(), ctime_ms=int(time.time() * 1000),
            custom_metadata=dict(custom_metadata or {}),
        )
        seg, md, md_version = await self._new_segment(rec, 0, 1)
        rec = rec.replace(segments=(seg,))
        try:
            version: int = await self._meta(self._ctx().store.kv.create, record_key(name), serialize_record(rec))
        except MetadataVersionError:
            self._spawn(self._delete_ledgers([seg.ledger_id]))
            raise LedgerExistsError(f"named ledger {name!r} already exists") from None
        except BaseException:
            self._spawn(self._delete_ledgers([seg.ledger_id]))
            raise
        return self._writer_handle(Versioned(rec, version), md, md_version)

    async def _new_segment(
        self, rec: NamedLedgerRecord, first_entry_id: int, epoch: int,
        quorum: tuple[int | None, int | None, int | None] = (None, None, None),
    ) -> tuple[Segment, LedgerMetadata, int]:
        """Create the OPEN ledger of a new segment: 2 metadata writes (ledger id, ledger metadata)."""
        ctx = self._ctx()
        e = rec.ensemble_size if quorum[0] is None else quorum[0]
        wq = rec.write_quorum_size if quorum[1] is None else quorum[1]
        aq = rec.ack_quorum_size if quorum[2] is None else quorum[2]
        if not e >= wq >= aq >= 1:
            raise IncorrectParameterError(
                f"need ensembleSize >= writeQuorumSize >= ackQuorumSize >= 1, got {e} >= {wq} >= {aq}"
            )
        try:
            ensemble = ctx.placement.new_ensemble(e, wq, aq, writable=ctx.writable_bookies,
                                                  read_only=ctx.read_only_bookies)
        except NotEnoughBookiesError:
            # The registration watch may lag behind a bookie that just registered: look once more.
            reg = ctx.store.registration
            ctx.writable_bookies = frozenset(str(b) for b in await self._meta(reg.list_bookies))
            ensemble = ctx.placement.new_ensemble(e, wq, aq, writable=ctx.writable_bookies,
                                                  read_only=ctx.read_only_bookies)
        md = LedgerMetadata(
            ensemble_size=e, write_quorum_size=wq, ack_quorum_size=aq,
            ensembles={0: tuple(BookieId(b) for b in ensemble)},
            digest_type=rec.digest_type, password=rec.password, state=LedgerState.OPEN,
            custom_metadata={CUSTOM_NAME_KEY: rec.name.encode(), CUSTOM_EPOCH_KEY: str(epoch).encode()},
            ctime_ms=int(time.time() * 1000), creator_token=int.from_bytes(os.urandom(7), "big"),
        )
        store = ctx.store
        ledger_id = await self._meta(store.id_generator.generate_ledger_id)
        md_version: int = await self._meta(store.ledgers.create_ledger_with_id, ledger_id, md)
        seg = Segment(int(ledger_id), first_entry_id, None, 0, epoch, e, wq, aq, {0: tuple(ensemble)})
        return seg, md, md_version

    async def _acquire(
        self,
        got: Versioned[NamedLedgerRecord],
        password: bytes,
        quorum: tuple[int | None, int | None, int | None],
    ) -> NamedLedgerHandle:
        """APPEND: fence + recover the open segment, create the next one, one CAS (see module doc)."""
        _check_password(got.value, password)
        new: tuple[Segment, LedgerMetadata, int] | None = None
        fenced: Segment | None = None
        recovered: dict[tuple[int, tuple[tuple[int, tuple[str, ...]], ...]], tuple[int, int]] = {}
        try:
            for _ in range(_CAS_RETRIES):
                rec = got.value
                segments = list(rec.segments)
                fenced = rec.open_segment
                if fenced is not None:
                    # Recover once per (ledger, ensembles) seen: a retry after an unrelated record
                    # change (cursor, shrink) does not redo it.
                    key = (fenced.ledger_id, tuple(sorted(fenced.ensembles.items())))
                    if key not in recovered:
                        recovered[key] = await self._recover_segment(rec, fenced)
                    last, length = recovered[key]
                    segments[-1] = fenced.closed(last, length)
                    if segments[-1].entry_count == 0:
                        segments.pop()  # an empty session leaves no segment behind
                first = max(rec.start_entry_id,
                            segments[-1].last_entry_id + 1 if segments and segments[-1].last_entry_id is not None
                            else rec.closed_end)
                epoch = rec.writer_epoch + 1
                if new is None:
                    new = await self._new_segment(rec, first, epoch, quorum)
                # A retry may move the first id or the epoch: both live only in the record.
                seg = dataclasses.replace(new[0], first_entry_id=first, epoch=epoch)
                segments.append(seg)
                updated = rec.replace(segments=tuple(segments), writer_epoch=epoch, writer=_writer_identity())
                try:
                    version = await self._cas(updated, got.version)
                except MetadataVersionError:
                    current = await self._get(rec.name)
                    if current is None:
                        raise NoSuchLedgerError(f"named ledger {rec.name!r} was deleted meanwhile") from None
                    if current.value.writer_epoch != rec.writer_epoch:
                        raise LedgerFencedError(
                            f"named ledger {rec.name!r}: another writer acquired it meanwhile "
                            f"(writer epoch {current.value.writer_epoch}, was {rec.writer_epoch})"
                        ) from None
                    got = current  # an unrelated change (cursor, shrink, ensemble change): retry on it
                    continue
                handle = self._writer_handle(Versioned(updated, version), new[1], new[2])
                new = None  # owned by the handle now
                if fenced is not None and self._close_fenced:
                    closed = updated.segments[-2] if len(updated.segments) > 1 else None
                    if closed is not None and closed.ledger_id == fenced.ledger_id:
                        self._spawn(self._close_ledger_metadata(closed))
                    elif fenced.ledger_id not in {s.ledger_id for s in updated.segments}:
                        self._spawn(self._delete_ledgers([fenced.ledger_id]))  # empty: dropped
                return handle
            raise MetadataVersionError(f"named ledger {got.value.name!r}: acquisition lost too many CAS races")
        finally:
            if new is not None:
                self._spawn(self._delete_ledgers([new[0].ledger_id]))

    def _writer_handle(self, v: Versioned[NamedLedgerRecord], md: LedgerMetadata, md_version: int) -> NamedLedgerHandle:
        handle = NamedLedgerHandle(self, v, None)
        seg = v.value.segments[-1]
        ctx = _SegmentWriterContext(self._ctx(), handle._record_ensemble_change)
        handle._writer = LedgerHandle(ctx, seg.ledger_id, Versioned(md, md_version), v.value.password, mode=WRITER)
        handle._writer_segment = seg
        return handle

    # ------------------------------------------------------------------ recovery of an open segment
    async def _recover_segment(self, rec: NamedLedgerRecord, seg: Segment) -> tuple[int, int]:
        """Fence the open segment on the bookies the record names and recover its tail.

        Returns (last entry id in the ledger, length). No metadata operation on the fast path; if
        the fast path cannot finish (a write-back needs an ensemble change, or too few bookies
        answer) fall back to BookKeeper's recovery through the ledger's metadata.
        """
        md = LedgerMetadata(
            ensemble_size=seg.ensemble_size, write_quorum_size=seg.write_quorum_size,
            ack_quorum_size=seg.ack_quorum_size,
            ensembles={k: tuple(BookieId(b) for b in v) for k, v in seg.ensembles.items()},
            digest_type=rec.digest_type, password=rec.password, state=LedgerState.OPEN,
        )
        try:
            return await _fast_recover(_ProbeContext(self._ctx()), seg.ledger_id, md, rec.password)
        except UnauthorizedAccessError:
            raise
        except VellumError as e:
            log.warning("named ledger %r: fast recovery of ledger %d failed (%s); recovering through "
                        "its metadata", rec.name, seg.ledger_id, e)
        closed = await recover_ledger(self._ctx(), seg.ledger_id, rec.password)
        return closed.value.last_entry_id, closed.value.length

    async def _close_ledger_metadata(self, seg: Segment) -> None:
        """Close a fenced segment's ledger metadata at the record's last entry (off the acquisition
        path; idempotent; a failure only leaves the ledger OPEN in its own metadata)."""
        assert seg.last_entry_id is not None
        last_local = seg.last_entry_id - seg.first_entry_id
        ctx = self._ctx()
        try:
            for _ in range(10):
                current = await ctx.read_metadata(seg.ledger_id)
                md = current.value
                if md.is_closed:
                    if md.last_entry_id != last_local:
                        log.error("ledger %d: its metadata is closed at entry %d but the name record "
                                  "says %d", seg.ledger_id, md.last_entry_id, last_local)
                    return
                if md.state is not LedgerState.OPEN:
                    return  # someone is recovering it by id: leave it to them
                try:
                    await ctx.write_metadata(seg.ledger_id, md.closed(last_local, seg.length), current.version)
                    return
                except MetadataVersionError:
                    continue
        except VellumError as e:
            log.info("ledger %d: closing its metadata after fencing failed: %s", seg.ledger_id, e)

    async def _delete_ledgers(self, ledger_ids: Sequence[int]) -> None:
        ctx = self._ctx()
        for lid in ledger_ids:
            try:
                await ctx.meta(ctx.store.ledgers.delete_ledger, LedgerId(lid))
            except VellumError as e:
                log.warning("ledger %d: delete failed (%s); it stays until deleted by hand", lid, e)

    # ------------------------------------------------------------------ delete
    async def delete(self, name: str) -> None:
        """Delete the name: fence its open segment (best effort), delete the record, then its
        ledgers (bookies reclaim their space at GC). Deleting a missing name is a no-op."""
        for _ in range(_CAS_RETRIES):
            got = await self._get(name)
            if got is None:
                return
            rec = got.value
            seg = rec.open_segment
            if seg is not None:
                try:
                    await self._fence_only(rec, seg)
                except VellumError as e:
                    # The writer still loses the record at its next metadata step (ensemble change,
                    # close); its adds may succeed until then, on a ledger about to be deleted.
                    log.warning("named ledger %r: fencing ledger %d before delete failed: %s", name, seg.ledger_id, e)
            try:
                await self._meta(self._ctx().store.kv.delete, record_key(name), got.version)
            except MetadataVersionError:
                continue
            await self._delete_ledgers([s.ledger_id for s in rec.segments])
            return
        raise MetadataVersionError(f"named ledger {name!r}: delete lost too many CAS races")

    async def _fence_only(self, rec: NamedLedgerRecord, seg: Segment) -> None:
        md = LedgerMetadata(
            ensemble_size=seg.ensemble_size, write_quorum_size=seg.write_quorum_size,
            ack_quorum_size=seg.ack_quorum_size,
            ensembles={k: tuple(BookieId(b) for b in v) for k, v in seg.ensembles.items()},
            digest_type=rec.digest_type, password=rec.password,
        )
        await fence_ledger(_ProbeContext(self._ctx()), seg.ledger_id, md, rec.password)

    # ------------------------------------------------------------------ shrink
    async def shrink(self, name: str, end_entry_id: int, *, force: bool = False,
                     _lac_hint: int | None = None) -> int:
        """Move the start of ``name`` to ``end_entry_id`` (entries below become invisible); returns
        the new start. A smaller ``end_entry_id`` than the current start changes nothing.

        ``force``: also drop whole segments below the new start from the record and delete their
        ledgers, and ask the bookies of the segment holding the new start to TRIM below it.
        """
        if end_entry_id < 0:
            raise IncorrectParameterError(f"bad shrink point {end_entry_id}")
        for _ in range(_CAS_RETRIES):
            got = await self._get_existing(name)
            rec = got.value
            last = _lac_hint if _lac_hint is not None else await self._last_entry_id(rec)
            if end_entry_id > last + 1:
                raise IncorrectParameterError(
                    f"named ledger {name!r}: cannot shrink to {end_entry_id}: the last entry is {last}"
                )
            start = max(rec.start_entry_id, end_entry_id)
            segments = list(rec.segments)
            dropped: list[Segment] = []
            if force:
                while segments and segments[0].last_entry_id is not None and segments[0].last_entry_id < start:
                    dropped.append(segments.pop(0))
            trimmed_to = max(rec.trimmed_to, start) if force else rec.trimmed_to
            if start == rec.start_entry_id and not dropped and trimmed_to == rec.trimmed_to:
                return start
            updated = rec.replace(start_entry_id=start, segments=tuple(segments), trimmed_to=trimmed_to)
            try:
                await self._cas(updated, got.version)
            except MetadataVersionError:
                continue
            if force:
                await self._delete_ledgers([s.ledger_id for s in dropped])
                if segments and segments[0].first_entry_id < start:
                    await self._trim(rec, segments[0], start - segments[0].first_entry_id)
            return start
        raise MetadataVersionError(f"named ledger {name!r}: shrink lost too many CAS races")

    async def _trim(self, rec: NamedLedgerRecord, seg: Segment, end_local: int) -> None:
        """TRIM ``seg``'s ledger below ``end_local`` on every bookie of its ensembles (best effort:
        a bookie that misses it keeps the entries until the ledger is deleted)."""
        if seg.is_open:
            bookies = {b for ens in seg.ensembles.values() for b in ens}
        else:
            md = (await self._ctx().read_metadata(seg.ledger_id)).value
            bookies = {str(b) for ens in md.ensembles.values() for b in ens}
        key = master_key(rec.password)
        bc = self._ctx().bookie_client
        results = await asyncio.gather(*(bc.trim(b, seg.ledger_id, end_local, key) for b in sorted(bookies)),
                                       return_exceptions=True)
        for b, r in zip(sorted(bookies), results):
            if isinstance(r, BaseException):
                log.warning("ledger %d: TRIM below %d on bookie %s failed: %s", seg.ledger_id, end_local, b, r)

    # ------------------------------------------------------------------ cursors
    async def get_cursor(self, name: str, key: str) -> tuple[bytes | None, int]:
        """(value or None, record version): pass the version to :meth:`set_cursor`."""
        got = await self._get_existing(name)
        return got.value.cursors.get(key), got.version

    async def set_cursor(self, name: str, key: str, value: bytes | None, expected_version: int) -> int:
        """Set (``None``: remove) a cursor by CAS on the whole record; ``MetadataVersionError`` if
        the record changed since ``expected_version``. Returns the new version."""
        got = await self._get_existing(name)
        if got.version != expected_version:
            raise MetadataVersionError(f"named ledger {name!r} changed since version {expected_version}")
        return await self._cas(_with_cursors(got.value, {key: value}), expected_version)

    # ------------------------------------------------------------------ publish / overwrite
    async def publish_segments(
        self,
        name: str,
        ledger_ids: Sequence[int],
        *,
        expected_version: int | None,
        cursor_updates: Mapping[str, bytes | None] | None = None,
    ) -> int:
        """Append pre-written CLOSED ledgers as new segments and update cursors in ONE CAS.

        ``expected_version=None`` creates the name (it must not exist; digest, password and quorum
        sizes come from the first ledger). An open writer segment is fenced and closed first (in
        the same CAS). A conflict (``MetadataVersionError``) leaves nothing visible. Empty ledgers
        are skipped. Returns the record's new version.
        """
        return await self._publish(name, ledger_ids, expected_version, cursor_updates, overwrite=False)

    async def overwrite(
        self,
        name: str,
        ledger_ids: Sequence[int],
        *,
        expected_version: int | None,
        cursor_updates: Mapping[str, bytes | None] | None = None,
    ) -> int:
        """Replace every segment by the given CLOSED ledgers in ONE CAS.

        Entry ids keep growing: the new segments start after the old last entry and the start moves
        there, so readers never see an id reused. The replaced ledgers are deleted afterwards.
        """
        return await self._publish(name, ledger_ids, expected_version, cursor_updates, overwrite=True)

    async def _publish(
        self,
        name: str,
        ledger_ids: Sequence[int],
        expected_version: int | None,
        cursor_updates: Mapping[str, bytes | None] | None,
        *,
        overwrite: bool,
    ) -> int:
        validate_name(name)
        ctx = self._ctx()
        mds: list[LedgerMetadata] = []
        for lid in ledger_ids:
            md = (await ctx.read_metadata(lid)).value
            if not md.is_closed:
                raise IncorrectParameterError(f"ledger {lid} is {md.state.name}: only CLOSED ledgers can be published")
            mds.append(md)
        if expected_version is None:
            if not mds:
                raise IncorrectParameterError("creating a name by publishing needs at least one ledger")
            first = mds[0]
            rec = NamedLedgerRecord(
                name=name, digest_type=first.digest_type, password=first.password,
                ensemble_size=first.ensemble_size, write_quorum_size=first.write_quorum_size,
                ack_quorum_size=first.ack_quorum_size, writer_epoch=0, ctime_ms=int(time.time() * 1000),
            )
            _check_published(rec, ledger_ids, mds)
            rec = rec.replace(segments=_append_segments((), 0, ledger_ids, mds, 0),
                              cursors=_with_cursors(rec, cursor_updates or {}).cursors)
            try:
                version: int = await self._meta(ctx.store.kv.create, record_key(name), serialize_record(rec))
            except MetadataVersionError:
                raise MetadataVersionError(f"named ledger {name!r} already exists (expected it not to)") from None
            return version
        got = await self._get_existing(name)
        if got.version != expected_version:
            raise MetadataVersionError(
                f"named ledger {name!r} changed: expected version {expected_version}, the store has {got.version}"
            )
        rec = got.value
        _check_published(rec, ledger_ids, mds)
        segments = list(rec.segments)
        epoch = rec.writer_epoch
        fenced = rec.open_segment
        if fenced is not None:
            last, length = await self._recover_segment(rec, fenced)
            segments[-1] = fenced.closed(last, length)
            epoch += 1  # the writer session is over: its ensemble changes and close must fail
            if segments[-1].entry_count == 0:
                segments.pop()
        end = segments[-1].last_entry_id + 1 if segments and segments[-1].last_entry_id is not None else rec.closed_end
        end = max(end, rec.start_entry_id)
        start = rec.start_entry_id
        replaced: list[Segment] = []
        if overwrite:
            replaced, segments, start = segments, [], end
        new_segments = _append_segments(tuple(segments), end, ledger_ids, mds, epoch)
        updated = _with_cursors(rec, cursor_updates or {}).replace(
            segments=new_segments, writer_epoch=epoch, start_entry_id=start,
            trimmed_to=max(rec.trimmed_to, start) if overwrite else rec.trimmed_to,
        )
        version = await self._cas(updated, expected_version)  # conflict: nothing visible
        if fenced is not None and self._close_fenced and not overwrite:
            closed = next((s for s in new_segments if s.ledger_id == fenced.ledger_id), None)
            if closed is not None:
                self._spawn(self._close_ledger_metadata(closed))
        if overwrite:
            keep = set(ledger_ids)
            await self._delete_ledgers([s.ledger_id for s in replaced if s.ledger_id not in keep])
        return version


# ============================================================================ the handle


class NamedLedgerHandle:
    """An open named ledger: a writer (CREATE/APPEND) or a reader (READ_ONLY). Entry ids are global.

    Readers see the record as of their last refresh: on open, and whenever a read or tail passes
    the end they know of (or finds the open segment idle); ``refresh()`` forces one.
    """

    def __init__(self, named: NamedLedgers, record: Versioned[NamedLedgerRecord], writer: LedgerHandle | None) -> None:
        self._named = named
        self._bk = named.bookkeeper
        self._record = record.value
        self._version = record.version
        self._writer: LedgerHandle | None = writer
        self._writer_segment: Segment | None = None
        self._readers: dict[int, LedgerHandle] = {}
        self._last_future: asyncio.Future[int] | None = None
        self._closed = False

    # ------------------------------------------------------------------ properties
    @property
    def name(self) -> str:
        return self._record.name

    @property
    def record(self) -> NamedLedgerRecord:
        return self._record

    @property
    def version(self) -> int:
        """The record version this handle last saw (for CAS of cursors)."""
        return self._version

    @property
    def is_writer(self) -> bool:
        return self._writer is not None

    @property
    def writer_epoch(self) -> int:
        return self._writer_segment.epoch if self._writer_segment is not None else self._record.writer_epoch

    @property
    def start_entry_id(self) -> int:
        return self._record.start_entry_id

    @property
    def ledger_id(self) -> int | None:
        """The writer's current segment ledger (None for a reader)."""
        return self._writer.ledger_id if self._writer is not None else None

    @property
    def last_add_confirmed(self) -> int:
        """Global id of the last confirmed entry this handle knows (``start - 1`` if none)."""
        rec = self._record
        if self._writer is not None and self._writer_segment is not None:
            return self._writer_segment.first_entry_id + self._writer.last_add_confirmed
        seg = rec.open_segment
        if seg is not None:
            h = self._readers.get(seg.ledger_id)
            lac = h.last_add_confirmed if h is not None else -1
            return max(seg.first_entry_id + lac, rec.closed_end - 1)
        return rec.closed_end - 1

    def __repr__(self) -> str:
        return (f"NamedLedgerHandle(name={self.name!r}, {'writer' if self.is_writer else 'reader'}, "
                f"start={self.start_entry_id}, lac={self.last_add_confirmed})")

    # ------------------------------------------------------------------ writes
    def append_async(self, data: bytes | bytearray | memoryview) -> asyncio.Future[int]:
        """Append one entry; the future completes with its global entry id once acknowledged."""
        w = self._writer
        loop = asyncio.get_running_loop()
        if w is None or self._writer_segment is None:
            fut: asyncio.Future[int] = loop.create_future()
            fut.set_exception(IllegalOpError(f"named ledger {self.name!r} was opened read-only"))
            return fut
        if self._closed:
            fut = loop.create_future()
            fut.set_exception(LedgerClosedError(f"named ledger {self.name!r}: handle closed"))
            return fut
        base = self._writer_segment.first_entry_id
        inner = w.append_async(data)
        out: asyncio.Future[int] = loop.create_future()

        def transfer(f: asyncio.Future[int]) -> None:
            if out.done():
                return
            exc = f.exception()
            if exc is not None:
                out.set_exception(exc)
            else:
                out.set_result(base + f.result())

        inner.add_done_callback(transfer)
        self._last_future = out
        return out

    async def append(self, data: bytes | bytearray | memoryview) -> int:
        return await self.append_async(data)

    async def _record_ensemble_change(self, md: LedgerMetadata) -> None:
        """Write the writer segment's new ensembles into the record (before the ledger's metadata)."""
        seg = self._writer_segment
        assert seg is not None
        ensembles = {k: tuple(str(b) for b in v) for k, v in md.ensembles.items()}
        rec, version = self._record, self._version
        for _ in range(_CAS_RETRIES):
            last = rec.segments[-1] if rec.segments else None
            if (rec.writer_epoch != seg.epoch or last is None or last.ledger_id != seg.ledger_id
                    or not last.is_open):
                raise LedgerFencedError(
                    f"named ledger {self.name!r}: writer epoch {seg.epoch} was fenced by epoch {rec.writer_epoch}"
                )
            updated = rec.replace(segments=(*rec.segments[:-1], dataclasses.replace(last, ensembles=ensembles)))
            try:
                version = await self._named._cas(updated, version)
            except MetadataVersionError:
                current = await self._named._get(self.name)
                if current is None:
                    raise LedgerFencedError(f"named ledger {self.name!r} was deleted") from None
                rec, version = current.value, current.version
                continue
            self._record, self._version = updated, version
            self._writer_segment = updated.segments[-1]
            return
        raise MetadataVersionError(f"named ledger {self.name!r}: ensemble change lost too many CAS races")

    # ------------------------------------------------------------------ reads
    async def refresh(self) -> NamedLedgerRecord:
        """Re-read the record (1 metadata read): new segments, closes, shrink."""
        got = await self._named._get_existing(self.name)
        self._adopt(got)
        return self._record

    def _adopt(self, got: Versioned[NamedLedgerRecord]) -> None:
        if got.version == self._version:
            return
        self._record, self._version = got.value, got.version
        live = {s.ledger_id for s in got.value.segments}
        for lid in [lid for lid in self._readers if lid not in live]:
            del self._readers[lid]

    async def _segment_reader(self, seg: Segment) -> LedgerHandle:
        if self._writer is not None and seg.ledger_id == self._writer.ledger_id:
            return self._writer
        h = self._readers.get(seg.ledger_id)
        if h is None:
            h = await self._bk.open_ledger(seg.ledger_id, password=self._record.password, recovery=False)
            self._readers[seg.ledger_id] = h
        return h

    async def read_last_add_confirmed(self) -> int:
        """Refresh the record and the open segment's LAC from the bookies; the global LAC."""
        if self._writer is not None:
            return self.last_add_confirmed
        await self.refresh()
        seg = self._record.open_segment
        if seg is not None:
            h = await self._segment_reader(seg)
            with contextlib.suppress(VellumError):
                await h.read_last_add_confirmed()
        return self.last_add_confirmed

    def _check_start(self, first: int) -> None:
        if first < self._record.start_entry_id:
            raise EntriesShrunkError(
                f"named ledger {self.name!r}: entry {first} is below the start {self._record.start_entry_id} "
                "(shrunk)"
            )

    async def read(self, first_entry_id: int, last_entry_id: int) -> list[NamedLedgerEntry]:
        """Entries ``first..last`` (global ids, inclusive), all confirmed, possibly across segments."""
        if first_entry_id < 0 or first_entry_id > last_entry_id:
            raise IncorrectParameterError(f"named ledger {self.name!r}: bad entry range {first_entry_id}..{last_entry_id}")
        if last_entry_id > self.last_add_confirmed:
            await self.read_last_add_confirmed()
        self._check_start(first_entry_id)
        if last_entry_id > self.last_add_confirmed:
            raise ReadError(
                f"named ledger {self.name!r}: cannot read {first_entry_id}..{last_entry_id} beyond the "
                f"last add confirmed {self.last_add_confirmed}"
            )
        out: list[NamedLedgerEntry] = []
        nxt = first_entry_id
        while nxt <= last_entry_id:
            batch = await self._read_some(nxt, last_entry_id)
            out.extend(batch)
            nxt = batch[-1].entry_id + 1
        return out

    async def _read_some(self, first: int, last: int) -> list[NamedLedgerEntry]:
        """Entries from ``first`` up to ``last`` within one segment (at least one)."""
        for attempt in range(2):
            seg = self._record.segment_for(first)
            if seg is None:
                if attempt == 0:
                    await self.refresh()
                    self._check_start(first)
                    continue
                raise NoSuchEntryError(f"named ledger {self.name!r}: no segment holds entry {first}")
            h = await self._segment_reader(seg)
            lo = first - seg.first_entry_id
            hi = last - seg.first_entry_id
            try:
                if seg.last_entry_id is not None:
                    # Closed in the record: every entry up to its last was recovered to AQ bookies,
                    # even if the ledger's own metadata is not closed yet.
                    hi = min(hi, seg.last_entry_id - seg.first_entry_id)
                    entries = await h.read_unconfirmed(lo, hi)
                else:
                    hi = min(hi, h.last_add_confirmed)
                    entries = await h.read(lo, hi)
            except NoSuchEntryError:
                if attempt == 0:  # trimmed or dropped meanwhile?
                    await self.refresh()
                    self._check_start(first)
                    continue
                raise
            base = seg.first_entry_id
            return [NamedLedgerEntry(base + e.entry_id, e.payload, seg.ledger_id, e.entry_id) for e in entries]
        raise NoSuchEntryError(f"named ledger {self.name!r}: entry {first} not found")

    async def tail(
        self, start_entry_id: int | None = None, *, poll_timeout_s: float = 1.0, batch_size: int = 64
    ) -> AsyncGenerator[NamedLedgerEntry, None]:
        """Every entry from ``start_entry_id`` (default: the start) in order, as it becomes
        confirmed, across writer sessions: when the open segment is closed (or fenced) and a new
        one appears, continue there. Never ends for a reader; a writer's tail ends when it closes.
        Raises ``EntriesShrunkError`` if the position falls below the start."""
        nxt = self._record.start_entry_id if start_entry_id is None else start_entry_id
        while True:
            self._check_start(nxt)
            rec = self._record
            seg = rec.segment_for(nxt)
            if seg is None:
                if self._writer is not None:
                    if self._closed:
                        return
                    await asyncio.sleep(poll_timeout_s)
                    continue
                # Past the end of the closed segments and no open one yet: wait for the next writer.
                before = self._version
                await self.refresh()
                if self._version == before:
                    await asyncio.sleep(poll_timeout_s)
                continue
            h = await self._segment_reader(seg)
            local = nxt - seg.first_entry_id
            bound = (seg.last_entry_id - seg.first_entry_id) if seg.last_entry_id is not None else h.last_add_confirmed
            if local <= bound:
                for e in await self._read_some(nxt, seg.first_entry_id + min(bound, local + batch_size - 1)):
                    yield e
                    nxt = e.entry_id + 1
                continue
            if seg.last_entry_id is not None:
                continue  # segment finished: segment_for(nxt) moves to the next one
            if h is self._writer:
                if self._closed or not self._writer.is_writable:
                    return  # our own writer stopped: nothing more will be confirmed
                await h.wait_for_lac(h.last_add_confirmed, poll_timeout_s)
                continue
            before = h.last_add_confirmed
            lac = await h.wait_for_lac(before, poll_timeout_s)
            if lac <= before:
                # Idle: the writer may be gone (fenced, closed): the record says what happened.
                await self.refresh()

    # ------------------------------------------------------------------ shrink / cursors
    async def shrink(self, end_entry_id: int, force: bool = False) -> int:
        """See :meth:`NamedLedgers.shrink`. Not allowed on a READ_ONLY handle (it changes state)."""
        if self._writer is None:
            raise IllegalOpError(f"named ledger {self.name!r} was opened read-only: use NamedLedgers.shrink")
        start = await self._named.shrink(self.name, end_entry_id, force=force, _lac_hint=self.last_add_confirmed)
        await self.refresh()
        return start

    def get_cursor(self, key: str) -> tuple[bytes | None, int]:
        """(value, record version) as of this handle's view; ``refresh()`` first for the newest."""
        return self._record.cursors.get(key), self._version

    async def set_cursor(self, key: str, value: bytes | None, expected_version: int) -> int:
        """CAS the cursor into the record; ``MetadataVersionError`` if the record moved on."""
        if expected_version == self._version:
            updated = _with_cursors(self._record, {key: value})
            version = await self._named._cas(updated, expected_version)
            self._record, self._version = updated, version
            return version
        version = await self._named.set_cursor(self.name, key, value, expected_version)
        await self.refresh()
        return version

    # ------------------------------------------------------------------ close
    async def close(self) -> None:
        """A writer closes its segment: its ledger (CLOSED at the LAC), then the record. A writer
        that failed (fenced, no bookies) leaves the segment to the next acquirer's recovery."""
        if self._closed:
            return
        self._closed = True
        w, seg = self._writer, self._writer_segment
        if w is None or seg is None:
            return
        if self._last_future is not None:
            await asyncio.gather(self._last_future, return_exceptions=True)  # drains: futures complete in order
        if not w.is_writable:
            w.abandon()
            return
        await w.close()
        closed = seg.closed(w.last_add_confirmed, w.length)
        rec, version = self._record, self._version
        for _ in range(_CAS_RETRIES):
            last = rec.segments[-1] if rec.segments else None
            if rec.writer_epoch != seg.epoch or last is None or last.ledger_id != seg.ledger_id or not last.is_open:
                mine = next((s for s in rec.segments if s.ledger_id == seg.ledger_id), None)
                if mine is not None and mine.last_entry_id not in (None, closed.last_entry_id):
                    raise LedgerFencedError(
                        f"named ledger {self.name!r}: segment {seg.ledger_id} was closed by another writer at "
                        f"{mine.last_entry_id}; this writer's last entry is {closed.last_entry_id}"
                    )
                return  # the next writer closed it the same way
            segments = list(rec.segments[:-1])
            if closed.entry_count:
                segments.append(closed)
            updated = rec.replace(segments=tuple(segments))
            try:
                version = await self._named._cas(updated, version)
            except MetadataVersionError:
                current = await self._named._get(self.name)
                if current is None:
                    return
                rec, version = current.value, current.version
                continue
            self._record, self._version = updated, version
            if not closed.entry_count:
                await self._named._delete_ledgers([seg.ledger_id])
            return
        raise MetadataVersionError(f"named ledger {self.name!r}: close lost too many CAS races")

    async def __aenter__(self) -> NamedLedgerHandle:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


# ============================================================================ helpers


async def _fast_recover(ctx: ClientContext, ledger_id: int, md: LedgerMetadata, password: bytes) -> tuple[int, int]:
    """BookKeeper's recovery steps 2-5 (``recovery.recover_tail``) on the ensembles the name
    record gives, without touching the ledger's metadata (``ctx`` refuses metadata writes):
    fence at ensemble coverage, read forward with fencing reads, write back each recovered
    entry. Returns (last entry id, length)."""
    handle = LedgerHandle(ctx, ledger_id, Versioned(md, -1), password, mode=RECOVERY)
    try:
        return await recover_tail(ctx, handle, password)
    finally:
        handle.abandon()


def _check_password(rec: NamedLedgerRecord, password: bytes) -> None:
    if rec.password != bytes(password):
        raise UnauthorizedAccessError(f"named ledger {rec.name!r}: wrong password")


def _digest(value: Any) -> DigestType:
    if isinstance(value, DigestType):
        return value
    if isinstance(value, str):
        return DigestType.parse(value)
    try:
        return DigestType(int(value))
    except ValueError:
        raise IncorrectParameterError(f"unknown digest type {value!r}") from None


def _with_cursors(rec: NamedLedgerRecord, updates: Mapping[str, bytes | None]) -> NamedLedgerRecord:
    cursors = dict(rec.cursors)
    for k, v in updates.items():
        if not isinstance(k, str) or not k:
            raise IncorrectParameterError(f"bad cursor key {k!r}")
        if v is None:
            cursors.pop(k, None)
        else:
            if len(v) > 64 * 1024:
                raise IncorrectParameterError(f"cursor {k!r}: {len(v)} bytes (cursors are small markers, <= 64 KiB)")
            cursors[k] = bytes(v)
    return rec.replace(cursors=cursors)


def _check_published(rec: NamedLedgerRecord, ledger_ids: Sequence[int], mds: Sequence[LedgerMetadata]) -> None:
    present = {s.ledger_id for s in rec.segments}
    if len(set(ledger_ids)) != len(ledger_ids):
        raise IncorrectParameterError(f"ledger ids repeated in {list(ledger_ids)}")
    for lid, md in zip(ledger_ids, mds):
        if lid in present:
            raise IncorrectParameterError(f"ledger {lid} is already a segment of {rec.name!r}")
        if md.password != rec.password or md.digest_type != rec.digest_type:
            raise IncorrectParameterError(
                f"ledger {lid}: its digest type and password must be those of named ledger {rec.name!r}"
            )


def _append_segments(
    segments: tuple[Segment, ...], first: int, ledger_ids: Sequence[int], mds: Sequence[LedgerMetadata], epoch: int
) -> tuple[Segment, ...]:
    out = list(segments)
    for lid, md in zip(ledger_ids, mds):
        if md.last_entry_id < 0:
            continue  # an empty ledger adds nothing
        out.append(Segment(int(lid), first, first + md.last_entry_id, md.length, epoch))
        first += md.last_entry_id + 1
    return tuple(out)
