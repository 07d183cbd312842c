"""The client settings of the commands that talk to a cluster: ``vellum shell --client-conf FILE
...`` and ``vellum spark --client-conf FILE ...`` (or ``$VELLUM_CLIENT_CONF``), a ``key=value``
file with BookKeeper's client keys, e.g. the TLS keys (``tlsProviderFactoryClass``,
``tlsTrustStore``, ``tlsCertificatePath``, ``tlsKeyStore``), the token ones
(``clientAuthProviderFactoryClass=token``, ``clientAuthTokenFile``) and the ZooKeeper identity
(``zkEnableSecurity``, ``zkDigestAuthFile``) and TLS to ZooKeeper (``zkTlsEnabled``,
``zkTlsTrustStore``, ``zkTlsCertificatePath``, ``zkTlsKeyStore``). ``vellum standalone --tls``
writes one.

One definition: ``client_conf_option`` puts the flag (and its environment variable) on a command
group; every verb below it reads the settings with ``shell_client_config()`` (commands that open a
client, a Spark job that ships them to its tasks) or ``open_shell_store(uri)`` (commands that open
the metadata store directly: the ZooKeeper identity and TLS of that file).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import click

from vellum.client.metadata_security import open_configured_store
from vellum.config import DEFAULT_METADATA_URI, ClientConfig, load_client_config
from vellum.meta import MetadataStore
from vellum.security.admin_http_client import AdminHttpAccess, AdminHttpCallError

ENV = "VELLUM_CLIENT_CONF"
_OBJ_KEY = "client_conf"


def metadata_uri_option(help: str = "metadata service URI") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--uri`` of the shell verbs that open the metadata store or a client on it: default
    ``$VELLUM_METADATA_URI``, else the standalone store."""
    return click.option(
        "--uri",
        default=lambda: os.environ.get("VELLUM_METADATA_URI") or DEFAULT_METADATA_URI,
        show_default="$VELLUM_METADATA_URI or " + DEFAULT_METADATA_URI,
        help=help,
    )


def client_conf_flag(purpose: str = "for commands that talk to bookies or the metadata store"
                     ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The ``--client-conf FILE`` flag itself (default ``$VELLUM_CLIENT_CONF``): the command
    gets ``client_conf: str | None``. Commands that are not under ``vellum shell`` / ``vellum
    spark`` (``vellum console``, ``vellum bench``) put it on themselves and load the file with
    ``load_client_config_file``."""
    return click.option(
        "--client-conf", type=click.Path(dir_okay=False, exists=True), envvar=ENV, default=None,
        help=f"client settings (TLS, token, ZooKeeper identity) {purpose}; default ${ENV}")


def load_client_config_file(path: str | None) -> ClientConfig:
    """The settings of a ``--client-conf`` file; the defaults when none is given."""
    return load_client_config(path) if path else ClientConfig()


def client_conf_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--client-conf FILE`` (default ``$VELLUM_CLIENT_CONF``) on a command group (put it below
    ``@group.group()`` / ``@cli.group()``): the path is kept in the click context for
    ``shell_client_config()``; the group function itself does not see it."""

    @functools.wraps(fn)
    def wrapper(*args: Any, client_conf: str | None, **kwargs: Any) -> Any:
        click.get_current_context().ensure_object(dict)[_OBJ_KEY] = client_conf
        return fn(*args, **kwargs)

    return client_conf_flag()(wrapper)


def shell_client_config() -> ClientConfig | None:
    """The ``--client-conf`` file given to the command's group (``vellum shell``, ``vellum
    spark``; else ``$VELLUM_CLIENT_CONF``), loaded; ``None`` when neither is set."""
    path = None
    ctx = click.get_current_context(silent=True)
    while ctx is not None and path is None:
        if isinstance(ctx.obj, dict):
            path = ctx.obj.get(_OBJ_KEY)
        ctx = ctx.parent
    path = path or os.environ.get(ENV)
    return load_client_config(path) if path else None


def open_shell_store(uri: str) -> MetadataStore:
    """The metadata store ``uri``, with the ZooKeeper identity and TLS of the shell's client settings."""
    return open_configured_store(uri, shell_client_config() or ClientConfig())


def admin_http_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--admin-token-file`` and ``--http-ca-file`` (or ``$VELLUM_ADMIN_TOKEN_FILE``,
    ``$VELLUM_HTTP_CA_FILE``) for commands that call bookies' admin HTTP API; the command gets
    ``access: AdminHttpAccess`` instead. Put it below ``@click.command``."""

    @functools.wraps(fn)
    def wrapper(*args: Any, admin_token_file: str | None, http_ca_file: str | None, **kwargs: Any) -> Any:
        try:
            access = AdminHttpAccess.from_files(admin_token_file, http_ca_file)
        except AdminHttpCallError as e:
            raise click.ClickException(str(e)) from None
        return fn(*args, access=access, **kwargs)

    with_ca = click.option(
        "--http-ca-file", envvar="VELLUM_HTTP_CA_FILE", type=click.Path(dir_okay=False), default=None,
        help="CA certificate(s), PEM, of bookies whose admin API is https (httpServerTlsEnable)")(wrapper)
    return click.option(
        "--admin-token-file", envvar="VELLUM_ADMIN_TOKEN_FILE", type=click.Path(dir_okay=False), default=None,
        help="a token for the bookies' admin API (`vellum security issue-token --subject ops --role admin`): "
             "needed when the bookies check tokens")(with_ca)
