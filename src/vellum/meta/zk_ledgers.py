"""The ZooKeeper driver's ledger metadata: ledger ids from ephemeral-sequential znodes
(``ZkLedgerIdGenerator``) and the ledger znodes of the flat, hierarchical and long hierarchical
layouts (``ZkLedgerManager``), with the lost-reply handling of creates and deletes that
``meta/zk.py`` describes (defect D4 of docs/correctness.md). Both run on the store's kazoo
session (``meta/zk.py``)."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    NodeExistsError,
    NoNodeError,
)
from kazoo.protocol.states import ZnodeStat

from vellum.errors import (
    LedgerExistsError,
    LedgerIdOverflowError,
    MetadataStoreUnavailableError,
    MetadataVersionError,
    MetaStoreError,
    NoSuchLedgerError,
)
from vellum.ids import LedgerId
from vellum.meta import paths as P
from vellum.meta.api import (
    LedgerIdGenerator,
    LedgerManager,
    LedgerRange,
    LedgerWatcher,
    Versioned,
    Watch,
)
from vellum.meta.model import (
    LedgerLayout,
    LedgerMetadata,
    deserialize_ledger_metadata,
    serialize_ledger_metadata,
)
from vellum.meta.zk_common import CREATE_RETRIES, TRANSIENT, Flag, Retry, unavailable

log = logging.getLogger(__name__)


_FLAT_PAGE = 10_000
_MAX_DOUBTFUL = 1024


class ZkLedgerIdGenerator(LedgerIdGenerator):
    """BookKeeper's ZkLedgerIdGenerator: the sequence number of an ephemeral-sequential znode.

    The node is named ``ID-<marker>-<seq>`` with a marker unique to the call (Curator's
    "protected" names): when the reply to the create is lost, the retry lists ``idgen`` and takes
    the number its first attempt obtained instead of leaving that node behind. The sequence
    counter belongs to the parent znode, so ids stay unique next to BookKeeper's ``ID-<seq>``.
    """

    def __init__(self, client: KazooClient, root: str, retry_s: float = 10.0) -> None:
        self._client = client
        self._dir = f"{root}/{P.IDGEN}"
        self._retry_s = retry_s

    def generate_ledger_id(self) -> LedgerId:
        marker = f"ID-{uuid.uuid4().hex}-"
        retry = Retry(self._retry_s, f"generating a ledger id under {self._dir}")
        path: str | None = None
        while path is None:
            try:
                if retry.unknown:
                    path = self._find(marker)
                if path is None:
                    path = self._client.create(
                        f"{self._dir}/{marker}", b"", ephemeral=True, sequence=True, makepath=True
                    )
            except TRANSIENT as e:
                retry.failed(e)
        seq = int(path.rsplit("-", 1)[1])
        # The node only carried the counter; drop it without waiting (if that is lost too, the
        # ephemeral node still ends with the session).
        self._client.delete_async(path)
        if not 0 <= seq < P.INT32_MAX:
            raise LedgerIdOverflowError(f"ledger id sequence {seq} at {path} exceeds Integer.MAX_VALUE")
        return LedgerId(seq)

    def _find(self, marker: str) -> str | None:
        try:
            children = self._client.get_children(self._dir)
        except NoNodeError:
            return None
        mine = sorted(c for c in children if c.startswith(marker))
        for extra in mine[1:]:  # a lost attempt applied after all: its number is simply skipped
            self._client.delete_async(f"{self._dir}/{extra}")
        return f"{self._dir}/{mine[0]}" if mine else None


class ZkLedgerManager(LedgerManager):
    """Flat or hierarchical ledger manager on one root.

    Create and delete retry lost replies for up to ``retry_s`` (see the module docstring). A
    create with a generated id whose outcome stays unknown goes to ``_doubtful`` (id -> the bytes
    it wrote); the next ``create_ledger`` settles those first.
    """

    def __init__(
        self,
        client: KazooClient,
        root: str,
        layout: LedgerLayout,
        id_generator: LedgerIdGenerator,
        retry_s: float = 10.0,
    ) -> None:
        self._client = client
        self._root = root
        self.layout = layout
        self._idgen = id_generator
        self._type = layout.manager_type
        self._hier = self._type in ("hierarchical", "longhierarchical")
        self._retry_s = retry_s
        self._lock = threading.Lock()
        self._doubtful: dict[LedgerId, bytes] = {}

    def ledger_path(self, ledger_id: int) -> str:
        if self._type == "longhierarchical":
            return P.long_hierarchical_ledger_path(self._root, ledger_id)
        if self._hier:
            return P.hierarchical_ledger_path(self._root, ledger_id)
        return P.flat_ledger_path(self._root, ledger_id)

    def create_ledger(self, metadata: LedgerMetadata) -> tuple[LedgerId, int]:
        data = serialize_ledger_metadata(metadata)
        adopted = self._settle_doubtful(data)
        if adopted is not None:
            return adopted, 0
        for _ in range(CREATE_RETRIES):
            ledger_id = self._idgen.generate_ledger_id()
            try:
                return ledger_id, self._create(ledger_id, metadata, data, generated=True)
            except LedgerExistsError:
                continue  # an id taken by create_ledger_with_id; BookKeeper also just retries
        raise LedgerExistsError(f"{CREATE_RETRIES} generated ledger ids in a row already existed under {self._root}")

    def create_ledger_with_id(self, ledger_id: LedgerId, metadata: LedgerMetadata) -> int:
        return self._create(ledger_id, metadata, serialize_ledger_metadata(metadata), generated=False)

    def _create(self, ledger_id: LedgerId, metadata: LedgerMetadata, data: bytes, *, generated: bool) -> int:
        """Create the znode exactly once from the caller's view; returns version 0.

        A lost reply is retried; a retry that meets NodeExists asks ``_made_by`` whether the
        node is this create's own. The version returned is always 0, the version the create
        made: if someone wrote the ledger since, the caller's first CAS fails and it re-reads.
        """
        path = self.ledger_path(ledger_id)
        if generated:
            advice = (
                f"; ledger {ledger_id} ({path}) may have been created: this store adopts it at its next "
                "create_ledger with the same metadata or removes it then"
            )
        else:
            advice = (
                f"; ledger {ledger_id} ({path}) may have been created: retry create_ledger_with_id with "
                "the same metadata (a creator token recognises its own create) or read the ledger"
            )
        retry = Retry(self._retry_s, f"creating ledger {ledger_id} at {path}")
        while True:
            try:
                try:
                    self._client.create(path, data, makepath=True)
                    return 0
                except NodeExistsError:
                    if self._made_by(path, metadata, data, after_unknown=retry.unknown > 0):
                        return 0
                    raise LedgerExistsError(
                        f"ledger {ledger_id} already exists at {path} (made by another creator)"
                    ) from None
            except TRANSIENT as e:
                try:
                    retry.failed(e, advice)
                except MetadataStoreUnavailableError:
                    if generated:
                        self._remember_doubtful(ledger_id, data)
                    raise

    def _made_by(self, path: str, metadata: LedgerMetadata, data: bytes, *, after_unknown: bool) -> bool:
        """Whether the existing znode at ``path`` is the one this create made (BK#1967's check).

        With a creator token (both clients set a random one) the stored token decides, on any
        NodeExists, as in BookKeeper: so a caller may also retry a create it was told failed.
        Token-less metadata (tools, tests) is recognised only by a retry of this call's own
        unanswered attempt, and only by byte-identical data at version 0: without a token an
        identical create by someone else in that window cannot be told apart.
        """
        try:
            stored, stat = self._client.get(path)
        except NoNodeError:
            # Existed a moment ago and is gone: ours and already deleted, or someone else's.
            # BookKeeper answers "exists" here too: re-creating could resurrect a deleted ledger.
            return False
        if metadata.creator_token:
            try:
                found = deserialize_ledger_metadata(stored, where=f"znode {path}")
            except MetaStoreError:
                return False  # not Vellum metadata: certainly not ours
            return found.creator_token == metadata.creator_token
        return after_unknown and stat.version == 0 and bytes(stored) == data

    def _remember_doubtful(self, ledger_id: LedgerId, data: bytes) -> None:
        with self._lock:
            if len(self._doubtful) >= _MAX_DOUBTFUL:
                dropped = next(iter(self._doubtful))
                del self._doubtful[dropped]
                log.warning(
                    "forgetting ledger %s (%s) whose create had no answer: it may exist with no owner; "
                    "check it with `vellum shell ledgermetadata %s`", dropped, self.ledger_path(dropped), dropped,
                )
            self._doubtful[ledger_id] = data

    def _settle_doubtful(self, data: bytes) -> LedgerId | None:
        """Resolve earlier creates whose outcome stayed unknown (the caller was told they failed).

        A node that holds exactly ``data`` at version 0 is adopted: the caller retries that very
        create, and one answered create = one ledger. Any other node still as this store wrote it
        is deleted (at version 0, so a ledger somebody found and used is left alone, with a
        warning). An answer that is lost again keeps the entry for the next call.
        """
        if not self._doubtful:
            return None
        with self._lock:
            pending, self._doubtful = self._doubtful, {}
        adopted: LedgerId | None = None
        for lid, written in pending.items():
            path = self.ledger_path(lid)
            try:
                try:
                    stored, stat = self._client.get(path)
                except NoNodeError:
                    continue  # the unanswered create never happened
                if stat.version != 0:
                    log.warning(
                        "ledger %s (%s), whose create had no answer, was changed since: left in place", lid, path
                    )
                    continue  # in use by whoever found it: not ours to remove
                if bytes(stored) != written:
                    continue  # our create never happened; someone else created this id
                if adopted is None and written == data:
                    adopted = lid
                    continue
                self._client.delete(path, version=0)
                log.warning("removed ledger %s (%s): its create had no answer and was reported failed", lid, path)
            except (NoNodeError, BadVersionError):
                continue
            except TRANSIENT:
                with self._lock:
                    self._doubtful.setdefault(lid, written)
        return adopted

    def read_ledger(self, ledger_id: LedgerId) -> Versioned[LedgerMetadata]:
        path = self.ledger_path(ledger_id)
        try:
            data, stat = self._client.get(path)
        except NoNodeError:
            raise NoSuchLedgerError(f"no ledger {ledger_id} (no znode {path})") from None
        except TRANSIENT as e:
            unavailable(e, f"reading {path}")
        return Versioned(deserialize_ledger_metadata(data, where=f"znode {path}"), stat.version)

    def write_ledger(self, ledger_id: LedgerId, metadata: LedgerMetadata, expected_version: int) -> int:
        path = self.ledger_path(ledger_id)
        try:
            stat = self._client.set(path, serialize_ledger_metadata(metadata), version=expected_version)
        except BadVersionError:
            raise MetadataVersionError(
                f"ledger {ledger_id} at {path} changed: expected version {expected_version}, the store has another"
            ) from None
        except NoNodeError:
            raise NoSuchLedgerError(f"no ledger {ledger_id} (no znode {path})") from None
        except TRANSIENT as e:
            unavailable(e, f"writing {path}")
        return int(stat.version)

    def delete_ledger(self, ledger_id: LedgerId, expected_version: int | None = None) -> None:
        path = self.ledger_path(ledger_id)
        retry = Retry(self._retry_s, f"deleting ledger {ledger_id} at {path}")
        while True:
            try:
                self._client.delete(path, version=-1 if expected_version is None else expected_version)
                return
            except NoNodeError:
                # Absent is success, the contract of meta.api and BookKeeper's since BK#1967
                # (removeLedgerMetadata: NONODE -> OK). It is what a retry sees after the first
                # attempt's reply was lost; telling that case from "never existed" would need
                # state ZooKeeper does not keep, and exclusive removal protects nothing.
                return
            except BadVersionError:
                raise MetadataVersionError(
                    f"ledger {ledger_id} at {path} changed: expected version {expected_version}"
                ) from None
            except TRANSIENT as e:
                retry.failed(e, f"; ledger {ledger_id} may already be deleted: deleting again is safe")

    def ledger_exists(self, ledger_id: LedgerId) -> bool:
        try:
            return self._client.exists(self.ledger_path(ledger_id)) is not None
        except TRANSIENT as e:
            unavailable(e, f"checking ledger {ledger_id}")

    def _children(self, path: str) -> list[str]:
        try:
            return sorted(self._client.get_children(path))
        except NoNodeError:
            return []  # removed while we walked: nothing under it any more
        except TRANSIENT as e:
            unavailable(e, f"listing {path}")

    def ledger_ranges(self, start_after: LedgerId | None = None) -> Iterator[LedgerRange]:
        if not self._hier:
            # Flat: ZooKeeper can only list one node's children at once, so this loads every
            # name (BookKeeper's flat manager does the same; the reason hierarchical exists).
            ids = sorted(
                i for i in (P.parse_flat_name(n) for n in self._children(self._root))
                if i is not None and (start_after is None or i > start_after)
            )
            for k in range(0, len(ids), _FLAT_PAGE):
                yield LedgerRange(tuple(LedgerId(i) for i in ids[k:k + _FLAT_PAGE]))
            return
        yield from self._walk_hierarchical(start_after)

    def _walk_hierarchical(self, start_after: int | None) -> Iterator[LedgerRange]:
        # Level-1 names: 2 digits = 2/4/4 layout (10-digit ids), 3 digits = 3/4/4/4/4 (19 digits).
        top = [n for n in self._children(self._root) if n.isdigit() and len(n) in (2, 3)]
        shapes = ((3, 5),) if self._type == "longhierarchical" else ((2, 3), (3, 5))
        for width, depth in shapes:
            digits = 10 if width == 2 else 19
            start = None if start_after is None else f"{start_after:0{digits}d}"
            for name in (n for n in top if len(n) == width):
                yield from self._walk(f"{self._root}/{name}", name, depth - 1, start)

    def _walk(self, path: str, prefix: str, levels_left: int, start: str | None) -> Iterator[LedgerRange]:
        if start is not None and prefix < start[: len(prefix)]:
            return  # the whole subtree is at or below start_after
        children = self._children(path)
        if levels_left == 1:
            ids = []
            for c in children:
                if len(c) == 5 and c[0] == "L" and c[1:].isdigit():
                    full = prefix + c[1:]
                    if start is None or full > start:
                        ids.append(LedgerId(int(full)))
            if ids:
                yield LedgerRange(tuple(ids))
            return
        for c in children:
            if len(c) == 4 and c.isdigit():
                yield from self._walk(f"{path}/{c}", prefix + c, levels_left - 1, start)

    def watch_ledger(self, ledger_id: LedgerId, callback: LedgerWatcher) -> Watch:
        path = self.ledger_path(ledger_id)
        flag = Flag()
        first = [True]

        def on_change(data: bytes | None, stat: ZnodeStat | None, *_: Any) -> bool | None:
            if flag.cancelled:
                return False  # tells kazoo to drop the watch
            if first[0]:
                first[0] = False  # kazoo calls once at registration; the contract is "after a change"
                return None
            if data is None or stat is None:
                callback(ledger_id, None)
            else:
                try:
                    md = deserialize_ledger_metadata(data, where=f"znode {path}")
                except MetaStoreError:
                    log.exception("watched ledger %s has unreadable metadata", ledger_id)
                    return None
                callback(ledger_id, Versioned(md, stat.version))
            return None

        try:
            self._client.DataWatch(path, on_change)
        except TRANSIENT as e:
            unavailable(e, f"watching {path}")
        return flag
