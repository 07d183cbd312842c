"""Named ledgers (requirement R3 of docs/correctness.md): open a log by name, re-open it for appending after another writer,
shrink it from the front, keep small cursors next to it.

Responsibility: the asyncio API over a :class:`~vellum.client.bookkeeper.BookKeeper`:
:class:`NamedLedgers` (open / list / info / delete / shrink / cursors / publish_segments /
overwrite): the record's reads and CASes in the metadata store, fencing and recovering a
name's open segment, creating and retiring segment ledgers. Its parts live next door and are
re-exported here: the record, its serialization and every change made to it, pure
(``named_record.py``); the handle of an open name, :class:`NamedLedgerHandle` (append, read,
tail, shrink, cursors, close with one continuous sequence of entry ids; ``named_handle.py``).

Mechanism (docs/named-ledgers.md): a named ledger is an ordered list of ledger *segments* kept in
one record of the metadata store's key-value area (``names/<name>``), changed only by
compare-and-set. Global entry id = segment's first global id + the entry's id in its ledger.
An APPEND acquisition reads the record (1 read), fences and recovers the open segment's tail on
the bookies named in the record (no metadata op), creates the next segment's ledger (2 writes:
ledger id + ledger metadata) and commits everything with one CAS of the record (1 write).

Invariants (the record's own, contiguous segments and format versions, are in ``named_record.py``):
- the record is the truth for a name: a segment's last entry is the one in the record, even if
  its ledger's own metadata is still OPEN (its close is done off the acquisition path);
- every writer session has its own ``writer_epoch``; a writer touches the record only while the
  epoch and the open segment are still its own, so a fenced writer can never re-open the record;
- a named writer CASes the record *before* its ledger's metadata on an ensemble change, so the
  record always names every bookie the open segment may have acknowledged entries on: fencing
  the bookies the record names is enough (see ``_writer_handle``);
- entries below ``start_entry_id`` are never returned; shrink never touches entries at or after it.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from vellum.client.bookkeeper import BookKeeper, parse_digest_type
from vellum.client.ledger import RECOVERY, WRITER, ClientContext, LedgerHandle
from vellum.client.named_handle import NamedLedgerHandle
from vellum.client.named_record import (
    CAS_RETRIES,
    CUSTOM_EPOCH_KEY,
    CUSTOM_NAME_KEY,
    KEY_PREFIX,
    RECORD_FORMAT_NAME,
    RECORD_FORMAT_VERSION,
    BookieCollection,
    NamedLedgerEntry,
    NamedLedgerInfo,
    NamedLedgerRecord,
    PositionCursor,
    Quorum,
    RecoveredEnd,
    Segment,
    ShrinkResult,
    check_published,
    deserialize_record,
    first_published,
    record_key,
    resolve_quorum,
    serialize_record,
    validate_name,
)
from vellum.client.recovery import fence_ledger, recover_ledger, recover_tail
from vellum.errors import (
    EntriesShrunkError,  # defined in vellum.errors; importable from here too (compatibility)
    IncorrectParameterError,
    LedgerExistsError,
    LedgerFencedError,
    MetadataVersionError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
    UnauthorizedAccessError,
    VellumError,
)
from vellum.format.entry import DigestType, master_key
from vellum.ids import LedgerId
from vellum.meta.api import Versioned
from vellum.meta.model import LedgerMetadata, LedgerState

__all__ = [
    "CUSTOM_EPOCH_KEY", "CUSTOM_NAME_KEY", "KEY_PREFIX", "RECORD_FORMAT_NAME", "RECORD_FORMAT_VERSION",
    "BookieCollection", "EntriesShrunkError", "NamedLedgerEntry", "NamedLedgerHandle", "NamedLedgerInfo", "NamedLedgerRecord",
    "NamedLedgers", "OpenMode", "PositionCursor", "Segment", "ShrinkResult", "deserialize_record", "record_key", "serialize_record",
    "validate_name",
]

log = logging.getLogger(__name__)


class OpenMode(enum.Enum):
    """How :meth:`NamedLedgers.open` treats the name (``O_CREATE/O_APPEND/O_RDONLY`` of requirement R3 of docs/correctness.md).

    ``CREATE_OR_APPEND`` is Vellum's extra: APPEND, creating the name if it is missing.
    """

    CREATE = "create"
    APPEND = "append"
    READ_ONLY = "read_only"
    CREATE_OR_APPEND = "create_or_append"


#: the wall clock of a record's and a segment's ``ctime`` (``time.time`` in production; the
#: simulator sets its own: docs/verification.md)
_wall_clock = time.time


def _writer_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


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

    async def _create_record(self, record: NamedLedgerRecord) -> int:
        """Store the record of a new name (``MetadataVersionError`` if the name exists)."""
        version: int = await self._meta(self._ctx().store.kv.create, record_key(record.name),
                                         serialize_record(record))
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
        segment_metadata: Mapping[str, bytes] | None = None,
    ) -> NamedLedgerHandle:
        """Open ``name``: CREATE (``LedgerExistsError`` if it exists), APPEND (``NoSuchLedgerError``
        if missing; fences the previous writer session), READ_ONLY (changes nothing), or
        CREATE_OR_APPEND. The quorum sizes and digest apply to new segments (CREATE defaults them
        from the client configuration, APPEND from the record). ``segment_metadata``: custom
        metadata of the segment ledger this writer session creates (e.g. its entry format,
        ``vellum.format.records``), beside the name and epoch the segment is always stamped with."""
        mode = OpenMode(mode)
        validate_name(name)
        if not isinstance(password, (bytes, bytearray)):
            raise IncorrectParameterError("password must be bytes")
        password = bytes(password)
        quorum = (ensemble_size, write_quorum_size, ack_quorum_size)
        if mode is OpenMode.CREATE:
            return await self._create(name, digest_type, password, quorum, custom_metadata, segment_metadata)
        if mode is OpenMode.READ_ONLY:
            v = await self._get_existing(name)
            v.value.check_password(password)
            handle = NamedLedgerHandle(self, v)
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
                return await self._create(name, digest_type, password, quorum, custom_metadata, segment_metadata)
            except LedgerExistsError:
                got = await self._get_existing(name)  # created meanwhile: append to it
        return await self._acquire(got, password, quorum, segment_metadata)

    async def _create(
        self,
        name: str,
        digest_type: str | DigestType | None,
        password: bytes,
        quorum: Quorum,
        custom_metadata: dict[str, bytes] | None,
        segment_metadata: Mapping[str, bytes] | None = None,
    ) -> NamedLedgerHandle:
        cfg = self._bk.config
        e, wq, aq = resolve_quorum(quorum, (cfg.ensemble_size, cfg.write_quorum_size, cfg.ack_quorum_size))
        dt = parse_digest_type(digest_type if digest_type is not None else cfg.digest_type)
        rec = NamedLedgerRecord(
            name=name, digest_type=dt, password=password, ensemble_size=e, write_quorum_size=wq,
            ack_quorum_size=aq, writer_epoch=1, writer=_writer_identity(), ctime_ms=int(_wall_clock() * 1000),
            custom_metadata=dict(custom_metadata or {}),
        )
        seg, md, md_version = await self._new_segment(rec, 0, 1, segment_metadata=segment_metadata)
        rec = rec.replace(segments=(seg,))
        try:
            version = await self._create_record(rec)
        except MetadataVersionError:
            self._spawn(self._delete_ledgers([seg.ledger_id]))
            raise LedgerExistsError(f"named ledger {name!r} already exists") from None
        except BaseException:
            self._spawn(self._delete_ledgers([seg.ledger_id]))
            raise
        return self._writer_handle(Versioned(rec, version), md, md_version)

    async def _new_segment(
        self, rec: NamedLedgerRecord, first_entry_id: int, epoch: int, quorum: Quorum = (None, None, None),
        *, segment_metadata: Mapping[str, bytes] | None = None,
    ) -> tuple[Segment, LedgerMetadata, int]:
        """Create the OPEN ledger of a new segment: 2 metadata writes (ledger id, ledger metadata)."""
        ctx = self._ctx()
        e, wq, aq = resolve_quorum(quorum, (rec.ensemble_size, rec.write_quorum_size, rec.ack_quorum_size))
        try:
            ensemble = ctx.placement.new_ensemble(e, wq, aq, writable=ctx.writable_bookies,
                                                  read_only=ctx.read_only_bookies)
        except NotEnoughBookiesError:
            # The registration watch may lag behind a bookie that just registered: look once more.
            reg = ctx.store.registration
            ctx.writable_bookies = frozenset(str(b) for b in await self._meta(reg.list_bookies))
            ensemble = ctx.placement.new_ensemble(e, wq, aq, writable=ctx.writable_bookies,
                                                  read_only=ctx.read_only_bookies)
        md = rec.segment_ledger_metadata((e, wq, aq), ensemble, epoch, ctime_ms=int(_wall_clock() * 1000),
                                         creator_token=int.from_bytes(os.urandom(7), "big"),
                                         extra=segment_metadata)
        store = ctx.store
        ledger_id = await self._meta(store.id_generator.generate_ledger_id)
        md_version: int = await self._meta(store.ledgers.create_ledger_with_id, ledger_id, md)
        seg = Segment(int(ledger_id), first_entry_id, None, 0, epoch, e, wq, aq, {0: tuple(ensemble)})
        return seg, md, md_version

    async def _acquire(
        self,
        got: Versioned[NamedLedgerRecord],
        password: bytes,
        quorum: Quorum,
        segment_metadata: Mapping[str, bytes] | None = None,
    ) -> NamedLedgerHandle:
        """APPEND: fence + recover the open segment, create the next one, one CAS (see module doc)."""
        got.value.check_password(password)
        new: tuple[Segment, LedgerMetadata, int] | None = None
        fenced: Segment | None = None
        recovered: dict[tuple[int, tuple[tuple[int, tuple[str, ...]], ...]], RecoveredEnd] = {}
        try:
            for _ in range(CAS_RETRIES):
                rec = got.value
                fenced = rec.open_segment
                end: RecoveredEnd | None = None
                if fenced is not None:
                    # Recover once per (ledger, ensembles) seen: a retry after an unrelated record
                    # change (cursor, shrink) does not redo it.
                    key = (fenced.ledger_id, tuple(sorted(fenced.ensembles.items())))
                    if key not in recovered:
                        recovered[key] = await self._recover_segment(rec, fenced)
                    end = recovered[key]
                if new is None:
                    # Its first entry id and epoch are placed by acquired(), on each retry's record.
                    new = await self._new_segment(rec, 0, rec.writer_epoch + 1, quorum,
                                                   segment_metadata=segment_metadata)
                updated = rec.acquired(end, new[0], _writer_identity())
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
        handle = NamedLedgerHandle(self, v)
        seg = v.value.segments[-1]
        # An ensemble change is written to the record first (so acquirers fence the new bookies
        # too), then to the ledger's metadata: the writer awaits the hook before its CAS.
        writer = LedgerHandle(self._ctx(), seg.ledger_id, Versioned(md, md_version), v.value.password, mode=WRITER,
                              on_ensemble_change=handle._record_ensemble_change)
        handle._adopt_writer(writer, seg)
        return handle

    # ------------------------------------------------------------------ recovery of an open segment
    async def _recover_segment(self, rec: NamedLedgerRecord, seg: Segment) -> RecoveredEnd:
        """Fence the open segment on the bookies the record names and recover its tail.

        Returns (last entry id in the ledger, length). No metadata operation on the fast path; if
        the fast path cannot finish (a write-back needs an ensemble change, or too few bookies
        answer) fall back to BookKeeper's recovery through the ledger's metadata.
        """
        md = rec.probe_metadata(seg)
        try:
            return await _fast_recover(self._ctx(), seg.ledger_id, md, rec.password)
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
        for _ in range(CAS_RETRIES):
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
        md = rec.probe_metadata(seg)
        await fence_ledger(self._ctx(), seg.ledger_id, md, rec.password)  # fencing writes no metadata

    # ------------------------------------------------------------------ shrink
    async def shrink(self, name: str, end_entry_id: int, *, force: bool = False) -> ShrinkResult:
        """Move the start of ``name`` to ``end_entry_id`` (entries below become invisible).
        Shrinking to the current start again is allowed (e.g. with ``force`` after a shrink
        without); below it is ``IncorrectParameterError``, as is past the last entry + 1.

        ``force``: also drop whole segments below the new start from the record and delete their
        ledgers, and have every bookie holding the range collect it now (wire op COLLECT: trim
        below the start, seal the entry logs holding it, run a GC pass); returns once every
        bookie answered, with what each reclaimed (``ShrinkResult.collections``). A bookie that
        could not collect is reported there (``collected`` False), never hidden; shrinking with
        ``force`` to the same point again asks the bookies again.
        """
        return await self._shrink(name, end_entry_id, force, None)

    async def _shrink(self, name: str, end_entry_id: int, force: bool, last_entry_id: int | None) -> ShrinkResult:
        """:meth:`shrink`. ``last_entry_id``: the name's last entry when the caller knows it (its
        writer's LAC), else the bookies are asked for the open segment's."""
        if end_entry_id < 0:
            raise IncorrectParameterError(f"bad shrink point {end_entry_id}")
        for _ in range(CAS_RETRIES):
            got = await self._get_existing(name)
            rec = got.value
            last = last_entry_id if last_entry_id is not None else await self._last_entry_id(rec)
            updated, dropped = rec.shrunk(end_entry_id, last, force=force)
            start = updated.start_entry_id
            if updated is not rec:
                # The bookies of a dropped segment are only in its ledger's metadata: read it
                # before the ledger is deleted.
                dropped_bookies = {s.ledger_id: await self._bookies_of(s) for s in dropped} if force else {}
                try:
                    await self._cas(updated, got.version)
                except MetadataVersionError:
                    continue
            else:
                dropped_bookies = {}
            if not force:
                return ShrinkResult(start)
            await self._delete_ledgers([s.ledger_id for s in dropped])
            targets: tuple[tuple[str, int, int], ...] = ()
            for seg in dropped:
                targets += tuple((b, seg.ledger_id, 0) for b in dropped_bookies[seg.ledger_id])
            kept = updated.segments[0] if updated.segments else None
            if kept is not None and kept.first_entry_id < start:
                end_local = start - kept.first_entry_id
                targets += tuple((b, kept.ledger_id, end_local) for b in await self._bookies_of(kept))
            collections = await self._collect(rec, targets)
            return ShrinkResult(start, tuple(s.ledger_id for s in dropped), collections)
        raise MetadataVersionError(f"named ledger {name!r}: shrink lost too many CAS races")

    async def _bookies_of(self, seg: Segment) -> tuple[str, ...]:
        """Every bookie of every ensemble of ``seg``'s ledger (the record for an open segment,
        else the ledger's metadata; none if that is gone already)."""
        if seg.is_open:
            return tuple(sorted({str(b) for ens in seg.ensembles.values() for b in ens}))
        try:
            md = (await self._ctx().read_metadata(seg.ledger_id)).value
        except NoSuchLedgerError:
            return ()
        return tuple(sorted({str(b) for ens in md.ensembles.values() for b in ens}))

    async def _collect(self, rec: NamedLedgerRecord, targets: Sequence[tuple[str, int, int]]) -> tuple[BookieCollection, ...]:
        """COLLECT ``(bookie, ledger, local end)`` on every target at once; each answer is a
        :class:`BookieCollection` (an error is reported, and logged, not raised)."""
        ctx = self._ctx()
        key = master_key(rec.password)
        timeout = float(ctx.config.shrink_collect_timeout_s)
        results = await asyncio.gather(
            *(ctx.bookie_client.collect(b, lid, end, key, timeout_s=timeout) for b, lid, end in targets),
            return_exceptions=True,
        )
        out: tuple[BookieCollection, ...] = ()
        for (bookie, lid, end), r in zip(targets, results):
            if isinstance(r, NoSuchLedgerError):
                log.info("named ledger %r: bookie %s does not hold ledger %d: nothing to collect there",
                         rec.name, bookie, lid)
                out += (BookieCollection(bookie, lid, end, held=False),)
            elif isinstance(r, BaseException):
                log.warning("named ledger %r: bookie %s could not collect ledger %d below entry %d: %s "
                            "(its space comes back at its next GC pass)", rec.name, bookie, lid, end, r)
                out += (BookieCollection(bookie, lid, end, error=f"{type(r).__name__}: {r}"),)
            else:
                reclaimed, garbage = r
                out += (BookieCollection(bookie, lid, end, reclaimed_bytes=reclaimed, garbage_bytes=garbage),)
        return out

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
        return await self._cas(got.value.with_cursors({key: value}), expected_version)

    # ------------------------------------------------------------------ publish / overwrite
    async def publish_segments(
        self,
        name: str,
        ledger_ids: Sequence[int],
        *,
        expected_version: int | None,
        cursor_updates: Mapping[str, bytes | None] | None = None,
        time_ranges: Mapping[int, tuple[int, int]] | None = None,
    ) -> int:
        """Append pre-written CLOSED ledgers as new segments and update cursors in ONE CAS.

        ``expected_version=None`` creates the name (it must not exist; digest, password and quorum
        sizes come from the first ledger). An open writer segment is fenced and closed first (in
        the same CAS). A conflict (``MetadataVersionError``) leaves nothing visible. Empty ledgers
        are skipped. ``time_ranges``: ledger id -> (lowest, highest) append time of its
        records-v1 entries, kept in its segment (docs/formats.md "Segment time range").
        Returns the record's new version.
        """
        return await self._publish(name, ledger_ids, expected_version, cursor_updates, overwrite=False,
                                   time_ranges=time_ranges)

    async def overwrite(
        self,
        name: str,
        ledger_ids: Sequence[int],
        *,
        expected_version: int | None,
        cursor_updates: Mapping[str, bytes | None] | None = None,
        time_ranges: Mapping[int, tuple[int, int]] | None = None,
    ) -> int:
        """Replace every segment by the given CLOSED ledgers in ONE CAS.

        Entry ids keep growing: the new segments start after the old last entry and the start moves
        there, so readers never see an id reused. The replaced ledgers are deleted afterwards.
        """
        return await self._publish(name, ledger_ids, expected_version, cursor_updates, overwrite=True,
                                   time_ranges=time_ranges)

    async def merge_segments(self, name: str, ledger_ids: Sequence[int], merged_ledger_id: int) -> int:
        """Replace the consecutive CLOSED segments ``ledger_ids`` by ledger ``merged_ledger_id``,
        a CLOSED copy of their entries in order (the same global ids, count and bytes; checked),
        in one CAS, retried on the fresh record while unrelated changes win the race (a change
        to those segments themselves, e.g. a forced shrink dropping one, is an
        ``IncorrectParameterError``). The replaced ledgers are *not* deleted: a reader may have
        planned reads of them; the caller deletes them once no such read can be running.
        Returns the record's new version."""
        md = (await self._ctx().read_metadata(merged_ledger_id)).value
        for _ in range(CAS_RETRIES):
            got = await self._get_existing(name)
            updated = got.value.merged(ledger_ids, merged_ledger_id, md)
            try:
                return await self._cas(updated, got.version)
            except MetadataVersionError:
                continue
        raise MetadataVersionError(f"named ledger {name!r}: merging segments lost {CAS_RETRIES} CAS races")

    async def _publish(
        self,
        name: str,
        ledger_ids: Sequence[int],
        expected_version: int | None,
        cursor_updates: Mapping[str, bytes | None] | None,
        *,
        overwrite: bool,
        time_ranges: Mapping[int, tuple[int, int]] | None = None,
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
            rec = first_published(name, ledger_ids, mds, cursor_updates or {}, ctime_ms=int(_wall_clock() * 1000),
                                  time_ranges=time_ranges)
            try:
                return await self._create_record(rec)
            except MetadataVersionError:
                raise MetadataVersionError(f"named ledger {name!r} already exists (expected it not to)") from None
        got = await self._get_existing(name)
        if got.version != expected_version:
            raise MetadataVersionError(
                f"named ledger {name!r} changed: expected version {expected_version}, the store has {got.version}"
            )
        rec = got.value
        check_published(rec, ledger_ids, mds)  # before fencing the writer
        fenced = rec.open_segment
        recovered = await self._recover_segment(rec, fenced) if fenced is not None else None
        updated, replaced = rec.published(recovered, ledger_ids, mds, cursor_updates or {}, overwrite=overwrite,
                                          time_ranges=time_ranges)
        version = await self._cas(updated, expected_version)  # conflict: nothing visible
        if fenced is not None and self._close_fenced and not overwrite:
            closed = next((s for s in updated.segments if s.ledger_id == fenced.ledger_id), None)
            if closed is not None:
                self._spawn(self._close_ledger_metadata(closed))
        if overwrite:
            keep = set(ledger_ids)
            await self._delete_ledgers([s.ledger_id for s in replaced if s.ledger_id not in keep])
        return version


# ============================================================================ helpers


async def _fast_recover(ctx: ClientContext, ledger_id: int, md: LedgerMetadata, password: bytes) -> tuple[int, int]:
    """BookKeeper's recovery steps 2-5 (``recovery.recover_tail``) on the ensembles the name
    record gives, without touching the ledger's metadata (the probe handle may not write it: a
    write-back that needs an ensemble change fails with ``LedgerRecoveryError`` and the caller
    falls back to recovery through the ledger's metadata, which can CAS the change safely):
    fence at ensemble coverage, read forward with fencing reads, write back each recovered
    entry. Returns (last entry id, length)."""
    handle = LedgerHandle(ctx, ledger_id, Versioned(md, -1), password, mode=RECOVERY, metadata_writes=False)
    try:
        return await recover_tail(ctx, handle, password)
    finally:
        handle.abandon()

