"""Every door of a secured cluster, on real bookie processes with real TLS certificates:

* the admin HTTP API of a bookie whose bookie port requires authentication is never open to
  changes: a bookie whose admin port nothing would authenticate refuses to start and names the
  keys to set, and starts with ``httpServerAdminInsecure=true`` (open, on purpose); over https
  with client certificates, the certificate must carry the admin role; with a token key, plain
  http changes need an admin token;
* tokens open one door each (bookie port: audience ``vellum``; admin HTTP: ``vellum-admin``),
  reads that need a credential apply ``authorizedRoles``, tokens with bad time claims are
  refused cleanly on both ports (the bookie keeps the connection protocol, admin HTTP answers
  401, never 500), and so are tokens living longer than ``tokenMaxLifetimeSeconds``;
* a client with a valid token cannot claim the next ledger ids (ADD or fencing READ with its own
  key before the owner writes): the owner's ledgers work, empty password included, and the
  bookie logs the refusals with the ledger id and the peer, never the key.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from security_testkit import Pki, make_pki, run

from vellum.aio import BookKeeper
from vellum.config import TLS_CONTEXT_FACTORY, ClientConfig
from vellum.errors import SecurityError, UnauthorizedAccessError
from vellum.format.entry import DigestManager, DigestType, master_key
from vellum.security import tokens
from vellum.security.pki import CertificateFiles
from vellum.security.tokens import ADMIN_AUDIENCE, BOOKIE_AUDIENCE, TokenSigner
from vellum.testing.local_cluster import LocalCluster

PASSWORD = b"the owner's password"


def mutual_tls(p: Pki) -> dict[str, str]:
    """mutual TLS and certificate authentication with authorizedRoles, and nothing else."""
    return {
        "tlsProviderFactoryClass": TLS_CONTEXT_FACTORY,
        "tlsKeyStore": str(p.bookie.key), "tlsCertificatePath": str(p.bookie.cert),
        "tlsTrustStore": str(p.ca.cert), "tlsClientAuthentication": "true",
        "bookieAuthProviderFactoryClass": "tls", "authorizedRoles": "client,bookie",
    }


def http(url: str, method: str = "GET", token: str | None = None, context: ssl.SSLContext | None = None,
         body: Any = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else (b"" if method != "GET" else None)
    req = urllib.request.Request(url, data=data, method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10, context=context) as resp:
            raw = resp.read()
            status = resp.status
    except urllib.error.HTTPError as e:
        with e:
            raw, status = e.read(), e.code
    try:
        return status, json.loads(raw or b"null")
    except ValueError:
        return status, raw.decode(errors="replace")


# ------------------------------------------------------------------ the admin port's own door


def test_a_bookie_whose_admin_port_would_be_open_refuses_to_start_and_starts_when_told(tmp_path: Path) -> None:
    p = make_pki(tmp_path / "pki")
    with pytest.raises(RuntimeError) as refused, LocalCluster(tmp_path / "open", bookies=1,
                                                              bookie_conf=mutual_tls(p)):
        pass
    said = str(refused.value)
    assert "exited with" in said and "nothing would authenticate admin HTTP calls" in said, said
    for key in ("tokenSecretKeyFile", "httpServerTrustStorePath", "httpServerAdminInsecure=true"):
        assert key in said, (key, said)

    with LocalCluster(tmp_path / "insecure", bookies=1,
                      bookie_conf={**mutual_tls(p), "httpServerAdminInsecure": "true"}) as cluster:
        status, body = http(cluster.http_url(0) + "/api/v1/bookie/gc", "PUT")
        assert status == 200 and "Triggered GC" in str(body)  # open, as the operator said
        assert "httpServerAdminInsecure=true: the admin HTTP API" in cluster.log_text(0)


def test_over_https_with_client_certificates_changes_need_the_admin_role(tmp_path: Path) -> None:
    p = make_pki(tmp_path / "pki")
    conf = {**mutual_tls(p), "httpServerTlsEnable": "true", "httpServerKeyStorePath": str(p.bookie.key),
            "httpServerCertificatePath": str(p.bookie.cert), "httpServerTrustStorePath": str(p.ca.cert)}

    def context(cert: CertificateFiles) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(p.ca.cert))
        ctx.check_hostname = False
        ctx.load_cert_chain(str(cert.cert), str(cert.key))
        return ctx

    with LocalCluster(tmp_path / "c", bookies=1, bookie_conf=conf) as cluster:
        url = cluster.http_url(0).replace("http:", "https:") + "/api/v1/bookie/gc"
        status, body = http(url, "PUT", context=context(p.client))
        assert status == 403 and "principal 'alice' (certificate, roles ['client']) lacks the admin role" in \
            body["error"], body
        status, body = http(url, "PUT", context=context(p.admin))
        assert status == 200 and "Triggered GC" in str(body)
        # no plain http at all: a 400 saying so, before any credential is looked at
        status, body = http(cluster.http_url(0) + "/api/v1/bookie/gc", "PUT")
        assert status == 400 and "this port speaks https" in body, body
        assert "admin HTTP PUT /api/v1/bookie/gc from 127.0.0.1 refused" in cluster.log_text(0)


# ------------------------------------------------------------- tokens, both ports, one cluster


class Secured:
    def __init__(self, cluster: LocalCluster, p: Pki, secret: Path) -> None:
        self.cluster = cluster
        self.pki = p
        self.secret = secret
        self.signer = TokenSigner.from_secret_file(secret)

    def logs(self) -> str:
        return "".join(self.cluster.log_text(i) for i in range(len(self.cluster.bookie_ids)))

    def wait_for_log(self, text: str, timeout_s: float = 10.0) -> None:
        self.cluster.wait_until(lambda: text in self.logs(), timeout_s=timeout_s, what=f"bookie log line {text!r}")

    def forged(self, **claims: Any) -> str:
        """A token signed with the cluster's key whose claims are whatever the test says."""
        now = int(dt.datetime.now(dt.UTC).timestamp())
        body = {"sub": "mallory", "roles": ["admin", "client"], "aud": BOOKIE_AUDIENCE, "iat": now,
                "exp": now + 600, **claims}
        return jwt.encode(body, tokens.read_secret_file(self.secret), algorithm="HS256")

    def admin(self, path: str, method: str = "GET", token: str | None = None) -> tuple[int, Any]:
        return http(self.cluster.http_url(0) + path, method, token)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    p = make_pki(tmp_path_factory.mktemp("pki"))
    secret = tokens.write_secret_file(tmp_path_factory.mktemp("tokens") / "secret")
    conf = {**mutual_tls(p), "bookieAuthProviderFactoryClass": "tls,token", "tokenSecretKeyFile": str(secret),
            "httpServerTokenRequiredForReads": "true"}
    with LocalCluster(tmp_path_factory.mktemp("cluster"), bookies=3, bookie_conf=conf) as cluster:
        yield Secured(cluster, p, secret)


