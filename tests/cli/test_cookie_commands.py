"""``vellum shell cookie_get`` / ``cookie_delete``: the metadata store's copy of a bookie's
cookie, which a bookie with every disk wiped is refused against (rule 6 of docs/correctness.md)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from vellum.cli.main import cli
from vellum.format.cookie import Cookie
from vellum.ids import BookieId
from vellum.meta import open_metadata_store


def test_cookie_get_and_delete(tmp_path: Path) -> None:
    uri = f"sqlite://{tmp_path / 'm.db'}"
    run = CliRunner().invoke
    assert run(cli, ["shell", "metaformat", "--uri", uri]).exit_code == 0
    cookie = Cookie(bookie_id="127.0.0.1:3181", journal_dirs=("/j",), ledger_dirs=("/l0", "/l1"), instance_id="i-1")
    with open_metadata_store(uri) as s:
        s.registration.put_cookie(BookieId("127.0.0.1:3181"), cookie.encode(), None)
    r = run(cli, ["shell", "cookie_get", "--uri", uri, "127.0.0.1:3181", "--json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.output)
    assert (got["bookie_id"], got["ledger_dirs"], got["instance_id"]) == ("127.0.0.1:3181", "/l0, /l1", "i-1")
    r = run(cli, ["shell", "cookie_delete", "--uri", uri, "127.0.0.1:3181"], input="n\n")
    assert r.exit_code != 0
    r = run(cli, ["shell", "cookie_delete", "--uri", uri, "127.0.0.1:3181", "--yes"])
    assert r.exit_code == 0, r.output
    with open_metadata_store(uri) as s:
        assert s.registration.get_cookie(BookieId("127.0.0.1:3181")) is None
    r = run(cli, ["shell", "cookie_get", "--uri", uri, "127.0.0.1:3181"])
    assert r.exit_code != 0 and "holds no cookie" in r.output
    r = run(cli, ["shell", "cookie_delete", "--uri", uri, "127.0.0.1:3181", "--yes"])
    assert r.exit_code != 0 and "holds no cookie" in r.output
