"""``vellum security``: make what TLS and tokens need, and say which keys to set next.

Commands (each prints the files it wrote and the configuration that uses them):

* ``create-ca --dir D``: a cluster CA (``D/ca.cert.pem``, ``D/ca.key.pem`` mode 0600);
* ``issue-cert --ca-dir D --role bookie|client|admin --name N [--dns ...] [--ip ...] [--days N]
  --out DIR``: a certificate for principal ``N`` (CN) with the role in its OU
  (BookKeeper's ``0:<role>`` convention), its key (0600) and a copy of the CA certificate;
* ``create-secret --out F``: a random HS256 secret for tokens (0600);
* ``issue-token (--secret-file F | --key-file K) --subject S --role R [--ttl 1h]
  [--for bookie|admin]``: a signed token for one door: the bookie port (audience ``vellum``,
  ``tokenAudience``) or the admin HTTP API (``vellum-admin``, ``httpServerTokenAudience``);
  without ``--for``, a token with the ``admin`` role is for admin HTTP, any other for the bookie
  port. ``--ttl`` may not exceed ``--max-lifetime`` (default: the bookies' default
  ``tokenMaxLifetimeSeconds``, 30 days). Only the token goes to stdout (so
  ``TOKEN=$(vellum security issue-token ...)`` works), everything else to stderr.

Certificates and tokens are made by ``vellum.security`` (``pki``, ``tokens``); this module
only parses options and prints.
"""

from __future__ import annotations

import re
from pathlib import Path

import click

from vellum.config import TLS_CONTEXT_FACTORY
from vellum.errors import IncorrectParameterError
from vellum.security import pki, tokens


def register(cli: click.Group) -> None:
    cli.add_command(security)


@click.group()
def security() -> None:
    """Certificates (TLS, mutual TLS) and signed tokens for a cluster."""


@security.command("create-ca")
@click.option("--dir", "directory", required=True, type=click.Path(file_okay=False),
              help="where to write ca.cert.pem and ca.key.pem (created 0700)")
@click.option("--name", default="Vellum CA", show_default=True, help="the CA's common name")
@click.option("--days", default=3650, show_default=True, type=click.IntRange(min=1), help="validity")
@click.option("--key-type", type=click.Choice(pki.KEY_TYPES), default=pki.DEFAULT_KEY_TYPE, show_default=True)
@click.option("--force", is_flag=True, help="replace an existing CA (orphans every certificate it issued)")
def create_ca(directory: str, name: str, days: int, key_type: str, force: bool) -> None:
    """Create the cluster's certificate authority."""
    files = pki.write_ca(pki.create_ca(name, days=days, key_type=key_type), directory, overwrite=force)
    click.echo(f"wrote {files.cert} (CA certificate: every bookie's and client's tlsTrustStore)")
    click.echo(f"wrote {files.key} (CA private key, mode 0600: keep it off the bookies)")
    click.echo("next: a certificate per bookie and per client, e.g.\n"
               f"  vellum security issue-cert --ca-dir {directory} --role bookie --name bookie-1 --out certs/bookie-1\n"
               f"  vellum security issue-cert --ca-dir {directory} --role client --name my-app --out certs/my-app")


@security.command("issue-cert")
@click.option("--ca-dir", required=True, type=click.Path(file_okay=False, exists=True), help="from create-ca")
@click.option("--role", required=True, type=click.Choice(pki.ROLES), help="recorded in the certificate's OU")
@click.option("--name", required=True, help="the principal: the certificate's CN")
@click.option("--dns", "dns_names", multiple=True, help="DNS name SAN (repeat; default: localhost)")
@click.option("--ip", "ip_addresses", multiple=True, help="IP address SAN (repeat; default: 127.0.0.1)")
@click.option("--days", default=365, show_default=True, type=click.IntRange(min=1), help="validity")
@click.option("--key-type", type=click.Choice(pki.KEY_TYPES), default=pki.DEFAULT_KEY_TYPE, show_default=True)
@click.option("--key-password-file", type=click.Path(dir_okay=False, exists=True),
              help="encrypt the key with the password in this file (then set tlsKeyStorePasswordPath)")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="output directory")
