"""A small certificate authority for a Vellum cluster: create a CA, issue role certificates.

Responsibility: make the PEM files TLS needs (``tlsTrustStore`` = the CA certificate,
``tlsCertificatePath`` + ``tlsKeyStore`` = a certificate and its private key) and read a
certificate's identity back. Uses ``cryptography``; no hand-written ASN.1.

What a certificate says:

* CA: subject ``CN=<name>, O=Vellum``; ``BasicConstraints(ca, pathlen=0)`` and
  ``KeyUsage(keyCertSign, cRLSign)``, both critical; self-signed.
* Issued (``issue_certificate``): subject ``CN=<principal>, OU=0:<role>, O=Vellum``. The OU
  follows BookKeeper's ``CertUtils`` convention (``<code>:<value>`` parts separated by ``;``;
  code ``0`` lists role names separated by ``,``), so ``roles_of`` and a BookKeeper
  ``authorizedRoles`` check read the same roles. SANs: the DNS names and IP addresses given
  (default ``localhost`` and ``127.0.0.1``). Extended key usage: ``bookie`` certificates are
  both TLS server and TLS client (a bookie also connects to other bookies); ``client`` and
  ``admin`` certificates are TLS client only, so a bookie never accepts them as a server.
* Keys: EC P-256 by default (``KEY_TYPES``); signatures SHA-256 (SHA-384 for P-384).
* Validity: from ``valid_from`` (default: a minute ago, for clock skew) for ``days`` days.

Files (``write_ca`` / ``write_certificate``): ``ca.cert.pem`` + ``ca.key.pem`` in the CA
directory; ``<name>.cert.pem`` + ``<name>.key.pem`` + a copy of ``ca.cert.pem`` in an output
directory. Private keys are written with mode 0600 (optionally encrypted with a password, as
``tlsKeyStorePasswordPath`` expects), certificates 0644; every file is written to a temporary
name and renamed into place, so a process reloading certificates never reads half a file.
Existing files are not overwritten unless asked (a replaced CA orphans every certificate).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from vellum.errors import IncorrectParameterError, SecurityError

#: The roles a certificate can be issued for.
ROLES = ("bookie", "client", "admin")
#: Key types ``issue_certificate`` / ``create_ca`` accept; the first is the default.
KEY_TYPES = ("ec-p256", "ec-p384", "rsa-2048", "rsa-3072")
DEFAULT_KEY_TYPE = KEY_TYPES[0]
DEFAULT_DNS_NAMES = ("localhost",)
DEFAULT_IP_ADDRESSES = ("127.0.0.1",)
#: BookKeeper's CertUtils: OU parts ``<code>:<value>`` separated by ``;``; code 0 = role names.
OU_ROLE_CODE = "0"
_OU_PART = re.compile(r"^([0-9]+):(.*)$")
_ORGANIZATION = "Vellum"

CA_CERT_FILE = "ca.cert.pem"
CA_KEY_FILE = "ca.key.pem"

PrivateKey: TypeAlias = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


@dataclass(frozen=True)
class CertificateAuthority:
    """A CA: its private key and self-signed certificate."""

    key: PrivateKey
    cert: x509.Certificate

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)


@dataclass(frozen=True)
class IssuedCertificate:
    """A certificate issued by a CA, with its private key and the CA certificate."""

    name: str
    key: PrivateKey
    cert: x509.Certificate
    ca_cert: x509.Certificate

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def key_pem(self, password: bytes | None = None) -> bytes:
        return private_key_pem(self.key, password)


@dataclass(frozen=True)
class CaFiles:
    cert: Path
    key: Path


@dataclass(frozen=True)
class CertificateFiles:
    """Where ``write_certificate`` put things: the certificate (``tlsCertificatePath``), its key
    (``tlsKeyStore``) and the CA certificate (``tlsTrustStore``)."""

    cert: Path
    key: Path
    ca: Path


# ------------------------------------------------------------------------------- keys


def generate_key(key_type: str = DEFAULT_KEY_TYPE) -> PrivateKey:
    if key_type == "ec-p256":
        return ec.generate_private_key(ec.SECP256R1())
    if key_type == "ec-p384":
        return ec.generate_private_key(ec.SECP384R1())
    if key_type in ("rsa-2048", "rsa-3072"):
        return rsa.generate_private_key(public_exponent=65537, key_size=int(key_type[4:]))
    raise IncorrectParameterError(f"key type {key_type!r} is not one of {', '.join(KEY_TYPES)}")


def _hash_for(key: PrivateKey) -> hashes.SHA256 | hashes.SHA384:
    if isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.key_size > 256:
        return hashes.SHA384()
    return hashes.SHA256()


def private_key_pem(key: PrivateKey, password: bytes | None = None) -> bytes:
    """PKCS#8 PEM, encrypted with ``password`` if one is given (what ``ssl`` loads with
    ``tlsKeyStorePasswordPath``)."""
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    )
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)


# ------------------------------------------------------------------------- certificates


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _validity(valid_from: dt.datetime | None, days: float) -> tuple[dt.datetime, dt.datetime]:
    if days <= 0:
        raise IncorrectParameterError(f"validity must be a positive number of days, got {days}")
    start = valid_from if valid_from is not None else _now() - dt.timedelta(minutes=1)
    if start.tzinfo is None:
        start = start.replace(tzinfo=dt.UTC)
    return start, start + dt.timedelta(days=days)


def create_ca(
    name: str = "Vellum CA",
    *,
    days: float = 3650,
    key_type: str = DEFAULT_KEY_TYPE,
    valid_from: dt.datetime | None = None,
) -> CertificateAuthority:
    """A new CA: a fresh key and a self-signed certificate valid for ``days``."""
    key = generate_key(key_type)
    subject = x509.Name([
        x509.NameAttribute(NameOID.COMMON_NAME, name),
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, _ORGANIZATION),
    ])
    start, end = _validity(valid_from, days)
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .sign(key, _hash_for(key))
    )
    return CertificateAuthority(key, cert)


def issue_certificate(
    ca: CertificateAuthority,
    *,
    name: str,
    role: str,
    dns_names: Sequence[str] = DEFAULT_DNS_NAMES,
    ip_addresses: Sequence[str] = DEFAULT_IP_ADDRESSES,
    days: float = 365,
    key_type: str = DEFAULT_KEY_TYPE,
    valid_from: dt.datetime | None = None,
    extra_roles: Sequence[str] = (),
) -> IssuedCertificate:
    """A certificate for principal ``name`` with ``role`` (one of ``ROLES``; ``extra_roles``
    are added to the OU as well), signed by ``ca``."""
    if role not in ROLES:
        raise IncorrectParameterError(f"role {role!r} is not one of {', '.join(ROLES)}")
    if not name or not name.strip():
        raise IncorrectParameterError("a certificate needs a principal name (its CN)")
    roles = [role, *(r for r in extra_roles if r != role)]
    for r in roles:
        if not r or any(c in r for c in ",;:") or r != r.strip():
            raise IncorrectParameterError(f"role name {r!r} may not be empty or contain ',', ';' or ':'")
    key = generate_key(key_type)
    subject = x509.Name([
        x509.NameAttribute(NameOID.COMMON_NAME, name),
        x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, f"{OU_ROLE_CODE}:{','.join(roles)}"),
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, _ORGANIZATION),
    ])
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
    for ip in ip_addresses:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(ip)))
        except ValueError:
            raise IncorrectParameterError(f"{ip!r} is not an IP address") from None
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if role == "bookie":
        usages.insert(0, ExtendedKeyUsageOID.SERVER_AUTH)
    start, end = _validity(valid_from, days)
    ca_ski = ca.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False,
                key_encipherment=isinstance(key, rsa.RSAPrivateKey), data_encipherment=False,
                key_agreement=False, key_cert_sign=False, crl_sign=False, encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca.key, _hash_for(ca.key))
    return IssuedCertificate(name, key, cert, ca.cert)


# ---------------------------------------------------------------------------- identity


def principal_of(cert: x509.Certificate) -> str:
    """The certificate's principal: its subject CN."""
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not names:
        raise SecurityError(f"certificate {cert.subject.rfc4514_string()!r} has no common name (CN)")
    value = names[0].value
    return value.decode() if isinstance(value, bytes) else value


