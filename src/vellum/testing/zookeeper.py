"""A real ZooKeeper server for tests, benchmarks and local experiments.

Responsibility: start Debian's ``zookeeper`` package (3.8) as a standalone server on
127.0.0.1 with a private temporary data directory and a free port, wait until it answers, and
stop it by the PID we started (the whole process group), never by name.

Invariants:
- the server is a direct child (``java ... ZooKeeperServerMain <cfg>``) so that we own its PID;
  ``stop()`` kills exactly that process group and waits for it, so no server is left running;
- the admin HTTP server is off (``admin.enableServer=false``) and every log line goes to
  ``<tmpdir>/zookeeper.log`` (plus ``server.out`` for the JVM's own output);
- every wait is bounded by a deadline.

``pause()``/``resume()`` send SIGSTOP/SIGCONT to the server, for tests that need ZooKeeper to
stop answering without closing any socket.

TLS (``tls=ZooKeeperTls(...)``): the server also serves a ``secureClientPort`` on 127.0.0.1 with
Netty (``serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory``) and PEM stores
(``ssl.keyStore.type=PEM``: one file with the private key and the certificate chain;
``ssl.trustStore.type=PEM``: the CA certificate(s) client certificates must chain to), and
``ssl.clientAuth`` (``need`` by default, ZooKeeper's default: mutual TLS). The plaintext
``clientPort`` stays on as well (the start check uses it, and tests aim clients at the wrong
port on purpose); ``secure_hosts`` / ``secure_uri()`` name the TLS one. ``TlsTestPki.create(dir)``
makes the PEM files for it with ``vellum.security.pki`` (a CA, ZooKeeper's key store, client
and bookie certificates, and a stranger's from another CA).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from vellum.security import pki

ZK_SHARE = Path("/usr/share/zookeeper")
JAVA_SHARE = Path("/usr/share/java")
ZK_JAR = JAVA_SHARE / "zookeeper.jar"
SERVER_MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"

# zookeeper.jar's manifest names its runtime dependencies (netty, jute, slf4j-api...). slf4j has
# no binding there, so the server would log nothing; these two route slf4j into log4j 1.2,
# which writes to the file our log4j.properties names.
_LOGGING_JARS = ("slf4j-log4j12.jar", "log4j-1.2.jar")
# The manifest also lacks three jars Netty's server (serverCnxnFactory=NettyServerCnxnFactory, which
# the TLS port needs) loads: without netty-codec it fails with ClassNotFoundException on the first
# connection. Debian ships them (libnetty-java).
_NETTY_JARS = ("netty-codec.jar", "netty-resolver.jar", "netty-transport-native-unix-common.jar")


@dataclass(frozen=True)
class ZooKeeperTls:
    """The server side of ZooKeeper's client TLS: ``key_store`` is a PEM file holding the
    server's private key and certificate (chain), ``trust_store`` the CA certificate(s) of the
    clients, ``client_auth`` ZooKeeper's ``ssl.clientAuth`` (need, want or none)."""

    key_store: Path
    trust_store: Path
    client_auth: str = "need"


@dataclass(frozen=True)
class TlsTestPki:
    """PEM files for a TLS ZooKeeper and its clients, all made with ``vellum.security.pki``:
    ``ca`` issued ZooKeeper's certificate (for 127.0.0.1 and localhost; key and certificate in
    one file, ``key_store``, ZooKeeper's PEM key store layout) and ``client`` / ``bookie``;
    ``stranger`` is a client certificate from another CA (whose certificate is ``stranger.ca``)."""

    ca: Path
    key_store: Path
    client: pki.CertificateFiles
    bookie: pki.CertificateFiles
    stranger: pki.CertificateFiles

    @classmethod
    def create(cls, base: Path) -> TlsTestPki:
        ca = pki.create_ca("ZooKeeper test CA")
        ca_files = pki.write_ca(ca, base / "ca")
        server = pki.write_certificate(pki.issue_certificate(ca, name="zookeeper", role="bookie"), base / "zk")
        key_store = base / "zk" / "zookeeper.keystore.pem"
        pki.write_file_atomic(key_store, server.key.read_bytes() + server.cert.read_bytes(), mode=0o600)
        other = pki.create_ca("Some other CA")
        return cls(
            ca=ca_files.cert,
            key_store=key_store,
            client=pki.write_certificate(pki.issue_certificate(ca, name="alice", role="client"), base / "client"),
            bookie=pki.write_certificate(pki.issue_certificate(ca, name="bookie-1", role="bookie"), base / "bookie"),
            stranger=pki.write_certificate(pki.issue_certificate(other, name="mallory", role="client"),
                                           base / "stranger"),
        )

    def server_tls(self, client_auth: str = "need") -> ZooKeeperTls:
        return ZooKeeperTls(key_store=self.key_store, trust_store=self.ca, client_auth=client_auth)

    def client_keys(self, cert: pki.CertificateFiles | None = None, *, trust: Path | None = None) -> dict[str, str]:
        """The ``zkTls*`` configuration keys of a client presenting ``cert`` (default: ``client``)."""
        cert = cert or self.client
        return {"zkTlsEnabled": "true", "zkTlsTrustStore": str(trust or self.ca),
                "zkTlsCertificatePath": str(cert.cert), "zkTlsKeyStore": str(cert.key)}


