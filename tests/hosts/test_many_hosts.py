"""Many hosts: a secured cluster across network namespaces, through slow and lossy links.

The test builds a LAN (``vellum.testing.netns``: a bridge in a namespace of its own, nothing in
the test's own namespace) with seven hosts, each a network namespace with one address:

- ``h1``..``h5`` (10.77.0.11-15): a bookie each; ``h1``..``h3`` also a ZooKeeper server (a
  three-server ensemble, Debian's ``zookeeper``);
- ``ops`` (10.77.0.101): AutoRecovery and the operator console;
- ``cli`` (10.77.0.100): the client (``tests/hosts/client_job.py``).

Every process is started from the units in ``deploy/systemd/`` (``vellum.testing.units``: the
unit's ``ExecStart`` with ``/etc/vellum`` and ``/var/lib/vellum`` mapped to the host's
directories), with the configuration ``docs/deployment.md`` describes: TLS with certificates
from ``vellum security`` (mutual, IP SANs of each host), token and certificate authentication,
https admin API.

The links: each bookie host runs ``vellum.testing.delay_proxy`` on its advertised address
(the bookie itself binds a second address of that host behind it), so every connection to a
bookie, from the client, AutoRecovery or another bookie, pays 2 ms +- 1 ms each way and is
reset after a random lifetime (mean ``DROP_MEAN_S``), as a real network would do it.

Scenario: write E=5/WQ=3/AQ=2 and E=3/WQ=3/AQ=2 ledgers on the whole cluster; then keep writing
E=3 ledgers while host h5 dies (every process SIGKILLed), h4 is partitioned (its ``eth0`` down
until its ZooKeeper session expires) and plugged back, and h3 gets a rolling restart (its units
stopped with SIGTERM and started again, the recovery delay raised meanwhile). Every
acknowledged entry is read back from the client host and compared; AutoRecovery replaces h5
in every E=3 ledger and, through the auditor's ledger check, copies the entries a failed
bookie never got (acknowledged by AQ=2 before the ensemble change), and marks the E=5 ones (no
sixth bookie can take h5's place); everything is read back again; the console, reached from the
client host, lists the live bookies.

Part of the default suite. Skipped when the kernel refuses namespaces (a failure under
``CI=true``). Time ~60 s on a quiet machine, ~85-100 s on two loaded cores. ``VELLUM_MANY_HOSTS_SPARK=1`` adds a Spark job on an eighth host (``spk``,
10.77.0.102): ``vellum spark replica-check`` over the E=3 ledgers must find every copy (without
the ledger check above it reports the missing ones). ``VELLUM_MANY_HOSTS_LONG=1`` writes more
for longer, Spark included. ``VELLUM_MANY_HOSTS_PLANT_AQ1=1`` is the negative control: ledgers
written with WQ=AQ=1 (one copy), so killing h5 loses entries and the read-back check must fail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.cookiejar import CookieJar
from pathlib import Path
from typing import Any

import pytest

from vellum.meta import open_metadata_store
from vellum.testing import netns
from vellum.testing.units import Unit, map_path
from vellum.testing.zookeeper import missing_reason

REPO = Path(__file__).resolve().parents[2]
UNITS = REPO / "deploy" / "systemd"
CLIENT_JOB = Path(__file__).with_name("client_job.py")

LONG = os.environ.get("VELLUM_MANY_HOSTS_LONG") == "1"
PLANT_AQ1 = os.environ.get("VELLUM_MANY_HOSTS_PLANT_AQ1") == "1"
SPARK = LONG or os.environ.get("VELLUM_MANY_HOSTS_SPARK") == "1"

BOOKIE_HOSTS = {f"h{i}": f"10.77.0.1{i}" for i in range(1, 6)}
ZK_HOSTS = ("h1", "h2", "h3")
OPS, CLI, SPK = ("ops", "10.77.0.101"), ("cli", "10.77.0.100"), ("spk", "10.77.0.102")
BOOKIE_PORT, HTTP_PORT, ZK_PORT, CONSOLE_PORT = 3181, 8080, 2181, 8090
ZK_URI = "zk+hierarchical://" + ",".join(f"{BOOKIE_HOSTS[h]}:{ZK_PORT}" for h in ZK_HOSTS) + "/ledgers"
DROP_MEAN_S = 15.0
ZK_TIMEOUT_MS = 6000
VELLUM = [sys.executable, "-m", "vellum.cli.main"]  # /opt/vellum/bin/vellum of this checkout


def _require(ok: bool, reason: str) -> None:
    if ok:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true: {reason}", pytrace=False)
    pytest.skip(reason)


def private(address: str) -> str:
    """Where a bookie binds behind its host's link proxy (on the host's ``lo``)."""
    return address.replace("10.77.0.", "10.77.1.")


# ------------------------------------------------------------------------------ configuration
# The files of docs/deployment.md, with the paths of an installed host; the test maps
# /etc/vellum and /var/lib/vellum to each host's directories.


def zoo_cfg(my_id: int) -> dict[str, str]:
    return {
        "tickTime": "1000", "initLimit": "10", "syncLimit": "5",
        "dataDir": "/var/lib/vellum/zookeeper",
        "clientPort": str(ZK_PORT),
        "clientPortAddress": BOOKIE_HOSTS[ZK_HOSTS[my_id - 1]],
        "maxClientCnxns": "0", "admin.enableServer": "false", "4lw.commands.whitelist": "ruok,srvr",
        "autopurge.snapRetainCount": "3", "autopurge.purgeInterval": "24",
        **{f"server.{i}": f"{BOOKIE_HOSTS[h]}:2888:3888" for i, h in enumerate(ZK_HOSTS, 1)},
    }


def bk_server_conf(address: str, name: str, *, proxied: bool) -> dict[str, str]:
    conf = {
        "metadataServiceUri": ZK_URI,
        "zkTimeout": str(ZK_TIMEOUT_MS),
        "advertisedAddress": address,
        "bookiePort": str(BOOKIE_PORT),
        "journalDirectories": "/var/lib/vellum/journal",
        "ledgerDirectories": "/var/lib/vellum/ledgers",
        "tlsProviderFactoryClass": "org.apache.bookkeeper.tls.TLSContextFactory",
        "tlsKeyStoreType": "PEM",
        "tlsKeyStore": f"/etc/vellum/tls/{name}.key.pem",
        "tlsCertificatePath": f"/etc/vellum/tls/{name}.cert.pem",
        "tlsTrustStoreType": "PEM",
        "tlsTrustStore": "/etc/vellum/tls/ca.cert.pem",
        "tlsClientAuthentication": "true",
        "tlsCertFilesRefreshDurationSeconds": "60",
        "bookieAuthProviderFactoryClass": "tls,token",
        "authorizedRoles": "client,bookie,admin",
        "tokenSecretKeyFile": "/etc/vellum/token-secret",
        "httpServerEnabled": "true",
        "httpServerPort": str(HTTP_PORT),
        "httpServerTlsEnable": "true",
        "httpServerKeyStorePath": f"/etc/vellum/tls/{name}.key.pem",
        "httpServerCertificatePath": f"/etc/vellum/tls/{name}.cert.pem",
        "autoRecoveryDaemonEnabled": "false",
        "lostBookieRecoveryDelay": "0",
        "rwRereplicateBackoffMs": "1000",
        "openLedgerRereplicationGracePeriod": "5000",
    }
    if proxied:  # test only: the link proxy holds address:3181, the bookie binds behind it
        conf["bookieBindAddress"] = private(address)
        conf["httpServerHost"] = address
    return conf


def client_conf(name: str) -> dict[str, str]:
    return {
        "metadataServiceUri": ZK_URI,
        "zkTimeout": str(ZK_TIMEOUT_MS),
        "tlsProviderFactoryClass": "org.apache.bookkeeper.tls.TLSContextFactory",
        "tlsTrustStore": "/etc/vellum/tls/ca.cert.pem",
        "tlsCertificatePath": f"/etc/vellum/tls/{name}.cert.pem",
        "tlsKeyStore": f"/etc/vellum/tls/{name}.key.pem",
        "clientAuthProviderFactoryClass": "tls",
        "addEntryTimeoutSec": "3",
        "readEntryTimeoutSec": "3",
    }


# ------------------------------------------------------------------------------ hosts


@dataclass
class Machine:
    """One host of the LAN with its file system root and the units running on it."""

    host: netns.Host
    root: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def path_map(self) -> dict[str, str]:
        return {"/etc/vellum": str(self.root / "etc/vellum"), "/var/lib/vellum": str(self.root / "var/lib/vellum")}

    def etc(self, rel: str) -> Path:
        return self.root / "etc/vellum" / rel

    def log(self, service: str) -> Path:
        return self.root / "var/log/vellum" / f"{service}.log"

    def write_conf(self, rel: str, values: dict[str, str]) -> Path:
        path = self.etc(rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"{k}={map_path(v, self.path_map)}\n" for k, v in values.items()))
        return path

    def start_unit(self, unit: str, ready: str | None = None, timeout_s: float = 90.0) -> None:
        """Run ``deploy/systemd/<unit>.service``'s ExecStart here (output to its log file);
        with ``ready``, wait for that text in the log."""
        argv = Unit.read(UNITS / f"{unit}.service").exec_start(self.path_map,
                                                               executables={"/opt/vellum/bin/vellum": VELLUM})
        self.start(unit, argv, ready, timeout_s)

    def start(self, name: str, argv: list[str], ready: str | None = None, timeout_s: float = 90.0) -> None:
        log = self.log(name)
        log.parent.mkdir(parents=True, exist_ok=True)
        offset = log.stat().st_size if log.exists() else 0
        with open(log, "ab") as out:
            self.procs[name] = self.host.popen(argv, log=out)
        if ready is not None:
            self.wait_log(name, ready, timeout_s, offset)

    def wait_log(self, name: str, text: str, timeout_s: float, offset: int = 0) -> None:
        log, proc = self.log(name), self.procs[name]
        deadline = time.monotonic() + timeout_s
        while text not in log.read_bytes()[offset:].decode(errors="replace"):
            if proc.poll() is not None:
                raise AssertionError(f"{name} on {self.host.name} exited with {proc.returncode}:\n{self.tail(name)}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} on {self.host.name}: no {text!r} in {timeout_s}s:\n{self.tail(name)}")
            time.sleep(0.2)

    def tail(self, name: str, n: int = 3000) -> str:
        log = self.log(name)
        return log.read_text(errors="replace")[-n:] if log.exists() else "(no log)"

    def crash(self) -> None:
        """The host dies: every process in it SIGKILLed at once."""
        self.host.kill_all()
        for proc in self.procs.values():
            proc.wait(30)
        self.procs.clear()

    def stop_unit(self, name: str, timeout_s: float = 60.0) -> None:
        """systemctl stop: SIGTERM (KillSignal), then wait."""
        proc = self.procs.pop(name)
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)
                raise AssertionError(f"{name} on {self.host.name} did not stop on SIGTERM in {timeout_s}s") from None


def wait_until(what: str, predicate: Callable[[], bool], timeout_s: float, diagnose: Callable[[], str] = str,
               ) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s}s\n{diagnose()}")
        time.sleep(0.5)


@pytest.fixture
def lan() -> Iterator[netns.Lan]:
    _require(shutil.which("ip") is not None, "the ip command (iproute2) is missing")
    reason = netns.unavailable_reason()
    _require(reason is None, f"many-hosts test: {reason}")
    zk_reason = missing_reason()
    _require(zk_reason is None, f"many-hosts test: {zk_reason}")
    with netns.Lan() as network:
        yield network


def vellum_cli(*args: str, cwd: Path) -> str:
    out = subprocess.run([*VELLUM, *args], capture_output=True, text=True, timeout=120, cwd=cwd)
    assert out.returncode == 0, f"vellum {' '.join(args)}: {out.stderr[-2000:]}"
    return out.stdout


def make_pki(work: Path, machines: dict[str, Machine]) -> None:
    """``vellum security`` as docs/deployment.md runs it: one CA, a certificate per host with
    its address, a client one, the token secret and an admin token; copied to each host's
    /etc/vellum/tls."""
    vellum_cli("security", "create-ca", "--dir", "ca", "--name", "Many hosts CA", cwd=work)
    for name, m in machines.items():
        role = "client" if name in (CLI[0], SPK[0]) else "bookie"
        vellum_cli("security", "issue-cert", "--ca-dir", "ca", "--role", role, "--name", name,
                   "--ip", m.host.address, "--dns", name, "--out", f"certs/{name}", cwd=work)
    vellum_cli("security", "create-secret", "--out", "token-secret", cwd=work)
    token = vellum_cli("security", "issue-token", "--secret-file", "token-secret", "--subject", "operator",
                       "--role", "admin", "--ttl", "1h", "--for", "admin", cwd=work).strip()
    for name, m in machines.items():
        tls = m.etc("tls")
        tls.mkdir(parents=True)
        for src, dst in ((f"certs/{name}/{name}.cert.pem", f"{name}.cert.pem"),
                         (f"certs/{name}/{name}.key.pem", f"{name}.key.pem"), ("ca/ca.cert.pem", "ca.cert.pem")):
            shutil.copy(work / src, tls / dst)
        if name == OPS[0] or name in BOOKIE_HOSTS:
            shutil.copy(work / "token-secret", m.etc("token-secret"))
        if name == OPS[0]:
            m.etc("admin.token").write_text(token + "\n")


# ------------------------------------------------------------------------------ the test


@pytest.mark.zk
@pytest.mark.timeout(1200 if LONG or SPARK else 300)
def test_a_secured_cluster_on_five_hosts_keeps_every_acknowledged_entry(lan: netns.Lan, tmp_path: Path) -> None:
    t0 = time.monotonic()
    machines: dict[str, Machine] = {}
    if SPARK:
        _require(_pyspark_missing() is None, f"many-hosts Spark job: {_pyspark_missing()}")
    for name, addr in [*BOOKIE_HOSTS.items(), OPS, CLI, *([SPK] if SPARK else [])]:
        machines[name] = Machine(lan.add_host(name, addr), tmp_path / "hosts" / name)
    for name in BOOKIE_HOSTS:
        machines[name].host.add_local_address(private(BOOKIE_HOSTS[name]))
    work = tmp_path / "admin"
    work.mkdir()
    make_pki(work, machines)
    ops, cli = machines[OPS[0]], machines[CLI[0]]

    def diagnose() -> str:
        return "\n".join(f"--- {m.host.name} {svc}:\n{m.tail(svc, 1500)}" for m in machines.values() for svc in m.procs)

    try:
        # ZooKeeper ensemble on h1..h3, from vellum-zookeeper.service
        for my_id, name in enumerate(ZK_HOSTS, 1):
            m = machines[name]
            m.write_conf("zookeeper/zoo.cfg", zoo_cfg(my_id))
            shutil.copy(REPO / "deploy" / "zookeeper" / "log4j.properties", m.etc("zookeeper/log4j.properties"))
            data = m.root / "var/lib/vellum/zookeeper"
            data.mkdir(parents=True)
            (data / "myid").write_text(f"{my_id}\n")
            m.start_unit("vellum-zookeeper")
        wait_until("a ZooKeeper quorum", lambda: _zk_serving(ops.host), 90, diagnose)

        # format the metadata from the ops host (its own bk_server.conf: AutoRecovery and tools)
        ops.write_conf("bk_server.conf", {**bk_server_conf(OPS[1], OPS[0], proxied=False),
                                          "auditorPeriodicCheckInterval": "5"})  # weekly by default
        out = ops.host.run([*VELLUM, "shell", "metaformat", "--uri", ZK_URI], timeout_s=120)
        assert out.returncode == 0, out.stderr

        # bookies on h1..h5, each behind its link proxy, from vellum-bookie.service
        for i, (name, addr) in enumerate(BOOKIE_HOSTS.items()):
            m = machines[name]
            m.write_conf("bk_server.conf", bk_server_conf(addr, name, proxied=True))
            start_proxy(m, addr, seed=i)
            m.start_unit("vellum-bookie")
        ids = {f"{a}:{BOOKIE_PORT}" for a in BOOKIE_HOSTS.values()}
        wait_until("five bookies registered", lambda: registered(ops.host) == ids, 120, diagnose)

        # AutoRecovery and the console on ops, from their units
        ops.etc("vellum.env").write_text(f"VELLUM_METADATA_URI={ZK_URI}\nVELLUM_CONSOLE_NAME={OPS[1]}\n")
        ops.write_conf("client.conf", client_conf(OPS[0]))
        ops.start_unit("vellum-autorecovery", ready="READY autorecovery")
        ops.start_unit("vellum-console")
        cli.write_conf("client.conf", client_conf(CLI[0]))
        setup_s = time.monotonic() - t0

        # phase 1: the whole cluster, both ledger shapes
        wq, aq = (1, 1) if PLANT_AQ1 else (3, 2)
        ledgers = cli.root / "ledgers.jsonl"
        n = 400 if LONG else 100
        for e in (5, 3):
            job = run_writer(cli, ledgers, e, wq, aq, entries=n, max_ledgers=2, max_s=120, background=False)
            assert job.returncode == 0, job.stderr[-3000:]
        rows = _rows(ledgers)
        full = [r for r in rows if r.get("E") == 5 and r["closed"]]
        assert full, f"no E=5 ledger was written whole: {rows}"

        # phase 2: E=3 writes while h5 dies, h4 is partitioned and h3 restarts
        stop = cli.root / "stop"
        writer = run_writer(cli, ledgers, 3, wq, aq, entries=n, max_ledgers=200, max_s=120, background=True,
                            stop=stop)
        time.sleep(2)
        h5, h4, h3 = machines["h5"], machines["h4"], machines["h3"]
        h5.crash()  # the host dies: bookie and link proxy
        time.sleep(2)
        h4.host.unplug()
        h4_id = f"{BOOKIE_HOSTS['h4']}:{BOOKIE_PORT}"
        try:  # the partition is real: h4's session expires and its registration goes
            wait_until("h4 dropped out of the registrations", lambda: h4_id not in registered(ops.host),
                       ZK_TIMEOUT_MS / 1000 + 20, diagnose)
            time.sleep(1)
        finally:
            h4.host.plug()
        assert shell_json(ops, "whoisauditor")["auditor"] == f"{OPS[1]}:{BOOKIE_PORT}"
        # a rolling restart of h3 as docs/deployment.md does it: the delay holds AutoRecovery back
        shell_json(ops, "lostbookierecoverydelay", "--set", "600")
        for svc in ("vellum-bookie", "vellum-zookeeper"):
            h3.stop_unit(svc)
        h3.start_unit("vellum-zookeeper")
        offset = h3.log("vellum-bookie").stat().st_size
        h3.start_unit("vellum-bookie")
        h3.wait_log("vellum-bookie", "READY ", 90, offset)
        alive = ids - {f"{BOOKIE_HOSTS['h5']}:{BOOKIE_PORT}"}
        wait_until("h1..h4 registered again", lambda: registered(ops.host) == alive, 90, diagnose)
        assert {r["bookie id"] for r in shell_json(ops, "listbookies")} == alive  # as docs/deployment.md checks
        shell_json(ops, "lostbookierecoverydelay", "--set", "0")
        time.sleep(3 if not LONG else 30)  # writes on the healed cluster
        stop.write_text("stop")
        assert writer.wait(90) == 0, cli.tail("writer")
        rows = _rows(ledgers)
        e3 = [r for r in rows if r.get("E") == 3 and r.get("ledger") is not None]
        acked = sum(r["acked"] for r in rows)
        assert len(e3) >= 3 and acked >= 4 * n, f"too little was written to prove anything: {rows}"

        # every acknowledged entry reads back (the reader recovers the ledgers left open)
        check = read_back(cli, ledgers)
        assert check["bad_count"] == 0, f"acknowledged entries lost or wrong: {check}\n{diagnose()}"

        # AutoRecovery: h5 replaced in every E=3 ledger; the E=5 ones are marked (no sixth bookie).
        # Entries acknowledged by AQ=2 whose third copy never reached a bookie that failed (h4
        # cut off, h3 stopping) stay behind in the old segment, as in BookKeeper: the auditor's
        # ledger check (auditorPeriodicCheckInterval) finds them and the workers copy them.
        dead = f"{BOOKIE_HOSTS['h5']}:{BOOKIE_PORT}"
        e3_ids = [r["ledger"] for r in e3]
        closed_ms = int(time.time() * 1000)  # every ledger is closed now (the reader recovered them)

        def healed() -> bool:
            checked_ms, naming, marked = ops.host.call(_recovery_state, e3_ids, dead)
            return (checked_ms or 0) > closed_ms and not naming and not (marked & set(e3_ids))

        wait_until("AutoRecovery replaced h5 and every missing copy in the E=3 ledgers", healed, 180,
                   lambda: f"{ops.host.call(_recovery_state, e3_ids, dead)}\n{ops.tail('vellum-autorecovery')}")
        e5_ids = [r["ledger"] for r in rows if r.get("E") == 5 and r.get("ledger") is not None]
        marked = {r["ledgerId"]: r["missingReplicas"] for r in shell_json(ops, "listunderreplicated")}
        assert all(dead in marked.get(lid, []) for lid in e5_ids), (e5_ids, marked)
        check = read_back(cli, ledgers)  # again, now that the copies moved
        assert check["bad_count"] == 0, f"after AutoRecovery: {check}\n{diagnose()}"

        if SPARK:  # every copy of the healed ledgers really is there: Spark's replica check from its own host
            spk = machines[SPK[0]]
            spk.write_conf("client.conf", client_conf(SPK[0]))
            out = spk.host.run([*VELLUM, "spark", "--client-conf", str(spk.etc("client.conf")), "replica-check",
                                "--metadata-uri", ZK_URI, "--json", *[f"--ledger={lid}" for lid in e3_ids]],
                               timeout_s=600)
            assert out.returncode == 0, out.stderr[-3000:]
            report = json.loads(out.stdout)
            assert report["ledgersChecked"] == len(e3_ids) and report["problems"] == [], \
                json.dumps({"report": report, "metadata": ops.host.call(_ensembles, [
                    p["ledgerId"] for p in report["problems"]]), "written": [
                    r for r in rows if r.get("ledger") in {p["ledgerId"] for p in report["problems"]}]}, indent=1)

        # the console (from the client host, as an operator's browser would) lists the bookies
        page = cli.host.call(console_cluster_page, f"http://{OPS[1]}:{CONSOLE_PORT}",
                             ops.etc("admin.token").read_text().strip())
        for bookie in alive:
            assert bookie in page, f"console's cluster page lacks {bookie}"
        total_s = time.monotonic() - t0
        changed = ops.host.call(_ledgers_with_ensemble_changes, [r["ledger"] for r in rows if r.get("ledger")])
        assert changed >= 1, "no writer changed its ensemble: the faults never met a write"
        recovery_log = ops.tail("vellum-autorecovery", 10**7)
        found = recovery_log.count("misses entries on")
        # the worker outlives metadata failures on its own (docs/autorecovery.md): its supervisor
        # never has to start it again
        assert "the replication worker failed" not in recovery_log, recovery_log[-5000:]
        unavailable = [line[:240] for line in recovery_log.splitlines() if "ZooKeeper unavailable" in line]
        print(f"setup {setup_s:.1f}s, total {total_s:.1f}s, ledgers {len(rows)} ({changed} with ensemble changes), "
              f"acked entries {acked}, checked {check['checked']}, proxy drops {proxy_drops(machines)}, "
              f"fragments with missing copies found by the ledger check {found}, "
              f"AutoRecovery warnings about ZooKeeper being unavailable {len(unavailable)}", *unavailable[:6], sep="\n")
    except BaseException:
        print(diagnose())
        raise
    finally:
        for m in machines.values():
            for proc in m.procs.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(30)


def _pyspark_missing() -> str | None:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return "pyspark is not installed (./run setup installs the spark extra)"
    return None


def start_proxy(m: Machine, address: str, seed: int) -> None:
    argv = [sys.executable, "-m", "vellum.testing.delay_proxy",
            "--route", f"{address}:{BOOKIE_PORT}={private(address)}:{BOOKIE_PORT}",
            "--delay-ms", "2", "--jitter-ms", "1", "--drop-mean-s", str(DROP_MEAN_S), "--seed", str(seed)]
    m.start("link-proxy", argv, ready="PROXY READY", timeout_s=60)


def proxy_drops(machines: dict[str, Machine]) -> int:
    return sum(m.tail("link-proxy", 10**7).count("dropping connection") for m in machines.values()
               if m.log("link-proxy").exists())


def run_writer(cli: Machine, out: Path, e: int, wq: int, aq: int, *, entries: int, max_ledgers: int, max_s: float,
               background: bool, stop: Path | None = None) -> Any:
    argv = [sys.executable, str(CLIENT_JOB), "write", str(cli.etc("client.conf")), str(out),
            str(stop or cli.root / "no-stop"), str(e), str(wq), str(aq), str(entries), str(max_ledgers), str(max_s)]
    if background:
        log = cli.log("writer")
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:  # a file, not a pipe: a chatty writer never blocks on it
            return subprocess.Popen(cli.host.argv(argv), stdout=out, stderr=subprocess.STDOUT)
    return cli.host.run(argv, timeout_s=max_s + 60)


def read_back(cli: Machine, ledgers: Path) -> dict[str, Any]:
    out = cli.host.run([sys.executable, str(CLIENT_JOB), "read", str(cli.etc("client.conf")), str(ledgers)],
                       timeout_s=180)
    assert out.returncode == 0, out.stderr[-3000:]
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _zk_serving(host: netns.Host) -> bool:
    def ask() -> bool:
        try:
            with open_metadata_store(ZK_URI) as store:
                store.registration.list_bookies()
            return True
        except Exception:
            return False
    return host.call(ask)


def registered(host: netns.Host) -> set[str]:
    def ask() -> set[str]:
        with open_metadata_store(ZK_URI) as store:
            return store.registration.list_bookies() | store.registration.list_bookies(read_only=True)
    return host.call(ask)


def _ensembles(ids: list[int]) -> dict[int, Any]:
    with open_metadata_store(ZK_URI) as store:
        out: dict[int, Any] = {}
        for lid in ids:
            md = store.ledgers.read_ledger(lid).value
            out[lid] = {str(first): [str(b) for b in ens] for first, ens in md.ensembles.items()}
        return out


def _ledgers_naming(ids: list[int], bookie: str) -> list[int]:
    with open_metadata_store(ZK_URI) as store:
        naming = []
        for lid in ids:
            md = store.ledgers.read_ledger(lid).value
            if any(bookie in ensemble for ensemble in md.ensembles.values()):
                naming.append(lid)
        return naming


def _recovery_state(ids: list[int], bookie: str) -> tuple[int | None, list[int], set[int]]:
    """When the auditor last finished a ledger check, the ledgers of ``ids`` whose metadata
    names ``bookie``, and the under-replicated ledgers."""
    from vellum.admin import recovery_admin

    with open_metadata_store(ZK_URI) as store:
        checked = store.underreplication.get_check_all_ledgers_ctime()
        marked = {r.ledger_id for r in recovery_admin.list_under_replicated(store)}
    return checked, _ledgers_naming(ids, bookie), marked


def _ledgers_with_ensemble_changes(ids: list[int]) -> int:
    with open_metadata_store(ZK_URI) as store:
        return sum(len(store.ledgers.read_ledger(lid).value.ensembles) > 1 for lid in ids)


def shell_json(m: Machine, command: str, *args: str) -> Any:
    """``vellum shell <command> --uri ... [args] --json`` run on host ``m``."""
    out = m.host.run([*VELLUM, "shell", command, "--uri", ZK_URI, *args, "--json"], timeout_s=120)
    assert out.returncode == 0, f"vellum shell {command}: {out.stderr[-2000:]}"
    return json.loads(out.stdout)


def console_cluster_page(base: str, token: str) -> str:
    jar = CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    with opener.open(base + "/healthz", timeout=30) as r:
        assert r.read() == b"OK\n"
    data = urllib.parse.urlencode({"token": token, "back": "/cluster"}).encode()
    login = urllib.request.Request(base + "/login", data=data, headers={"Origin": base})  # as a browser sends it
    with opener.open(login, timeout=30) as r:
        r.read()
    with opener.open(base + "/cluster", timeout=60) as r:
        return str(r.read().decode())
