"""A writer process killed with SIGKILL mid-stream: opening the ledger with recovery fences it,
recovers its tail and closes it; every acknowledged entry is readable and the closed last entry
is at least the last acknowledged one (BookKeeper's NoDivergenceBetweenClientAndMetaData)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from vellum.client.blocking import BookKeeper
from vellum.testing.local_cluster import LocalCluster

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from ledger_writer_proc import payload  # noqa: E402


def test_recovery_after_writer_killed_mid_stream(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "c", bookies=3) as cluster:
        for round_no, kill_after in enumerate((0.3, 1.2)):
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), *sys.path]))
            err = open(tmp_path / f"writer-{round_no}.err", "w")  # noqa: SIM115 - closed below
            proc = subprocess.Popen([sys.executable, str(HERE / "ledger_writer_proc.py"), cluster.metadata_uri],
                                    stdout=subprocess.PIPE, stderr=err, text=True, env=env)
            acked: list[int] = []
            ledger: list[int] = []
            started = threading.Event()

            def read_lines(p: subprocess.Popen[str] = proc, a: list[int] = acked, lg: list[int] = ledger,
                           ev: threading.Event = started) -> None:
                assert p.stdout is not None
                for line in p.stdout:
                    kind, value = line.split()
                    if kind == "LEDGER":
                        lg.append(int(value))
                        ev.set()
                    else:
                        a.append(int(value))

            reader = threading.Thread(target=read_lines, daemon=True)
            reader.start()
            try:
                assert started.wait(60), (tmp_path / f"writer-{round_no}.err").read_text()
                deadline = time.monotonic() + 30
                while len(acked) < 50 and time.monotonic() < deadline:
                    time.sleep(0.01)
                time.sleep(kill_after)
                proc.send_signal(signal.SIGKILL)
                proc.wait(30)
                reader.join(10)
            finally:
                if proc.stdout is not None:
                    proc.stdout.close()
                err.close()
            assert acked, "the writer acknowledged nothing"
            with BookKeeper(cluster.metadata_uri) as bk:
                lh = bk.open_ledger(ledger[0], password=b"pw", recovery=True)
                md = bk.ledger_metadata(ledger[0])
                assert md.state.name == "CLOSED"
                assert md.last_entry_id >= max(acked), (md.last_entry_id, max(acked))
                entries = lh.read(0, md.last_entry_id)
                assert [e.entry_id for e in entries] == list(range(md.last_entry_id + 1))
                for e in entries:
                    assert e.payload == payload(e.entry_id)
