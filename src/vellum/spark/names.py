"""The Spark side of named ledgers: readable views of name records, and atomic publishing.

Responsibility: adapt :mod:`vellum.client.named` (asyncio) to the blocking code of the data
source: ``NameReader`` gives the readable range and segments of a name without opening it for
writing; ``NameWriter`` publishes a job's staging ledgers (and a sink cursor) by one CAS.

Invariants:
- reading never changes the record and never fences: the open segment's readable end is its
  LAC, read with a ``recovery=False`` handle (kept per ledger so refreshes are cheap);
- a publish is one compare-and-set of the record; the cursor check (replay detection) uses the
  same record version as the CAS, so "check then publish" cannot interleave with another commit;
- staging ledgers are written with the name's digest type and password (the record's), which
  the named-ledger client requires of published segments;
- ``referenced_ledgers`` is all or nothing: a listing or record it cannot read raises
  ``NameScanError``, never a partial set (callers delete what is *not* in the set).
"""

from __future__ import annotations

from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from vellum.client.blocking import BookKeeper, LedgerHandle
from vellum.client.named import NamedLedgerRecord, NamedLedgers, OpenMode, PositionCursor
from vellum.client.named_record import CAS_RETRIES
from vellum.errors import MetadataVersionError, NoSuchLedgerError
from vellum.meta.api import Versioned
from vellum.spark.options import WriteOptions

_T = TypeVar("_T")
_TIMEOUT_S = 120.0
#: full scans of the name records tried while names keep appearing during the scan
_SCAN_ROUNDS = 5


def _call(bk: BookKeeper, coro: Coroutine[Any, Any, _T]) -> _T:
    """Run a coroutine of the async client on the blocking client's loop (bounded wait)."""
    return bk.run(coro, timeout_s=_TIMEOUT_S)


@dataclass(frozen=True)
class SegmentView:
    ledger_id: int
    first_entry_id: int
    last_readable: int  # global id of the last readable entry (first - 1 if none)
    #: (lowest, highest) append time of a closed segment's entries, if its record keeps it
    time_range: tuple[int, int] | None = None


@dataclass(frozen=True)
class NameView:
    start_entry_id: int
    end: int  # global id after the last readable entry
    segments: tuple[SegmentView, ...]
    password: bytes = field(repr=False)  # never in a log line or error message
    custom_metadata: dict[str, bytes]
    avg_entry_bytes: int


