"""TLS on the ZooKeeper connection (ZooKeeper's ``secureClientPort``), and what to say when the
two sides disagree.

Responsibility: give kazoo connections wrapped in the caller's ``ssl.SSLContext``
(``TlsHandler``), and find out, when a session cannot be established, whether TLS is the reason
(``diagnose``): a plaintext client on a TLS port, a TLS client on a plaintext port, a server
certificate this client does not trust, a client certificate the server refuses. The TLS
context itself is built by the caller (``vellum.security.tls`` from the ``zkTls*`` keys, see
``vellum.client.metadata_security``); this module only uses it.

Invariants:

* kazoo's own TLS options are not used: its context also trusts the system's CA store, which a
  cluster CA does not need; with ``TlsHandler`` only the configured trust store counts, TLS 1.2
  is the minimum (the caller's context) and a context that follows its files (rotation) is
  asked again for each new connection;
* ``diagnose`` opens its own short connections, each bounded by ``timeout_s`` (at most three
  hosts of the connect string are probed), and returns ``None`` when TLS is not the problem
  (nothing listening, a server that answers): the caller then keeps waiting as usual;
* every message names the ZooKeeper address and the setting (or server property) to check.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kazoo.handlers.threading import SequentialThreadingHandler

#: hosts of the connect string ``diagnose`` probes at most
_MAX_PROBED_HOSTS = 3


@dataclass(frozen=True)
class ZkTls:
    """TLS for a ZooKeeper session: ``context()`` returns the context for a new connection
    (verifies ZooKeeper's certificate; presents the client's, if any). ``certificate_path`` and
    ``trust_store`` are only named in messages (empty certificate = none presented)."""

    context: Callable[[], ssl.SSLContext]
    certificate_path: str = ""
    trust_store: str = ""


class TlsHandler(SequentialThreadingHandler):  # type: ignore[misc]
    """kazoo's threading handler, with every connection wrapped in ``tls.context()``."""

    def __init__(self, tls: ZkTls) -> None:
        super().__init__()
        self._tls = tls

    def create_connection(self, address: tuple[str, int], hostname: str | None = None,
                          timeout: float | None = None, **_kazoo_tls_options: Any) -> ssl.SSLSocket:
        sock = socket.create_connection(address, timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = self._tls.context().wrap_socket(sock, server_hostname=hostname or address[0])
        except BaseException:
            sock.close()
            raise
        return conn


# ------------------------------------------------------------------------------ diagnosis


def _connect_request() -> bytes:
    """A ZooKeeper ConnectRequest (protocol 0, no session, 4 s timeout), length-framed."""
    body = (
        (0).to_bytes(4, "big") + (0).to_bytes(8, "big") + (4000).to_bytes(4, "big") + (0).to_bytes(8, "big")
        + (16).to_bytes(4, "big") + bytes(16) + b"\x00"
    )
    return len(body).to_bytes(4, "big") + body


def _answers(sock: socket.socket | ssl.SSLSocket) -> bool:
    """Send a ConnectRequest; does a ConnectResponse header come back? (OSError if the peer
    resets, SSLError if it sends a TLS alert.)"""
    sock.sendall(_connect_request())
    head = sock.recv(4)
    return len(head) == 4 and int.from_bytes(head, "big") > 0


def _plaintext_answers(host: str, port: int, timeout_s: float) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as s:
            return _answers(s)
    except OSError:
        return False


def _speaks_tls(host: str, port: int, timeout_s: float) -> bool:
    """Does the port complete (or refuse with a TLS alert) a TLS handshake? Nothing verified."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as raw, \
                ctx.wrap_socket(raw, server_hostname=host):
            return True
    except ssl.SSLError as e:
        return "ALERT" in str(e.reason or "")  # the server speaks TLS and refused something
    except OSError:
        return False


def _alert(e: ssl.SSLError) -> str:
    """``SSLV3_ALERT_CERTIFICATE_UNKNOWN`` -> ``certificate unknown``."""
    reason = str(e.reason or e)
    return reason.split("ALERT_", 1)[-1].replace("_", " ").lower()


def _refused_certificate(where: str, tls: ZkTls, e: ssl.SSLError | None) -> str:
    alert = f" (TLS alert: {_alert(e)})" if e is not None else ""
    if not tls.certificate_path:
        return (f"ZooKeeper at {where} refused the TLS connection{alert}: it requires a client certificate "
                "(its ssl.clientAuth=need, the default): set zkTlsCertificatePath and zkTlsKeyStore, or set "
                "ssl.clientAuth=none on ZooKeeper")
    return (f"ZooKeeper at {where} refused this client's certificate {tls.certificate_path}{alert}: it must be "
            "issued by a CA in ZooKeeper's ssl.trustStore.location (and be valid now); check "
            "zkTlsCertificatePath and zkTlsKeyStore")


def _diagnose_tls(host: str, port: int, tls: ZkTls, timeout_s: float) -> str | None:
    where = f"{host}:{port}"
    try:
        ctx = tls.context()
    except Exception as e:  # a context that cannot be built is the answer
        return f"the TLS settings for ZooKeeper at {where} cannot be loaded: {e}"
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as raw, \
                ctx.wrap_socket(raw, server_hostname=host) as conn:
            try:
                if _answers(conn):
                    return None
            except ssl.SSLError as e:  # TLS 1.3: the server checks the client certificate after the handshake
                if "ALERT" in str(e.reason or ""):
                    return _refused_certificate(where, tls, e)
                return None
            except OSError:
                pass
            return (f"ZooKeeper at {where} closed the connection after the TLS handshake: it may refuse this "
                    f"client's certificate; check that zkTlsCertificatePath ({tls.certificate_path or 'none'}) is "
                    "issued by a CA in ZooKeeper's ssl.trustStore.location")
    except ssl.SSLCertVerificationError as e:
        detail = e.verify_message or str(e.reason)
        if "hostname" in detail.lower() or "ip address mismatch" in detail.lower():
            return (f"the TLS certificate of ZooKeeper at {where} does not name {host} ({detail}): issue it for "
                    f"that name (`vellum security issue-cert --dns/--ip`) or set "
                    "zkTlsHostnameVerificationEnabled=false")
        return (f"the TLS certificate of ZooKeeper at {where} is not trusted ({detail}): zkTlsTrustStore "
                f"({tls.trust_store or '?'}) must hold the CA that issued ZooKeeper's certificate (its "
                "ssl.keyStore.location)")
    except ssl.SSLError as e:
        if "ALERT" in str(e.reason or ""):
            return _refused_certificate(where, tls, e)
        if _plaintext_answers(host, port, timeout_s):
            return (f"ZooKeeper at {where} answers in plaintext on this port, but zkTlsEnabled=true: point "
                    "metadataServiceUri at ZooKeeper's secureClientPort (or set zkTlsEnabled=false)")
        return f"the TLS handshake with ZooKeeper at {where} failed: {e.reason or e}"
    except OSError:
        if _plaintext_answers(host, port, timeout_s):
            return (f"ZooKeeper at {where} answers in plaintext on this port, but zkTlsEnabled=true: point "
                    "metadataServiceUri at ZooKeeper's secureClientPort (or set zkTlsEnabled=false)")
        return None


def _diagnose_plaintext(host: str, port: int, timeout_s: float) -> str | None:
    where = f"{host}:{port}"
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as s:
            if _answers(s):
                return None
    except (TimeoutError, ConnectionRefusedError, socket.gaierror):
        return None  # nothing there, or a silent server: not a TLS question
    except OSError:
        pass  # reset while talking: fall through
    if _speaks_tls(host, port, timeout_s):
        return (f"ZooKeeper at {where} speaks TLS on this port (a secureClientPort) and closed this plaintext "
                "connection: set zkTlsEnabled=true with zkTlsTrustStore (and zkTlsCertificatePath + zkTlsKeyStore "
                "if it requires client certificates), or use its plaintext clientPort")
    return None


def diagnose(hosts: str, tls: ZkTls | None, *, timeout_s: float = 2.0) -> str | None:
    """Why a session with ``hosts`` (kazoo's ``host:port,...``) cannot be established, if the
    reason is TLS (see the module docstring); ``None`` otherwise."""
    for hp in hosts.split(",")[:_MAX_PROBED_HOSTS]:
        host, _, port = hp.strip().rpartition(":")
        host = host.strip("[]")
        if not host or not port.isdigit():
            continue
        problem = (_diagnose_tls(host, int(port), tls, timeout_s) if tls is not None
                   else _diagnose_plaintext(host, int(port), timeout_s))
        if problem is not None:
            return problem
    return None
