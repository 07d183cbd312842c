"""A real crash: SIGKILL a process appending to a Journal; every acked entry must replay intact.

With direct I/O (``journalDirectIO``) the rounds mix files written with O_DIRECT and buffered:
the format is the same, a kill can land between a direct write and its fsync, and replay reads
them all back alike."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vellum.format.journal import JournalRecord, RecordKind
from vellum.format.lastmark import ZERO_MARK
from vellum.storage.journal import Journal

sys.path.insert(0, str(Path(__file__).parent))
from journal_writer_proc import payload

HELPER = Path(__file__).parent / "journal_writer_proc.py"
ROUNDS = 5


@pytest.mark.parametrize("io", ["buffered", "direct-io"])
def test_sigkill_at_random_moments_loses_no_acked_entry(io: str, request: pytest.FixtureRequest) -> None:
    base: Path = request.getfixturevalue("direct_io_dir" if io == "direct-io" else "tmp_path")
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    rng.seed(seed)
    journal_dir = base / "journal"
    acked_all: set[int] = set()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parents[2] / "src")]))
    for round_no in range(ROUNDS):
        first = round_no * 10_000_000
        proc = subprocess.Popen(
            [sys.executable, str(HELPER), str(journal_dir), str(first), str(round_no % 2),
             "1" if io == "direct-io" and round_no != 2 else "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        assert proc.stdout is not None
        # wait for the first ack so the kill lands mid-stream, then a random extra delay
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else ""
        time.sleep(rng.uniform(0.05, 1.0))
        proc.send_signal(signal.SIGKILL)
        rest, err = proc.communicate(timeout=30)
        # every line printed before the kill was acked after its fsync
        acked = {int(x) for x in (line + rest).split()}
        assert acked, err
        acked_all |= acked

        records: list[JournalRecord] = []
        Journal(journal_dir).replay(ZERO_MARK, records.append)
        replayed = {r.entry_id: r.data for r in records if r.kind is RecordKind.ENTRY}
        missing = acked_all - replayed.keys()
        assert not missing, f"seed {seed} round {round_no}: acked entries lost: {sorted(missing)[:10]}"
        for entry_id in acked_all:
            assert replayed[entry_id] == payload(entry_id), f"seed {seed}: entry {entry_id} differs"
        # records that were written but not acknowledged are fine; corrupt ones are not
        for entry_id, data in replayed.items():
            assert data == payload(entry_id)
    assert len(os.listdir(journal_dir / "current")) >= 2  # the rounds rolled and restarted
