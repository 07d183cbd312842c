"""The simulator's in-memory metadata store against the metadata contract suite's ledger tests
(``tests/meta/test_contract.py``) and AutoRecovery's records (``tests/meta/test_underreplication_contract.py``):
the semantics the simulated clients and AutoRecovery rely on are the real drivers'. Left out:
cookies and the layout (not simulated), and the tests that wait on other threads or on the wall
clock (the simulated store lives on one loop; ``test_sim_sessions.py`` covers its waits, watches,
election and session expiry on virtual time)."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from vellum.ids import LedgerId
from vellum.meta import LedgerMetadata, MetadataStore
from vellum.meta.model import deserialize_ledger_metadata, serialize_ledger_metadata
from vellum.sim import metadata as sim_metadata
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
_ur_contract = _load("sim_ur_contract", _META / "test_underreplication_contract.py")

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


UR_CONTRACT: list[Callable[[Callable[..., MetadataStore]], None]] = [
    _ur_contract.test_list_in_ledger_id_order,
    _ur_contract.test_two_sessions_cannot_hold_the_same_ledger,
    _ur_contract.test_acquire_skips_excluded_and_locked,
    _ur_contract.test_closing_a_session_frees_its_locks,
    _ur_contract.test_record_marked_again_while_replicating_stays,
    _ur_contract.test_audit_timestamps,
]


@pytest.mark.parametrize("case", UR_CONTRACT, ids=lambda c: c.__name__)
def test_the_simulated_store_keeps_the_underreplication_contract(
        case: Callable[[Callable[..., MetadataStore]], None]) -> None:
    """Each ``open_ur()`` of the contract is another session on one simulated cluster."""
    loop = SimLoop()
    first: list[SimMetadataStore] = []

    def open_ur(**_kw: float) -> MetadataStore:
        if not first:
            first.append(SimMetadataStore(loop))
            return first[0]
        return first[0].session(f"session-{len(first)}")

    try:
        case(open_ur)
    finally:
        loop.close()


def test_password_of_gives_the_stored_rows_password_without_parsing_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulated bookies' master-key check asks ``password_of`` on every first add of a
    ledger: the password of the row stored now (created, rewritten, deleted), known from the
    metadata it was written from (docs/verification.md, "Speed": no parse per metadata write)."""
    loop = SimLoop()
    try:
        store = SimMetadataStore(loop)
        ledgers = store.cluster.ledgers
        md = LedgerMetadata(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1, ensembles={0: ("b:1",)},
                            password=b"first")

        def no_parse(*_a: object, **_kw: object) -> LedgerMetadata:
            raise AssertionError("password_of parsed a row it wrote")

        monkeypatch.setattr(sim_metadata, "deserialize_ledger_metadata", no_parse)
        lid, version = ledgers.create_ledger(md)
        assert store.password_of(lid) == b"first"
        ledgers.write_ledger(lid, dataclasses.replace(md, password=b"second"), version)
        assert store.password_of(lid) == b"second"
        ledgers.create_ledger_with_id(LedgerId(77), dataclasses.replace(md, password=b"third"))
        assert store.password_of(77) == b"third"
        monkeypatch.undo()
        ledgers.delete_ledger(lid)
        assert store.password_of(lid) is None
    finally:
        loop.close()


def test_every_read_of_a_row_gets_its_own_copy_of_what_its_bytes_parse_to() -> None:
    """A row is serialized and parsed at its first read, and later reads get copies of that
    parse: each reader still gets what the bytes give (custom metadata in the bytes' sorted
    order) and shares nothing mutable with the store, the writer or another reader, as with a
    real store (docs/verification.md, "Speed")."""
    loop = SimLoop()
    try:
        ledgers = SimMetadataStore(loop).cluster.ledgers
        md = LedgerMetadata(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1, ensembles={0: ("b:1",)},
                            custom_metadata={"z": b"1", "a": b"2"}, password=b"pw")
        lid, _version = ledgers.create_ledger(md)
        md.ensembles[5] = ("b:2",)  # type: ignore[index]  # a writer breaking the contract afterwards
        first = ledgers.read_ledger(lid).value
        assert first == deserialize_ledger_metadata(serialize_ledger_metadata(
            LedgerMetadata(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1, ensembles={0: ("b:1",)},
                           custom_metadata={"z": b"1", "a": b"2"}, password=b"pw")), where="test")
        assert list(first.custom_metadata) == ["a", "z"]
        first.ensembles[7] = ("b:3",)  # type: ignore[index]  # a reader breaking it
        first.custom_metadata["b"] = b"3"  # type: ignore[index]
        again = ledgers.read_ledger(lid).value
        assert again == ledgers.read_ledger(lid).value and again is not first
        assert dict(again.ensembles) == {0: ("b:1",)} and list(again.custom_metadata) == ["a", "z"]
    finally:
        loop.close()


def test_ledger_metadata_has_no_mutable_part_but_the_two_mappings_a_row_copies() -> None:
    """``_own_copy`` copies ``ensembles`` and ``custom_metadata``: every other field of a
    ``LedgerMetadata`` must hold an immutable value, or a reader's copy would share it."""
    md = deserialize_ledger_metadata(serialize_ledger_metadata(LedgerMetadata(
        ensemble_size=2, write_quorum_size=2, ack_quorum_size=1, ensembles={0: ("b:1", "b:2")},
        custom_metadata={"k": b"v"}, password=b"pw", ctime_ms=5, creator_token=9)), where="test")
    immutable = (int, str, bytes, float, bool, type(None), tuple, frozenset)
    shared = {f.name for f in dataclasses.fields(md) if not isinstance(getattr(md, f.name), immutable)}
    assert shared == {"ensembles", "custom_metadata"}
    assert all(isinstance(v, tuple) for v in md.ensembles.values())
    assert all(isinstance(v, bytes) for v in md.custom_metadata.values())
