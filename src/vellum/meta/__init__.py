"""Metadata: ledger metadata, bookie registration, ledger ids, AutoRecovery (requirement R2 of docs/correctness.md; docs/metadata.md).

Layer L2: imports only errors/ids/config (and kazoo/sqlite3). Two drivers implement
``meta.api``: ZooKeeper (``zk://``, BookKeeper's znode layout) and the embedded SQLite store
(``sqlite:///path``, the default). ``open_metadata_store(uri)`` picks one.
"""

from vellum.meta.api import (
    AuditorElection,
    ClusterInfo,
    KeyValueStore,
    LayoutManager,
    LedgerIdGenerator,
    LedgerManager,
    LedgerRange,
    MetadataStore,
    RegistrationManager,
    SessionEvent,
    UnderReplicatedLedger,
    UnderReplicationManager,
    Versioned,
    Watch,
)
from vellum.meta.model import DigestType, LedgerLayout, LedgerMetadata, LedgerState
from vellum.meta.uri import MetadataUri, open_metadata_store, parse_metadata_uri

__all__ = [
    "AuditorElection",
    "ClusterInfo",
    "DigestType",
    "KeyValueStore",
    "LayoutManager",
    "LedgerIdGenerator",
    "LedgerLayout",
    "LedgerManager",
    "LedgerMetadata",
    "LedgerRange",
    "LedgerState",
    "MetadataStore",
    "MetadataUri",
    "RegistrationManager",
    "SessionEvent",
    "UnderReplicatedLedger",
    "UnderReplicationManager",
    "Versioned",
    "Watch",
    "open_metadata_store",
    "parse_metadata_uri",
]
