"""Metadata store security: ZooKeeper digest ACLs (``zkEnableSecurity`` + ``zkDigestAuthFile``,
real ZooKeeper) and the embedded SQLite file's mode.

Covered: a secured store creates every znode readable and writable by the cluster's identity
only; a session without credentials, or with other credentials, cannot read the ledgers or the
cookies and is told which setting to fix; a secured store that finds an open root warns; the
digest file must be private; the SQLite store file is created 0600 and one that group or
others may write is refused with a message naming the file and the fix."""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from vellum.errors import ConfigError, MetaStoreError
from vellum.ids import BookieId
from vellum.meta import open_metadata_store
from vellum.meta.model import LedgerMetadata
from vellum.testing.zookeeper import ZooKeeperServer


def digest_file(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text + "\n")
    path.chmod(mode)
    return path


def metadata() -> LedgerMetadata:
    return LedgerMetadata(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1,
                          ensembles={0: ("127.0.0.1:3181",)}, password=b"secret")


def test_a_secured_zookeeper_store_is_closed_to_other_sessions(
    zk_server: ZooKeeperServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = f"/secured-{uuid.uuid4().hex[:8]}"
    uri = zk_server.uri("zk+hierarchical", root)
    creds = digest_file(tmp_path / "zk-digest", "vellum:s3cret")
    with open_metadata_store(uri, zk_digest_auth_file=str(creds)) as store:
        store.format()
        ledger_id, _version = store.ledgers.create_ledger(metadata())
        ledger_path = store.ledgers.ledger_path(ledger_id)  # type: ignore[attr-defined]
        store.registration.put_cookie(BookieId("127.0.0.1:3181"), b"cookie", None)
        assert store.registration.get_cookie(BookieId("127.0.0.1:3181")) is not None
        paths = (root, f"{root}/cookies", f"{root}/cookies/127.0.0.1:3181", f"{root}/INSTANCEID", ledger_path)
        for path in paths:
            acls, _ = store.client.get_acls(path)  # type: ignore[attr-defined]
            assert [(a.id.scheme, a.id.id.split(":")[0], a.perms) for a in acls] == [("digest", "vellum", 31)], path

    anonymous = KazooClient(hosts=zk_server.hosts)
    anonymous.start(timeout=10)
    try:
        for path in paths:
            with pytest.raises(NoAuthError):
                anonymous.get(path)
        with pytest.raises(NoAuthError):
            anonymous.create(f"{root}/cookies/intruder", b"x")
    finally:
        anonymous.stop()
        anonymous.close()

    with pytest.raises(MetaStoreError, match=f"{root} on .* is protected by ZooKeeper ACLs: set zkEnableSecurity=true "
                                             "and zkDigestAuthFile"):
        open_metadata_store(uri)
    wrong = digest_file(tmp_path / "wrong", "vellum:guess")
    with pytest.raises(MetaStoreError, match="ZooKeeper refused the digest identity 'vellum'"):
        open_metadata_store(uri, zk_digest_auth_file=str(wrong))
    with open_metadata_store(uri, zk_digest_auth_file=str(creds)) as store:
        assert store.is_formatted()
        assert store.ledgers.read_ledger(ledger_id).value.password == b"secret"
        assert store.registration.get_cookie(BookieId("127.0.0.1:3181")).value == b"cookie"  # type: ignore[union-attr]

    # a secured store on an open root says so
    open_root = f"/open-{uuid.uuid4().hex[:8]}"
    with open_metadata_store(zk_server.uri("zk+hierarchical", open_root)) as store:
        store.format()
    with caplog.at_level(logging.WARNING, logger="vellum.meta.zk"), \
            open_metadata_store(zk_server.uri("zk+hierarchical", open_root), zk_digest_auth_file=str(creds)):
        pass
    assert "is open to every ZooKeeper client" in caplog.text


def test_the_digest_file_must_be_private_and_well_formed(tmp_path: Path) -> None:
    from vellum.meta.zk import read_digest_file

    assert read_digest_file(str(digest_file(tmp_path / "ok", "u:p"))) == "u:p"
    with pytest.raises(ConfigError, match=r"is open to group/others \(mode 0644\).*chmod 600"):
        read_digest_file(str(digest_file(tmp_path / "open", "u:p", 0o644)))
    with pytest.raises(ConfigError, match="must hold one line user:password"):
        read_digest_file(str(digest_file(tmp_path / "bad", "just-a-password")))
    with pytest.raises(ConfigError, match="cannot read zkDigestAuthFile"):
        read_digest_file(str(tmp_path / "missing"))


def test_the_sqlite_store_file_is_private(tmp_path: Path) -> None:
    path = tmp_path / "metadata.db"
    old = os.umask(0o002)  # a permissive umask must not leak into the store's mode
    try:
        with open_metadata_store(f"sqlite:///{path}") as store:
            store.format()
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o600
    for extra in (Path(f"{path}-wal"), Path(f"{path}-shm")):
        if extra.exists():
            assert extra.stat().st_mode & 0o022 == 0, extra
    path.chmod(0o664)
    with pytest.raises(MetaStoreError, match=rf"{path} is writable by group or others \(mode 0664\).*Fix it with "
                                             rf"`chmod 600 {path}"):
        open_metadata_store(f"sqlite:///{path}")
    path.chmod(0o644)  # readable is the operator's choice; writable is not
    with open_metadata_store(f"sqlite:///{path}") as store:
        assert store.is_formatted()
