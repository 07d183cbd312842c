"""The acceptance test of docs/security.md, on real processes with real TLS: a 3-bookie cluster (``LocalCluster``,
configured from ``bk_server.conf`` with BookKeeper's keys) with mutual TLS, authentication by
certificate or token (``bookieAuthProviderFactoryClass=tls,token``) and authorization
(``authorizedRoles=client,bookie``), its admin HTTP on https with token checks.

* the authorized client writes and reads, and so does a client whose certificate has no
  authorized role but whose token has one;
* a client with no certificate, a certificate from another CA, an expired certificate, a
  certificate without an authorized role, a plaintext connection and a bad token are each
  refused with a clear error on the client side and a log line on the bookie naming the peer
  and the reason, and not one entry of theirs reaches a bookie;
* the admin HTTP refuses a mutating call without a token (401) and with a non-admin token (403),
  and accepts it with an admin token; the ledger metadata endpoint never shows the password,
  and no bookie log line does.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from security_testkit import Pki, make_pki, run

from vellum.aio import BookKeeper
from vellum.config import TLS_CONTEXT_FACTORY, ClientConfig
from vellum.errors import NoSuchLedgerError, SecurityError, VellumError
from vellum.security import tokens
from vellum.security.pki import CertificateFiles
from vellum.security.tokens import ADMIN_AUDIENCE, TokenSigner
from vellum.testing.local_cluster import LocalCluster

PASSWORD = b"top-secret-ledger-password"


class Secured:
    def __init__(self, cluster: LocalCluster, p: Pki, secret: Path) -> None:
        self.cluster = cluster
        self.pki = p
        self.signer = TokenSigner.from_secret_file(secret)

    def logs(self) -> str:
        return "".join(self.cluster.log_text(i) for i in range(len(self.cluster.bookie_ids)))

    def wait_for_log(self, text: str, timeout_s: float = 10.0) -> None:
        self.cluster.wait_until(lambda: text in self.logs(), timeout_s=timeout_s, what=f"bookie log line {text!r}")


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    p = make_pki(tmp_path_factory.mktemp("pki"))
    secret = tokens.write_secret_file(tmp_path_factory.mktemp("tokens") / "secret")
    conf = {
        "tlsProviderFactoryClass": TLS_CONTEXT_FACTORY,
        "tlsKeyStoreType": "PEM",
        "tlsKeyStore": str(p.bookie.key),
        "tlsCertificatePath": str(p.bookie.cert),
        "tlsTrustStoreType": "PEM",
        "tlsTrustStore": str(p.ca.cert),
        "tlsClientAuthentication": "true",
        "bookieAuthProviderFactoryClass": "org.apache.bookkeeper.tls.BookieAuthZFactory,token",
        "authorizedRoles": "client,bookie",
        "tokenSecretKeyFile": str(secret),
        "httpServerTlsEnable": "true",
        "httpServerKeyStorePath": str(p.bookie.key),
        "httpServerCertificatePath": str(p.bookie.cert),
    }
    with LocalCluster(tmp_path_factory.mktemp("cluster"), bookies=3, bookie_conf=conf) as cluster:
        yield Secured(cluster, p, secret)


def client_config(p: Pki, cert: CertificateFiles | None, *, tls: bool = True, token: str = "") -> ClientConfig:
    base: dict[str, Any] = {"ensemble_size": 3, "write_quorum_size": 3, "ack_quorum_size": 2,
                            "add_entry_timeout_s": 5.0, "read_entry_timeout_s": 5.0}
    if token:
        base |= {"client_auth_provider_factory_class": "token", "client_auth_token": token}
    if not tls:
        return ClientConfig(**base)
    keys = {"tls_certificate_path": str(cert.cert), "tls_key_store": str(cert.key)} if cert else {}
    return ClientConfig(tls_provider_factory_class=TLS_CONTEXT_FACTORY, tls_trust_store=str(p.ca.cert),
                        **keys, **base)


def test_authorized_clients_write_and_read(secured: Secured) -> None:
    p = secured.pki
    token = secured.signer.issue("etl-job", ["client"])

    async def main() -> None:
        async with BookKeeper(secured.cluster.metadata_uri, config=client_config(p, p.client)) as bk:
            lh = await bk.create_ledger(password=PASSWORD)
            assert await asyncio.gather(*(lh.append_async(b"entry %d" % i) for i in range(30))) == list(range(30))
            await lh.close()
        # the admin certificate has no authorized role: its token (role client) lets it in
        async with BookKeeper(secured.cluster.metadata_uri, config=client_config(p, p.admin, token=token)) as bk:
            rh = await bk.open_ledger(lh.ledger_id, password=PASSWORD)
            assert [e.payload for e in await rh.read(0, 29)] == [b"entry %d" % i for i in range(30)]

    run(main())
    secured.wait_for_log("authenticated: principal 'alice' (tls, roles ['client'])")
    secured.wait_for_log("authenticated: principal 'etl-job' (token, roles ['client'])")


def bad_token(secured: Secured, tmp: Path) -> str:
    other = TokenSigner.from_secret_file(tokens.write_secret_file(tmp / "other-secret"))
    return other.issue("mallory", ["client"])


@pytest.mark.parametrize(
    ("who", "client_says", "bookie_says"),
    [
        ("no-certificate", "refused this client", "failed: peer did not return a certificate"),
        ("other-ca", "refused this client", "failed: unable to get local issuer certificate"),
        ("expired", "refused this client", "failed: certificate has expired"),
        ("no-authorized-role", r"refused this client: request refused: principal 'root' \(tls, roles \['admin'\]\) "
                               r"has none of the authorized roles \['client', 'bookie'\]",
         "has none of the authorized roles ['client', 'bookie']"),
        ("plaintext", "requires TLS and this client is configured without it",
         "plaintext request refused: this bookie requires TLS (peer ('127.0.0.1'"),
        ("bad-token", "refused this client: authentication refused: token refused: bad signature",
         "refused, closing the connection: authentication refused: token refused: bad signature"),
    ],
)
def test_each_unauthorized_client_is_refused_clearly_and_stores_nothing(
    secured: Secured, tmp_path: Path, who: str, client_says: str, bookie_says: str
) -> None:
    p = secured.pki
    config = {
        "no-certificate": lambda: client_config(p, None),
        "other-ca": lambda: client_config(p, p.other_ca_client),
        "expired": lambda: client_config(p, p.expired_client),
        "no-authorized-role": lambda: client_config(p, p.admin),
        "plaintext": lambda: client_config(p, None, tls=False),
        "bad-token": lambda: client_config(p, p.admin, token=bad_token(secured, tmp_path)),
    }[who]()

    async def main() -> int:
        async with BookKeeper(secured.cluster.metadata_uri, config=config) as bk:
            lh = await bk.create_ledger(password=PASSWORD)
            with pytest.raises(SecurityError, match=client_says):
                await lh.append(b"must not be stored")
            return lh.ledger_id

    ledger_id = run(main())
    secured.wait_for_log(bookie_says)
    assert "('127.0.0.1'," in secured.logs()  # the peer is named

    async def nothing_stored() -> None:
        async with BookKeeper(secured.cluster.metadata_uri, config=client_config(p, p.client)) as bk:
            for bookie_id in secured.cluster.bookie_ids:
                with pytest.raises(NoSuchLedgerError):  # not one entry of it reached a bookie
                    await bk.bookie_client.list_entries(bookie_id, ledger_id)

    run(nothing_stored())


def https(secured: Secured, method: str, path: str, token: str | None = None, body: Any = None) -> tuple[int, Any]:
    ctx = ssl.create_default_context(cafile=str(secured.pki.ca.cert))
    ctx.check_hostname = False
    port = secured.cluster.http_url(0).rsplit(":", 1)[1]
    data = json.dumps(body).encode() if body is not None else (b"" if method != "GET" else None)
    req = urllib.request.Request(f"https://127.0.0.1:{port}{path}", data=data, method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as e:
        with e:
            return e.code, json.loads(e.read() or b"null")


def test_admin_http_needs_an_admin_token_to_change_anything(secured: Secured) -> None:
    status, body = https(secured, "PUT", "/api/v1/bookie/gc")
    assert status == 401 and "needs a token with the admin role" in body["error"]
    status, body = https(secured, "PUT", "/api/v1/bookie/gc", secured.signer.issue("app", ["client"],
                                                                                   audience=ADMIN_AUDIENCE))
    assert status == 403 and "lacks the admin role" in body["error"]
    status, body = https(secured, "PUT", "/api/v1/bookie/gc", secured.signer.issue("ops", ["admin"],
                                                                                   audience=ADMIN_AUDIENCE))
    assert status == 200 and "Triggered GC" in str(body)
    assert https(secured, "GET", "/api/v1/bookie/state")[0] == 200  # reads stay open by default
    secured.wait_for_log("admin HTTP PUT /api/v1/bookie/gc from 127.0.0.1 refused")
    with pytest.raises(OSError):  # https only (URLError, or the connection closed)
        urllib.request.urlopen(secured.cluster.http_url(0) + "/api/v1/bookie/state", timeout=5)


def test_a_ledger_password_never_shows(secured: Secured) -> None:
    p = secured.pki

    async def main() -> int:
        async with BookKeeper(secured.cluster.metadata_uri, config=client_config(p, p.client)) as bk:
            lh = await bk.create_ledger(password=PASSWORD)
            await lh.append(b"x")
            await lh.close()
            return lh.ledger_id

    ledger_id = run(main())
    status, body = https(secured, "GET", f"/api/v1/ledger/metadata?ledger_id={ledger_id}")
    assert status == 200 and body["password"] == "(redacted)" and body["state"] == "CLOSED"
    shown = json.dumps(body)
    encoded = base64.b64encode(PASSWORD).decode()
    assert PASSWORD.decode() not in shown and encoded not in shown
    logs = secured.logs()
    assert PASSWORD.decode() not in logs and encoded not in logs


def test_the_gc_tools_reach_a_secured_bookie_with_a_ca_file_and_an_admin_token(
        secured: Secured, tmp_path: Path) -> None:
    """`vellum shell gc`, `gc-status`, `entrylogs-usage` and `spark gc-report`'s --http path
    against https bookies that check tokens: each refusal says what to give."""
    from click.testing import CliRunner

    from vellum.cli.main import cli
    from vellum.security.admin_http_client import AdminHttpAccess
    from vellum.spark.jobs import gc_report

    url = "https://127.0.0.1:" + secured.cluster.http_url(0).rsplit(":", 1)[1]
    ca = str(secured.pki.ca.cert)
    admin, app = tmp_path / "admin.jwt", tmp_path / "app.jwt"
    admin.write_text(secured.signer.issue("ops", ["admin"], audience=ADMIN_AUDIENCE) + "\n")
    app.write_text(secured.signer.issue("app", ["client"], audience=ADMIN_AUDIENCE))

    def shell(*args: str) -> tuple[int, str]:
        r = CliRunner().invoke(cli, ["shell", *args], env={"VELLUM_ADMIN_TOKEN_FILE": None,
                                                          "VELLUM_HTTP_CA_FILE": None})
        return r.exit_code, r.output

    code, out = shell("gc-status", "--http", url)
    assert code != 0 and "--http-ca-file" in out and "certificate" in out
    code, out = shell("gc-status", "--http", url.replace("https:", "http:"), "--http-ca-file", ca)
    assert code != 0 and "https://" in out
    code, out = shell("gc-status", "--http", url, "--http-ca-file", ca, "--json")
    assert code == 0 and isinstance(json.loads(out), list), out
    code, out = shell("gc", "--http", url, "--http-ca-file", ca)
    assert code != 0 and "HTTP 401" in out and "--admin-token-file" in out
    code, out = shell("gc", "--http", url, "--http-ca-file", ca, "--admin-token-file", str(app))
    assert code != 0 and "HTTP 403" in out and "admin role" in out
    code, out = shell("gc", "--http", url, "--http-ca-file", ca, "--admin-token-file", str(admin), "--wait")
    assert code == 0 and "Triggered GC" in out, out
    code, out = shell("entrylogs-usage", "--http", url, "--http-ca-file", ca, "--json")
    assert code == 0 and isinstance(json.loads(out), list), out
    (tmp_path / "empty").write_text("")
    code, out = shell("gc", "--http", url, "--http-ca-file", ca, "--admin-token-file", str(tmp_path / "empty"))
    assert code != 0 and "is empty" in out

    # gc-report's --http rows (no Spark needed for running bookies' listings)
    rows = gc_report(None, metadata_uri=secured.cluster.metadata_uri, http_urls=[url],
                     access=AdminHttpAccess.from_files(str(admin), ca))
    assert all(r["source"] == "http" for r in rows)
    with pytest.raises(VellumError, match="--http-ca-file"):
        gc_report(None, metadata_uri=secured.cluster.metadata_uri, http_urls=[url])
