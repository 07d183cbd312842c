"""The blocking named-ledger API and the shell commands (names, name, readname, shrink), plus a
named writer's ensemble change (the record names the new bookie before the ledger does)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from names_testkit import unique_name

from vellum.cli.main import cli
from vellum.client.blocking import BookKeeper
from vellum.client.named import EntriesShrunkError
from vellum.client.named_blocking import NamedLedgers, OpenMode
from vellum.errors import LedgerFencedError
from vellum.testing.local_cluster import LocalCluster

QUORUM = {"ensemble_size": 3, "write_quorum_size": 2, "ack_quorum_size": 2}


def shell(uri: str, *args: str) -> str:
    result = CliRunner().invoke(cli, ["shell", *args, "--uri", uri])
    assert result.exit_code == 0, (result.output, result.exception)
    return result.output


def test_blocking_api(sqlite_cluster: LocalCluster) -> None:
    with BookKeeper(sqlite_cluster.metadata_uri) as bk:
        named = NamedLedgers(bk)
        name = unique_name("blocking")
        with named.open(name, OpenMode.CREATE, **QUORUM) as w:
            futures = [w.append_async(f"b{i}".encode()) for i in range(20)]
            assert [f.result(30) for f in futures] == list(range(20))
            assert w.append(b"b20") == 20
            _, version = w.get_cursor("c")
            w.set_cursor("c", b"1", version)
        r = named.open(name, OpenMode.READ_ONLY)
        assert [e.payload for e in r.read(0, 20)] == [f"b{i}".encode() for i in range(21)]
        it = r.tail(5, poll_timeout_s=0.2)
        assert [next(it).entry_id for _ in range(16)] == list(range(5, 21))
        it.close()
        assert named.get_cursor(name, "c")[0] == b"1"
        assert named.list("blocking/") == [name]
        a = named.open(name, OpenMode.APPEND)
        b = named.open(name, OpenMode.APPEND)
        with pytest.raises(LedgerFencedError):
            a.append(b"stale")
        assert b.append(b"b21") == 21
        b.close()
        named.drain()


def test_shell_commands(sqlite_cluster: LocalCluster) -> None:
    uri = sqlite_cluster.metadata_uri
    name = unique_name("shell")
    with BookKeeper(uri) as bk:
        named = NamedLedgers(bk)
        w = named.open(name, OpenMode.CREATE, **QUORUM)
        for i in range(10):
            w.append(f"s{i}".encode())
        w.close()
        w = named.open(name, OpenMode.APPEND)
        for i in range(10, 15):
            w.append(f"s{i}".encode())
        w.close()
        named.drain()

    assert json.loads(shell(uri, "names", "shell/", "--json")) == [name]
    assert name in shell(uri, "names")
    info = json.loads(shell(uri, "name", name, "--json"))
    assert info["state"] == "CLOSED" and info["startEntryId"] == 0 and info["lastEntryId"] == 14
    assert info["writerEpoch"] == 2 and len(info["segments"]) == 2
    assert info["sizeBytes"] == sum(len(f"s{i}") for i in range(15))
    assert "segments" in shell(uri, "name", name)  # the table form
    rows = json.loads(shell(uri, "readname", name, "3", "11", "--show-payload", "--json"))
    assert [r["entryId"] for r in rows] == list(range(3, 12))
    assert rows[-1]["payload"] == "s11" and rows[-1]["ledgerEntryId"] == 1
    out = json.loads(shell(uri, "shrink", name, "12", "--force", "--json"))
    assert out["startEntryId"] == 12 and out["segments"] == 1
    # every bookie of both segments collected before the command returned
    assert out["collected"] is True and len(out["droppedLedgers"]) == 1
    ledgers = {c["ledgerId"] for c in out["collections"]}
    assert len(ledgers) == 2 and out["droppedLedgers"][0] in ledgers
    assert all(c["error"] == "" for c in out["collections"])
    table = shell(uri, "shrink", name, "12", "--force")  # the same point again: asks again
    assert "garbage collection on the bookies (done)" in table
    back = CliRunner().invoke(cli, ["shell", "shrink", name, "11", "--uri", uri])
    assert back.exit_code != 0 and "backwards" in str(back.exception)
    rows = json.loads(shell(uri, "readname", name, "--json"))
    assert [r["entryId"] for r in rows] == [12, 13, 14]
    bad = CliRunner().invoke(cli, ["shell", "readname", name, "0", "1", "--uri", uri])
    assert bad.exit_code != 0 and isinstance(bad.exception, EntriesShrunkError)


def test_named_writer_ensemble_change_is_in_the_record_first(tmp_path: Path) -> None:
    # Four bookies, ensemble of 3: killing one forces an ensemble change onto the fourth. The
    # record must name it, so that the next APPEND fences the bookies that may hold acked entries.
    with LocalCluster(tmp_path / "c", 4) as c, BookKeeper(c.metadata_uri) as bk:
        named = NamedLedgers(bk)
        name = unique_name("ens")
        w = named.open(name, OpenMode.CREATE, **QUORUM)
        for i in range(5):
            w.append(f"e{i}".encode())
        seg = w.record.segments[-1]
        victim = seg.ensembles[0][0]
        c.kill(c.bookie_ids.index(victim))
        for i in range(5, 15):
            w.append(f"e{i}".encode())
        rec = named.record(name).value
        open_seg = rec.segments[-1]
        assert len(open_seg.ensembles) == 2 and victim not in open_seg.ensembles[max(open_seg.ensembles)]
        md = bk.ledger_metadata(open_seg.ledger_id)
        assert {k: tuple(map(str, v)) for k, v in md.ensembles.items()} == dict(open_seg.ensembles)
        w2 = named.open(name, OpenMode.APPEND)
        assert w2.last_add_confirmed == 14
        with pytest.raises(LedgerFencedError):
            w.append(b"stale")
        assert w2.append(b"e15") == 15
        w2.close()
        r = named.open(name, OpenMode.READ_ONLY)
        assert [e.payload for e in r.read(0, 15)] == [f"e{i}".encode() for i in range(16)]
        named.drain()


def test_shell_cursor_shows_a_position_and_deletes_a_retaining_cursor(sqlite_cluster: LocalCluster) -> None:
    from vellum.client.named import PositionCursor
    from vellum.errors import IncorrectParameterError

    uri = sqlite_cluster.metadata_uri
    name = unique_name("cursor")
    with BookKeeper(uri) as bk:
        named = NamedLedgers(bk)
        with named.open(name, OpenMode.CREATE, **QUORUM) as w:
            for i in range(10):
                w.append(f"c{i}".encode())
        version = named.record(name).version
        named.set_cursor(name, "reader", PositionCursor(4, retain=True).encode(), version)
        with pytest.raises(IncorrectParameterError, match="cursor 'reader' retains"):
            named.shrink(name, 6)
        got = json.loads(shell(uri, "cursor", name, "reader", "--json"))
        assert (got["position"], got["retain"], got["lag"], got["deleted"]) == (4, True, 6, False)
        got = json.loads(shell(uri, "cursor", name, "reader", "--delete", "--json"))
        assert got["deleted"] and "reader" not in named.record(name).value.cursors
        assert named.shrink(name, 6).start_entry_id == 6  # nothing holds it back any more
        result = CliRunner().invoke(cli, ["shell", "cursor", name, "reader", "--uri", uri])
        assert result.exit_code != 0 and "has no cursor 'reader'" in result.output
