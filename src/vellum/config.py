"""Server and client configuration: frozen dataclasses with BookKeeper's keys and defaults.

Each field is a BookKeeper configuration key in snake_case with a unit suffix; its camelCase
BookKeeper name is accepted in ``bk_server.conf``-style files (``key=value`` lines, ``#``
comments, lists comma-separated). Every other key BookKeeper 4.16-4.18 defines is handled by
``config_keys`` (honoured through an alias, accepted as not used, or refused for values Vellum
cannot honour); a key no BookKeeper release defines is an error with a "did you mean" suggestion.
Values are validated against ranges and cross-field rules when the object is built; errors in a
file name the file, the line and the key.
Where Vellum's default differs from BookKeeper's code default, the field's doc says why.
No I/O except ``load_server_config``/``parse_conf_file`` reading the file they are given.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, get_type_hints

from vellum import config_keys, logs
from vellum.errors import ConfigError

_T = TypeVar("_T")

#: Where ``vellum standalone`` keeps its embedded metadata store; the shell's default ``--uri``.
DEFAULT_DATA_DIR = "data/standalone"
DEFAULT_METADATA_URI = f"sqlite:///./{DEFAULT_DATA_DIR}/metadata.db"
#: The ``tlsProviderFactoryClass`` value that turns TLS on (BookKeeper's class name; Vellum has
#: one TLS implementation, Python's ``ssl`` with PEM files, and no other factory).
TLS_CONTEXT_FACTORY = "org.apache.bookkeeper.tls.TLSContextFactory"
_TLS_ON_DOC = (
    f"TLS on: {TLS_CONTEXT_FACTORY} (BookKeeper's class name; the short name works too); empty = no TLS"
)


def _opt(
    key: str,
    default: Any,
    doc: str,
    *,
    lo: float | None = None,
    hi: float | None = None,
    choices: tuple[str, ...] | None = None,
    secret: bool = False,
) -> Any:
    """A setting; a ``secret`` one (a password, a token) is never shown: not in ``repr`` nor
    by ``describe`` (``vellum config show``)."""
    meta = {"key": key, "doc": doc, "lo": lo, "hi": hi, "choices": choices, "secret": secret}
    if isinstance(default, list):
        default = tuple(default)
    return field(default=default, metadata=meta, repr=not secret)


# Placement keys: read by clients, and by a bookie for the replacement bookies its AutoRecovery
# picks (BookKeeper reads them from bk_server.conf there too). One declaration, both classes.
#: ``ensemblePlacementPolicy`` values: Vellum's short names and BookKeeper's class names
PLACEMENT_POLICIES = {
    "default": "default", "rackaware": "rackaware", "zoneaware": "zoneaware", "regionaware": "regionaware",
    **{f"{prefix}{cls}": name for name, cls in (
        ("default", "DefaultEnsemblePlacementPolicy"), ("rackaware", "RackawareEnsemblePlacementPolicy"),
        ("zoneaware", "ZoneawareEnsemblePlacementPolicy"), ("regionaware", "RegionAwareEnsemblePlacementPolicy"))
       for prefix in ("", "org.apache.bookkeeper.client.")},
}


def placement_policy_name(value: str) -> str:
    """Vellum's name (default, rackaware, zoneaware, regionaware) of an ``ensemblePlacementPolicy``
    value; ConfigError for a policy Vellum does not have."""
    name = PLACEMENT_POLICIES.get(value.strip())
    if name is None:
        raise ConfigError(
            f"ensemblePlacementPolicy={value} is refused: Vellum's placement policies are default, rackaware, "
            "zoneaware and regionaware, or BookKeeper's class names org.apache.bookkeeper.client."
            "{Default,Rackaware,Zoneaware,RegionAware}EnsemblePlacementPolicy"
        )
    return name


def _ensemble_placement_policy() -> Any:
    return _opt(
        "ensemblePlacementPolicy", "default",
        "bookie placement: default (random), rackaware, zoneaware, regionaware, or BookKeeper's class names "
        "(org.apache.bookkeeper.client.RackawareEnsemblePlacementPolicy, ...)",
        choices=tuple(PLACEMENT_POLICIES),
    )


def _min_num_racks_per_write_quorum() -> Any:
    return _opt("minNumRacksPerWriteQuorum", 2, "rack-aware: racks spanned by each write quorum", lo=1)


def _enforce_min_num_racks_per_write_quorum() -> Any:
    return _opt("enforceMinNumRacksPerWriteQuorum", False, "rack-aware: fail instead of degrading")


def _network_topology_script_file_name() -> Any:
    return _opt(
        "networkTopologyScriptFileName", "",
        "rack-, zone- and region-aware: executable run with bookie host addresses as arguments, printing one "
        "network location per argument (/rack, /zone/upgradedomain, /region/rack); empty = the mapping "
        "`vellum shell racks` keeps in the metadata store",
    )


def _network_topology_script_number_args() -> Any:
    return _opt("networkTopologyScriptNumberArgs", 100, "most host addresses per run of the topology script", lo=1)


def _network_topology_script_timeout_ms() -> Any:
    return _opt(
        "networkTopologyScriptTimeoutMs", 5000,
        "a topology script run taking longer is killed and its hosts get the default location (Vellum's key)",
        lo=1,
    )


def _repp_dns_resolver_class() -> Any:
    return _opt(
        "reppDnsResolverClass", "org.apache.bookkeeper.net.ScriptBasedMapping",
        "where network locations come from: only ScriptBasedMapping (the script, else the stored mapping); "
        "another class is refused when a topology-aware policy is used",
    )


def _min_num_zones_per_write_quorum() -> Any:
    return _opt("minNumZonesPerWriteQuorum", 2, "zone-aware: zones each write quorum must span (strict)", lo=1)


def _desired_num_zones_per_write_quorum() -> Any:
    return _opt("desiredNumZonesPerWriteQuorum", 3, "zone-aware: zones each write quorum should span", lo=1)


def _enforce_strict_zoneaware_placement() -> Any:
    return _opt(
        "enforceStrictZoneawarePlacement", True,
        "zone-aware: fail a ledger when minNumZonesPerWriteQuorum cannot be met (and require E a multiple of "
        "WQ, WQ > minNumZonesPerWriteQuorum, known locations); false = best effort",
    )


def _repp_regions_to_write() -> Any:
    return _opt(
        "reppRegionsToWrite", "",
        "region-aware: regions, ';'-separated; set = every acknowledged entry in "
        "reppMinimumRegionsForDurability regions",
    )


def _repp_minimum_regions_for_durability() -> Any:
    return _opt(
        "reppMinimumRegionsForDurability", 2,
        "region-aware (with reppRegionsToWrite): regions each acknowledged entry is in", lo=0,
    )


def _repp_enable_durability_enforcement_in_replace() -> Any:
    return _opt(
        "reppEnableDurabilityEnforcementInReplace", True,
        "region-aware: a replacement from another region must keep reppMinimumRegionsForDurability",
    )


#: the keys above, as ``ServerConfig.client_placement_values`` hands them to the bookie's client
PLACEMENT_FIELDS = ("ensemble_placement_policy", "min_num_racks_per_write_quorum",
                    "enforce_min_num_racks_per_write_quorum", "network_topology_script_file_name",
                    "network_topology_script_number_args", "network_topology_script_timeout_ms",
                    "repp_dns_resolver_class", "min_num_zones_per_write_quorum",
                    "desired_num_zones_per_write_quorum", "enforce_strict_zoneaware_placement",
                    "repp_regions_to_write", "repp_minimum_regions_for_durability",
                    "repp_enable_durability_enforcement_in_replace")


@dataclass(frozen=True)
class ServerConfig:
    """Configuration of one bookie (``bk_server.conf``)."""

    # --- identity and network ---
    bookie_port: int = _opt("bookiePort", 3181, "TCP port of the bookie protocol", lo=0, hi=65535)
    bookie_id: str = _opt("bookieId", "", "explicit bookie id; empty = advertised_address:port")
    advertised_address: str = _opt(
        "advertisedAddress", "",
        "address other processes use to reach this bookie (the host of its id); empty = the address of "
        "listeningInterface, else 127.0.0.1",
    )
    bookie_bind_address: str = _opt(
        "bookieBindAddress", "",
        "address the bookie port binds (0.0.0.0 = every interface); empty = the address of listeningInterface, "
        "else the advertised address, which must be an address of this host (Vellum's)",
    )
    listening_interface: str = _opt(
        "listeningInterface", "",
        "network interface (e.g. eth0) whose IPv4 address the bookie binds and, unless advertisedAddress is "
        "set, advertises; empty or 'default' = not used",
    )
    netty_max_frame_size_bytes: int = _opt(
        "nettyMaxFrameSizeBytes", 5242880, "largest accepted wire frame", lo=1024, hi=1 << 30
    )
    max_adds_in_progress_limit: int = _opt(
        "maxAddsInProgressLimit",
        10000,
        "adds in flight per bookie before TOOMANYREQUESTS (BookKeeper: 0 = unlimited; "
        "Vellum bounds memory by default)",
        lo=0,
    )
    max_reads_in_progress_limit: int = _opt(
        "maxReadsInProgressLimit",
        10000,
        "reads in flight per bookie before TOOMANYREQUESTS (BookKeeper: 0 = unlimited)",
        lo=0,
    )
    # --- what unauthenticated and idle connections may cost (Vellum's keys; docs/security.md) ---
    unauthenticated_max_frame_size_bytes: int = _opt(
        "unauthenticatedMaxFrameSizeBytes", 16384,
        "Vellum's own key: the largest frame a connection may send before it is authenticated (and upgraded "
        "to TLS when required; nettyMaxFrameSizeBytes after); a longer one closes the connection. At least "
        "9216: an AUTH carrying the largest token (8 KiB) must fit",
        lo=9216, hi=1 << 30,
    )
    unauthenticated_connections_limit: int = _opt(
        "unauthenticatedConnectionsLimit", 500,
        "Vellum's own key: connections per bookie not yet authenticated (and upgraded to TLS when required); "
        "a new one past it closes the oldest such connection. Keep it well below the descriptor limit "
        "(ulimit -n). 0 = no bound",
        lo=0,
    )
    authentication_timeout_ms: int = _opt(
        "authenticationTimeoutMs", 10000,
        "Vellum's own key: a connection not authenticated (and upgraded to TLS when required) this long "
        "after its accept is closed; only with TLS or authentication on. 0 = no deadline",
        lo=0,
    )
    connection_idle_timeout_ms: int = _opt(
        "connectionIdleTimeoutMs", 0,
        "Vellum's own key: an authenticated connection with no traffic and no request in progress (a waiting "
        "long-poll LAC read is one) for this long is closed; clients reconnect at their next request. "
        "0 = never (the default: a close racing a client's new add fails that add)",
        lo=0,
    )
    connection_refusal_log_period_s: int = _opt(
        "connectionRefusalLogPeriodSeconds", 60,
        "Vellum's own key: a connection refusal (failed AUTH or TLS handshake, timeouts, oversized frame "
        "before authentication, ...) is logged once per reason, peer address and period, with the count of "
        "those not logged; every refusal is counted in bookkeeper_server_REFUSED. 0 = log each one",
        lo=0,
    )
    # --- directories ---
    journal_directories: tuple[str, ...] = _opt(
        "journalDirectories", ["/tmp/bk-txn"], "journal directories (one journal thread each)"
    )
    ledger_directories: tuple[str, ...] = _opt(
        "ledgerDirectories", ["/tmp/bk-data"], "ledger directories (entry logs + index)"
    )
    index_directories: tuple[str, ...] = _opt(
        "indexDirectories", [], "RocksDB index directories; empty = the ledger directories"
    )
    allow_storage_expansion: bool = _opt(
        "allowStorageExpansion", False, "allow new ledger dirs to be added to a cookie"
    )
    data_integrity_checking: bool = _opt(
        "dataIntegrityChecking", False,
        "a bookie that may have lost data (dirs stamped over, unclean shutdown without journal fsync) marks "
        "its ledgers limbo, answers 'unknown' for what it lacks and copies it back from the other replicas",
    )
    data_integrity_stamp_missing_cookies: bool = _opt(
        "dataIntegrityStampMissingCookies", False,
        "with dataIntegrityChecking: stamp over the cookies of wiped dirs instead of refusing to start",
    )
    # --- journal ---
    journal_format_version_to_write: int = _opt(
        "journalFormatVersionToWrite", 6, "journal file format version", lo=4, hi=6
    )
    journal_max_size_mb: int = _opt(
        "journalMaxSizeMB", 2048, "roll the journal file past this size", lo=1
    )
    journal_max_backups: int = _opt(
        "journalMaxBackups", 5, "journal files kept below the last mark", lo=0
    )
    journal_pre_alloc_size_mb: int = _opt(
        "journalPreAllocSizeMB", 16, "journal preallocation step", lo=1
    )
    journal_write_buffer_size_kb: int = _opt(
        "journalWriteBufferSizeKB", 64, "journal write buffer", lo=1
    )
    journal_sync_data: bool = _opt(
        "journalSyncData", True, "fsync the journal before acknowledging (never turn off in production)"
    )
    journal_max_group_wait_ms: float = _opt(
        "journalMaxGroupWaitMSec", 2, "group commit: flush when the oldest entry waited this long", lo=0
    )
    journal_buffered_writes_threshold_bytes: int = _opt(
        "journalBufferedWritesThreshold", 524288, "group commit: flush past this many bytes", lo=0
    )
    journal_buffered_entries_threshold: int = _opt(
        "journalBufferedEntriesThreshold", 0, "group commit: flush past this many entries (0 = off)", lo=0
    )
    journal_flush_when_queue_empty: bool = _opt(
        "journalFlushWhenQueueEmpty",
        True,
        "group commit: flush as soon as the queue is empty (BookKeeper: false; with a separate "
        "force-write stage batches still form while an fsync runs, without a fixed wait)",
    )
    journal_force_write_thread: bool = _opt(
        "journalForceWriteThread",
        False,
        "fsync on a separate force-write thread while the writer writes the next batch "
        "(BookKeeper's structure); false: the writer fsyncs each batch itself and the records "
        "queued meanwhile form the next one (one thread hand-off fewer per group commit)",
    )
    journal_remove_from_page_cache: bool = _opt(
        "journalRemoveFromPageCache",
        True,
        "drop journal pages from the OS page cache once fsynced (only replay reads them; freed "
        "pages are reused at once instead of the cache growing over fresh memory)",
    )
    journal_alignment_size_bytes: int = _opt(
        "journalAlignmentSize", 512,
        "journal flushes are padded to this alignment; with journalDirectIO every write is aligned "
        "to it, so it must be at least the disk's logical sector size (4096 on 4Kn disks)",
        lo=512, hi=1 << 20,
    )
    journal_direct_io: bool = _opt(
        "journalDirectIO",
        False,
        "Vellum's own key: write journals with O_DIRECT from aligned buffers, at least 1 MiB per "
        "write (same file format, fsync kept; meant for big entries; the space ahead is left as "
        "holes, not zeroed); falls back to buffered writes with a warning where the filesystem "
        "refuses O_DIRECT",
    )
    journal_queue_size: int = _opt("journalQueueSize", 10000, "journal queue capacity", lo=1)
    # --- entry logs and ledger storage ---
    log_size_limit_bytes: int = _opt(
        "logSizeLimit", 1073741824, "rotate an entry log past this size", lo=1024 + 64, hi=(1 << 31) - 1
    )
    entry_log_file_preallocation_enabled: bool = _opt(
        "entryLogFilePreallocationEnabled", True, "preallocate the next entry log"
    )
    flush_interval_ms: int = _opt(
        "flushInterval", 10000, "checkpoint period (flush ledger storage, persist lastMark)", lo=1
    )
    flush_entrylog_bytes: int = _opt(
        "flushEntrylogBytes",
        1048576,
        "fsync the entry log every N bytes written (0 = at flush only; BookKeeper: 0; small steps "
        "keep a write-cache flush from queueing tens of MB ahead of the journal's fsync on a shared disk)",
        lo=0,
    )
    db_storage_write_cache_max_size_mb: int = _opt(
        "dbStorage_writeCacheMaxSizeMb",
        0,
        "write cache per bookie, split across ledger dirs and in two; 0 = 25% of the memory the "
        "bookie may use (its cgroup limit, else the machine's RAM), as BookKeeper "
        "(25% of direct memory) sizes it",
        lo=0,
    )
    db_storage_read_ahead_cache_max_size_mb: int = _opt(
        "dbStorage_readAheadCacheMaxSizeMb",
        64,
        "read-ahead cache per bookie, split across ledger dirs (BookKeeper: 25% of direct memory)",
        lo=0,
    )
    db_storage_read_ahead_cache_batch_size: int = _opt(
        "dbStorage_readAheadCacheBatchSize", 100, "entries read ahead after a cache miss", lo=0
    )
    db_storage_read_ahead_cache_batch_bytes_size: int = _opt(
        "dbStorage_readAheadCacheBatchBytesSize",
        262144,
        "bytes read ahead after a cache miss at most, -1 = no bound (BookKeeper: -1; big entries "
        "gain nothing from read-ahead but the copy, and pipelined readers ask for them anyway)",
        lo=-1,
    )
    db_storage_max_throttle_time_ms: int = _opt(
        "dbStorage_maxThrottleTimeMs", 10000, "wait for a full write cache before rejecting", lo=0
    )
    db_storage_direct_io_entry_logger: bool = _opt(
        "dbStorage_directIOEntryLogger",
        False,
        "write entry logs with O_DIRECT from aligned buffers (same file format as buffered; reads "
        "stay buffered); not with entryLogPerLedgerEnabled (as in BookKeeper); falls back to "
        "buffered writes with a warning where the filesystem refuses O_DIRECT",
    )
    db_storage_direct_io_entry_logger_total_write_buffer_size_mb: int = _opt(
        "dbStorage_directIOEntryLoggerTotalWriteBufferSizeMB",
        64,
        "aligned write buffers of the direct-I/O entry logger, split across ledger dirs (one per "
        "dir's active log; BookKeeper: 12.5% of direct memory)",
        lo=1,
    )
    entry_log_per_ledger_enabled: bool = _opt(
        "entryLogPerLedgerEnabled", False, "one active entry log per active ledger (docs/gc.md)"
    )
    entrylog_map_access_expiry_time_s: int = _opt(
        "entrylogMapAccessExpiryTimeInSeconds", 300, "evict idle ledger -> active log mappings", lo=1
    )
    maximum_number_of_active_entry_logs: int = _opt(
        "maximumNumberOfActiveEntryLogs", 500, "cap on active logs in entry-log-per-ledger mode", lo=1
    )
    # --- disks ---
    disk_usage_threshold: float = _opt(
        "diskUsageThreshold", 0.95,
        "a ledger dir above this usage is full; usage = 1 - usable/total of its filesystem, usable being "
        "what the bookie's user can still write (blocks reserved for root count as used), as in BookKeeper",
        lo=0.0, hi=1.0,
    )
    disk_usage_warn_threshold: float = _opt(
        "diskUsageWarnThreshold", 0.90, "warn and suspend major compaction above this", lo=0.0, hi=1.0
    )
    disk_usage_lwm_threshold: float = _opt(
        "diskUsageLwmThreshold", 0.95, "a full dir is writable again below this", lo=0.0, hi=1.0
    )
    disk_check_interval_ms: int = _opt("diskCheckInterval", 10000, "disk usage check period", lo=1)
    read_only_mode_enabled: bool = _opt(
        "readOnlyModeEnabled", True, "turn read-only instead of shutting down when all dirs are full"
    )
    force_read_only_bookie: bool = _opt("forceReadOnlyBookie", False, "start read-only")
    # --- GC and compaction ---
    gc_wait_time_ms: int = _opt("gcWaitTime", 600000, "GC period", lo=1)
    minor_compaction_interval_s: int = _opt(
        "minorCompactionInterval", 3600,
        "minor compaction period, seconds (<= 0 disables); below majorCompactionInterval when both are on",
    )
    minor_compaction_threshold: float = _opt(
        "minorCompactionThreshold", 0.2,
        "compact logs whose live ratio is below this (0 disables); below majorCompactionThreshold when both "
        "are on", lo=0.0, hi=1.0,
    )
    major_compaction_interval_s: int = _opt(
        "majorCompactionInterval", 86400,
        "major compaction period, seconds (<= 0 disables); above minorCompactionInterval when both are on",
    )
    major_compaction_threshold: float = _opt(
        "majorCompactionThreshold", 0.8,
        "compact logs whose live ratio is below this (0 disables); above minorCompactionThreshold when both "
        "are on", lo=0.0, hi=1.0,
    )
    minor_compaction_max_time_ms: int = _opt(
        "minorCompactionMaxTimeMillis", -1, "max run time of one minor pass (<= 0: no limit)"
    )
    major_compaction_max_time_ms: int = _opt(
        "majorCompactionMaxTimeMillis", -1, "max run time of one major pass (<= 0: no limit)"
    )
    compaction_rate_by_entries: int = _opt(
        "compactionRateByEntries", 1000, "compaction throttle, entries per second", lo=1
    )
    compaction_rate_by_bytes: int = _opt(
        "compactionRateByBytes", 1000000, "compaction throttle, bytes per second", lo=1
    )
    is_throttle_by_bytes: bool = _opt("isThrottleByBytes", False, "throttle compaction by bytes")
    is_force_gc_allow_when_no_space: bool = _opt(
        "isForceGCAllowWhenNoSpace", False, "keep compacting when disks are (almost) full"
    )
    force_allow_compaction: bool = _opt(
        "forceAllowCompaction", False,
        "a forced GC (admin API, shell gc) compacts even when the compaction intervals disable the "
        "scheduled runs, with thresholds strictly between 0 and 1",
    )
    # --- metadata ---
    metadata_service_uri: str = _opt(
        "metadataServiceUri",
        "",
        "zk://host:port[,host:port]/ledgers, zk+flat://, zk+hierarchical://, zk+longhierarchical://, sqlite:///path; "
        "empty = the embedded store next to the first ledger dir",
    )
    zk_timeout_ms: int = _opt(
        "zkTimeout", 10000,
        "metadata session timeout: the ZooKeeper session's (the server bounds it by its min/maxSessionTimeout) "
        "and the embedded store's lease",
        lo=100,
    )
    ledger_manager_type: str = _opt(
        "ledgerManagerType", "hierarchical", "ledger layout chosen at format time",
        choices=("flat", "hierarchical", "longhierarchical"),
    )
    # --- AutoRecovery (auditor and replication workers) ---
    # where replacement bookies go (also client keys: see PLACEMENT_FIELDS)
    ensemble_placement_policy: str = _ensemble_placement_policy()
    min_num_racks_per_write_quorum: int = _min_num_racks_per_write_quorum()
    enforce_min_num_racks_per_write_quorum: bool = _enforce_min_num_racks_per_write_quorum()
    network_topology_script_file_name: str = _network_topology_script_file_name()
    network_topology_script_number_args: int = _network_topology_script_number_args()
    network_topology_script_timeout_ms: int = _network_topology_script_timeout_ms()
    repp_dns_resolver_class: str = _repp_dns_resolver_class()
    min_num_zones_per_write_quorum: int = _min_num_zones_per_write_quorum()
    desired_num_zones_per_write_quorum: int = _desired_num_zones_per_write_quorum()
    enforce_strict_zoneaware_placement: bool = _enforce_strict_zoneaware_placement()
    repp_regions_to_write: str = _repp_regions_to_write()
    repp_minimum_regions_for_durability: int = _repp_minimum_regions_for_durability()
    repp_enable_durability_enforcement_in_replace: bool = _repp_enable_durability_enforcement_in_replace()
    auto_recovery_daemon_enabled: bool = _opt(
        "autoRecoveryDaemonEnabled", False,
        "run an auditor candidate and a replication worker inside the bookie (else: vellum autorecovery)",
    )
    lost_bookie_recovery_delay_s: int = _opt(
        "lostBookieRecoveryDelay", 0,
        "seconds a bookie must stay gone before its ledgers are marked under-replicated "
        "(the value set with `vellum shell lostbookierecoverydelay` wins)", lo=0,
    )
    auditor_periodic_bookie_check_interval_s: int = _opt(
        "auditorPeriodicBookieCheckInterval", 86400,
        "seconds between scans of every ledger for fragments on unregistered bookies (0 = off)", lo=0,
    )
    auditor_periodic_check_interval_s: int = _opt(
        "auditorPeriodicCheckInterval", 604800,
        "seconds between checks that every bookie of every fragment holds its entries (0 = off)", lo=0,
    )
    auditor_ledger_verification_percentage: int = _opt(
        "auditorLedgerVerificationPercentage", 0,
        "share of ledgers whose entries the periodic check reads and verifies, not only lists", lo=0, hi=100,
    )
    auditor_replicas_check_interval_s: int = _opt(
        "auditorReplicasCheckInterval", 0,
        "seconds between replicas checks: every entry of every closed ledger read from every replica "
        "and verified, which finds data lost or corrupted on bookies that are up (0 = off)", lo=0,
    )
    auditor_periodic_placement_policy_check_interval_s: int = _opt(
        "auditorPeriodicPlacementPolicyCheckInterval", 0,
        "seconds between placement checks: ledgers with an ensemble the placement policy would not "
        "choose (e.g. a write quorum on too few racks) are counted and logged (0 = off)", lo=0,
    )
    open_ledger_rereplication_grace_period_ms: int = _opt(
        "openLedgerRereplicationGracePeriod", 30000,
        "ms a replication worker leaves the open fragment of an unclosed ledger to its writer before "
        "fencing the ledger to heal it", lo=0,
    )
    rereplication_entry_batch_size: int = _opt(
        "rereplicationEntryBatchSize", 10, "entries a replication worker copies at once", lo=1,
    )
    replication_rate_by_bytes: int = _opt(
        "replicationRateByBytes", -1, "bytes per second a replication worker copies at most (-1 = no bound)",
    )
    replication_yield_to_foreground: bool = _opt(
        "replicationYieldToForeground", True,
        "a replication worker copies fewer entries at once while its requests wait behind foreground "
        "traffic (delay-based, down to one entry in flight) and at full speed on an idle cluster "
        "(Vellum; false: always rereplicationEntryBatchSize in flight)",
    )
    replication_yield_delay_ms: int = _opt(
        "replicationYieldDelayMs", 10,
        "queuing delay (ms above the lowest delay seen lately) a yielding replication worker tolerates "
        "before it halves the entries it has in flight", lo=1, hi=60000,
    )
    rw_rereplicate_backoff_ms: int = _opt(
        "rwRereplicateBackoffMs", 5000, "ms before a replication worker retries a ledger it failed on", lo=0,
    )
    # --- admin HTTP and stats ---
    http_server_enabled: bool = _opt(
        "httpServerEnabled", True, "run the admin HTTP server (BookKeeper: false)"
    )
    http_server_port: int = _opt("httpServerPort", 8080, "admin HTTP port", lo=0, hi=65535)
    http_server_host: str = _opt(
        "httpServerHost", "",
        "admin HTTP bind address; empty = the bookie port's bind address (loopback unless the bookie "
        "advertises or binds another; BookKeeper: 0.0.0.0)",
    )
    # --- metrics port (BookKeeper's PrometheusMetricsProvider keys; docs/operations.md, Metrics) ---
    enable_statistics: bool = _opt(
        "enableStatistics", True,
        "export metrics on prometheusStatsHttpPort; false = no metrics port (the admin HTTP /metrics still "
        "answers: Vellum's counters cost nothing to keep)",
    )
    prometheus_stats_http_enable: bool = _opt(
        "prometheusStatsHttpEnable", True,
        "serve GET /metrics on prometheusStatsHttpPort (BookKeeper's provider key). Unlike BookKeeper, Vellum "
        "serves it also when httpServerEnabled=true, so both scrape configurations work",
    )
    prometheus_stats_http_port: int = _opt(
        "prometheusStatsHttpPort", 8000,
        "port of the metrics-only HTTP listener (GET /metrics, the same metrics as the admin HTTP /metrics); "
        "0 = any free port (in the READY line and the start log)",
        lo=0, hi=65535,
    )
    prometheus_stats_http_address: str = _opt(
        "prometheusStatsHttpAddress", "0.0.0.0",
        "bind address of the metrics port (BookKeeper's default 0.0.0.0: every interface, so that Prometheus "
        "on another host can scrape it; it serves metrics only, never the admin API)",
    )
    # --- logs (Vellum's keys: BookKeeper configures log4j2 in its own file; docs/operations.md, Logs) ---
    log_format: str = _opt(
        "logFormat", "logfmt",
        "log line format: logfmt (ts=... level=... logger=... msg=\"...\" bookie=... ledger=... entry=...), "
        "json (one object per line, same keys), text (the plain format of earlier releases)",
        choices=("logfmt", "json", "text"),
    )
    log_levels: str = _opt(
        "logLevels", "",
        "levels per module, comma list of module=LEVEL (a bare LEVEL is every module's), e.g. "
        "INFO,vellum.storage=DEBUG,vellum.client=WARNING; empty = INFO (DEBUG with -v)",
    )
    log_file: str = _opt(
        "logFile", "", "write the log to this file, rotated by size, instead of stderr; empty = stderr"
    )
    log_file_max_size_mb: int = _opt(
        "logFileMaxSizeMb", 100, "logFile is rotated when it would grow past this size", lo=1
    )
    log_file_backups: int = _opt(
        "logFileBackups", 10, "rotated logFile copies kept (logFile.1 ... logFile.N, oldest dropped)", lo=0
    )
    log_config_file: str = _opt(
        "logConfigFile", "",
        "a logging.config.dictConfig dictionary in a .json file, used instead of logFormat and logFile "
        "(logLevels still applies over it); Vellum's formatters and bookie filter are vellum.logs."
        "LogfmtFormatter, JsonFormatter and BookieIdFilter",
    )
    # --- TLS on the bookie port (START_TLS; PEM files) ---
    tls_provider_factory_class: str = _opt(
        "tlsProviderFactoryClass", "",
        _TLS_ON_DOC + ". With TLS on, the bookie upgrades connections on START_TLS and refuses every "
        "plaintext request (BookKeeper also serves plaintext)",
    )
    tls_provider: str = _opt(
        "tlsProvider", "OpenSSL", "TLS implementation: always Python's ssl (OpenSSL); JDK is accepted",
        choices=("OpenSSL", "JDK"),
    )
    tls_key_store_type: str = _opt("tlsKeyStoreType", "PEM", "format of tlsKeyStore: PEM only (BookKeeper: JKS)")
    tls_key_store: str = _opt("tlsKeyStore", "", "the bookie's private key, PEM file")
    tls_key_store_password_path: str = _opt(
        "tlsKeyStorePasswordPath", "", "file holding the password of an encrypted tlsKeyStore"
    )
    tls_certificate_path: str = _opt("tlsCertificatePath", "", "the bookie's certificate (chain), PEM file")
    tls_trust_store_type: str = _opt(
        "tlsTrustStoreType", "PEM", "format of tlsTrustStore: PEM only (BookKeeper: JKS)"
    )
    tls_trust_store: str = _opt(
        "tlsTrustStore", "", "CA certificate(s), PEM file, that client certificates must chain to (mutual TLS)"
    )
    tls_trust_store_password_path: str = _opt(
        "tlsTrustStorePasswordPath", "",
        "password file of a JKS/PKCS12 trust store; a PEM trust store has none (only watched for changes)",
    )
    tls_client_authentication: bool = _opt(
        "tlsClientAuthentication", False,
        "mutual TLS: require a client certificate signed by a tlsTrustStore CA; its CN and OU roles "
        "become the connection's principal",
    )
    tls_cert_files_refresh_duration_s: int = _opt(
        "tlsCertFilesRefreshDurationSeconds", 0,
        "check the certificate, key and trust files this often and reload them when changed, for new "
        "connections (0 = never)",
        lo=0,
    )
    tls_enabled_protocols: tuple[str, ...] = _opt(
        "tlsEnabledProtocols", [], "TLS versions to offer (TLSv1.2, TLSv1.3); empty = TLS 1.2 and later"
    )
    tls_enabled_cipher_suites: tuple[str, ...] = _opt(
        "tlsEnabledCipherSuites", [], "TLS 1.2 cipher suites, OpenSSL names; empty = OpenSSL's defaults"
    )
    # --- authentication and authorization on the bookie port (docs/security.md) ---
    bookie_auth_provider_factory_class: tuple[str, ...] = _opt(
        "bookieAuthProviderFactoryClass", [],
        "authentication providers, comma list: tls (the mutual-TLS certificate; BookKeeper's "
        "org.apache.bookkeeper.tls.BookieAuthZFactory) and/or token (signed tokens sent with AUTH); "
        "empty = no authentication. With it on, unauthenticated connections are refused",
    )
    authorized_roles: tuple[str, ...] = _opt(
        "authorizedRoles", [],
        "roles (certificate OU 0:<role>, token roles claim) a client needs, comma list; empty = any "
        "authenticated client. Include bookie for re-replication traffic",
    )
    token_secret_key_file: str = _opt(
        "tokenSecretKeyFile", "", "HS256 secret (file) that verifies tokens (bookie port AUTH and admin HTTP)"
    )
    token_public_key_file: str = _opt(
        "tokenPublicKeyFile", "", "RS256/ES256 public key or certificate (PEM file) that verifies tokens"
    )
    token_audience: str = _opt(
        "tokenAudience", "vellum",
        "the aud claim of tokens for the bookie port (tokens issued with `vellum security issue-token --for bookie`)",
    )
    http_server_token_audience: str = _opt(
        "httpServerTokenAudience", "vellum-admin",
        "the aud claim of tokens for the admin HTTP API (`issue-token --for admin`); must differ from "
        "tokenAudience, so that a token opens one door only (Vellum's key)",
    )
    token_max_lifetime_s: int = _opt(
        "tokenMaxLifetimeSeconds", 2592000,
        "longest lifetime (exp - iat, and exp from now) of a token either port accepts; longer ones are "
        "refused, and `issue-token` refuses to make them (30 days; Vellum's key)",
        lo=1,
    )
    master_key_check: str = _opt(
        "ledgerMasterKeyCheck", "auto",
        "check the master key of a ledger this bookie has not seen against the ledger's metadata before "
        "accepting it (first ADD, fence, explicit LAC): true, false, or auto = true when "
        "bookieAuthProviderFactoryClass is set. Stops a client from claiming a ledger id before its owner "
        "(Vellum's key; BookKeeper trusts the first key it sees)",
        choices=("auto", "true", "false"),
    )
    # --- admin HTTP security ---
    http_server_tls_enable: bool = _opt(
        "httpServerTlsEnable", False, "serve the admin HTTP API over TLS (https) only"
    )
    http_server_key_store_path: str = _opt(
        "httpServerKeyStorePath", "",
        "admin HTTP TLS private key, PEM file (with the certificate in it unless httpServerCertificatePath)",
    )
    http_server_key_store_password: str = _opt(
        "httpServerKeyStorePassword", "", "password of an encrypted httpServerKeyStorePath (BookKeeper's key)",
        secret=True,
    )
    http_server_certificate_path: str = _opt(
        "httpServerCertificatePath", "", "admin HTTP TLS certificate (chain), PEM file (Vellum's key)"
    )
    http_server_trust_store_path: str = _opt(
        "httpServerTrustStorePath", "",
        "CA certificate(s), PEM file: when set, admin HTTP clients must present a certificate from it",
    )
    http_server_header_read_timeout_ms: int = _opt(
        "httpServerHeaderReadTimeoutMs", 10000,
        "Vellum's own key: an admin HTTP connection that has not sent a complete request head this long after "
        "its accept or its previous answer is closed (half-sent requests, idle keep-alive connections)",
        lo=100,
    )
    http_server_token_required_for_reads: bool = _opt(
        "httpServerTokenRequiredForReads", False,
        "with a token key set, read-only admin endpoints need a token too (with one of authorizedRoles or "
        "admin, when authorizedRoles is set); mutating ones always need the admin role. /heartbeat stays open",
    )
    http_server_admin_insecure: bool = _opt(
        "httpServerAdminInsecure", False,
        "let a bookie whose bookie port requires authentication run an admin HTTP API that anyone who "
        "reaches it may use to change the bookie (no token key, no admin client certificates). Off: such a "
        "bookie refuses to start (Vellum's key)",
    )
    # --- metadata store security ---
    zk_enable_security: bool = _opt(
        "zkEnableSecurity", False,
        "ZooKeeper digest ACLs: authenticate with zkDigestAuthFile and create every znode readable and "
        "writable by that identity only",
    )
    zk_digest_auth_file: str = _opt(
        "zkDigestAuthFile", "", "file holding user:password, the cluster's ZooKeeper digest identity (Vellum's)"
    )
    # --- TLS to ZooKeeper (Vellum's keys: BookKeeper passes ZooKeeper's zookeeper.client.secure and
    # zookeeper.ssl.* Java system properties instead; docs/security.md section 5) ---
    zk_tls_enabled: bool = _opt(
        "zkTlsEnabled", False,
        "connect to ZooKeeper with TLS; metadataServiceUri names its secureClientPort (ZooKeeper's "
        "zookeeper.client.secure)",
    )
    zk_tls_trust_store: str = _opt(
        "zkTlsTrustStore", "",
        "CA certificate(s), PEM file, that ZooKeeper's certificate must chain to (zookeeper.ssl.trustStore.location)",
    )
    zk_tls_certificate_path: str = _opt(
        "zkTlsCertificatePath", "",
        "client certificate (chain), PEM file, presented to ZooKeeper (needed when its ssl.clientAuth=need, its "
        "default); with the key in it unless zkTlsKeyStore",
    )
    zk_tls_key_store: str = _opt(
        "zkTlsKeyStore", "",
        "private key of zkTlsCertificatePath, PEM file (zookeeper.ssl.keyStore.location holds both)",
    )
    zk_tls_key_store_password_path: str = _opt(
        "zkTlsKeyStorePasswordPath", "", "file holding the password of an encrypted zkTlsKeyStore"
    )
    zk_tls_hostname_verification_enabled: bool = _opt(
        "zkTlsHostnameVerificationEnabled", True,
        "check that ZooKeeper's certificate names the host in metadataServiceUri (ZooKeeper's "
        "zookeeper.ssl.hostnameVerification, on by default)",
    )

    def __post_init__(self) -> None:
        _validate_ranges(self)
        _validate_tls(self)
        _validate_server_auth(self)
        _validate_logs_and_metrics(self)
        _validate_zk_security(self)
        if self.tls_enabled and not (self.tls_key_store and self.tls_certificate_path):
            raise ConfigError("tlsProviderFactoryClass turns TLS on: set tlsCertificatePath and tlsKeyStore too "
                              "(`vellum security issue-cert --role bookie` makes them)")
        if self.tls_enabled and self.tls_client_authentication and not self.tls_trust_store:
            raise ConfigError("tlsClientAuthentication=true needs tlsTrustStore (the CA certificate clients chain to)")
        if self.disk_usage_warn_threshold > self.disk_usage_threshold:
            raise ConfigError(
                f"diskUsageWarnThreshold ({self.disk_usage_warn_threshold}) must not exceed "
                f"diskUsageThreshold ({self.disk_usage_threshold})"
            )
        if self.disk_usage_lwm_threshold > self.disk_usage_threshold:
            raise ConfigError(
                f"diskUsageLwmThreshold ({self.disk_usage_lwm_threshold}) must not exceed "
                f"diskUsageThreshold ({self.disk_usage_threshold})"
            )
        validate_compaction_order(
            self.minor_compaction_interval_s, self.minor_compaction_threshold,
            self.major_compaction_interval_s, self.major_compaction_threshold,
        )
        if not self.journal_directories:
            raise ConfigError("journalDirectories must name at least one directory")
        if not self.ledger_directories:
            raise ConfigError("ledgerDirectories must name at least one directory")
        if self.journal_alignment_size_bytes & (self.journal_alignment_size_bytes - 1):
            raise ConfigError(
                f"journalAlignmentSize ({self.journal_alignment_size_bytes}) must be a power of two"
            )
        if self.journal_direct_io and self.journal_format_version_to_write < 5:
            raise ConfigError(
                f"journalDirectIO=true needs journalFormatVersionToWrite >= 5 (padding records keep "
                f"every flush aligned), not {self.journal_format_version_to_write}: raise the version "
                "or set journalDirectIO=false"
            )
        if self.db_storage_direct_io_entry_logger and self.entry_log_per_ledger_enabled:
            raise ConfigError(
                "dbStorage_directIOEntryLogger=true cannot be combined with entryLogPerLedgerEnabled=true "
                "(BookKeeper does not support it either: one aligned write buffer per active log): "
                "turn one of them off"
            )

    def write_cache_max_bytes(self, memory_bytes: int) -> int:
        """The write cache of the whole bookie, for a process that may use ``memory_bytes``:
        the configured size, or 25% of that memory when the key is 0 (at least 16 MiB)."""
        if self.db_storage_write_cache_max_size_mb > 0:
            return self.db_storage_write_cache_max_size_mb * 1024 * 1024
        return max(16 * 1024 * 1024, memory_bytes // 4)

    @property
    def metrics_port_enabled(self) -> bool:
        """Does the bookie open its metrics port (``enableStatistics`` and ``prometheusStatsHttpEnable``)?"""
        return self.enable_statistics and self.prometheus_stats_http_enable

    @property
    def effective_index_directories(self) -> tuple[str, ...]:
        return self.index_directories or self.ledger_directories

    @property
    def tls_enabled(self) -> bool:
        return bool(self.tls_provider_factory_class)

    @property
    def auth_providers(self) -> tuple[str, ...]:
        """``bookieAuthProviderFactoryClass`` as Vellum's provider names (tls, token)."""
        return tuple(dict.fromkeys(_auth_provider(v, "bookieAuthProviderFactoryClass")
                                   for v in self.bookie_auth_provider_factory_class))

    @property
    def token_verification_enabled(self) -> bool:
        return bool(self.token_secret_key_file or self.token_public_key_file)

    @property
    def http_client_certificates(self) -> bool:
        """Does the admin HTTP API see client certificates (https that requires them)?"""
        return self.http_server_tls_enable and bool(self.http_server_trust_store_path)

    @property
    def admin_credential_required(self) -> bool:
        """Do mutating admin HTTP calls need an admin credential? With a token key, always
        (as before); and whenever the bookie port requires authentication, unless
        ``httpServerAdminInsecure``."""
        return self.token_verification_enabled or (bool(self.auth_providers) and not self.http_server_admin_insecure)

    @property
    def master_key_check_enabled(self) -> bool:
        """``ledgerMasterKeyCheck``: auto = on when the bookie port requires authentication."""
        if self.master_key_check == "auto":
            return bool(self.auth_providers)
        return self.master_key_check == "true"

    def client_placement_values(self) -> dict[str, Any]:
        """``ClientConfig`` placement keys for this bookie's own clients (AutoRecovery picks
        replacement bookies with them), as set in the bookie's file."""
        by_name = {f.name: f for f in dataclasses.fields(self)}
        return {by_name[n].metadata["key"]: getattr(self, n) for n in PLACEMENT_FIELDS}

    def client_security_values(self) -> dict[str, Any]:
        """``ClientConfig`` keys for this bookie's own client traffic (re-replication,
        AutoRecovery): TLS with the bookie's certificate (role ``bookie``), authenticated by it,
        and the same ZooKeeper identity and TLS (``zkTls*``). ``authorizedRoles`` must then
        include ``bookie``."""
        out: dict[str, Any] = {
            "zkEnableSecurity": self.zk_enable_security, "zkDigestAuthFile": self.zk_digest_auth_file,
            **{f.metadata["key"]: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name.startswith("zk_tls_")},
            # the bookie port's and ZooKeeper's certificates follow their files alike
            "tlsCertFilesRefreshDurationSeconds": self.tls_cert_files_refresh_duration_s,
        }
        if self.tls_enabled:
            out.update({
                "tlsProviderFactoryClass": self.tls_provider_factory_class,
                "tlsKeyStore": self.tls_key_store, "tlsCertificatePath": self.tls_certificate_path,
                "tlsKeyStorePasswordPath": self.tls_key_store_password_path,
                "tlsTrustStore": self.tls_trust_store,
                "tlsEnabledProtocols": self.tls_enabled_protocols,
                "tlsEnabledCipherSuites": self.tls_enabled_cipher_suites,
            })
            if "tls" in self.auth_providers:
                out["clientAuthProviderFactoryClass"] = "tls"
        return out


