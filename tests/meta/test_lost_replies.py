"""Ledger create/delete while ZooKeeper replies are lost (defect D4 of docs/correctness.md; BookKeeper BK#1967).

``_Lossy`` wraps one store's kazoo client on a real ZooKeeper: a request either reaches the
server and its reply is lost (the create/delete really happens, the call raises ConnectionLoss,
as when the connection drops with the request in flight) or is lost itself (nothing happens,
ConnectionLoss). The caller below retries what it is told is retryable, as applications do.
What must hold: every create is exactly once from the caller's view (each id it got exists with
its metadata, no ledger exists that nobody got an id for, no error reaches it while retries
can settle the doubt) and a delete whose reply was lost reports success.
"""

from __future__ import annotations

import dataclasses
import random
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss
from meta_testkit import wait_until  # type: ignore[import-not-found]

from vellum.errors import LedgerExistsError, MetadataStoreUnavailableError
from vellum.ids import BookieId, LedgerId
from vellum.meta import LedgerMetadata, Versioned, open_metadata_store
from vellum.meta.zk import ZkLedgerManager, ZkMetadataStore
from vellum.testing.zookeeper import ZooKeeperServer

MD = LedgerMetadata(
    ensemble_size=2, write_quorum_size=2, ack_quorum_size=1,
    ensembles={0: (BookieId("b1:3181"), BookieId("b2:3181"))}, password=b"pw",
)


