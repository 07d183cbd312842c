"""The pieces the many-hosts test stands on, alone: the shipped systemd units parse into the
command lines ``docs/deployment.md`` names, and the link proxy delays, keeps order and drops
(``vellum.testing.units``, ``vellum.testing.delay_proxy``). Loopback only."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from vellum.testing.delay_proxy import DelayProxy, LinkModel, Route
from vellum.testing.units import Unit, map_path

UNITS = Path(__file__).resolve().parents[2] / "deploy" / "systemd"
MAP = {"/etc/vellum": "/h/etc/vellum", "/var/lib/vellum": "/h/var/lib/vellum"}
VELLUM = ["python", "-m", "vellum.cli.main"]


def test_every_unit_runs_the_installed_vellum_or_java_with_files_under_etc_vellum() -> None:
    names = sorted(p.name for p in UNITS.glob("*.service"))
    assert names == ["vellum-autorecovery.service", "vellum-bookie.service", "vellum-console.service",
                     "vellum-zookeeper.service"]
    assert Unit.read(UNITS / "vellum-bookie.service").exec_start(MAP) == [
        "/opt/vellum/bin/vellum", "bookie", "--conf", "/h/etc/vellum/bk_server.conf"]
    assert Unit.read(UNITS / "vellum-autorecovery.service").exec_start(MAP, executables={
        "/opt/vellum/bin/vellum": VELLUM}) == [*VELLUM, "autorecovery", "--conf", "/h/etc/vellum/bk_server.conf"]
    zk = Unit.read(UNITS / "vellum-zookeeper.service").exec_start(MAP)
    assert zk[0] == "/usr/bin/java" and zk[-1] == "/h/etc/vellum/zookeeper/zoo.cfg"
    assert "-Dlog4j.configuration=file:/h/etc/vellum/zookeeper/log4j.properties" in zk
    assert "org.apache.zookeeper.server.quorum.QuorumPeerMain" in zk


def test_the_console_unit_takes_its_variables_from_its_environment_file(tmp_path: Path) -> None:
    etc = tmp_path / "etc/vellum"
    etc.mkdir(parents=True)
    unit = Unit.read(UNITS / "vellum-console.service")
    with pytest.raises(FileNotFoundError, match="EnvironmentFile"):
        unit.exec_start({"/etc/vellum": str(etc)})
    (etc / "vellum.env").write_text("# the cluster\nVELLUM_METADATA_URI=zk://10.0.0.1:2181/ledgers\n")
    with pytest.raises(ValueError, match=r"\$VELLUM_CONSOLE_NAME"):
        unit.exec_start({"/etc/vellum": str(etc)})
    (etc / "vellum.env").write_text("VELLUM_METADATA_URI=zk://10.0.0.1:2181/ledgers\nVELLUM_CONSOLE_NAME=ops1\n")
    argv = unit.exec_start({"/etc/vellum": str(etc)}, executables={"/opt/vellum/bin/vellum": VELLUM})
    assert argv[:4] == [*VELLUM, "console"]
    assert argv[argv.index("--metadata") + 1] == "zk://10.0.0.1:2181/ledgers"
    assert argv[argv.index("--public-name") + 1] == "ops1"
    assert argv[argv.index("--client-conf") + 1] == f"{etc}/client.conf"


def test_map_path_maps_prefixes_only() -> None:
    assert map_path("/etc/vellum/tls/ca.cert.pem", MAP) == "/h/etc/vellum/tls/ca.cert.pem"
    assert map_path("/etc/vellumx", MAP) == "/etc/vellumx"
    assert map_path("-Dx=file:/etc/vellum/a", MAP) == "-Dx=file:/h/etc/vellum/a"
    assert map_path("/usr/share/java/a.jar:/etc/vellum/b", MAP) == "/usr/share/java/a.jar:/h/etc/vellum/b"
    assert map_path("zk://10.0.0.1:2181/ledgers", MAP) == "zk://10.0.0.1:2181/ledgers"


async def _echo_server() -> tuple[asyncio.Server, int]:
    async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(4096):
                w.write(data)
                await w.drain()
        except ConnectionError:
            pass
        w.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def test_the_link_proxy_delays_each_way_and_keeps_the_byte_order() -> None:
    async def main() -> tuple[bytes, float]:
        server, port = await _echo_server()
        proxy = DelayProxy([Route("127.0.0.1", 0, "127.0.0.1", port)], LinkModel(delay_ms=30, jitter_ms=25), seed=3)
        await proxy.start()
        pport = proxy._servers[0].sockets[0].getsockname()[1]
        r, w = await asyncio.open_connection("127.0.0.1", pport)
        sent = b"".join(b"%d," % i for i in range(200))
        t = time.monotonic()
        for i in range(200):  # many small chunks, each with its own jitter
            w.write(b"%d," % i)
            await w.drain()
            await asyncio.sleep(0)
        got = await asyncio.wait_for(r.readexactly(len(sent)), 30)
        elapsed = time.monotonic() - t
        w.close()
        await proxy.stop()
        server.close()
        return got, elapsed

    got, elapsed = asyncio.run(main())
    assert got == b"".join(b"%d," % i for i in range(200))
    assert elapsed >= 2 * 0.005  # at least the minimum delay (30 - 25 ms) in each direction


def test_the_link_proxy_resets_connections_after_their_lifetime() -> None:
    async def main() -> tuple[type[BaseException] | None, int]:
        server, port = await _echo_server()
        proxy = DelayProxy([Route("127.0.0.1", 0, "127.0.0.1", port)], LinkModel(1, 0, drop_mean_s=0.2), seed=1)
        await proxy.start()
        pport = proxy._servers[0].sockets[0].getsockname()[1]
        r, w = await asyncio.open_connection("127.0.0.1", pport)
        error: type[BaseException] | None = None
        try:
            for _ in range(200):  # bounded: 10 s at most; the mean lifetime is 0.2 s
                w.write(b"x")
                await w.drain()
                if await asyncio.wait_for(r.read(1), 5) == b"":
                    break
                await asyncio.sleep(0.05)
        except (ConnectionError, OSError) as e:
            error = type(e)
        w.close()
        drops = proxy.drops
        await proxy.stop()
        server.close()
        return error, drops

    error, drops = asyncio.run(main())
    assert drops == 1
    assert error is not None and issubclass(error, ConnectionError)


def test_a_link_model_with_more_jitter_than_delay_is_refused() -> None:
    with pytest.raises(ValueError, match=r"jitter_ms=3 exceeds delay_ms=2"):
        LinkModel(delay_ms=2, jitter_ms=3)
    with pytest.raises(ValueError, match="LISTEN_HOST:PORT=TARGET_HOST:PORT"):
        Route.parse("10.0.0.1:3181")