@dataclass(frozen=True)
class ClientConfig:
    """Configuration of a client (``bk_client.conf``-style keys)."""

    metadata_service_uri: str = _opt(
        "metadataServiceUri", "", "metadata store URI; empty = sqlite store in ./data/metadata.db"
    )
    ensemble_size: int = _opt("ensembleSize", 3, "default ensemble size of new ledgers", lo=1)
    write_quorum_size: int = _opt("writeQuorumSize", 2, "default write quorum", lo=1)
    ack_quorum_size: int = _opt("ackQuorumSize", 2, "default ack quorum", lo=1)
    digest_type: str = _opt(
        "digestType", "CRC32C", "default digest (BookKeeper: CRC32)",
        choices=("CRC32", "CRC32C", "HMAC", "MAC", "DUMMY"),
    )
    add_entry_timeout_s: float = _opt("addEntryTimeoutSec", 5, "per-bookie add timeout", lo=0.001)
    read_entry_timeout_s: float = _opt("readEntryTimeoutSec", 5, "per-bookie read timeout", lo=0.001)
    speculative_read_timeout_ms: int = _opt(
        "speculativeReadTimeout", 2000, "ask the next replica after this long (0 = off)", lo=0
    )
    explicit_lac_interval_ms: int = _opt(
        "explicitLacInterval", 0, "send explicit LAC when idle this long (0 = off)", lo=0
    )
    max_num_ensemble_changes: int = _opt(
        "maxNumEnsembleChanges", 1 << 31, "ensemble changes allowed per ledger", lo=0
    )
    recovery_read_batch_size: int = _opt("recoveryReadBatchSize", 1, "recovery read batch", lo=1)
    max_adds_in_flight: int = _opt(
        "maxAddsInFlight", 4096, "adds a ledger handle keeps outstanding; later appends queue (Vellum's)", lo=1
    )
    shrink_collect_timeout_s: float = _opt(
        "shrinkCollectTimeoutSec", 600,
        "how long a named ledger's shrink with force waits for each bookie's garbage collection pass "
        "(wire op COLLECT; a pass compacts logs, which may take minutes) (Vellum's)", lo=0.001,
    )
    ensemble_placement_policy: str = _ensemble_placement_policy()
    min_num_racks_per_write_quorum: int = _min_num_racks_per_write_quorum()
    enforce_min_num_racks_per_write_quorum: bool = _enforce_min_num_racks_per_write_quorum()
    network_topology_script_file_name: str = _network_topology_script_file_name()
    network_topology_script_number_args: int = _network_topology_script_number_args()
    network_topology_script_timeout_ms: int = _network_topology_script_timeout_ms()
    repp_dns_resolver_class: str = _repp_dns_resolver_class()
    min_num_zones_per_write_quorum: int = _min_num_zones_per_write_quorum()
    desired_num_zones_per_write_quorum: int = _desired_num_zones_per_write_quorum()
    enforce_strict_zoneaware_placement: bool = _enforce_strict_zoneaware_placement()
    repp_regions_to_write: str = _repp_regions_to_write()
    repp_minimum_regions_for_durability: int = _repp_minimum_regions_for_durability()
    repp_enable_durability_enforcement_in_replace: bool = _repp_enable_durability_enforcement_in_replace()
    zk_timeout_ms: int = _opt("zkTimeout", 10000, "ZooKeeper session timeout", lo=100)
    # --- TLS to bookies (START_TLS; PEM files). client* keys win over tls* ones, as in BookKeeper ---
    tls_provider_factory_class: str = _opt(
        "tlsProviderFactoryClass", "",
        _TLS_ON_DOC + ". With TLS on, every bookie connection starts with START_TLS",
    )
    tls_provider: str = _opt(
        "tlsProvider", "OpenSSL", "TLS implementation: always Python's ssl (OpenSSL); JDK is accepted",
        choices=("OpenSSL", "JDK"),
    )
    tls_key_store_type: str = _opt("tlsKeyStoreType", "PEM", "format of tlsKeyStore: PEM only (BookKeeper: JKS)")
    tls_key_store: str = _opt("tlsKeyStore", "", "the client's private key, PEM file (for mutual TLS)")
    tls_key_store_password_path: str = _opt(
        "tlsKeyStorePasswordPath", "", "file holding the password of an encrypted tlsKeyStore"
    )
    tls_certificate_path: str = _opt(
        "tlsCertificatePath", "", "the client's certificate, PEM file, presented when set (for mutual TLS)"
    )
    tls_trust_store_type: str = _opt(
        "tlsTrustStoreType", "PEM", "format of tlsTrustStore: PEM only (BookKeeper: JKS)"
    )
    tls_trust_store: str = _opt(
        "tlsTrustStore", "", "CA certificate(s), PEM file, that bookie certificates must chain to (required)"
    )
    tls_trust_store_password_path: str = _opt(
        "tlsTrustStorePasswordPath", "", "password file of a JKS/PKCS12 trust store; a PEM one has none"
    )
    client_key_store_type: str = _opt("clientKeyStoreType", "", "overrides tlsKeyStoreType on a client")
    client_key_store: str = _opt("clientKeyStore", "", "overrides tlsKeyStore on a client")
    client_key_store_password_path: str = _opt(
        "clientKeyStorePasswordPath", "", "overrides tlsKeyStorePasswordPath on a client"
    )
    client_trust_store_type: str = _opt("clientTrustStoreType", "", "overrides tlsTrustStoreType on a client")
    client_trust_store: str = _opt("clientTrustStore", "", "overrides tlsTrustStore on a client")
    client_trust_store_password_path: str = _opt(
        "clientTrustStorePasswordPath", "", "overrides tlsTrustStorePasswordPath on a client"
    )
    tls_client_authentication: bool = _opt(
        "tlsClientAuthentication", False,
        "the bookies require client certificates: refuse to start without tlsCertificatePath and tlsKeyStore "
        "(Vellum presents a configured certificate either way)",
    )
    tls_hostname_verification_enabled: bool = _opt(
        "tlsHostnameVerificationEnabled", False, "check that a bookie's certificate names the host connected to"
    )
    start_tls_timeout_s: float = _opt(
        "startTLSTimeoutSecs", 10, "time for START_TLS and the TLS handshake on a new connection", lo=0.001
    )
    tls_cert_files_refresh_duration_s: int = _opt(
        "tlsCertFilesRefreshDurationSeconds", 0,
        "check the certificate, key and trust files this often and reload them when changed (0 = never)",
        lo=0,
    )
    tls_enabled_protocols: tuple[str, ...] = _opt(
        "tlsEnabledProtocols", [], "TLS versions to offer (TLSv1.2, TLSv1.3); empty = TLS 1.2 and later"
    )
    tls_enabled_cipher_suites: tuple[str, ...] = _opt(
        "tlsEnabledCipherSuites", [], "TLS 1.2 cipher suites, OpenSSL names; empty = OpenSSL's defaults"
    )
    # --- authentication to bookies (docs/security.md) ---
    client_auth_provider_factory_class: str = _opt(
        "clientAuthProviderFactoryClass", "",
        "authenticate each bookie connection: token (sends clientAuthToken / clientAuthTokenFile) or tls "
        "(has the bookie check the client certificate at connect time; BookKeeper's "
        "org.apache.bookkeeper.tls.BookieAuthZFactory); empty = send nothing",
    )
    client_auth_token: str = _opt(
        "clientAuthToken", "", "the token itself (prefer clientAuthTokenFile)", secret=True
    )
    client_auth_token_file: str = _opt(
        "clientAuthTokenFile", "", "file holding the token, re-read for each new connection (renewal)"
    )
    # --- metadata store security ---
    zk_enable_security: bool = _opt(
        "zkEnableSecurity", False, "ZooKeeper digest ACLs: authenticate with zkDigestAuthFile (as the bookies)"
    )
    zk_digest_auth_file: str = _opt(
        "zkDigestAuthFile", "", "file holding user:password, the cluster's ZooKeeper digest identity (Vellum's)"
    )
    # --- TLS to ZooKeeper (Vellum's keys: BookKeeper passes ZooKeeper's zookeeper.client.secure and
    # zookeeper.ssl.* Java system properties instead; docs/security.md section 5) ---
    zk_tls_enabled: bool = _opt(
        "zkTlsEnabled", False,
        "connect to ZooKeeper with TLS; metadataServiceUri names its secureClientPort (ZooKeeper's "
        "zookeeper.client.secure)",
    )
    zk_tls_trust_store: str = _opt(
        "zkTlsTrustStore", "",
        "CA certificate(s), PEM file, that ZooKeeper's certificate must chain to (zookeeper.ssl.trustStore.location)",
    )
    zk_tls_certificate_path: str = _opt(
        "zkTlsCertificatePath", "",
        "client certificate (chain), PEM file, presented to ZooKeeper (needed when its ssl.clientAuth=need, its "
        "default); with the key in it unless zkTlsKeyStore",
    )
    zk_tls_key_store: str = _opt(
        "zkTlsKeyStore", "",
        "private key of zkTlsCertificatePath, PEM file (zookeeper.ssl.keyStore.location holds both)",
    )
    zk_tls_key_store_password_path: str = _opt(
        "zkTlsKeyStorePasswordPath", "", "file holding the password of an encrypted zkTlsKeyStore"
    )
    zk_tls_hostname_verification_enabled: bool = _opt(
        "zkTlsHostnameVerificationEnabled", True,
        "check that ZooKeeper's certificate names the host in metadataServiceUri (ZooKeeper's "
        "zookeeper.ssl.hostnameVerification, on by default)",
    )

    def __post_init__(self) -> None:
        _validate_ranges(self)
        _validate_tls(self)
        _validate_zk_security(self)
        if self.client_auth_provider_factory_class.strip():
            provider = _auth_provider(self.client_auth_provider_factory_class, "clientAuthProviderFactoryClass")
            if provider == "token" and bool(self.client_auth_token) == bool(self.client_auth_token_file):
                raise ConfigError("clientAuthProviderFactoryClass=token needs exactly one of clientAuthTokenFile "
                                  "and clientAuthToken (`vellum security issue-token` makes a token)")
            if provider == "tls" and not (self.tls_enabled and self.tls_certificate_path):
                raise ConfigError("clientAuthProviderFactoryClass=tls needs TLS with a client certificate "
                                  "(tlsProviderFactoryClass, tlsCertificatePath, tlsKeyStore)")
        if self.tls_enabled and not (self.client_trust_store or self.tls_trust_store):
            raise ConfigError("tlsProviderFactoryClass turns TLS on: set tlsTrustStore too (the CA certificate "
                              "bookie certificates chain to)")
        if self.tls_enabled and self.tls_client_authentication and not (
            (self.client_key_store or self.tls_key_store) and self.tls_certificate_path
        ):
            raise ConfigError("tlsClientAuthentication=true on a client needs tlsCertificatePath and tlsKeyStore")
        if not self.ensemble_size >= self.write_quorum_size >= self.ack_quorum_size:
            raise ConfigError(
                "need ensembleSize >= writeQuorumSize >= ackQuorumSize, got "
                f"{self.ensemble_size} >= {self.write_quorum_size} >= {self.ack_quorum_size}"
            )


    @property
    def tls_enabled(self) -> bool:
        return bool(self.tls_provider_factory_class)


