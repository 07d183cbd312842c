"""The metadata shell commands against a real embedded store (click's runner, no mocks)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from vellum.cli.main import cli
from vellum.ids import BookieId
from vellum.meta import LedgerMetadata, open_metadata_store

MD = LedgerMetadata(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1, ensembles={0: (BookieId("b:1"),)})


def test_shell_flow(tmp_path: Path) -> None:
    uri = f"sqlite://{tmp_path / 'm.db'}"
    run = CliRunner().invoke
    r = run(cli, ["shell", "metaformat", "--uri", uri, "--json"])
    assert r.exit_code == 0, r.output
    assert len(json.loads(r.output)["instanceId"]) == 36
    with open_metadata_store(uri) as s:
        ids = [s.ledgers.create_ledger(MD)[0] for _ in range(5)]
        s.registration.register_bookie(BookieId("bk:1"))
        r = run(cli, ["shell", "listbookies", "--uri", uri, "--json"])
        assert json.loads(r.output) == [{"bookie id": "bk:1", "state": "writable"}]
        r = run(cli, ["shell", "clusterinfo", "--uri", uri, "--json"])
        info = json.loads(r.output)
        assert (info["ledgers"], info["writableBookies"], info["auditor"]) == (5, 1, "none")
        assert (info["totalBookies"], info["unavailableBookies"]) == (1, 0), info
        # a bookie that joined (its cookie is stored) but is not registered is down
        s.registration.put_cookie(BookieId("bk:2"), b"cookie", None)
        info = json.loads(run(cli, ["shell", "clusterinfo", "--uri", uri, "--json"]).output)
        assert (info["totalBookies"], info["writableBookies"], info["unavailableBookies"]) == (2, 1, 1), info
        table = run(cli, ["shell", "clusterinfo", "--uri", uri]).output
        assert "unavailableBookies" in table and "totalBookies" in table, table
    r = run(cli, ["shell", "listledgers", "--uri", uri, "--limit", "2", "--start-after", str(ids[0]), "--json"])
    assert json.loads(r.output)["ledgers"] == ids[1:3]
    r = run(cli, ["shell", "ledgermetadata", "--uri", uri, str(ids[0])])
    assert r.exit_code == 0 and "OPEN" in r.output
    r = run(cli, ["shell", "deleteledger", "--uri", uri, str(ids[0])], input="n\n")
    assert r.exit_code != 0
    r = run(cli, ["shell", "deleteledger", "--uri", uri, str(ids[0]), "--yes"])
    assert r.exit_code == 0
    r = run(cli, ["shell", "listledgers", "--uri", uri, "--json", "--limit", "0"])
    assert json.loads(r.output)["ledgers"] == ids[1:]
    r = run(cli, ["shell", "metaformat", "--uri", uri])
    assert r.exit_code != 0 and "already formatted" in str(r.exception)
