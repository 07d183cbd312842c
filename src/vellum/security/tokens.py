"""Signed, expiring tokens (JWT, via pyjwt) for clients without certificates and for admin HTTP.

Responsibility: issue a token for a principal with roles, and verify one back into
``TokenClaims``; nothing else (which roles may do what is the authorization step's business).

Token = a JWT with claims ``sub`` (principal), ``roles`` (list of role names), ``aud``
(audience, default ``vellum``), ``iat``, ``exp`` and ``jti`` (a random id, so that a later
replay check has something to remember). Algorithms:

* ``HS256``: a shared secret read from a file (``TokenSigner.from_secret_file``); the file must
  hold at least 32 bytes (``write_secret_file`` makes one, mode 0600); surrounding whitespace
  is ignored, so a trailing newline does not change the key;
* ``RS256`` / ``ES256``: the issuer signs with a private key PEM (RSA, or EC P-256) and
  verifiers hold only the public key (or the certificate) PEM.

Invariants: ``verify`` accepts exactly one algorithm (the verifier's; never ``none``), requires
``sub``, ``exp`` and ``aud``, refuses a token over ``MAX_TOKEN_BYTES`` before parsing it, and
raises :class:`vellum.errors.SecurityError` with a message naming the reason: expired (with
when), bad signature, wrong audience, not yet valid, malformed.
"""

from __future__ import annotations

import base64
import datetime as dt
import secrets
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from vellum.errors import IncorrectParameterError, SecurityError
from vellum.security.pki import write_file_atomic

ALGORITHMS = ("HS256", "RS256", "ES256")
DEFAULT_AUDIENCE = "vellum"
DEFAULT_TTL_S = 3600.0
#: Bigger tokens are refused unparsed (bounded work for whatever a peer sends).
MAX_TOKEN_BYTES = 8192
MIN_SECRET_BYTES = 32
#: Clock skew tolerated on ``exp`` / ``iat`` / ``nbf``.
LEEWAY_S = 30.0


@dataclass(frozen=True)
class TokenClaims:
    """What a verified token says."""

    subject: str
    roles: tuple[str, ...]
    audience: str
    expires_at: dt.datetime
    issued_at: dt.datetime | None
    token_id: str | None


# ------------------------------------------------------------------------------- keys