# ---------------------------------------------------------------------------------------------

#: Vellum's authentication providers by the names a file may use (BookKeeper's class names too)
_AUTH_PROVIDERS = {
    "tls": "tls", "bookieauthzfactory": "tls", "org.apache.bookkeeper.tls.bookieauthzfactory": "tls",
    "token": "token", "tokenauthproviderfactory": "token", "vellum.security.auth.tokenauthproviderfactory": "token",
}


def _auth_provider(value: str, key: str) -> str:
    name = _AUTH_PROVIDERS.get(value.strip().lower())
    if name is None:
        raise ConfigError(
            f"{key}={value} is refused: Vellum's authentication providers are tls (mutual TLS; BookKeeper's "
            "org.apache.bookkeeper.tls.BookieAuthZFactory) and token (signed tokens)"
        )
    return name


def _validate_server_auth(cfg: ServerConfig) -> None:
    providers = cfg.auth_providers
    if cfg.authorized_roles and not providers:
        raise ConfigError("authorizedRoles needs bookieAuthProviderFactoryClass (tls and/or token): roles come "
                          "from an authenticated certificate or token")
    if cfg.token_secret_key_file and cfg.token_public_key_file:
        raise ConfigError("set one of tokenSecretKeyFile (HS256) and tokenPublicKeyFile (RS256/ES256), not both")
    if "tls" in providers and not (cfg.tls_enabled and cfg.tls_client_authentication):
        raise ConfigError("bookieAuthProviderFactoryClass=tls takes the principal from the client certificate: "
                          "set tlsProviderFactoryClass and tlsClientAuthentication=true")
    if "token" in providers and not cfg.token_verification_enabled:
        raise ConfigError("bookieAuthProviderFactoryClass=token needs tokenSecretKeyFile or tokenPublicKeyFile "
                          "(the key that verifies tokens)")
    if cfg.http_server_tls_enable and not cfg.http_server_key_store_path:
        raise ConfigError("httpServerTlsEnable=true needs httpServerKeyStorePath (PEM private key) and the "
                          "certificate (in it, or httpServerCertificatePath)")
    if cfg.http_server_token_required_for_reads and not cfg.token_verification_enabled:
        raise ConfigError("httpServerTokenRequiredForReads=true needs tokenSecretKeyFile or tokenPublicKeyFile")
    if cfg.token_audience.strip() == cfg.http_server_token_audience.strip():
        raise ConfigError(f"tokenAudience and httpServerTokenAudience are both {cfg.token_audience!r}: a token for "
                          "the bookie port would open the admin HTTP API too; give them different values")
    if (providers and cfg.http_server_enabled and not cfg.http_server_admin_insecure
            and not cfg.token_verification_enabled and not cfg.http_client_certificates):
        raise ConfigError(
            f"bookieAuthProviderFactoryClass={','.join(providers)} requires authentication on the bookie port, but "
            "nothing would authenticate admin HTTP calls: anyone reaching httpServerPort could trigger GC, switch "
            "the bookie read-only or decommission it. Set tokenSecretKeyFile or tokenPublicKeyFile (admin tokens), "
            "or httpServerTlsEnable=true with httpServerTrustStorePath (client certificates with the admin role), "
            "or httpServerEnabled=false; to run it open on purpose, set httpServerAdminInsecure=true"
        )


