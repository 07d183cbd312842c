"""The ZooKeeper driver's cluster layout record (``{root}/LAYOUT``, ``ZkLayoutManager``) and
Vellum's key-value area (``{root}/vellum-kv``, ``ZkKeyValueStore``), on the store's kazoo session
(``meta/zk.py``)."""

from __future__ import annotations

import logging

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
)

from vellum.errors import (
    MetadataStoreUnavailableError,
    MetadataVersionError,
)
from vellum.meta import paths as P
from vellum.meta.api import (
    KeyValueStore,
    LayoutManager,
    Versioned,
)
from vellum.meta.model import (
    LedgerLayout,
)
from vellum.meta.zk_common import CREATE_RETRIES, TRANSIENT, delete_znode, read_znode, unavailable

log = logging.getLogger(__name__)


class ZkLayoutManager(LayoutManager):
    def __init__(self, client: KazooClient, root: str) -> None:
        self._client = client
        self.path = f"{root}/{P.LAYOUT}"

    def read_layout(self) -> LedgerLayout | None:
        found = read_znode(self._client, self.path)
        return None if found is None else LedgerLayout.parse(found[0], where=f"znode {self.path}")

    def store_layout(self, layout: LedgerLayout) -> None:
        try:
            self._client.create(self.path, layout.serialize(), makepath=True)
        except NodeExistsError:
            raise MetadataVersionError(f"a layout already exists at {self.path}") from None
        except TRANSIENT as e:
            unavailable(e, f"writing {self.path}")

    def delete_layout(self) -> None:
        delete_znode(self._client, self.path)


_KEY_MARK = b"v"


class ZkKeyValueStore(KeyValueStore):
    """Keys are znode paths under ``{root}/vellum-kv``; a znode holding a key has data b"v"+value."""

    def __init__(self, client: KazooClient, root: str) -> None:
        self._client = client
        self._base = f"{root}/{P.KV}"

    def _path(self, key: str) -> str:
        return f"{self._base}/{P.validate_kv_key(key)}"

    def get(self, key: str) -> Versioned[bytes] | None:
        found = read_znode(self._client, self._path(key), f"key {key!r}")
        if found is None:
            return None
        data, stat = found
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
