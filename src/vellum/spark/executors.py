"""Whether a Spark cluster's executors can run the ``vellum`` data source.

Every read and write task imports ``vellum`` in the executor's Python. On a cluster that Python
is the one ``PYSPARK_PYTHON`` / ``spark.pyspark.python`` names on each worker host, not the
driver's; without Vellum there the first task fails deep inside Spark with ``No module named
'vellum'``. ``check_executors`` runs one tiny task (a function that needs only the standard
library, so it runs even where Vellum is missing) and turns a missing install into an error that
says what to do (docs/spark.md, "Running on a cluster").

Invariants: the probe never waits forever (its job is cancelled after ``timeout_s``: a cluster
with no executor yet is reported as unknown, not as broken); local masters are not probed (the
executors are the driver's own Python).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

log = logging.getLogger(__name__)

_GROUP = "vellum-executor-check"


class ExecutorSetupError(RuntimeError):
    """The cluster's executors cannot import Vellum."""


def is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[") or master.startswith("local-cluster")


def check_executors(spark: Any, *, timeout_s: float = 120.0) -> None:
    """Raise ``ExecutorSetupError`` if an executor of ``spark``'s cluster cannot import Vellum."""
    sc = spark.sparkContext
    if is_local(sc.master):
        return
    how = ("point PYSPARK_PYTHON (or spark.pyspark.python) at a Python with Vellum installed on "
           "every worker host, or ship Vellum to the executors with spark.archives / --py-files "
           "(docs/spark.md, 'Running on a cluster')")

    def probe(_: Any) -> tuple[str, str, str]:
        # Runs on an executor. Nested, so cloudpickle ships it by value: unpickling it must not
        # need the vellum module it is looking for.
        import importlib.util
        import socket
        import sys

        spec = importlib.util.find_spec("vellum")
        return socket.gethostname(), sys.executable, "" if spec is None else str(spec.origin)

    cancel = threading.Timer(timeout_s, sc.cancelJobGroup, args=(_GROUP,))
    cancel.daemon = True
    sc.setJobGroup(_GROUP, "vellum: can the executors import vellum?", interruptOnCancel=True)
    cancel.start()
    try:
        answers = sc.parallelize([0], 1).map(probe).collect()
    except Exception as exc:  # any failure of the probe task is reported with its cause
        if not cancel.is_alive():
            log.warning("vellum: no Spark executor answered within %.0f s; could not check that the "
                        "executors can import vellum", timeout_s)
            return
        raise ExecutorSetupError(
            f"a Spark executor of {sc.master} could not run Python for the vellum data source: "
            f"{_first_line(exc)}; {how}") from None
    finally:
        cancel.cancel()
        sc.setLocalProperty("spark.jobGroup.id", None)
        sc.setLocalProperty("spark.job.description", None)
    for host, python, where in answers:
        if not where:
            raise ExecutorSetupError(
                f"Spark executors cannot import vellum: the executor on {host} runs {python}, which "
                f"has no 'vellum' module; {how}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    for line in text.splitlines():
        if "Error" in line or "error" in line:
            return line.strip()[:500]
    return (text.splitlines() or [type(exc).__name__])[0][:500]