def _validate_logs_and_metrics(cfg: ServerConfig) -> None:
    logs.parse_levels(cfg.log_levels)
    if cfg.log_config_file and cfg.log_file:
        raise ConfigError(f"logConfigFile={cfg.log_config_file} configures the handlers itself, logFile={cfg.log_file} "
                          "too: name the file in the dictConfig (a logging.handlers.RotatingFileHandler) and remove "
                          "logFile, or remove logConfigFile")
    if cfg.log_config_file:
        logs.load_config_file(cfg.log_config_file)
    port = cfg.prometheus_stats_http_port
    if not cfg.metrics_port_enabled or port == 0:
        return
    if port == cfg.bookie_port:
        raise ConfigError(f"prometheusStatsHttpPort and bookiePort are both {port}: give the metrics port another "
                          "port, or prometheusStatsHttpEnable=false")
    if cfg.http_server_enabled and port == cfg.http_server_port:
        raise ConfigError(f"prometheusStatsHttpPort and httpServerPort are both {port}: the admin HTTP server "
                          "already serves /metrics there; set prometheusStatsHttpEnable=false, or another port")


def _validate_zk_security(obj: Any) -> None:
    if obj.zk_enable_security and not obj.zk_digest_auth_file:
        raise ConfigError("zkEnableSecurity=true needs zkDigestAuthFile (a file holding user:password, the "
                          "cluster's ZooKeeper identity; Vellum uses digest ACLs, not SASL)")
    if obj.zk_tls_enabled and not obj.zk_tls_trust_store:
        raise ConfigError("zkTlsEnabled=true needs zkTlsTrustStore (the CA certificate ZooKeeper's certificate "
                          "chains to)")
    if obj.zk_tls_key_store_password_path and not (obj.zk_tls_key_store or obj.zk_tls_certificate_path):
        raise ConfigError("zkTlsKeyStorePasswordPath needs zkTlsKeyStore (the encrypted key it unlocks)")


