"""AutoRecovery's records on ZooKeeper: under-replicated ledgers, their locks, the switch, the
delay and the auditor election, on the session of a ``ZkMetadataStore`` (``meta/zk.py``).

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

Under-replication locks and auditor votes are ephemeral: they end with the session. A lost
session ends leadership at once (``on_lost``); after a new session, or a reconnection (kazoo
drops watches on a disconnection), every candidacy runs its election step again.
"""

from __future__ import annotations

import contextlib
import logging
import random
import socket
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError, NotEmptyError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import EventType, WatchedEvent, ZnodeStat

from vellum.errors import IncorrectParameterError, MetadataStoreUnavailableError, MetaStoreError
from vellum.ids import BookieId, LedgerId
from vellum.meta import paths as P
from vellum.meta import underreplication as UR
from vellum.meta.api import (
    AuditorElection,
    DelayWatcher,
    UnderReplicatedLedger,
    UnderReplicationManager,
    Watch,
)
from vellum.meta.dispatch import CallbackDispatcher
from vellum.meta.underreplication import Candidacy
from vellum.meta.zk_common import (
    CREATE_RETRIES,
    TRANSIENT,
    Flag,
    Retry,
    delete_znode,
    read_znode,
    unavailable,
)

log = logging.getLogger(__name__)


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
            for _ in range(CREATE_RETRIES):
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
        retry = Retry(self._manager._retry_s, f"withdrawing auditor vote {vote}")
        try:
            while True:
                try:
                    self._client.delete(vote)
                    return
                except NoNodeError:
                    return
                except TRANSIENT as e:
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
        except TRANSIENT as e:
            unavailable(e, f"initialising {self._base}")
        self._ensured = True

    def _put(self, path: str, data: bytes) -> None:
        try:
            for _ in range(CREATE_RETRIES):
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
        except TRANSIENT as e:
            unavailable(e, f"writing {path}")
        raise MetadataStoreUnavailableError(f"{path} kept appearing and vanishing")

    def _get(self, path: str) -> bytes | None:
        found = read_znode(self._client, path)
        return None if found is None else found[0]

    # -- records --------------------------------------------------------------------------

    def _read(self, ledger_id: int) -> UnderReplicatedLedger | None:
        path = P.ur_ledger_path(self._ledgers, ledger_id)
        found = read_znode(self._client, path)
        if found is None:
            return None
        data, stat = found
        replicas, ctime = UR.decode_under_replicated(data, where=f"znode {path}")
        return UnderReplicatedLedger(LedgerId(ledger_id), tuple(BookieId(r) for r in replicas), ctime, stat.version)

    def mark_under_replicated(self, ledger_id: LedgerId, missing_replicas: Iterable[str]) -> None:
        path = P.ur_ledger_path(self._ledgers, ledger_id)
        missing = [str(r) for r in missing_replicas]
        self._ensure()
        # Idempotent, so a lost reply is simply retried (a retry finds its own write and stops).
        retry = Retry(self._retry_s, f"marking ledger {ledger_id} under-replicated at {path}")
        for _ in range(CREATE_RETRIES):
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
            except TRANSIENT as e:
                retry.failed(e)
        raise MetadataStoreUnavailableError(f"under-replicated record {path} kept changing")

    def get_under_replicated(self, ledger_id: LedgerId) -> UnderReplicatedLedger | None:
        return self._read(ledger_id)

    def _children(self, path: str, watch: bool) -> list[str]:
        try:
            return list(self._client.get_children(path, watch=self._on_event if watch else None))
        except NoNodeError:
            return []
        except TRANSIENT as e:
            unavailable(e, f"listing {path}")

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
        except TRANSIENT as e:
            unavailable(e, f"checking {self._disable}")
        locked = set(self._children(self._locks, watch=True))
        for ledger_id in self._walk(watch=True, shuffle=True):
            if ledger_id in excluded or P.ur_lock_path(self._locks, ledger_id).rsplit("/", 1)[1] in locked:
                continue
            if not self._take_lock(ledger_id, data):
                continue
            path = P.ur_ledger_path(self._ledgers, ledger_id)
            retry = Retry(self._retry_s, f"reading {path} after locking it")
            while True:
                try:
                    stat = self._client.exists(path)
                    break
                except TRANSIENT as e:
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
        retry = Retry(self._retry_s, f"locking ledger {ledger_id} at {path}")
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
            except TRANSIENT as e:
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
        except TRANSIENT as e:
            unavailable(e, f"releasing {path}")

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
        except TRANSIENT as e:
            unavailable(e, f"deleting {path}")
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
        except TRANSIENT as e:
            unavailable(e, f"checking {path}")

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
        except TRANSIENT as e:
            unavailable(e, f"creating {self._disable}")

    def enable_replication(self) -> None:
        delete_znode(self._client, self._disable)

    def is_replication_enabled(self) -> bool:
        try:
            return self._client.exists(self._disable) is None
        except TRANSIENT as e:
            unavailable(e, f"checking {self._disable}")

    def wait_replication_enabled(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            with self._cond:
                gen = self._gen
            try:
                if self._client.exists(self._disable, watch=self._on_event) is None:
                    return True
            except TRANSIENT as e:
                unavailable(e, f"checking {self._disable}")
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
        flag = Flag()
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
        except TRANSIENT as e:
            unavailable(e, f"watching {self._delay}")
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
            if isinstance(e, TRANSIENT):
                unavailable(e, f"running for auditor under {self._election}")
            raise
        return election

    def _forget(self, election: _ZkAuditorElection) -> None:
        with self._lock:
            self._elections.discard(election)

    def current_auditor(self) -> BookieId | None:
        try:
            for _ in range(CREATE_RETRIES):
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
        except TRANSIENT as e:
            unavailable(e, f"reading {self._election}")
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
