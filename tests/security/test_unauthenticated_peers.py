"""What a peer with network access only can cost a bookie, on real bookie processes: frames
announced but never sent, connections that never authenticate, plaintext on a TLS-only port,
a flood of bad tokens. Each attack runs while a real client keeps writing and reading.

* 200 connections each announcing a 5 MiB frame leave the bookie's RSS within 50 MiB of where it
  started: on a token bookie, on a mutual-TLS bookie (frames announced before START_TLS), and
  on a bookie without security (where receive buffers grow with the bytes that arrive);
* 500 silent connections on a bookie whose descriptor limit leaves room for fewer: the
  unauthenticated budget keeps the bookie's descriptors (a valid client is served), and every
  silent connection is closed at the authentication deadline;
* an authenticated connection idle past ``connectionIdleTimeoutMs`` is closed and the client's
  next request reconnects transparently; a long-poll LAC read waiting longer is not cut;
* a plaintext request on a TLS-only bookie gets its answers and a closed connection;
* 60 refused AUTHs make a handful of log lines (with a count) and 60 in the REFUSED metric.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import resource
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from security_testkit import Pki, make_pki, run, server_settings

from vellum.aio import BookKeeper
from vellum.config import TLS_CONTEXT_FACTORY, ClientConfig
from vellum.errors import EUA
from vellum.proto import FrameDecoder, encode
from vellum.proto import messages as m
from vellum.security import tokens
from vellum.security.tokens import TokenSigner
from vellum.testing.local_cluster import LocalCluster

PASSWORD = b"ledger-password"
FIVE_MIB = 5 * 1024 * 1024
ADD_HEADER = (m.PROTOCOL_VERSION << 24) | (m.OP_ADD << 16)

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module", autouse=True)
def enough_descriptors() -> Iterator[None]:
    """This test process holds ~600 sockets at once."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, 4096) if hard != resource.RLIM_INFINITY else 4096
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# ------------------------------------------------------------------------------- helpers


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def port_of(cluster: LocalCluster) -> int:
    return int(cluster.bookie_ids[0].rsplit(":", 1)[1])


def connect_all(port: int, n: int, first_bytes: bytes = b"") -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        if first_bytes:
            with contextlib.suppress(OSError):
                s.sendall(first_bytes)
        socks.append(s)
    return socks


def is_closed_by_peer(s: socket.socket) -> bool:
    s.setblocking(False)
    try:
        while True:
            data = s.recv(65536)
            if not data:
                return True
    except BlockingIOError:
        return False
    except OSError:  # reset
        return True


def close_all(socks: list[socket.socket]) -> None:
    for s in socks:
        s.close()


def metric(cluster: LocalCluster, name: str, **labels: str) -> float:
    text = cluster.http_get(0, "/metrics")
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = re.escape(name) + (r"\{" + re.escape(want) + r"\}" if want else "") + r" ([0-9.e+]+)"
    found = re.search(pattern, text)
    return float(found.group(1)) if found else 0.0


async def write_and_read(bk: BookKeeper, n: int = 5) -> None:
    lh = await bk.create_ledger(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1, password=PASSWORD)
    assert await asyncio.gather(*(lh.append_async(b"entry %d" % i) for i in range(n))) == list(range(n))
    assert [e.payload for e in await lh.read(0, n - 1)] == [b"entry %d" % i for i in range(n)]
    await lh.close()


def base_client(**kw: Any) -> ClientConfig:
    return ClientConfig(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1,
                        add_entry_timeout_s=10.0, read_entry_timeout_s=10.0, **kw)


def valid_client_works(cluster: LocalCluster, config: ClientConfig) -> None:
    async def main() -> None:
        async with BookKeeper(cluster.metadata_uri, config=config) as bk:
            await write_and_read(bk)

    run(main())


