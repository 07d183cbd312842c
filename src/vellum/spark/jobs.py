"""Offline analyses of bookie storage on Spark: the GC report and the replica check.

Responsibility:
- ``gc_report``: for every bookie and every entry log, total and live bytes (live = the ledger
  still exists in the metadata store and the bytes are of entries not shrunk away), usage, age
  and the ledgers that pin the log ("why is this months-old entry log still on disk?"). Sources:
  a directory of copied bookie data (scanned here, read-only) or running bookies through their
  admin HTTP API (``GET /api/v1/bookie/entrylogs``).
- ``replica_check``: for each ledger, whether every bookie of every ensemble segment holds the
  entries the write-set striping gives it (wire op LIST_ENTRIES), optionally comparing the stored
  bytes of each entry across its replicas; under-replicated and divergent ledgers are listed.
  A bookie the checker cannot ask (down, refused the connection, TLS or authentication failed,
  timed out, or its copy of the ledger is in doubt) is reported *unreachable* with its error,
  never as missing data: only a bookie that answers "I do not hold this ledger/these entries"
  makes copies missing.

Client settings: every job takes ``client_config`` (a ``ClientConfig``: TLS, token, ZooKeeper
identity; ``vellum spark --client-conf``), used on the driver and shipped to the tasks.

Invariants:
- read-only: entry logs are opened ``O_RDONLY`` and scanned with the pure format scanner (no
  ``EntryLogger``, which would write ``lastId``); nothing is written to bookies or metadata;
- the per-file / per-ledger work runs in Spark tasks (RDD ``mapPartitions``: ``mapInArrow``
  would need pandas) over a task list built on
  the driver; Python sources cannot pin tasks to hosts, so each task reads what it is given
  (a path on a filesystem the executors share, or a bookie's network API), never a remote
  host's local path;
- liveness is decided once, on the driver, from one listing of the metadata store, and shipped
  to the tasks, so every log is judged against the same snapshot.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vellum.config import ClientConfig
from vellum.errors import NoSuchLedgerError, ReadError
from vellum.format import entrylog as fmt
from vellum.security.admin_http_client import AdminHttpAccess
from vellum.storage.entry_logger import parse_log_file_name

# ============================================================================ gc-report


@dataclass(frozen=True)
class Liveness:
    """A metadata snapshot: existing ledgers, and per ledger the first entry id not shrunk away."""

    ledgers: frozenset[int]
    first_live_entry: dict[int, int] = field(default_factory=dict)


def _driver_client(metadata_uri: str, client_config: ClientConfig | None) -> Any:
    """A blocking client of the driver, with the job's client settings."""
    from vellum.client.blocking import BookKeeper

    return BookKeeper(metadata_uri, config=client_config)


def _task_config(metadata_uri: str, client_config: ClientConfig | None) -> ClientConfig:
    """The settings shipped to the tasks: the job's, with its metadata URI."""
    return dataclasses.replace(client_config or ClientConfig(), metadata_service_uri=metadata_uri)


def liveness_snapshot(metadata_uri: str, client_config: ClientConfig | None = None) -> Liveness:
    """Existing ledger ids, plus shrink points of named-ledger segments (driver side)."""
    from vellum.spark.names import NameReader

    with _driver_client(metadata_uri, client_config) as bk:
        ledgers = frozenset(bk.list_ledgers())
        shrunk: dict[int, int] = {}
        reader = NameReader(bk)
        for name in reader.list_names():
            got = reader.record(name)
            if got is None:
                continue
            rec = got.value
            for seg in rec.segments:
                if seg.first_entry_id < rec.start_entry_id:
                    # local ids below this are shrunk away (never readable again)
                    shrunk[seg.ledger_id] = rec.start_entry_id - seg.first_entry_id
    return Liveness(ledgers, shrunk)