def client_config(p: Pki, cert: CertificateFiles, token: str = "") -> ClientConfig:
    extra: dict[str, Any] = {"client_auth_provider_factory_class": "token", "client_auth_token": token} if token else {}
    return ClientConfig(tls_provider_factory_class=TLS_CONTEXT_FACTORY, tls_trust_store=str(p.ca.cert),
                        tls_certificate_path=str(cert.cert), tls_key_store=str(cert.key), ensemble_size=3,
                        write_quorum_size=3, ack_quorum_size=2, add_entry_timeout_s=5.0, read_entry_timeout_s=5.0,
                        **extra)


def write_with_token(secured: Secured, token: str) -> None:
    """Write one entry as the admin certificate (no authorized role) with ``token``."""
    p = secured.pki

    async def main() -> SecurityError | None:
        try:
            async with BookKeeper(secured.cluster.metadata_uri, config=client_config(p, p.admin, token)) as bk:
                lh = await bk.create_ledger(password=PASSWORD)
                await lh.append(b"x")
        except SecurityError as e:
            await asyncio.sleep(0.2)  # let the refused TLS connection finish closing before the loop does
            return e
        return None

    refused = run(main())
    if refused is not None:
        raise refused


def test_plain_http_changes_need_an_admin_token_for_admin_http(secured: Secured) -> None:
    status, body = secured.admin("/api/v1/bookie/gc", "PUT")
    assert status == 401 and "needs a token with the admin role" in body["error"]
    bookie_port_token = secured.signer.issue("ops", ["admin"], audience=BOOKIE_AUDIENCE)
    status, body = secured.admin("/api/v1/bookie/gc", "PUT", bookie_port_token)
    assert status == 401 and "wrong audience 'vellum' (expected 'vellum-admin'" in body["error"]
    admin_token = secured.signer.issue("ops", ["admin"], audience=ADMIN_AUDIENCE)
    status, body = secured.admin("/api/v1/bookie/gc", "PUT", admin_token)
    assert status == 200 and "Triggered GC" in str(body)


