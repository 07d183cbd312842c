"""``vellum shell simpletest`` refused midway leaves nothing behind: on real bookie processes,
one of three bookies is killed while its registration lingers (the metadata session has not
expired yet), so simpletest's ledger is created on an ensemble of three, its adds to the dead
bookie fail and no spare bookie can replace it. The command fails with a sentence that says
why, and the ledger it created is closed and deleted, not left open for a recovery to find."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from vellum.cli.main import cli
from vellum.meta import open_metadata_store
from vellum.testing.local_cluster import LocalCluster


def _ledgers(uri: str) -> list[int]:
    with open_metadata_store(uri) as store:
        return [int(lid) for lid in store.ledgers.iter_ledger_ids()]


def test_a_refused_simpletest_deletes_the_ledger_it_created(tmp_path: Path) -> None:
    # a long session timeout: the killed bookie stays registered for the whole test
    with LocalCluster(tmp_path / "c", bookies=3, bookie_conf={"zkTimeout": "60000"}) as cluster:
        uri = cluster.metadata_uri
        runner = CliRunner()
        r = runner.invoke(cli, ["shell", "simpletest", "--uri", uri, "-e", "3", "-w", "3", "-a", "3", "-n", "5",
                                "--json"])
        assert r.exit_code == 0, r.output
        kept = json.loads(r.output)["ledgerId"]
        assert _ledgers(uri) == [kept]  # a passing test keeps its (closed) ledger, as before

        cluster.kill(2)
        assert cluster.bookie_ids[2] in cluster.registered()[0]  # still listed as writable
        r = runner.invoke(cli, ["shell", "simpletest", "--uri", uri, "-e", "3", "-w", "3", "-a", "3", "-n", "20"])
        assert r.exit_code != 0
        assert _ledgers(uri) == [kept]  # nothing open left behind
        assert "simpletest failed on ledger" in r.output and "the ledger it created was deleted" in r.output, r.output

        # refused before anything is created: says so, creates nothing
        r = runner.invoke(cli, ["shell", "simpletest", "--uri", uri, "-e", "5", "-w", "2", "-a", "2"])
        assert r.exit_code != 0 and "cannot create a ledger" in r.output, r.output
        assert _ledgers(uri) == [kept]