def find_ledger_dirs(roots: Iterable[str | Path]) -> list[tuple[str, Path]]:
    """``(bookie label, current dir)`` of every ledger dir under ``roots`` holding entry logs.

    The label is the ledger dir's path relative to its root (e.g. ``bookie-0/ledgers``), so copies
    of several bookies under one directory stay apart.
    """
    out: list[tuple[str, Path]] = []
    for root in roots:
        root = Path(root).resolve()
        if not root.exists():
            raise FileNotFoundError(f"{root}: no such directory")
        for current in sorted({p.parent for p in root.rglob("*.log") if p.parent.name == "current"}):
            if any(parse_log_file_name(p.name) is not None for p in current.iterdir()):
                rel = current.parent.relative_to(root)
                label = root.name if str(rel) == "." else str(rel)
                out.append((label, current))
    return out


def scan_log(bookie: str, path: Path, live: Liveness) -> list[dict[str, Any]]:
    """Per ledger of one entry log: bytes and live bytes (read-only)."""
    st = path.stat()
    log_id = parse_log_file_name(path.name)
    assert log_id is not None
    fd = os.open(path, os.O_RDONLY)
    try:
        def read(off: int, n: int) -> bytes:
            return os.pread(fd, n, off)

        size = st.st_size
        sizes = fmt.read_ledgers_map(read, size, where=str(path))
        source = "map"
        partial = sizes is not None and any(lid in live.first_live_entry for lid in sizes)
        live_sizes: dict[int, int] = {}
        if sizes is None or partial:
            # No map (active or unsealed log), or a ledger shrunk from the front: scan the records.
            source = "scan"
            sizes = {}
            for rec in fmt.EntryLogScanner(read, end=size, where=str(path)):
                n = fmt.SIZE_FIELD + rec.size
                sizes[rec.ledger_id] = sizes.get(rec.ledger_id, 0) + n
                if rec.ledger_id in live.ledgers and rec.entry_id >= live.first_live_entry.get(rec.ledger_id, 0):
                    live_sizes[rec.ledger_id] = live_sizes.get(rec.ledger_id, 0) + n
        else:
            live_sizes = {lid: n for lid, n in sizes.items() if lid in live.ledgers}
    finally:
        os.close(fd)
    rows = [dict(bookie=bookie, logId=log_id, file=str(path), fileBytes=size, mtime=st.st_mtime,
                 ledgerId=lid, bytes=n, liveBytes=live_sizes.get(lid, 0), source=source)
            for lid, n in sorted(sizes.items())]
    if not rows:  # an empty log still occupies its file
        rows.append(dict(bookie=bookie, logId=log_id, file=str(path), fileBytes=size, mtime=st.st_mtime,
                         ledgerId=-1, bytes=0, liveBytes=0, source=source))
    return rows


def _scan_logs_task(live: Liveness, tasks: Iterable[tuple[str, str]]) -> Iterator[dict[str, Any]]:
    for bookie, file in tasks:
        try:
            yield from scan_log(bookie, Path(file), live)
        except FileNotFoundError:
            continue  # deleted by GC while the job ran: not on disk any more


def _http_rows(http_urls: list[str], live: Liveness, access: AdminHttpAccess) -> list[dict[str, Any]]:
    """Rows of the running bookies' ``/api/v1/bookie/entrylogs`` (the logs as of each dir's
    last GC pass, with bytes per ledger). Liveness comes from the metadata snapshot, as for
    copied data; a ledger shrunk from the front counts whole (the bookie does not say which of
    its entries a log holds)."""
    rows: list[dict[str, Any]] = []
    for url in http_urls:
        for log in access.call(url, "/api/v1/bookie/entrylogs"):
            log_id = int(str(log["logId"]), 16)
            total = int(log.get("size", log.get("totalBytes", 0)))
            mtime = log.get("mtime")
            base = dict(bookie=f"{url} {log.get('ledgerDir', '')}".strip(), logId=log_id,
                        file=f"{log.get('ledgerDir', '')}/current/{log_id:x}.log", fileBytes=total,
                        mtime=float("nan") if mtime is None else float(mtime), source="http")
            per_ledger = {int(k): int(v) for k, v in (log.get("ledgerBytes") or {}).items()}
            for lid, n in sorted(per_ledger.items()):
                rows.append(dict(base, ledgerId=lid, bytes=n, liveBytes=n if lid in live.ledgers else 0))
            if not per_ledger:
                rows.append(dict(base, ledgerId=-1, bytes=0, liveBytes=0))
    return rows


