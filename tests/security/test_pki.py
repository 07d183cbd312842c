"""The certificate authority (``vellum.security.pki``): what a CA and an issued certificate say,
how roles travel (BookKeeper's OU convention), and how the files are written."""

from __future__ import annotations

import datetime as dt
import ipaddress
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from security_testkit import KEY_PASSWORD, Pki

from vellum.errors import IncorrectParameterError, SecurityError
from vellum.security import pki


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_ca_is_a_self_signed_ca_certificate_with_a_private_key_file(tmp_path: Path) -> None:
    ca = pki.create_ca("My CA", days=30)
    files = pki.write_ca(ca, tmp_path / "ca")
    assert (files.cert.name, files.key.name) == ("ca.cert.pem", "ca.key.pem")
    assert _mode(files.key) == 0o600 and _mode(files.cert) == 0o644 and _mode(tmp_path / "ca") == 0o700
    loaded = pki.load_ca(tmp_path / "ca")
    assert loaded.cert == ca.cert
    cert = loaded.cert
    assert cert.subject == cert.issuer
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "My CA"
    bc = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert bc.critical and bc.value.ca and bc.value.path_length == 0
    assert cert.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign
    assert cert.not_valid_after_utc - cert.not_valid_before_utc == dt.timedelta(days=30)
    cert.verify_directly_issued_by(cert)
    assert isinstance(loaded.key, ec.EllipticCurvePrivateKey) and loaded.key.curve.name == "secp256r1"


def test_a_second_ca_in_the_same_place_is_refused_unless_forced(tmp_path: Path) -> None:
    pki.write_ca(pki.create_ca(), tmp_path)
    with pytest.raises(SecurityError, match="already holds a CA"):
        pki.write_ca(pki.create_ca(), tmp_path)
    replacement = pki.create_ca("new")
    pki.write_ca(replacement, tmp_path, overwrite=True)
    assert pki.load_ca(tmp_path).cert == replacement.cert


@pytest.mark.parametrize("role", pki.ROLES)
def test_an_issued_certificate_names_its_principal_and_role(role: str) -> None:
    ca = pki.create_ca()
    issued = pki.issue_certificate(ca, name=f"{role}-7", role=role)
    cert = issued.cert
    cert.verify_directly_issued_by(ca.cert)
    assert pki.principal_of(cert) == f"{role}-7"
    assert pki.roles_of(cert) == (role,)
    # BookKeeper's CertUtils convention: OU "0:<roles>"
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)[0].value == f"0:{role}"
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    eku = list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    # A bookie is a TLS server and (towards other bookies) a client; clients and admins only clients.
    expected = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH] if role == "bookie" else [
        ExtendedKeyUsageOID.CLIENT_AUTH]
    assert eku == expected
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_sans_validity_and_key_type_are_as_asked() -> None:
    ca = pki.create_ca(key_type="rsa-2048")
    start = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    issued = pki.issue_certificate(
        ca, name="b", role="bookie", dns_names=["bk1.example", "bk1"], ip_addresses=["10.0.0.5", "::1"],
        days=7, valid_from=start, key_type="ec-p384", extra_roles=["auditor"],
    )
    cert = issued.cert
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["bk1.example", "bk1"]
    assert [str(i) for i in san.get_values_for_type(x509.IPAddress)] == ["10.0.0.5", "::1"]
    assert cert.not_valid_before_utc == start and cert.not_valid_after_utc == start + dt.timedelta(days=7)
    assert isinstance(issued.key, ec.EllipticCurvePrivateKey) and issued.key.curve.name == "secp384r1"
    assert isinstance(ca.key, rsa.RSAPrivateKey)
    assert pki.roles_of(cert) == ("bookie", "auditor")


def test_roles_are_read_the_way_bookkeeper_reads_them() -> None:
    ca = pki.create_ca()
    key = pki.generate_key()

    def with_ou(ou: str | None) -> x509.Certificate:
        names = [x509.NameAttribute(NameOID.COMMON_NAME, "x")]
        if ou is not None:
            names.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, ou))
        now = dt.datetime.now(dt.UTC)
        return (x509.CertificateBuilder().subject_name(x509.Name(names)).issuer_name(ca.cert.subject)
                .public_key(key.public_key()).serial_number(1).not_valid_before(now)
                .not_valid_after(now + dt.timedelta(days=1)).sign(ca.key, hashes.SHA256()))

    assert pki.roles_of(with_ou("0:client, admin ;1:cluster-a")) == ("client", "admin")
    assert pki.roles_of(with_ou("1:cluster-a;0:bookie")) == ("bookie",)
    assert pki.roles_of(with_ou("engineering")) == ()
    assert pki.roles_of(with_ou(None)) == ()


def test_bad_requests_are_refused() -> None:
    ca = pki.create_ca()
    with pytest.raises(IncorrectParameterError, match="role 'root' is not one of bookie, client, admin"):
        pki.issue_certificate(ca, name="x", role="root")
    with pytest.raises(IncorrectParameterError, match="not an IP address"):
        pki.issue_certificate(ca, name="x", role="client", ip_addresses=["localhost"])
    with pytest.raises(IncorrectParameterError, match="positive number of days"):
        pki.issue_certificate(ca, name="x", role="client", days=0)
    with pytest.raises(IncorrectParameterError, match="key type"):
        pki.create_ca(key_type="dsa")
    with pytest.raises(IncorrectParameterError, match="may not be empty or contain"):
        pki.issue_certificate(ca, name="x", role="client", extra_roles=["a,b"])


def test_certificate_files_keys_0600_ca_copy_and_no_silent_overwrite(tmp_path: Path) -> None:
    ca = pki.create_ca()
    issued = pki.issue_certificate(ca, name="alice smith/ops", role="client")
    files = pki.write_certificate(issued, tmp_path / "out")
    assert files.cert.name == "alice_smith_ops.cert.pem" and files.key.name == "alice_smith_ops.key.pem"
    assert _mode(files.key) == 0o600 and _mode(files.cert) == 0o644
    assert pki.load_certificate(files.ca) == ca.cert
    assert pki.load_certificate(files.cert) == issued.cert
    assert pki.load_private_key(files.key).public_key() == issued.key.public_key()
    with pytest.raises(SecurityError, match="refusing to overwrite"):
        pki.write_certificate(pki.issue_certificate(ca, name="alice smith/ops", role="client"), tmp_path / "out")
    assert not list((tmp_path / "out").glob(".*tmp")), "no temporary file is left behind"


def test_an_encrypted_key_needs_its_password(pki_set: Pki) -> None:
    key_file = pki_set.encrypted_client.key
    assert b"ENCRYPTED" in key_file.read_bytes()
    with pytest.raises(SecurityError, match="private key"):
        pki.load_private_key(key_file)
    with pytest.raises(SecurityError, match="password is wrong"):
        pki.load_private_key(key_file, b"wrong")
    assert pki.load_private_key(key_file, KEY_PASSWORD) is not None


def test_missing_and_garbage_files_say_which_file(tmp_path: Path) -> None:
    with pytest.raises(SecurityError, match=r"cannot read certificate .*nope.pem"):
        pki.load_certificate(tmp_path / "nope.pem")
    junk = tmp_path / "junk.pem"
    junk.write_text("hello")
    with pytest.raises(SecurityError, match=r"junk.pem is not a PEM certificate"):
        pki.load_certificate(junk)
