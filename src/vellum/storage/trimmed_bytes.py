"""Bytes of entry-log records that trim dropped from the index, per entry log: dead for GC.

``LedgerStorage.trim`` removes a ledger's first entries from the location index but cannot
shrink the logs holding them; GC counts these bytes as dead when it weighs a log for
compaction. The counts are saved in ``<index dir>/current/vellum-trimmed-bytes.json``
(``{"version": 1, "trimmed": {"<hex log id>": bytes}}``) so a restart does not forget them.

Invariants:
- The file is advisory: GC's entry-level liveness check stays authoritative, so an unreadable or
  invalid file is reported and ignored (counts start from zero), never an error.
- ``save`` runs after the index sync that made the trims durable (ledger storage's flush), only
  when something changed, through ``durable.write_file_durably``; a failed save is retried at
  the next one.
- A log GC deleted or compacted away drops out (``forget``); at load, counts of logs that no
  longer exist are dropped.

Thread-safe (one lock).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable
from pathlib import Path

from vellum.errors import StorageError
from vellum.storage.durable import write_file_durably

#: the file's name in the index dir's ``current``
TRIMMED_FILE = "vellum-trimmed-bytes.json"
log = logging.getLogger(__name__)


class TrimmedBytes:
    """Per entry log, bytes of records trimmed away (see the module docstring)."""

    def __init__(self, path: Path, existing_logs: Iterable[int]) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._bytes = self._load(set(existing_logs))
        self._dirty = False

    def _load(self, existing: set[int]) -> dict[int, int]:
        """The saved counts of logs that still exist; {} if the file is missing or unusable."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as e:
            log.warning("%s: cannot read (%s); trimmed bytes start from zero", self.path, e)
            return {}
        try:
            doc = json.loads(raw)
            if doc.get("version") != 1:
                raise ValueError(f"unknown version {doc.get('version')!r}")
            saved = {int(k, 16): int(v) for k, v in doc["trimmed"].items()}
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            log.warning("%s is not a valid trimmed-bytes file (%s); trimmed bytes start from zero",
                        self.path, e)
            return {}
        return {lid: n for lid, n in saved.items() if lid in existing and n > 0}

    def add(self, dead: dict[int, int]) -> None:
        """Count ``{log_id: bytes}`` more trimmed bytes."""
        if not dead:
            return
        with self._lock:
            for log_id, size in dead.items():
                self._bytes[log_id] = self._bytes.get(log_id, 0) + size
            self._dirty = True

    def snapshot(self) -> dict[int, int]:
        with self._lock:
            return dict(self._bytes)

    def forget(self, log_id: int) -> None:
        """GC deleted (or compacted away) the log: drop its count."""
        with self._lock:
            if self._bytes.pop(log_id, None) is not None:
                self._dirty = True

    def save(self) -> None:
        """Persist the counts if they changed since the last save (StorageError if it fails)."""
        with self._lock:
            if not self._dirty:
                return
            doc = {"version": 1, "trimmed": {f"{lid:x}": n for lid, n in sorted(self._bytes.items())}}
            self._dirty = False
        try:
            write_file_durably(self.path, json.dumps(doc).encode())
        except StorageError:
            with self._lock:
                self._dirty = True  # try again at the next flush
            raise
