"""ZooKeeper metadata driver (kazoo), with BookKeeper's znode layout.

Responsibility: implement every interface of ``meta.api`` on a ZooKeeper ensemble under one root
(default ``/ledgers``):

    {root}/LAYOUT                    "2\\n<factoryClass>:1" (BookKeeper's text)
    {root}/INSTANCEID                cluster instance id (UUID text)
    {root}/available/<bookieId>      ephemeral: writable bookie
    {root}/available/readonly/<id>   ephemeral: read-only bookie
    {root}/cookies/<bookieId>        persistent, versioned cookie
    {root}/idgen/ID-<marker>-<seq>   ephemeral-sequential: ledger id = seq, node deleted at once
    {root}/L0000000001               flat ledger manager
    {root}/00/0000/L0001             hierarchical ledger manager (2/4/4; ids >= 2^31 as below)
    {root}/000/0000/0000/0000/L0001  long hierarchical ledger manager (3/4/4/4/4 for every id)
    {root}/vellum-kv/<key>           Vellum's key-value area (data = b"v" + value; b"" = directory)

AutoRecovery's znodes under ``{root}/underreplication`` (under-replicated ledgers, locks, the
auditor election): ``meta/zk_underreplication.py``, on this store's session.

Invariants:
- versions are znode ``stat.version``; every CAS is a ``set``/``delete`` with that version, so
  ZooKeeper itself decides conflicts;
- one kazoo session per store; on session loss (``LOST``) listeners hear ``EXPIRED`` (a client
  must assume it may have been fenced); when kazoo has a new session the store re-creates its
  bookie registrations (a try that fails is repeated at every connection until one succeeds),
  then listeners hear ``RECONNECTED``; kazoo's connection thread runs the state listener, which
  takes no lock that is held across a ZooKeeper round trip;
- connection problems surface as ``MetadataStoreUnavailableError`` (retryable), bad data as
  ``MetaStoreError`` naming the znode;
- a lost reply (ConnectionLoss, a timeout, an expired or moved session while a request was in
  flight) means "the operation may or may not have happened". Ledger create and delete retry
  within a budget (``op_retry_s``, default the session timeout) and settle that doubt, as
  BookKeeper does since BK#1967: creation is exactly once from the caller's view (a retry that
  finds the znode recognises its own by the creator token, ``cToken``, or, for token-less
  metadata, by identical bytes), delete is idempotent (absent = success). An id-generator node
  carries a per-call marker so a retry finds the sequence number its lost attempt obtained. A
  create with a generated id that exhausts the budget is remembered: the next ``create_ledger``
  of this store adopts it (same metadata) or removes it, so nobody is left holding no id to an
  existing ledger;
- with a digest identity (``digest_auth`` = ``user:password``, BookKeeper's ``zkEnableSecurity``
  with Vellum's ``zkDigestAuthFile``) the session authenticates with it and every znode this
  store creates gets the ACL ``digest:user:<hash>:cdrwa`` and nothing else: only sessions with
  the cluster's identity (bookies, trusted clients, tools given the file) can read or write
  ledgers, cookies and registrations. A store that finds the root closed to its session says
  which setting to fix; one that finds it open to everyone while secured warns;
- with ``tls`` (``zkTlsEnabled``, ``meta/zk_tls.py``) every connection of the session is TLS with
  the caller's context; a session that is not established within ``_DIAGNOSE_AFTER_S`` has its
  connection probed, and a TLS mismatch (plaintext against a ``secureClientPort``, an untrusted
  or refused certificate) ends the attempt at once with a ``MetaStoreError`` naming the address
  and the setting to check, instead of retrying until the connect timeout;
- the under-replication manager (``meta/zk_underreplication.py``) runs on this store's session
  and dispatcher; it shares the retry budget and the error translation (``meta/zk_common.py``).

Size: about 1,000 lines: one driver implementing five interfaces of ``meta.api`` (ledger manager
~290 lines with the lost-reply handling, registration ~165, key-value ~110, layout, id
generator) over one kazoo session, each class read on its own.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
)
from kazoo.protocol.states import ZnodeStat
from kazoo.security import make_digest_acl

from vellum.errors import (
    ConfigError,
    LedgerExistsError,
    LedgerIdOverflowError,
    MetadataStoreUnavailableError,
    MetadataVersionError,
    MetaStoreError,
    NoSuchLedgerError,
)
from vellum.ids import BookieId, LedgerId
from vellum.meta import paths as P
from vellum.meta.api import (
    BookiesWatcher,
    KeyValueStore,
    LayoutManager,
    LedgerIdGenerator,
    LedgerManager,
    LedgerRange,
    LedgerWatcher,
    MetadataStore,
    RegistrationManager,
    SessionEvent,
    SessionListener,
    Versioned,
    Watch,
)
from vellum.meta.dispatch import CallbackDispatcher
from vellum.meta.model import (
    LedgerLayout,
    LedgerMetadata,
    deserialize_ledger_metadata,
    serialize_ledger_metadata,
)
from vellum.meta.zk_common import CREATE_RETRIES, TRANSIENT, Flag, Retry, unavailable
from vellum.meta.zk_tls import TlsHandler, ZkTls, diagnose
from vellum.meta.zk_underreplication import ZkUnderReplicationManager

log = logging.getLogger(__name__)

_FLAT_PAGE = 10_000
_MAX_DOUBTFUL = 1024
#: a session not established after this long has its connection probed for a TLS mismatch
_DIAGNOSE_AFTER_S = 2.0


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


class ZkRegistrationManager(RegistrationManager):
    def __init__(self, client: KazooClient, root: str, session_timeout_s: float) -> None:
        self._client = client
        self._root = root
        self._available = f"{root}/{P.AVAILABLE}"
        self._readonly = f"{root}/{P.AVAILABLE}/{P.READONLY}"
        self._cookies = f"{root}/{P.COOKIES}"
        self._session_timeout_s = session_timeout_s
        self._lock = threading.RLock()
        self._mine: dict[BookieId, tuple[bool, bytes]] = {}

    def _path(self, bookie_id: BookieId, read_only: bool) -> str:
        return f"{self._readonly if read_only else self._available}/{bookie_id}"

    def register_bookie(self, bookie_id: BookieId, *, read_only: bool = False, data: bytes = b"") -> None:
        if not bookie_id or "/" in bookie_id or bookie_id == P.READONLY:
            raise MetaStoreError(f"bad bookie id {bookie_id!r}")
        with self._lock:
            self._mine[bookie_id] = (read_only, data)
            self._create(bookie_id, read_only, data)

    def _create(self, bookie_id: BookieId, read_only: bool, data: bytes) -> None:
        session_id = self._client.client_id[0] if self._client.client_id else None
        self._delete_own(self._path(bookie_id, not read_only), session_id)
        path = self._path(bookie_id, read_only)
        # A node left by our previous session (or a previous process) lives until that session
        # expires; wait for it rather than fail a restarting bookie (bounded by 2 session timeouts).
        deadline = time.monotonic() + 2 * self._session_timeout_s + 1
        while True:
            try:
                self._client.create(path, data, ephemeral=True, makepath=True)
                return
            except NodeExistsError:
                try:
                    _, stat = self._client.get(path)
                except NoNodeError:
                    continue
                if stat.ephemeralOwner == session_id:
                    self._client.set(path, data)
                    return
                if time.monotonic() > deadline:
                    raise MetaStoreError(
                        f"bookie {bookie_id} is already registered at {path} by another live session "
                        f"0x{stat.ephemeralOwner:x}"
                    ) from None
                time.sleep(0.2)
            except TRANSIENT as e:
                unavailable(e, f"registering at {path}")

    def _delete_own(self, path: str, session_id: int | None) -> None:
        try:
            _, stat = self._client.get(path)
            if stat.ephemeralOwner == session_id:
                self._client.delete(path, version=stat.version)
        except (NoNodeError, BadVersionError):
            pass

    def reregister_all(self) -> bool:
        """After a new session: re-create every registration this store made; False if one
        failed (the store tries again at its next connection)."""
        done = True
        with self._lock:
            for bookie_id, (read_only, data) in list(self._mine.items()):
                try:
                    self._create(bookie_id, read_only, data)
                except Exception:
                    log.exception("re-registering bookie %s failed; tried again at the next connection", bookie_id)
                    done = False
        return done

    def unregister_bookie(self, bookie_id: BookieId) -> None:
        with self._lock:
            self._mine.pop(bookie_id, None)
            session_id = self._client.client_id[0] if self._client.client_id else None
            try:
                for ro in (False, True):
                    self._delete_own(self._path(bookie_id, ro), session_id)
            except TRANSIENT as e:
                unavailable(e, f"unregistering {bookie_id}")

    def list_bookies(self, *, read_only: bool = False) -> frozenset[BookieId]:
        path = self._readonly if read_only else self._available
        try:
            names = self._client.get_children(path)
        except NoNodeError:
            return frozenset()
        except TRANSIENT as e:
            unavailable(e, f"listing {path}")
        return frozenset(BookieId(n) for n in names if read_only or n != P.READONLY)

    def get_bookie_data(self, bookie_id: BookieId) -> bytes | None:
        for read_only in (False, True):
            path = self._path(bookie_id, read_only)
            try:
                data, _stat = self._client.get(path)
                return bytes(data)
            except NoNodeError:
                continue
            except TRANSIENT as e:
                unavailable(e, f"reading {path}")
        return None

    def watch_bookies(self, callback: BookiesWatcher, *, read_only: bool = False) -> Watch:
        path = self._readonly if read_only else self._available
        flag = Flag()

        def on_children(children: list[str]) -> bool | None:
            if flag.cancelled:
                return False
            callback(frozenset(BookieId(n) for n in children if read_only or n != P.READONLY))
            return None

        try:
            self._client.ensure_path(path)
            self._client.ChildrenWatch(path, on_children)
        except TRANSIENT as e:
            unavailable(e, f"watching {path}")
        return flag

    def get_cookie(self, bookie_id: BookieId) -> Versioned[bytes] | None:
        path = f"{self._cookies}/{bookie_id}"
        try:
            data, stat = self._client.get(path)
        except NoNodeError:
            return None
        except TRANSIENT as e:
            unavailable(e, f"reading {path}")
        return Versioned(bytes(data), stat.version)

    def put_cookie(self, bookie_id: BookieId, data: bytes, expected_version: int | None) -> int:
        path = f"{self._cookies}/{bookie_id}"
        try:
            if expected_version is None:
                self._client.create(path, data, makepath=True)
                return 0
            return int(self._client.set(path, data, version=expected_version).version)
        except NodeExistsError:
            raise MetadataVersionError(f"cookie {path} already exists") from None
        except (BadVersionError, NoNodeError):
            raise MetadataVersionError(
                f"cookie {path} is not at version {expected_version} (changed or removed)"
            ) from None
        except TRANSIENT as e:
            unavailable(e, f"writing {path}")

    def remove_cookie(self, bookie_id: BookieId, expected_version: int | None = None) -> None:
        path = f"{self._cookies}/{bookie_id}"
        try:
            self._client.delete(path, version=-1 if expected_version is None else expected_version)
        except NoNodeError:
            pass
        except BadVersionError:
            raise MetadataVersionError(f"cookie {path} is not at version {expected_version}") from None
        except TRANSIENT as e:
            unavailable(e, f"deleting {path}")

    def list_cookies(self) -> frozenset[BookieId]:
        try:
            return frozenset(BookieId(n) for n in self._client.get_children(self._cookies))
        except NoNodeError:
            return frozenset()
        except TRANSIENT as e:
            unavailable(e, f"listing {self._cookies}")

    def get_instance_id(self) -> str | None:
        path = f"{self._root}/{P.INSTANCEID}"
        try:
            data, _ = self._client.get(path)
        except NoNodeError:
            return None
        except TRANSIENT as e:
            unavailable(e, f"reading {path}")
        try:
            return bytes(data).decode("ascii").strip()
        except UnicodeDecodeError:
            raise MetaStoreError(f"{path}: instance id is not text: {bytes(data)[:40]!r}") from None


class ZkLayoutManager(LayoutManager):
    def __init__(self, client: KazooClient, root: str) -> None:
        self._client = client
        self.path = f"{root}/{P.LAYOUT}"

    def read_layout(self) -> LedgerLayout | None:
        try:
            data, _ = self._client.get(self.path)
        except NoNodeError:
            return None
        except TRANSIENT as e:
            unavailable(e, f"reading {self.path}")
        return LedgerLayout.parse(data, where=f"znode {self.path}")

    def store_layout(self, layout: LedgerLayout) -> None:
        try:
            self._client.create(self.path, layout.serialize(), makepath=True)
        except NodeExistsError:
            raise MetadataVersionError(f"a layout already exists at {self.path}") from None
        except TRANSIENT as e:
            unavailable(e, f"writing {self.path}")

    def delete_layout(self) -> None:
        try:
            self._client.delete(self.path)
        except NoNodeError:
            pass
        except TRANSIENT as e:
            unavailable(e, f"deleting {self.path}")


_KEY_MARK = b"v"


class ZkKeyValueStore(KeyValueStore):
    """Keys are znode paths under ``{root}/vellum-kv``; a znode holding a key has data b"v"+value."""

    def __init__(self, client: KazooClient, root: str) -> None:
        self._client = client
        self._base = f"{root}/{P.KV}"

    def _path(self, key: str) -> str:
        return f"{self._base}/{P.validate_kv_key(key)}"

    def get(self, key: str) -> Versioned[bytes] | None:
        try:
            data, stat = self._client.get(self._path(key))
        except NoNodeError:
            return None
        except TRANSIENT as e:
            unavailable(e, f"reading key {key!r}")
        if not data.startswith(_KEY_MARK):
            return None  # only a directory of longer keys
        return Versioned(bytes(data[1:]), stat.version)

    def create(self, key: str, value: bytes) -> int:
        path = self._path(key)
        try:
            try:
                self._client.create(path, _KEY_MARK + value, makepath=True)
                return 0
            except NodeExistsError:
                data, stat = self._client.get(path)
                if data.startswith(_KEY_MARK):
                    raise MetadataVersionError(f"key {key!r} already exists ({path})") from None
                # A directory node of longer keys becomes a key too.
                return int(self._client.set(path, _KEY_MARK + value, version=stat.version).version)
        except (BadVersionError, NoNodeError):
            raise MetadataVersionError(f"key {key!r} changed while being created ({path})") from None
        except TRANSIENT as e:
            unavailable(e, f"creating key {key!r}")

    def cas(self, key: str, value: bytes, expected_version: int) -> int:
        path = self._path(key)
        try:
            data, stat = self._client.get(path)
            if not data.startswith(_KEY_MARK) or stat.version != expected_version:
                raise MetadataVersionError(f"key {key!r} ({path}) is not at version {expected_version}")
            return int(self._client.set(path, _KEY_MARK + value, version=expected_version).version)
        except (BadVersionError, NoNodeError):
            raise MetadataVersionError(f"key {key!r} ({path}) is not at version {expected_version}") from None
        except TRANSIENT as e:
            unavailable(e, f"writing key {key!r}")

    def delete(self, key: str, expected_version: int | None = None) -> bool:
        path = self._path(key)
        try:
            for _ in range(CREATE_RETRIES):
                try:
                    data, stat = self._client.get(path)
                except NoNodeError:
                    return False
                if not data.startswith(_KEY_MARK):
                    return False
                if expected_version is not None and stat.version != expected_version:
                    raise MetadataVersionError(f"key {key!r} ({path}) is not at version {expected_version}")
                try:
                    try:
                        self._client.delete(path, version=stat.version)
                    except NotEmptyError:
                        self._client.set(path, b"", version=stat.version)  # keep the directory
                    return True
                except BadVersionError:
                    if expected_version is not None:
                        raise MetadataVersionError(
                            f"key {key!r} ({path}) is not at version {expected_version}"
                        ) from None
                except NoNodeError:
                    return False
            raise MetadataStoreUnavailableError(f"key {key!r} ({path}) kept changing during delete")
        except TRANSIENT as e:
            unavailable(e, f"deleting key {key!r}")

    def list(self, prefix: str = "", *, start_after: str | None = None, limit: int | None = None) -> list[str]:
        directory, _, partial = prefix.rpartition("/")
        node = f"{self._base}/{directory}" if directory else self._base
        found: list[str] = []

        def walk(path: str, key_prefix: str, first: bool) -> None:
            try:
                children = self._client.get_children(path)
            except NoNodeError:
                return
            for c in children:
                if first and not c.startswith(partial):
                    continue
                key = f"{key_prefix}{c}"
                child = f"{path}/{c}"
                try:
                    data, _ = self._client.get(child)
                except NoNodeError:
                    continue
                if data.startswith(_KEY_MARK):
                    found.append(key)
                walk(child, key + "/", False)

        try:
            walk(node, f"{directory}/" if directory else "", True)
        except TRANSIENT as e:
            unavailable(e, f"listing keys under {prefix!r}")
        # Keys are collected per subtree, then sorted, because '/' does not sort first.
        keys = sorted(k for k in found if start_after is None or k > start_after)
        return keys[:limit] if limit is not None else keys


def read_digest_file(path: str) -> str:
    """The ``user:password`` digest identity in ``path`` (surrounding whitespace ignored). The
    file is a secret: refused if group or others may read or write it."""
    try:
        st = os.stat(path)
        text = Path(path).read_text().strip()
    except OSError as e:
        raise ConfigError(f"cannot read zkDigestAuthFile {path}: {e.strerror or e}") from None
    if st.st_mode & 0o077:
        raise ConfigError(f"zkDigestAuthFile {path} is open to group/others (mode {st.st_mode & 0o777:04o}): it "
                          f"holds the cluster's ZooKeeper password; run `chmod 600 {path}`")
    user, sep, password = text.partition(":")
    if not sep or not user or not password or "\n" in text:
        raise ConfigError(f"zkDigestAuthFile {path} must hold one line user:password")
    return text


class ZkMetadataStore(MetadataStore):
    """A kazoo session on ``hosts`` with the metadata under ``root``."""

    def __init__(
        self,
        hosts: str,
        root: str = "/ledgers",
        *,
        ledger_manager_type: str | None = None,
        session_timeout_s: float = 10.0,
        connect_timeout_s: float = 10.0,
        op_retry_s: float | None = None,
        uri: str = "",
        digest_auth: str = "",
        tls: ZkTls | None = None,
    ) -> None:
        """``digest_auth``: ``user:password``, the cluster's ZooKeeper identity (see the module
        docstring); empty = no authentication, znodes open to every client (world ACL).
        ``tls``: connect with TLS (ZooKeeper's ``secureClientPort``); ``None`` = plaintext."""
        self.uri = uri or f"zk://{hosts}{root}"
        self.hosts = hosts
        self.root = root.rstrip("/") or "/ledgers"
        self._wanted_type = ledger_manager_type
        # How long ledger create/delete keep retrying lost replies: a session timeout is how
        # long ZooKeeper itself waits before it gives up on a silent client.
        self._op_retry_s = session_timeout_s if op_retry_s is None else op_retry_s
        security: dict[str, Any] = {}
        self._digest_user = ""
        if digest_auth:
            user, _, password = digest_auth.partition(":")
            self._digest_user = user
            security = {"auth_data": [("digest", digest_auth)],
                        "default_acl": [make_digest_acl(user, password, all=True)]}
        if tls is not None:
            # use_ssl only for kazoo's log line: TlsHandler wraps the connections itself.
            security.update(handler=TlsHandler(tls), use_ssl=True)
        self._tls = tls
        self._client = KazooClient(
            hosts=hosts,
            timeout=session_timeout_s,
            connection_retry={"max_tries": -1, "delay": 0.1, "max_delay": 1.0},
            **security,
        )
        self._dispatch = CallbackDispatcher("vellum-zk-events")
        self._listeners: list[SessionListener] = []
        #: the ledger manager's lazy set-up and format(), which hold it across ZooKeeper round trips
        self._lock = threading.RLock()
        #: the session state (_lost, _closed, _listeners): never held across a round trip, since
        #: kazoo's connection thread takes it in _on_state before the connection serves requests
        self._session_lock = threading.Lock()
        self._lost = False
        #: registrations lost with a session and not yet re-created (retried at each connection)
        self._reregister_pending = False
        self._closed = False
        self._ledgers: ZkLedgerManager | None = None
        try:
            self._start(connect_timeout_s)
            self._check_access()
        except BaseException:
            self._client.stop()
            self._client.close()
            self._dispatch.close()
            raise
        self._idgen = ZkLedgerIdGenerator(self._client, self.root, self._op_retry_s)
        self._registration = ZkRegistrationManager(self._client, self.root, session_timeout_s)
        self._layout = ZkLayoutManager(self._client, self.root)
        self._kv = ZkKeyValueStore(self._client, self.root)
        self._ur = ZkUnderReplicationManager(self._client, self.root, self._dispatch, self._op_retry_s)
        self._client.add_listener(self._on_state)

    def _start(self, connect_timeout_s: float) -> None:
        """Establish the session within ``connect_timeout_s``; a TLS mismatch fails early."""
        tls_note = " over TLS" if self._tls is not None else ""
        try:
            connected = self._client.start_async()
            first = min(connect_timeout_s, _DIAGNOSE_AFTER_S)
            connected.wait(first)
            if not self._client.connected:
                problem = diagnose(self.hosts, self._tls)
                if problem is not None:
                    raise MetaStoreError(f"{problem} (metadata root {self.root})")
                connected.wait(max(0.0, connect_timeout_s - first))
        except (KazooException, OSError) as e:
            raise MetadataStoreUnavailableError(
                f"cannot reach ZooKeeper at {self.hosts}{tls_note} (metadata root {self.root}): {type(e).__name__}"
            ) from None
        if not self._client.connected:
            hint = ("; check that it serves TLS there (its secureClientPort) and zkTlsTrustStore"
                    if self._tls is not None else "")
            raise MetadataStoreUnavailableError(
                f"cannot reach ZooKeeper at {self.hosts}{tls_note} (metadata root {self.root}) within "
                f"{connect_timeout_s:g}s: KazooTimeoutError{hint}"
            )

    def _check_access(self) -> None:
        """Can this session read the root? Say which setting to fix if not; warn if a secured
        store finds it open to everyone (formatted before zkEnableSecurity was on)."""
        try:
            if self._client.exists(self.root) is None:
                return
            self._client.get_children(self.root)
            acls, _ = self._client.get_acls(self.root)
        except NoAuthError:
            if self._digest_user:
                raise MetaStoreError(
                    f"ZooKeeper refused the digest identity {self._digest_user!r} on {self.root} ({self.hosts}): "
                    "zkDigestAuthFile holds another identity than the one the cluster was formatted with"
                ) from None
            raise MetaStoreError(
                f"{self.root} on {self.hosts} is protected by ZooKeeper ACLs: set zkEnableSecurity=true and "
                "zkDigestAuthFile (the cluster's user:password)"
            ) from None
        except KazooException as e:
            raise MetadataStoreUnavailableError(f"cannot read {self.root} on {self.hosts}: {type(e).__name__}") from None
        if self._digest_user and any(a.id.scheme == "world" for a in acls):
            log.warning("zkEnableSecurity is on but %s on %s is open to every ZooKeeper client (formatted without "
                        "it?): restrict it, e.g. zkCli.sh setAcl -R %s digest:%s:<hash>:cdrwa", self.root,
                        self.hosts, self.root, self._digest_user)

    # -- session --------------------------------------------------------------------------

    @property
    def client(self) -> KazooClient:
        """The kazoo client (for tests and tools; the library uses the managers)."""
        return self._client

    @property
    def session_id(self) -> int:
        cid = self._client.client_id
        return int(cid[0]) if cid else 0

    def _on_state(self, state: str) -> None:
        # Runs on kazoo's connection thread: never block here (nor wait for a lock held across
        # a round trip: that request would wait for this connection, this connection for it).
        if state == KazooState.LOST:
            with self._session_lock:
                if self._closed:
                    return
                self._lost = True
                self._reregister_pending = True
            self._emit(SessionEvent.EXPIRED)
        elif state == KazooState.CONNECTED:
            with self._session_lock:
                if self._closed:
                    return
                renewed, self._lost = self._lost, False
                reregister = self._reregister_pending
            if reregister:
                # Round trips: on the dispatcher thread. A failed try (the connection dropped
                # again) is retried at the next connection, not left for the next session.
                self._dispatch.submit(self._reregister)
            if renewed:
                self._emit(SessionEvent.RECONNECTED)

    def _reregister(self) -> None:
        done = self._registration.reregister_all()
        with self._session_lock:
            if done and not self._lost:
                self._reregister_pending = False

    def _emit(self, event: SessionEvent) -> None:
        with self._session_lock:
            listeners = list(self._listeners)
        for fn in listeners:
            self._dispatch.submit(lambda fn=fn: fn(event))  # type: ignore[misc]

    def add_session_listener(self, listener: SessionListener) -> Callable[[], None]:
        with self._session_lock:
            self._listeners.append(listener)

        def remove() -> None:
            with self._session_lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return remove

    # -- managers -------------------------------------------------------------------------

    @property
    def ledgers(self) -> LedgerManager:
        with self._lock:
            if self._ledgers is None:
                layout = self._layout.read_layout()
                if layout is None:
                    raise MetaStoreError(
                        f"no ledger layout at {self._layout.path}: the cluster at {self.hosts} is not "
                        f"formatted (run `vellum shell metaformat --uri {self.uri}`)"
                    )
                if self._wanted_type is not None and layout.manager_type != self._wanted_type:
                    raise MetaStoreError(
                        f"{self.uri} asks for the {self._wanted_type} ledger manager but "
                        f"{self._layout.path} says {layout.manager_type} ({layout.factory_class})"
                    )
                self._ledgers = ZkLedgerManager(self._client, self.root, layout, self._idgen, self._op_retry_s)
            return self._ledgers

    @property
    def id_generator(self) -> LedgerIdGenerator:
        return self._idgen

    @property
    def registration(self) -> ZkRegistrationManager:
        return self._registration

    @property
    def layout(self) -> LayoutManager:
        return self._layout

    @property
    def kv(self) -> KeyValueStore:
        return self._kv

    @property
    def underreplication(self) -> ZkUnderReplicationManager:
        return self._ur

    def is_formatted(self) -> bool:
        return self._layout.read_layout() is not None

    def format(self, ledger_manager_type: str | None = None, *, force: bool = False) -> str:
        mtype = ledger_manager_type or self._wanted_type or "hierarchical"
        if self._wanted_type is not None and mtype != self._wanted_type:
            raise MetaStoreError(f"{self.uri} fixes the {self._wanted_type} ledger manager, not {mtype}")
        layout = LedgerLayout(mtype)
        instance_id = str(uuid.uuid4())
        with self._lock:
            try:
                if force:
                    self._client.delete(self.root, recursive=True)
                elif self._client.exists(self._layout.path) or self._client.exists(f"{self.root}/{P.INSTANCEID}"):
                    raise MetaStoreError(
                        f"{self.root} on {self.hosts} is already formatted; use --force to wipe it"
                    )
                for sub in (P.AVAILABLE, f"{P.AVAILABLE}/{P.READONLY}", P.COOKIES, P.IDGEN):
                    self._client.ensure_path(f"{self.root}/{sub}")
                tx = self._client.transaction()
                tx.create(self._layout.path, layout.serialize())
                tx.create(f"{self.root}/{P.INSTANCEID}", instance_id.encode())
                results = tx.commit()
            except NoNodeError:
                return self.format(mtype, force=force)  # root vanished under a concurrent wipe
            except TRANSIENT as e:
                unavailable(e, f"formatting {self.root}")
            if any(isinstance(r, Exception) for r in results):
                raise MetaStoreError(f"{self.root} on {self.hosts} was formatted concurrently: {results}")
            self._ledgers = None
            self._ur._ensured = False  # a wipe removed {root}/underreplication/LAYOUT
        return instance_id

    def close(self) -> None:
        with self._session_lock:
            if self._closed:
                return
            self._closed = True
        self._ur.close()
        try:
            self._client.stop()
            self._client.close()
        finally:
            self._dispatch.close()