def discover_http_urls(metadata_uri: str, client_config: ClientConfig | None = None) -> dict[str, str]:
    """``{bookie id: admin HTTP base URL}`` of the registered bookies (writable and read-only)
    that published one (``httpAddress`` in their registration data)."""
    with _driver_client(metadata_uri, client_config) as bk:
        reg = bk.aio.store.registration
        out: dict[str, str] = {}
        for bookie in sorted(reg.list_bookies() | reg.list_bookies(read_only=True)):
            raw = reg.get_bookie_data(bookie)
            try:
                url = json.loads(raw.decode()).get("httpAddress") if raw else None
            except (ValueError, UnicodeDecodeError, AttributeError):
                url = None
            if url:
                out[bookie] = str(url)
        return out


def gc_report(
    spark: Any,
    *,
    metadata_uri: str,
    dirs: list[str] | None = None,
    http_urls: list[str] | None = None,
    access: AdminHttpAccess | None = None,
    now: float | None = None,
    client_config: ClientConfig | None = None,
) -> list[dict[str, Any]]:
    """One row per (bookie, entry log), oldest first; see the module docstring. ``access``:
    the token and CA for bookies whose admin API is secured."""
    live = liveness_snapshot(metadata_uri, client_config)
    rows: list[dict[str, Any]] = []
    if dirs:
        tasks = [(label, str(p)) for label, cur in find_ledger_dirs(dirs)
                 for p in sorted(cur.iterdir()) if parse_log_file_name(p.name) is not None]
        if tasks:
            # Plain RDD tasks: mapInArrow would need pandas, which the [spark] extra leaves out.
            rdd = spark.sparkContext.parallelize(tasks, _slices(spark, len(tasks)))
            rows.extend(rdd.mapPartitions(functools.partial(_scan_logs_task, live)).collect())
    if http_urls:
        rows.extend(_http_rows(http_urls, live, access or AdminHttpAccess()))
    return summarize_logs(rows, live, time.time() if now is None else now)


def summarize_logs(rows: list[dict[str, Any]], live: Liveness, now: float) -> list[dict[str, Any]]:
    by_log: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in rows:
        by_log.setdefault((r["bookie"], r["logId"]), []).append(r)
    out: list[dict[str, Any]] = []
    for (bookie, log_id), rs in by_log.items():
        first = rs[0]
        ledgers = sorted(r["ledgerId"] for r in rs if r["ledgerId"] >= 0)
        pinned = [r["ledgerId"] for r in sorted(rs, key=lambda r: -r["liveBytes"])
                  if r["ledgerId"] >= 0 and r["ledgerId"] in live.ledgers]
        live_bytes = sum(r["liveBytes"] for r in rs)
        total = int(first["fileBytes"])
        data_bytes = sum(r["bytes"] for r in rs) or total
        mtime = first["mtime"]
        age_s = None if mtime != mtime else round(now - mtime, 1)  # NaN: unknown over HTTP
        shrunk = [lid for lid in pinned if lid in live.first_live_entry]
        out.append({
            "bookie": bookie, "logId": f"{log_id:x}", "file": first["file"], "totalBytes": total,
            "liveBytes": live_bytes, "usage": round(live_bytes / data_bytes, 4) if data_bytes else 0.0,
            "ageSeconds": age_s, "ledgers": len(ledgers), "deadLedgers": len(ledgers) - len(pinned),
            "pinnedBy": pinned, "partlyShrunk": shrunk, "source": first["source"],
        })
    out.sort(key=lambda r: (-(r["ageSeconds"] or 0), r["bookie"], r["logId"]))
    return out


# ============================================================================ replica-check

def _expected_in(a: int, b: int, index: int, e: int, wq: int) -> int:
    """How many entry ids in ``[a, b]`` have ensemble index ``index`` in their write set."""
    if b < a:
        return 0
    count = 0
    for r in range(e):
        if (index - r) % e < wq:  # entries with id % E == r are striped onto index
            first = a + ((r - a) % e)
            if first <= b:
                count += (b - first) // e + 1
    return count


