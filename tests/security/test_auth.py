"""Authentication and authorization on the bookie port, in-process: the real ``BookieServer``
and ``BookieClient`` (a fake bookie keeps entries in memory) with a ``BookieAuthenticator``.

Covered: the ``tls`` provider (the mutual-TLS certificate's CN and OU roles) and the ``token``
provider (AUTH with a JWT); ``authorizedRoles``; each refusal (no identity, a role not
authorized, a bad / expired / foreign / oversized token, an unknown provider) gives the client a
``SecurityError`` with the bookie's reason and the bookie a log line naming the peer, stores
nothing and closes the connection; a raw client that sends operations before authenticating
gets the notice, an EUA answer and a closed connection; the bookie keeps serving the others."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from pathlib import Path
from typing import Any

import pytest
from security_testkit import Pki, client_settings, close, run, server_settings

from vellum.client.bookie_client import BookieClient
from vellum.client.bookkeeper import client_auth
from vellum.config import TLS_CONTEXT_FACTORY, ClientConfig, ServerConfig
from vellum.errors import EOK, EUA, ConfigError, SecurityError
from vellum.format.entry import DigestManager, DigestType, master_key
from vellum.proto import FrameDecoder, encode
from vellum.proto import messages as m
from vellum.security import tokens
from vellum.security.auth import Admission, BookieAuthenticator, ClientAuth, Identity, provider_names
from vellum.security.tls import ReloadingContext
from vellum.security.tokens import TokenSigner, TokenVerifier
from vellum.testing.memory_bookie import MemoryBookieServer as Bookie

KEY = master_key(b"pw")
SERVER_LOG = "vellum.server.bookie_server"


def entry(ledger_id: int, entry_id: int, payload: bytes) -> bytes:
    return DigestManager(ledger_id, DigestType.CRC32C).compute(entry_id, entry_id - 1, len(payload), payload)


async def add_and_read(client: BookieClient, bookie_id: str, ledger_id: int = 1) -> bytes:
    await client.add(bookie_id, KEY, entry(ledger_id, 0, b"authorized"))
    return bytes(await client.read(bookie_id, ledger_id, 0))


@pytest.fixture(scope="module")
def secret(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tokens.write_secret_file(tmp_path_factory.mktemp("tokens") / "secret")


def signer(secret: Path) -> TokenSigner:
    return TokenSigner.from_secret_file(secret)


# ----------------------------------------------------------------------------- the decisions


def test_the_authenticator_decides_from_certificates_tokens_and_roles(secret: Path, tmp_path: Path) -> None:
    assert provider_names(["org.apache.bookkeeper.tls.BookieAuthZFactory", " token", "tls"]) == ("tls", "token")
    with pytest.raises(SecurityError, match="authentication provider 'sasl' is not one Vellum has"):
        provider_names(["sasl"])
    with pytest.raises(SecurityError, match="the token provider needs a verification key"):
        BookieAuthenticator(["token"])
    auth = BookieAuthenticator(["tls", "token"], authorized_roles=["client", "bookie"],
                               token_verifier=TokenVerifier.from_secret_file(secret))
    cert = auth.from_certificate("alice", ("client",))
    assert cert == Identity("alice", ("client",), "tls")
    auth.authorize(cert)
    assert auth.from_auth("tls", b"", cert) is cert
    token = signer(secret).issue("svc", ["bookie"])
    assert auth.from_auth("token", token.encode(), None) == Identity("svc", ("bookie",), "token")
    with pytest.raises(SecurityError, match=r"principal 'root' \(tls, roles \['admin'\]\) has none of the "
                                            r"authorized roles \['client', 'bookie'\]"):
        auth.authorize(Identity("root", ("admin",), "tls"))
    with pytest.raises(SecurityError, match=r"not authenticated: this bookie requires a client certificate .* or a "
                                            r"token"):
        auth.authorize(None)
    with pytest.raises(SecurityError, match="no client certificate"):
        auth.from_auth("tls", b"", None)
    with pytest.raises(SecurityError, match="unknown authentication provider 'kerberos'"):
        auth.from_auth("kerberos", b"x", None)
    expired = signer(secret).issue("svc", ["bookie"], ttl_s=60, now=dt.datetime.now(dt.UTC) - dt.timedelta(hours=1))
    with pytest.raises(SecurityError, match="token refused: expired at"):
        auth.from_auth("token", expired.encode(), None)
    other = TokenSigner.from_secret_file(tokens.write_secret_file(tmp_path / "other")).issue("svc", ["bookie"])
    with pytest.raises(SecurityError, match="token refused: bad signature"):
        auth.from_auth("token", other.encode(), None)
    with pytest.raises(SecurityError, match="over the 8192-byte limit"):
        auth.from_auth("token", b"x" * 9000, None)
    # admit: the same decisions as a value, for a connection's session (never raises)
    assert auth.admit(cert) == Admission(cert)
    assert auth.admit(None, "token", token.encode()) == Admission(Identity("svc", ("bookie",), "token"))
    refused = auth.admit(Identity("root", ("admin",), "tls"))
    assert refused.identity is None and "has none of the authorized roles" in refused.refusal
    assert auth.admit(None).refusal.startswith("not authenticated: this bookie requires")
    assert auth.admit(cert, "kerberos", b"x").refusal.startswith("unknown authentication provider 'kerberos'")
    assert BookieAuthenticator(["tls"]).from_certificate("alice", ()) is not None  # no roles needed
    BookieAuthenticator(["tls"]).authorize(Identity("alice", (), "tls"))


def test_configuration_of_authentication(secret: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="bookieAuthProviderFactoryClass=tls takes the principal from the client "
                                          "certificate"):
        ServerConfig(bookie_auth_provider_factory_class=("tls",))
    with pytest.raises(ConfigError, match="bookieAuthProviderFactoryClass=token needs tokenSecretKeyFile"):
        ServerConfig(bookie_auth_provider_factory_class=("token",))
    cfg = ServerConfig(bookie_auth_provider_factory_class=("token",), token_secret_key_file=str(secret),
                       authorized_roles=("client", "bookie"))
    assert cfg.auth_providers == ("token",)
    with pytest.raises(ConfigError, match="clientAuthProviderFactoryClass=token needs exactly one of"):
        ClientConfig(client_auth_provider_factory_class="token")
    with pytest.raises(ConfigError, match="clientAuthProviderFactoryClass=tls needs TLS with a client certificate"):
        ClientConfig(client_auth_provider_factory_class="tls")
    token_file = tmp_path / "token"
    token_file.write_text(signer(secret).issue("app", ["client"]) + "\n")
    auth = client_auth(ClientConfig(client_auth_provider_factory_class="token", client_auth_token_file=str(token_file)))
    assert auth is not None and auth.plugin == "token" and auth.payload() == token_file.read_bytes().strip()
    with pytest.raises(SecurityError, match="cannot read clientAuthTokenFile"):
        client_auth(ClientConfig(client_auth_provider_factory_class="token",
                                 client_auth_token_file=str(tmp_path / "missing")))
    assert client_auth(ClientConfig()) is None


# ------------------------------------------------------------------------- on the wire: tls


def mutual_tls_bookie(p: Pki, roles: tuple[str, ...] = ("client", "bookie")) -> Bookie:
    return Bookie(ReloadingContext.for_server(server_settings(p)), BookieAuthenticator(["tls"], authorized_roles=roles))


def test_an_authorized_certificate_is_served(pki_set: Pki, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        bookie = mutual_tls_bookie(pki_set)
        await bookie.server.start()
        plain = BookieClient(tls=ReloadingContext.for_client(client_settings(pki_set, pki_set.client)))
        asking = BookieClient(tls=ReloadingContext.for_client(client_settings(pki_set, pki_set.client)),
                              auth=ClientAuth.certificate())
        try:
            assert await add_and_read(plain, bookie.bookie_id, 1) == entry(1, 0, b"authorized")
            assert await add_and_read(asking, bookie.bookie_id, 2) == entry(2, 0, b"authorized")
            identities = {c.identity for c in bookie.server._connections}
            assert identities == {Identity("alice", ("client",), "tls")}
        finally:
            await plain.close()
            await asking.close()
            await bookie.server.stop()

    with caplog.at_level(logging.INFO, logger=SERVER_LOG):
        run(main())
    assert "authenticated: principal 'alice' (tls, roles ['client'])" in caplog.text


@pytest.mark.parametrize("ask", [False, True], ids=["first-request", "auth-at-connect"])
def test_a_certificate_without_an_authorized_role_is_refused(
    pki_set: Pki, caplog: pytest.LogCaptureFixture, ask: bool
) -> None:
    async def main() -> None:
        bookie = mutual_tls_bookie(pki_set)
        await bookie.server.start()
        admin = BookieClient(tls=ReloadingContext.for_client(client_settings(pki_set, pki_set.admin)),
                             auth=ClientAuth.certificate() if ask else None)
        ok = BookieClient(tls=ReloadingContext.for_client(client_settings(pki_set, pki_set.client)))
        try:
            with pytest.raises(SecurityError, match=f"bookie {bookie.bookie_id} refused this client: .*principal "
                                                    r"'root' \(tls, roles \['admin'\]\) has none of the authorized "
                                                    r"roles \['client', 'bookie'\]"):
                await add_and_read(admin, bookie.bookie_id)
            assert bookie.memory.entries == {}
            assert await add_and_read(ok, bookie.bookie_id) == entry(1, 0, b"authorized")  # still serving
        finally:
            await admin.close()
            await ok.close()
            await bookie.server.stop()

    with caplog.at_level(logging.WARNING, logger=SERVER_LOG):
        run(main())
    assert "refused, closing the connection" in caplog.text and "('127.0.0.1'" in caplog.text


# ----------------------------------------------------------------------- on the wire: token


def token_bookie(secret: Path, p: Pki | None = None) -> Bookie:
    tls = ReloadingContext.for_server(server_settings(p, mutual=False)) if p else None
    return Bookie(tls, BookieAuthenticator(["token"], authorized_roles=["client"],
                                           token_verifier=TokenVerifier.from_secret_file(secret)))


def token_client(token: str, p: Pki | None = None) -> BookieClient:
    tls = ReloadingContext.for_client(client_settings(p, None)) if p else None
    return BookieClient(tls=tls, auth=ClientAuth.token(token=token))


@pytest.mark.parametrize("over_tls", [False, True], ids=["clear", "tls"])
def test_a_client_with_a_good_token_is_served(secret: Path, pki_set: Pki, over_tls: bool) -> None:
    p = pki_set if over_tls else None

    async def main() -> None:
        bookie = token_bookie(secret, p)
        await bookie.server.start()
        client = token_client(signer(secret).issue("app-1", ["client"]), p)
        try:
            assert await add_and_read(client, bookie.bookie_id) == entry(1, 0, b"authorized")
            (conn,) = bookie.server._connections
            assert conn.identity == Identity("app-1", ("client",), "token")
        finally:
            await client.close()
            await bookie.server.stop()

    run(main())


def bad_tokens(secret: Path, tmp_path: Path) -> dict[str, tuple[str, str]]:
    other = TokenSigner.from_secret_file(tokens.write_secret_file(tmp_path / "other"))
    past = dt.datetime.now(dt.UTC) - dt.timedelta(hours=2)
    return {
        "expired": (signer(secret).issue("app", ["client"], ttl_s=60, now=past), "token refused: expired at"),
        "foreign": (other.issue("app", ["client"]), "token refused: bad signature"),
        "garbage": ("not.a.token", "token refused: malformed"),
        "audience": (signer(secret).issue("app", ["client"], audience="pulsar"), "wrong audience 'pulsar'"),
        "role": (signer(secret).issue("app", ["reader"]), r"principal 'app' \(token, roles \['reader'\]\) has none"),
        "oversized": ("x" * 9000, "over the 8192-byte limit"),
    }


@pytest.mark.parametrize("kind", ["expired", "foreign", "garbage", "audience", "role", "oversized"])
def test_a_bad_token_is_refused_with_the_reason(
    secret: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    token, reason = bad_tokens(secret, tmp_path)[kind]

    async def main() -> None:
        bookie = token_bookie(secret)
        await bookie.server.start()
        client = token_client(token)
        good = token_client(signer(secret).issue("app-2", ["client"]))
        try:
            with pytest.raises(SecurityError, match=f"bookie {bookie.bookie_id} refused this client: authentication "
                                                    f"refused: .*{reason}"):
                await add_and_read(client, bookie.bookie_id)
            assert bookie.memory.entries == {}
            assert await add_and_read(good, bookie.bookie_id) == entry(1, 0, b"authorized")
        finally:
            await client.close()
            await good.close()
            await bookie.server.stop()

    with caplog.at_level(logging.WARNING, logger=SERVER_LOG):
        run(main())
    assert "AUTH from ('127.0.0.1'" in caplog.text and "refused, closing the connection" in caplog.text
    assert token[:40] not in caplog.text or kind in ("garbage", "oversized"), "a token in the log"


def test_operations_before_authenticating_get_a_notice_an_eua_and_a_close(
    secret: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> list[Any]:
        bookie = token_bookie(secret)
        await bookie.server.start()
        try:
            # the Vellum client without credentials: the notice becomes its error
            with pytest.raises(SecurityError, match="refused this client: request refused: not authenticated: this "
                                                    "bookie requires a token"):
                await add_and_read(BookieClient(), bookie.bookie_id)
            # a raw v2 client: notice, EUA for its ADD, then the connection closes
            reader, writer = await asyncio.open_connection("127.0.0.1", bookie.server.port)
            writer.write(encode(m.AddRequest(KEY, entry(5, 0, b"sneaky"))) + encode(m.ReadRequest(5, 0)))
            data = await asyncio.wait_for(reader.read(), 5)  # to EOF: the bookie closed
            await close(writer)
            assert bookie.memory.entries == {}
            return FrameDecoder(1 << 20, side="client").feed(data)
        finally:
            await bookie.server.stop()

    with caplog.at_level(logging.WARNING, logger=SERVER_LOG):
        got = run(main())
    assert got[0].request_id == m.AUTH_NOTICE_ID and got[0].status == EUA
    assert "not authenticated" in got[0].message
    assert got[1:] == [m.AddResponse(EUA, 5, 0)], "nothing after the refusal"
    assert "AddRequest from ('127.0.0.1'" in caplog.text


def test_auth_on_a_bookie_without_authentication_is_answered_eok() -> None:
    async def main() -> list[Any]:
        bookie = Bookie(None, None)
        await bookie.server.start()
        try:
            client = BookieClient(auth=ClientAuth.token(token="whatever"))
            assert await add_and_read(client, bookie.bookie_id) == entry(1, 0, b"authorized")
            await client.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", bookie.server.port)
            writer.write(encode(m.AuthRequest(3, "token", b"x")))
            got = FrameDecoder(1 << 20, side="client").feed(await reader.read(4096))
            await close(writer)
            return got
        finally:
            await bookie.server.stop()

    assert run(main()) == [m.AuthResponse(3, EOK, "authentication is off on this bookie")]


def test_token_and_tls_providers_together(secret: Path, pki_set: Pki) -> None:
    """A bookie with both providers serves a certificate with an authorized role, and a client
    whose certificate lacks one once it presents a good token."""

    async def main() -> None:
        auth = BookieAuthenticator(["tls", "token"], authorized_roles=["client"],
                                   token_verifier=TokenVerifier.from_secret_file(secret))
        bookie = Bookie(ReloadingContext.for_server(server_settings(pki_set)), auth)
        await bookie.server.start()
        admin_with_token = BookieClient(tls=ReloadingContext.for_client(client_settings(pki_set, pki_set.admin)),
                                        auth=ClientAuth.token(token=signer(secret).issue("ops", ["client"])))
        try:
            assert await add_and_read(admin_with_token, bookie.bookie_id) == entry(1, 0, b"authorized")
            (conn,) = bookie.server._connections
            assert conn.identity == Identity("ops", ("client",), "token") and conn.principal == "root"
        finally:
            await admin_with_token.close()
            await bookie.server.stop()

    run(main())


def test_a_client_config_with_tls_and_token_builds(secret: Path, pki_set: Pki, tmp_path: Path) -> None:
    token_file = tmp_path / "t"
    token_file.write_text(signer(secret).issue("x", ["client"]))
    cfg = ClientConfig(tls_provider_factory_class=TLS_CONTEXT_FACTORY, tls_trust_store=str(pki_set.ca.cert),
                       client_auth_provider_factory_class="token", client_auth_token_file=str(token_file))
    assert client_auth(cfg) is not None
