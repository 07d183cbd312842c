"""The keys a bookie and a client both read, declared once: each group is a frozen dataclass
that ``ServerConfig`` and ``ClientConfig`` both include (as bases), with the checks that belong
to its keys.

- ``MetadataKeys``: where the metadata store is and how to reach it securely (``metadataServiceUri``,
  ``zkTimeout``, ZooKeeper digest ACLs and TLS to ZooKeeper).
- ``PlacementKeys``: where ensembles go; read by clients, and by a bookie for the replacement
  bookies its AutoRecovery picks (BookKeeper reads them from ``bk_server.conf`` there too).
- ``TlsKeys``: TLS on the bookie port (START_TLS; PEM files), the bookie's side and the client's.

Also the authentication provider names both sides accept. No I/O.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from vellum.config.declare import opt
from vellum.errors import ConfigError

#: Where ``vellum standalone`` keeps its embedded metadata store; the shell's default ``--uri``.
DEFAULT_DATA_DIR = "data/standalone"
DEFAULT_METADATA_URI = f"sqlite:///./{DEFAULT_DATA_DIR}/metadata.db"
#: The ``tlsProviderFactoryClass`` value that turns TLS on (BookKeeper's class name; Vellum has
#: one TLS implementation, Python's ``ssl`` with PEM files, and no other factory).
TLS_CONTEXT_FACTORY = "org.apache.bookkeeper.tls.TLSContextFactory"
_TLS_ON_DOC = (
    f"TLS on: {TLS_CONTEXT_FACTORY} (BookKeeper's class name; the short name works too); empty = no TLS"
)

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


@dataclass(frozen=True)
class MetadataKeys:
    """The metadata store and its security, for a bookie and a client alike."""

    metadata_service_uri: str = opt(
        "metadataServiceUri",
        "",
        "zk://host:port[,host:port]/ledgers, zk+flat://, zk+hierarchical://, zk+longhierarchical://, sqlite:///path; "
        "empty = the embedded store (a bookie's next to its first ledger dir, a client's in ./data/metadata.db)",
    )
    zk_timeout_ms: int = opt(
        "zkTimeout", 10000,
        "metadata session timeout: the ZooKeeper session's (the server bounds it by its min/maxSessionTimeout) "
        "and the embedded store's lease",
        lo=100,
    )
    # --- metadata store security ---
    zk_enable_security: bool = opt(
        "zkEnableSecurity", False,
        "ZooKeeper digest ACLs: authenticate with zkDigestAuthFile and create every znode readable and "
        "writable by that identity only (bookies and clients use the same identity)",
    )
    zk_digest_auth_file: str = opt(
        "zkDigestAuthFile", "", "file holding user:password, the cluster's ZooKeeper digest identity (Vellum's)"
    )
    # --- TLS to ZooKeeper (Vellum's keys: BookKeeper passes ZooKeeper's zookeeper.client.secure and
    # zookeeper.ssl.* Java system properties instead; docs/security.md section 5) ---
    zk_tls_enabled: bool = opt(
        "zkTlsEnabled", False,
        "connect to ZooKeeper with TLS; metadataServiceUri names its secureClientPort (ZooKeeper's "
        "zookeeper.client.secure)",
    )
    zk_tls_trust_store: str = opt(
        "zkTlsTrustStore", "",
        "CA certificate(s), PEM file, that ZooKeeper's certificate must chain to (zookeeper.ssl.trustStore.location)",
    )
    zk_tls_certificate_path: str = opt(
        "zkTlsCertificatePath", "",
        "client certificate (chain), PEM file, presented to ZooKeeper (needed when its ssl.clientAuth=need, its "
        "default); with the key in it unless zkTlsKeyStore",
    )
    zk_tls_key_store: str = opt(
        "zkTlsKeyStore", "",
        "private key of zkTlsCertificatePath, PEM file (zookeeper.ssl.keyStore.location holds both)",
    )
    zk_tls_key_store_password_path: str = opt(
        "zkTlsKeyStorePasswordPath", "", "file holding the password of an encrypted zkTlsKeyStore"
    )
    zk_tls_hostname_verification_enabled: bool = opt(
        "zkTlsHostnameVerificationEnabled", True,
        "check that ZooKeeper's certificate names the host in metadataServiceUri (ZooKeeper's "
        "zookeeper.ssl.hostnameVerification, on by default)",
    )


def validate_zk_security(obj: MetadataKeys) -> None:
    if obj.zk_enable_security and not obj.zk_digest_auth_file:
        raise ConfigError("zkEnableSecurity=true needs zkDigestAuthFile (a file holding user:password, the "
                          "cluster's ZooKeeper identity; Vellum uses digest ACLs, not SASL)")
    if obj.zk_tls_enabled and not obj.zk_tls_trust_store:
        raise ConfigError("zkTlsEnabled=true needs zkTlsTrustStore (the CA certificate ZooKeeper's certificate "
                          "chains to)")
    if obj.zk_tls_key_store_password_path and not (obj.zk_tls_key_store or obj.zk_tls_certificate_path):
        raise ConfigError("zkTlsKeyStorePasswordPath needs zkTlsKeyStore (the encrypted key it unlocks)")


@dataclass(frozen=True)
class PlacementKeys:
    """Ensemble placement: read by clients, and by a bookie for the replacement bookies its
    AutoRecovery picks (``ServerConfig.client_placement_values``)."""

    ensemble_placement_policy: str = opt(
        "ensemblePlacementPolicy", "default",
        "bookie placement: default (random), rackaware, zoneaware, regionaware, or BookKeeper's class names "
        "(org.apache.bookkeeper.client.RackawareEnsemblePlacementPolicy, ...)",
        choices=tuple(PLACEMENT_POLICIES),
    )
    min_num_racks_per_write_quorum: int = opt(
        "minNumRacksPerWriteQuorum", 2, "rack-aware: racks spanned by each write quorum", lo=1
    )
    enforce_min_num_racks_per_write_quorum: bool = opt(
        "enforceMinNumRacksPerWriteQuorum", False, "rack-aware: fail instead of degrading"
    )
    network_topology_script_file_name: str = opt(
        "networkTopologyScriptFileName", "",
        "rack-, zone- and region-aware: executable run with bookie host addresses as arguments, printing one "
        "network location per argument (/rack, /zone/upgradedomain, /region/rack); empty = the mapping "
        "`vellum shell racks` keeps in the metadata store",
    )
    network_topology_script_number_args: int = opt(
        "networkTopologyScriptNumberArgs", 100, "most host addresses per run of the topology script", lo=1
    )
    network_topology_script_timeout_ms: int = opt(
        "networkTopologyScriptTimeoutMs", 5000,
        "a topology script run taking longer is killed and its hosts get the default location (Vellum's key)",
        lo=1,
    )
    repp_dns_resolver_class: str = opt(
        "reppDnsResolverClass", "org.apache.bookkeeper.net.ScriptBasedMapping",
        "where network locations come from: only ScriptBasedMapping (the script, else the stored mapping); "
        "another class is refused when a topology-aware policy is used",
    )
    min_num_zones_per_write_quorum: int = opt(
        "minNumZonesPerWriteQuorum", 2, "zone-aware: zones each write quorum must span (strict)", lo=1
    )
    desired_num_zones_per_write_quorum: int = opt(
        "desiredNumZonesPerWriteQuorum", 3, "zone-aware: zones each write quorum should span", lo=1
    )
    enforce_strict_zoneaware_placement: bool = opt(
        "enforceStrictZoneawarePlacement", True,
        "zone-aware: fail a ledger when minNumZonesPerWriteQuorum cannot be met (and require E a multiple of "
        "WQ, WQ > minNumZonesPerWriteQuorum, known locations); false = best effort",
    )
    repp_regions_to_write: str = opt(
        "reppRegionsToWrite", "",
        "region-aware: regions, ';'-separated; set = every acknowledged entry in "
        "reppMinimumRegionsForDurability regions",
    )
    repp_minimum_regions_for_durability: int = opt(
        "reppMinimumRegionsForDurability", 2,
        "region-aware (with reppRegionsToWrite): regions each acknowledged entry is in", lo=0,
    )
    repp_enable_durability_enforcement_in_replace: bool = opt(
        "reppEnableDurabilityEnforcementInReplace", True,
        "region-aware: a replacement from another region must keep reppMinimumRegionsForDurability",
    )


#: the placement keys, as ``ServerConfig.client_placement_values`` hands them to the bookie's client
PLACEMENT_FIELDS = tuple(f.name for f in dataclasses.fields(PlacementKeys))


@dataclass(frozen=True)
class TlsKeys:
    """TLS on the bookie port (START_TLS; PEM files): the bookie's certificate and the CA its
    clients chain to, or a client's. On a client the ``client*`` store keys win over these, as
    in BookKeeper."""

    tls_provider_factory_class: str = opt(
        "tlsProviderFactoryClass", "",
        _TLS_ON_DOC + ". With TLS on, a bookie upgrades connections on START_TLS and refuses every "
        "plaintext request (BookKeeper also serves plaintext), and a client starts every bookie connection "
        "with START_TLS",
    )
    tls_provider: str = opt(
        "tlsProvider", "OpenSSL", "TLS implementation: always Python's ssl (OpenSSL); JDK is accepted",
        choices=("OpenSSL", "JDK"),
    )
    tls_key_store_type: str = opt("tlsKeyStoreType", "PEM", "format of tlsKeyStore: PEM only (BookKeeper: JKS)")
    tls_key_store: str = opt(
        "tlsKeyStore", "", "private key, PEM file: the bookie's, or the client's (for mutual TLS)"
    )
    tls_key_store_password_path: str = opt(
        "tlsKeyStorePasswordPath", "", "file holding the password of an encrypted tlsKeyStore"
    )
    tls_certificate_path: str = opt(
        "tlsCertificatePath", "",
        "certificate (chain), PEM file: the bookie's, or the client's, presented when set (for mutual TLS)",
    )
    tls_trust_store_type: str = opt(
        "tlsTrustStoreType", "PEM", "format of tlsTrustStore: PEM only (BookKeeper: JKS)"
    )
    tls_trust_store: str = opt(
        "tlsTrustStore", "",
        "CA certificate(s), PEM file: on a client, what bookie certificates must chain to (required); on a "
        "bookie, what client certificates must chain to (mutual TLS)",
    )
    tls_trust_store_password_path: str = opt(
        "tlsTrustStorePasswordPath", "",
        "password file of a JKS/PKCS12 trust store; a PEM trust store has none (only watched for changes)",
    )
    tls_client_authentication: bool = opt(
        "tlsClientAuthentication", False,
        "mutual TLS. A bookie requires a client certificate signed by a tlsTrustStore CA; its CN and OU roles "
        "become the connection's principal. A client then refuses to start without tlsCertificatePath and "
        "tlsKeyStore (Vellum presents a configured certificate either way)",
    )
    tls_cert_files_refresh_duration_s: int = opt(
        "tlsCertFilesRefreshDurationSeconds", 0,
        "check the certificate, key and trust files this often and reload them when changed, for new "
        "connections (0 = never)",
        lo=0,
    )
    tls_enabled_protocols: tuple[str, ...] = opt(
        "tlsEnabledProtocols", [], "TLS versions to offer (TLSv1.2, TLSv1.3); empty = TLS 1.2 and later"
    )
    tls_enabled_cipher_suites: tuple[str, ...] = opt(
        "tlsEnabledCipherSuites", [], "TLS 1.2 cipher suites, OpenSSL names; empty = OpenSSL's defaults"
    )

    @property
    def tls_enabled(self) -> bool:
        return bool(self.tls_provider_factory_class)


def validate_tls(obj: TlsKeys) -> None:
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


#: Vellum's authentication providers by the names a file may use (BookKeeper's class names too)
_AUTH_PROVIDERS = {
    "tls": "tls", "bookieauthzfactory": "tls", "org.apache.bookkeeper.tls.bookieauthzfactory": "tls",
    "token": "token", "tokenauthproviderfactory": "token", "vellum.security.auth.tokenauthproviderfactory": "token",
}


def auth_provider(value: str, key: str) -> str:
    """Vellum's name (tls, token) of an authentication provider given as ``key=value``."""
    name = _AUTH_PROVIDERS.get(value.strip().lower())
    if name is None:
        raise ConfigError(
            f"{key}={value} is refused: Vellum's authentication providers are tls (mutual TLS; BookKeeper's "
            "org.apache.bookkeeper.tls.BookieAuthZFactory) and token (signed tokens)"
        )
    return name
