"""``vellum standalone --tls`` (the ``Standalone`` supervisor with ``tls=True``), and the ways
clients reach a secured cluster: ``vellum shell --client-conf`` and the Spark source/sink's
``bookkeeper.*`` options.

A secured standalone makes its CA and certificates once (a restart keeps them), serves mutual
TLS only, writes a client configuration that works as printed, refuses a plaintext client, and
its admin HTTP (https) needs the admin token it wrote."""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from vellum.cli.main import cli
from vellum.client.blocking import BookKeeper
from vellum.config import ClientConfig, load_client_config
from vellum.errors import SecurityError
from vellum.spark.connection import client_config as spark_client_config
from vellum.standalone import Standalone
from vellum.testing.local_cluster import free_port


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    cluster = Standalone(tmp_path_factory.mktemp("standalone"), bookies=1, port_base=free_port(),
                         http_port_base=free_port(), tls=True)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def test_the_printed_client_configuration_connects(standalone: Standalone) -> None:
    sec = standalone.security
    assert sec is not None
    assert sec.bookie.key.stat().st_mode & 0o777 == 0o600 and sec.admin_token.stat().st_mode & 0o777 == 0o600
    config = load_client_config(sec.client_conf, ensembleSize=1, writeQuorumSize=1, ackQuorumSize=1)
    with BookKeeper(standalone.metadata_uri, config=config) as bk:
        lh = bk.create_ledger()
        lh.append(b"secured standalone")
        lh.close()
        assert [e.payload for e in bk.open_ledger(lh.ledger_id).read(0, 0)] == [b"secured standalone"]
    plain = ClientConfig(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1)
    with BookKeeper(standalone.metadata_uri, config=plain) as bk:
        lh = bk.create_ledger()
        with pytest.raises(SecurityError, match="requires TLS"):
            lh.append(b"in clear")


def test_the_shell_takes_a_client_configuration(standalone: Standalone) -> None:
    sec = standalone.security
    assert sec is not None
    args = ["simpletest", "--uri", standalone.metadata_uri, "-e", "1", "-w", "1", "-a", "1", "-n", "5", "--json"]
    ok = CliRunner().invoke(cli, ["shell", "--client-conf", str(sec.client_conf), *args])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output)["entriesVerified"] == 5
    refused = CliRunner().invoke(cli, ["shell", *args], env={"VELLUM_CLIENT_CONF": ""})
    said = refused.output + ("" if isinstance(refused.exception, SystemExit) else str(refused.exception))
    assert refused.exit_code != 0 and "requires TLS" in said, said


def test_bench_and_console_take_the_client_configuration(standalone: Standalone,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """`vellum bench` and `vellum console` read the same client settings as the shell: the
    --client-conf flag or $VELLUM_CLIENT_CONF."""
    sec = standalone.security
    assert sec is not None
    args = ["bench", "--uri", standalone.metadata_uri, "-e", "1", "-w", "1", "-a", "1", "-n", "20", "-t", "20",
            "--json"]
    ok = CliRunner().invoke(cli, [*args, "--client-conf", str(sec.client_conf)], env={"VELLUM_CLIENT_CONF": ""})
    assert ok.exit_code == 0, ok.output
    report = json.loads(ok.output[ok.output.index("{"):])
    assert (report["entries"], report["errors"]) == (20, 0), report
    by_env = CliRunner().invoke(cli, args, env={"VELLUM_CLIENT_CONF": str(sec.client_conf)})
    assert by_env.exit_code == 0, by_env.output
    refused = CliRunner().invoke(cli, args, env={"VELLUM_CLIENT_CONF": ""})
    assert refused.exit_code != 0
    assert "vellum bench against" in refused.output and "requires TLS" in refused.output, refused.output

    import vellum.console.server as console_server

    seen = []
    monkeypatch.setattr(console_server, "run_console", lambda settings, **_kw: seen.append(settings) or 0)
    served = CliRunner().invoke(cli, ["console", "--metadata", standalone.metadata_uri, "--port", "0"],
                                env={"VELLUM_CLIENT_CONF": str(sec.client_conf)})
    assert served.exit_code == 0, served.output
    assert seen[0].client_config.tls_enabled and seen[0].client_config.tls_trust_store == str(sec.ca)


def test_spark_options_pass_the_tls_keys_through(standalone: Standalone) -> None:
    sec = standalone.security
    assert sec is not None
    # Spark lower-cases option keys: bookkeeper.tlsTrustStore arrives as tlstruststore
    options = tuple((k.lower(), v) for k, v in sec.client_keys().items())
    config = spark_client_config(standalone.metadata_uri, options)
    assert config.tls_enabled and config.tls_trust_store == str(sec.ca)
    assert config.client_auth_provider_factory_class == "tls"


def test_the_admin_http_needs_the_admin_token_it_wrote(standalone: Standalone) -> None:
    sec = standalone.security
    assert sec is not None
    ctx = ssl.create_default_context(cafile=str(sec.ca))
    ctx.check_hostname = False
    url = f"https://127.0.0.1:{standalone.specs[0].http_port}/api/v1/bookie/gc"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(urllib.request.Request(url, data=b"", method="PUT"), timeout=10, context=ctx)
    assert refused.value.code == 401
    refused.value.close()
    req = urllib.request.Request(url, data=b"", method="PUT",
                                 headers={"Authorization": f"Bearer {sec.admin_token.read_text().strip()}"})
    with urllib.request.urlopen(req, timeout=10, context=ctx) as resp:
        assert resp.status == 200


def test_the_printed_curl_line_works_and_keeps_the_token_out_of_ps(
        standalone: Standalone, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The admin HTTP example `vellum standalone --tls` prints, run as printed (through a shell,
    with a `curl` that records its argv before running the real one): it forces a GC, and the
    token is in no argv, where every local user could read it in `ps`."""
    from vellum.cli.cmd_run import _say_how_to_connect_securely

    sec = standalone.security
    assert sec is not None
    real_curl = shutil.which("curl")
    if real_curl is None:
        pytest.skip("curl is not installed")
    _say_how_to_connect_securely(standalone.metadata_uri, sec, standalone.specs[0].http_port, "")
    line = next(x.strip() for x in capsys.readouterr().out.splitlines() if x.strip().startswith("curl "))
    fake = tmp_path / "bin"
    fake.mkdir()
    argv_file = tmp_path / "argv"
    (fake / "curl").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {argv_file}\nexec {real_curl} "$@"\n')
    (fake / "curl").chmod(0o755)
    result = subprocess.run(["bash", "-c", line + " -sS --fail"], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PATH": f"{fake}:{os.environ.get('PATH', '')}"})
    assert result.returncode == 0 and "Triggered GC" in result.stdout, (line, result.stdout, result.stderr)
    token = sec.admin_token.read_text().strip()
    assert argv_file.read_text() and token not in argv_file.read_text()
    assert sec.admin_header.stat().st_mode & 0o077 == 0  # like the token file: the owner's alone


def test_a_restart_keeps_the_certificates(tmp_path: Path) -> None:
    from vellum.standalone import StandaloneSecurity

    first = StandaloneSecurity.prepare(tmp_path, "sqlite:///x.db")
    ca = first.ca.read_bytes()
    second = StandaloneSecurity.prepare(tmp_path, "sqlite:///x.db")
    assert second.ca.read_bytes() == ca and second.bookie.cert.exists()
    assert "metadataServiceUri=sqlite:///x.db" in second.client_conf.read_text()
