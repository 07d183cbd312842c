"""Admin use-cases of one bookie, shared by the HTTP API and the CLI.

Each method returns plain JSON-able data in BookKeeper's shapes (field names of its REST API)
so that front ends only render. Blocking; the HTTP layer runs them in a thread.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from vellum.admin import recovery_admin
from vellum.bookie.bookie import Bookie
from vellum.config import ServerConfig
from vellum.errors import IncorrectParameterError
from vellum.ids import BookieId, LedgerId
from vellum.meta.api import MetadataStore


class BookieAdmin:
    def __init__(
        self,
        *,
        bookie: Bookie,
        bookie_id: str,
        store: MetadataStore,
        config: ServerConfig,
        is_shutting_down: Callable[[], bool] = lambda: False,
    ) -> None:
        self._bookie = bookie
        self.bookie_id = bookie_id
        self._store = store
        self._config = config
        self._is_shutting_down = is_shutting_down

    def info(self) -> dict[str, int]:
        info = self._bookie.info()
        return {"freeSpace": info.free_disk_bytes, "totalSpace": info.total_disk_bytes}

    def state(self) -> dict[str, bool]:
        shutting_down = self._is_shutting_down()
        return {
            "running": not shutting_down,
            "readOnly": self._bookie.is_read_only,
            "shuttingDown": shutting_down,
            "availableForHighPriorityWrites": not shutting_down,
        }

    def set_read_only(self, read_only: bool) -> dict[str, bool]:
        self._bookie.set_forced_read_only(read_only)
        return {"readOnly": self._bookie.is_read_only}

    def list_bookies(self, kind: str = "rw", print_hostnames: bool = False) -> dict[str, str | None]:
        if kind not in ("rw", "ro", "all"):
            raise IncorrectParameterError(f"type must be rw, ro or all, not {kind!r}")
        reg = self._store.registration
        ids: set[BookieId] = set()
        if kind in ("rw", "all"):
            ids |= reg.list_bookies(read_only=False)
        if kind in ("ro", "all"):
            ids |= reg.list_bookies(read_only=True)
        return {b: (b.rsplit(":", 1)[0] if print_hostnames else None) for b in sorted(ids)}

    def ledger_metadata(self, ledger_id: int) -> dict[str, Any]:
        versioned = self._store.ledgers.read_ledger(LedgerId(ledger_id))
        shown = versioned.value.to_json_dict()
        # The password (the master key's source) is a secret: whoever holds it may write and
        # fence the ledger. Say whether there is one, never what it is.
        shown["password"] = "(redacted)" if versioned.value.password else ""
        return shown

    def cluster_info(self) -> dict[str, Any]:
        info = self._store.cluster_info()
        return {
            **recovery_admin.cluster_state(self._store),
            "totalBookiesCount": info.writable_bookies + info.read_only_bookies,
            "writableBookiesCount": info.writable_bookies,
            "readonlyBookiesCount": info.read_only_bookies,
            "unavailableBookiesCount": 0,
        }

    def list_disk_files(self, file_type: str | None = None) -> dict[str, str]:
        """``{"journal files": "a.txn, ...", "entrylog files": ..., "index files": ...}``."""
        kinds = {"journal": ("journal files", self._config.journal_directories, ".txn"),
                 "entrylog": ("entrylog files", self._config.ledger_directories, ".log")}
        if file_type is not None and file_type not in (*kinds, "index"):
            raise IncorrectParameterError(f"file_type must be journal, entrylog or index, not {file_type!r}")
        out: dict[str, str] = {}
        for key, (label, dirs, suffix) in kinds.items():
            if file_type in (None, key):
                names = sorted(
                    p.name for d in dirs for p in (Path(d) / "current").glob(f"*{suffix}") if p.is_file()
                )
                out[label] = ", ".join(names)
        if file_type in (None, "index"):
            out["index files"] = ", ".join(
                str(Path(d) / "current" / name)
                for d in self._config.effective_index_directories
                for name in ("locations", "ledgers")
            )
        return out

    def last_log_mark(self) -> dict[str, str]:
        marks = self._bookie.checkpoint_marks()
        return {f"LastLogMark: Journal Id - {m.journal_id}({m.journal_id:x}.txn)": f"Pos - {m.offset}" for m in marks}
