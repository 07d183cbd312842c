"""Signed tokens (``vellum.security.tokens``): issue and verify with HS256, RS256 and ES256, and
a clear refusal for each way a token can be wrong."""

from __future__ import annotations

import base64
import datetime as dt
import json
import stat
from pathlib import Path

import jwt
import pytest
from security_testkit import Pki

from vellum.errors import SecurityError
from vellum.security import pki, tokens
from vellum.security.tokens import TokenSigner, TokenVerifier


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    return tokens.write_secret_file(tmp_path / "token.secret")


def test_hs256_round_trip(secret: Path) -> None:
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    token = TokenSigner.from_secret_file(secret).issue("alice", ["client", "reader"], ttl_s=600)
    claims = TokenVerifier.from_secret_file(secret).verify(token)
    assert (claims.subject, claims.roles, claims.audience) == ("alice", ("client", "reader"), "vellum")
    assert claims.token_id and claims.issued_at is not None
    assert dt.timedelta(seconds=590) < claims.expires_at - claims.issued_at <= dt.timedelta(seconds=600)
    header = json.loads(base64.urlsafe_b64decode(token.split(".")[0] + "=="))
    assert header["alg"] == "HS256"


def test_a_trailing_newline_in_the_secret_file_does_not_change_the_key(secret: Path, tmp_path: Path) -> None:
    other = tmp_path / "copy"
    other.write_bytes(secret.read_bytes().strip() + b"\r\n\n")
    token = TokenSigner.from_secret_file(secret).issue("alice")
    assert TokenVerifier.from_secret_file(other).verify(token).subject == "alice"


def test_expired_tokens_are_refused_with_when(secret: Path) -> None:
    issued = dt.datetime.now(dt.UTC) - dt.timedelta(hours=2)
    token = TokenSigner.from_secret_file(secret).issue("alice", ttl_s=60, now=issued)
    with pytest.raises(SecurityError, match=r"token refused: expired at 20\d\d-"):
        TokenVerifier.from_secret_file(secret).verify(token)


def test_a_token_signed_with_another_key_is_a_bad_signature(secret: Path, tmp_path: Path) -> None:
    other = tokens.write_secret_file(tmp_path / "other.secret")
    token = TokenSigner.from_secret_file(other).issue("mallory", ["admin"])
    with pytest.raises(SecurityError, match="bad signature"):
        TokenVerifier.from_secret_file(secret).verify(token)


def test_a_token_for_another_audience_is_refused(secret: Path) -> None:
    token = TokenSigner.from_secret_file(secret).issue("alice", audience="some-other-service")
    with pytest.raises(SecurityError, match=r"wrong audience 'some-other-service' \(expected 'vellum'[;)]"):
        TokenVerifier.from_secret_file(secret).verify(token)
    assert TokenVerifier.from_secret_file(secret).verify(token, audience="some-other-service").subject == "alice"


def test_unsigned_tampered_oversized_and_incomplete_tokens_are_refused(secret: Path) -> None:
    verifier = TokenVerifier.from_secret_file(secret)
    key = tokens.read_secret_file(secret)
    exp = int((dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).timestamp())
    unsigned = jwt.encode({"sub": "root", "aud": "vellum", "exp": exp, "roles": ["admin"]}, None, algorithm="none")
    with pytest.raises(SecurityError, match="token refused"):
        verifier.verify(unsigned)
    good = TokenSigner.from_secret_file(secret).issue("alice", ["client"])
    head, body, sig = good.split(".")
    claims = json.loads(base64.urlsafe_b64decode(body + "=="))
    claims["roles"] = ["admin"]
    forged_body = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    with pytest.raises(SecurityError, match="bad signature"):
        verifier.verify(f"{head}.{forged_body}.{sig}")
    with pytest.raises(SecurityError, match="over the 8192-byte limit"):
        verifier.verify("x" * 10000)
    no_exp = jwt.encode({"sub": "alice", "aud": "vellum"}, key, algorithm="HS256")
    with pytest.raises(SecurityError, match="no 'exp' claim"):
        verifier.verify(no_exp)
    bad_roles = jwt.encode({"sub": "alice", "aud": "vellum", "exp": exp, "roles": "admin"}, key, algorithm="HS256")
    with pytest.raises(SecurityError, match="'roles' claim is not a list"):
        verifier.verify(bad_roles)
    with pytest.raises(SecurityError, match="malformed"):
        verifier.verify("not.a.token")


