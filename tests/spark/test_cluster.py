"""The data source on a real Spark standalone cluster, as an operator runs it (docs/spark.md,
"Running on a cluster").

A master and a worker are started from pyspark's own ``spark-class`` on 127.0.0.1; drivers are
started with ``spark-submit`` in their own processes (one SparkContext per process: the
session-wide ``local[2]`` one stays untouched). The example pipeline runs there end to end: an
exactly-once streaming write of aggregated totals and a batch read that checks them. A driver
whose executors run a Python without Vellum fails at ``register()`` with a message that says
what to set, instead of Spark's ``No module named 'vellum'`` from inside a task.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vellum.testing.local_cluster import LocalCluster, free_port

ROOT = Path(__file__).resolve().parents[2]


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent  # a pip-installed pyspark is a whole Spark distribution


def _bin(tool: str) -> str:
    return str(_spark_home() / "bin" / tool)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    env.update(SPARK_HOME=str(_spark_home()), SPARK_LOCAL_IP="127.0.0.1", SPARK_DAEMON_MEMORY="256m",
               PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}", **extra)
    return env


class StandaloneSpark:
    """One master and one worker (2 cores, 1 GiB) on 127.0.0.1, stopped with the fixture."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.port, self.ui = free_port(), free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Any] = []

    def _start(self, name: str, *args: str) -> None:
        log = open(self.base / f"{name}.log", "wb")  # noqa: SIM115 - closed in stop()
        self.logs.append(log)
        self.procs.append(subprocess.Popen([_bin("spark-class"), *args], stdout=log, stderr=subprocess.STDOUT,
                                           env=_env(),
                                           start_new_session=True))

    def start(self) -> None:
        self._start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                    "--port", str(self.port), "--webui-port", str(self.ui))
        self._start("worker", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                    "--cores", "2", "--memory", "1g", "--webui-port", str(free_port()),
                    "--work-dir", str(self.base / "work"), self.url)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs):
                break
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.ui}/json/", timeout=2) as r:
                    if json.load(r).get("aliveworkers", 0) >= 1:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        logs = "\n".join((self.base / f"{n}.log").read_text(errors="replace")[-2000:] for n in ("master", "worker"))
        raise AssertionError(f"the standalone Spark master and worker did not come up:\n{logs}")

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
        for log in self.logs:
            log.close()

    def submit(self, script: Path, *args: str, executor_python: str, timeout_s: float = 420) -> subprocess.CompletedProcess[str]:
        cmd = [_bin("spark-submit"), "--master", self.url,
               "--conf", "spark.executor.memory=512m", "--conf", "spark.cores.max=2",
               "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1",
               "--driver-memory", "768m", str(script), *args]
        return subprocess.run(cmd, env=_env(PYSPARK_PYTHON=executor_python, PYSPARK_DRIVER_PYTHON=sys.executable),
                              capture_output=True, text=True, timeout=timeout_s, cwd=str(ROOT))


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory, spark: Any) -> Iterator[StandaloneSpark]:
    # ``spark`` first: its checks skip (or, under CI, fail) when Java or pyspark is missing.
    del spark
    s = StandaloneSpark(tmp_path_factory.mktemp("spark-standalone"))
    try:
        s.start()
        yield s
    finally:
        s.stop()


def test_pipeline_runs_on_a_standalone_cluster(standalone: StandaloneSpark, cluster: LocalCluster,
                                               tmp_path: Path) -> None:
    """spark-submit of the example to the master: exactly-once streaming totals, checked by a
    batch read, computed by the worker's executors."""
    done = standalone.submit(ROOT / "examples" / "pipeline.py", "--metadata-uri", cluster.metadata_uri,
                             "--rounds", "2", "--events", "300", "--checkpoint-dir", str(tmp_path / "ckpt"),
                             executor_python=sys.executable)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "pipeline OK" in done.stdout
    # The executors really were the worker's (an app directory per application it ran).
    work = standalone.base / "work"
    assert list(work.glob("app-*/*/stderr")), (sorted(map(str, work.rglob("*")))[:20], done.stdout[-2000:],
                                               (standalone.base / "worker.log").read_text()[-3000:])


def test_executors_without_vellum_fail_at_register_saying_what_to_set(
        standalone: StandaloneSpark, tmp_path: Path) -> None:
    python = shutil.which("python3", path="/usr/bin:/bin")
    assert python is not None
    probe = subprocess.run([python, "-c", "import vellum"], capture_output=True, env=_env())
    if probe.returncode == 0:
        pytest.skip(f"{python} can import vellum here: no Python without Vellum to run executors on")
    script = tmp_path / "driver.py"
    script.write_text(
        "import sys\n"
        "from pyspark.sql import SparkSession\n"
        "from vellum.spark import register\n"
        "from vellum.spark.executors import ExecutorSetupError\n"
        "spark = SparkSession.builder.appName('no-vellum').getOrCreate()\n"
        "try:\n"
        "    register(spark)\n"
        "except ExecutorSetupError as exc:\n"
        "    print('REFUSED:', exc)\n"
        "    sys.exit(3)\n"
        "finally:\n"
        "    spark.stop()\n"
    )
    done = standalone.submit(script, executor_python=python, timeout_s=240)
    assert done.returncode == 3, done.stdout[-3000:] + done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("REFUSED:"))
    assert "cannot import vellum" in line and python in line, line
    assert "PYSPARK_PYTHON" in line and "docs/spark.md" in line
