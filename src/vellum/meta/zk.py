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

Parts: this module holds the session (``ZkMetadataStore``) and the bookie registrations; the
ledger ids and ledger znodes are ``meta/zk_ledgers.py``, the layout record and the key-value
area ``meta/zk_kv.py``, all on this store's session.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
)
from kazoo.security import make_digest_acl

from vellum.errors import (
    ConfigError,
    MetadataStoreUnavailableError,
    MetadataVersionError,
    MetaStoreError,
)
from vellum.ids import BookieId
from vellum.meta import paths as P
from vellum.meta.api import (
    BookiesWatcher,
    KeyValueStore,
    LayoutManager,
    LedgerIdGenerator,
    LedgerManager,
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
)
from vellum.meta.zk_common import TRANSIENT, Flag, read_znode, unavailable
from vellum.meta.zk_kv import ZkKeyValueStore, ZkLayoutManager
from vellum.meta.zk_ledgers import ZkLedgerIdGenerator, ZkLedgerManager
from vellum.meta.zk_tls import TlsHandler, ZkTls, diagnose
from vellum.meta.zk_underreplication import ZkUnderReplicationManager

log = logging.getLogger(__name__)

#: a session not established after this long has its connection probed for a TLS mismatch
_DIAGNOSE_AFTER_S = 2.0


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
        found = read_znode(self._client, f"{self._cookies}/{bookie_id}")
        return None if found is None else Versioned(found[0], found[1].version)

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
        found = read_znode(self._client, path)
        if found is None:
            return None
        data = found[0]
        try:
            return bytes(data).decode("ascii").strip()
        except UnicodeDecodeError:
            raise MetaStoreError(f"{path}: instance id is not text: {bytes(data)[:40]!r}") from None


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
