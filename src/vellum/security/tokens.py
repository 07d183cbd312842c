"""Signed, expiring tokens (JWT, via pyjwt) for clients without certificates and for admin HTTP.

Responsibility: issue a token for a principal with roles, and verify one back into
``TokenClaims``; nothing else (which roles may do what is the authorization step's business).

Token = a JWT with claims ``sub`` (principal), ``roles`` (list of role names), ``aud``
(audience), ``iat``, ``exp`` and ``jti`` (a random id, so that a later replay check has
something to remember). The audience says which door a token opens: ``BOOKIE_AUDIENCE``
(``vellum``, the bookie port; also what every token issued before audiences were split
carries) or ``ADMIN_AUDIENCE`` (``vellum-admin``, the admin HTTP API); each door accepts only
its own. Algorithms:

* ``HS256``: a shared secret read from a file (``TokenSigner.from_secret_file``); the file must
  hold at least 32 bytes (``write_secret_file`` makes one, mode 0600); surrounding whitespace
  is ignored, so a trailing newline does not change the key;
* ``RS256`` / ``ES256``: the issuer signs with a private key PEM (RSA, or EC P-256) and
  verifiers hold only the public key (or the certificate) PEM.

Invariants: ``verify`` accepts exactly one algorithm (the verifier's; never ``none``), requires
``sub``, ``exp`` and ``aud``, refuses a token over ``MAX_TOKEN_BYTES`` before parsing it, and
raises :class:`vellum.errors.SecurityError` (never anything else, whatever the claims hold)
with a message naming the reason: expired (with when), bad signature, wrong audience, not yet
valid, lifetime over the maximum, malformed. Time claims (``exp``, ``iat``, ``nbf``) must be
numbers of seconds between 1970 and 9999; a string, a boolean or an out-of-range number is
malformed. A token may live at most ``max_lifetime_s`` (``exp - iat``, and ``exp`` no further
than that from now): ``issue`` refuses a longer one, ``verify`` refuses one signed elsewhere.
"""

from __future__ import annotations

import base64
import datetime as dt
import math
import secrets
import time
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
#: the audience of tokens for the bookie port (``tokenAudience``)
BOOKIE_AUDIENCE = "vellum"
#: the audience of tokens for the admin HTTP API (``httpServerTokenAudience``)
ADMIN_AUDIENCE = "vellum-admin"
DEFAULT_AUDIENCE = BOOKIE_AUDIENCE
DEFAULT_TTL_S = 3600.0
#: the longest a token may live unless configured otherwise (``tokenMaxLifetimeSeconds``): 30 days
DEFAULT_MAX_LIFETIME_S = 30 * 24 * 3600.0
#: the latest time claim accepted (9999-12-31T23:59:59Z): beyond, a date cannot even be printed
_MAX_TIME_S = 253402300799
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
    """One key and one of ``ALGORITHMS`` (what signing and verifying both hold), and the
    longest lifetime a token may have."""

    def __init__(self, key: Any, algorithm: str, *, max_lifetime_s: float = DEFAULT_MAX_LIFETIME_S) -> None:
        if algorithm not in ALGORITHMS:
            raise IncorrectParameterError(f"token algorithm {algorithm!r} is not one of {', '.join(ALGORITHMS)}")
        if not max_lifetime_s > 0:
            raise IncorrectParameterError(f"the maximum token lifetime must be > 0 seconds, got {max_lifetime_s}")
        self._key = key
        self.algorithm = algorithm
        self.max_lifetime_s = float(max_lifetime_s)


