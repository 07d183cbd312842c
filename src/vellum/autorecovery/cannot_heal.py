"""Why an under-replicated ledger cannot heal, said once and kept where operators look.

A replication worker that cannot replace a fragment because no bookie may take its place
raises ``CannotHealError`` with one of two reasons:

- **no spare bookie** (``NO_SPARE_BOOKIE``): every writable bookie is already in the segment
  (or is the bookie being replaced), e.g. a cluster of exactly E bookies that lost one. The
  sentence names how many bookies the ensemble needs and how many are writable;
- **placement cannot be met** (``PLACEMENT``): there are spare bookies, but the placement policy
  refuses each of them; the sentence names the policy and the constraint (its configuration key).

``CannotHealRecords`` keeps that reason in the metadata store's key-value area, one record per
ledger under ``autorecovery/cannotheal/<ledger id>`` (JSON ``{kind, reason, since, worker}``),
next to BookKeeper's own under-replication record, which stays byte for byte BookKeeper's. The
shell (``listunderreplicated``, ``autorecovery status``), the admin HTTP API
(``list_under_replicated_ledger``, ``cluster_info``) and the console's recovery page show it.

Invariants: a record is written only when the reason changes (``record`` says so, and the
worker logs a warning at that moment only: once per ledger per reason); it is deleted when the
ledger heals, fails for another reason, or its under-replication record is gone (readers ignore
such a stale record; the auditor sweeps them). Blocking calls: run them off the event loop.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

from vellum.errors import MetadataVersionError, NotEnoughBookiesError
from vellum.meta.api import KeyValueStore

log = logging.getLogger(__name__)

NO_SPARE_BOOKIE = "no-spare-bookie"
PLACEMENT = "placement"
#: a NotEnoughBookiesError raised by the client itself (e.g. the ensemble change of a recovery)
NOT_ENOUGH_BOOKIES = "not-enough-bookies"

KEY_PREFIX = "autorecovery/cannotheal/"


class CannotHealError(NotEnoughBookiesError):
    """No bookie may take a fragment's place; ``kind`` is one of the module's reasons."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


def _listed(bookies: Collection[str], at_most: int = 8) -> str:
    shown = sorted(bookies)
    text = ", ".join(shown[:at_most])
    return text + (f" and {len(shown) - at_most} more" if len(shown) > at_most else "")


def no_spare_bookie(bookie: str, ensemble_size: int, *, writable: Collection[str], read_only: Collection[str],
                    excluded: Collection[str]) -> CannotHealError:
    """No writable bookie outside the segment: how many the ensemble needs, how many there are."""
    usable = set(writable) - set(read_only) - set(excluded)
    ro = set(read_only)
    text = (f"no spare bookie to replace {bookie}: an ensemble of {ensemble_size} needs {ensemble_size} writable "
            f"bookies, {len(usable)} available" + (f" ({_listed(usable)})" if usable else "")
            + (f"; {len(ro)} read-only ({_listed(ro)}) take no new copies" if ro else "")
            + f"; add a bookie or bring {bookie} back")
    return CannotHealError(NO_SPARE_BOOKIE, text)


def placement_unmet(bookie: str, policy: str, refusal: NotEnoughBookiesError) -> CannotHealError:
    """Spare bookies exist but the placement policy takes none of them."""
    detail = str(refusal)
    prefix = f"replace bookie {bookie}: "
    if detail.startswith(prefix):
        detail = detail[len(prefix):]
    return CannotHealError(PLACEMENT, f"placement cannot be met replacing {bookie}: {policy}: {detail}")


@dataclass(frozen=True)
class CannotHeal:
    kind: str
    reason: str
    since_ms: int
    worker: str

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "reason": self.reason, "since": self.since_ms, "worker": self.worker}


def _key(ledger_id: int) -> str:
    return f"{KEY_PREFIX}{ledger_id:019d}"


def _decode(raw: bytes) -> CannotHeal | None:
    try:
        data = json.loads(raw.decode())
        return CannotHeal(str(data["kind"]), str(data["reason"]), int(data["since"]), str(data.get("worker", "")))
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None  # not ours to interpret: shown as no reason, overwritten at the next refusal


class CannotHealRecords:
    """The cannot-heal records of one metadata store (see the module docstring)."""

    def __init__(self, kv: KeyValueStore) -> None:
        self._kv = kv

    def get(self, ledger_id: int) -> CannotHeal | None:
        got = self._kv.get(_key(ledger_id))
        return _decode(got.value) if got is not None else None

    def record(self, ledger_id: int, kind: str, reason: str, worker: str) -> bool:
        """Store the reason; True when it is new or differs from the stored one (then say it)."""
        key = _key(ledger_id)
        for _ in range(5):
            got = self._kv.get(key)
            old = _decode(got.value) if got is not None else None
            if old is not None and (old.kind, old.reason) == (kind, reason):
                return False
            value = json.dumps(CannotHeal(kind, reason, int(time.time() * 1000), worker).to_json()).encode()
            try:
                if got is None:
                    self._kv.create(key, value)
                else:
                    self._kv.cas(key, value, got.version)
                return True
            except MetadataVersionError:
                continue  # written meanwhile (another worker, a sweep): look again
        return True

    def clear(self, ledger_id: int) -> None:
        try:
            self._kv.delete(_key(ledger_id))
        except MetadataVersionError:
            pass

    def all(self) -> dict[int, CannotHeal]:
        out: dict[int, CannotHeal] = {}
        for key in self._kv.list(KEY_PREFIX):
            got = self._kv.get(key)
            rec = _decode(got.value) if got is not None else None
            if rec is not None and key[len(KEY_PREFIX):].isdigit():
                out[int(key[len(KEY_PREFIX):])] = rec
        return out

    def sweep(self, under_replicated: Callable[[], Iterable[int]]) -> int:
        """Delete the records of ledgers that are no longer under-replicated; how many. The
        records are listed before the under-replication records, so a reason recorded meanwhile
        for a newly marked ledger is not taken for a stale one."""
        keys = self._kv.list(KEY_PREFIX)
        if not keys:
            return 0
        live = {int(lid) for lid in under_replicated()}
        stale = [k for k in keys if not (k[len(KEY_PREFIX):].isdigit() and int(k[len(KEY_PREFIX):]) in live)]
        for key in stale:
            try:
                self._kv.delete(key)
            except MetadataVersionError:
                pass
        return len(stale)


def summarize(records: dict[int, CannotHeal], at_most: int = 3) -> str:
    """One line for many records: the commonest reasons with their ledger counts."""
    by_reason: dict[str, int] = {}
    for rec in records.values():
        by_reason[rec.reason] = by_reason.get(rec.reason, 0) + 1
    parts = [f"{n} ledger{'s' if n > 1 else ''}: {reason}"
             for reason, n in sorted(by_reason.items(), key=lambda kv: -kv[1])[:at_most]]
    if len(by_reason) > at_most:
        parts.append(f"{len(by_reason) - at_most} other reasons")
    return "; ".join(parts)