def issue_token(secured: Secured, *args: str) -> str:
    from click.testing import CliRunner

    from vellum.cli.main import cli

    r = CliRunner().invoke(cli, ["security", "issue-token", "--secret-file", str(secured.secret), *args])
    assert r.exit_code == 0, r.output
    return r.stdout.strip()


def test_each_door_takes_the_tokens_issued_for_it_only(secured: Secured) -> None:
    """`vellum security issue-token` names the door; the other door refuses the token."""
    admin_http_token = issue_token(secured, "--subject", "ops", "--role", "admin", "--role", "client")
    assert secured.admin("/api/v1/bookie/gc", "PUT", admin_http_token)[0] == 200
    with pytest.raises(SecurityError, match=r"token refused: wrong audience 'vellum-admin' \(expected 'vellum'"):
        write_with_token(secured, admin_http_token)
    bookie_port_token = issue_token(secured, "--subject", "ops", "--role", "admin", "--role", "client",
                                    "--for", "bookie")
    write_with_token(secured, bookie_port_token)
    status, body = secured.admin("/api/v1/bookie/gc", "PUT", bookie_port_token)
    assert status == 401 and "wrong audience 'vellum' (expected 'vellum-admin'" in body["error"]


def test_admin_reads_apply_authorized_roles(secured: Secured) -> None:
    def read(roles: list[str]) -> tuple[int, Any]:
        return secured.admin("/api/v1/bookie/state", token=secured.signer.issue("x", roles, audience=ADMIN_AUDIENCE))

    status, body = read(["guest"])
    assert status == 403 and "has none of the authorized roles ['client', 'bookie']" in body["error"], body
    assert read(["client"])[0] == 200 and read(["admin"])[0] == 200
    assert secured.admin("/api/v1/bookie/state")[0] == 401


@pytest.mark.parametrize(("claims", "reason"), [
    ({"exp": "tomorrow"}, "malformed 'exp' claim 'tomorrow'"),
    ({"exp": "4102444800"}, "malformed 'exp' claim '4102444800'"),
    ({"exp": 1e300}, "malformed 'exp' claim 1e+300"),
    ({"exp": 10**30}, "malformed 'exp' claim 1000000000000000000000000000000"),
    ({"iat": "yesterday"}, "malformed 'iat' claim 'yesterday'"),
    ({"iat": -(10**30)}, "malformed 'iat' claim -1000000000000000000000000000000"),
    ({"iat": True}, "malformed 'iat' claim True"),
])
def test_bad_time_claims_are_refused_cleanly_on_both_ports(secured: Secured, claims: dict[str, Any],
                                                           reason: str) -> None:
    status, body = secured.admin("/api/v1/bookie/gc", "PUT", secured.forged(aud=ADMIN_AUDIENCE, **claims))
    assert status == 401 and reason in body["error"], (status, body)
    with pytest.raises(SecurityError, match="authentication refused: token refused: " + _escape(reason)):
        write_with_token(secured, secured.forged(**claims))


