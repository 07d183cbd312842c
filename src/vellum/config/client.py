"""A client's configuration (``bk_client.conf``-style keys): ``ClientConfig``, its own keys
over the groups it shares with the bookie (``vellum.config.shared``). No I/O."""

from __future__ import annotations

from dataclasses import dataclass

from vellum.config.declare import opt, validate_ranges
from vellum.config.shared import (
    MetadataKeys,
    PlacementKeys,
    TlsKeys,
    auth_provider,
    validate_tls,
    validate_zk_security,
)
from vellum.errors import ConfigError


@dataclass(frozen=True)
class ClientConfig(TlsKeys, PlacementKeys, MetadataKeys):
    """Configuration of a client (``bk_client.conf``-style keys)."""

    ensemble_size: int = opt("ensembleSize", 3, "default ensemble size of new ledgers", lo=1)
    write_quorum_size: int = opt("writeQuorumSize", 2, "default write quorum", lo=1)
    ack_quorum_size: int = opt("ackQuorumSize", 2, "default ack quorum", lo=1)
    digest_type: str = opt(
        "digestType", "CRC32C", "default digest (BookKeeper: CRC32)",
        choices=("CRC32", "CRC32C", "HMAC", "MAC", "DUMMY"),
    )
    add_entry_timeout_s: float = opt("addEntryTimeoutSec", 5, "per-bookie add timeout", lo=0.001)
    read_entry_timeout_s: float = opt("readEntryTimeoutSec", 5, "per-bookie read timeout", lo=0.001)
    speculative_read_timeout_ms: int = opt(
        "speculativeReadTimeout", 2000, "ask the next replica after this long (0 = off)", lo=0
    )
    explicit_lac_interval_ms: int = opt(
        "explicitLacInterval", 0, "send explicit LAC when idle this long (0 = off)", lo=0
    )
    max_num_ensemble_changes: int = opt(
        "maxNumEnsembleChanges", 1 << 31, "ensemble changes allowed per ledger", lo=0
    )
    recovery_read_batch_size: int = opt("recoveryReadBatchSize", 1, "recovery read batch", lo=1)
    max_adds_in_flight: int = opt(
        "maxAddsInFlight", 4096, "adds a ledger handle keeps outstanding; later appends queue (Vellum's)", lo=1
    )
    shrink_collect_timeout_s: float = opt(
        "shrinkCollectTimeoutSec", 600,
        "how long a named ledger's shrink with force waits for each bookie's garbage collection pass "
        "(wire op COLLECT; a pass compacts logs, which may take minutes) (Vellum's)", lo=0.001,
    )
    # --- TLS to bookies (START_TLS; PEM files; the shared tls* keys are TlsKeys). client* keys win over
    # tls* ones, as in BookKeeper ---
    client_key_store_type: str = opt("clientKeyStoreType", "", "overrides tlsKeyStoreType on a client")
    client_key_store: str = opt("clientKeyStore", "", "overrides tlsKeyStore on a client")
    client_key_store_password_path: str = opt(
        "clientKeyStorePasswordPath", "", "overrides tlsKeyStorePasswordPath on a client"
    )
    client_trust_store_type: str = opt("clientTrustStoreType", "", "overrides tlsTrustStoreType on a client")
    client_trust_store: str = opt("clientTrustStore", "", "overrides tlsTrustStore on a client")
    client_trust_store_password_path: str = opt(
        "clientTrustStorePasswordPath", "", "overrides tlsTrustStorePasswordPath on a client"
    )
    tls_hostname_verification_enabled: bool = opt(
        "tlsHostnameVerificationEnabled", False, "check that a bookie's certificate names the host connected to"
    )
    start_tls_timeout_s: float = opt(
        "startTLSTimeoutSecs", 10, "time for START_TLS and the TLS handshake on a new connection", lo=0.001
    )
    # --- authentication to bookies (docs/security.md) ---
    client_auth_provider_factory_class: str = opt(
        "clientAuthProviderFactoryClass", "",
        "authenticate each bookie connection: token (sends clientAuthToken / clientAuthTokenFile) or tls "
        "(has the bookie check the client certificate at connect time; BookKeeper's "
        "org.apache.bookkeeper.tls.BookieAuthZFactory); empty = send nothing",
    )
    client_auth_token: str = opt(
        "clientAuthToken", "", "the token itself (prefer clientAuthTokenFile)", secret=True
    )
    client_auth_token_file: str = opt(
        "clientAuthTokenFile", "", "file holding the token, re-read for each new connection (renewal)"
    )

    def __post_init__(self) -> None:
        validate_ranges(self)
        validate_tls(self)
        validate_zk_security(self)
        if self.client_auth_provider_factory_class.strip():
            provider = auth_provider(self.client_auth_provider_factory_class, "clientAuthProviderFactoryClass")
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