def _validate_tls(obj: Any) -> None:
    """The TLS keys shared by both sides: a known factory, PEM stores when TLS is on."""
    factory = obj.tls_provider_factory_class.strip()
    if factory and factory.rsplit(".", 1)[-1] != TLS_CONTEXT_FACTORY.rsplit(".", 1)[-1]:
        raise ConfigError(
            f"tlsProviderFactoryClass={factory} is refused: Vellum's TLS is BookKeeper's TLSContextFactory with "
            f"PEM files; set tlsProviderFactoryClass={TLS_CONTEXT_FACTORY} or remove the key"
        )
    if not factory:
        return
    types = [("tlsKeyStoreType", obj.tls_key_store_type), ("tlsTrustStoreType", obj.tls_trust_store_type)]
    types += [(k, getattr(obj, f)) for k, f in (("clientKeyStoreType", "client_key_store_type"),
                                                 ("clientTrustStoreType", "client_trust_store_type"))
              if getattr(obj, f, "")]
    for key, value in types:
        if value.strip().upper() != "PEM":
            raise ConfigError(
                f"{key}={value} is refused: Vellum reads PEM files only; convert the store (PKCS12: `openssl "
                f"pkcs12 -in store.p12 -nodes -out store.pem`; JKS: `keytool -importkeystore -deststoretype "
                f"PKCS12` first) and set {key}=PEM"
            )


