"""The client host's program in tests/hosts/test_many_hosts.py: a writer and a reader run
inside the client's network namespace, configured from a client file (``load_client_config``).

``write CONF OUT STOP E WQ AQ ENTRIES MAX_LEDGERS MAX_S``: create ledgers one after another
(E/WQ/AQ), append ENTRIES entries to each and close it, until MAX_LEDGERS ledgers, MAX_S seconds
or the file STOP exists; a failed add or close ends that ledger (left as it is) and the next one
starts. Each ledger ends as one JSON line in OUT: id, quorums, how many entries were
acknowledged (ids 0..acked-1), whether it closed, the error if any.

``read CONF LEDGERS_JSONL``: open every ledger listed (with recovery, as a new reader would),
read entries 0..acked-1 and compare each with the payload written; prints one JSON object:
``{"checked": n, "bad": [...]}`` (missing, unreadable or different entries). The links reset
connections at random, and an E=5 ledger that lost h5 keeps two live copies of an entry: when
both connections happen to be down at once the read is tried again (three times, half a
second apart) for that reason only, "bookie unavailable" or a timeout. A missing or different
entry is never retried away; nor is an entry whose every copy is on a dead bookie (the planted AQ=1 run).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from collections.abc import Callable
from typing import TypeVar

from vellum.client.blocking import BookKeeper
from vellum.config import load_client_config
from vellum.errors import BookieHandleNotAvailableError, TimeoutError_

PASSWORD = b"many-hosts"
#: tries of one read when the bookies holding it were unreachable (links reset at random)
READ_TRIES = 3

T = TypeVar("T")


def _transient_retry(op: Callable[[], T]) -> T:
    for attempt in range(1, READ_TRIES + 1):
        try:
            return op()
        except (BookieHandleNotAvailableError, TimeoutError_):
            if attempt == READ_TRIES:
                raise
            time.sleep(0.5)
    raise AssertionError("unreachable")


def payload(ledger_id: int, entry_id: int) -> bytes:
    return (b"ledger %d entry %d " % (ledger_id, entry_id)).ljust(200, b".")


def write(conf: str, out: str, stop: str, e: int, wq: int, aq: int, entries: int, max_ledgers: int,
          max_s: float) -> None:
    cfg = load_client_config(conf)
    deadline = time.monotonic() + max_s
    with BookKeeper(cfg.metadata_service_uri, config=cfg) as bk, open(out, "a") as f:
        for _ in range(max_ledgers):
            if os.path.exists(stop) or time.monotonic() > deadline:
                break
            row: dict[str, object] = {"E": e, "WQ": wq, "AQ": aq, "acked": 0, "closed": False, "error": None}
            try:
                lh = bk.create_ledger(ensemble_size=e, write_quorum_size=wq, ack_quorum_size=aq, password=PASSWORD)
            except Exception as exc:
                row["error"] = f"create: {type(exc).__name__}: {exc}"
                f.write(json.dumps(row) + "\n")
                f.flush()
                time.sleep(0.5)
                continue
            row["ledger"] = lh.ledger_id
            try:
                for i in range(entries):
                    if lh.append(payload(lh.ledger_id, i)) != i:
                        raise AssertionError(f"entry {i} got another id")
                    row["acked"] = i + 1
                lh.close()
                row["closed"] = True
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {exc}"
            f.write(json.dumps(row) + "\n")
            f.flush()


def read(conf: str, ledgers_file: str) -> None:
    cfg = load_client_config(conf)
    with open(ledgers_file) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    checked, bad = 0, []
    with BookKeeper(cfg.metadata_service_uri, config=cfg) as bk:
        for row in rows:
            if "ledger" not in row or row["acked"] == 0:
                continue
            lid, acked = row["ledger"], row["acked"]
            try:
                lh = _transient_retry(functools.partial(bk.open_ledger, lid, password=PASSWORD))
                try:
                    lac = lh.last_add_confirmed
                    if lac < acked - 1:
                        bad.append({"ledger": lid, "problem": f"last entry {lac} < last acknowledged {acked - 1}"})
                    got = {}
                    for start in range(0, min(acked, lac + 1), 100):
                        last = min(acked, lac + 1, start + 100) - 1
                        for entry in _transient_retry(functools.partial(lh.read, start, last)):
                            got[entry.entry_id] = bytes(entry.payload)
                finally:
                    lh.close()
            except Exception as exc:
                bad.append({"ledger": lid, "problem": f"{type(exc).__name__}: {exc}"})
                continue
            for i in range(acked):
                checked += 1
                if got.get(i) != payload(lid, i):
                    bad.append({"ledger": lid, "entry": i, "problem": "missing" if i not in got else "different"})
    print(json.dumps({"checked": checked, "bad": bad[:50], "bad_count": len(bad)}))


if __name__ == "__main__":
    if sys.argv[1] == "write":
        a = sys.argv[2:]
        write(a[0], a[1], a[2], int(a[3]), int(a[4]), int(a[5]), int(a[6]), int(a[7]), float(a[8]))
    elif sys.argv[1] == "read":
        read(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit(f"usage: {sys.argv[0]} write|read ...")
