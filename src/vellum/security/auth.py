"""Authentication and authorization of bookie connections (BookKeeper's auth providers).

Responsibility: decide who is on the other end of a connection and whether it may be served;
no sockets and no wire frames here (the server and the client own those, and translate the
decisions into AUTH frames).

Providers (BookKeeper's ``bookieAuthProviderFactoryClass`` / ``clientAuthProviderFactoryClass``
idea; Vellum's are named, a comma list on the bookie, one on a client):

* ``tls`` (also BookKeeper's ``org.apache.bookkeeper.tls.BookieAuthZFactory``): the principal
  is the client certificate's CN and its roles are the OU's ``0:<role>`` list, taken from the
  mutual-TLS handshake. A client may send ``AUTH("tls", b"")`` to learn at connect time whether
  that identity is accepted;
* ``token``: the client sends ``AUTH("token", <JWT>)``; the bookie verifies it
  (:class:`vellum.security.tokens.TokenVerifier`) and takes ``sub`` and ``roles`` from it.

Authorization (BookKeeper's ``authorizedRoles``): an identity is served iff it has one of the
authorized roles; an empty list authorizes every authenticated identity.

A connection asks once per request (``BookieAuthenticator.admit``) and gets an ``Admission``:
the identity it may be served as, or the reason it may not, as a value the connection's
session decides on (``from_auth`` and ``authorize`` are the two steps of it, and raise).

Invariants: ``BookieAuthenticator`` never returns an identity it has not verified; every
refusal is a :class:`vellum.errors.SecurityError` whose message names the principal (when one
is known) and the reason, fit for the bookie's log and for the client; nothing here logs a
token (only its subject, once verified).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from vellum.errors import SecurityError
from vellum.security.tokens import BOOKIE_AUDIENCE, MAX_TOKEN_BYTES, TokenVerifier

TLS = "tls"
TOKEN = "token"
PROVIDERS = (TLS, TOKEN)
#: BookKeeper's class names accepted for Vellum's providers
_ALIASES = {
    "org.apache.bookkeeper.tls.bookieauthzfactory": TLS,
    "bookieauthzfactory": TLS,
    "vellum.security.auth.tokenauthproviderfactory": TOKEN,
    "tokenauthproviderfactory": TOKEN,
}


def provider_name(value: str) -> str:
    """``tls`` or ``token`` for a provider name or one of BookKeeper's class names."""
    v = value.strip()
    low = v.lower()
    if low in PROVIDERS:
        return low
    if low in _ALIASES:
        return _ALIASES[low]
    raise SecurityError(
        f"authentication provider {v!r} is not one Vellum has: use tls (mutual TLS; BookKeeper's "
        "org.apache.bookkeeper.tls.BookieAuthZFactory) or token (signed tokens)"
    )


def provider_names(values: Iterable[str]) -> tuple[str, ...]:
    """The providers of a comma list (order kept, duplicates dropped)."""
    out: list[str] = []
    for v in values:
        if v.strip():
            name = provider_name(v)
            if name not in out:
                out.append(name)
    return tuple(out)


@dataclass(frozen=True)
class Identity:
    """An authenticated peer: its principal, its roles and how it proved them."""

    principal: str
    roles: tuple[str, ...]
    method: str  # "tls" | "token"

    def describe(self) -> str:
        return f"principal {self.principal!r} ({self.method}, roles {list(self.roles)})"


@dataclass(frozen=True)
class Admission:
    """What the authenticator made of a peer: ``identity``, proved and authorized (served), or
    None and ``refusal``, the reason (``SecurityError``'s message)."""

    identity: Identity | None
    refusal: str = ""