@click.option("--force", is_flag=True, help="replace existing files (certificate rotation)")
def issue_cert(ca_dir: str, role: str, name: str, dns_names: tuple[str, ...], ip_addresses: tuple[str, ...],
               days: int, key_type: str, key_password_file: str | None, out_dir: str, force: bool) -> None:
    """Issue a certificate signed by the CA for a bookie, a client or an admin."""
    ca = pki.load_ca(ca_dir)
    issued = pki.issue_certificate(
        ca, name=name, role=role, dns_names=dns_names or pki.DEFAULT_DNS_NAMES,
        ip_addresses=ip_addresses or pki.DEFAULT_IP_ADDRESSES, days=days, key_type=key_type,
    )
    password = Path(key_password_file).read_bytes().rstrip(b"\r\n") if key_password_file else None
    files = pki.write_certificate(issued, out_dir, key_password=password, overwrite=force)
    cert = issued.cert
    sans = ", ".join([*(dns_names or pki.DEFAULT_DNS_NAMES), *(ip_addresses or pki.DEFAULT_IP_ADDRESSES)])
    click.echo(f"wrote {files.cert} (CN={name}, role {role}, SAN {sans}, valid until "
               f"{cert.not_valid_after_utc:%Y-%m-%d})")
    click.echo(f"wrote {files.key} (private key, mode 0600{', encrypted' if password else ''})")
    click.echo(f"wrote {files.ca} (the CA certificate)")
    where = "bk_server.conf" if role == "bookie" else "the client's configuration (ClientConfig)"
    lines = [
        f"tlsProviderFactoryClass={TLS_CONTEXT_FACTORY}",
        "tlsKeyStoreType=PEM",
        f"tlsKeyStore={files.key.resolve()}",
        f"tlsCertificatePath={files.cert.resolve()}",
        "tlsTrustStoreType=PEM",
        f"tlsTrustStore={files.ca.resolve()}",
    ]
    if password:
        lines.append(f"tlsKeyStorePasswordPath={Path(key_password_file or '').resolve()}")
    if role == "bookie":
        lines += ["tlsClientAuthentication=true   # mutual TLS: clients must present a certificate of this CA",
                  "tlsCertFilesRefreshDurationSeconds=60   # pick up replaced certificate files without a restart"]
    click.echo(f"next: set in {where}:\n" + "".join(f"  {line}\n" for line in lines).rstrip())
    if role == "bookie":
        click.echo("then restart the bookie: it accepts TLS connections only (clients need tlsProviderFactoryClass "
                   "and tlsTrustStore, plus a client certificate with tlsClientAuthentication=true)")


@security.command("create-secret")
@click.option("--out", "out_file", required=True, type=click.Path(dir_okay=False), help="the secret file")
@click.option("--force", is_flag=True, help="replace an existing secret (every token signed with it stops working)")
def create_secret(out_file: str, force: bool) -> None:
    """Create a random secret for HS256 tokens (mode 0600)."""
    path = tokens.write_secret_file(out_file, overwrite=force)
    click.echo(f"wrote {path} (token secret, mode 0600)")
    click.echo(f"next: vellum security issue-token --secret-file {path} --subject my-app --role client")


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration_s(text: str, option: str = "--ttl") -> float:
    """``"90"`` / ``"90s"`` / ``"30m"`` / ``"12h"`` / ``"7d"`` in seconds."""
    match = _DURATION.match(text.lower())
    if not match or float(match.group(1)) <= 0:
        raise IncorrectParameterError(f"{option} {text!r}: a positive duration such as 3600, 30m, 12h or 7d")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


_FOR = {"bookie": tokens.BOOKIE_AUDIENCE, "admin": tokens.ADMIN_AUDIENCE}


@security.command("issue-token")
@click.option("--secret-file", type=click.Path(dir_okay=False, exists=True), help="HS256 secret (create-secret)")
@click.option("--key-file", type=click.Path(dir_okay=False, exists=True),
              help="RS256/ES256 private key PEM (instead of --secret-file)")
@click.option("--subject", required=True, help="the principal the token names (sub)")
@click.option("--role", "roles", multiple=True, help="a role the token carries (repeat)")
@click.option("--ttl", default="1h", show_default=True, help="lifetime: seconds, or with s/m/h/d")
@click.option("--for", "door", type=click.Choice(sorted(_FOR)), default=None,
              help="the port it opens: bookie (tokenAudience) or admin HTTP (httpServerTokenAudience); "
                   "default: admin if --role admin is given, else bookie")
@click.option("--audience", default=None, help="an explicit aud claim (instead of --for), for a cluster that set "
                                               "tokenAudience / httpServerTokenAudience")
@click.option("--max-lifetime", default=None,
              help="the bookies' tokenMaxLifetimeSeconds if raised (seconds, or with s/m/h/d); default 30d")
def issue_token(secret_file: str | None, key_file: str | None, subject: str, roles: tuple[str, ...], ttl: str,
                door: str | None, audience: str | None, max_lifetime: str | None) -> None:
    """Issue a signed token; the token alone goes to stdout."""
    if (secret_file is None) == (key_file is None):
        raise click.UsageError("give exactly one of --secret-file (HS256) and --key-file (RS256/ES256)")
    if door is not None and audience is not None:
        raise click.UsageError("give --for or --audience, not both")
    max_s = parse_duration_s(max_lifetime, "--max-lifetime") if max_lifetime else tokens.DEFAULT_MAX_LIFETIME_S
    signer = (tokens.TokenSigner.from_secret_file(secret_file, max_lifetime_s=max_s) if secret_file
              else tokens.TokenSigner.from_private_key_file(key_file or "", max_lifetime_s=max_s))
    ttl_s = parse_duration_s(ttl)
    if audience is None:
        door = door or ("admin" if "admin" in roles else "bookie")
        audience = _FOR[door]
    token = signer.issue(subject, roles, ttl_s=ttl_s, audience=audience)
    click.echo(token)
    port = {tokens.BOOKIE_AUDIENCE: " (the bookie port)", tokens.ADMIN_AUDIENCE: " (the admin HTTP API)"}
    click.echo(f"token for {subject!r} (roles {', '.join(roles) or 'none'}, {signer.algorithm}, audience "
               f"{audience!r}{port.get(audience, '')}) valid for {ttl_s:g}s", err=True)