def roles_of(cert: x509.Certificate) -> tuple[str, ...]:
    """The roles in the certificate's subject OU (BookKeeper's ``CertUtils.getRolesFromOU``:
    the first OU, its ``0:`` part, split on ``,``); ``()`` if it names none."""
    ous = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
    if not ous:
        return ()
    ou = ous[0].value
    text = ou.decode() if isinstance(ou, bytes) else ou
    for part in text.split(";"):
        match = _OU_PART.match(part.strip())
        if match and match.group(1) == OU_ROLE_CODE:
            return tuple(r.strip() for r in match.group(2).split(",") if r.strip())
    return ()


def load_certificate(path: str | Path) -> x509.Certificate:
    """The first certificate of a PEM file."""
    data = _read(Path(path), "certificate")
    try:
        return x509.load_pem_x509_certificate(data)
    except ValueError as e:
        raise SecurityError(f"{path} is not a PEM certificate: {e}") from None


def load_private_key(path: str | Path, password: bytes | None = None) -> PrivateKey:
    data = _read(Path(path), "private key")
    try:
        key = serialization.load_pem_private_key(data, password)
    except TypeError as e:  # encrypted without a password, or a password for a clear key
        raise SecurityError(f"private key {path}: {e}") from None
    except ValueError as e:
        raise SecurityError(f"{path} is not a PEM private key (or the password is wrong): {e}") from None
    if not isinstance(key, (ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey)):
        raise SecurityError(f"private key {path} is a {type(key).__name__}; use an EC or RSA key")
    return key


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise SecurityError(f"cannot read {what} {path}: {e.strerror or e}") from None


