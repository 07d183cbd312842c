"""Changing ``lostBookieRecoveryDelay`` while a bookie is gone, as a rolling restart does
(``docs/deployment.md``, "Rolling restart"): BookKeeper's auditor audits at once only when the
delay is re-set to the value it has (``triggeraudit``) or set to 0; any other value only
changes how long a lost bookie is waited for. Real bookie processes, embedded metadata store.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from vellum.cli.main import cli
from vellum.client.blocking import BookKeeper
from vellum.testing.local_cluster import LocalCluster


def _shell_json(*args: str) -> Any:
    result = CliRunner().invoke(cli, ["shell", *args, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    out = result.output
    return json.loads(out[out.index("{") if out.lstrip().startswith("{") else out.index("["):])


def _marked(uri: str) -> set[int]:
    return {r["ledgerId"] for r in _shell_json("listunderreplicated", "--uri", uri)}


def _wait(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s}s"
        time.sleep(0.25)


def test_raising_the_delay_while_a_bookie_is_down_does_not_mark_its_ledgers(tmp_path: Path) -> None:
    conf = {"autoRecoveryDaemonEnabled": "true", "lostBookieRecoveryDelay": "0"}
    with LocalCluster(tmp_path / "c", bookies=3, bookie_conf=conf) as cluster:
        uri = cluster.metadata_uri
        with BookKeeper(uri) as bk:
            ids = []
            for _ in range(4):
                lh = bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
                lh.append(b"entry")
                lh.close()
                ids.append(lh.ledger_id)
        _wait(lambda: _shell_json("whoisauditor", "--uri", uri)["auditor"] is not None, 30, "an auditor")
        auditor = _shell_json("whoisauditor", "--uri", uri)["auditor"]
        victim = next(i for i, b in enumerate(cluster.bookie_ids) if b != auditor)
        victim_id = cluster.bookie_ids[victim]

        _shell_json("lostbookierecoverydelay", "--uri", uri, "--set", "600")  # before the restart
        time.sleep(1.5)  # the auditor has seen the change
        cluster.kill(victim)
        _wait(lambda: victim_id not in (cluster.registered()[0] | cluster.registered()[1]), 30, "the bookie gone")
        time.sleep(3)  # several auditor ticks (1 s each)
        assert _marked(uri) == set(), "raising the delay marked the restarting bookie's ledgers at once"

        _shell_json("lostbookierecoverydelay", "--uri", uri, "--set", "900")  # another value: still waits
        time.sleep(3)
        assert _marked(uri) == set(), "changing the delay to another value marked the lost bookie's ledgers"

        result = CliRunner().invoke(cli, ["shell", "triggeraudit", "--uri", uri], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        _wait(lambda: _marked(uri) == set(ids), 30, "triggeraudit marks the lost bookie's ledgers")