def _read(path: str | Path, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise SecurityError(f"cannot read {what} {path}: {e.strerror or e}") from None


def read_secret_file(path: str | Path) -> bytes:
    secret = _read(path, "token secret file").strip()
    if len(secret) < MIN_SECRET_BYTES:
        raise SecurityError(
            f"token secret file {path} holds {len(secret)} bytes; HS256 needs at least {MIN_SECRET_BYTES} "
            "(make one with `vellum security create-secret`)"
        )
    return secret


def write_secret_file(path: str | Path, *, overwrite: bool = False) -> Path:
    """A new random HS256 secret (32 random bytes, base64) in ``path``, mode 0600."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    write_file_atomic(p, base64.b64encode(secrets.token_bytes(32)) + b"\n", mode=0o600, overwrite=overwrite)
    return p


def _algorithm_of(key: Any, path: str | Path) -> str:
    if isinstance(key, (rsa.RSAPrivateKey, rsa.RSAPublicKey)):
        return "RS256"
    if isinstance(key, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey)):
        if key.curve.name != "secp256r1":
            raise SecurityError(f"{path}: ES256 needs an EC P-256 key, this one is {key.curve.name}")
        return "ES256"
    raise SecurityError(f"{path}: a {type(key).__name__} cannot sign tokens; use an RSA or EC P-256 key")


# ------------------------------------------------------------------------------- issue


class _KeyedAlgorithm:
    """One key and one of ``ALGORITHMS`` (what signing and verifying both hold)."""

    def __init__(self, key: Any, algorithm: str) -> None:
        if algorithm not in ALGORITHMS:
            raise IncorrectParameterError(f"token algorithm {algorithm!r} is not one of {', '.join(ALGORITHMS)}")
        self._key = key
        self.algorithm = algorithm


class TokenSigner(_KeyedAlgorithm):
    """Issues tokens with one key and algorithm."""

    @classmethod
    def from_secret_file(cls, path: str | Path) -> TokenSigner:
        return cls(read_secret_file(path), "HS256")

    @classmethod
    def from_private_key_file(cls, path: str | Path, password: bytes | None = None) -> TokenSigner:
        try:
            key = serialization.load_pem_private_key(_read(path, "token signing key"), password)
        except (ValueError, TypeError) as e:
            raise SecurityError(f"{path} is not a usable PEM private key: {e}") from None
        return cls(key, _algorithm_of(key, path))

    def issue(self, subject: str, roles: Sequence[str] = (), *, ttl_s: float = DEFAULT_TTL_S,
              audience: str = DEFAULT_AUDIENCE, now: dt.datetime | None = None) -> str:
        """A token for ``subject`` with ``roles``, valid ``ttl_s`` seconds from ``now``."""
        if not subject:
            raise IncorrectParameterError("a token needs a subject (the principal)")
        if ttl_s <= 0:
            raise IncorrectParameterError(f"token lifetime must be > 0 seconds, got {ttl_s}")
        issued = now or dt.datetime.now(dt.UTC)
        claims = {
            "sub": subject,
            "roles": list(roles),
            "aud": audience,
            "iat": int(issued.timestamp()),
            "exp": int((issued + dt.timedelta(seconds=ttl_s)).timestamp()),
            "jti": uuid.uuid4().hex,
        }
        token = jwt.encode(claims, self._key, algorithm=self.algorithm)
        if len(token) > MAX_TOKEN_BYTES:
            raise IncorrectParameterError(f"token of {len(token)} bytes exceeds {MAX_TOKEN_BYTES}: fewer roles")
        return token


# ------------------------------------------------------------------------------ verify


class TokenVerifier(_KeyedAlgorithm):
    """Verifies tokens signed with one key and algorithm."""

    @classmethod
    def from_secret_file(cls, path: str | Path) -> TokenVerifier:
        return cls(read_secret_file(path), "HS256")

    @classmethod
    def from_public_key_file(cls, path: str | Path) -> TokenVerifier:
        """From a public key PEM or a certificate PEM (its public key)."""
        data = _read(path, "token verification key")
        key: Any
        try:
            if b"BEGIN CERTIFICATE" in data:
                key = x509.load_pem_x509_certificate(data).public_key()
            else:
                key = serialization.load_pem_public_key(data)
        except ValueError as e:
            raise SecurityError(f"{path} is not a PEM public key or certificate: {e}") from None
        return cls(key, _algorithm_of(key, path))

    def verify(self, token: str | bytes, *, audience: str = DEFAULT_AUDIENCE) -> TokenClaims:
        """The claims of ``token``; ``SecurityError`` saying why if it is not acceptable."""
        if len(token) > MAX_TOKEN_BYTES:
            raise SecurityError(f"token refused: {len(token)} bytes is over the {MAX_TOKEN_BYTES}-byte limit")
        try:
            claims = jwt.decode(
                token, self._key, algorithms=[self.algorithm], audience=audience, leeway=LEEWAY_S,
                options={"require": ["sub", "exp", "aud"]},
            )
        except jwt.ExpiredSignatureError:
            raise SecurityError(f"token refused: expired at {_expiry_of(token)}") from None
        except jwt.InvalidSignatureError:
            raise SecurityError("token refused: bad signature (signed with another key)") from None
        except jwt.InvalidAudienceError:
            raise SecurityError(
                f"token refused: wrong audience {_unverified(token).get('aud')!r} (expected {audience!r})"
            ) from None
        except jwt.ImmatureSignatureError:
            raise SecurityError("token refused: not valid yet (issued in the future)") from None
        except jwt.MissingRequiredClaimError as e:
            raise SecurityError(f"token refused: no {e.claim!r} claim") from None
        except jwt.InvalidAlgorithmError:
            raise SecurityError(f"token refused: not signed with {self.algorithm}") from None
        except jwt.InvalidTokenError as e:
            raise SecurityError(f"token refused: malformed ({e})") from None
        roles = claims.get("roles", [])
        if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
            raise SecurityError("token refused: its 'roles' claim is not a list of names")
        subject = claims["sub"]
        if not isinstance(subject, str) or not subject:
            raise SecurityError("token refused: empty subject")
        iat = claims.get("iat")
        jti = claims.get("jti")
        return TokenClaims(
            subject=subject,
            roles=tuple(roles),
            audience=audience,
            expires_at=dt.datetime.fromtimestamp(claims["exp"], dt.UTC),
            issued_at=dt.datetime.fromtimestamp(iat, dt.UTC) if isinstance(iat, (int, float)) else None,
            token_id=jti if isinstance(jti, str) else None,
        )


def _unverified(token: str | bytes) -> dict[str, Any]:
    try:
        claims: dict[str, Any] = jwt.decode(token, options={"verify_signature": False})
        return claims
    except jwt.InvalidTokenError:
        return {}


def _expiry_of(token: str | bytes) -> str:
    exp = _unverified(token).get("exp")
    if not isinstance(exp, (int, float)):
        return "?"
    return dt.datetime.fromtimestamp(exp, dt.UTC).isoformat(timespec="seconds")