class TokenSigner(_KeyedAlgorithm):
    """Issues tokens with one key and algorithm."""

    @classmethod
    def from_secret_file(cls, path: str | Path, *, max_lifetime_s: float = DEFAULT_MAX_LIFETIME_S) -> TokenSigner:
        return cls(read_secret_file(path), "HS256", max_lifetime_s=max_lifetime_s)

    @classmethod
    def from_private_key_file(cls, path: str | Path, password: bytes | None = None, *,
                              max_lifetime_s: float = DEFAULT_MAX_LIFETIME_S) -> TokenSigner:
        try:
            key = serialization.load_pem_private_key(_read(path, "token signing key"), password)
        except (ValueError, TypeError) as e:
            raise SecurityError(f"{path} is not a usable PEM private key: {e}") from None
        return cls(key, _algorithm_of(key, path), max_lifetime_s=max_lifetime_s)

    def issue(self, subject: str, roles: Sequence[str] = (), *, ttl_s: float = DEFAULT_TTL_S,
              audience: str = DEFAULT_AUDIENCE, now: dt.datetime | None = None) -> str:
        """A token for ``subject`` with ``roles``, valid ``ttl_s`` seconds from ``now``."""
        if not subject:
            raise IncorrectParameterError("a token needs a subject (the principal)")
        if not ttl_s > 0:
            raise IncorrectParameterError(f"token lifetime must be > 0 seconds, got {ttl_s}")
        if ttl_s > self.max_lifetime_s:
            raise IncorrectParameterError(
                f"token lifetime {ttl_s:.0f}s is over the maximum of {self.max_lifetime_s:.0f}s that bookies accept "
                "(tokenMaxLifetimeSeconds): issue a shorter one and renew it (clientAuthTokenFile is re-read)"
            )
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
    def from_secret_file(cls, path: str | Path, *, max_lifetime_s: float = DEFAULT_MAX_LIFETIME_S) -> TokenVerifier:
        return cls(read_secret_file(path), "HS256", max_lifetime_s=max_lifetime_s)

    @classmethod
    def from_public_key_file(cls, path: str | Path, *,
                             max_lifetime_s: float = DEFAULT_MAX_LIFETIME_S) -> TokenVerifier:
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
        return cls(key, _algorithm_of(key, path), max_lifetime_s=max_lifetime_s)

    def verify(self, token: str | bytes, *, audience: str = DEFAULT_AUDIENCE,
               now: float | None = None) -> TokenClaims:
        """The claims of ``token``; ``SecurityError`` saying why if it is not acceptable."""
        if len(token) > MAX_TOKEN_BYTES:
            raise SecurityError(f"token refused: {len(token)} bytes is over the {MAX_TOKEN_BYTES}-byte limit")
        try:
            # pyjwt checks the signature, the audience and that the claims are there; the time
            # claims are checked below, where a bad value cannot escape as anything but a refusal.
            claims = jwt.decode(
                token, self._key, algorithms=[self.algorithm], audience=audience,
                options={"require": ["sub", "exp", "aud"], "verify_exp": False, "verify_iat": False,
                         "verify_nbf": False},
            )
        except jwt.InvalidSignatureError:
            raise SecurityError("token refused: bad signature (signed with another key)") from None
        except jwt.InvalidAudienceError:
            raise SecurityError(
                f"token refused: wrong audience {_audience_of(token)!r} (expected {audience!r}"
                f"{_AUDIENCE_HINTS.get(audience, '')})"
            ) from None
        except jwt.MissingRequiredClaimError as e:
            raise SecurityError(f"token refused: no {e.claim!r} claim") from None
        except jwt.InvalidAlgorithmError:
            raise SecurityError(f"token refused: not signed with {self.algorithm}") from None
        except jwt.InvalidTokenError as e:
            raise SecurityError(f"token refused: malformed ({e})") from None
        except Exception as e:  # whatever a peer sends must end as a refusal
            raise SecurityError(f"token refused: malformed ({type(e).__name__})") from None
        roles = claims.get("roles", [])
        if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
            raise SecurityError("token refused: its 'roles' claim is not a list of names")
        subject = claims["sub"]
        if not isinstance(subject, str) or not subject:
            raise SecurityError("token refused: empty subject")
        exp = _time_claim(claims, "exp")
        iat = _time_claim(claims, "iat")
        nbf = _time_claim(claims, "nbf")
        assert exp is not None  # required above
        t = time.time() if now is None else now
        if exp <= t - LEEWAY_S:
            raise SecurityError(f"token refused: expired at {_iso(exp)}")
        if (nbf is not None and nbf > t + LEEWAY_S) or (iat is not None and iat > t + LEEWAY_S):
            raise SecurityError("token refused: not valid yet (issued in the future)")
        if iat is not None and exp - iat > self.max_lifetime_s + LEEWAY_S:
            raise SecurityError(
                f"token refused: its lifetime ({exp - iat:.0f}s from iat to exp) is over the maximum of "
                f"{self.max_lifetime_s:.0f}s (tokenMaxLifetimeSeconds)"
            )
        if exp - t > self.max_lifetime_s + LEEWAY_S:
            raise SecurityError(
                f"token refused: valid until {_iso(exp)}, more than the maximum lifetime of "
                f"{self.max_lifetime_s:.0f}s from now (tokenMaxLifetimeSeconds)"
            )
        jti = claims.get("jti")
        return TokenClaims(
            subject=subject,
            roles=tuple(roles),
            audience=audience,
            expires_at=dt.datetime.fromtimestamp(exp, dt.UTC),
            issued_at=dt.datetime.fromtimestamp(iat, dt.UTC) if iat is not None else None,
            token_id=jti if isinstance(jti, str) else None,
        )


#: what a refusal for the wrong audience adds, by the audience expected
_AUDIENCE_HINTS = {
    ADMIN_AUDIENCE: "; admin HTTP takes tokens issued for it: `vellum security issue-token --for admin`",
    BOOKIE_AUDIENCE: "; the bookie port takes tokens issued for it: `vellum security issue-token --for bookie`",
}


def _time_claim(claims: dict[str, Any], name: str) -> float | None:
    """A NumericDate claim (seconds since 1970) as a float, None if absent; a refusal for
    anything else (a string, a boolean, NaN, a time before 1970 or after 9999)."""
    value = claims.get(name)
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not (isinstance(value, int) or math.isfinite(value)) or not 0 <= value <= _MAX_TIME_S):
        shown = repr(value)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        raise SecurityError(f"token refused: malformed {name!r} claim {shown} (a time in seconds since 1970 "
                            "is expected)")
    return float(value)


def _iso(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat(timespec="seconds")


def _unverified(token: str | bytes) -> dict[str, Any]:
    try:
        claims: dict[str, Any] = jwt.decode(token, options={"verify_signature": False})
        return claims
    except Exception:  # only used to word a refusal
        return {}


def _audience_of(token: str | bytes) -> Any:
    aud = _unverified(token).get("aud")
    return aud if isinstance(aud, (str, list)) else None
