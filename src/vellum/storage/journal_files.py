"""Journal files as they lie on disk: their names (``<hex id>.txn``), listing them, reading one
(``JournalFile``) and replaying a run of them from a ``LogMark`` (``replay_journals``). The
writing side, which owns the current file, is ``storage/journal.py``; the byte format is
``vellum.format.journal``.

Invariant: replay stops at the first bad record (rule 2 of docs/correctness.md); a bad record
is the torn tail of a crash only in the last journal, corruption anywhere else.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from vellum.errors import CorruptionError, StorageError
from vellum.format.journal import JournalRecord, JournalScanner, RecordKind, ScanStop
from vellum.format.lastmark import ZERO_MARK, LogMark

log = logging.getLogger("vellum.storage.journal")

_JOURNAL_NAME = re.compile(r"^([0-9a-f]+)\.txn$")


def journal_file_name(journal_id: int) -> str:
    """BookKeeper's name: ``Long.toHexString(id) + ".txn"``."""
    return f"{journal_id:x}.txn"


def list_journal_ids(current_dir: Path) -> list[int]:
    """Ids of the ``<hex id>.txn`` files in a journal's ``current`` directory, ascending."""
    try:
        names = os.listdir(current_dir)
    except FileNotFoundError:
        return []
    ids = []
    for name in names:
        m = _JOURNAL_NAME.match(name)
        if m:
            ids.append(int(m.group(1), 16))
    return sorted(ids)


class JournalFile:
    """A read-only journal file for scanning: ``with JournalFile(path) as jf: for r in jf.scan(): ...``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._fd = os.open(path, os.O_RDONLY)
        except OSError as e:
            raise StorageError(f"cannot open journal {path}: {e.strerror}") from None

    def read(self, offset: int, n: int) -> bytes:
        try:
            return os.pread(self._fd, n, offset)
        except OSError as e:
            raise StorageError(f"cannot read journal {self.path} at offset {offset}: {e.strerror}") from None

    def scanner(self, start: int | None = None) -> JournalScanner:
        return JournalScanner(self.read, start=start, where=str(self.path))

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> JournalFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True, slots=True)
class JournalReplay:
    """What replay found in one journal file."""

    journal_id: int
    path: Path
    start: int
    records: int
    stop: ScanStop


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """Outcome of ``Journal.replay``: per-file results, totals, and where valid data ends."""

    journals: list[JournalReplay] = field(default_factory=list)
    records: int = 0
    #: records with an unknown negative entry id (skipped, as BookKeeper does)
    skipped: int = 0

    @property
    def end_mark(self) -> LogMark | None:
        """The position after the last valid record of the last journal (None: no journal)."""
        if not self.journals:
            return None
        last = self.journals[-1]
        return LogMark(last.journal_id, last.stop.valid_end)

    @property
    def torn_tail(self) -> bool:
        return bool(self.journals) and not self.journals[-1].stop.clean


def replay_journals(journal_ids: list[int], path_of: Callable[[int], Path], mark: LogMark,
                    on_record: Callable[[JournalRecord], None]) -> ReplayResult:
    """Feed every valid record at or after ``mark`` of the journals ``journal_ids`` (ascending;
    ``path_of`` names each file) to ``on_record``, in journal order.

    Records with unknown negative entry ids are skipped. A bad record ends the replay: in the
    last journal it is the torn tail of a crash (reported in the result); in an earlier journal
    it is ``CorruptionError`` naming the file and offset. A missing marked journal is
    ``CorruptionError`` (fail-stop), except for the zero mark of a fresh bookie.
    """
    all_ids = journal_ids
    ids = [i for i in all_ids if i >= mark.journal_id]
    if mark != ZERO_MARK and mark.journal_id not in ids:
        raise CorruptionError(
            f"journal {path_of(mark.journal_id)} named by lastMark {mark} is missing "
            f"(journals present: {', '.join(journal_file_name(i) for i in all_ids) or 'none'})"
        )
    journals: list[JournalReplay] = []
    total = skipped = 0
    for n, journal_id in enumerate(ids):
        path = path_of(journal_id)
        start = mark.offset if journal_id == mark.journal_id else None
        count = 0
        with JournalFile(path) as jf:
            scanner = jf.scanner(start)
            for record in scanner:
                if record.kind is RecordKind.OTHER:
                    skipped += 1
                    continue
                on_record(record)
                count += 1
        stop = scanner.stop
        assert stop is not None
        total += count
        journals.append(JournalReplay(journal_id, path, scanner.start, count, stop))
        if not stop.clean:
            if n != len(ids) - 1:
                raise CorruptionError(
                    f"{stop.describe(str(path))}; it is not the last journal, so this is "
                    "corruption, not a torn tail"
                )
            log.warning("journal %s: torn tail ignored: %s", path, stop.describe(str(path)))
    return ReplayResult(journals, total, skipped)
