"""TextFormat strings (format/text_format.py) as the cookie and the under-replication records print and read them."""

from __future__ import annotations

from vellum.format.cookie import Cookie
from vellum.format.text_format import escape_text
from vellum.meta.underreplication import format_text_proto, parse_text_proto

VALUE = 'bookie "é"\t\\ \x01\''


def test_escape_text_as_java_prints_it() -> None:
    assert escape_text(VALUE) == 'bookie \\"\\303\\251\\"\\t\\\\ \\001\\\''


def test_under_replication_text_round_trips_escaped_strings() -> None:
    data = format_text_proto([("replica", VALUE), ("ctime", 5)])
    assert data == b'replica: "bookie \\"\\303\\251\\"\\t\\\\ \\001\\\'"\nctime: 5\n'
    assert parse_text_proto(data, where="test") == [("replica", VALUE), ("ctime", 5)]


def test_cookie_round_trips_escaped_strings() -> None:
    cookie = Cookie(bookie_id="h:1", journal_dirs=("/j",), ledger_dirs=("/l/" + VALUE.replace("\t", " "),), instance_id="i")
    assert Cookie.decode(cookie.encode(), where="test") == cookie
