"""Admin HTTP security, in-process: the real ``AdminHttpServer`` (aiohttp) over a stub admin.

Covered: with a token key, mutating calls need a token with the admin role (401 without a
valid one, 403 without the role) and reads are open unless ``tokens_for_reads``; /heartbeat is
always open; refusals are logged without the token; TLS (https) with the certificates of
``vellum.security.pki``, optionally requiring client certificates; and no JSON answer ever
carries a password or a master key, whatever the handler returned."""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest
from aiohttp import web
from security_testkit import Pki, run

from vellum.admin.bookie_admin import BookieAdmin
from vellum.config import ServerConfig
from vellum.errors import ConfigError
from vellum.http.admin_http import AdminHttpServer, HttpSecurity, redact
from vellum.security import tokens
from vellum.security.tls import ReloadingContext, TlsSettings
from vellum.security.tokens import ADMIN_AUDIENCE, BOOKIE_AUDIENCE, TokenSigner, TokenVerifier
from vellum.service import http_tls

HTTP_LOG = "vellum.http.admin_http"


class StubAdmin:
    def __init__(self) -> None:
        self.read_only = False

    def state(self) -> dict[str, Any]:
        return {"running": True, "readOnly": self.read_only, "shuttingDown": False,
                "availableForHighPriorityWrites": True}

    def set_read_only(self, value: bool) -> dict[str, Any]:
        self.read_only = value
        return {"readOnly": value}

    def ledger_metadata(self, ledger_id: int) -> dict[str, Any]:
        return {"state": "OPEN", "password": "c2VjcmV0", "nested": [{"masterKey": "abc", "ok": 1}]}


