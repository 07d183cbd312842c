"""Keeping a long-running streaming sink bounded: merging its small segments, retiring what it
leaves behind.

Responsibility: after a micro-batch's publish (driver side), copy the entries of
``segmentMergeFactor`` closed segments of one merge level into one new ledger and swap them in
by one CAS (:meth:`NamedLedgers.merge_segments`); delete the replaced ledgers, and the job
markers of old micro-batches (``spark/finished/<job>``), once older than
``segmentRetireDelay``. So a query that publishes a segment per task per micro-batch keeps
about ``factor * log_factor(batches)`` segments (docs/spark.md "A sink that runs for a year").

Invariants:
- the copy is entry for entry: the same payload bytes in the same order, so a reader by global
  entry id sees the same entries before and after the swap (its entry 0 is the first replaced
  segment's first entry); ``merge_segments`` checks the count and the bytes; only segments of
  one entry format (packed or plain, ``vellum.entryFormat``) are merged together;
- exactly once is untouched: a merge changes no entry, no cursor and no segment that is not
  closed, and it runs only after the batch's own publish;
- crash-safe through the staging registrations (``writer.py``): the copy's ledger is registered
  (job ``m-<id>``) before its first entry and unregistered after the CAS; the replaced ledgers
  are registered (job ``r-<id>``, with their time) *before* the CAS. A crash leaves either the
  old segments (the copy unreferenced: deleted by the next retirement or ``staging-gc``) or
  the new one (the replaced ledgers unreferenced and registered: deleted later), never a loss:
  a ledger some name references is never deleted (``cleanup_staging``);
- replaced ledgers stay readable for ``segmentRetireDelay``: a reader may have planned a read
  of them before the swap;
- a failure never fails the micro-batch (it is committed already): logged, tried again later.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import logging
import time
import uuid
from dataclasses import dataclass

from vellum.client.blocking import BookKeeper
from vellum.client.ledger import LedgerHandle as AsyncLedgerHandle
from vellum.client.named import CUSTOM_NAME_KEY, NamedLedgers, Segment
from vellum.format.records import ENTRY_FORMAT_KEY
from vellum.spark.options import WriteOptions
from vellum.spark.writer import (
    STAGING_PREFIX,
    TAG_JOB,
    cleanup_staging,
    sweep_finished_markers,
)

log = logging.getLogger(__name__)

#: job prefixes of the registrations made here (the copy; the replaced ledgers)
MERGE_JOB = "m-"
RETIRED_JOB = "r-"
#: entries fetched per read while copying, and appends kept in flight
_READ_CHUNK = 256
_WINDOW = 256
#: entries per ``append_batch_async`` call while copying (a quarter of the window)
_SLICE = _WINDOW // 4
_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class MergeResult:
    replaced: tuple[int, ...]  # ledger ids of the segments swapped out
    ledger_id: int  # the copy holding their entries
    level: int


def _register(bk: BookKeeper, job: str, index: int, ledger_id: int) -> str:
    key = f"{STAGING_PREFIX}{job}/0.{index}.{ledger_id}"
    bk.aio.store.kv.create(key, json.dumps({"ledgerId": ledger_id, "ctimeMs": int(time.time() * 1000)}).encode())
    return key


def _drop(bk: BookKeeper, keys: list[str]) -> None:
    for key in keys:
        bk.aio.store.kv.delete(key)


async def _copy(bk: BookKeeper, window: tuple[Segment, ...], password: bytes, target: AsyncLedgerHandle) -> None:
    """Append every entry of the window's ledgers to ``target``, in order, at most ``_WINDOW``
    in flight: in ``append_batch_async`` slices of ``_SLICE`` entries (one future per slice,
    not one per entry; the oldest slice is awaited before the window would overflow)."""
    pending: collections.deque[tuple[asyncio.Future[int], int]] = collections.deque()
    in_flight = 0
    try:
        for seg in window:
            count = seg.entry_count or 0
            src = await bk.aio.open_ledger(seg.ledger_id, password=password, recovery=False)
            for lo in range(0, count, _READ_CHUNK):
                payloads = [e.payload for e in await src.read(lo, min(count, lo + _READ_CHUNK) - 1)]
                for start in range(0, len(payloads), _SLICE):
                    part = payloads[start:start + _SLICE]
                    while pending and in_flight + len(part) > _WINDOW:
                        fut, n = pending.popleft()
                        in_flight -= n
                        await fut
                    pending.append((target.append_batch_async(part), len(part)))
                    in_flight += len(part)
        while pending:
            await pending.popleft()[0]
    finally:
        for f, _n in pending:
            if f.done() and not f.cancelled():
                f.exception()


def merge_once(bk: BookKeeper, opts: WriteOptions) -> MergeResult | None:
    """Merge the newest mergeable window of ``opts.name``'s segments, if any (see the module
    docstring); None when there is nothing to merge. Raises on failure (the caller logs)."""
    named = NamedLedgers(bk.aio)
    rec = bk.run(named.record(opts.name), timeout_s=_TIMEOUT_S).value
    chosen: tuple[Segment, ...] | None = None
    fmt: bytes | None = None
    for window in rec.merge_windows(opts.segment_merge_factor, opts.segment_merge_max_bytes):
        formats = {bk.ledger_metadata(s.ledger_id).custom_metadata.get(ENTRY_FORMAT_KEY) for s in window}
        if len(formats) == 1:
            chosen, fmt = window, formats.pop()
            break
    if chosen is None:
        return None
    job = _job(MERGE_JOB, rec.name)
    custom = {CUSTOM_NAME_KEY: rec.name.encode(), TAG_JOB: job.encode()}
    if fmt is not None:
        custom[ENTRY_FORMAT_KEY] = fmt
    target = bk.create_ledger(ensemble_size=rec.ensemble_size, write_quorum_size=rec.write_quorum_size,
                              ack_quorum_size=rec.ack_quorum_size, digest_type=rec.digest_type.name,
                              password=rec.password, custom_metadata=custom)
    keys = [_register(bk, job, 0, target.ledger_id)]
    retired_job = _job(RETIRED_JOB, rec.name)
    retired: list[str] = []
    try:
        bk.run(_copy(bk, chosen, rec.password, target.aio), timeout_s=_TIMEOUT_S)
        target.close()
        retired = [_register(bk, retired_job, i, s.ledger_id) for i, s in enumerate(chosen)]
        bk.run(named.merge_segments(rec.name, [s.ledger_id for s in chosen], target.ledger_id),
               timeout_s=_TIMEOUT_S)
    except BaseException:
        # Not swapped in: the copy goes, the replaced ledgers stay segments (their registrations
        # are dropped; a ledger a name references is never deleted anyway).
        try:
            bk.delete_ledger(target.ledger_id)
            _drop(bk, keys + retired)
        except Exception as exc:
            log.warning("vellum sink %s: cleaning up merge job %s failed (%s); `vellum spark staging-gc` "
                        "removes what is left", opts.name, job, exc)
        raise
    _drop(bk, keys)  # the copy is a segment now
    return MergeResult(tuple(s.ledger_id for s in chosen), target.ledger_id, max(s.level for s in chosen) + 1)


def _name_tag(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()[:12]


def _job(prefix: str, name: str) -> str:
    """A job name carrying its creation time and its name's tag: retiring lists keys only (reads
    no values), and a sink retires only its own name's jobs, on its own delay."""
    return f"{prefix}{int(time.time() * 1000)}-{_name_tag(name)}-{uuid.uuid4().hex[:12]}"


