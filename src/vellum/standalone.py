"""Standalone: several bookie processes and their metadata store on one machine, supervised.

Responsibility: lay out each bookie's dirs and ``bk_server.conf`` under a data dir, format the
embedded metadata store if needed, start one ``vellum bookie`` process per bookie, wait until
they are registered, and stop them (SIGTERM, then SIGKILL after a grace period). Used by
``vellum standalone``; ``vellum.testing.local_cluster`` borrows the process spec, the conf
writing and the command line. Each bookie process is composed by ``service.py``; nothing here
runs in a bookie's process.

With ``tls`` (``vellum standalone --tls``) the cluster is secured (``StandaloneSecurity``): a
CA and certificates are made once under ``<data dir>/security`` (kept across restarts), the
bookies serve mutual TLS only, authenticate by certificate or token and authorize the roles
client, bookie and admin; their admin HTTP is https with mutating calls needing an admin token;
a client configuration file and an admin token (renewed at each start) are written there, and
the same token as a curl header file (``admin.header``, for ``curl -H @file``: a token on a
command line is visible to every local user in ``ps``).

Each bookie's metrics port (``prometheusStatsHttpPort``) listens on loopback at
``metrics_port_base + i`` (``vellum standalone``: 8000 + i), or on any free port when the base
is 0 (the default of this class: several clusters on one machine never collide).

Invariants: bookie ``i`` listens on ``port_base + i`` (its id is ``127.0.0.1:<port>``, tied to
its disks by the cookie), so a restart with the same data dir is the same bookie; a bookie
that exits during start fails ``start()`` with the tail of its log.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from vellum.client.metadata_security import open_configured_store
from vellum.config import TLS_CONTEXT_FACTORY, ClientConfig
from vellum.meta import open_metadata_store
from vellum.security import pki, tokens


@dataclass
class BookieProcessSpec:
    """Where bookie process ``index`` listens and keeps its data; ``extra`` are more
    ``bk_server.conf`` keys (over the ones derived from the spec). ``metrics_port`` is its
    ``prometheusStatsHttpPort`` on loopback; 0 (the default) = any free port, so that bookies on
    one machine never collide on BookKeeper's 8000."""

    index: int
    port: int
    http_port: int
    base: Path
    conf_file: Path
    extra: dict[str, str] = field(default_factory=dict)
    metrics_port: int = 0

    @property
    def bookie_id(self) -> str:
        return f"127.0.0.1:{self.port}"


def process_specs(data_dir: Path, *, bookies: int, port_base: int, http_port_base: int,
                  metrics_port_base: int = 0) -> list[BookieProcessSpec]:
    """Bookie ``i`` on ``port_base + i`` (admin HTTP on ``http_port_base + i``, metrics port on
    ``metrics_port_base + i``, or any free port when that base is 0), its data and
    ``bk_server.conf`` under ``data_dir/bookie-<i>``."""
    return [
        BookieProcessSpec(i, port_base + i, http_port_base + i, data_dir / f"bookie-{i}",
                          data_dir / f"bookie-{i}" / "bk_server.conf",
                          metrics_port=metrics_port_base + i if metrics_port_base else 0)
        for i in range(bookies)
    ]


def bookie_conf_text(spec: BookieProcessSpec, metadata_uri: str) -> str:
    """The ``bk_server.conf`` of a bookie process: ports, dirs and metadata store from the spec,
    then the spec's extra keys (which win)."""
    values = {
        "bookiePort": str(spec.port),
        "httpServerPort": str(spec.http_port),
        "prometheusStatsHttpAddress": "127.0.0.1",
        "prometheusStatsHttpPort": str(spec.metrics_port),
        "journalDirectories": str(spec.base / "journal"),
        "ledgerDirectories": str(spec.base / "ledgers"),
        "metadataServiceUri": metadata_uri,
        **spec.extra,
    }
    return "".join(f"{k}={v}\n" for k, v in values.items())


def write_bookie_conf(spec: BookieProcessSpec, metadata_uri: str) -> None:
    spec.base.mkdir(parents=True, exist_ok=True)
    spec.conf_file.write_text(bookie_conf_text(spec, metadata_uri))


def bookie_command(conf_file: Path) -> list[str]:
    """The command line of one bookie process (this interpreter, ``vellum bookie``)."""
    return [sys.executable, "-m", "vellum.cli.main", "bookie", "--conf", str(conf_file)]


def format_if_needed(metadata_uri: str, config: ClientConfig | None = None) -> str:
    """Format the metadata store unless it is; returns the cluster's instance id. ``config``:
    the ZooKeeper identity and TLS to open it with (``zkEnableSecurity``, ``zkTls*``)."""
    with open_configured_store(metadata_uri, config or ClientConfig()) as store:
        if not store.is_formatted():
            return store.format()
        return store.registration.get_instance_id() or ""


#: lifetime of the admin token ``vellum standalone --tls`` writes at each start
ADMIN_TOKEN_TTL_S = 7 * 24 * 3600.0


