"""``metadataServiceUri`` parsing and the factory that opens the matching driver.

Accepted URIs:
- ``zk://host:port[,host:port...]/ledgers``: ZooKeeper; the ledger manager is the one stored
  in ``/ledgers/LAYOUT`` (format defaults to hierarchical);
- ``zk+hierarchical://...`` / ``zk+flat://...``: ZooKeeper, and the layout must be that one;
- ``sqlite:///abs/path.db`` (also ``sqlite:////abs/path.db``) or ``sqlite:///./rel/path.db``:
  the embedded store;
- empty: the caller's default SQLite path (``default_sqlite_path``).

Invariant: a URI that does not match these is a ``ConfigError`` naming the URI and what was
expected; nothing is opened for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vellum.errors import ConfigError
from vellum.meta.api import MetadataStore

if TYPE_CHECKING:
    from vellum.meta.zk_tls import ZkTls

_ZK_SCHEMES = {"zk": None, "zk+hierarchical": "hierarchical", "zk+flat": "flat",
               "zk+longhierarchical": "longhierarchical"}
_UNSUPPORTED = ("zk+null", "etcd")


@dataclass(frozen=True)
class MetadataUri:
    driver: str  # "zk" | "sqlite"
    ledger_manager_type: str | None = None
    hosts: str = ""
    root: str = "/ledgers"
    path: str = ""


def parse_metadata_uri(uri: str) -> MetadataUri:
    scheme, sep, rest = uri.partition("://")
    if not sep:
        raise ConfigError(
            f"bad metadataServiceUri {uri!r}: expected zk://host:port/ledgers, zk+hierarchical://..., "
            "zk+flat://... or sqlite:///path"
        )
    scheme = scheme.lower()
    if scheme == "sqlite":
        if not rest.startswith("/") or rest in ("/", "//"):
            raise ConfigError(
                f"bad metadataServiceUri {uri!r}: use sqlite:///absolute/path.db or sqlite:///./relative/path.db"
            )
        if rest.startswith("//"):
            path = rest[1:]  # sqlite:////abs -> /abs
        elif rest.startswith(("/./", "/../")):
            path = rest[1:]  # sqlite:///./rel -> ./rel
        else:
            path = rest  # sqlite:///abs -> /abs
        return MetadataUri("sqlite", path=path)
    if scheme in _ZK_SCHEMES:
        hosts, _, root = rest.partition("/")
        if not hosts:
            raise ConfigError(f"bad metadataServiceUri {uri!r}: no ZooKeeper host:port")
        for hp in hosts.split(","):
            host, colon, port = hp.rpartition(":")
            if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ConfigError(f"bad metadataServiceUri {uri!r}: {hp!r} is not host:port")
        root = "/" + root.strip("/") if root.strip("/") else "/ledgers"
        return MetadataUri("zk", _ZK_SCHEMES[scheme], hosts=hosts, root=root)
    if scheme in _UNSUPPORTED:
        raise ConfigError(f"metadataServiceUri {uri!r}: the {scheme} driver is not supported by Vellum")
    raise ConfigError(
        f"bad metadataServiceUri {uri!r}: unknown scheme {scheme!r}; expected zk, zk+hierarchical, "
        "zk+longhierarchical, zk+flat or sqlite"
    )


def open_metadata_store(
    uri: str,
    *,
    default_sqlite_path: str | Path | None = None,
    session_timeout_s: float = 10.0,
    connect_timeout_s: float = 10.0,
    poll_interval_s: float = 0.1,
    zk_digest_auth_file: str = "",
    zk_tls: ZkTls | None = None,
) -> MetadataStore:
    """Open (connect to) the store ``uri`` names; does not format it. ``zk_digest_auth_file``:
    a ZooKeeper store authenticates with the ``user:password`` in it and creates znodes readable
    and writable by that identity only (``zkEnableSecurity``); ``zk_tls``: a ZooKeeper store
    connects with TLS (``zkTlsEnabled``; ``vellum.client.metadata_security`` builds it from a
    configuration). Both are ignored by the SQLite store, which is protected by its file mode."""
    if not uri:
        if default_sqlite_path is None:
            raise ConfigError("metadataServiceUri is empty and no default SQLite path was given")
        Path(default_sqlite_path).parent.mkdir(parents=True, exist_ok=True)
        uri = f"sqlite:///{Path(default_sqlite_path).resolve()}"
    parsed = parse_metadata_uri(uri)
    if parsed.driver == "sqlite":
        from vellum.meta.sqlite import SqliteMetadataStore

        return SqliteMetadataStore(
            parsed.path, session_timeout_s=session_timeout_s, poll_interval_s=poll_interval_s, uri=uri
        )
    from vellum.meta.zk import ZkMetadataStore, read_digest_file

    return ZkMetadataStore(
        parsed.hosts,
        parsed.root,
        ledger_manager_type=parsed.ledger_manager_type,
        session_timeout_s=session_timeout_s,
        connect_timeout_s=connect_timeout_s,
        uri=uri,
        digest_auth=read_digest_file(zk_digest_auth_file) if zk_digest_auth_file else "",
        tls=zk_tls,
    )
