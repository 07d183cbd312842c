"""No seed reads the host's clock (docs/verification.md, "Determinism"): every wall and monotonic
clock read of the code a run reaches goes through a seam the simulator sets (the client's
``_wall_clock``, the request path's ``_monotonic``, AutoRecovery's ``virtual_clock``, the real
bookie's ``BookieRuntime``), so a host clock that jumps changes nothing of a seed."""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import vellum
from vellum.sim.runner import FAULT_KINDS, MODEL_ONLY_FAULTS, SimOptions, run_seed
from vellum.sim.workload import WorkloadShape

_SRC = str(Path(vellum.__file__).parent)
_CLOCKS = ("time", "monotonic", "time_ns", "monotonic_ns", "perf_counter", "perf_counter_ns")
SHAPE = WorkloadShape(ledgers=2, entries=(10, 30), reader_polls=10)
#: the model with every fault (AutoRecovery on: its seed 2 has answers the request path logs, rate-limited
#: on a clock), and the real bookie with power losses (its GC passes time themselves)
RUNS = {
    "model": SimOptions(shape=SHAPE, faults=frozenset(FAULT_KINDS)),
    "real": SimOptions(shape=SHAPE, bookie="real", power_loss=0.5,
                       faults=frozenset(FAULT_KINDS) - MODEL_ONLY_FAULTS),
    "named": SimOptions(shape=SHAPE, named=True),  # the named-ledger client stamps records with a ctime
}


@pytest.fixture
def host_clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[bool], Counter[str]]]:
    """``host_clock(jump)``: every clock of the ``time`` module records the code of vellum that
    reads it (file:line); with ``jump`` it also answers a far time that leaps at every read."""
    reads: Counter[str] = Counter()

    def install(jump: bool) -> Counter[str]:
        run_thread = threading.get_ident()
        for name in _CLOCKS:
            real = getattr(time, name)

            def read(*args: object, _real: Callable[..., float] = real, _ns: bool = name.endswith("_ns")) -> float:
                if threading.get_ident() != run_thread:
                    # A run is one thread; other threads of the test process (a session-scoped
                    # cluster's clients polling their store, say) read the real clock unrecorded.
                    return _real(*args)
                caller = sys._getframe(1)
                if caller.f_code.co_filename.startswith(_SRC):
                    reads[f"{caller.f_code.co_filename[len(_SRC) + 1:]}:{caller.f_lineno}"] += 1
                if not jump:
                    return _real(*args)
                read.calls += 1  # type: ignore[attr-defined]
                leap = 4e9 + 86_400.0 * read.calls  # type: ignore[attr-defined]
                return int(leap * 1e9) if _ns else leap

            read.calls = 0  # type: ignore[attr-defined]
            monkeypatch.setattr(time, name, read)
        return reads

    yield install


@pytest.mark.parametrize("kind", sorted(RUNS))
def test_a_run_reads_no_host_clock(kind: str, host_clock: Callable[[bool], Counter[str]]) -> None:
    reads = host_clock(False)
    for seed in (0, 2):  # seed 2 of the model: an answer the request path logs (rate-limited)
        result = run_seed(seed, RUNS[kind])
        assert result.error is None and not result.violations
    assert not reads, f"the host's clock was read from vellum code in a run: {dict(reads)}"


@pytest.mark.parametrize("kind", sorted(RUNS))
def test_a_jumping_host_clock_leaves_a_seeds_fingerprint_alone(kind: str,
                                                              host_clock: Callable[[bool], Counter[str]]) -> None:
    before = run_seed(3, RUNS[kind])
    host_clock(True)
    after = run_seed(3, RUNS[kind])
    assert (after.fingerprint, after.error, after.operations) == (before.fingerprint, before.error, before.operations)