class BookieAuthenticator:
    """A bookie's providers and ``authorizedRoles``: identities from certificates or tokens,
    and the decision to serve them."""

    def __init__(self, providers: Iterable[str], *, authorized_roles: Iterable[str] = (),
                 token_verifier: TokenVerifier | None = None, audience: str = BOOKIE_AUDIENCE) -> None:
        self.providers = provider_names(providers)
        if not self.providers:
            raise SecurityError("an authenticator needs at least one provider (tls, token)")
        if TOKEN in self.providers and token_verifier is None:
            raise SecurityError("the token provider needs a verification key (tokenSecretKeyFile or "
                                "tokenPublicKeyFile)")
        self.authorized_roles = tuple(r.strip() for r in authorized_roles if r.strip())
        self._verifier = token_verifier
        self._audience = audience

    def from_certificate(self, principal: str | None, roles: tuple[str, ...]) -> Identity | None:
        """The identity of a mutual-TLS peer, or ``None`` (no certificate, or ``tls`` not on)."""
        if TLS not in self.providers or not principal:
            return None
        return Identity(principal, roles, TLS)

    def from_auth(self, plugin: str, payload: bytes, certificate: Identity | None) -> Identity:
        """The identity an AUTH message proves; ``SecurityError`` saying why it proves none."""
        name = plugin.strip().lower()
        if name == TOKEN:
            if self._verifier is None or TOKEN not in self.providers:
                raise SecurityError("token authentication is not enabled on this bookie "
                                    f"(bookieAuthProviderFactoryClass={','.join(self.providers)})")
            if len(payload) > MAX_TOKEN_BYTES:
                raise SecurityError(f"token refused: {len(payload)} bytes is over the {MAX_TOKEN_BYTES}-byte limit")
            try:
                token = bytes(payload).decode("ascii")
            except UnicodeDecodeError:
                raise SecurityError("token refused: malformed (not ASCII)") from None
            claims = self._verifier.verify(token, audience=self._audience)
            return Identity(claims.subject, claims.roles, TOKEN)
        if name == TLS:
            if TLS not in self.providers:
                raise SecurityError("certificate authentication is not enabled on this bookie "
                                    f"(bookieAuthProviderFactoryClass={','.join(self.providers)})")
            if certificate is None:
                raise SecurityError("no client certificate: mutual TLS authentication needs one "
                                    "(tlsCertificatePath and tlsKeyStore on the client)")
            return certificate
        raise SecurityError(f"unknown authentication provider {plugin[:40]!r} (this bookie has "
                            f"{', '.join(self.providers)})")

    def admit(self, certificate: Identity | None, plugin: str | None = None, payload: bytes = b"") -> Admission:
        """Whether the peer may be served, as a value (never raises ``SecurityError``): as
        its AUTH message (``plugin``, ``payload``) proves it, or without one (``plugin`` None)
        as its mutual-TLS ``certificate`` does."""
        try:
            identity = certificate if plugin is None else self.from_auth(plugin, payload, certificate)
            self.authorize(identity)
        except SecurityError as e:
            return Admission(None, str(e))
        return Admission(identity)

    def authorize(self, identity: Identity | None) -> None:
        """Raise ``SecurityError`` unless ``identity`` may be served."""
        if identity is None:
            ways = []
            if TLS in self.providers:
                ways.append("a client certificate from the cluster's CA (mutual TLS)")
            if TOKEN in self.providers:
                ways.append("a token (clientAuthProviderFactoryClass=token)")
            raise SecurityError(f"not authenticated: this bookie requires {' or '.join(ways)}")
        if self.authorized_roles and not set(identity.roles) & set(self.authorized_roles):
            raise SecurityError(
                f"{identity.describe()} has none of the authorized roles {list(self.authorized_roles)} "
                "(authorizedRoles)"
            )


class ClientAuth:
    """What a client sends to authenticate: ``plugin`` and a payload read when each
    connection opens (a token file is re-read, so a renewed token is used without a restart)."""

    def __init__(self, plugin: str, payload: Callable[[], bytes]) -> None:
        self.plugin = provider_name(plugin)
        self._payload = payload

    @classmethod
    def certificate(cls) -> ClientAuth:
        return cls(TLS, lambda: b"")

    @classmethod
    def token(cls, *, token: str = "", token_file: str | Path = "") -> ClientAuth:
        if bool(token) == bool(token_file):
            raise SecurityError("token authentication needs exactly one of clientAuthToken and clientAuthTokenFile")
        if token:
            data = token.strip().encode("ascii", "replace")
            return cls(TOKEN, lambda: data)
        path = Path(token_file)

        def read() -> bytes:
            try:
                return path.read_bytes().strip()
            except OSError as e:
                raise SecurityError(f"cannot read clientAuthTokenFile {path}: {e.strerror or e}") from None

        read()  # a missing file fails at start, not at the first connection
        return cls(TOKEN, read)

    def payload(self) -> bytes:
        return self._payload()