def test_tokens_living_longer_than_the_maximum_are_refused_on_both_ports(secured: Secured) -> None:
    now = int(dt.datetime.now(dt.UTC).timestamp())
    century = {"iat": now, "exp": now + 100 * 365 * 86400}
    status, body = secured.admin("/api/v1/bookie/gc", "PUT", secured.forged(aud=ADMIN_AUDIENCE, **century))
    assert status == 401 and "over the maximum of 2592000s (tokenMaxLifetimeSeconds)" in body["error"]
    with pytest.raises(SecurityError, match=r"over the maximum of 2592000s \(tokenMaxLifetimeSeconds\)"):
        write_with_token(secured, secured.forged(**century))
    with pytest.raises(SecurityError, match="more than the maximum lifetime"):  # no iat: exp counts from now
        write_with_token(secured, jwt.encode({"sub": "m", "aud": BOOKIE_AUDIENCE, "exp": century["exp"]},
                                             tokens.read_secret_file(secured.secret), algorithm="HS256"))
    assert "Traceback" not in secured.logs()


def _escape(text: str) -> str:
    import re

    return re.escape(text)


# -------------------------------------------------------------------------- master keys


def test_a_client_cannot_claim_the_next_ledger_ids_before_their_owner(secured: Secured) -> None:
    p = secured.pki
    squatter_token = secured.signer.issue("squatter", ["client"])
    wrong = master_key(b"squatter's own password")

    async def main() -> list[int]:
        async with BookKeeper(secured.cluster.metadata_uri, config=client_config(p, p.client)) as owner, \
                BookKeeper(secured.cluster.metadata_uri, config=client_config(p, p.admin, squatter_token)) as squat:
            first = await owner.create_ledger(password=PASSWORD)
            await first.close()
            targets = [first.ledger_id + 1, first.ledger_id + 2, first.ledger_id + 3]
            for bookie_id in secured.cluster.bookie_ids:
                for lid in targets[:2]:  # ADD with the squatter's key, before the owner's ledger exists
                    stored = DigestManager(lid, DigestType.CRC32C).compute(0, -1, 5, b"squat")
                    with pytest.raises(UnauthorizedAccessError):
                        await squat.bookie_client.add(bookie_id, wrong, stored, timeout_s=5)
                with pytest.raises(UnauthorizedAccessError):  # a fencing READ would set the key too
                    await squat.bookie_client.read(bookie_id, targets[2], 0, fence_master_key=wrong, timeout_s=5)
            made = []
            for password in (PASSWORD, b"", PASSWORD):  # an empty password is a password too
                lh = await owner.create_ledger(password=password)
                made.append(lh.ledger_id)
                assert await asyncio.gather(*(lh.append_async(b"%d" % i) for i in range(10))) == list(range(10))
                await lh.close()
                rh = await owner.open_ledger(lh.ledger_id, password=password)
                assert [e.payload for e in await rh.read(0, 9)] == [b"%d" % i for i in range(10)]
            assert made == targets
            # the owner's key is now the ledger's: the squatter's stays refused
            stored = DigestManager(targets[0], DigestType.CRC32C).compute(10, 9, 5, b"squat")
            with pytest.raises(UnauthorizedAccessError):
                await squat.bookie_client.add(secured.cluster.bookie_ids[0], wrong, stored, timeout_s=5)
            return targets

    targets = run(main())
    secured.wait_for_log(f"master key refused: ADD of entry 0 of ledger {targets[0]} from ('127.0.0.1'")
    assert "principal 'squatter'" in secured.logs()
    assert wrong.hex() not in secured.logs() and wrong.hex().upper() not in secured.logs()
