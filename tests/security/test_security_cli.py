"""``vellum security``: create-ca, issue-cert, create-secret and issue-token write what they say,
print the configuration keys to set next, and what they make works (the certificate chains to
the CA, carries its role; the token verifies)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from vellum.cli.main import cli
from vellum.config import TLS_CONTEXT_FACTORY
from vellum.security import pki
from vellum.security.tokens import TokenVerifier


def test_create_ca_then_issue_certificates_and_a_token(tmp_path: Path) -> None:
    run = CliRunner().invoke
    r = run(cli, ["security", "create-ca", "--dir", str(tmp_path / "ca"), "--name", "Prod CA"])
    assert r.exit_code == 0, r.output
    assert "ca.cert.pem" in r.output and "issue-cert" in r.output
    r = run(cli, ["security", "create-ca", "--dir", str(tmp_path / "ca")])
    assert r.exit_code != 0 and "already holds a CA" in str(r.exception)  # main() prints it as "error: ..."

    r = run(cli, ["security", "issue-cert", "--ca-dir", str(tmp_path / "ca"), "--role", "bookie", "--name",
                  "bookie-1", "--dns", "bk1.example", "--ip", "10.1.2.3", "--days", "30", "--out",
                  str(tmp_path / "bk1")])
    assert r.exit_code == 0, r.output
    for line in (f"tlsProviderFactoryClass={TLS_CONTEXT_FACTORY}", "tlsKeyStoreType=PEM",
                 f"tlsKeyStore={(tmp_path / 'bk1' / 'bookie-1.key.pem').resolve()}",
                 f"tlsCertificatePath={(tmp_path / 'bk1' / 'bookie-1.cert.pem').resolve()}",
                 f"tlsTrustStore={(tmp_path / 'bk1' / 'ca.cert.pem').resolve()}", "tlsClientAuthentication=true"):
        assert line in r.output, (line, r.output)
    cert = pki.load_certificate(tmp_path / "bk1" / "bookie-1.cert.pem")
    cert.verify_directly_issued_by(pki.load_certificate(tmp_path / "ca" / "ca.cert.pem"))
    assert (pki.principal_of(cert), pki.roles_of(cert)) == ("bookie-1", ("bookie",))
    assert stat.S_IMODE((tmp_path / "bk1" / "bookie-1.key.pem").stat().st_mode) == 0o600

    (tmp_path / "pw").write_text("s3cret\n")
    r = run(cli, ["security", "issue-cert", "--ca-dir", str(tmp_path / "ca"), "--role", "admin", "--name", "ops",
                  "--key-password-file", str(tmp_path / "pw"), "--out", str(tmp_path / "ops")])
    assert r.exit_code == 0, r.output
    assert "client's configuration" in r.output and "tlsKeyStorePasswordPath=" in r.output
    assert pki.load_private_key(tmp_path / "ops" / "ops.key.pem", b"s3cret") is not None
    r = run(cli, ["security", "issue-cert", "--ca-dir", str(tmp_path / "ca"), "--role", "root", "--name", "x",
                  "--out", str(tmp_path / "x")])
    assert r.exit_code != 0 and "'root' is not one of" in r.output

    r = run(cli, ["security", "create-secret", "--out", str(tmp_path / "token.secret")])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["security", "issue-token", "--secret-file", str(tmp_path / "token.secret"),
                                 "--subject", "spark-job", "--role", "client", "--ttl", "30m"])
    assert r.exit_code == 0, r.output
    token = r.stdout.strip()
    assert "\n" not in token and "valid for 1800s" in r.stderr
    claims = TokenVerifier.from_secret_file(tmp_path / "token.secret").verify(token)
    assert (claims.subject, claims.roles) == ("spark-job", ("client",))
    r = run(cli, ["security", "issue-token", "--subject", "x"])
    assert r.exit_code != 0 and "exactly one of --secret-file" in r.output


def test_issue_token_names_the_door_and_refuses_an_overlong_lifetime(tmp_path: Path) -> None:
    from vellum.errors import IncorrectParameterError, SecurityError
    from vellum.security.tokens import ADMIN_AUDIENCE, BOOKIE_AUDIENCE

    secret = str(tmp_path / "token.secret")
    assert CliRunner().invoke(cli, ["security", "create-secret", "--out", secret]).exit_code == 0
    verifier = TokenVerifier.from_secret_file(secret)

    def issue(*args: str) -> tuple[int, str, str, BaseException | None]:
        r = CliRunner().invoke(cli, ["security", "issue-token", "--secret-file", secret, "--subject", "s", *args])
        return r.exit_code, r.stdout.strip(), r.stderr, r.exception

    code, token, said, _ = issue("--role", "admin")  # admin role: for admin HTTP unless told
    assert code == 0 and "(the admin HTTP API)" in said
    assert verifier.verify(token, audience=ADMIN_AUDIENCE).roles == ("admin",)
    with pytest.raises(SecurityError, match="wrong audience 'vellum-admin'"):
        verifier.verify(token, audience=BOOKIE_AUDIENCE)
    code, token, said, _ = issue("--role", "admin", "--for", "bookie")
    assert code == 0 and "(the bookie port)" in said and verifier.verify(token, audience=BOOKIE_AUDIENCE)
    code, token, _, _ = issue("--role", "client")
    assert code == 0 and verifier.verify(token, audience=BOOKIE_AUDIENCE).roles == ("client",)
    code, _, _, exc = issue("--role", "admin", "--ttl", "36500d")  # a 100-year admin token
    assert code != 0 and isinstance(exc, IncorrectParameterError) and "tokenMaxLifetimeSeconds" in str(exc)
    code, token, _, _ = issue("--role", "client", "--ttl", "60d", "--max-lifetime", "90d")
    assert code == 0
    with pytest.raises(SecurityError, match="over the maximum of 2592000s"):
        verifier.verify(token, audience=BOOKIE_AUDIENCE)  # a bookie keeping the default refuses it