# ------------------------------------------------------------------------------- files


def write_file_atomic(path: Path, data: bytes, *, mode: int, overwrite: bool = True) -> None:
    """Write ``data`` to ``path`` with exactly ``mode``, through a temporary file renamed into
    place (readers see the old file or the new one, never a part)."""
    if not overwrite and path.exists():
        raise SecurityError(f"{path} exists; refusing to overwrite it (use --force to replace it)")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), mode)
    try:
        os.fchmod(fd, mode)  # the umask may have narrowed or the file may have existed
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _make_dir(directory: Path) -> Path:
    directory = Path(directory)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    return directory


def file_stem(name: str) -> str:
    """A file name for principal ``name`` (characters outside ``[A-Za-z0-9._-]`` become ``_``)."""
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", name).strip(".")
    return stem or "cert"


def write_ca(ca: CertificateAuthority, directory: str | Path, *, password: bytes | None = None,
             overwrite: bool = False) -> CaFiles:
    """``ca.cert.pem`` (0644) and ``ca.key.pem`` (0600) in ``directory`` (created 0700)."""
    d = _make_dir(Path(directory))
    files = CaFiles(d / CA_CERT_FILE, d / CA_KEY_FILE)
    if not overwrite:
        for p in (files.cert, files.key):
            if p.exists():
                raise SecurityError(f"{p} exists: {d} already holds a CA (use --force to replace it, "
                                    "which orphans every certificate it issued)")
    write_file_atomic(files.key, private_key_pem(ca.key, password), mode=0o600)
    write_file_atomic(files.cert, ca.cert_pem, mode=0o644)
    return files


def load_ca(directory: str | Path, *, password: bytes | None = None) -> CertificateAuthority:
    """The CA ``write_ca`` wrote in ``directory``."""
    d = Path(directory)
    cert = load_certificate(d / CA_CERT_FILE)
    key = load_private_key(d / CA_KEY_FILE, password)
    if cert.public_key() != key.public_key():
        raise SecurityError(f"{d / CA_KEY_FILE} is not the key of {d / CA_CERT_FILE}")
    return CertificateAuthority(key, cert)


def write_certificate(issued: IssuedCertificate, directory: str | Path, *, key_password: bytes | None = None,
                      overwrite: bool = False, stem: str | None = None) -> CertificateFiles:
    """``<stem>.cert.pem`` (0644), ``<stem>.key.pem`` (0600) and ``ca.cert.pem`` (0644) in
    ``directory`` (created 0700); ``stem`` defaults to the principal name made file-safe."""
    d = _make_dir(Path(directory))
    base = stem or file_stem(issued.name)
    files = CertificateFiles(d / f"{base}.cert.pem", d / f"{base}.key.pem", d / CA_CERT_FILE)
    if not overwrite:
        for p in (files.cert, files.key):
            if p.exists():
                raise SecurityError(f"{p} exists; refusing to overwrite it (use --force to replace it)")
    # Key first: a reloader that sees the new certificate must find its key already there.
    write_file_atomic(files.key, issued.key_pem(key_password), mode=0o600)
    write_file_atomic(files.cert, issued.cert_pem, mode=0o644)
    ca_pem = issued.ca_cert.public_bytes(serialization.Encoding.PEM)
    if not files.ca.exists() or files.ca.read_bytes() != ca_pem:
        write_file_atomic(files.ca, ca_pem, mode=0o644)
    return files