class _Lossy:
    """Loses replies (and some requests) of ``create``/``delete`` on paths under ``root``.

    ``policy(kind, path)`` decides per call: "reply" (apply, then raise), "request" (raise
    without applying) or None. The default loses at random (seeded), at most ``max_in_a_row``
    times in a row per path, so a retrying driver gets through.
    """

    def __init__(self, client: KazooClient, root: str, *, seed: int = 12, max_in_a_row: int = 3) -> None:
        self.client = client
        self.root = root
        self.rng = random.Random(seed)
        self.max_in_a_row = max_in_a_row
        self.in_a_row: dict[str, int] = {}
        self.lost = {"create": 0, "delete": 0}
        self.lost_replies_by_path: dict[str, int] = {}
        self.real_create = client.create
        self.real_delete = client.delete
        self.policy: Callable[[str, str], str | None] = self._random

    def _random(self, kind: str, path: str) -> str | None:
        key = path.rsplit("-", 1)[0] if "/idgen/" in path else path  # one idgen call = one marker
        if self.in_a_row.get(key, 0) >= self.max_in_a_row:
            self.in_a_row[key] = 0
            return None
        choice = self.rng.choices(["reply", "request", None], weights=[5, 1, 4])[0]
        self.in_a_row[key] = self.in_a_row.get(key, 0) + 1 if choice else 0
        return choice

    def _wrap(self, kind: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(path: str, *args: Any, **kwargs: Any) -> Any:
            what = self.policy(kind, path) if path.startswith(self.root + "/") else None
            if what == "request":
                self.lost[kind] += 1
                raise ConnectionLoss()
            try:
                return real(path, *args, **kwargs)
            finally:
                if what == "reply":  # whatever the answer was (done, NodeExists, NoNode): lost
                    self.lost[kind] += 1
                    self.lost_replies_by_path[path] = self.lost_replies_by_path.get(path, 0) + 1
                    raise ConnectionLoss()  # replaces the answer, or the exception it was

        return call

    def __enter__(self) -> _Lossy:
        # Instance attributes shadow KazooClient's methods for this client only.
        self.client.create = self._wrap("create", self.real_create)  # type: ignore[method-assign]
        self.client.delete = self._wrap("delete", self.real_delete)  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        del self.client.create
        del self.client.delete


def _lose_first_reply(kind: str, match: Callable[[str], bool]) -> Callable[[str, str], str | None]:
    """A policy: lose the reply of the first ``kind`` call on each matching path, no more."""
    seen: set[str] = set()

    def policy(k: str, path: str) -> str | None:
        if k != kind or not match(path) or path in seen:
            return None
        seen.add(path)
        return "reply"

    return policy


@pytest.fixture(params=["zk+flat", "zk+hierarchical"])
def zk_store(request: pytest.FixtureRequest, zk_server: ZooKeeperServer) -> Iterator[ZkMetadataStore]:
    store = open_metadata_store(zk_server.uri(str(request.param), f"/lost-{uuid.uuid4().hex[:10]}/ledgers"))
    assert isinstance(store, ZkMetadataStore)
    store.format()
    yield store
    store.close()


def _idgen_children(store: ZkMetadataStore) -> list[str]:
    return list(store.client.get_children(f"{store.root}/idgen"))


@pytest.mark.parametrize("token", ["creator-token", "no-token"])
def test_50_creates_with_lost_replies_leave_no_orphans(zk_store: ZkMetadataStore, token: str) -> None:
    rng = random.Random(4)
    wanted = [
        dataclasses.replace(
            MD,
            custom_metadata={"n": str(i).encode()},
            creator_token=rng.getrandbits(56) if token == "creator-token" else 0,
        )
        for i in range(50)
    ]
    got: list[tuple[LedgerId, int, LedgerMetadata]] = []
    errors_seen = 0
    with _Lossy(zk_store.client, zk_store.root) as lossy:
        for md in wanted:
            while True:  # the caller retries what it is told is retryable
                try:
                    lid, version = zk_store.ledgers.create_ledger(md)
                    break
                except MetadataStoreUnavailableError:
                    errors_seen += 1
            got.append((lid, version, md))
    assert lossy.lost["create"] >= 30, "the injection did not lose enough replies to test anything"
    assert any("/idgen/" in p for p in lossy.lost_replies_by_path), "no id-generator reply was lost"

    ids = [lid for lid, _, _ in got]
    stored = set(zk_store.ledgers.iter_ledger_ids())
    orphans = sorted(stored - set(ids))
    assert not orphans, f"{len(orphans)} ledgers exist that no caller got an id for: {orphans}"
    assert len(set(ids)) == 50 and stored == set(ids)
    for lid, version, md in got:
        assert zk_store.ledgers.read_ledger(lid) == Versioned(md, version)
    assert errors_seen == 0, f"{errors_seen} lost replies reached the caller as errors"
    # Id-generator nodes whose replies were lost were found again and removed (asynchronously).
    wait_until(lambda: _idgen_children(zk_store) == [], timeout_s=10, what="idgen nodes removed")


def test_delete_with_lost_reply_reports_success(zk_store: ZkMetadataStore) -> None:
    lm = zk_store.ledgers
    lid, _ = lm.create_ledger(MD)
    lid2, version2 = lm.create_ledger(MD)
    with _Lossy(zk_store.client, zk_store.root) as lossy:
        lossy.policy = _lose_first_reply("delete", lambda path: True)
        lm.delete_ledger(lid)  # really deleted, reply lost, the retry finds nothing: success
        lm.delete_ledger(lid2, version2)  # a versioned delete too
    assert lossy.lost["delete"] >= 2
    assert not lm.ledger_exists(lid) and not lm.ledger_exists(lid2)
    lm.delete_ledger(lid)  # and a plain repeat stays a success (meta.api: absent is fine)


def test_create_with_id_after_lost_reply_is_its_own_not_a_conflict(zk_store: ZkMetadataStore) -> None:
    lm = zk_store.ledgers
    assert isinstance(lm, ZkLedgerManager)
    mine = dataclasses.replace(MD, creator_token=0xC0FFEE)
    with _Lossy(zk_store.client, zk_store.root) as lossy:
        lossy.policy = _lose_first_reply("create", lambda path: path == lm.ledger_path(42))
        assert lm.create_ledger_with_id(LedgerId(42), mine) == 0
        assert lossy.lost["create"] >= 1
    assert lm.read_ledger(LedgerId(42)) == Versioned(mine, 0)
    # a real conflict is still one: another creator token, or token-less metadata
    with pytest.raises(LedgerExistsError, match="another creator"):
        lm.create_ledger_with_id(LedgerId(42), dataclasses.replace(MD, creator_token=0xBAD))
    with pytest.raises(LedgerExistsError):
        lm.create_ledger_with_id(LedgerId(42), MD)


@pytest.mark.parametrize("retry", ["same-metadata", "new-metadata"])
def test_create_whose_doubt_outlasts_the_budget_is_settled_by_the_next(
    zk_server: ZooKeeperServer, retry: str
) -> None:
    """The reply stays lost past the retry budget: the caller hears 'unavailable, may exist';
    the next create_ledger of the store adopts that ledger (the same metadata: the caller's
    retry) or removes it (other metadata), so no ledger is left that nobody holds."""
    store = ZkMetadataStore(zk_server.hosts, f"/budget-{uuid.uuid4().hex[:10]}/ledgers", op_retry_s=0.3)
    try:
        store.format()
        lm = store.ledgers
        md = dataclasses.replace(MD, creator_token=7)
        with _Lossy(store.client, store.root) as lossy:
            # every answer about the ledger znode is lost; the id generator works
            lossy.policy = lambda kind, path: "reply" if kind == "create" and "/idgen/" not in path else None
            with pytest.raises(MetadataStoreUnavailableError, match=r"ledger \d+ .* may have been created"):
                lm.create_ledger(md)
        (doubtful,) = list(lm.iter_ledger_ids())  # it was made: nobody holds its id yet
        again = md if retry == "same-metadata" else dataclasses.replace(MD, creator_token=8)
        lid, version = lm.create_ledger(again)
        assert list(lm.iter_ledger_ids()) == [lid]
        assert lm.read_ledger(lid) == Versioned(again, version)
        assert (lid == doubtful) == (retry == "same-metadata")
    finally:
        store.close()