class NameReader:
    """Read-only views of named ledgers (driver side)."""

    def __init__(self, bk: BookKeeper) -> None:
        self._bk = bk
        self._named = NamedLedgers(bk.aio)
        self._readers: dict[int, LedgerHandle] = {}

    def list_names(self) -> list[str]:
        return _call(self._bk, self._named.list(""))

    def record(self, name: str) -> Versioned[NamedLedgerRecord] | None:
        try:
            return _call(self._bk, self._named.record(name))
        except NoSuchLedgerError:
            return None

    def view(self, name: str) -> NameView | None:
        got = self.record(name)
        if got is None:
            return None
        rec = got.value
        segs: list[SegmentView] = []
        length = entries = 0
        for seg in rec.segments:
            if seg.last_entry_id is not None:
                last = seg.last_entry_id
                length += seg.length
                entries += seg.last_entry_id - seg.first_entry_id + 1
            else:
                h = self._readers.get(seg.ledger_id)
                try:
                    if h is None:
                        h = self._bk.open_ledger(seg.ledger_id, password=rec.password, recovery=False)
                        self._readers = {seg.ledger_id: h}  # only the current open segment is kept
                    else:
                        h.read_last_add_confirmed()
                except NoSuchLedgerError:
                    return None  # deleted under us: the record changed, the caller sees data loss
                last = seg.first_entry_id + h.last_add_confirmed
                length += h.length
                entries += h.last_add_confirmed + 1
            if last >= rec.start_entry_id:
                segs.append(SegmentView(seg.ledger_id, seg.first_entry_id, last, seg.time_range))
        end = max(rec.start_entry_id, segs[-1].last_readable + 1 if segs else rec.start_entry_id)
        avg = max(1, length // entries) if entries > 0 and length > 0 else 1024
        return NameView(rec.start_entry_id, end, tuple(segs), rec.password, dict(rec.custom_metadata), avg)


def store_position_cursor(bk: BookKeeper, name: str, key: str, next_entry_id: int, *, retain: bool) -> bool:
    """Store cursor ``key`` of ``name`` as a position (the next entry to read) by CAS on a fresh
    record, retried while other changes (writers, publishes, other cursors) win the race.
    False if the name does not exist."""
    import time

    named = NamedLedgers(bk.aio)
    value = PositionCursor(next_entry_id, retain, {"updatedMs": int(time.time() * 1000)}).encode()
    for _ in range(CAS_RETRIES):
        try:
            got = _call(bk, named.record(name))
            _call(bk, named.set_cursor(name, key, value, got.version))
            return True
        except NoSuchLedgerError:
            return False
        except MetadataVersionError:
            continue
    raise MetadataVersionError(f"named ledger {name!r}: cursor {key!r} lost {CAS_RETRIES} compare-and-set races")


class NameScanError(RuntimeError):
    """Not every named-ledger record could be read: nothing may be deleted on the strength of it."""


def referenced_ledgers(bk: BookKeeper) -> frozenset[int]:
    """Every ledger id that some named ledger's segments reference, from a fresh read of every record.

    Deleting a ledger outside this set cannot lose published data; so the set must be complete:
    a name created during the scan (a commit creating its name) triggers another round, and any
    error (store unavailable, unreadable or newer-format record) raises ``NameScanError``.
    """
    named = NamedLedgers(bk.aio)
    try:
        names = _call(bk, named.list(""))
        for _ in range(_SCAN_ROUNDS):
            ids: set[int] = set()
            for name in names:
                try:
                    rec = _call(bk, named.record(name)).value
                except NoSuchLedgerError:
                    continue  # deleted since the listing: its record references nothing any more
                ids.update(seg.ledger_id for seg in rec.segments)
            again = _call(bk, named.list(""))
            if set(again) <= set(names):
                return frozenset(ids)
            names = again  # names appeared while we read: one of them may reference our ledgers
    except Exception as exc:
        raise NameScanError(f"could not read every named-ledger record ({type(exc).__name__}: {exc})") from exc
    raise NameScanError(f"named ledgers kept being created during {_SCAN_ROUNDS} scans of their records")


class NameWriter:
    """Publishes staging ledgers into one named ledger (driver-side commit)."""

    def __init__(self, bk: BookKeeper, opts: WriteOptions) -> None:
        self._bk = bk
        self._opts = opts
        self._named = NamedLedgers(bk.aio)

    def publish(self, ledger_ids: list[int], *, overwrite: bool, cursor: tuple[str, int] | None,
                time_ranges: dict[int, tuple[int, int]] | None = None) -> bool:
        """One CAS publishing ``ledger_ids`` (and the cursor). False: a replay, nothing changed.
        ``time_ranges``: the append-time range of a ledger's records-v1 entries, kept in its segment.

        ``MetadataVersionError`` when another commit won the race: the caller re-reads and retries.
        """
        name = self._opts.name
        got = None
        try:
            got = _call(self._bk, self._named.record(name))
        except NoSuchLedgerError:
            pass
        updates: dict[str, bytes | None] = {}
        if cursor is not None:
            key, batch_id = cursor
            if got is not None:
                stored = got.value.cursors.get(key)
                if stored is not None and int(stored) >= batch_id:
                    return False
            updates[key] = str(batch_id).encode()
        if got is None and not ledger_ids:
            # Nothing to publish, but the name should exist afterwards (and carry the cursor).
            self._create_empty()
            got = _call(self._bk, self._named.record(name))
        if got is None:
            fn = self._named.overwrite if overwrite else self._named.publish_segments
            _call(self._bk, fn(name, ledger_ids, expected_version=None, cursor_updates=updates,
                               time_ranges=time_ranges))
            return True
        if not ledger_ids and not overwrite:
            if updates:
                key, value = next(iter(updates.items()))
                _call(self._bk, self._named.set_cursor(name, key, value, got.version))
            return True
        fn = self._named.overwrite if overwrite else self._named.publish_segments
        _call(self._bk, fn(name, ledger_ids, expected_version=got.version, cursor_updates=updates,
                           time_ranges=time_ranges))
        return True

    def _create_empty(self) -> None:
        o = self._opts
        try:
            h = _call(self._bk, self._named.open(
                o.name, OpenMode.CREATE, digest_type=o.digest_type, password=o.password,
                ensemble_size=o.ensemble_size, write_quorum_size=o.write_quorum_size,
                ack_quorum_size=o.ack_quorum_size,
            ))
        except MetadataVersionError:
            return
        except Exception as exc:
            if type(exc).__name__ == "LedgerExistsError":
                return
            raise
        _call(self._bk, h.close())


def resolve_write_settings(bk: BookKeeper, opts: WriteOptions) -> WriteOptions:
    """Options completed from an existing name's record: its digest type and quorum defaults.

    Published segments must have the record's digest and password, so a mismatching password
    option is an error here, at ``save()`` time, rather than at commit after all the writing.

    Quorums left unset come from the name's record, else from the client's configuration. (An
    unstriped default, ensemble = write quorum, was tried: its segments are read with BATCH_READ,
    but on a 3-bookie cluster two tasks' random ensembles often share both bookies, and writes
    lost more than reads gained; see docs/benchmarks.md.)
    """
    import dataclasses

    try:
        rec = _call(bk, NamedLedgers(bk.aio).record(opts.name)).value
    except NoSuchLedgerError:
        rec = None
    if rec is not None:
        if rec.password != opts.password:
            raise ValueError(f"[VELLUM_OPTION] named ledger {opts.name!r} exists with another password: "
                             "give its password in the option password")
        if opts.digest_type is not None and opts.digest_type != rec.digest_type.name:
            raise ValueError(f"[VELLUM_OPTION] named ledger {opts.name!r} uses digest {rec.digest_type.name}, "
                             f"not {opts.digest_type}")
    cfg = bk.config
    ensemble = opts.ensemble_size or (rec.ensemble_size if rec else cfg.ensemble_size)
    write_quorum = opts.write_quorum_size or (rec.write_quorum_size if rec else cfg.write_quorum_size)
    ack_quorum = opts.ack_quorum_size or (rec.ack_quorum_size if rec else cfg.ack_quorum_size)
    if write_quorum > ensemble:
        if opts.ensemble_size:
            raise ValueError(f"[VELLUM_OPTION] writeQuorumSize {write_quorum} is above ensembleSize {ensemble}")
        ensemble = write_quorum  # a default ensemble below the write quorum this job asked for
    if ack_quorum > write_quorum:
        if opts.ack_quorum_size:
            raise ValueError(f"[VELLUM_OPTION] ackQuorumSize {ack_quorum} is above writeQuorumSize {write_quorum}")
        ack_quorum = write_quorum  # a default ack quorum above the write quorum this job asked for
    return dataclasses.replace(
        opts,
        digest_type=rec.digest_type.name if rec else opts.digest_type,
        ensemble_size=ensemble,
        write_quorum_size=write_quorum,
        ack_quorum_size=ack_quorum,
    )