class ZooKeeperUnavailable(RuntimeError):
    """Java or Debian's zookeeper package is missing (the message says which)."""


def find_java() -> str | None:
    """The java binary: $JAVA_HOME/bin/java, then PATH, then /usr/bin/java (zkEnv.sh's choice)."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return os.path.join(home, "bin", "java")
    found = shutil.which("java")
    if found:
        return found
    return "/usr/bin/java" if os.access("/usr/bin/java", os.X_OK) else None


def zookeeper_classpath(*, netty: bool = False) -> str:
    """Classpath of Debian's server (zkEnv.sh: ``/usr/share/java/zookeeper.jar``, deps via its
    manifest); ``netty``: with the jars Netty's server needs beyond the manifest."""
    if not ZK_JAR.exists():
        raise ZooKeeperUnavailable(
            f"{ZK_JAR} not found: install Debian's 'zookeeper' package (./run installs it)"
        )
    parts = [str(ZK_JAR)]
    parts += [str(JAVA_SHARE / j) for j in _LOGGING_JARS if (JAVA_SHARE / j).exists()]
    if netty:
        parts += [str(JAVA_SHARE / j) for j in _NETTY_JARS if (JAVA_SHARE / j).exists()]
    return ":".join(parts)


def missing_reason() -> str | None:
    """Why a real ZooKeeper cannot start here, or None if it can."""
    if find_java() is None:
        return "java not found (install default-jre-headless)"
    if not ZK_JAR.exists():
        return f"Debian's zookeeper package is not installed ({ZK_JAR} missing)"
    return None


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ZooKeeperServer:
    """One standalone ZooKeeper server process; use as a context manager or start()/stop()."""

    def __init__(
        self,
        *,
        data_dir: str | Path | None = None,
        port: int | None = None,
        tick_time_ms: int = 500,
        min_session_timeout_ms: int = 1000,
        max_session_timeout_ms: int = 60000,
        start_timeout_s: float = 30.0,
        tls: ZooKeeperTls | None = None,
        four_letter_words: tuple[str, ...] = (),
    ) -> None:
        """``four_letter_words``: the commands the server answers on its client port (e.g.
        ``("cons",)`` for ``four_letter_word``); none by default."""
        self._own_dir = data_dir is None
        self.base_dir = Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix="vellum-zk-"))
        self.port = port if port is not None else free_port()
        self.tick_time_ms = tick_time_ms
        self.min_session_timeout_ms = min_session_timeout_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        self.start_timeout_s = start_timeout_s
        self.tls = tls
        self.four_letter_words = four_letter_words
        self.secure_port = 0
        while tls is not None and self.secure_port in (0, self.port):
            self.secure_port = free_port()
        self._proc: subprocess.Popen[bytes] | None = None
        self._paused = False

    # -- properties -------------------------------------------------------------------------

    @property
    def hosts(self) -> str:
        """``host:port`` for kazoo."""
        return f"127.0.0.1:{self.port}"

    def uri(self, scheme: str = "zk+hierarchical", root: str = "/ledgers") -> str:
        """A metadataServiceUri pointing at this server."""
        return f"{scheme}://{self.hosts}{root}"

    @property
    def secure_hosts(self) -> str:
        """``host:port`` of the ``secureClientPort`` (TLS servers only)."""
        if self.tls is None:
            raise RuntimeError("this ZooKeeper serves no TLS port (start it with tls=ZooKeeperTls(...))")
        return f"127.0.0.1:{self.secure_port}"

    def secure_uri(self, scheme: str = "zk+hierarchical", root: str = "/ledgers") -> str:
        """A metadataServiceUri pointing at this server's TLS port."""
        return f"{scheme}://{self.secure_hosts}{root}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def log_file(self) -> Path:
        return self.base_dir / "zookeeper.log"

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> ZooKeeperServer:
        java = find_java()
        if java is None:
            raise ZooKeeperUnavailable("java not found (install default-jre-headless)")
        classpath = zookeeper_classpath(netty=self.tls is not None)
        data = self.base_dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        cfg = self.base_dir / "zoo.cfg"
        cfg.write_text(
            "\n".join(
                [
                    f"tickTime={self.tick_time_ms}",
                    f"dataDir={data}",
                    f"clientPort={self.port}",
                    "clientPortAddress=127.0.0.1",
                    f"minSessionTimeout={self.min_session_timeout_ms}",
                    f"maxSessionTimeout={self.max_session_timeout_ms}",
                    "admin.enableServer=false",
                    f"4lw.commands.whitelist={','.join(self.four_letter_words)}",
                    "maxClientCnxns=0",
                    # Tests create many znodes quickly; skip fsync-per-txn latency only where
                    # durability of the test server itself does not matter.
                    "forceSync=no",
                    *self._tls_lines(),
                    "",
                ]
            )
        )
        log4j = self.base_dir / "log4j.properties"
        log4j.write_text(
            "\n".join(
                [
                    "log4j.rootLogger=INFO, FILE",
                    "log4j.appender.FILE=org.apache.log4j.FileAppender",
                    f"log4j.appender.FILE.File={self.log_file}",
                    "log4j.appender.FILE.layout=org.apache.log4j.PatternLayout",
                    "log4j.appender.FILE.layout.ConversionPattern=%d{ISO8601} %-5p [%t] %c{1} - %m%n",
                    "",
                ]
            )
        )
        cmd = [
            java,
            "-Xmx256m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",  # faster JVM start; the server is not CPU-bound in tests
            f"-Dlog4j.configuration=file:{log4j}",
            f"-Dzookeeper.log.dir={self.base_dir}",
            "-Dzookeeper.admin.enableServer=false",
            "-Dzookeeper.jmx.log4j.disable=true",
            "-cp",
            classpath,
            SERVER_MAIN,
            str(cfg),
        ]
        out = open(self.base_dir / "server.out", "ab")  # noqa: SIM115 - the child owns it
        try:
            # start_new_session: the server gets its own process group, which stop() kills whole.
            self._proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        finally:
            out.close()
        try:
            self._wait_serving()
        except BaseException:
            self.stop()
            raise
        return self

    def _tls_lines(self) -> list[str]:
        """zoo.cfg lines of the TLS port (ZooKeeper turns ``ssl.*`` keys into ``zookeeper.ssl.*``
        properties)."""
        if self.tls is None:
            return []
        return [
            "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
            f"secureClientPort={self.secure_port}",
            "secureClientPortAddress=127.0.0.1",
            f"ssl.keyStore.location={self.tls.key_store}",
            "ssl.keyStore.type=PEM",
            f"ssl.trustStore.location={self.tls.trust_store}",
            "ssl.trustStore.type=PEM",
            f"ssl.clientAuth={self.tls.client_auth}",
        ]

    def _wait_serving(self) -> None:
        """Wait until a ZooKeeper handshake succeeds (the port being open is not enough)."""
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"ZooKeeper exited with {self._proc.returncode} during start; "
                    f"see {self.base_dir / 'server.out'} and {self.log_file}:\n{self._tail()}"
                )
            if _handshake_ok("127.0.0.1", self.port) and (self.tls is None or _port_open("127.0.0.1",
                                                                                         self.secure_port)):
                return
            time.sleep(0.1)
        raise RuntimeError(
            f"ZooKeeper on 127.0.0.1:{self.port} did not serve within {self.start_timeout_s}s; "
            f"see {self.log_file}:\n{self._tail()}"
        )

    def _tail(self, n: int = 20) -> str:
        lines: list[str] = []
        for f in (self.base_dir / "server.out", self.log_file):
            if f.exists():
                lines += f.read_text(errors="replace").splitlines()[-n:]
        return "\n".join(lines)

    def four_letter_word(self, command: str, timeout_s: float = 10.0) -> str:
        """ZooKeeper's answer to a four-letter word (``cons``: every connection with its
        session id and negotiated timeout); the server must be started allowing it."""
        if command not in self.four_letter_words:
            raise RuntimeError(f"start the server with four_letter_words=({command!r},) to ask it {command}")
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout_s) as s:
            s.sendall(command.encode())
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")

    def pause(self) -> None:
        """SIGSTOP the server: sockets stay open but nothing is answered."""
        if self._proc is not None and self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGSTOP)
            self._paused = True

    def resume(self) -> None:
        if self._proc is not None and self._paused:
            os.killpg(self._proc.pid, signal.SIGCONT)
            self._paused = False

    def stop(self, *, remove_data: bool | None = None) -> None:
        """Kill the server's process group (by our PID) and wait for it; remove a temp dir we made."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                try:
                    if self._paused:
                        os.killpg(proc.pid, signal.SIGCONT)
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
        self._paused = False
        if remove_data if remove_data is not None else self._own_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> ZooKeeperServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def _handshake_ok(host: str, port: int) -> bool:
    """Send a ZooKeeper ConnectRequest and check that a ConnectResponse comes back."""
    # ConnectRequest: protocolVersion(int) lastZxidSeen(long) timeOut(int) sessionId(long)
    # passwd(buffer: int len + bytes) readOnly(bool); framed by a 4-byte length.
    body = (
        (0).to_bytes(4, "big")
        + (0).to_bytes(8, "big")
        + (4000).to_bytes(4, "big")
        + (0).to_bytes(8, "big")
        + (16).to_bytes(4, "big")
        + bytes(16)
        + b"\x00"
    )
    try:
        with socket.create_connection((host, port), timeout=1.0) as s:
            s.sendall(len(body).to_bytes(4, "big") + body)
            head = s.recv(4)
            # Dropping the socket leaves a throwaway session that the server expires in 4 s.
            return len(head) == 4 and int.from_bytes(head, "big") > 0
    except OSError:
        return False