def _job_time_ms(job: str, name: str) -> int | None:
    """When a merge or retirement job of ``name`` was created; None for any other job."""
    if not job.startswith((RETIRED_JOB, MERGE_JOB)):
        return None
    parts = job[2:].split("-")
    if len(parts) != 3 or parts[1] != _name_tag(name) or not parts[0].isdigit():
        return None
    return int(parts[0])


_last_sweep = {"at": 0.0}


def retire(bk: BookKeeper, name: str, delay_ms: float) -> int:
    """Delete the ledgers of ``name``'s replaced segments (and of its merges that never swapped
    in) registered more than ``delay_ms`` ago that no name references; at most every tenth of the delay, the
    finished markers as old. Returns how many ledgers were deleted. Lists the registrations'
    keys; reads values only of what is due."""
    now_ms = time.time() * 1000
    jobs = {key[len(STAGING_PREFIX):].split("/", 1)[0] for key in bk.aio.store.kv.list(STAGING_PREFIX)}
    deleted = 0
    for job in sorted(jobs):
        born = _job_time_ms(job, name)
        if born is not None and now_ms - born >= delay_ms:
            deleted += cleanup_staging(bk, job, set()).deleted
    if now_ms - _last_sweep["at"] >= max(1000.0, delay_ms / 10):
        _last_sweep["at"] = now_ms
        sweep_finished_markers(bk, delay_ms)
    return deleted


def keep_bounded(bk: BookKeeper, opts: WriteOptions) -> list[MergeResult]:
    """After a published micro-batch: merge while a window is due (usually at most one per
    level), then retire what is old enough. Never raises: the batch is committed already."""
    done: list[MergeResult] = []
    try:
        for _ in range(16):  # a counter carries over a few levels at most per batch
            if opts.segment_merge_factor < 2:
                break
            got = merge_once(bk, opts)
            if got is None:
                break
            done.append(got)
            log.info("vellum sink %s: merged segments %s into ledger %d (level %d)", opts.name,
                     list(got.replaced), got.ledger_id, got.level)
        retire(bk, opts.name, opts.segment_retire_delay_ms)
    except Exception as exc:
        log.warning("vellum sink %s: keeping its segments bounded failed (%s: %s); tried again after the "
                    "next micro-batch", opts.name, type(exc).__name__, exc)
    return done
