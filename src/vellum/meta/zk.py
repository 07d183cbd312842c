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

AutoRecovery, BookKeeper's layout (``ZkLedgerUnderreplicationManager``, ``ZkLedgerAuditorManager``;
encodings in ``meta/underreplication.py``), under ``{ur} = {root}/underreplication``:

    {ur}/LAYOUT                          text proto ``type: "BASIC"`` ``version: 1``
    {ur}/ledgers/%04x/%04x/%04x/%04x/urL%010d
                                         persistent: ledger marked under-replicated; the id's four
                                         16-bit groups in hex; data = text proto
                                         ``UnderreplicatedLedgerFormat`` (``replica: "host:port"``
                                         lines, ``ctime: <ms>``); empty levels pruned on delete
    {ur}/locks/urL%010d                  ephemeral: a worker re-replicates the ledger; data = text
                                         proto ``LockDataFormat`` (``bookieId: "<worker>"``)
    {ur}/disable                         exists = replication disabled (data empty)
    {ur}/lostBookieRecoveryDelay         seconds as decimal text
    {ur}/auditorelection                 data = the leader's ``AuditorVoteFormat`` (for tools)
    {ur}/auditorelection/V_%010d         ephemeral-sequential vote, text proto ``AuditorVoteFormat``
                                         (``bookieId: "host:port"``); the lowest sequence leads
    {ur}/checkallledgersctime            binary proto ``CheckAllLedgersFormat`` (field 1 = ms)
    {ur}/placementpolicycheckctime       binary proto ``PlacementPolicyCheckFormat``
    {ur}/replicascheckctime              binary proto ``ReplicasCheckFormat``

Invariants:
- versions are znode ``stat.version``; every CAS is a ``set``/``delete`` with that version, so
  ZooKeeper itself decides conflicts;
- one kazoo session per store; on session loss (``LOST``) listeners hear ``EXPIRED`` (a client
  must assume it may have been fenced); when kazoo has a new session the store re-creates its
  bookie registrations, then listeners hear ``RECONNECTED``;
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
- under-replication locks and auditor votes are ephemeral: they end with the session. A lost
  session ends leadership at once (``on_lost``); after a new session, or a reconnection (kazoo
  drops watches on a disconnection), every candidacy runs its election step again.

Size: about 1,600 lines because it is one driver implementing the six interfaces of ``meta.api``
(ledger manager ~290 lines with the lost-reply handling, under-replication ~480 plus the auditor
election ~105, registration ~165, key-value ~110, layout, id generator) over one kazoo session.
They share the session, its state listener, the retry budget and the error translation; each
class stays under 500 lines and is read on its own.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator
from pathlib import Path
from typing import Any, NoReturn

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    OperationTimeoutError,
    SessionExpiredError,
    SessionMovedError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import EventType, WatchedEvent, ZnodeStat
from kazoo.security import make_digest_acl

