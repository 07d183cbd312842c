"""The commands a user runs first, against real bookie processes: simpletest, readledger,
recover, and ``vellum bench`` (a short run, checked for its report, not for its speed)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from vellum.cli.main import cli
from vellum.client.blocking import BookKeeper
from vellum.testing.local_cluster import LocalCluster


def test_shell_commands_and_bench(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "c", bookies=3) as c:
        uri = c.metadata_uri
        runner = CliRunner()
        r = runner.invoke(cli, ["shell", "simpletest", "--uri", uri, "-n", "50", "--json"])
        assert r.exit_code == 0, r.output
        report = json.loads(r.output)
        assert report["entriesVerified"] == 50 and report["state"] == "CLOSED"

        # A ledger left open by a writer that went away: readledger does not fence it,
        # recover closes it at the last entry.
        with BookKeeper(uri) as bk:
            lh = bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2, password=b"pw")
            for i in range(10):
                lh.append(b"entry %d" % i)
            ledger_id = lh.ledger_id
            r = runner.invoke(cli, ["shell", "readledger", "--uri", uri, "--password", "pw", str(ledger_id),
                                    "--show-payload", "--json"])
            assert r.exit_code == 0, r.output
            rows = json.loads(r.output)
            assert [row["payload"] for row in rows][:9] == [f"entry {i}" for i in range(9)]
            lh.append(b"still writable: readledger did not fence")
            r = runner.invoke(cli, ["shell", "recover", "--uri", uri, "--password", "pw", str(ledger_id), "--json"])
            assert r.exit_code == 0, r.output
            rec = json.loads(r.output)
            assert rec["state"] == "CLOSED" and rec["lastEntryId"] == 10

            # A packed ledger (as the Spark sink writes): rows per entry, rows shown.
            from vellum.format.records import ENTRY_FORMAT_KEY, ROWS_V1, pack

            packed = bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2,
                                      custom_metadata={ENTRY_FORMAT_KEY: ROWS_V1})
            packed.append(pack([b"a", b"bc"]))
            packed.append(pack([b"d"]))
            packed.close()
            r = runner.invoke(cli, ["shell", "readledger", "--uri", uri, str(packed.ledger_id), "--show-payload",
                                    "--json"])
            assert r.exit_code == 0, r.output
            assert [(row["rows"], row["payload"]) for row in json.loads(r.output)] == [(2, "a | bc"), (1, "d")]

        r = runner.invoke(cli, ["bench", "--uri", uri, "-e", "3", "-w", "2", "-a", "2", "-t", "1.5", "--json"])
        assert r.exit_code == 0, r.output
        out = json.loads(r.output[r.output.index("{"):])
        assert out["entries"] > 0 and out["errors"] == 0
        assert set(out["latency_ms"]) >= {"p50", "p95", "p99", "p99.9", "max"}
