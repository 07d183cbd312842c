"""TLS contexts for bookies and clients from BookKeeper-named PEM settings, reloaded on change.

Responsibility: turn ``TlsSettings`` (BookKeeper's ``tls*`` keys, as plain values) into
``ssl.SSLContext`` objects, rebuild them when the files change, and read the peer's identity
off an established connection. No sockets here: the server and client own their connections.

Settings (BookKeeper key -> field):

* ``tlsKeyStoreType`` / ``tlsTrustStoreType`` -> ``key_store_type`` / ``trust_store_type``:
  ``PEM`` only (JKS and PKCS12 are refused with a hint to convert them);
* ``tlsKeyStore`` -> ``key_store``: the private key PEM; ``tlsKeyStorePasswordPath`` ->
  ``key_store_password_path``: a file holding its password (trailing newline ignored);
* ``tlsCertificatePath`` -> ``certificate_path``: the certificate (chain) PEM;
* ``tlsTrustStore`` -> ``trust_store``: the CA certificate(s) PEM that peers must chain to;
* ``tlsClientAuthentication`` -> ``client_authentication``: a server requires and verifies a
  client certificate (mutual TLS); BookKeeper's semantics;
* ``tlsEnabledProtocols`` -> ``enabled_protocols`` (e.g. ``TLSv1.2,TLSv1.3``; never below 1.2)
  and ``tlsEnabledCipherSuites`` -> ``enabled_cipher_suites`` (OpenSSL names; TLS 1.3 suites
  are always on, as Python's ``ssl`` cannot restrict them);
* ``tlsHostnameVerificationEnabled`` -> ``hostname_verification`` (clients; off by default, as
  in BookKeeper: the CA is the cluster's own);
* ``tlsCertFilesRefreshDurationSeconds`` -> ``refresh_s`` (``ReloadingContext``);
* ``key_prefix``: how error messages spell the keys (``tls`` -> ``tlsKeyStore``; the ZooKeeper
  connection's settings use ``zkTls`` -> ``zkTlsKeyStore``, ``zkTlsTrustStore``...).

Invariants:

* every context refuses anything below TLS 1.2;
* a server context always presents ``certificate_path`` + ``key_store``; it verifies client
  certificates against ``trust_store`` iff ``client_authentication`` (else it asks for none);
* a client context always verifies the bookie's certificate against ``trust_store`` (there is
  no "trust anything" mode) and presents its own certificate when one is configured;
* ``ReloadingContext.get()`` stats the files at most once per ``refresh_s`` (0 = never), and
  rebuilds the context only when one changed (mtime, size or inode); a rebuild that fails
  (say, a new certificate whose key is not there yet) keeps the previous context, logs why,
  and is retried at the next check. Connections already established keep their context; new
  ones get the new one, so certificates rotate without a restart.
"""

from __future__ import annotations

import logging
import os
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509

from vellum.errors import SecurityError
from vellum.security.pki import principal_of, roles_of

log = logging.getLogger(__name__)

_PROTOCOLS = {
    "TLSv1.2": ssl.TLSVersion.TLSv1_2,
    "TLSv1.3": ssl.TLSVersion.TLSv1_3,
}
_TOO_OLD = ("SSLv2", "SSLv3", "SSLv2Hello", "TLSv1", "TLSv1.1")
#: What a BookKeeper operator would write to turn TLS on (``tlsProviderFactoryClass``).
TLS_CONTEXT_FACTORY = "org.apache.bookkeeper.tls.TLSContextFactory"


@dataclass(frozen=True)
class TlsSettings:
    """BookKeeper's TLS settings as plain values (see the module docstring for the keys)."""

    key_store: str = ""
    certificate_path: str = ""
    trust_store: str = ""
    key_store_password_path: str = ""
    trust_store_password_path: str = ""
    key_store_type: str = "PEM"
    trust_store_type: str = "PEM"
    client_authentication: bool = False
    enabled_protocols: tuple[str, ...] = ()
    enabled_cipher_suites: tuple[str, ...] = ()
    hostname_verification: bool = False
    refresh_s: float = 0.0
    #: the key's password itself, when it is configured in clear (BookKeeper's
    #: ``httpServerKeyStorePassword``); ``key_store_password_path`` wins
    key_store_password: str = field(default="", repr=False)
    #: the prefix of the key names in error messages (``tls`` + ``KeyStore``)
    key_prefix: str = "tls"

    def key(self, name: str) -> str:
        """The configuration key ``name`` (``KeyStore``, ``TrustStore``...) as the user wrote it."""
        return self.key_prefix + name

    def watched_files(self) -> tuple[str, ...]:
        """The files whose change triggers a reload (BookKeeper watches the same five)."""
        files = (self.certificate_path, self.key_store, self.key_store_password_path, self.trust_store,
                 self.trust_store_password_path)
        return tuple(f for f in files if f)