def compaction_enabled(interval_s: int, threshold: float) -> bool:
    """Is a scheduled (minor or major) compaction on? BookKeeper's rule: its interval and its
    threshold are both positive (``<= 0`` on either turns it off)."""
    return interval_s > 0 and threshold > 0


def validate_compaction_order(
    minor_interval_s: int, minor_threshold: float, major_interval_s: int, major_threshold: float
) -> None:
    """When minor and major compaction are both on, minor must be strictly below major in
    threshold (it takes the emptier entry logs) and in interval (it runs more often), as
    BookKeeper's GC thread requires; equal values are refused too. A compaction turned off
    (``compaction_enabled``) orders nothing. Raises ``ConfigError`` naming both keys and values."""
    if not (compaction_enabled(minor_interval_s, minor_threshold)
            and compaction_enabled(major_interval_s, major_threshold)):
        return
    if minor_threshold >= major_threshold:
        raise ConfigError(
            f"minorCompactionThreshold ({minor_threshold}) must be below majorCompactionThreshold "
            f"({major_threshold}) when both compactions are on: lower the minor one or raise the major "
            "one, or turn one off with its interval <= 0 (docs/operations.md)"
        )
    if minor_interval_s >= major_interval_s:
        raise ConfigError(
            f"minorCompactionInterval ({minor_interval_s}s) must be below majorCompactionInterval "
            f"({major_interval_s}s) when both compactions are on: shorten the minor one or lengthen the "
            "major one, or turn one off with its interval <= 0 (docs/operations.md)"
        )