def _intersect(ranges: Iterable[tuple[int, int]], a: int, b: int) -> list[tuple[int, int]]:
    return [(max(a, x), min(b, y)) for x, y in ranges if max(a, x) <= min(b, y)]


def _first_missing(ranges: list[tuple[int, int]], a: int, b: int, index: int, e: int, wq: int,
                   limit: int = 5) -> list[int]:
    out: list[int] = []
    held = sorted(ranges)
    eid = a
    while eid <= b and len(out) < limit:
        if (index - eid) % e < wq and not any(x <= eid <= y for x, y in held):
            out.append(eid)
        eid += 1
        if eid - a > 100_000:  # listing examples only: bounded work
            break
    return out


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def check_ledger(bk: Any, ledger_id: int, *, digests: bool = False) -> list[dict[str, Any]]:
    """Rows for one ledger: one per (segment, bookie). ``reachable`` False (with ``error``) when
    the bookie could not be asked: then nothing is known about its copies (``missing`` 0)."""
    from vellum.client.ledger import write_set

    try:
        md = bk.ledger_metadata(ledger_id)
    except NoSuchLedgerError:
        return []
    firsts = sorted(md.ensembles)
    if md.is_closed:
        last = md.last_entry_id
    else:
        try:
            last = bk.open_ledger(ledger_id, password=md.password, recovery=False).last_add_confirmed
        except Exception as exc:  # no bookie of the last ensemble told its LAC: nothing to compare
            error = f"cannot read the ledger's LAC: {_error_text(exc)}"
            return [dict(ledgerId=ledger_id, segmentFirst=firsts[-1], segmentLast=-1, bookie=str(b), expected=0,
                         present=0, missing=0, extra=0, digestMismatches=0, firstMissing="", reachable=False,
                         error=error) for b in md.ensembles[firsts[-1]]]
    bc = bk.aio.bookie_client
    e, wq = md.ensemble_size, md.write_quorum_size

    def call(coro: Any) -> Any:
        return bk.run(coro, timeout_s=60)

    rows: list[dict[str, Any]] = []
    held: dict[str, tuple[tuple[int, int], ...] | None] = {}
    errors: dict[str, str] = {}
    for bookie in sorted({str(b) for ens in md.ensembles.values() for b in ens}):
        try:
            held[bookie] = call(bc.list_entries(bookie, ledger_id))
        except NoSuchLedgerError:
            held[bookie] = ()  # the bookie answered: it holds nothing of this ledger
        except Exception as exc:
            # Down, refused (TLS, authentication), timed out, or unsure of its own copy
            # (EUNKNOWNLEDGERSTATE): we cannot tell what it holds, so it is unreachable,
            # never "missing".
            held[bookie] = None
            errors[bookie] = _error_text(exc)
    for i, first in enumerate(firsts):
        seg_last = min(last, firsts[i + 1] - 1) if i + 1 < len(firsts) else last
        mismatches: dict[int, int] = {}
        if digests and seg_last >= first:
            mismatches = _digest_mismatches(bk, md, ledger_id, first, seg_last, call, write_set,
                                            skip=frozenset(errors))
        for index, bookie in enumerate(md.ensembles[first]):
            bookie = str(bookie)
            expected = _expected_in(first, seg_last, index, e, wq)
            ranges = held.get(bookie)
            if ranges is None:
                rows.append(dict(ledgerId=ledger_id, segmentFirst=first, segmentLast=seg_last, bookie=bookie,
                                 expected=expected, present=0, missing=0, extra=0, digestMismatches=0,
                                 firstMissing="", reachable=False, error=errors.get(bookie, "unreachable")))
                continue
            inside = _intersect(ranges, first, seg_last)
            present = sum(y - x + 1 for x, y in inside)
            have = sum(_expected_in(x, y, index, e, wq) for x, y in inside)
            missing = expected - have
            rows.append(dict(
                ledgerId=ledger_id, segmentFirst=first, segmentLast=seg_last, bookie=bookie,
                expected=expected, present=present, missing=missing, extra=present - have,
                digestMismatches=mismatches.get(index, 0),
                firstMissing=",".join(map(str, _first_missing(inside, first, seg_last, index, e, wq)))
                if missing else "",
                reachable=True,
                error="",
            ))
    return rows