# ------------------------------------------------------------------------------ contexts


def _check_types(settings: TlsSettings) -> None:
    for key, value in (("tlsKeyStoreType", settings.key_store_type), ("tlsTrustStoreType", settings.trust_store_type)):
        if value.upper() != "PEM":
            raise SecurityError(
                f"{key}={value}: Vellum reads PEM files only; convert the store, e.g. `openssl pkcs12 -in "
                "store.p12 -nodes -out store.pem` (JKS: `keytool -importkeystore -deststoretype PKCS12` first), "
                f"and set {key}=PEM"
            )


def _password(path: str, key: str = "tlsKeyStorePasswordPath") -> str | None:
    if not path:
        return None
    try:
        return Path(path).read_text().rstrip("\r\n")
    except OSError as e:
        raise SecurityError(f"cannot read {key} {path}: {e.strerror or e}") from None


def _require_file(key: str, path: str, side: str) -> None:
    if not path:
        raise SecurityError(f"TLS on the {side} needs {key}")
    if not os.path.isfile(path):
        raise SecurityError(f"{key}={path}: no such file")


def _protocols(ctx: ssl.SSLContext, protocols: tuple[str, ...]) -> None:
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if not protocols:
        return
    versions = []
    for p in protocols:
        if p in _TOO_OLD:
            raise SecurityError(f"tlsEnabledProtocols names {p}: Vellum requires TLSv1.2 or later")
        if p not in _PROTOCOLS:
            raise SecurityError(f"tlsEnabledProtocols names {p!r}: one of {', '.join(_PROTOCOLS)}")
        versions.append(_PROTOCOLS[p])
    ctx.minimum_version = min(versions)
    ctx.maximum_version = max(versions)


def _ciphers(ctx: ssl.SSLContext, suites: tuple[str, ...]) -> None:
    if not suites:
        return
    tls13 = {c["name"] for c in ctx.get_ciphers() if c.get("protocol") == "TLSv1.3"}
    rest = [s for s in suites if s not in tls13]
    if not rest:
        return
    try:
        ctx.set_ciphers(":".join(rest))
    except ssl.SSLError:
        raise SecurityError(
            f"tlsEnabledCipherSuites={','.join(suites)}: no cipher suite matches; use OpenSSL names "
            "(e.g. ECDHE-ECDSA-AES128-GCM-SHA256), not Java's"
        ) from None


def _load_chain(ctx: ssl.SSLContext, settings: TlsSettings) -> None:
    password = _password(settings.key_store_password_path, settings.key("KeyStorePasswordPath"))
    if password is None and settings.key_store_password:
        password = settings.key_store_password

    def no_password() -> str:
        # Without this callback OpenSSL would prompt on the terminal for an encrypted key.
        raise SecurityError(f"{settings.key('KeyStore')}={settings.key_store} is encrypted: set "
                            f"{settings.key('KeyStorePasswordPath')} to a file holding its password")

    try:
        ctx.load_cert_chain(settings.certificate_path, settings.key_store,
                            password=password if password is not None else no_password)
    except SecurityError:
        raise
    except ssl.SSLError as e:
        raise SecurityError(
            f"cannot load {settings.key('CertificatePath')}={settings.certificate_path} with "
            f"{settings.key('KeyStore')}={settings.key_store}: {e.reason or e} (is the key the certificate's, and "
            f"the password in {settings.key('KeyStorePasswordPath')} right?)"
        ) from None
    except OSError as e:
        raise SecurityError(f"cannot load the TLS certificate or key: {e}") from None


def _load_trust(ctx: ssl.SSLContext, settings: TlsSettings) -> None:
    try:
        ctx.load_verify_locations(cafile=settings.trust_store)
    except (ssl.SSLError, OSError) as e:
        raise SecurityError(f"cannot load {settings.key('TrustStore')}={settings.trust_store}: {e}") from None