def _validate_ranges(obj: Any) -> None:
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        lo, hi, choices = f.metadata.get("lo"), f.metadata.get("hi"), f.metadata.get("choices")
        key = f.metadata.get("key", f.name)
        if lo is not None and value < lo:
            raise ConfigError(f"{key}={value} is below its minimum {lo}")
        if hi is not None and value > hi:
            raise ConfigError(f"{key}={value} is above its maximum {hi}")
        if choices is not None and value not in choices:
            raise ConfigError(f"{key}={value!r} is not one of {', '.join(choices)}")


_UNIT = re.compile(r"^\s*-?[0-9][0-9_.,]*\s*[A-Za-z%]+\s*$")


def _convert(cls: type, name: str, key: str, raw: Any) -> Any:
    hint = get_type_hints(cls)[name]
    if not isinstance(raw, str):
        if hint is tuple[str, ...] and isinstance(raw, (list, tuple)):
            return tuple(str(x) for x in raw)
        return raw
    text = raw.strip()
    try:
        if hint is bool:
            low = text.lower()
            if low in ("true", "yes", "1", "on"):
                return True
            if low in ("false", "no", "0", "off"):
                return False
            raise ValueError(text)
        if hint is int:
            return int(float(text)) if "e" in text.lower() else int(text)
        if hint is float:
            return float(text)
        if hint == tuple[str, ...]:
            return tuple(p.strip() for p in text.split(",") if p.strip())
    except ValueError:
        kind = getattr(hint, "__name__", hint)
        if hint in (int, float) and _UNIT.match(text):
            raise ConfigError(
                f"{key}={raw!r} is not a valid {kind}: write a plain number, without a unit or "
                "separators (the unit is part of the key's name, e.g. journalMaxSizeMB, flushInterval in ms)"
            ) from None
        raise ConfigError(f"{key}={raw!r} is not a valid {kind}") from None
    return text


