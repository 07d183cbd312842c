"""BookKeeper's configuration keys that are not Vellum settings: what Vellum does with each.

An operator's ``bk_server.conf`` (BookKeeper 4.16-4.18, or Pulsar's ``bookkeeper.conf``) must
load as it is. Every key any of those releases defines falls in one of three kinds:

- **honoured**: a field of ``ServerConfig`` / ``ClientConfig`` (``config.py``), or an older
  spelling mapped onto one (``ALIASES``: ``zkServers`` + ``zkLedgersRootPath`` +
  ``ledgerManagerFactoryClass`` become ``metadataServiceUri``; ``journalDirectory`` is
  ``journalDirectories``);
- **accepted**: meaningful only to BookKeeper's Java implementation (allocators, thread pools,
  Netty, stats providers, other ledger storages) or to a part Vellum does not have yet; the key
  is read and ignored, and the bookie lists it once at start with the reason (``ACCEPTED``);
- **refused for some values**: a value asks for something Vellum cannot do, and doing something
  else silently would mislead the operator (another ledger storage, a host-name bookie id):
  ``REFUSED_WHEN`` names the values and says what Vellum does instead.

A key no BookKeeper release defines is not here: it stays an error with "did you mean".
Pure data and checks: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from vellum.errors import ConfigError

# ------------------------------------------------------------------------------ accepted


def _group(reason: str, *keys: str) -> dict[str, str]:
    return dict.fromkeys(keys, reason)


ACCEPTED: dict[str, str] = {
    **_group(
        "Java/Netty memory allocator setting: Vellum runs on Python's allocator",
        "allocatorExitOnOutOfMemory", "allocatorLeakDetectionPolicy", "allocatorOutOfMemoryPolicy",
        "allocatorPoolingConcurrency", "allocatorPoolingPolicy", "byteBufAllocatorSizeInitial",
        "byteBufAllocatorSizeMax", "byteBufAllocatorSizeMin", "nettyUsePooledBuffers",
    ),
    **_group(
        "Java thread pool setting: a Vellum bookie serves the network on one asyncio loop, adds on "
        "one ordered add thread per connection batch, reads on a small reader pool",
        "numAddWorkerThreads", "numReadWorkerThreads", "numHighPriorityWorkerThreads",
        "numLongPollWorkerThreads", "numJournalCallbackThreads", "numOfMemtableFlushThreads",
        "serverNumAcceptorThreads", "serverNumIOThreads", "enableBusyWait",
        "readWorkerThreadsThrottlingEnabled", "maxPendingAddRequestsPerThread",
        "maxPendingReadRequestsPerThread", "enableTaskExecutionStats", "taskExecutionWarnTimeMicros",
        "preserveMdcForTaskExecution", "requestTimerNumTicks", "requestTimerTickDurationMs",
        "numIOThreads", "numWorkerThreads",
    ),
    **_group(
        "Netty socket setting: Vellum uses the operating system's TCP defaults (TCP_NODELAY on)",
        "serverTcpKeepCnt", "serverTcpKeepIdle", "serverTcpKeepIntvl", "serverTcpLinger",
        "serverTcpNoDelay", "serverSockKeepalive", "serverWriteBufferHighWaterMark",
        "serverWriteBufferLowWaterMark", "enableLocalTransport", "disableServerSocketBind",
        "allowEphemeralPorts", "allowLoopback", "closeChannelOnResponseTimeout",
        "waitTimeoutOnResponseBackpressureMs",
    ),
    **_group(
        "stats provider setting: Vellum exports Prometheus metrics (prometheusStatsHttpPort and the admin "
        "HTTP /metrics), counts without latency summaries, and has no JVM",
        "statsProviderClass", "codahaleStatsCSVEndpoint",
        "codahaleStatsGraphiteEndpoint", "codahaleStatsJmxEndpoint", "codahaleStatsOutputFrequencySeconds",
        "codahaleStatsPrefix", "codahaleStatsSlf4jEndpoint",
        "prometheusStatsLatencyRolloverSeconds", "exposeDefaultJVMMetrics",
        "limitStatsLogging", "sanityCheckMetricsEnabled",
    ),
    **_group(
        "admin HTTP implementation class: Vellum's admin HTTP server is built in (aiohttp)",
        "httpServerClass",
    ),
    **_group(
        "setting of InterleavedLedgerStorage / SortedLedgerStorage index files: Vellum stores "
        "ledgers the DbLedgerStorage way (entry logs + RocksDB index)",
        "fileInfoCacheInitialCapacity", "fileInfoFormatVersionToWrite", "fileInfoMaxIdleTime",
        "openFileLimit", "pageSize", "pageLimit", "skipListArenaChunkSize", "skipListArenaMaxAllocSize",
        "skipListSizeLimit", "sortedLedgerStorageEnabled", "readBufferSizeBytes", "writeBufferSizeBytes",
        "entryLogPerLedgerCounterLimitsMultFactor",
    ),
    **_group(
        "RocksDB tuning file or option: Vellum opens RocksDB (rocksdict) with its own options",
        "defaultRocksdbConf", "entryLocationRocksdbConf", "ledgerMetadataRocksdbConf",
        "entryLocationCompactionInterval", "dbStorage_rocksDB_blockCacheSize", "dbStorage_rocksDB_blockSize",
        "dbStorage_rocksDB_bloomFilterBitsPerKey", "dbStorage_rocksDB_checksum_type",
        "dbStorage_rocksDB_format_version", "dbStorage_rocksDB_logLevel", "dbStorage_rocksDB_logPath",
        "dbStorage_rocksDB_lz4CompressionEnabled", "dbStorage_rocksDB_maxSizeInLevel1MB",
        "dbStorage_rocksDB_numFilesInLevel0", "dbStorage_rocksDB_numLevels", "dbStorage_rocksDB_sstSizeInMB",
        "dbStorage_rocksDB_writeBufferSizeMB",
    ),
    **_group(
        "direct-I/O entry logger read setting: Vellum's direct-I/O entry logger writes with O_DIRECT "
        "but reads through the page cache (the read-ahead cache sits above it) and keeps one read "
        "descriptor per entry log until the log is deleted",
        "dbStorage_directIOEntryLoggerMaxFdCacheTimeSeconds",
        "dbStorage_directIOEntryLoggerReadBufferSizeMB", "dbStorage_directIOEntryLoggerTotalReadBufferSizeMB",
    ),
    **_group(
        "journal tuning of the Java implementation: Vellum's journal groups commits on "
        "journalMaxGroupWaitMSec / journalBufferedWritesThreshold / journalFlushWhenQueueEmpty, "
        "always writes entries to the journal and never reuses journal files",
        "journalAdaptiveGroupWrites", "journalChannelProvider", "journalMaxMemorySizeMb",
        "journalPageCacheFlushIntervalMSec", "journalReuseFiles", "journalWriteData",
        "skipReplayJournalInvalidRecord",
    ),
    **_group(
        "GC and compaction tuning Vellum does not offer: it compacts with compactionRateByEntries / "
        "compactionRateByBytes and keeps entry-log metadata in memory",
        "compactionRate", "compactionMaxOutstandingRequests", "useTransactionalCompaction",
        "useTargetEntryLogSizeForGc", "gcMetadataOpRateLimit", "gcEntryLogMetadataCacheEnabled",
        "gcEntryLogMetadataCachePath", "gcOverreplicatedLedgerWaitTime",
        "gcOverreplicatedLedgerMaxConcurrentRequests", "verifyMetadataOnGC",
    ),
    **_group(
        "AutoRecovery tuning of the Java implementation: Vellum's auditor checks ledgers one at a "
        "time, a failed worker releases its lock at once (another worker or a retry after "
        "rwRereplicateBackoffMs continues), and records always carry their mark time",
        "auditorMaxNumberOfConcurrentOpenLedgerOperations",
        "auditorAcquireConcurrentOpenLedgerOperationsTimeOutMSec",
        "lockReleaseOfFailedLedgerGracePeriod",
        "storeSystemTimeAsLedgerUnderreplicatedMarkTime", "inFlightReadEntryNumInLedgerChecker",
        "zkReplicationTaskRateLimit",
    ),
    **_group(
        "data-integrity setting Vellum does not have yet",
        "localConsistencyCheckOnStartup", "localScrubInterval", "localScrubRateLimit",
    ),
    **_group(
        "metadata-driver setting of the Java implementation: Vellum's drivers are chosen by "
        "metadataServiceUri (zk://, zk+flat://, zk+hierarchical://, sqlite:///)",
        "registrationManagerClass", "registrationClientClass", "metastoreImplClass",
        "metastoreMaxEntriesPerScan", "ledgerManagerFactoryDisableClassCheck",
        "allowShadedLedgerManagerFactoryClass", "shadedLedgerManagerFactoryClassPrefix",
        "ledgerMetadataVersion", "storeSystemTimeAsLedgerCreationTime", "ledgerIdFormatterClass",
        "entryFormatterClass",
    ),
    **_group(
        "ZooKeeper retry / rate setting of the Java client: a Vellum session (timeout zkTimeout) "
        "reconnects at once with a backoff from 0.1 s to 1 s, for as long as it takes, retries a lost "
        "ledger create or delete for up to zkTimeout, and does not rate-limit requests",
        "zkRetryBackoffStartMs", "zkRetryBackoffMaxMs", "zkRetryBackoffMaxRetries", "zkRequestRateLimit",
    ),
    **_group(
        "disk-space setting of the Java implementation: Vellum uses diskUsageThreshold / "
        "diskUsageWarnThreshold / diskUsageLwmThreshold and turns read-only when every ledger dir is full",
        "minUsableSizeForEntryLogCreation", "minUsableSizeForHighPriorityWrites",
        "minUsableSizeForIndexFileCreation", "readOnlyModeOnAnyDiskFullEnabled",
        "allowMultipleDirsUnderSameDiskPartition", "persistBookieStatusEnabled",
    ),
    **_group(
        "bookie lifecycle setting of the Java implementation (component stack, health checks, "
        "startup users, batch-read bound): not used by Vellum",
        "extraServerComponents", "ignoreExtraServerComponentsStartupFailures", "bookieDeathWatchInterval",
        "enableHealthCheck", "permittedStartupUsers", "maxBatchReadSize", "available", "standard", "system",
        "org.apache.bookkeeper.conf.readsystemproperties",
    ),
    **_group(
        "DistributedLog / table-service setting: not part of Vellum",
        "dlog.bkcAckQuorumSize", "dlog.bkcEnsembleSize", "dlog.bkcWriteQuorumSize",
        "storage.cluster.controller.schedule.interval.ms", "storage.range.store.dirs",
        "storage.serve.readonly.tables", "storageserver.grpc.port",
    ),
    **_group(
        "admin HTTP trust store password: Vellum's httpServerTrustStorePath is a PEM file, which has none",
        "httpServerTrustStorePassword",
    ),
    **_group(
        "region-aware placement: Vellum checks the region durability rule on every write quorum while it "
        "places, so the final validation BookKeeper runs (ensemble spans reppMinimumRegionsForDurability "
        "regions) cannot fail; read and ignored",
        "reppEnableValidation",
    ),
    **_group(
        "placement tuning Vellum's policies do not have (no disk-weighted choice, no preference for the "
        "client's own node, no fault-domain count on acknowledgements, bookies that leave are dropped at once); "
        "read and ignored by clients and bookies",
        "diskWeightBasedPlacementEnabled", "enforceMinNumFaultDomainsForWrite", "ignoreLocalNodeInPlacementPolicy",
        "networkTopologyStabilizePeriodSeconds",
    ),
    **_group(
        "region-aware placement feature flags: Vellum has no feature provider (durability follows "
        "reppRegionsToWrite / reppMinimumRegionsForDurability, every region may receive bookies)",
        "reppDisableDurabilityFeatureName", "reppDisableDurabilityEnforcementFeature",
        "reppDisallowBookiePlacementInRegionFeatureName",
    ),
    **_group(
        "client setting (speculative reads, quarantine, timeouts, connection pool): read by "
        "clients; in a bookie's file it is ignored",
        "addEntryQuorumTimeoutSec", "batchReadEnabled", "bookieAddressResolverEnabled",
        "bookieConnectionErrorQuarantineEnabled", "bookieErrorThresholdPerInterval",
        "bookieFailureHistoryExpirationMSec", "bookieHealthCheckEnabled", "bookieHealthCheckIntervalSeconds",
        "bookieQuarantineRatio", "bookieQuarantineTimeSeconds", "clientConnectTimeoutMillis",
        "clientReceiveBufferSize",
        "clientRole", "clientSendBufferSize", "clientSockKeepalive", "clientTcpNoDelay",
        "clientTcpUserTimeoutMillis", "clientWriteBufferHighWaterMark", "clientWriteBufferLowWaterMark",
        "delayEnsembleChange", "disableEnsembleChangeFeatureName",
        "enableBookieAddressTracking", "enableBookieFailureTracking",
        "enableDigestTypeAutodetection", "enableParallelRecoveryRead",
        "firstSpeculativeReadLACTimeout", "firstSpeculativeReadTimeout",
        "getBookieInfoIntervalSeconds", "getBookieInfoRetryIntervalSeconds", "getBookieInfoTimeoutSecs",
        "maxSpeculativeReadLACTimeout", "maxSpeculativeReadTimeout",
        "numChannelsPerBookie", "opportunisticStriping", "passwd", "pcbcTimeoutTimerNumTicks",
        "pcbcTimeoutTimerTickDurationMs", "readReorderThresholdPendingRequests", "readTimeout",
        "recoveryBatchReadEnabled", "reorderReadSequenceEnabled",
        "stickyReadSEnabled", "tcpKeepCnt", "tcpKeepIdle", "tcpKeepIntvl", "throttle",
        "timeoutMonitorIntervalSec", "timeoutTaskIntervalMillis", "timeoutTimerNumTicks",
        "timeoutTimerTickDurationMs", "useV2WireProtocol",
        "waitTimeoutOnBackpressureMs",
    ),
}

# ------------------------------------------------------------------------------ refused


def _blank(value: str) -> bool:
    return value.strip() in ("", "null")


def _false(value: str) -> bool:
    return value.strip().lower() in ("", "false", "0", "no", "off")


def _db_ledger_storage(value: str) -> bool:
    return _blank(value) or value.strip().rsplit(".", 1)[-1] == "DbLedgerStorage"


#: key -> (is this value fine?, why other values are refused and what to do). A key here is
#: also in ``ACCEPTED`` (or honoured): the values that pass are accepted as not used.
REFUSED_WHEN: dict[str, tuple[Callable[[str], bool], str]] = {
    "ledgerStorageClass": (
        _db_ledger_storage,
        "Vellum stores ledgers the DbLedgerStorage way (entry logs + RocksDB index) and cannot read "
        "or write InterleavedLedgerStorage / SortedLedgerStorage index files; set "
        "ledgerStorageClass=org.apache.bookkeeper.bookie.storage.ldb.DbLedgerStorage or remove the key",
    ),
    "useHostNameAsBookieID": (
        _false,
        "Vellum names a bookie advertisedAddress:bookiePort or bookieId; set bookieId to the host "
        "name instead (the id is bound to the disks by the cookie)",
    ),
    "useShortHostName": (
        _false,
        "Vellum names a bookie advertisedAddress:bookiePort or bookieId; set bookieId instead",
    ),
}
ACCEPTED.update({
    **_group(
        "Vellum always stores ledgers the DbLedgerStorage way (entry logs + RocksDB index)",
        "ledgerStorageClass",
    ),
    **_group(
        "bookie id from the host name: accepted only when off (Vellum's id is advertisedAddress:bookiePort "
        "or bookieId)",
        "useHostNameAsBookieID", "useShortHostName",
    ),
})
assert set(REFUSED_WHEN) <= set(ACCEPTED), "a refused key also needs its accepted reason"

# ------------------------------------------------------------------------------ aliases

#: Older spellings mapped onto Vellum's settings (see ``resolve_aliases``).
ALIASES = ("zkServers", "zkLedgersRootPath", "ledgerManagerFactoryClass", "journalDirectory")

_LEDGER_MANAGER_SCHEMES = {
    "HierarchicalLedgerManagerFactory": "zk+hierarchical",
    "LongHierarchicalLedgerManagerFactory": "zk+longhierarchical",
    "FlatLedgerManagerFactory": "zk+flat",
    "LegacyHierarchicalLedgerManagerFactory": "zk+hierarchical",
}


def resolve_aliases(values: Mapping[str, Any], *, where: str = "") -> dict[str, Any]:
    """Map the older keys onto Vellum's: ``zkServers`` (+ ``zkLedgersRootPath``, default
    ``/ledgers``, + ``ledgerManagerFactoryClass``) becomes ``metadataServiceUri``;
    ``journalDirectory`` becomes ``journalDirectories``. Both spellings given and disagreeing is
    an error naming both. Returns a new dict without the alias keys."""
    out = {k: v for k, v in values.items() if k not in ALIASES}
    at = f" in {where}" if where else ""
    def text(key: str) -> str:
        return str(values.get(key, "")).strip()

    servers = text("zkServers")
    manager = text("ledgerManagerFactoryClass")
    scheme = "zk"
    if manager:
        short = manager.rsplit(".", 1)[-1]
        if short not in _LEDGER_MANAGER_SCHEMES:
            raise ConfigError(
                f"ledgerManagerFactoryClass={manager!r}{at} is not a ledger manager Vellum knows "
                f"(one of {', '.join(sorted(_LEDGER_MANAGER_SCHEMES))})"
            )
        scheme = _LEDGER_MANAGER_SCHEMES[short]
    if servers:
        root = text("zkLedgersRootPath") or "/ledgers"
        uri = f"{scheme}://{servers.replace(',', ';')}{root}"
        given = text("metadataServiceUri")
        if given and given != uri and not _same_zk_uri(given, uri):
            raise ConfigError(
                f"zkServers/zkLedgersRootPath{at} say {uri} but metadataServiceUri says {given}: keep one "
                "of them (metadataServiceUri is the current spelling)"
            )
        out["metadataServiceUri"] = given or uri
    journal = text("journalDirectory")
    if journal:
        given = text("journalDirectories")
        if given and [p.strip() for p in given.split(",")] != [journal]:
            raise ConfigError(
                f"journalDirectory={journal}{at} disagrees with journalDirectories={given}: keep "
                "journalDirectories (the current spelling)"
            )
        out["journalDirectories"] = given or journal
    return out


def _same_zk_uri(a: str, b: str) -> bool:
    """The same ensemble and root, whatever the ZooKeeper URI scheme variant and host separator."""

    def norm(u: str) -> tuple[str, str]:
        rest = u.split("://", 1)[-1]
        hosts, _, path = rest.partition("/")
        return ",".join(sorted(h.strip() for h in hosts.replace(";", ",").split(","))), "/" + path.rstrip("/")

    return a.split("://", 1)[0].startswith("zk") and b.split("://", 1)[0].startswith("zk") and norm(a) == norm(b)


def check_refused(key: str, value: str, *, where: str = "") -> None:
    """Raise ConfigError if ``value`` of ``key`` asks for something Vellum cannot honour."""
    rule = REFUSED_WHEN.get(key)
    if rule is not None and not rule[0](value):
        at = f" in {where}" if where else ""
        raise ConfigError(f"{key}={value}{at} is refused: {rule[1]}")
