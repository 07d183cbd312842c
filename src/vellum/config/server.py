"""The bookie's configuration (``bk_server.conf``): ``ServerConfig``, its own keys over the
groups it shares with the client (``vellum.config.shared``), and the checks across them.
Where Vellum's default differs from BookKeeper's code default, the field's doc says why. No I/O
(but ``logConfigFile``, which is read to check it)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from vellum import logs
from vellum.config.bookie_security import BookieSecurityKeys
from vellum.config.declare import opt, validate_ranges
from vellum.config.shared import (
    PLACEMENT_FIELDS,
    MetadataKeys,
    PlacementKeys,
    TlsKeys,
    validate_tls,
    validate_zk_security,
)
from vellum.errors import ConfigError


@dataclass(frozen=True)
class ServerConfig(BookieSecurityKeys, TlsKeys, PlacementKeys, MetadataKeys):
    """Configuration of one bookie (``bk_server.conf``)."""

    # --- identity and network ---
    bookie_port: int = opt("bookiePort", 3181, "TCP port of the bookie protocol", lo=0, hi=65535)
    bookie_id: str = opt("bookieId", "", "explicit bookie id; empty = advertised_address:port")
    advertised_address: str = opt(
        "advertisedAddress", "",
        "address other processes use to reach this bookie (the host of its id); empty = the address of "
        "listeningInterface, else 127.0.0.1",
    )
    bookie_bind_address: str = opt(
        "bookieBindAddress", "",
        "address the bookie port binds (0.0.0.0 = every interface); empty = the address of listeningInterface, "
        "else the advertised address, which must be an address of this host (Vellum's)",
    )
    listening_interface: str = opt(
        "listeningInterface", "",
        "network interface (e.g. eth0) whose IPv4 address the bookie binds and, unless advertisedAddress is "
        "set, advertises; empty or 'default' = not used",
    )
    netty_max_frame_size_bytes: int = opt(
        "nettyMaxFrameSizeBytes", 5242880, "largest accepted wire frame", lo=1024, hi=1 << 30
    )
    max_adds_in_progress_limit: int = opt(
        "maxAddsInProgressLimit",
        10000,
        "adds in flight per bookie before TOOMANYREQUESTS (BookKeeper: 0 = unlimited; "
        "Vellum bounds memory by default)",
        lo=0,
    )
    max_reads_in_progress_limit: int = opt(
        "maxReadsInProgressLimit",
        10000,
        "reads in flight per bookie before TOOMANYREQUESTS (BookKeeper: 0 = unlimited)",
        lo=0,
    )
    # --- what unauthenticated and idle connections may cost (Vellum's keys; docs/security.md) ---
    unauthenticated_max_frame_size_bytes: int = opt(
        "unauthenticatedMaxFrameSizeBytes", 16384,
        "Vellum's own key: the largest frame a connection may send before it is authenticated (and upgraded "
        "to TLS when required; nettyMaxFrameSizeBytes after); a longer one closes the connection. At least "
        "9216: an AUTH carrying the largest token (8 KiB) must fit",
        lo=9216, hi=1 << 30,
    )
    unauthenticated_connections_limit: int = opt(
        "unauthenticatedConnectionsLimit", 500,
        "Vellum's own key: connections per bookie not yet authenticated (and upgraded to TLS when required); "
        "a new one past it closes the oldest such connection. Keep it well below the descriptor limit "
        "(ulimit -n). 0 = no bound",
        lo=0,
    )
    authentication_timeout_ms: int = opt(
        "authenticationTimeoutMs", 10000,
        "Vellum's own key: a connection not authenticated (and upgraded to TLS when required) this long "
        "after its accept is closed; only with TLS or authentication on. 0 = no deadline",
        lo=0,
    )
    connection_idle_timeout_ms: int = opt(
        "connectionIdleTimeoutMs", 0,
        "Vellum's own key: an authenticated connection with no traffic and no request in progress (a waiting "
        "long-poll LAC read is one) for this long is closed; clients reconnect at their next request. "
        "0 = never (the default: a close racing a client's new add fails that add)",
        lo=0,
    )
    connection_refusal_log_period_s: int = opt(
        "connectionRefusalLogPeriodSeconds", 60,
        "Vellum's own key: a connection refusal (failed AUTH or TLS handshake, timeouts, oversized frame "
        "before authentication, ...) is logged once per reason, peer address and period, with the count of "
        "those not logged; every refusal is counted in bookkeeper_server_REFUSED. 0 = log each one",
        lo=0,
    )
    # --- directories ---
    journal_directories: tuple[str, ...] = opt(
        "journalDirectories", ["/tmp/bk-txn"], "journal directories (one journal thread each)"
    )
    ledger_directories: tuple[str, ...] = opt(
        "ledgerDirectories", ["/tmp/bk-data"], "ledger directories (entry logs + index)"
    )
    index_directories: tuple[str, ...] = opt(
        "indexDirectories", [], "RocksDB index directories; empty = the ledger directories"
    )
    allow_storage_expansion: bool = opt(
        "allowStorageExpansion", False, "allow new ledger dirs to be added to a cookie"
    )
    data_integrity_checking: bool = opt(
        "dataIntegrityChecking", False,
        "a bookie that may have lost data (dirs stamped over, unclean shutdown without journal fsync) marks "
        "its ledgers limbo, answers 'unknown' for what it lacks and copies it back from the other replicas",
    )
    data_integrity_stamp_missing_cookies: bool = opt(
        "dataIntegrityStampMissingCookies", False,
        "with dataIntegrityChecking: stamp over the cookies of wiped dirs instead of refusing to start",
    )
    # --- journal ---
    journal_format_version_to_write: int = opt(
        "journalFormatVersionToWrite", 6, "journal file format version", lo=4, hi=6
    )
    journal_max_size_mb: int = opt(
        "journalMaxSizeMB", 2048, "roll the journal file past this size", lo=1
    )
    journal_max_backups: int = opt(
        "journalMaxBackups", 5, "journal files kept below the last mark", lo=0
    )
    journal_pre_alloc_size_mb: int = opt(
        "journalPreAllocSizeMB", 16, "journal preallocation step", lo=1
    )
    journal_write_buffer_size_kb: int = opt(
        "journalWriteBufferSizeKB", 64, "journal write buffer", lo=1
    )
    journal_sync_data: bool = opt(
        "journalSyncData", True, "fsync the journal before acknowledging (never turn off in production)"
    )
    journal_max_group_wait_ms: float = opt(
        "journalMaxGroupWaitMSec", 2, "group commit: flush when the oldest entry waited this long", lo=0
    )
    journal_buffered_writes_threshold_bytes: int = opt(
        "journalBufferedWritesThreshold", 524288, "group commit: flush past this many bytes", lo=0
    )
    journal_buffered_entries_threshold: int = opt(
        "journalBufferedEntriesThreshold", 0, "group commit: flush past this many entries (0 = off)", lo=0
    )
    journal_flush_when_queue_empty: bool = opt(
        "journalFlushWhenQueueEmpty",
        True,
        "group commit: flush as soon as the queue is empty (BookKeeper: false; with a separate "
        "force-write stage batches still form while an fsync runs, without a fixed wait)",
    )
    journal_force_write_thread: bool = opt(
        "journalForceWriteThread",
        False,
        "fsync on a separate force-write thread while the writer writes the next batch "
        "(BookKeeper's structure); false: the writer fsyncs each batch itself and the records "
        "queued meanwhile form the next one (one thread hand-off fewer per group commit)",
    )
    journal_remove_from_page_cache: bool = opt(
        "journalRemoveFromPageCache",
        True,
        "drop journal pages from the OS page cache once fsynced (only replay reads them; freed "
        "pages are reused at once instead of the cache growing over fresh memory)",
    )
    journal_alignment_size_bytes: int = opt(
        "journalAlignmentSize", 512,
        "journal flushes are padded to this alignment; with journalDirectIO every write is aligned "
        "to it, so it must be at least the disk's logical sector size (4096 on 4Kn disks)",
        lo=512, hi=1 << 20,
    )
    journal_direct_io: bool = opt(
        "journalDirectIO",
        False,
        "Vellum's own key: write journals with O_DIRECT from aligned buffers, at least 1 MiB per "
        "write (same file format, fsync kept; meant for big entries; the space ahead is left as "
        "holes, not zeroed); falls back to buffered writes with a warning where the filesystem "
        "refuses O_DIRECT",
    )
    journal_queue_size: int = opt("journalQueueSize", 10000, "journal queue capacity", lo=1)
    # --- entry logs and ledger storage ---
    log_size_limit_bytes: int = opt(
        "logSizeLimit", 1073741824, "rotate an entry log past this size", lo=1024 + 64, hi=(1 << 31) - 1
    )
    entry_log_file_preallocation_enabled: bool = opt(
        "entryLogFilePreallocationEnabled", True, "preallocate the next entry log"
    )
    flush_interval_ms: int = opt(
        "flushInterval", 10000, "checkpoint period (flush ledger storage, persist lastMark)", lo=1
    )
    flush_entrylog_bytes: int = opt(
        "flushEntrylogBytes",
        1048576,
        "fsync the entry log every N bytes written (0 = at flush only; BookKeeper: 0; small steps "
        "keep a write-cache flush from queueing tens of MB ahead of the journal's fsync on a shared disk)",
        lo=0,
    )
    db_storage_write_cache_max_size_mb: int = opt(
        "dbStorage_writeCacheMaxSizeMb",
        0,
        "write cache per bookie, split across ledger dirs and in two; 0 = 25% of the memory the "
        "bookie may use (its cgroup limit, else the machine's RAM), as BookKeeper "
        "(25% of direct memory) sizes it",
        lo=0,
    )
    db_storage_read_ahead_cache_max_size_mb: int = opt(
        "dbStorage_readAheadCacheMaxSizeMb",
        64,
        "read-ahead cache per bookie, split across ledger dirs (BookKeeper: 25% of direct memory)",
        lo=0,
    )
    db_storage_read_ahead_cache_batch_size: int = opt(
        "dbStorage_readAheadCacheBatchSize", 100, "entries read ahead after a cache miss", lo=0
    )
    db_storage_read_ahead_cache_batch_bytes_size: int = opt(
        "dbStorage_readAheadCacheBatchBytesSize",
        262144,
        "bytes read ahead after a cache miss at most, -1 = no bound (BookKeeper: -1; big entries "
        "gain nothing from read-ahead but the copy, and pipelined readers ask for them anyway)",
        lo=-1,
    )
    db_storage_max_throttle_time_ms: int = opt(
        "dbStorage_maxThrottleTimeMs", 10000, "wait for a full write cache before rejecting", lo=0
    )
    db_storage_direct_io_entry_logger: bool = opt(
        "dbStorage_directIOEntryLogger",
        False,
        "write entry logs with O_DIRECT from aligned buffers (same file format as buffered; reads "
        "stay buffered); not with entryLogPerLedgerEnabled (as in BookKeeper); falls back to "
        "buffered writes with a warning where the filesystem refuses O_DIRECT",
    )
    db_storage_direct_io_entry_logger_total_write_buffer_size_mb: int = opt(
        "dbStorage_directIOEntryLoggerTotalWriteBufferSizeMB",
        64,
        "aligned write buffers of the direct-I/O entry logger, split across ledger dirs (one per "
        "dir's active log; BookKeeper: 12.5% of direct memory)",
        lo=1,
    )
    entry_log_per_ledger_enabled: bool = opt(
        "entryLogPerLedgerEnabled", False, "one active entry log per active ledger (docs/gc.md)"
    )
    entrylog_map_access_expiry_time_s: int = opt(
        "entrylogMapAccessExpiryTimeInSeconds", 300, "evict idle ledger -> active log mappings", lo=1
    )
    maximum_number_of_active_entry_logs: int = opt(
        "maximumNumberOfActiveEntryLogs", 500, "cap on active logs in entry-log-per-ledger mode", lo=1
    )
    # --- disks ---
    disk_usage_threshold: float = opt(
        "diskUsageThreshold", 0.95,
        "a ledger dir above this usage is full; usage = 1 - usable/total of its filesystem, usable being "
        "what the bookie's user can still write (blocks reserved for root count as used), as in BookKeeper",
        lo=0.0, hi=1.0,
    )
    disk_usage_warn_threshold: float = opt(
        "diskUsageWarnThreshold", 0.90, "warn and suspend major compaction above this", lo=0.0, hi=1.0
    )
    disk_usage_lwm_threshold: float = opt(
        "diskUsageLwmThreshold", 0.95, "a full dir is writable again below this", lo=0.0, hi=1.0
    )
    disk_check_interval_ms: int = opt("diskCheckInterval", 10000, "disk usage check period", lo=1)
    read_only_mode_enabled: bool = opt(
        "readOnlyModeEnabled", True, "turn read-only instead of shutting down when all dirs are full"
    )
    force_read_only_bookie: bool = opt("forceReadOnlyBookie", False, "start read-only")
    # --- GC and compaction ---
    gc_wait_time_ms: int = opt("gcWaitTime", 600000, "GC period", lo=1)
    minor_compaction_interval_s: int = opt(
        "minorCompactionInterval", 3600,
        "minor compaction period, seconds (<= 0 disables); below majorCompactionInterval when both are on",
    )
    minor_compaction_threshold: float = opt(
        "minorCompactionThreshold", 0.2,
        "compact logs whose live ratio is below this (0 disables); below majorCompactionThreshold when both "
        "are on", lo=0.0, hi=1.0,
    )
    major_compaction_interval_s: int = opt(
        "majorCompactionInterval", 86400,
        "major compaction period, seconds (<= 0 disables); above minorCompactionInterval when both are on",
    )
    major_compaction_threshold: float = opt(
        "majorCompactionThreshold", 0.8,
        "compact logs whose live ratio is below this (0 disables); above minorCompactionThreshold when both "
        "are on", lo=0.0, hi=1.0,
    )
    minor_compaction_max_time_ms: int = opt(
        "minorCompactionMaxTimeMillis", -1, "max run time of one minor pass (<= 0: no limit)"
    )
    major_compaction_max_time_ms: int = opt(
        "majorCompactionMaxTimeMillis", -1, "max run time of one major pass (<= 0: no limit)"
    )
    compaction_rate_by_entries: int = opt(
        "compactionRateByEntries", 1000, "compaction throttle, entries per second", lo=1
    )
    compaction_rate_by_bytes: int = opt(
        "compactionRateByBytes", 1000000, "compaction throttle, bytes per second", lo=1
    )
    is_throttle_by_bytes: bool = opt("isThrottleByBytes", False, "throttle compaction by bytes")
    is_force_gc_allow_when_no_space: bool = opt(
        "isForceGCAllowWhenNoSpace", False, "keep compacting when disks are (almost) full"
    )
    force_allow_compaction: bool = opt(
        "forceAllowCompaction", False,
        "a forced GC (admin API, shell gc) compacts even when the compaction intervals disable the "
        "scheduled runs, with thresholds strictly between 0 and 1",
    )
    # --- metadata ---
    ledger_manager_type: str = opt(
        "ledgerManagerType", "hierarchical", "ledger layout chosen at format time",
        choices=("flat", "hierarchical", "longhierarchical"),
    )
    # --- AutoRecovery (auditor and replication workers; where replacement bookies go: PlacementKeys) ---
    auto_recovery_daemon_enabled: bool = opt(
        "autoRecoveryDaemonEnabled", False,
        "run an auditor candidate and a replication worker inside the bookie (else: vellum autorecovery)",
    )
    lost_bookie_recovery_delay_s: int = opt(
        "lostBookieRecoveryDelay", 0,
        "seconds a bookie must stay gone before its ledgers are marked under-replicated "
        "(the value set with `vellum shell lostbookierecoverydelay` wins)", lo=0,
    )
    auditor_periodic_bookie_check_interval_s: int = opt(
        "auditorPeriodicBookieCheckInterval", 86400,
        "seconds between scans of every ledger for fragments on unregistered bookies (0 = off)", lo=0,
    )
    auditor_periodic_check_interval_s: int = opt(
        "auditorPeriodicCheckInterval", 604800,
        "seconds between checks that every bookie of every fragment holds its entries (0 = off)", lo=0,
    )
    auditor_ledger_verification_percentage: int = opt(
        "auditorLedgerVerificationPercentage", 0,
        "share of ledgers whose entries the periodic check reads and verifies, not only lists", lo=0, hi=100,
    )
    auditor_replicas_check_interval_s: int = opt(
        "auditorReplicasCheckInterval", 0,
        "seconds between replicas checks: every entry of every closed ledger read from every replica "
        "and verified, which finds data lost or corrupted on bookies that are up (0 = off)", lo=0,
    )
    auditor_periodic_placement_policy_check_interval_s: int = opt(
        "auditorPeriodicPlacementPolicyCheckInterval", 0,
        "seconds between placement checks: ledgers with an ensemble the placement policy would not "
        "choose (e.g. a write quorum on too few racks) are counted and logged (0 = off)", lo=0,
    )
    open_ledger_rereplication_grace_period_ms: int = opt(
        "openLedgerRereplicationGracePeriod", 30000,
        "ms a replication worker leaves the open fragment of an unclosed ledger to its writer before "
        "fencing the ledger to heal it", lo=0,
    )
    rereplication_entry_batch_size: int = opt(
        "rereplicationEntryBatchSize", 10, "entries a replication worker copies at once", lo=1,
    )
    replication_rate_by_bytes: int = opt(
        "replicationRateByBytes", -1, "bytes per second a replication worker copies at most (-1 = no bound)",
    )
    replication_yield_to_foreground: bool = opt(
        "replicationYieldToForeground", True,
        "a replication worker copies fewer entries at once while its requests wait behind foreground "
        "traffic (delay-based, down to one entry in flight) and at full speed on an idle cluster "
        "(Vellum; false: always rereplicationEntryBatchSize in flight)",
    )
    replication_yield_delay_ms: int = opt(
        "replicationYieldDelayMs", 10,
        "queuing delay (ms above the lowest delay seen lately) a yielding replication worker tolerates "
        "before it halves the entries it has in flight", lo=1, hi=60000,
    )
    rw_rereplicate_backoff_ms: int = opt(
        "rwRereplicateBackoffMs", 5000, "ms before a replication worker retries a ledger it failed on", lo=0,
    )
    # --- admin HTTP and stats ---
    http_server_enabled: bool = opt(
        "httpServerEnabled", True, "run the admin HTTP server (BookKeeper: false)"
    )
    http_server_port: int = opt("httpServerPort", 8080, "admin HTTP port", lo=0, hi=65535)
    http_server_host: str = opt(
        "httpServerHost", "",
        "admin HTTP bind address; empty = the bookie port's bind address (loopback unless the bookie "
        "advertises or binds another; BookKeeper: 0.0.0.0)",
    )
    # --- metrics port (BookKeeper's PrometheusMetricsProvider keys; docs/operations.md, Metrics) ---
    enable_statistics: bool = opt(
        "enableStatistics", True,
        "export metrics on prometheusStatsHttpPort; false = no metrics port (the admin HTTP /metrics still "
        "answers: Vellum's counters cost nothing to keep)",
    )
    prometheus_stats_http_enable: bool = opt(
        "prometheusStatsHttpEnable", True,
        "serve GET /metrics on prometheusStatsHttpPort (BookKeeper's provider key). Unlike BookKeeper, Vellum "
        "serves it also when httpServerEnabled=true, so both scrape configurations work",
    )
    prometheus_stats_http_port: int = opt(
        "prometheusStatsHttpPort", 8000,
        "port of the metrics-only HTTP listener (GET /metrics, the same metrics as the admin HTTP /metrics); "
        "0 = any free port (in the READY line and the start log)",
        lo=0, hi=65535,
    )
    prometheus_stats_http_address: str = opt(
        "prometheusStatsHttpAddress", "0.0.0.0",
        "bind address of the metrics port (BookKeeper's default 0.0.0.0: every interface, so that Prometheus "
        "on another host can scrape it; it serves metrics only, never the admin API)",
    )
    # --- logs (Vellum's keys: BookKeeper configures log4j2 in its own file; docs/operations.md, Logs) ---
    log_format: str = opt(
        "logFormat", "logfmt",
        "log line format: logfmt (ts=... level=... logger=... msg=\"...\" bookie=... ledger=... entry=...), "
        "json (one object per line, same keys), text (the plain format of earlier releases)",
        choices=("logfmt", "json", "text"),
    )
    log_levels: str = opt(
        "logLevels", "",
        "levels per module, comma list of module=LEVEL (a bare LEVEL is every module's), e.g. "
        "INFO,vellum.storage=DEBUG,vellum.client=WARNING; empty = INFO (DEBUG with -v)",
    )
    log_file: str = opt(
        "logFile", "", "write the log to this file, rotated by size, instead of stderr; empty = stderr"
    )
    log_file_max_size_mb: int = opt(
        "logFileMaxSizeMb", 100, "logFile is rotated when it would grow past this size", lo=1
    )
    log_file_backups: int = opt(
        "logFileBackups", 10, "rotated logFile copies kept (logFile.1 ... logFile.N, oldest dropped)", lo=0
    )
    log_config_file: str = opt(
        "logConfigFile", "",
        "a logging.config.dictConfig dictionary in a .json file, used instead of logFormat and logFile "
        "(logLevels still applies over it); Vellum's formatters and bookie filter are vellum.logs."
        "LogfmtFormatter, JsonFormatter and BookieIdFilter",
    )

    def __post_init__(self) -> None:
        validate_ranges(self)
        validate_tls(self)
        _validate_server_auth(self)
        _validate_logs_and_metrics(self)
        validate_zk_security(self)
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
