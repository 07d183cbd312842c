"""``vellum verify cluster`` against real bookie processes: the simulator's workload (writer,
tailing reader, racing recoveries, deletes) and checker on a running cluster, with a nemesis
command of the user's that pauses a bookie (SIGSTOP) and lets it go on (SIGCONT)."""

from __future__ import annotations

import json
import os
import signal
import stat
from pathlib import Path

from click.testing import CliRunner

from vellum.cli.main import cli
from vellum.client.blocking import BookKeeper
from vellum.testing.local_cluster import LocalCluster

NEMESIS = """#!/bin/sh
# the user's nemesis: `inject` pauses one bookie, `heal` lets it go on
state={state}
case "$1" in
  inject) pid=$(shuf -n 1 {pids}); kill -STOP "$pid" && echo "$pid" > "$state" && echo "paused $pid" ;;
  heal) [ -s "$state" ] && kill -CONT "$(cat "$state")" && echo "resumed $(cat "$state")"; : > "$state" ;;
  *) echo "unknown action $1" >&2; exit 2 ;;
esac
"""


def test_verify_cluster_checks_a_running_cluster_under_a_nemesis(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "c", bookies=4) as cluster:
        pids = [cluster.pid(i) for i in range(4)]
        (tmp_path / "pids").write_text("\n".join(map(str, pids)) + "\n")
        script = tmp_path / "nemesis.sh"
        script.write_text(NEMESIS.format(state=tmp_path / "paused", pids=tmp_path / "pids"))
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
        with BookKeeper(cluster.metadata_uri) as bk:
            before = set(bk.list_ledgers())
        try:
            r = CliRunner().invoke(cli, ["verify", "cluster", "--metadata", cluster.metadata_uri, "--duration", "14",
                                         "--round", "7", "--ledgers", "2", "--entries", "60", "--nemesis",
                                         str(script), "--seed", "7", "--json"])
        finally:
            for pid in pids:  # whatever happened, no bookie stays paused
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
        assert r.exit_code == 0, r.output
        report = json.loads(r.output[r.output.index("{"):])
        assert report["rounds"] >= 2 and report["ledgers"] >= 2, report
        assert report["acks"] > 50 and report["reads"] > 0 and report["recoveries"] > 0, report
        assert report["nemesis"].get("inject", 0) >= 1 and report["nemesis"].get("heal", 0) >= 1, report
        assert report["violations"] == [], report["violations"]
        with BookKeeper(cluster.metadata_uri) as bk:
            assert set(bk.list_ledgers()) == before  # it deleted what it made


def test_verify_cluster_says_what_is_wrong(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["verify", "cluster", "--metadata", "sqlite:///" + str(tmp_path / "none.db"),
                                 "--duration", "0"])
    assert r.exit_code != 0 and "--duration" in r.output and "more than 0" in r.output, r.output
    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    r = CliRunner().invoke(cli, ["shell", "metaformat", "--uri", empty])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["verify", "cluster", "--metadata", empty, "--duration", "2"])
    assert r.exit_code != 0 and "no writable bookie is registered" in r.output, r.output