def announce_big_frames_and_measure(cluster: LocalCluster, config: ClientConfig, n: int = 200) -> tuple[float, float]:
    """RSS before, and the most it reached while ``n`` connections announced a 5 MiB frame
    (with a few bytes of its body) and a valid client wrote and read."""
    pid = cluster.pid(0)
    valid_client_works(cluster, config)  # warm: the client path's own memory is not the attack's
    before = rss_mib(pid)
    frame_start = struct.pack(">iI", FIVE_MIB, ADD_HEADER) + bytes(64)
    peak = before
    socks: list[socket.socket] = []
    try:
        for _ in range(n // 50):
            socks += connect_all(port_of(cluster), 50, frame_start)
            peak = max(peak, rss_mib(pid))
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:  # let the bookie read them all
            peak = max(peak, rss_mib(pid))
            time.sleep(0.1)
        valid_client_works(cluster, config)
        peak = max(peak, rss_mib(pid))
    finally:
        close_all(socks)
    return before, peak


# ------------------------------------------------------------------------- token bookie

@pytest.fixture(scope="module")
def secret(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tokens.write_secret_file(tmp_path_factory.mktemp("tokens") / "secret")


@pytest.fixture(scope="module")
def token_cluster(tmp_path_factory: pytest.TempPathFactory, secret: Path) -> Iterator[LocalCluster]:
    conf = {
        "bookieAuthProviderFactoryClass": "token",
        "authorizedRoles": "client",
        "tokenSecretKeyFile": str(secret),
        "authenticationTimeoutMs": "6000",
        "unauthenticatedConnectionsLimit": "100",
        "connectionIdleTimeoutMs": "2000",
        "httpServerHeaderReadTimeoutMs": "1000",
    }
    with LocalCluster(tmp_path_factory.mktemp("token-cluster"), bookies=1, bookie_conf=conf) as cluster:
        yield cluster


def token_config(secret: Path) -> ClientConfig:
    token = TokenSigner.from_secret_file(secret).issue("app", ["client"])
    return base_client(client_auth_provider_factory_class="token", client_auth_token=token)


def test_announced_big_frames_before_auth_cost_no_memory(token_cluster: LocalCluster, secret: Path) -> None:
    before, peak = announce_big_frames_and_measure(token_cluster, token_config(secret))
    assert peak - before < 50, f"bookie RSS went from {before:.0f} to {peak:.0f} MiB"
    assert "before authenticating a peer may send frames of 16384 bytes at most" in token_cluster.log_text(0)


def test_silent_connections_cannot_exhaust_descriptors_and_are_closed_at_the_deadline(
    token_cluster: LocalCluster, secret: Path
) -> None:
    pid = token_cluster.pid(0)
    config = token_config(secret)
    valid_client_works(token_cluster, config)
    baseline = open_fds(pid)
    soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    # Room for the budget (100) and some, not for 500 silent connections.
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (baseline + 250, hard))
    socks: list[socket.socket] = []
    try:
        socks = connect_all(port_of(token_cluster), 450)
        time.sleep(0.5)
        socks += connect_all(port_of(token_cluster), 50)  # takes whatever descriptors were still free
        valid_client_works(token_cluster, config)  # not refused for lack of descriptors
        assert open_fds(pid) < baseline + 150  # the budget holds, whatever the attacker opened
        # All of them are closed at the deadline (6 s after their accept; the oldest went earlier
        # to make room for newer ones).
        deadline = time.monotonic() + 15.0
        open_socks = list(socks)
        while open_socks and time.monotonic() < deadline:
            open_socks = [s for s in open_socks if not is_closed_by_peer(s)]
            time.sleep(0.2)
        assert not open_socks, f"{len(open_socks)} of 500 silent connections still open"
        token_cluster.wait_until(lambda: open_fds(pid) <= baseline + 5, timeout_s=10, what="descriptors released")
        valid_client_works(token_cluster, config)
    finally:
        close_all(socks)
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
    log = token_cluster.log_text(0)
    assert "not authenticated within 6s (authenticationTimeoutMs)" in log
    assert "unauthenticatedConnectionsLimit" in log
    # rate-limited: one line per reason and peer per minute, with counts, not 500 lines
    assert log.count("not authenticated within 6s") < 10
    assert metric(token_cluster, "bookkeeper_server_REFUSED_total", reason="authentication_timeout") \
        + metric(token_cluster, "bookkeeper_server_REFUSED_total", reason="unauthenticated_budget") >= 500


def test_running_out_of_descriptors_is_logged(token_cluster: LocalCluster) -> None:
    """A descriptor limit below the unauthenticated budget (a misconfiguration): accepting
    fails, and the bookie says so instead of dropping connections silently."""
    pid = token_cluster.pid(0)
    baseline = open_fds(pid)
    soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (baseline + 30, hard))
    socks: list[socket.socket] = []
    try:
        socks = connect_all(port_of(token_cluster), 60)
        token_cluster.wait_until(lambda: "out of file descriptors" in token_cluster.log_text(0), timeout_s=10,
                                 what="the descriptor exhaustion logged")
    finally:
        close_all(socks)
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
    assert "raise the limit (ulimit -n) or lower unauthenticatedConnectionsLimit" in token_cluster.log_text(0)
    assert metric(token_cluster, "bookkeeper_server_REFUSED_total", reason="descriptors_exhausted") >= 1


