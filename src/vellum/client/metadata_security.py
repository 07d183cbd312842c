"""The metadata store, opened with the security settings of a configuration.

Responsibility: one place that turns a ``ServerConfig`` or ``ClientConfig`` into the arguments
``open_metadata_store`` needs: the session timeout (``zkTimeout``), and for a secured
ZooKeeper the digest identity (``zkEnableSecurity``
+ ``zkDigestAuthFile``) and TLS (``zkTlsEnabled`` + ``zkTlsTrustStore``, ``zkTlsCertificatePath``,
``zkTlsKeyStore``, ``zkTlsKeyStorePasswordPath``, ``zkTlsHostnameVerificationEnabled``). Bookies,
``vellum autorecovery``, the client, the shell (``--client-conf``), the console and the Spark
connector all open the store through it, so they agree.

Invariants: the TLS context follows its files like the bookie port's
(``tlsCertFilesRefreshDurationSeconds``): a rotated certificate is used by the next ZooKeeper
connection; bad TLS files fail here, before anything connects, with the ``zkTls*`` key named.
"""

from __future__ import annotations

from pathlib import Path

from vellum.config import ClientConfig, ServerConfig
from vellum.meta import MetadataStore, open_metadata_store
from vellum.meta.zk_tls import ZkTls
from vellum.security.tls import ReloadingContext, TlsSettings, client_context


def zk_tls(config: ServerConfig | ClientConfig) -> ZkTls | None:
    """TLS for the ZooKeeper session (``zkTlsEnabled``), or ``None``. A certificate and key in
    one PEM file (ZooKeeper's own PEM key store layout) may be given as either key alone."""
    if not config.zk_tls_enabled:
        return None
    certificate = config.zk_tls_certificate_path or config.zk_tls_key_store
    settings = TlsSettings(
        key_store=config.zk_tls_key_store or certificate,
        certificate_path=certificate,
        trust_store=config.zk_tls_trust_store,
        key_store_password_path=config.zk_tls_key_store_password_path,
        hostname_verification=config.zk_tls_hostname_verification_enabled,
        refresh_s=config.tls_cert_files_refresh_duration_s,
        key_prefix="zkTls",
    )
    holder = ReloadingContext(lambda: client_context(settings), settings.watched_files(), settings.refresh_s,
                              what="ZooKeeper TLS")
    return ZkTls(context=holder.get, certificate_path=certificate, trust_store=settings.trust_store)


def open_configured_store(
    uri: str,
    config: ServerConfig | ClientConfig,
    *,
    default_sqlite_path: str | Path | None = None,
    session_timeout_s: float | None = None,
    connect_timeout_s: float = 10.0,
) -> MetadataStore:
    """``open_metadata_store(uri)`` with ``config``'s session timeout (``zkTimeout``, for the
    embedded store's lease too), ZooKeeper identity and TLS. ``session_timeout_s`` overrides
    ``zkTimeout``."""
    return open_metadata_store(
        uri,
        default_sqlite_path=default_sqlite_path,
        session_timeout_s=config.zk_timeout_ms / 1000.0 if session_timeout_s is None else session_timeout_s,
        connect_timeout_s=connect_timeout_s,
        zk_digest_auth_file=config.zk_digest_auth_file if config.zk_enable_security else "",
        zk_tls=zk_tls(config) if uri.lower().startswith("zk") else None,
    )
