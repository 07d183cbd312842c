"""Admin use-cases of one bookie, shared by the HTTP API and the CLI.

Each method returns plain JSON-able data in BookKeeper's shapes (field names of its REST API)
so that front ends only render. Blocking, except the ``async`` ones that talk to bookies
through a client (``client_config``: the bookie's own client identity); the HTTP layer runs
the blocking ones in a thread.

The sanity check (BookKeeper's ``bookie/sanity``) writes a ledger on this bookie alone, reads
it back and deletes it; one runs at a time (a second waits up to ``SANITY_WAIT_S``), each
bounded by ``SANITY_TIMEOUT_S``. A read-only bookie fails it at once (it cannot take the
write), saying so.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vellum.admin import recovery_admin
from vellum.admin.ledger_admin import ledger_metadata_json
from vellum.bookie.bookie import Bookie
from vellum.client.bookkeeper import BookKeeper
from vellum.config import ClientConfig, ServerConfig, describe
from vellum.errors import IncorrectParameterError, TooManyRequestsError, VellumError
from vellum.ids import BookieId, LedgerId
from vellum.meta.api import MetadataStore
from vellum.security.redaction import REDACTED, is_secret_key, redact

log = logging.getLogger(__name__)

SANITY_ENTRIES = 10
SANITY_TIMEOUT_S = 30.0
SANITY_WAIT_S = 5.0
BOOKIE_INFO_TIMEOUT_S = 5.0


def readable_bytes(value: int) -> str:
    """BookKeeper's ``ListBookieInfoService.getReadable``: ``(1.234GB)`` in powers of 1000,
    three decimals at most, rounded down; empty below 1000."""
    units = ("", "KB", "MB", "GB", "TB")
    shown, unit = float(value), 0
    while shown >= 1000 and unit < len(units) - 1:
        shown /= 1000
        unit += 1
    if unit == 0:
        return ""
    text = f"{math.floor(shown * 1000) / 1000:.3f}".rstrip("0").rstrip(".")
    return f"({text}{units[unit]})"


class BookieAdmin:
    def __init__(
        self,
        *,
        bookie: Bookie,
        bookie_id: str,
        store: MetadataStore,
        config: ServerConfig,
        client_config: ClientConfig | None = None,
        is_shutting_down: Callable[[], bool] = lambda: False,
    ) -> None:
        self._bookie = bookie
        self.bookie_id = bookie_id
        self._store = store
        self._config = config
        self._client_config = client_config or ClientConfig()
        self._is_shutting_down = is_shutting_down
        self._sanity_lock = asyncio.Lock()

    def info(self) -> dict[str, int]:
        info = self._bookie.info()
        return {"freeSpace": info.free_disk_bytes, "totalSpace": info.total_disk_bytes}

    def state(self) -> dict[str, bool | str]:
        """BookKeeper's ``bookie/state``, plus ``readOnlyReason`` (why, when read-only: a failed
        journal, full disks, the admin switch)."""
        shutting_down = self._is_shutting_down()
        out: dict[str, bool | str] = {
            "running": not shutting_down,
            "readOnly": self._bookie.is_read_only,
            "shuttingDown": shutting_down,
            "availableForHighPriorityWrites": not shutting_down,
        }
        reason = self._bookie.read_only_reason
        if reason is not None:
            out["readOnlyReason"] = reason
        return out

    def set_read_only(self, read_only: bool) -> dict[str, bool | str]:
        """The admin switch; the answer says why a bookie stays read-only when asked to be
        writable (full disks, a failed journal: the switch cannot undo those)."""
        self._bookie.set_forced_read_only(read_only)
        out: dict[str, bool | str] = {"readOnly": self._bookie.is_read_only}
        reason = self._bookie.read_only_reason
        if not read_only and reason is not None:
            out["readOnlyReason"] = reason
        return out

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
        return ledger_metadata_json(self._store.ledgers.read_ledger(LedgerId(ledger_id)).value)

    def server_config(self) -> dict[str, Any]:
        """The configuration in force, ``{BookKeeper key: value}`` (BookKeeper's
        ``config/server_config``), secrets shown as ``(redacted)``: the settings declared
        secret, and any key naming a password (``security.redaction``)."""
        out: dict[str, Any] = {}
        for key, name, value, _default, _doc in describe(self._config):
            hidden = value != getattr(self._config, name)  # describe hides the secrets that are set
            out[key] = REDACTED if hidden or is_secret_key(key) else list(value) if isinstance(value, tuple) else value
        clean, _changed = redact(out)
        return dict(clean)

    async def list_bookie_info(self) -> dict[str, str]:
        """Free and total disk space of every registered bookie, asked over the wire, and their
        sums: BookKeeper's ``bookie/list_bookie_info`` strings. A bookie that does not answer
        within ``BOOKIE_INFO_TIMEOUT_S`` is left out (logged); ``{}`` when none answered."""
        reg = self._store.registration
        bookies = sorted(await asyncio.to_thread(lambda: reg.list_bookies() | reg.list_bookies(read_only=True)))
        async with BookKeeper(config=self._client_config, store=self._store) as bk:
            answers = await asyncio.gather(
                *(bk.bookie_client.bookie_info(b, timeout_s=BOOKIE_INFO_TIMEOUT_S) for b in bookies),
                return_exceptions=True)
        out: dict[str, str] = {}
        total_free = total = 0
        for bookie, answer in zip(bookies, answers, strict=True):
            if isinstance(answer, BaseException):
                log.warning("bookie info of %s: no answer (%s); left out of list_bookie_info", bookie, answer)
                continue
            capacity, free = answer
            out[bookie] = (f": {{Free: {free}{readable_bytes(free)}, "
                           f"Total: {capacity}{readable_bytes(capacity)}}},")
            total_free += free
            total += capacity
        if out:
            out["ClusterInfo: "] = (f"{{Free: {total_free}{readable_bytes(total_free)}, "
                                    f"Total: {total}{readable_bytes(total)}}}")
        return out

    async def sanity(self) -> dict[str, Any]:
        """``{"passed": bool, "readOnly": bool}`` (BookKeeper's ``bookie/sanity``), with
        ``"error"`` saying why when it did not pass. ``TooManyRequestsError`` if another check
        kept running for ``SANITY_WAIT_S``."""
        if self._bookie.is_read_only:
            return {"passed": False, "readOnly": True,
                    "error": f"bookie {self.bookie_id} is read-only ({self._bookie.read_only_reason}): it takes "
                             "no writes, so the sanity check "
                             "(write a ledger on it, read it back) cannot run; make it writable first "
                             "(PUT /api/v1/bookie/state/readonly {\"readOnly\": false}, or free disk space)"}
        try:
            await asyncio.wait_for(self._sanity_lock.acquire(), SANITY_WAIT_S)
        except TimeoutError:
            raise TooManyRequestsError(f"another sanity check of bookie {self.bookie_id} is still running after "
                                       f"{SANITY_WAIT_S:g}s: try again later") from None
        try:
            await asyncio.wait_for(
                recovery_admin.bookie_sanity(None, str(self.bookie_id), SANITY_ENTRIES, config=self._client_config,
                                             store=self._store),
                SANITY_TIMEOUT_S)
        except (VellumError, TimeoutError) as e:
            reason = str(e) or f"no answer within {SANITY_TIMEOUT_S:g}s"
            log.warning("sanity check of bookie %s failed: %s", self.bookie_id, reason)
            return {"passed": False, "readOnly": self._bookie.is_read_only, "error": reason}
        finally:
            self._sanity_lock.release()
        log.info("sanity check of bookie %s passed (%d entries written and read back)", self.bookie_id,
                 SANITY_ENTRIES)
        return {"passed": True, "readOnly": False}

    def cluster_info(self) -> dict[str, Any]:
        info = self._store.cluster_info()
        return {
            **recovery_admin.cluster_state(self._store),
            # total: every bookie with a cookie (joined once, not decommissioned), as BookKeeper
            "totalBookiesCount": info.total_bookies,
            "writableBookiesCount": info.writable_bookies,
            "readonlyBookiesCount": info.read_only_bookies,
            "unavailableBookiesCount": info.unavailable_bookies,
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

    def entry_location_compaction(self) -> dict[str, bool]:
        """``{"<entry-location index path>": compacting}`` (BookKeeper's GET
        ``entry_location_compact``): this bookie never compacts its index on request, so none is."""
        return {str(Path(d) / "current" / "locations"): False for d in self._config.effective_index_directories}

    def last_log_mark(self) -> dict[str, str]:
        marks = self._bookie.checkpoint_marks()
        return {f"LastLogMark: Journal Id - {m.journal_id}({m.journal_id:x}.txn)": f"Pos - {m.offset}" for m in marks}
