"""Where a bookie listens: ``advertisedAddress``, ``bookieBindAddress``, ``listeningInterface`` and
``httpServerHost`` (``server/listen.py``).

The real-process tests run a bookie and its client inside a network namespace the test creates
(``ip netns``; root needed, skipped where the kernel refuses) with a veth interface holding a
routable address: a bookie advertising that address must be reachable there, bookie port and
admin HTTP alike. Nothing leaves the namespace.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from vellum.config import ServerConfig
from vellum.errors import ConfigError
from vellum.meta import open_metadata_store
from vellum.server.listen import resolve_listen_addresses
from vellum.standalone import BookieProcessSpec, bookie_command, format_if_needed, write_bookie_conf
from vellum.testing.local_cluster import LocalCluster, free_port

ADDR = "10.213.7.1"  # on the namespace's veth only


# ------------------------------------------------------------------------------ resolution


def test_defaults_stay_on_loopback() -> None:
    a = resolve_listen_addresses(ServerConfig())
    assert (a.bind_host, a.advertised_host, a.http_host) == ("127.0.0.1", "127.0.0.1", "127.0.0.1")


def test_listening_interface_lo_binds_and_advertises_its_address() -> None:
    a = resolve_listen_addresses(ServerConfig(listening_interface="lo"))
    assert (a.bind_host, a.advertised_host, a.http_host) == ("127.0.0.1", "127.0.0.1", "127.0.0.1")


def test_unknown_interface_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"listeningInterface=nosuch0: no such network interface.*lo"):
        resolve_listen_addresses(ServerConfig(listening_interface="nosuch0"))


def test_loopback_bind_with_a_routable_advertised_address_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"bookieBindAddress=127.0.0.1 is a loopback address but "
                                          r"advertisedAddress=192.0.2.7 is not.*0.0.0.0"):
        resolve_listen_addresses(ServerConfig(advertised_address="192.0.2.7", bookie_bind_address="127.0.0.1"))


def test_an_advertised_address_of_another_host_needs_a_bind_address() -> None:
    with pytest.raises(ConfigError, match=r"advertisedAddress=192.0.2.7 is not an address of this host.*"
                                          r"bookieBindAddress"):
        resolve_listen_addresses(ServerConfig(advertised_address="192.0.2.7"))
    a = resolve_listen_addresses(ServerConfig(advertised_address="192.0.2.7", bookie_bind_address="0.0.0.0"))
    assert (a.bind_host, a.advertised_host, a.http_host) == ("0.0.0.0", "192.0.2.7", "0.0.0.0")


def test_listening_interface_lo_bookie_process_serves(tmp_path: Path) -> None:
    """BookKeeper's ``listeningInterface`` is honoured by a real bookie (here the loopback one)."""
    with LocalCluster(tmp_path / "c", bookies=1, bookie_conf={"listeningInterface": "lo"}) as c:
        assert c.registered()[0] == {c.bookie_ids[0]}
        assert c.http_get(0, "/api/v1/bookie/state")["readOnly"] is False
        assert "accepted, not used" not in c.log_text(0)  # honoured now, not listed as ignored


# ------------------------------------------------------------------------------ namespaces


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def netns() -> Iterator[str]:
    """A network namespace of this test with loopback up and a veth pair, ``v0`` holding ADDR."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    name = f"vellum-t{os.getpid()}-{time.monotonic_ns() % 10**6}"
    try:
        _ip("netns", "add", name)
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"cannot create a network namespace here: {e}")
    try:
        try:
            _ip("-n", name, "link", "set", "lo", "up")
            _ip("-n", name, "link", "add", "v0", "type", "veth", "peer", "name", "v1")
            _ip("-n", name, "addr", "add", f"{ADDR}/24", "dev", "v0")
            _ip("-n", name, "link", "set", "v0", "up")
            _ip("-n", name, "link", "set", "v1", "up")
        except subprocess.CalledProcessError as e:
            pytest.skip(f"the kernel refused a veth interface in a namespace: {e.stderr!r}")
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


@contextlib.contextmanager
def bookie_in(ns: str, base: Path, extra: dict[str, str]) -> Iterator[tuple[BookieProcessSpec, str]]:
    """One bookie process inside namespace ``ns`` (embedded store under ``base``); yields its
    spec and metadata URI once it says READY."""
    uri = f"sqlite:///{base / 'metadata.db'}"
    format_if_needed(uri)
    taken: set[int] = set()
    spec = BookieProcessSpec(0, free_port(taken), free_port(taken), base / "bookie-0", base / "bookie-0" / "b.conf",
                             {"journalMaxGroupWaitMSec": "1", **extra})
    write_bookie_conf(spec, uri)
    log = base / "bookie.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(["ip", "netns", "exec", ns, *bookie_command(spec.conf_file)], stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while "READY " not in log.read_text(errors="replace"):
            if proc.poll() is not None:
                raise AssertionError(f"bookie exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"bookie not ready:\n{log.read_text()[-3000:]}")
            time.sleep(0.1)
        yield spec, uri
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


CLIENT = """
import json, sys, urllib.request
from vellum.client.blocking import BookKeeper
from vellum.config import ClientConfig
uri, http = sys.argv[1], sys.argv[2]
cfg = ClientConfig(metadata_service_uri=uri, add_entry_timeout_s=5, read_entry_timeout_s=5)
with BookKeeper(uri, config=cfg) as bk:
    lh = bk.create_ledger(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1, password=b"pw")
    lh.append(b"across the namespace's own address")
    lh.close()
    ensemble = list(lh.metadata.ensembles[0])
    rh = bk.open_ledger(lh.ledger_id, password=b"pw")
    got = [bytes(e.payload) for e in rh.read(0, 0)]
    rh.close()
with urllib.request.urlopen(http + "/api/v1/bookie/state", timeout=10) as r:
    state = json.loads(r.read())
print(json.dumps({"ensemble": ensemble, "read": [g.decode() for g in got], "readOnly": state["readOnly"]}))
"""


def run_client(ns: str, uri: str, http: str) -> dict[str, object]:
    """The client runs in the namespace too: it can only reach the bookie at ADDR."""
    out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", CLIENT, uri, http],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("how", ["advertisedAddress", "listeningInterface"])
def test_bookie_with_a_routable_address_is_reachable_there(tmp_path: Path, netns: str, how: str) -> None:
    extra = {"advertisedAddress": ADDR} if how == "advertisedAddress" else {"listeningInterface": "v0"}
    with bookie_in(netns, tmp_path, extra) as (spec, uri):
        bookie_id = f"{ADDR}:{spec.port}"
        with open_metadata_store(uri) as store:
            assert store.registration.list_bookies() == {bookie_id}
            info = json.loads(store.registration.get_bookie_data(bookie_id) or b"{}")
        assert info["httpAddress"] == f"http://{ADDR}:{spec.http_port}"
        result = run_client(netns, uri, info["httpAddress"])
        assert result == {"ensemble": [bookie_id], "read": ["across the namespace's own address"], "readOnly": False}