def _digest_mismatches(bk: Any, md: Any, ledger_id: int, first: int, last: int, call: Any,
                       write_set: Any, *, skip: frozenset[str] = frozenset()) -> dict[int, int]:
    """Per ensemble index: entries whose stored bytes differ from the majority of their replicas,
    or that their bookie refuses with an I/O error (its own digest check found the copy corrupt).
    Bookies in ``skip`` (unreachable) are not asked."""
    bc = bk.aio.bookie_client
    ensemble = md.ensembles[first]
    out: dict[int, int] = {}
    for eid in range(first, last + 1):
        copies: dict[int, bytes] = {}
        for idx in write_set(eid, md.ensemble_size, md.write_quorum_size):
            if str(ensemble[idx]) in skip:
                continue
            try:
                copies[idx] = bytes(call(bc.read(ensemble[idx], ledger_id, eid)))
            except ReadError:
                # EIO: the bookie holds the entry (LIST_ENTRIES counts it present) but its copy
                # is unreadable or failed the bookie's digest check: a bad copy to replace.
                out[idx] = out.get(idx, 0) + 1
            except Exception:
                continue  # missing copies are counted by LIST_ENTRIES already
        if len(set(copies.values())) > 1:
            values = list(copies.values())
            majority = max(set(values), key=values.count)
            for idx, v in copies.items():
                if v != majority:
                    out[idx] = out.get(idx, 0) + 1
    return out


def _check_ledgers_task(config: ClientConfig, digests: bool, ledger_ids: Iterable[int]) -> Iterator[dict[str, Any]]:
    from vellum.spark.connection import shared_client_for

    bk = shared_client_for(config)
    for lid in ledger_ids:
        yield from check_ledger(bk, int(lid), digests=digests)


def _slices(spark: Any, n: int) -> int:
    return max(1, min(n, 2 * int(spark.sparkContext.defaultParallelism)))


def replica_check(
    spark: Any, *, metadata_uri: str, ledger_ids: list[int] | None = None, digests: bool = False,
    client_config: ClientConfig | None = None,
) -> list[dict[str, Any]]:
    """One row per (ledger, segment, bookie); see ``summarize_replicas`` for the verdicts."""
    if ledger_ids is None:
        with _driver_client(metadata_uri, client_config) as bk:
            ledger_ids = bk.list_ledgers()
    if not ledger_ids:
        return []
    rdd = spark.sparkContext.parallelize(ledger_ids, _slices(spark, len(ledger_ids)))
    task = functools.partial(_check_ledgers_task, _task_config(metadata_uri, client_config), digests)
    rows = rdd.mapPartitions(task).collect()
    rows.sort(key=lambda r: (r["ledgerId"], r["segmentFirst"], r["bookie"]))
    return rows


def summarize_replicas(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per ledger with a problem: divergent (copies differ), under-replicated (a bookie
    that answered lacks copies) or, when neither is known, unreachable (some of its bookies could
    not be asked; their copies are unknown, not missing). ``unreachable``: bookie -> error."""
    by_ledger: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        by_ledger.setdefault(r["ledgerId"], []).append(r)
    out: list[dict[str, Any]] = []
    for lid, rs in sorted(by_ledger.items()):
        missing = sum(r["missing"] for r in rs)
        mism = sum(r["digestMismatches"] for r in rs)
        unreachable = {r["bookie"]: r["error"] for r in rs if not r.get("reachable", True)}
        if not missing and not mism and not unreachable:
            continue
        status = "divergent" if mism else "under-replicated" if missing else "unreachable"
        out.append({"ledgerId": lid, "status": status, "missingCopies": missing, "digestMismatches": mism,
                    "bookies": sorted({r["bookie"] for r in rs if r["missing"] or r["digestMismatches"]}),
                    "unreachable": dict(sorted(unreachable.items()))})
    return out