def test_idle_connections_are_closed_and_the_client_reconnects_but_long_polls_are_not_cut(
    token_cluster: LocalCluster, secret: Path
) -> None:
    async def main() -> None:
        async with BookKeeper(token_cluster.metadata_uri, config=token_config(secret)) as bk:
            lh = await bk.create_ledger(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1, password=PASSWORD)
            await lh.append(b"first")
            closes = token_cluster.log_text(0).count("idle for 2s (connectionIdleTimeoutMs)")
            # A long poll that waits 4 s (past the 2 s idle timeout) is a request in progress.
            client = bk.bookie_client  # the pooled bookie client
            bookie_id = token_cluster.bookie_ids[0]
            started = time.monotonic()
            answer = await client.long_poll_lac(bookie_id, lh.ledger_id, 0, timeout_ms=4000)
            assert time.monotonic() - started >= 3.5 and answer is not None
            assert token_cluster.log_text(0).count("idle for 2s (connectionIdleTimeoutMs)") == closes
            # Now idle: closed by the bookie (the client's loop keeps running meanwhile, so it
            # sees the close); the next add and read reconnect on their own.
            deadline = time.monotonic() + 10.0
            while token_cluster.log_text(0).count("idle for 2s (connectionIdleTimeoutMs)") == closes:
                assert time.monotonic() < deadline, "the idle connection was not closed"
                await asyncio.sleep(0.1)
            await asyncio.sleep(0.2)
            assert not client.is_connected(bookie_id)
            await lh.append(b"second")
            assert [e.payload for e in await lh.read(0, 1)] == [b"first", b"second"]
            await lh.close()

    run(main())


def test_refused_auths_are_counted_and_logged_rate_limited(token_cluster: LocalCluster, tmp_path: Path) -> None:
    other = TokenSigner.from_secret_file(tokens.write_secret_file(tmp_path / "other")).issue("mallory", ["client"])
    before = metric(token_cluster, "bookkeeper_server_REFUSED_total", reason="auth_refused")
    lines_before = token_cluster.log_text(0).count("bad signature")
    auth = encode(m.AuthRequest(1, "token", other.encode()))
    for _ in range(60):
        with socket.create_connection(("127.0.0.1", port_of(token_cluster)), timeout=10) as s:
            s.sendall(auth)
            got = b""
            while chunk := s.recv(4096):  # answered EUA, then closed
                got += chunk
            (answer,) = FrameDecoder(m.DEFAULT_MAX_FRAME_SIZE, side="client").feed(got)
            assert isinstance(answer, m.AuthResponse) and answer.status == EUA
    token_cluster.wait_until(
        lambda: metric(token_cluster, "bookkeeper_server_REFUSED_total", reason="auth_refused") >= before + 60,
        timeout_s=10, what="60 refusals counted")
    assert token_cluster.log_text(0).count("bad signature") - lines_before <= 2


# ---------------------------------------------------------------------- mutual-TLS bookie

@pytest.fixture(scope="module")
def mtls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Pki]]:
    p = make_pki(tmp_path_factory.mktemp("pki"))
    conf = {
        "tlsProviderFactoryClass": TLS_CONTEXT_FACTORY,
        "tlsKeyStore": str(p.bookie.key),
        "tlsCertificatePath": str(p.bookie.cert),
        "tlsTrustStore": str(p.ca.cert),
        "tlsClientAuthentication": "true",
        "bookieAuthProviderFactoryClass": "tls",
        "authorizedRoles": "client",
        # This test is about the bookie port; its admin port (loopback, read for /metrics) is
        # left open on purpose, which a secured bookie accepts only when told so.
        "httpServerAdminInsecure": "true",
    }
    with LocalCluster(tmp_path_factory.mktemp("mtls-cluster"), bookies=1, bookie_conf=conf) as cluster:
        yield cluster, p