from vellum.errors import (
    ConfigError,
    IncorrectParameterError,
    LedgerExistsError,
    LedgerIdOverflowError,
    MetadataStoreUnavailableError,
    MetadataVersionError,
    MetaStoreError,
    NoSuchLedgerError,
)
from vellum.ids import BookieId, LedgerId
from vellum.meta import paths as P
from vellum.meta import underreplication as UR
from vellum.meta.api import (
    AuditorElection,
    BookiesWatcher,
    DelayWatcher,
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
    UnderReplicatedLedger,
    UnderReplicationManager,
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
from vellum.meta.underreplication import Candidacy
from vellum.meta.zk_tls import TlsHandler, ZkTls, diagnose

log = logging.getLogger(__name__)

_FLAT_PAGE = 10_000
_CREATE_RETRIES = 100
_RETRY_FIRST_DELAY_S = 0.01
_RETRY_MAX_DELAY_S = 1.0
_MAX_DOUBTFUL = 1024
#: a session not established after this long has its connection probed for a TLS mismatch
_DIAGNOSE_AFTER_S = 2.0


def _unavailable(e: Exception, what: str) -> NoReturn:
    raise MetadataStoreUnavailableError(f"ZooKeeper unavailable while {what}: {type(e).__name__}") from e


# Errors after which the request may or may not have been applied by the server: the reply was
# lost with the connection, or the session ended or moved while the request was in flight.
_TRANSIENT = (ConnectionLoss, SessionExpiredError, SessionMovedError, OperationTimeoutError, KazooTimeoutError)


class _Retry:
    """The retry budget of one operation whose replies may be lost.

    ``failed(e)`` counts an attempt of unknown outcome, then sleeps (10 ms doubling to 1 s) or,
    once the budget is spent or the store is closed, raises ``MetadataStoreUnavailableError``.
    """

    def __init__(self, budget_s: float, what: str) -> None:
        self._deadline = time.monotonic() + budget_s
        self._delay = _RETRY_FIRST_DELAY_S
        self._what = what
        self.unknown = 0  # attempts whose outcome is unknown

    def failed(self, e: Exception, advice: str = "") -> None:
        self.unknown += 1
        if isinstance(e, ConnectionClosedError) or time.monotonic() + self._delay > self._deadline:
            raise MetadataStoreUnavailableError(
                f"ZooKeeper unavailable while {self._what}: {type(e).__name__} "
                f"({self.unknown} attempt(s) without an answer){advice}"
            ) from e
        time.sleep(self._delay)
        self._delay = min(2 * self._delay, _RETRY_MAX_DELAY_S)


class _Flag(Watch):
    def __init__(self, on_cancel: Callable[[], None] | None = None) -> None:
        self.cancelled = False
        self._on_cancel = on_cancel

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            if self._on_cancel:
                self._on_cancel()


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
        retry = _Retry(self._retry_s, f"generating a ledger id under {self._dir}")
        path: str | None = None
        while path is None:
            try:
                if retry.unknown:
                    path = self._find(marker)
                if path is None:
                    path = self._client.create(
                        f"{self._dir}/{marker}", b"", ephemeral=True, sequence=True, makepath=True
                    )
            except _TRANSIENT as e:
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
        for _ in range(_CREATE_RETRIES):
            ledger_id = self._idgen.generate_ledger_id()
            try:
                return ledger_id, self._create(ledger_id, metadata, data, generated=True)
            except LedgerExistsError:
                continue  # an id taken by create_ledger_with_id; BookKeeper also just retries
        raise LedgerExistsError(f"{_CREATE_RETRIES} generated ledger ids in a row already existed under {self._root}")

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
        retry = _Retry(self._retry_s, f"creating ledger {ledger_id} at {path}")
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
            except _TRANSIENT as e:
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
            except _TRANSIENT:
                with self._lock:
                    self._doubtful.setdefault(lid, written)
        return adopted

    def read_ledger(self, ledger_id: LedgerId) -> Versioned[LedgerMetadata]:
        path = self.ledger_path(ledger_id)
        try:
            data, stat = self._client.get(path)
        except NoNodeError:
            raise NoSuchLedgerError(f"no ledger {ledger_id} (no znode {path})") from None
        except _TRANSIENT as e:
            _unavailable(e, f"reading {path}")
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
        except _TRANSIENT as e:
            _unavailable(e, f"writing {path}")
        return int(stat.version)

    def delete_ledger(self, ledger_id: LedgerId, expected_version: int | None = None) -> None:
        path = self.ledger_path(ledger_id)
        retry = _Retry(self._retry_s, f"deleting ledger {ledger_id} at {path}")
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
            except _TRANSIENT as e:
                retry.failed(e, f"; ledger {ledger_id} may already be deleted: deleting again is safe")

    def ledger_exists(self, ledger_id: LedgerId) -> bool:
        try:
            return self._client.exists(self.ledger_path(ledger_id)) is not None
        except _TRANSIENT as e:
            _unavailable(e, f"checking ledger {ledger_id}")

    def _children(self, path: str) -> list[str]:
        try:
            return sorted(self._client.get_children(path))
        except NoNodeError:
            return []  # removed while we walked: nothing under it any more
        except _TRANSIENT as e:
            _unavailable(e, f"listing {path}")

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
        flag = _Flag()
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
        except _TRANSIENT as e:
            _unavailable(e, f"watching {path}")
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
            except _TRANSIENT as e:
                _unavailable(e, f"registering at {path}")

    def _delete_own(self, path: str, session_id: int | None) -> None:
        try:
            _, stat = self._client.get(path)
            if stat.ephemeralOwner == session_id:
                self._client.delete(path, version=stat.version)
        except (NoNodeError, BadVersionError):
            pass

    def reregister_all(self) -> None:
        """After a new session: re-create every registration this store made."""
        with self._lock:
            for bookie_id, (read_only, data) in list(self._mine.items()):
                try:
                    self._create(bookie_id, read_only, data)
                except Exception:
                    log.exception("re-registering bookie %s failed", bookie_id)

    def unregister_bookie(self, bookie_id: BookieId) -> None:
        with self._lock:
            self._mine.pop(bookie_id, None)
            session_id = self._client.client_id[0] if self._client.client_id else None
            try:
                for ro in (False, True):
                    self._delete_own(self._path(bookie_id, ro), session_id)
            except _TRANSIENT as e:
                _unavailable(e, f"unregistering {bookie_id}")

    def list_bookies(self, *, read_only: bool = False) -> frozenset[BookieId]:
        path = self._readonly if read_only else self._available
        try:
            names = self._client.get_children(path)
        except NoNodeError:
            return frozenset()
        except _TRANSIENT as e:
            _unavailable(e, f"listing {path}")
        return frozenset(BookieId(n) for n in names if read_only or n != P.READONLY)

    def get_bookie_data(self, bookie_id: BookieId) -> bytes | None:
        for read_only in (False, True):
            path = self._path(bookie_id, read_only)
            try:
                data, _stat = self._client.get(path)
                return bytes(data)
            except NoNodeError:
                continue
            except _TRANSIENT as e:
                _unavailable(e, f"reading {path}")
        return None

    def watch_bookies(self, callback: BookiesWatcher, *, read_only: bool = False) -> Watch:
        path = self._readonly if read_only else self._available
        flag = _Flag()

        def on_children(children: list[str]) -> bool | None:
            if flag.cancelled:
                return False
            callback(frozenset(BookieId(n) for n in children if read_only or n != P.READONLY))
            return None

        try:
            self._client.ensure_path(path)
            self._client.ChildrenWatch(path, on_children)
        except _TRANSIENT as e:
            _unavailable(e, f"watching {path}")
        return flag

    def get_cookie(self, bookie_id: BookieId) -> Versioned[bytes] | None:
        path = f"{self._cookies}/{bookie_id}"
        try:
            data, stat = self._client.get(path)
        except NoNodeError:
            return None
        except _TRANSIENT as e:
            _unavailable(e, f"reading {path}")
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
        except _TRANSIENT as e:
            _unavailable(e, f"writing {path}")

    def remove_cookie(self, bookie_id: BookieId, expected_version: int | None = None) -> None:
        path = f"{self._cookies}/{bookie_id}"
        try:
            self._client.delete(path, version=-1 if expected_version is None else expected_version)
        except NoNodeError:
            pass
        except BadVersionError:
            raise MetadataVersionError(f"cookie {path} is not at version {expected_version}") from None
        except _TRANSIENT as e:
            _unavailable(e, f"deleting {path}")

    def get_instance_id(self) -> str | None:
        path = f"{self._root}/{P.INSTANCEID}"
        try:
            data, _ = self._client.get(path)
        except NoNodeError:
            return None
        except _TRANSIENT as e:
            _unavailable(e, f"reading {path}")
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
        except _TRANSIENT as e:
            _unavailable(e, f"reading {self.path}")
        return LedgerLayout.parse(data, where=f"znode {self.path}")

    def store_layout(self, layout: LedgerLayout) -> None:
        try:
            self._client.create(self.path, layout.serialize(), makepath=True)
        except NodeExistsError:
            raise MetadataVersionError(f"a layout already exists at {self.path}") from None
        except _TRANSIENT as e:
            _unavailable(e, f"writing {self.path}")

    def delete_layout(self) -> None:
        try:
            self._client.delete(self.path)
        except NoNodeError:
            pass
        except _TRANSIENT as e:
            _unavailable(e, f"deleting {self.path}")


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
        except _TRANSIENT as e:
            _unavailable(e, f"reading key {key!r}")
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
        except _TRANSIENT as e:
            _unavailable(e, f"creating key {key!r}")

    def cas(self, key: str, value: bytes, expected_version: int) -> int:
        path = self._path(key)
        try:
            data, stat = self._client.get(path)
            if not data.startswith(_KEY_MARK) or stat.version != expected_version:
                raise MetadataVersionError(f"key {key!r} ({path}) is not at version {expected_version}")
            return int(self._client.set(path, _KEY_MARK + value, version=expected_version).version)
        except (BadVersionError, NoNodeError):
            raise MetadataVersionError(f"key {key!r} ({path}) is not at version {expected_version}") from None
        except _TRANSIENT as e:
            _unavailable(e, f"writing key {key!r}")

    def delete(self, key: str, expected_version: int | None = None) -> bool:
        path = self._path(key)
        try:
            for _ in range(_CREATE_RETRIES):
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
        except _TRANSIENT as e:
            _unavailable(e, f"deleting key {key!r}")

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
        except _TRANSIENT as e:
            _unavailable(e, f"listing keys under {prefix!r}")
        # Keys are collected per subtree, then sorted, because '/' does not sort first.
        keys = sorted(k for k in found if start_after is None or k > start_after)
        return keys[:limit] if limit is not None else keys


class _ZkAuditorElection(Candidacy):
    """BookKeeper's ``ZkLedgerAuditorManager``: an EPHEMERAL_SEQUENTIAL ``V_`` vote; the lowest
    leads; every other candidate watches only its predecessor (no herd on a change), the leader
    watches its own vote (deleted under it: it runs again). Election steps run under ``_lock``,
    on the caller's thread at first, later on the store's dispatcher thread."""

    def __init__(
        self,
        manager: ZkUnderReplicationManager,
        bookie_id: BookieId,
        on_leader: Callable[[], None] | None,
        on_lost: Callable[[], None] | None,
    ) -> None:
        super().__init__(bookie_id, manager.current_auditor, on_leader, on_lost, manager._dispatch.submit)
        self._manager = manager
        self._client = manager._client
        self._dir = manager._election
        self._vote: str | None = None

    def run(self) -> None:
        """Vote (if this session has no vote) and see where the vote stands; arm one watch."""
        with self._lock:
            for _ in range(_CREATE_RETRIES):
                if self.state.closed:
                    return
                if self._vote is None or self._client.exists(self._vote) is None:
                    self.state.lost()  # a leader whose vote vanished (wiped root) is no longer one
                    self._vote = self._client.create(
                        f"{self._dir}/{P.VOTE_PREFIX}", UR.encode_bookie_id_record(self._bookie_id),
                        ephemeral=True, sequence=True, makepath=True,
                    )
                mine = self._vote.rsplit("/", 1)[1]
                votes = sorted(
                    (seq, name) for name in self._client.get_children(self._dir)
                    if (seq := P.parse_vote_seq(name)) is not None
                )
                names = [name for _, name in votes]
                if mine not in names:
                    self._vote = None
                    continue
                index = names.index(mine)
                if index == 0:
                    if self._client.exists(self._vote, watch=self._on_watch) is None:
                        continue
                    with contextlib.suppress(NoNodeError):
                        # BookKeeper's leader writes its vote on the election node too (for tools).
                        self._client.set(self._dir, UR.encode_bookie_id_record(self._bookie_id))
                    self.state.won()
                    return
                self.state.lost()
                if self._client.exists(f"{self._dir}/{names[index - 1]}", watch=self._on_watch) is not None:
                    return
            raise MetadataStoreUnavailableError(f"the auditor election under {self._dir} kept changing")

    def run_safely(self) -> None:
        try:
            self.run()
        except (KazooException, KazooTimeoutError, MetadataStoreUnavailableError) as e:
            # The next connection (a CONNECTED state) runs the election again.
            log.warning("auditor election step for %s failed: %s", self._bookie_id, e)

    def _on_watch(self, event: WatchedEvent) -> None:
        # Runs on kazoo's callback thread: hand the ZooKeeper round trips to the dispatcher.
        # Session and connection events (type NONE) are the manager's state listener's business.
        if event.type != EventType.NONE and not self.state.closed:
            self._manager._dispatch.submit(self.run_safely)

    def resign(self) -> None:
        if not self.state.close():
            return
        self._manager._forget(self)
        with self._lock:
            vote, self._vote = self._vote, None
        if vote is None:
            return
        retry = _Retry(self._manager._retry_s, f"withdrawing auditor vote {vote}")
        try:
            while True:
                try:
                    self._client.delete(vote)
                    return
                except NoNodeError:
                    return
                except _TRANSIENT as e:
                    retry.failed(e)
        except MetadataStoreUnavailableError as e:
            log.warning("%s; it vanishes when this session ends", e)


class ZkUnderReplicationManager(UnderReplicationManager):
    """BookKeeper's ``ZkLedgerUnderreplicationManager`` and ``ZkLedgerAuditorManager`` on one
    kazoo session (layout in the module docstring).

    Waiting (``wait_for_work``, ``wait_replication_enabled``) uses one-shot watches whose callback
    is one bound method that only bumps ``_gen`` under ``_cond``: kazoo keeps one registration per
    path for it, so repeated scans do not pile up watchers, and no thread is started. A scan
    records the generation it started from (per thread), so a change during the scan is never
    missed: either the scan read the new state or the watch it left fires.
    """

    def __init__(self, client: KazooClient, root: str, dispatch: CallbackDispatcher, retry_s: float) -> None:
        self._client = client
        self._dispatch = dispatch
        self._retry_s = retry_s
        self._base = f"{root}/{P.UNDERREPLICATION}"
        self._ledgers = f"{self._base}/{P.UR_LEDGERS}"
        self._locks = f"{self._base}/{P.UR_LOCKS}"
        self._layout = f"{self._base}/{P.UR_LAYOUT}"
        self._disable = f"{self._base}/{P.UR_DISABLE}"
        self._delay = f"{self._base}/{P.UR_LOST_BOOKIE_RECOVERY_DELAY}"
        self._election = f"{self._base}/{P.UR_AUDITOR_ELECTION}"
        self._cond = threading.Condition()
        self._gen = 0
        self._seen = threading.local()
        self._lock = threading.Lock()
        self._held: dict[int, int] = {}  # ledger id -> record version when this session locked it
        self._stray: set[int] = set()
        self._elections: set[_ZkAuditorElection] = set()
        self._ensured = False
        self._closed = False
        client.add_listener(self._on_state)

    # -- plumbing -------------------------------------------------------------------------

    def _on_event(self, _event: object = None) -> None:
        with self._cond:
            self._gen += 1
            self._cond.notify_all()

    def _on_state(self, state: str) -> None:
        # kazoo's connection thread: never block. Watches do not survive a disconnection in
        # kazoo (they fire with type NONE), so elections re-arm theirs once connected again.
        if self._closed:
            return
        with self._lock:
            elections = list(self._elections)
        if state == KazooState.LOST:
            for e in elections:
                e.state.lost()  # the vote died with the session
        elif state == KazooState.CONNECTED:
            for e in elections:
                self._dispatch.submit(e.run_safely)
        self._on_event()

    def _wait_gen(self, gen: int, deadline: float) -> bool:
        """Wait until the generation moves past ``gen``; False on timeout or close."""
        with self._cond:
            while self._gen == gen and not self._closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return not self._closed

    def _session(self) -> int | None:
        cid = self._client.client_id
        return int(cid[0]) if cid else None

    def _ensure(self) -> None:
        """BookKeeper's ``checkLayout``: the base, ``ledgers``, ``locks`` and a ``BASIC:1`` LAYOUT."""
        if self._ensured:
            return
        try:
            self._client.ensure_path(self._ledgers)
            self._client.ensure_path(self._locks)
            try:
                self._client.create(self._layout, UR.encode_layout())
            except NodeExistsError:
                data, _ = self._client.get(self._layout)
                UR.check_layout(data, where=f"znode {self._layout}")
        except _TRANSIENT as e:
            _unavailable(e, f"initialising {self._base}")
        self._ensured = True

    def _put(self, path: str, data: bytes) -> None:
        try:
            for _ in range(_CREATE_RETRIES):
                try:
                    self._client.set(path, data)
                    return
                except NoNodeError:
                    pass
                try:
                    self._client.create(path, data, makepath=True)
                    return
                except NodeExistsError:
                    continue
        except _TRANSIENT as e:
            _unavailable(e, f"writing {path}")
        raise MetadataStoreUnavailableError(f"{path} kept appearing and vanishing")

    def _get(self, path: str) -> bytes | None:
        try:
            data, _ = self._client.get(path)
            return bytes(data)
        except NoNodeError:
            return None
        except _TRANSIENT as e:
            _unavailable(e, f"reading {path}")

    # -- records --------------------------------------------------------------------------

    def _read(self, ledger_id: int) -> UnderReplicatedLedger | None:
        path = P.ur_ledger_path(self._ledgers, ledger_id)
        try:
            data, stat = self._client.get(path)
        except NoNodeError:
            return None
        except _TRANSIENT as e:
            _unavailable(e, f"reading {path}")
        replicas, ctime = UR.decode_under_replicated(data, where=f"znode {path}")
        return UnderReplicatedLedger(LedgerId(ledger_id), tuple(BookieId(r) for r in replicas), ctime, stat.version)

    def mark_under_replicated(self, ledger_id: LedgerId, missing_replicas: Iterable[str]) -> None:
        path = P.ur_ledger_path(self._ledgers, ledger_id)
        missing = [str(r) for r in missing_replicas]
        self._ensure()
        # Idempotent, so a lost reply is simply retried (a retry finds its own write and stops).
        retry = _Retry(self._retry_s, f"marking ledger {ledger_id} under-replicated at {path}")
        for _ in range(_CREATE_RETRIES):
            try:
                try:
                    data, stat = self._client.get(path)
                except NoNodeError:
                    try:
                        self._client.create(path, UR.encode_under_replicated(missing, UR.now_ms()), makepath=True)
                        return
                    except (NodeExistsError, NoNodeError):
                        continue  # marked meanwhile, or a parent was pruned meanwhile
                replicas, _ = UR.decode_under_replicated(data, where=f"znode {path}")
                merged = UR.merge_replicas(replicas, missing)
                if merged is None:
                    return
                try:
                    self._client.set(path, UR.encode_under_replicated(merged, UR.now_ms()), version=stat.version)
                    return
                except (BadVersionError, NoNodeError):
                    continue
            except _TRANSIENT as e:
                retry.failed(e)
        raise MetadataStoreUnavailableError(f"under-replicated record {path} kept changing")

    def get_under_replicated(self, ledger_id: LedgerId) -> UnderReplicatedLedger | None:
        return self._read(ledger_id)

    def _children(self, path: str, watch: bool) -> list[str]:
        try:
            return list(self._client.get_children(path, watch=self._on_event if watch else None))
        except NoNodeError:
            return []
        except _TRANSIENT as e:
            _unavailable(e, f"listing {path}")

    def _walk(self, *, watch: bool = False, shuffle: bool = False) -> Iterator[int]:
        """Ids of the records, ascending (leaf by leaf; shuffled within a leaf if asked)."""

        def walk(path: str, depth: int) -> Iterator[int]:
            names = self._children(path, watch)
            if depth < 4:
                for name in sorted(n for n in names if P.is_ur_level_name(n)):
                    yield from walk(f"{path}/{name}", depth + 1)
                return
            ids = sorted(
                i for i in map(P.parse_ur_name, names)
                if i is not None and P.ur_ledger_parent(self._ledgers, i) == path
            )
            if shuffle:
                random.shuffle(ids)  # BookKeeper's spread of concurrent workers over a leaf
            yield from ids

        yield from walk(self._ledgers, 0)

    def list_under_replicated(self) -> Iterator[UnderReplicatedLedger]:
        for ledger_id in self._walk():
            record = self._read(ledger_id)
            if record is not None:
                yield record

    # -- locks ----------------------------------------------------------------------------

    def acquire_ledger_to_rereplicate(
        self, exclude: Collection[int] = (), *, worker_id: str | None = None
    ) -> LedgerId | None:
        self._ensure()
        self._release_stray()
        excluded = set(exclude)
        data = UR.encode_bookie_id_record(socket.gethostname() if worker_id is None else worker_id)
        with self._cond:
            self._seen.gen = self._gen
        try:
            if self._client.exists(self._disable, watch=self._on_event) is not None:
                return None
        except _TRANSIENT as e:
            _unavailable(e, f"checking {self._disable}")
        locked = set(self._children(self._locks, watch=True))
        for ledger_id in self._walk(watch=True, shuffle=True):
            if ledger_id in excluded or P.ur_lock_path(self._locks, ledger_id).rsplit("/", 1)[1] in locked:
                continue
            if not self._take_lock(ledger_id, data):
                continue
            path = P.ur_ledger_path(self._ledgers, ledger_id)
            retry = _Retry(self._retry_s, f"reading {path} after locking it")
            while True:
                try:
                    stat = self._client.exists(path)
                    break
                except _TRANSIENT as e:
                    try:
                        retry.failed(e)
                    except MetadataStoreUnavailableError:
                        with self._lock:
                            self._stray.add(ledger_id)  # nobody knows we hold it: release it later
                        raise
            if stat is None:  # replicated and removed between the listing and the lock
                self.release_ledger(LedgerId(ledger_id))
                continue
            self._held_version(ledger_id, stat.version)
            return LedgerId(ledger_id)
        return None

    def _release_stray(self) -> None:
        """Release locks an acquire took but could not hand out (its store became unavailable)."""
        with self._lock:
            stray, self._stray = self._stray, set()
        for ledger_id in stray:
            try:
                self.release_ledger(LedgerId(ledger_id))
            except MetadataStoreUnavailableError:
                with self._lock:
                    self._stray.add(ledger_id)
                raise

    def _held_version(self, ledger_id: int, version: int | None) -> None:
        with self._lock:
            if version is None:
                self._held.pop(ledger_id, None)
            else:
                self._held[ledger_id] = version

    def _take_lock(self, ledger_id: int, data: bytes) -> bool:
        path = P.ur_lock_path(self._locks, ledger_id)
        retry = _Retry(self._retry_s, f"locking ledger {ledger_id} at {path}")
        while True:
            try:
                try:
                    self._client.create(path, data, ephemeral=True, makepath=True)
                    return True
                except NodeExistsError:
                    if not retry.unknown:
                        return False
                    # After a lost reply the node may be this session's own.
                    _, stat = self._client.get(path)
                    return bool(stat.ephemeralOwner == self._session())
                except NoNodeError:
                    continue  # the lock was released between create and get
            except _TRANSIENT as e:
                retry.failed(e)

    def wait_for_work(self, timeout_s: float) -> bool:
        seen = getattr(self._seen, "gen", None)
        if seen is None:
            return True
        return self._wait_gen(seen, time.monotonic() + timeout_s)

    def release_ledger(self, ledger_id: LedgerId) -> None:
        self._held_version(ledger_id, None)
        path = P.ur_lock_path(self._locks, ledger_id)
        try:
            _, stat = self._client.get(path)
            if stat.ephemeralOwner == self._session():
                self._client.delete(path, version=stat.version)
        except (NoNodeError, BadVersionError):
            pass
        except _TRANSIENT as e:
            _unavailable(e, f"releasing {path}")

    def mark_replicated(self, ledger_id: LedgerId, expected_version: int | None = None) -> bool:
        path = P.ur_ledger_path(self._ledgers, ledger_id)
        with self._lock:
            version = self._held.get(ledger_id) if expected_version is None else expected_version
        deleted = False
        try:
            try:
                self._client.delete(path, version=-1 if version is None else version)
                deleted = True
            except NoNodeError:
                pass
            except BadVersionError:
                pass  # marked again meanwhile (another bookie lost): the record stays for a new check
            if deleted:
                self._prune(path)
        except _TRANSIENT as e:
            _unavailable(e, f"deleting {path}")
        self.release_ledger(ledger_id)
        return deleted

    def _prune(self, path: str) -> None:
        """Remove the record's now empty hex directories, as BookKeeper does (best effort)."""
        for _ in range(4):
            path = path.rsplit("/", 1)[0]
            try:
                self._client.delete(path)
            except NotEmptyError:
                return
            except NoNodeError:
                continue

    def is_locked(self, ledger_id: LedgerId) -> bool:
        path = P.ur_lock_path(self._locks, ledger_id)
        try:
            return self._client.exists(path) is not None
        except _TRANSIENT as e:
            _unavailable(e, f"checking {path}")

    def lock_owner(self, ledger_id: LedgerId) -> str | None:
        path = P.ur_lock_path(self._locks, ledger_id)
        data = self._get(path)
        return None if data is None else UR.decode_bookie_id_record(data, where=f"znode {path}")

    # -- switch, delay, timestamps --------------------------------------------------------

    def disable_replication(self) -> None:
        try:
            self._client.create(self._disable, b"", makepath=True)
        except NodeExistsError:
            pass
        except _TRANSIENT as e:
            _unavailable(e, f"creating {self._disable}")

    def enable_replication(self) -> None:
        try:
            self._client.delete(self._disable)
        except NoNodeError:
            pass
        except _TRANSIENT as e:
            _unavailable(e, f"deleting {self._disable}")

    def is_replication_enabled(self) -> bool:
        try:
            return self._client.exists(self._disable) is None
        except _TRANSIENT as e:
            _unavailable(e, f"checking {self._disable}")

    def wait_replication_enabled(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            with self._cond:
                gen = self._gen
            try:
                if self._client.exists(self._disable, watch=self._on_event) is None:
                    return True
            except _TRANSIENT as e:
                _unavailable(e, f"checking {self._disable}")
            if not self._wait_gen(gen, deadline):
                return False

    def get_lost_bookie_recovery_delay(self) -> int | None:
        data = self._get(self._delay)
        return None if data is None else UR.decode_delay(data, where=f"znode {self._delay}")

    def set_lost_bookie_recovery_delay(self, seconds: int) -> None:
        if seconds < 0:
            raise IncorrectParameterError(f"lost bookie recovery delay must be >= 0 s, got {seconds}")
        self._put(self._delay, UR.encode_delay(seconds))

    def watch_lost_bookie_recovery_delay(self, callback: DelayWatcher) -> Watch:
        flag = _Flag()
        where = f"znode {self._delay}"

        def on_change(data: bytes | None, stat: ZnodeStat | None, *_: Any) -> bool | None:
            if flag.cancelled:
                return False
            if data is None or stat is None:
                callback(None)
                return None
            try:
                value = UR.decode_delay(data, where=where)
            except MetaStoreError:
                log.exception("unreadable lost bookie recovery delay")
                return None
            callback(value)
            return None

        try:
            self._client.DataWatch(self._delay, on_change)
        except _TRANSIENT as e:
            _unavailable(e, f"watching {self._delay}")
        return flag

    def _get_ctime(self, name: str) -> int | None:
        path = f"{self._base}/{name}"
        data = self._get(path)
        return None if data is None else UR.decode_ctime(data, where=f"znode {path}")

    def get_check_all_ledgers_ctime(self) -> int | None:
        return self._get_ctime(P.UR_CHECK_ALL_LEDGERS_CTIME)

    def set_check_all_ledgers_ctime(self, ctime_ms: int) -> None:
        self._put(f"{self._base}/{P.UR_CHECK_ALL_LEDGERS_CTIME}", UR.encode_ctime(ctime_ms))

    def get_placement_policy_check_ctime(self) -> int | None:
        return self._get_ctime(P.UR_PLACEMENT_POLICY_CHECK_CTIME)

    def set_placement_policy_check_ctime(self, ctime_ms: int) -> None:
        self._put(f"{self._base}/{P.UR_PLACEMENT_POLICY_CHECK_CTIME}", UR.encode_ctime(ctime_ms))

    def get_replicas_check_ctime(self) -> int | None:
        return self._get_ctime(P.UR_REPLICAS_CHECK_CTIME)

    def set_replicas_check_ctime(self, ctime_ms: int) -> None:
        self._put(f"{self._base}/{P.UR_REPLICAS_CHECK_CTIME}", UR.encode_ctime(ctime_ms))

    # -- auditor election -----------------------------------------------------------------

    def elect_auditor(
        self,
        bookie_id: BookieId,
        on_leader: Callable[[], None] | None = None,
        *,
        on_lost: Callable[[], None] | None = None,
    ) -> AuditorElection:
        election = _ZkAuditorElection(self, bookie_id, on_leader, on_lost)
        with self._lock:
            if self._closed:
                raise MetaStoreError("the metadata store is closed")
            self._elections.add(election)
        try:
            election.run()
        except BaseException as e:
            election.resign()
            if isinstance(e, _TRANSIENT):
                _unavailable(e, f"running for auditor under {self._election}")
            raise
        return election

    def _forget(self, election: _ZkAuditorElection) -> None:
        with self._lock:
            self._elections.discard(election)

    def current_auditor(self) -> BookieId | None:
        try:
            for _ in range(_CREATE_RETRIES):
                try:
                    names = self._client.get_children(self._election)
                except NoNodeError:
                    return None
                votes = sorted((seq, n) for n in names if (seq := P.parse_vote_seq(n)) is not None)
                if not votes:
                    return None
                path = f"{self._election}/{votes[0][1]}"
                try:
                    data, _ = self._client.get(path)
                except NoNodeError:
                    continue  # the leader left between the listing and the read
                return BookieId(UR.decode_bookie_id_record(data, where=f"znode {path}"))
        except _TRANSIENT as e:
            _unavailable(e, f"reading {self._election}")
        raise MetadataStoreUnavailableError(f"the auditor election under {self._election} kept changing")

    def close(self) -> None:
        """Before the session ends: no callback runs after this, waiters return."""
        with self._lock:
            self._closed = True
            elections, self._elections = list(self._elections), set()
        for e in elections:
            e.state.close()
        self._client.remove_listener(self._on_state)
        with self._cond:
            self._cond.notify_all()


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
        self._lock = threading.RLock()
        self._lost = False
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
        # Runs on kazoo's connection thread: never block here.
        if state == KazooState.LOST:
            with self._lock:
                if self._closed:
                    return
                self._lost = True
            self._emit(SessionEvent.EXPIRED)
        elif state == KazooState.CONNECTED:
            with self._lock:
                if not self._lost or self._closed:
                    return
                self._lost = False
            # Re-registering needs ZooKeeper round trips: do it on the dispatcher thread.
            self._dispatch.submit(self._registration.reregister_all)
            self._emit(SessionEvent.RECONNECTED)

    def _emit(self, event: SessionEvent) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for fn in listeners:
            self._dispatch.submit(lambda fn=fn: fn(event))  # type: ignore[misc]

    def add_session_listener(self, listener: SessionListener) -> Callable[[], None]:
        with self._lock:
            self._listeners.append(listener)

        def remove() -> None:
            with self._lock:
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
            except _TRANSIENT as e:
                _unavailable(e, f"formatting {self.root}")
            if any(isinstance(r, Exception) for r in results):
                raise MetaStoreError(f"{self.root} on {self.hosts} was formatted concurrently: {results}")
            self._ledgers = None
            self._ur._ensured = False  # a wipe removed {root}/underreplication/LAYOUT
        return instance_id

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._ur.close()
        try:
            self._client.stop()
            self._client.close()
        finally:
            self._dispatch.close()
