"""The cannot-heal records (``autorecovery/cannot_heal``) on both metadata drivers (a real
ZooKeeper and the embedded store): a reason is "new" once and again only when it changes, a
cleared or stale record is gone, the shell's listing joins them to the under-replication
records, and the sentences name what the operator needs (needed vs available bookies; policy
and constraint)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from vellum.admin import recovery_admin as ra
from vellum.autorecovery.cannot_heal import (
    NO_SPARE_BOOKIE,
    PLACEMENT,
    CannotHealRecords,
    no_spare_bookie,
    placement_unmet,
    summarize,
)
from vellum.errors import NotEnoughBookiesError
from vellum.ids import LedgerId
from vellum.meta import MetadataStore, open_metadata_store
from vellum.testing.zookeeper import ZooKeeperServer


@pytest.fixture(params=["sqlite", "zk"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MetadataStore]:
    if request.param == "sqlite":
        uri = f"sqlite:///{tmp_path / 'm.db'}"
    else:
        zk: ZooKeeperServer = request.getfixturevalue("zk_server")
        uri = zk.uri("zk", f"/cannot-heal-{uuid.uuid4().hex[:8]}/ledgers")
    with open_metadata_store(uri) as s:
        s.format()
        yield s


def test_a_reason_is_new_once_and_again_when_it_changes(store: MetadataStore) -> None:
    records = CannotHealRecords(store.kv)
    assert records.record(7, NO_SPARE_BOOKIE, "no spare bookie to replace b3", "w1") is True
    assert records.record(7, NO_SPARE_BOOKIE, "no spare bookie to replace b3", "w2") is False  # said already
    got = records.get(7)
    assert got is not None and (got.kind, got.worker) == (NO_SPARE_BOOKIE, "w1")
    assert records.record(7, PLACEMENT, "placement cannot be met replacing b3: ...", "w2") is True
    assert records.record(8, NO_SPARE_BOOKIE, "no spare bookie to replace b3", "w1") is True
    assert set(records.all()) == {7, 8}

    urm = store.underreplication
    urm.mark_under_replicated(LedgerId(7), ["b3"])
    urm.mark_under_replicated(LedgerId(9), ["b3"])
    rows = {r.ledger_id: r for r in ra.list_under_replicated(store)}
    assert rows[7].cannot_heal is not None and rows[7].cannot_heal.kind == PLACEMENT
    assert rows[9].cannot_heal is None and rows[9].to_json()["cannotHeal"] is None
    assert 8 not in rows  # a stale record shows nowhere
    assert ra.cluster_state(store)["ledgersThatCannotHeal"] == 1
    assert ra.cannot_heal_reasons(list(rows.values())) == [("placement cannot be met replacing b3: ...", 1)]

    assert records.sweep(lambda: [int(r.ledger_id) for r in urm.list_under_replicated()]) == 1
    assert set(records.all()) == {7}
    records.clear(7)
    records.clear(7)  # idempotent
    assert records.all() == {} and records.get(7) is None
    assert ra.cluster_state(store)["ledgersThatCannotHeal"] == 0


def test_the_sentences_say_what_is_needed() -> None:
    e = no_spare_bookie("b3:3181", 3, writable=["b1:3181", "b2:3181", "b4:3181"], read_only=["b4:3181"],
                        excluded={"b3:3181"})
    assert e.kind == NO_SPARE_BOOKIE and isinstance(e, NotEnoughBookiesError)
    assert str(e) == ("no spare bookie to replace b3:3181: an ensemble of 3 needs 3 writable bookies, 2 available "
                      "(b1:3181, b2:3181); 1 read-only (b4:3181) take no new copies; add a bookie or bring "
                      "b3:3181 back")
    p = placement_unmet("b3:3181", "ensemblePlacementPolicy=rackaware", NotEnoughBookiesError(
        "replace bookie b3:3181: no writable bookie keeps every write quorum of 2 on 2 racks "
        "(enforceMinNumRacksPerWriteQuorum)"))
    assert p.kind == PLACEMENT and str(p) == (
        "placement cannot be met replacing b3:3181: ensemblePlacementPolicy=rackaware: no writable bookie keeps "
        "every write quorum of 2 on 2 racks (enforceMinNumRacksPerWriteQuorum)")


def test_summarize_counts_the_commonest_reasons(tmp_path: Path) -> None:
    with open_metadata_store(f"sqlite:///{tmp_path / 'm.db'}") as store:
        store.format()
        records = CannotHealRecords(store.kv)
        for lid in range(5):
            records.record(lid, NO_SPARE_BOOKIE, "A", "w")
        records.record(10, PLACEMENT, "B", "w")
        assert summarize(records.all()) == "5 ledgers: A; 1 ledger: B"
        for n, reason in enumerate("CDE"):
            records.record(20 + n, PLACEMENT, reason, "w")
        assert summarize(records.all(), at_most=2) == "5 ledgers: A; 1 ledger: B; 3 other reasons"
