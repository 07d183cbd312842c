"""The named-ledger record (requirement R3 of docs/correctness.md): what the metadata store keeps for one name, and every
change a named-ledger operation makes to it, as pure functions.

Responsibility: :class:`NamedLedgerRecord` and its :class:`Segment` list, their readable versioned
serialization (``VellumNamedLedger\\t1`` + JSON, docs/named-ledgers.md), name validation, the
values the API returns (:class:`NamedLedgerEntry`, :class:`NamedLedgerInfo`), and the record
transitions of acquisition, writer close, ensemble change, shrink, cursors and publish. No I/O:
:mod:`vellum.client.named` reads the record, asks the bookies, and CASes what these return.

Invariants (kept by every transition here):
- only the last segment may be OPEN; segments are contiguous: ``seg[i+1].first == seg[i].last + 1``;
- global entry id = a segment's ``first_entry_id`` + the entry's id in its ledger;
- an OPEN segment carries its quorum sizes and *every* ensemble, so fencing and recovering it
  never needs its ledger's metadata (:meth:`NamedLedgerRecord.probe_metadata`);
- a writer session owns the record only while ``writer_epoch`` is its epoch and its segment is
  the open last one (:meth:`NamedLedgerRecord.held_by`);
- the start only moves forward and never past the last entry + 1; entry ids are never reused
  (an overwrite starts the new segments after the old last entry);
- a cursor holds nothing back unless it says so: a *position cursor* (:class:`PositionCursor`)
  with ``retain`` set stops a shrink from moving the start past its position; every other
  cursor is an opaque marker a shrink ignores;
- a record written by a newer format version is refused (``MetaStoreError``), never rewritten.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vellum.errors import IncorrectParameterError, MetaStoreError, UnauthorizedAccessError, VellumError
from vellum.format.entry import DigestType
from vellum.ids import BookieId
from vellum.meta.model import LedgerMetadata, LedgerState

RECORD_FORMAT_NAME = "VellumNamedLedger"
RECORD_FORMAT_VERSION = 1
_HEADER_PREFIX = (RECORD_FORMAT_NAME + "\t").encode()
#: key prefix of named-ledger records in the key-value area
KEY_PREFIX = "names/"
_NAME_SEGMENT = re.compile(r"^[A-Za-z0-9._~:@=+-]+$")
#: custom metadata keys stamped on every segment ledger (ops can tell which name owns a ledger)
CUSTOM_NAME_KEY = "vellum.name"
CUSTOM_EPOCH_KEY = "vellum.writerEpoch"
#: cursors are small markers kept in the record itself
MAX_CURSOR_BYTES = 64 * 1024
#: bounded retries of a record CAS that keeps losing to unrelated record changes (cursors, shrink)
CAS_RETRIES = 50

#: (ensemble size, write quorum size, ack quorum size); None: take the default
Quorum = tuple[int | None, int | None, int | None]
#: an open segment's recovered end: (last entry id *in its ledger*, length in bytes)
RecoveredEnd = tuple[int, int]


@dataclass(frozen=True)
class PositionCursor:
    """A cursor that holds a reader's position: the next global entry id it will read.

    Stored as a JSON object (``{"nextEntryId": 120, "retain": false, ...}``; other keys are
    information such as the query and batch that wrote it) so that tools can tell it apart from
    an opaque cursor and compute its lag (entries between it and the name's end). With
    ``retain`` a shrink refuses to move the start past ``next_entry_id`` (docs/named-ledgers.md
    "Cursors").
    """

    next_entry_id: int
    retain: bool = False
    info: Mapping[str, Any] = field(default_factory=dict)

    def encode(self) -> bytes:
        body = {**dict(self.info), "nextEntryId": int(self.next_entry_id), "retain": bool(self.retain)}
        return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def decode(cls, value: bytes | None) -> PositionCursor | None:
        """The position cursor ``value`` holds, or None for any other cursor value."""
        if not value or not value.lstrip().startswith(b"{"):
            return None
        try:
            d = json.loads(value)
        except ValueError:
            return None
        if not isinstance(d, dict):
            return None
        pos = d.pop("nextEntryId", None)
        retain = d.pop("retain", False)
        if not isinstance(pos, int) or isinstance(pos, bool) or pos < 0 or not isinstance(retain, bool):
            return None
        return cls(pos, retain, d)


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
    #: how many merges its entries went through (0: as written; see ``merged``)
    level: int = 0
    #: CLOSED segments of records-v1 entries: (lowest, highest) append time of its entries, ms
    #: since the epoch, when its publisher knew it (docs/formats.md "Segment time range"); None:
    #: unknown (plain or rows-v1 entries, older publishers), readers then read the entries
    time_range: tuple[int, int] | None = None

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
            if self.level:
                d["level"] = self.level  # only on merged segments (older clients ignore it)
            if self.time_range is not None:
                d["appendTimeMs"] = list(self.time_range)  # only where known (older clients ignore it)
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
                   int(d.get("epoch", 0)), level=int(d.get("level", 0)), time_range=_time_range(d.get("appendTimeMs")))


def _time_range(raw: Any) -> tuple[int, int] | None:
    """A segment's ``appendTimeMs`` ``[lowest, highest]``; absent (older records) is None."""
    if raw is None:
        return None
    lo, hi = (int(x) for x in raw)
    if not 0 <= lo <= hi:
        raise ValueError(f"bad segment appendTimeMs {raw!r}: need 0 <= lowest <= highest")
    return lo, hi


def joined_time_range(segments: Sequence[Segment]) -> tuple[int, int] | None:
    """The time range of segments taken together: known only if every one's is."""
    ranges = [s.time_range for s in segments]
    if not ranges or any(r is None for r in ranges):
        return None
    return min(r[0] for r in ranges if r is not None), max(r[1] for r in ranges if r is not None)


@dataclass(frozen=True)
class NamedLedgerRecord:
    """What the metadata store keeps for one name (``names/<name>``), see the module docstring."""

    name: str
    digest_type: DigestType
    password: bytes = field(repr=False)  # never in a log line or error message
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

    def held_by(self, seg: Segment) -> bool:
        """True while the writer session of ``seg`` still owns the record: its epoch is the
        record's and ``seg`` is the open last segment (a fenced or closed session is not)."""
        last = self.segments[-1] if self.segments else None
        return (self.writer_epoch == seg.epoch and last is not None and last.ledger_id == seg.ledger_id
                and last.is_open)

    def check_password(self, password: bytes) -> None:
        if self.password != bytes(password):
            raise UnauthorizedAccessError(f"named ledger {self.name!r}: wrong password")

    def probe_metadata(self, seg: Segment) -> LedgerMetadata:
        """The metadata of OPEN segment ``seg``'s ledger as far as fencing and recovery need it,
        from the record alone (its quorums and every ensemble), without reading the ledger's."""
        return LedgerMetadata(
            ensemble_size=seg.ensemble_size, write_quorum_size=seg.write_quorum_size,
            ack_quorum_size=seg.ack_quorum_size,
            ensembles={k: tuple(BookieId(b) for b in v) for k, v in seg.ensembles.items()},
            digest_type=self.digest_type, password=self.password, state=LedgerState.OPEN,
        )

    def segment_ledger_metadata(
        self, quorum: tuple[int, int, int], ensemble: Sequence[str], epoch: int, *, ctime_ms: int, creator_token: int,
        extra: Mapping[str, bytes] | None = None,
    ) -> LedgerMetadata:
        """The OPEN metadata of a new segment's ledger: the name's digest and password, stamped
        with the name and the writer epoch (``CUSTOM_NAME_KEY``, ``CUSTOM_EPOCH_KEY``), plus the
        writer's ``extra`` custom metadata (its entry format)."""
        e, wq, aq = quorum
        return LedgerMetadata(
            ensemble_size=e, write_quorum_size=wq, ack_quorum_size=aq,
            ensembles={0: tuple(BookieId(b) for b in ensemble)},
            digest_type=self.digest_type, password=self.password, state=LedgerState.OPEN,
            custom_metadata={**(extra or {}), CUSTOM_NAME_KEY: self.name.encode(),
                             CUSTOM_EPOCH_KEY: str(epoch).encode()},
            ctime_ms=ctime_ms, creator_token=creator_token,
        )

    # -- transitions (each returns a new record; the caller CASes it)
    def replace(self, **changes: Any) -> NamedLedgerRecord:
        return dataclasses.replace(self, **changes)

    def sealed(self, recovered: RecoveredEnd | None) -> tuple[tuple[Segment, ...], int]:
        """The segments with the open one CLOSED at its ``recovered`` end (dropped if it holds no
        entry: an empty session leaves no segment behind), and the global id the next segment
        starts at. ``recovered`` is required exactly when there is an open segment."""
        segments = list(self.segments)
        fenced = self.open_segment
        if (fenced is None) != (recovered is None):
            raise ValueError(f"named ledger {self.name!r}: a recovered end is needed exactly for an open segment")
        if fenced is not None and recovered is not None:
            last, length = recovered
            segments[-1] = fenced.closed(last, length)
            if segments[-1].entry_count == 0:
                segments.pop()
        end = segments[-1].last_entry_id + 1 if segments and segments[-1].last_entry_id is not None else self.closed_end
        return tuple(segments), max(end, self.start_entry_id)

    def acquired(self, recovered: RecoveredEnd | None, new: Segment, writer: str) -> NamedLedgerRecord:
        """APPEND: the open segment sealed at its ``recovered`` end, ``new`` (an OPEN segment)
        appended after it, and the next writer epoch owned by ``writer``."""
        segments, first = self.sealed(recovered)
        epoch = self.writer_epoch + 1
        # A retried acquisition may see another first id or epoch: both live only in the record.
        seg = dataclasses.replace(new, first_entry_id=first, epoch=epoch)
        return self.replace(segments=(*segments, seg), writer_epoch=epoch, writer=writer)

    def with_open_ensembles(self, ensembles: Mapping[int, tuple[str, ...]]) -> NamedLedgerRecord:
        """The open last segment with the writer's new ``ensembles`` (an ensemble change)."""
        last = self.segments[-1]
        return self.replace(segments=(*self.segments[:-1], dataclasses.replace(last, ensembles=ensembles)))

    def with_writer_closed(self, closed: Segment) -> NamedLedgerRecord:
        """The open last segment replaced by its writer's ``closed`` one (dropped if empty)."""
        segments = list(self.segments[:-1])
        if closed.entry_count:
            segments.append(closed)
        return self.replace(segments=tuple(segments))

    def with_cursors(self, updates: Mapping[str, bytes | None]) -> NamedLedgerRecord:
        """Cursors set (``None``: removed); keys non-empty strings, values at most 64 KiB."""
        cursors = dict(self.cursors)
        for k, v in updates.items():
            if not isinstance(k, str) or not k:
                raise IncorrectParameterError(f"bad cursor key {k!r}")
            if v is None:
                cursors.pop(k, None)
            else:
                if len(v) > MAX_CURSOR_BYTES:
                    raise IncorrectParameterError(
                        f"cursor {k!r}: {len(v)} bytes (cursors are small markers, <= 64 KiB)")
                cursors[k] = bytes(v)
        return self.replace(cursors=cursors)

    def check_retaining_cursors(self, end_entry_id: int) -> None:
        """``IncorrectParameterError`` naming the first position cursor with ``retain`` set whose
        position is below ``end_entry_id`` (moving the start there would drop entries it has not
        read); cursors without ``retain`` hold nothing back."""
        for key, value in sorted(self.cursors.items()):
            pos = PositionCursor.decode(value)
            if pos is not None and pos.retain and pos.next_entry_id < end_entry_id:
                raise IncorrectParameterError(
                    f"named ledger {self.name!r}: cannot shrink to {end_entry_id}: cursor {key!r} retains "
                    f"the entries from {pos.next_entry_id} on (it has not read them yet). Shrink to at most "
                    f"{pos.next_entry_id}, or remove the cursor (or store it without retain) first"
                )

    def shrunk(
        self, end_entry_id: int, last_entry_id: int, *, force: bool
    ) -> tuple[NamedLedgerRecord, tuple[Segment, ...]]:
        """The start moved to ``end_entry_id`` and, with ``force``, the whole segments below it
        dropped; returns (record, dropped). The record is ``self`` when nothing changes (the
        same point again). Below the current start (backwards) or past ``last_entry_id + 1``:
        ``IncorrectParameterError``."""
        if end_entry_id < self.start_entry_id:
            raise IncorrectParameterError(
                f"named ledger {self.name!r}: cannot shrink to {end_entry_id}: its start is already "
                f"{self.start_entry_id} (a shrink never moves the start backwards; entries below it are gone)"
            )
        if end_entry_id > last_entry_id + 1:
            raise IncorrectParameterError(
                f"named ledger {self.name!r}: cannot shrink to {end_entry_id}: the last entry is {last_entry_id}"
            )
        if end_entry_id > self.start_entry_id:  # the same start again moves nothing
            self.check_retaining_cursors(end_entry_id)
        start = end_entry_id
        segments = list(self.segments)
        dropped: list[Segment] = []
        if force:
            while segments and segments[0].last_entry_id is not None and segments[0].last_entry_id < start:
                dropped.append(segments.pop(0))
        trimmed_to = max(self.trimmed_to, start) if force else self.trimmed_to
        if start == self.start_entry_id and not dropped and trimmed_to == self.trimmed_to:
            return self, ()
        return self.replace(start_entry_id=start, segments=tuple(segments), trimmed_to=trimmed_to), tuple(dropped)

    def published(
        self,
        recovered: RecoveredEnd | None,
        ledger_ids: Sequence[int],
        mds: Sequence[LedgerMetadata],
        cursor_updates: Mapping[str, bytes | None],
        *,
        overwrite: bool,
        time_ranges: Mapping[int, tuple[int, int]] | None = None,
    ) -> tuple[NamedLedgerRecord, tuple[Segment, ...]]:
        """``publish_segments`` / ``overwrite``: the open segment sealed at its ``recovered`` end
        (its writer epoch ends), the CLOSED ledgers appended as segments after the last entry
        (``overwrite``: replacing every segment, the start moved there) and the cursors updated.
        Returns (record, replaced segments)."""
        check_published(self, ledger_ids, mds)
        segments, end = self.sealed(recovered)
        # the writer session is over: its ensemble changes and close must fail
        epoch = self.writer_epoch + 1 if recovered is not None else self.writer_epoch
        start = self.start_entry_id
        replaced: tuple[Segment, ...] = ()
        if overwrite:
            replaced, segments, start = segments, (), end
        updated = self.with_cursors(cursor_updates).replace(
            segments=append_segments(segments, end, ledger_ids, mds, epoch, time_ranges), writer_epoch=epoch,
            start_entry_id=start, trimmed_to=max(self.trimmed_to, start) if overwrite else self.trimmed_to,
        )
        return updated, replaced

    def merge_windows(self, factor: int, max_bytes: int) -> list[tuple[Segment, ...]]:
        """Runs of ``factor`` consecutive CLOSED segments of one merge level that may be merged
        into one segment (``merged``), newest first: together at most ``max_bytes``, and all at
        or after the start (entries below it may be trimmed on the bookies: never copied).

        Merging ``factor`` segments of level L into one of level L+1 works like a counter in base
        ``factor``: a name that gains one segment per micro-batch keeps fewer than ``factor``
        segments per level, about ``factor * log_factor(segments written)`` in all, and each
        entry is copied once per level it climbs (segments above ``max_bytes`` stop climbing).
        """
        if factor < 2:
            return []
        closed = [s for s in self.segments if not s.is_open and s.first_entry_id >= self.start_entry_id]
        out: list[tuple[Segment, ...]] = []
        for i in range(len(closed) - factor, -1, -1):
            window = tuple(closed[i:i + factor])
            level = window[0].level
            if any(s.level != level for s in window):
                continue
            if sum(s.length for s in window) <= max_bytes:
                out.append(window)
        return out

    def merged(self, ledger_ids: Sequence[int], md_ledger_id: int, md: LedgerMetadata) -> NamedLedgerRecord:
        """The consecutive CLOSED segments ``ledger_ids`` replaced by one segment on ledger
        ``md_ledger_id`` (CLOSED, the name's digest and password) holding a copy of their
        entries: the same global ids (its entry 0 is the first segment's first entry), the same
        number of entries and payload bytes, one level above the highest merged."""
        ids = list(ledger_ids)
        if len(ids) < 2 or len(set(ids)) != len(ids):
            raise IncorrectParameterError(f"named ledger {self.name!r}: a merge needs two or more distinct "
                                          f"segments, got {ids}")
        at = next((i for i, s in enumerate(self.segments) if s.ledger_id == ids[0]), None)
        run = self.segments[at:at + len(ids)] if at is not None else ()
        if [s.ledger_id for s in run] != ids or any(s.is_open for s in run):
            raise IncorrectParameterError(f"named ledger {self.name!r}: ledgers {ids} are not consecutive "
                                          "closed segments of it (any more)")
        if any(s.ledger_id == md_ledger_id for s in self.segments):
            raise IncorrectParameterError(f"ledger {md_ledger_id} is already a segment of {self.name!r}")
        if not md.is_closed or md.password != self.password or md.digest_type != self.digest_type:
            raise IncorrectParameterError(f"ledger {md_ledger_id}: a merged segment must be CLOSED, with the "
                                          f"digest type and password of named ledger {self.name!r}")
        entries = sum(s.entry_count or 0 for s in run)
        length = sum(s.length for s in run)
        if md.last_entry_id + 1 != entries or md.length != length:
            raise IncorrectParameterError(
                f"ledger {md_ledger_id} holds {md.last_entry_id + 1} entries ({md.length} bytes), the segments "
                f"{ids} of {self.name!r} {entries} ({length} bytes): not a copy of them")
        first, last = run[0].first_entry_id, run[-1].last_entry_id
        seg = Segment(md_ledger_id, first, last, length, max(s.epoch for s in run),
                      level=max(s.level for s in run) + 1, time_range=joined_time_range(run))
        assert at is not None
        return self.replace(segments=(*self.segments[:at], seg, *self.segments[at + len(ids):]))

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


def first_published(
    name: str, ledger_ids: Sequence[int], mds: Sequence[LedgerMetadata],
    cursor_updates: Mapping[str, bytes | None], *, ctime_ms: int,
    time_ranges: Mapping[int, tuple[int, int]] | None = None,
) -> NamedLedgerRecord:
    """The record of a name created by publishing CLOSED ledgers: digest, password and quorum
    sizes come from the first ledger; no writer session (epoch 0)."""
    if not mds:
        raise IncorrectParameterError("creating a name by publishing needs at least one ledger")
    first = mds[0]
    rec = NamedLedgerRecord(
        name=name, digest_type=first.digest_type, password=first.password,
        ensemble_size=first.ensemble_size, write_quorum_size=first.write_quorum_size,
        ack_quorum_size=first.ack_quorum_size, writer_epoch=0, ctime_ms=ctime_ms,
    )
    check_published(rec, ledger_ids, mds)
    return rec.replace(segments=append_segments((), 0, ledger_ids, mds, 0, time_ranges),
                       cursors=rec.with_cursors(cursor_updates).cursors)


def check_published(rec: NamedLedgerRecord, ledger_ids: Sequence[int], mds: Sequence[LedgerMetadata]) -> None:
    """Ledgers to publish are distinct, not segments yet, with the name's digest and password."""
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


def append_segments(
    segments: tuple[Segment, ...], first: int, ledger_ids: Sequence[int], mds: Sequence[LedgerMetadata], epoch: int,
    time_ranges: Mapping[int, tuple[int, int]] | None = None,
) -> tuple[Segment, ...]:
    """``segments`` + one CLOSED segment per non-empty ledger, numbered on from global id ``first``
    (with its append-time range where ``time_ranges`` gives one for its ledger id)."""
    out = list(segments)
    for lid, md in zip(ledger_ids, mds):
        if md.last_entry_id < 0:
            continue  # an empty ledger adds nothing
        rng = (time_ranges or {}).get(int(lid))
        if rng is not None and not 0 <= rng[0] <= rng[1]:
            raise IncorrectParameterError(f"ledger {lid}: bad append-time range {rng} (need 0 <= lowest <= highest)")
        out.append(Segment(int(lid), first, first + md.last_entry_id, md.length, epoch,
                           time_range=None if rng is None else (int(rng[0]), int(rng[1]))))
        first += md.last_entry_id + 1
    return tuple(out)


def resolve_quorum(quorum: Quorum, defaults: tuple[int, int, int]) -> tuple[int, int, int]:
    """The given quorum sizes, ``defaults`` for those not given; ``E >= WQ >= AQ >= 1``."""
    e, wq, aq = (d if q is None else q for q, d in zip(quorum, defaults))
    if not e >= wq >= aq >= 1:
        raise IncorrectParameterError(
            f"need ensembleSize >= writeQuorumSize >= ackQuorumSize >= 1, got {e} >= {wq} >= {aq}"
        )
    return e, wq, aq


# ============================================================================ serialization


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


# ============================================================================ values the API returns


@dataclass(frozen=True, slots=True)
class NamedLedgerEntry:
    """One entry of a named ledger: its global ``entry_id`` and where it lives."""

    entry_id: int
    payload: bytes
    ledger_id: int
    ledger_entry_id: int


@dataclass(frozen=True)
class BookieCollection:
    """One bookie's garbage collection for a forced shrink (wire op COLLECT), for one ledger:
    ``end_entry_id`` is the ledger-local trim point (0: a dropped segment's ledger, collected
    whole); ``held`` False when the bookie did not hold the ledger (nothing to collect there);
    ``reclaimed_bytes`` what the bookie's GC pass freed in the ledger's dir(s) and
    ``garbage_bytes`` the dead bytes it left there; ``error`` is set when the bookie could not
    collect (down, timed out, refused): its space comes back at its next GC pass instead."""

    bookie: str
    ledger_id: int
    end_entry_id: int
    held: bool = True
    reclaimed_bytes: int = 0
    garbage_bytes: int = 0
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error


@dataclass(frozen=True)
class ShrinkResult:
    """What a shrink did: the new start, the ledgers of the whole segments it dropped (force),
    and, with force, every bookie's collection, all finished (or failed) when this is returned."""

    start_entry_id: int
    dropped_ledgers: tuple[int, ...] = ()
    collections: tuple[BookieCollection, ...] = ()

    @property
    def collected(self) -> bool:
        """Every bookie asked to collect did (vacuously true without force)."""
        return all(c.ok for c in self.collections)

    @property
    def reclaimed_bytes(self) -> int:
        """At least this many bytes were freed: per bookie its largest pass (the collections of
        several ledgers on one bookie usually share a pass and each reports it; counting the
        largest once never counts a shared pass twice)."""
        seen: dict[str, int] = {}
        for c in self.collections:
            seen[c.bookie] = max(seen.get(c.bookie, 0), c.reclaimed_bytes)
        return sum(seen.values())


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