def mtls_config(p: Pki) -> ClientConfig:
    return base_client(tls_provider_factory_class=TLS_CONTEXT_FACTORY, tls_trust_store=str(p.ca.cert),
                       tls_certificate_path=str(p.client.cert), tls_key_store=str(p.client.key))


def test_big_frames_announced_before_start_tls_cost_no_memory(mtls: tuple[LocalCluster, Pki]) -> None:
    cluster, p = mtls
    before, peak = announce_big_frames_and_measure(cluster, mtls_config(p))
    assert peak - before < 50, f"bookie RSS went from {before:.0f} to {peak:.0f} MiB"


def test_a_plaintext_request_on_a_tls_only_bookie_gets_its_answer_and_a_close(mtls: tuple[LocalCluster, Pki]) -> None:
    cluster, _p = mtls
    with socket.create_connection(("127.0.0.1", port_of(cluster)), timeout=10) as s:
        s.sendall(encode(m.ReadRequest(7, 0)))
        got = b""
        while chunk := s.recv(4096):  # ends only when the bookie closes the connection
            got += chunk
    notice, answer = FrameDecoder(m.DEFAULT_MAX_FRAME_SIZE, side="client").feed(got)
    assert notice == m.ErrorResponse(EUA, opcode=m.OP_START_TLS)
    assert isinstance(answer, m.ReadResponse) and answer.status == EUA
    assert "plaintext request refused: this bookie requires TLS" in cluster.log_text(0)


# --------------------------------------------------------------- a bookie without security

def test_big_frames_announced_to_an_open_bookie_cost_only_what_arrived(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "open", bookies=1) as cluster:
        before, peak = announce_big_frames_and_measure(cluster, base_client())
    assert peak - before < 50, f"bookie RSS went from {before:.0f} to {peak:.0f} MiB"


# --------------------------------------------------------------------------- admin HTTP

def test_admin_http_closes_a_half_sent_request(token_cluster: LocalCluster) -> None:
    http_port = int(token_cluster.http_url(0).rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", http_port), timeout=10) as s:
        s.sendall(b"GET /heartbeat HTTP/1.1\r\nHost: bookie\r\n")  # the head never ends
        # closed by the bookie after 1 s (httpServerHeaderReadTimeoutMs=1000); recv gives up after 10 s
        assert s.recv(4096) == b""
    assert "OK" in str(token_cluster.http_get(0, "/heartbeat"))


# ------------------------------------------------------- in process: a stalled TLS handshake

def test_a_tls_handshake_that_never_comes_is_logged(
    pki_set: Pki, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from prometheus_client import CollectorRegistry

    from vellum.security.tls import ReloadingContext
    from vellum.server import bookie_server
    from vellum.server.bookie_server import BookieServer, ServerLimits
    from vellum.server.guard import PeerLimits
    from vellum.server.metrics import ServerMetrics

    monkeypatch.setattr(bookie_server, "TLS_HANDSHAKE_TIMEOUT_S", 1.0)

    async def main() -> None:
        server = BookieServer(
            None, host="127.0.0.1", port=0,  # type: ignore[arg-type]  # no request reaches the bookie
            limits=ServerLimits(peers=PeerLimits(authentication_timeout_s=0)),  # only the handshake's own timeout
            metrics=ServerMetrics(CollectorRegistry()), tls=ReloadingContext.for_server(server_settings(pki_set)))
        await server.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(encode(m.StartTlsRequest(1)))
            await reader.readexactly(20)  # EOK in clear; the handshake never starts
            assert await asyncio.wait_for(reader.read(100), 10) == b""  # closed after 1 s
            writer.close()
        finally:
            await server.stop()

    with caplog.at_level(logging.WARNING, logger="vellum.server.bookie_server"):
        run(main())
    assert "failed: no handshake within 1s" in caplog.text
