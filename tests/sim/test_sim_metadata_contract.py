"""The simulator's in-memory metadata store against the metadata contract suite's ledger tests
(``tests/meta/test_contract.py``): the semantics the simulated clients rely on are the real
drivers'. The rest of the suite (cookies, layout, key-value area, sessions, processes) is not
simulated (docs/verification.md)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from vellum.meta import MetadataStore
from vellum.sim.loop import SimLoop
from vellum.sim.metadata import SimMetadataStore

_META = Path(__file__).resolve().parents[1] / "meta"


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)
    spec.loader.exec_module(module)
    return module


if "meta_testkit" not in sys.modules:
    _load("meta_testkit", _META / "conftest.py")
_contract = _load("sim_meta_contract", _META / "test_contract.py")

CONTRACT: list[Callable[[MetadataStore], None]] = [
    _contract.test_create_read_cas_conflict,
    _contract.test_delete_is_idempotent_and_versioned,
    _contract.test_create_with_id_recognises_its_own_creator_token,
    _contract.test_iteration_ranges_and_start_after,
]


@pytest.mark.parametrize("case", CONTRACT, ids=lambda c: c.__name__)
def test_the_simulated_store_keeps_the_ledger_contract(case: Callable[[MetadataStore], None]) -> None:
    loop = SimLoop()
    try:
        case(SimMetadataStore(loop))
    finally:
        loop.close()
