"""The bookie's security keys: authentication and authorization on the bookie port (tokens,
the mutual-TLS principal, the master-key check) and the admin HTTP API's TLS and credentials
(docs/security.md); ``ServerConfig`` includes them. The checks that involve other keys (TLS, the
admin HTTP port) are ``ServerConfig``'s. No I/O."""

from __future__ import annotations

from dataclasses import dataclass

from vellum.config.declare import opt
from vellum.config.shared import auth_provider


@dataclass(frozen=True)
class BookieSecurityKeys:
    """Who may use a bookie: its port's authentication and the admin HTTP API's security."""

    # --- authentication and authorization on the bookie port (docs/security.md) ---
    bookie_auth_provider_factory_class: tuple[str, ...] = opt(
        "bookieAuthProviderFactoryClass", [],
        "authentication providers, comma list: tls (the mutual-TLS certificate; BookKeeper's "
        "org.apache.bookkeeper.tls.BookieAuthZFactory) and/or token (signed tokens sent with AUTH); "
        "empty = no authentication. With it on, unauthenticated connections are refused",
    )
    authorized_roles: tuple[str, ...] = opt(
        "authorizedRoles", [],
        "roles (certificate OU 0:<role>, token roles claim) a client needs, comma list; empty = any "
        "authenticated client. Include bookie for re-replication traffic",
    )
    token_secret_key_file: str = opt(
        "tokenSecretKeyFile", "", "HS256 secret (file) that verifies tokens (bookie port AUTH and admin HTTP)"
    )
    token_public_key_file: str = opt(
        "tokenPublicKeyFile", "", "RS256/ES256 public key or certificate (PEM file) that verifies tokens"
    )
    token_audience: str = opt(
        "tokenAudience", "vellum",
        "the aud claim of tokens for the bookie port (tokens issued with `vellum security issue-token --for bookie`)",
    )
    http_server_token_audience: str = opt(
        "httpServerTokenAudience", "vellum-admin",
        "the aud claim of tokens for the admin HTTP API (`issue-token --for admin`); must differ from "
        "tokenAudience, so that a token opens one door only (Vellum's key)",
    )
    token_max_lifetime_s: int = opt(
        "tokenMaxLifetimeSeconds", 2592000,
        "longest lifetime (exp - iat, and exp from now) of a token either port accepts; longer ones are "
        "refused, and `issue-token` refuses to make them (30 days; Vellum's key)",
        lo=1,
    )
    master_key_check: str = opt(
        "ledgerMasterKeyCheck", "auto",
        "check the master key of a ledger this bookie has not seen against the ledger's metadata before "
        "accepting it (first ADD, fence, explicit LAC): true, false, or auto = true when "
        "bookieAuthProviderFactoryClass is set. Stops a client from claiming a ledger id before its owner "
        "(Vellum's key; BookKeeper trusts the first key it sees)",
        choices=("auto", "true", "false"),
    )
    # --- admin HTTP security ---
    http_server_tls_enable: bool = opt(
        "httpServerTlsEnable", False, "serve the admin HTTP API over TLS (https) only"
    )
    http_server_key_store_path: str = opt(
        "httpServerKeyStorePath", "",
        "admin HTTP TLS private key, PEM file (with the certificate in it unless httpServerCertificatePath)",
    )
    http_server_key_store_password: str = opt(
        "httpServerKeyStorePassword", "", "password of an encrypted httpServerKeyStorePath (BookKeeper's key)",
        secret=True,
    )
    http_server_certificate_path: str = opt(
        "httpServerCertificatePath", "", "admin HTTP TLS certificate (chain), PEM file (Vellum's key)"
    )
    http_server_trust_store_path: str = opt(
        "httpServerTrustStorePath", "",
        "CA certificate(s), PEM file: when set, admin HTTP clients must present a certificate from it",
    )
    http_server_header_read_timeout_ms: int = opt(
        "httpServerHeaderReadTimeoutMs", 10000,
        "Vellum's own key: an admin HTTP connection that has not sent a complete request head this long after "
        "its accept or its previous answer is closed (half-sent requests, idle keep-alive connections)",
        lo=100,
    )
    http_server_token_required_for_reads: bool = opt(
        "httpServerTokenRequiredForReads", False,
        "with a token key set, read-only admin endpoints need a token too (with one of authorizedRoles or "
        "admin, when authorizedRoles is set); mutating ones always need the admin role. /heartbeat stays open",
    )
    http_server_admin_insecure: bool = opt(
        "httpServerAdminInsecure", False,
        "let a bookie whose bookie port requires authentication run an admin HTTP API that anyone who "
        "reaches it may use to change the bookie (no token key, no admin client certificates). Off: such a "
        "bookie refuses to start (Vellum's key)",
    )

    @property
    def auth_providers(self) -> tuple[str, ...]:
        """``bookieAuthProviderFactoryClass`` as Vellum's provider names (tls, token)."""
        return tuple(dict.fromkeys(auth_provider(v, "bookieAuthProviderFactoryClass")
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