def test_short_secrets_are_refused(tmp_path: Path) -> None:
    weak = tmp_path / "weak"
    weak.write_text("hunter2\n")
    with pytest.raises(SecurityError, match="holds 7 bytes; HS256 needs at least 32"):
        TokenSigner.from_secret_file(weak)


@pytest.mark.parametrize(("key_type", "algorithm"), [("ec-p256", "ES256"), ("rsa-2048", "RS256")])
def test_key_pair_tokens_verify_with_the_public_key_or_the_certificate(
    tmp_path: Path, key_type: str, algorithm: str
) -> None:
    ca = pki.create_ca(key_type=key_type)
    files = pki.write_ca(ca, tmp_path)
    signer = TokenSigner.from_private_key_file(files.key)
    assert signer.algorithm == algorithm
    token = signer.issue("svc-spark", ["client"])
    public = tmp_path / "public.pem"
    from cryptography.hazmat.primitives import serialization

    public.write_bytes(ca.key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    assert TokenVerifier.from_public_key_file(public).verify(token).roles == ("client",)
    assert TokenVerifier.from_public_key_file(files.cert).verify(token).subject == "svc-spark"
    # A token signed by some other key pair of the same kind fails.
    stranger = pki.write_ca(pki.create_ca(key_type=key_type), tmp_path / "stranger")
    with pytest.raises(SecurityError, match="bad signature"):
        TokenVerifier.from_public_key_file(public).verify(TokenSigner.from_private_key_file(stranger.key).issue("x"))


def test_an_hs256_token_is_not_accepted_by_a_key_pair_verifier(pki_set: Pki, secret: Path) -> None:
    # Algorithm confusion: the verifier accepts exactly its own algorithm.
    token = TokenSigner.from_secret_file(secret).issue("alice")
    with pytest.raises(SecurityError, match="not signed with ES256"):
        TokenVerifier.from_public_key_file(pki_set.ca.cert).verify(token)


@pytest.mark.parametrize("bad", ["tomorrow", "4102444800", 1e300, 10**30, -1, True, None, [1], {"a": 1}])
@pytest.mark.parametrize("claim", ["exp", "iat", "nbf"])
def test_bad_time_claims_are_refusals_never_crashes(secret: Path, claim: str, bad: object) -> None:
    now = int(dt.datetime.now(dt.UTC).timestamp())
    body = {"sub": "m", "aud": "vellum", "iat": now, "exp": now + 60, claim: bad}
    if bad is None:
        body.pop(claim)
        if claim == "exp":
            with pytest.raises(SecurityError, match="no 'exp' claim"):
                TokenVerifier.from_secret_file(secret).verify(jwt.encode(body, tokens.read_secret_file(secret)))
            return
        assert TokenVerifier.from_secret_file(secret).verify(jwt.encode(body, tokens.read_secret_file(secret)))
        return
    token = jwt.encode(body, tokens.read_secret_file(secret), algorithm="HS256")
    with pytest.raises(SecurityError, match=f"token refused: malformed '{claim}' claim"):
        TokenVerifier.from_secret_file(secret).verify(token)


def test_a_token_may_not_live_longer_than_the_maximum(secret: Path) -> None:
    from vellum.errors import IncorrectParameterError

    signer = TokenSigner.from_secret_file(secret)
    with pytest.raises(IncorrectParameterError, match="over the maximum of 2592000s"):
        signer.issue("ops", ["admin"], ttl_s=100 * 365 * 86400.0)
    long_lived = TokenSigner.from_secret_file(secret, max_lifetime_s=90 * 86400.0).issue("ops", ttl_s=60 * 86400.0)
    with pytest.raises(SecurityError, match=r"lifetime \(5184000s from iat to exp\) is over the maximum of 2592000s"):
        TokenVerifier.from_secret_file(secret).verify(long_lived)
    assert TokenVerifier.from_secret_file(secret, max_lifetime_s=90 * 86400.0).verify(long_lived).subject == "ops"