def _keys_read_elsewhere(cls: type, reason: str) -> dict[str, str]:
    return {f.metadata["key"]: reason for f in dataclasses.fields(cls)}


#: Keys of the other configuration class, accepted in a file that serves both sides (a client
#: key in a bookie's file, or the reverse), as BookKeeper's files often do.
_OTHER_SIDE: dict[type, dict[str, str]] = {
    ServerConfig: _keys_read_elsewhere(ClientConfig, "client setting: read by Vellum's client, not by a bookie"),
    ClientConfig: _keys_read_elsewhere(ServerConfig, "bookie setting: read by a bookie, not by a client"),
}


def build_config(
    cls: type[_T],
    values: dict[str, Any],
    *,
    source: str = "",
    lines: dict[str, int] | None = None,
    accepted: dict[str, str] | None = None,
) -> _T:
    """Build ``cls`` from camelCase or snake_case keys. BookKeeper keys that are not settings
    are resolved (aliases), refused (``config_keys.REFUSED_WHEN``) or skipped; a skipped key
    goes to ``accepted`` (key -> reason) if given. A key no BookKeeper release defines raises
    with a suggestion. ``lines`` (key -> line number) makes errors name ``source:line``."""
    by_key: dict[str, str] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        by_key[f.name] = f.name
        by_key[f.metadata["key"]] = f.name

    def where(key: str | None = None) -> str:
        if not source:
            return ""
        line = (lines or {}).get(key or "")
        return f" in {source}:{line}" if line else f" in {source}"

    if any(k in values for k in config_keys.ALIASES) and "metadataServiceUri" in by_key:
        values = config_keys.resolve_aliases(values, where=source)
    kwargs: dict[str, Any] = {}
    for key, raw in values.items():
        name = by_key.get(key)
        if name is None:
            reason = config_keys.ACCEPTED.get(key) or _OTHER_SIDE.get(cls, {}).get(key)
            if reason is not None:
                config_keys.check_refused(key, str(raw), where=where(key).removeprefix(" in "))
                if accepted is not None:
                    accepted[key] = reason
                continue
            close = difflib.get_close_matches(key, list(by_key), n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"unknown configuration key {key!r}{where(key)}{hint}")
        try:
            kwargs[name] = _convert(cls, name, key, raw)
        except ConfigError as e:
            raise ConfigError(f"{e}{where(key)}") from None
    try:
        return cls(**kwargs)
    except ConfigError as e:
        raise ConfigError(f"{e}{where()}") from None


def parse_conf_file(path: str | Path) -> dict[str, str]:
    """Read a ``bk_server.conf``-style file into raw key -> value strings."""
    return {k: v for k, (v, _line) in parse_conf_lines(path).items()}


def parse_conf_lines(path: str | Path) -> dict[str, tuple[str, int]]:
    """Read a ``bk_server.conf``-style file into key -> (raw value, line number). A key given
    twice, a line without ``=`` and a file that is not UTF-8 are errors naming the file and line."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read configuration file {p}: {e.strerror}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        bad_line = data.count(b"\n", 0, e.start) + 1
        raise ConfigError(
            f"{p}:{bad_line}: byte 0x{data[e.start]:02x} is not UTF-8 (the file is in another encoding); "
            "save it as UTF-8 (key names and values are ASCII in BookKeeper's files)"
        ) from None
    out: dict[str, tuple[str, int]] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#") or s.startswith("!"):
            continue
        if "=" not in s:
            raise ConfigError(f"{p}:{lineno}: expected key=value, got {s!r}")
        k, v = s.split("=", 1)
        k = k.strip()
        if k in out:
            raise ConfigError(
                f"{p}:{lineno}: {k} is given twice (first on line {out[k][1]}): keep one of them"
            )
        out[k] = (v.strip(), lineno)
    return out


def load_server_config(
    path: str | Path | None = None, *, accepted: dict[str, str] | None = None, **overrides: Any
) -> ServerConfig:
    """The server configuration from ``path`` (over the defaults) and ``overrides``; keys that
    BookKeeper defines but Vellum does not use go to ``accepted`` (key -> reason) if given."""
    parsed = parse_conf_lines(path) if path else {}
    values: dict[str, Any] = {k: v for k, (v, _line) in parsed.items()}
    values.update(overrides)
    return build_config(
        ServerConfig, values, source=str(path) if path else "",
        lines={k: line for k, (_v, line) in parsed.items()}, accepted=accepted,
    )


def load_client_config(path: str | Path, **overrides: Any) -> ClientConfig:
    """The client configuration from a ``key=value`` file (BookKeeper's client keys; bookie keys
    in the same file are accepted, as in a shared ``bk_server.conf``) and ``overrides``."""
    parsed = parse_conf_lines(path)
    values: dict[str, Any] = {k: v for k, (v, _line) in parsed.items()}
    values.update(overrides)
    return build_config(ClientConfig, values, source=str(path), lines={k: line for k, (_v, line) in parsed.items()})


def describe(config: Any) -> list[tuple[str, str, Any, Any, str]]:
    """Rows (key, field name, value, default, doc) for ``vellum config show``."""
    rows = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.metadata.get("secret") and value:
            value = "(set, not shown)"
        rows.append((f.metadata["key"], f.name, value, f.default, f.metadata["doc"]))
    return rows