@dataclass(frozen=True)
class StandaloneSecurity:
    """The files of a secured standalone cluster, under ``<data dir>/security``."""

    directory: Path
    ca: Path
    bookie: pki.CertificateFiles
    client: pki.CertificateFiles
    token_secret: Path
    admin_token: Path
    client_conf: Path
    #: ``Authorization: Bearer <admin token>``, for ``curl -H @<file>`` (mode 0600)
    admin_header: Path

    @classmethod
    def prepare(cls, data_dir: Path, metadata_uri: str) -> StandaloneSecurity:
        """Make the CA, a bookie and a client certificate and the token secret if they are not
        there yet; (re)write the admin token and the client configuration."""
        d = data_dir / "security"
        ca_dir = d / "ca"
        if not (ca_dir / pki.CA_CERT_FILE).exists():
            authority = pki.create_ca("Vellum standalone CA")
            pki.write_ca(authority, ca_dir)
            pki.write_certificate(pki.issue_certificate(authority, name="standalone-bookie", role="bookie"),
                                  d / "bookie", stem="bookie")
            pki.write_certificate(pki.issue_certificate(authority, name="standalone-client", role="client"),
                                  d / "client", stem="client")
            tokens.write_secret_file(d / "token-secret", overwrite=True)
        bookie = pki.CertificateFiles(d / "bookie" / "bookie.cert.pem", d / "bookie" / "bookie.key.pem",
                                      d / "bookie" / pki.CA_CERT_FILE)
        client = pki.CertificateFiles(d / "client" / "client.cert.pem", d / "client" / "client.key.pem",
                                      d / "client" / pki.CA_CERT_FILE)
        admin_token = d / "admin.token"
        token = tokens.TokenSigner.from_secret_file(d / "token-secret").issue(
            "standalone-admin", ["admin"], ttl_s=ADMIN_TOKEN_TTL_S, audience=tokens.ADMIN_AUDIENCE)
        pki.write_file_atomic(admin_token, token.encode() + b"\n", mode=0o600)
        admin_header = d / "admin.header"
        pki.write_file_atomic(admin_header, f"Authorization: Bearer {token}\n".encode(), mode=0o600)
        sec = cls(d, ca_dir / pki.CA_CERT_FILE, bookie, client, d / "token-secret", admin_token, d / "client.conf",
                  admin_header)
        values = {"metadataServiceUri": metadata_uri, **sec.client_keys()}
        pki.write_file_atomic(sec.client_conf, "".join(f"{k}={v}\n" for k, v in values.items()).encode(), mode=0o600)
        return sec

    def bookie_keys(self) -> dict[str, str]:
        """The ``bk_server.conf`` keys of a secured bookie."""
        return {
            "tlsProviderFactoryClass": TLS_CONTEXT_FACTORY,
            "tlsKeyStoreType": "PEM", "tlsKeyStore": str(self.bookie.key),
            "tlsCertificatePath": str(self.bookie.cert),
            "tlsTrustStoreType": "PEM", "tlsTrustStore": str(self.ca),
            "tlsClientAuthentication": "true",
            "tlsCertFilesRefreshDurationSeconds": "60",
            "bookieAuthProviderFactoryClass": "tls,token",
            "authorizedRoles": "client,bookie,admin",
            "tokenSecretKeyFile": str(self.token_secret),
            "httpServerTlsEnable": "true",
            "httpServerKeyStorePath": str(self.bookie.key),
            "httpServerCertificatePath": str(self.bookie.cert),
        }

    def client_keys(self) -> dict[str, str]:
        """The client keys that connect to it (the ``client`` certificate)."""
        return {
            "tlsProviderFactoryClass": TLS_CONTEXT_FACTORY,
            "tlsTrustStore": str(self.ca),
            "tlsCertificatePath": str(self.client.cert),
            "tlsKeyStore": str(self.client.key),
            "clientAuthProviderFactoryClass": "tls",
        }


class Standalone:
    """Supervises N bookie processes sharing one embedded metadata store."""

    def __init__(self, data_dir: Path, *, bookies: int, port_base: int, http_port_base: int,
                 metrics_port_base: int = 0, metadata_uri: str | None = None, tls: bool = False) -> None:
        self.data_dir = data_dir.resolve()
        self.metadata_uri = metadata_uri or f"sqlite:///{self.data_dir / 'metadata.db'}"
        self.specs = process_specs(self.data_dir, bookies=bookies, port_base=port_base,
                                   http_port_base=http_port_base, metrics_port_base=metrics_port_base)
        self.tls = tls
        self.security: StandaloneSecurity | None = None
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def start(self, timeout_s: float = 60.0) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        format_if_needed(self.metadata_uri)
        if self.tls:
            self.security = StandaloneSecurity.prepare(self.data_dir, self.metadata_uri)
            for spec in self.specs:
                spec.extra = {**self.security.bookie_keys(), **spec.extra}
        for spec in self.specs:
            write_bookie_conf(spec, self.metadata_uri)
            with open(spec.base / "bookie.log", "ab") as log_file:  # the child keeps its own copy
                self.procs[spec.index] = subprocess.Popen(
                    bookie_command(spec.conf_file), stdout=log_file, stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        self.wait_registered(len(self.specs), timeout_s)

    def wait_registered(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with open_metadata_store(self.metadata_uri) as store:
            while True:
                up = store.registration.list_bookies() | store.registration.list_bookies(read_only=True)
                if len(up) >= count:
                    return
                for i, proc in self.procs.items():
                    if proc.poll() is not None:
                        log_path = self.specs[i].base / "bookie.log"
                        tail = log_path.read_text(errors="replace")[-2000:] if log_path.exists() else ""
                        raise RuntimeError(f"bookie {i} exited with {proc.returncode}:\n{tail}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"only {len(up)} of {count} bookies registered in {timeout_s}s")
                time.sleep(0.1)

    def stop(self, timeout_s: float = 30.0) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs.clear()