def server_context(settings: TlsSettings) -> ssl.SSLContext:
    """The context a bookie upgrades connections with (START_TLS)."""
    _check_types(settings)
    _require_file("tlsCertificatePath", settings.certificate_path, "server")
    _require_file("tlsKeyStore", settings.key_store, "server")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _protocols(ctx, settings.enabled_protocols)
    _ciphers(ctx, settings.enabled_cipher_suites)
    _load_chain(ctx, settings)
    if settings.client_authentication:
        _require_file("tlsTrustStore", settings.trust_store, "server (tlsClientAuthentication=true)")
        _load_trust(ctx, settings)
        ctx.verify_mode = ssl.CERT_REQUIRED
    else:
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def client_context(settings: TlsSettings) -> ssl.SSLContext:
    """The context a client (or a bookie talking to another bookie) connects with."""
    _check_types(settings)
    _require_file(settings.key("TrustStore"), settings.trust_store, "client")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    _protocols(ctx, settings.enabled_protocols)
    _ciphers(ctx, settings.enabled_cipher_suites)
    ctx.check_hostname = settings.hostname_verification
    ctx.verify_mode = ssl.CERT_REQUIRED
    _load_trust(ctx, settings)
    if settings.certificate_path or settings.key_store:
        _require_file(settings.key("CertificatePath"), settings.certificate_path, "client")
        _require_file(settings.key("KeyStore"), settings.key_store, "client")
        _load_chain(ctx, settings)
    elif settings.client_authentication:
        raise SecurityError("tlsClientAuthentication=true on the client needs tlsCertificatePath and tlsKeyStore")
    return ctx


# ----------------------------------------------------------------------------- reloading


def _stamp(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


class ReloadingContext:
    """An ``ssl.SSLContext`` that follows its files: ``get()`` returns the current context,
    rebuilt if a watched file changed (checked at most every ``refresh_s`` seconds; 0 = never,
    BookKeeper's default). Built once at construction, so bad settings fail at start."""

    def __init__(self, build: Callable[[], ssl.SSLContext], files: tuple[str, ...], refresh_s: float,
                 *, clock: Callable[[], float] = time.monotonic, what: str = "TLS") -> None:
        if refresh_s < 0:
            raise SecurityError(f"tlsCertFilesRefreshDurationSeconds must be >= 0, got {refresh_s}")
        self._build = build
        self._files = files
        self._refresh_s = refresh_s
        self._clock = clock
        self._what = what
        self._stamps = self._stamp_all()
        self._context = build()
        self._next_check = clock() + refresh_s
        self.reloads = 0  # how many times the context was rebuilt (for tests and metrics)

    @classmethod
    def for_server(cls, settings: TlsSettings, *, clock: Callable[[], float] = time.monotonic) -> ReloadingContext:
        return cls(lambda: server_context(settings), settings.watched_files(), settings.refresh_s,
                   clock=clock, what="server TLS")

    @classmethod
    def for_client(cls, settings: TlsSettings, *, clock: Callable[[], float] = time.monotonic) -> ReloadingContext:
        return cls(lambda: client_context(settings), settings.watched_files(), settings.refresh_s,
                   clock=clock, what="client TLS")

    def switching_context(self) -> ssl.SSLContext:
        """A server context for code that takes one fixed ``SSLContext`` (aiohttp): each new
        connection is switched, during its handshake, to the context current then (rotated
        certificates apply to new connections, as with ``get()``)."""
        base = self.get()

        def switch(ssl_object: ssl.SSLObject | ssl.SSLSocket, _name: str | None, _ctx: ssl.SSLContext) -> None:
            current = self.get()
            if current is not base:
                ssl_object.context = current

        base.sni_callback = switch
        return base

    def _stamp_all(self) -> tuple[tuple[int, int, int] | None, ...]:
        return tuple(_stamp(f) for f in self._files)

    def get(self) -> ssl.SSLContext:
        if self._refresh_s > 0:
            now = self._clock()
            if now >= self._next_check:
                self._next_check = now + self._refresh_s
                self._maybe_reload()
        return self._context

    def _maybe_reload(self) -> None:
        stamps = self._stamp_all()
        if stamps == self._stamps:
            return
        try:
            context = self._build()
        except SecurityError as e:
            log.warning("%s files changed but cannot be loaded (keeping the previous certificates, "
                        "retrying in %gs): %s", self._what, self._refresh_s, e)
            return
        self._context, self._stamps = context, stamps
        self.reloads += 1
        log.info("%s certificates reloaded from %s", self._what, ", ".join(self._files))


# ------------------------------------------------------------------------------ identity


def peer_certificate(ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> x509.Certificate | None:
    """The certificate the peer presented on an established TLS connection, if any."""
    if ssl_object is None:
        return None
    der = ssl_object.getpeercert(binary_form=True)
    if not der:
        return None
    return x509.load_der_x509_certificate(der)


def peer_principal(ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> tuple[str | None, tuple[str, ...]]:
    """``(principal, roles)`` of the peer's certificate: its CN and the roles of its OU
    (``pki.roles_of``); ``(None, ())`` when the peer presented no certificate."""
    cert = peer_certificate(ssl_object)
    if cert is None:
        return None, ()
    try:
        return principal_of(cert), roles_of(cert)
    except SecurityError:
        return None, roles_of(cert)