@pytest.fixture(scope="module")
def secret(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tokens.write_secret_file(tmp_path_factory.mktemp("http-tokens") / "secret")


async def call(session: aiohttp.ClientSession, method: str, url: str, token: str | None = None,
               body: Any = None, **kw: Any) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with session.request(method, url, headers=headers, json=body, **kw) as resp:
        text = await resp.text()
        try:
            return resp.status, json.loads(text)
        except ValueError:
            return resp.status, text


async def serve(security: HttpSecurity, ssl_context: ssl.SSLContext | None = None,
                extra: list[web.RouteDef] | None = None) -> tuple[AdminHttpServer, StubAdmin]:
    admin = StubAdmin()
    server = AdminHttpServer(cast(BookieAdmin, admin), host="127.0.0.1", port=0, security=security,
                             ssl_context=ssl_context, extra_routes=extra)
    await server.start()
    return server, admin


def test_mutating_calls_need_an_admin_token(secret: Path, caplog: pytest.LogCaptureFixture) -> None:
    signer = TokenSigner.from_secret_file(secret)
    admin_token = signer.issue("ops", ["admin"], audience=ADMIN_AUDIENCE)
    client_token = signer.issue("app", ["client"], audience=ADMIN_AUDIENCE)

    async def extra_put(_r: web.Request) -> web.Response:
        return web.json_response({"triggered": True})

    async def main() -> None:
        server, admin = await serve(HttpSecurity(verifier=TokenVerifier.from_secret_file(secret)),
                                    extra=[web.put("/api/v1/autorecovery/decommission", extra_put)])
        url = f"http://127.0.0.1:{server.port}"
        try:
            async with aiohttp.ClientSession() as s:
                status, body = await call(s, "PUT", url + "/api/v1/bookie/state/readonly", body={"readOnly": True})
                assert status == 401 and "needs a token with the admin role" in body["error"]
                status, body = await call(s, "PUT", url + "/api/v1/bookie/state/readonly", client_token,
                                          {"readOnly": True})
                assert status == 403 and "principal 'app' (token, roles ['client']) lacks the admin role" in body["error"]
                status, body = await call(s, "PUT", url + "/api/v1/bookie/state/readonly", "garbage",
                                          {"readOnly": True})
                assert status == 401 and "token refused: malformed" in body["error"]
                assert not admin.read_only
                # routes added by other modules are covered by the same rule
                assert (await call(s, "PUT", url + "/api/v1/autorecovery/decommission"))[0] == 401
                assert (await call(s, "PUT", url + "/api/v1/autorecovery/decommission", admin_token))[0] == 200
                status, body = await call(s, "PUT", url + "/api/v1/bookie/state/readonly", admin_token,
                                          {"readOnly": True})
                assert (status, body) == (200, {"readOnly": True}) and admin.read_only
                # reads stay open by default
                assert (await call(s, "GET", url + "/api/v1/bookie/state"))[0] == 200
                assert (await call(s, "GET", url + "/heartbeat"))[0] == 200
        finally:
            await server.stop()

    with caplog.at_level(logging.WARNING, logger=HTTP_LOG):
        run(main())
    assert "admin HTTP PUT /api/v1/bookie/state/readonly from 127.0.0.1 refused" in caplog.text
    assert admin_token not in caplog.text and client_token not in caplog.text


def test_reads_can_require_a_token_too(secret: Path) -> None:
    token = TokenSigner.from_secret_file(secret).issue("app", ["client"], audience=ADMIN_AUDIENCE)

    async def main() -> None:
        server, _ = await serve(HttpSecurity(verifier=TokenVerifier.from_secret_file(secret), tokens_for_reads=True))
        url = f"http://127.0.0.1:{server.port}"
        try:
            async with aiohttp.ClientSession() as s:
                status, body = await call(s, "GET", url + "/api/v1/bookie/state")
                assert status == 401 and "this call needs a token" in body["error"]
                assert (await call(s, "GET", url + "/api/v1/bookie/state", token))[0] == 200
                assert (await call(s, "GET", url + "/metrics"))[0] == 401
                assert (await call(s, "GET", url + "/heartbeat"))[0] == 200
        finally:
            await server.stop()

    run(main())


def test_reads_needing_a_credential_apply_authorized_roles(secret: Path) -> None:
    signer = TokenSigner.from_secret_file(secret)
    guest, client, admin = (signer.issue(n, [n], audience=ADMIN_AUDIENCE) for n in ("guest", "client", "admin"))

    async def main() -> None:
        server, _ = await serve(HttpSecurity(verifier=TokenVerifier.from_secret_file(secret), tokens_for_reads=True,
                                             authorized_roles=("client", "bookie")))
        url = f"http://127.0.0.1:{server.port}/api/v1/bookie/state"
        try:
            async with aiohttp.ClientSession() as s:
                status, body = await call(s, "GET", url, guest)
                assert status == 403 and "has none of the authorized roles ['client', 'bookie']" in body["error"]
                assert (await call(s, "GET", url, client))[0] == 200
                assert (await call(s, "GET", url, admin))[0] == 200
        finally:
            await server.stop()

    run(main())


def test_a_bookie_port_token_does_not_open_admin_http(secret: Path) -> None:
    bookie_token = TokenSigner.from_secret_file(secret).issue("ops", ["admin"], audience=BOOKIE_AUDIENCE)

    async def main() -> None:
        server, admin = await serve(HttpSecurity(verifier=TokenVerifier.from_secret_file(secret)))
        try:
            async with aiohttp.ClientSession() as s:
                status, body = await call(s, "PUT", f"http://127.0.0.1:{server.port}/api/v1/bookie/state/readonly",
                                          bookie_token, {"readOnly": True})
                assert status == 401 and "wrong audience 'vellum' (expected 'vellum-admin'" in body["error"]
                assert not admin.read_only
        finally:
            await server.stop()

    run(main())


def test_an_admin_client_certificate_is_an_admin_credential_over_https(pki_set: Pki) -> None:
    async def main() -> None:
        server, admin = await serve(HttpSecurity(admin_required=True, certificates=True),
                                    http_tls(https_config(pki_set, mutual=True)))
        url = f"https://127.0.0.1:{server.port}/api/v1/bookie/state/readonly"
        try:
            async with aiohttp.ClientSession() as s:
                status, body = await call(s, "PUT", url, body={"readOnly": True}, ssl=client_ssl(pki_set, pki_set.client))
                assert status == 403 and "principal 'alice' (certificate, roles ['client']) lacks the admin role" in \
                    body["error"]
                assert not admin.read_only
                status, body = await call(s, "PUT", url, body={"readOnly": True}, ssl=client_ssl(pki_set, pki_set.admin))
                assert status == 200 and admin.read_only
        finally:
            await server.stop()

    run(main())


def test_without_a_token_key_the_api_is_open_as_before() -> None:
    async def main() -> None:
        server, admin = await serve(HttpSecurity())
        try:
            async with aiohttp.ClientSession() as s:
                status, _ = await call(s, "PUT", f"http://127.0.0.1:{server.port}/api/v1/bookie/state/readonly",
                                       body={"readOnly": True})
                assert status == 200 and admin.read_only
        finally:
            await server.stop()

    run(main())


def test_no_answer_carries_a_password_or_a_master_key() -> None:
    assert redact({"password": "x", "a": [{"master_key": "k", "b": 1}], "ok": 2}) == (
        {"password": "(redacted)", "a": [{"master_key": "(redacted)", "b": 1}], "ok": 2}, True)

    async def main() -> Any:
        server, _ = await serve(HttpSecurity())
        try:
            async with aiohttp.ClientSession() as s:
                return await call(s, "GET", f"http://127.0.0.1:{server.port}/api/v1/ledger/metadata?ledger_id=1")
        finally:
            await server.stop()

    status, body = run(main())
    assert status == 200
    assert body == {"state": "OPEN", "password": "(redacted)", "nested": [{"masterKey": "(redacted)", "ok": 1}]}


def https_config(p: Pki, *, mutual: bool) -> ServerConfig:
    return ServerConfig(http_server_tls_enable=True, http_server_key_store_path=str(p.bookie.key),
                        http_server_certificate_path=str(p.bookie.cert),
                        http_server_trust_store_path=str(p.ca.cert) if mutual else "")


def client_ssl(p: Pki, cert: Any = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(p.ca.cert))
    ctx.check_hostname = False
    if cert is not None:
        ctx.load_cert_chain(str(cert.cert), str(cert.key))
    return ctx


def test_https_with_the_clusters_certificates(pki_set: Pki) -> None:
    async def main() -> None:
        server, _ = await serve(HttpSecurity(), http_tls(https_config(pki_set, mutual=False)))
        assert server.scheme == "https"
        try:
            async with aiohttp.ClientSession() as s:
                url = f"https://127.0.0.1:{server.port}/api/v1/bookie/state"
                assert (await call(s, "GET", url, ssl=client_ssl(pki_set)))[0] == 200
                # plain http to the https port: a clear 400, not a connection closed without a word
                status, body = await call(s, "GET", f"http://127.0.0.1:{server.port}/api/v1/bookie/state")
                assert status == 400 and "this port speaks https" in body, body
                assert (await call(s, "GET", url, ssl=client_ssl(pki_set)))[0] == 200  # still serving
                with pytest.raises(aiohttp.ClientConnectorCertificateError):
                    await call(s, "GET", url)  # the system CAs do not know the cluster's CA
        finally:
            await server.stop()

    run(main())


def test_https_can_require_client_certificates(pki_set: Pki) -> None:
    async def main() -> None:
        server, _ = await serve(HttpSecurity(), http_tls(https_config(pki_set, mutual=True)))
        try:
            async with aiohttp.ClientSession() as s:
                url = f"https://127.0.0.1:{server.port}/api/v1/bookie/state"
                assert (await call(s, "GET", url, ssl=client_ssl(pki_set, pki_set.admin)))[0] == 200
                with pytest.raises((aiohttp.ClientError, ssl.SSLError, ConnectionError)):
                    await call(s, "GET", url, ssl=client_ssl(pki_set))
                with pytest.raises((aiohttp.ClientError, ssl.SSLError, ConnectionError)):
                    await call(s, "GET", url, ssl=client_ssl(pki_set, pki_set.other_ca_client))
        finally:
            await server.stop()

    run(main())


def test_an_encrypted_http_key_loads_with_bookkeepers_password_key(pki_set: Pki) -> None:
    password = pki_set.password_file.read_text().strip()
    cfg = ServerConfig(http_server_tls_enable=True, http_server_key_store_path=str(pki_set.encrypted_client.key),
                       http_server_certificate_path=str(pki_set.encrypted_client.cert),
                       http_server_key_store_password=password)
    assert http_tls(cfg) is not None
    assert password not in repr(cfg)
    with pytest.raises(ConfigError, match="httpServerTlsEnable=true needs httpServerKeyStorePath"):
        ServerConfig(http_server_tls_enable=True)


def test_the_switching_context_follows_rotation(tmp_path: Path) -> None:
    from security_testkit import make_pki

    from vellum.security import pki

    p = make_pki(tmp_path)
    holder = ReloadingContext.for_server(TlsSettings(key_store=str(p.bookie.key), certificate_path=str(p.bookie.cert),
                                                     refresh_s=0.2))

    async def presented(port: int) -> str:
        _r, w = await asyncio.open_connection("127.0.0.1", port, ssl=client_ssl(p), server_hostname="")
        der = w.get_extra_info("ssl_object").getpeercert(binary_form=True)
        w.close()
        from cryptography import x509

        return pki.principal_of(x509.load_der_x509_certificate(der))

    async def main() -> None:
        server = await asyncio.start_server(lambda _r, w: w.close(), "127.0.0.1", 0, ssl=holder.switching_context())
        port = server.sockets[0].getsockname()[1]
        try:
            assert await presented(port) == "bookie-1"
            ca = pki.load_ca(p.base / "ca")
            pki.write_certificate(pki.issue_certificate(ca, name="bookie-1-renewed", role="bookie"),
                                  p.bookie.cert.parent, overwrite=True, stem="bookie-1")
            await asyncio.sleep(0.3)
            assert await presented(port) == "bookie-1-renewed"
        finally:
            server.close()

    run(main())
