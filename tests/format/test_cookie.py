"""Cookie text: BookKeeper's layout (version 5, TextFormat), version 3 read-only, errors, and
verify_matches naming the differing field."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vellum.errors import CookieError, CorruptionError, UnknownFormatVersionError
from vellum.format.cookie import CURRENT_COOKIE_LAYOUT_VERSION, Cookie


def make(**kw: object) -> Cookie:
    base: dict[str, object] = {
        "bookie_id": "127.0.0.1:3181",
        "journal_dirs": ("/data/j1",),
        "ledger_dirs": ("/data/l1", "/data/l2"),
        "instance_id": "6c7e2b7a-0d8e-4e0f-9d2a-1b2c3d4e5f60",
    }
    base.update(kw)
    return Cookie(**base)  # type: ignore[arg-type]


def test_encode_is_bookkeeper_text() -> None:
    c = make(journal_dirs=("/j1", "/j2"), index_dirs=("/idx",))
    assert c.encode().decode() == (
        "5\n"
        'bookieHost: "127.0.0.1:3181"\n'
        'journalDir: "/j1,/j2"\n'
        'ledgerDirs: "2\\t/data/l1\\t/data/l2"\n'
        'instanceId: "6c7e2b7a-0d8e-4e0f-9d2a-1b2c3d4e5f60"\n'
        'indexDirs: "1\\t/idx"\n'
    )


def test_optional_fields_are_omitted() -> None:
    text = make(instance_id=None).encode().decode()
    assert "instanceId" not in text and "indexDirs" not in text
    assert Cookie.decode(text.encode()) == make(instance_id=None)


def test_decode_bookkeeper_v4_text_with_comments_and_spacing() -> None:
    text = (
        "4\n"
        "# written by BookKeeper 4.14\n"
        'bookieHost:"bk1:3181"\n'
        "journalDir: 'bk/journal'\n"
        'ledgerDirs: "1\\tbk/ledgers"  \n'
    )
    c = Cookie.decode(text.encode())
    assert (c.layout_version, c.bookie_id, c.journal_dirs, c.ledger_dirs) == (
        4, "bk1:3181", ("bk/journal",), ("bk/ledgers",),
    )
    assert c.instance_id is None and c.index_dirs is None


def test_decode_version_3_plain_lines() -> None:
    c = Cookie.decode(b"3\nbk1:3181\n/j\n2\t/l1\t/l2\n")
    assert c == Cookie("bk1:3181", ("/j",), ("/l1", "/l2"), layout_version=3)
    # read-only: re-encoding writes the current layout
    assert c.encode().startswith(f"{CURRENT_COOKIE_LAYOUT_VERSION}\n".encode())


def test_non_ascii_dirs_use_octal_escapes_and_round_trip() -> None:
    c = make(ledger_dirs=("/données",))
    assert b"\\303\\251" in c.encode()
    assert Cookie.decode(c.encode()) == c


@given(
    bookie=st.text(min_size=1, max_size=30).filter(lambda s: "\x00" not in s),
    dirs=st.lists(
        st.text(min_size=1, max_size=20).filter(lambda s: "\t" not in s and "," not in s),
        min_size=1, max_size=4,
    ),
    instance=st.one_of(st.none(), st.text(min_size=1, max_size=40)),
)
def test_round_trip(bookie: str, dirs: list[str], instance: str | None) -> None:
    c = Cookie(bookie, tuple(dirs), tuple(reversed(dirs)), instance, tuple(dirs))
    assert Cookie.decode(c.encode()) == c


@pytest.mark.parametrize(
    ("data", "error", "needle"),
    [
        (b"", CorruptionError, "empty cookie"),
        (b"hello\nworld\n", CorruptionError, "'hello'"),
        (b"6\nbookieHost: \"x\"\n", UnknownFormatVersionError, "version 6"),
        (b"2\nx\n", CookieError, "too old"),
        (b"5\nbookieHost: \"x\"\n", CorruptionError, "no journalDir"),
        (b'5\nbookieHost: "x"\njournalDir: "/j"\nledgerDirs: "2\\t/l"\n', CorruptionError, "says 2 dirs"),
        (b'5\nbookieHost: "x"\nfoo: "y"\n', CorruptionError, "unknown cookie field 'foo'"),
        (b'5\nbookieHost: "x\n', CorruptionError, "unterminated"),
        (b"5\nbookieHost: 12\n", CorruptionError, "not a quoted string"),
        (b"3\nbk:1\n/j\n", CorruptionError, "3 lines"),
        (b"\xff\xfe", CorruptionError, "not UTF-8"),
    ],
)
def test_garbage_is_rejected_naming_what_was_found(data: bytes, error: type[Exception], needle: str) -> None:
    with pytest.raises(error) as exc:
        Cookie.decode(data, where="/x/current/VERSION")
    assert needle in str(exc.value)
    assert "/x/current/VERSION" in str(exc.value)


@pytest.mark.parametrize(
    ("other", "needle"),
    [
        (make(bookie_id="10.0.0.9:3181"), "bookie id differs"),
        (make(journal_dirs=("/data/j2",)), "journal dirs differ"),
        (make(ledger_dirs=("/data/l1",)), "ledger dirs differ"),
        (make(ledger_dirs=("/data/l2", "/data/l1")), "ledger dirs differ"),
        (make(instance_id="another-cluster"), "instance id differs"),
        (make(instance_id=None), "instance id differs"),
        (make(index_dirs=("/idx",)), "index dirs differ"),
    ],
)
def test_verify_names_the_differing_field(other: Cookie, needle: str) -> None:
    with pytest.raises(CookieError, match=needle):
        make().verify_matches(other, allow_expansion=False)


def test_verify_accepts_equal_cookies_of_older_layout() -> None:
    make().verify_matches(make(layout_version=4), allow_expansion=False)


def test_expansion_allows_a_superset_of_ledger_dirs_only() -> None:
    expected = make(ledger_dirs=("/data/l1", "/data/l2", "/data/l3"))
    stored = make()
    with pytest.raises(CookieError, match="allowStorageExpansion"):
        expected.verify_matches(stored, allow_expansion=False)
    expected.verify_matches(stored, allow_expansion=True)
    # a dir removed from the configuration is never accepted
    with pytest.raises(CookieError, match=r"no longer has"):
        make(ledger_dirs=("/data/l1",)).verify_matches(stored, allow_expansion=True)
    # journal dirs cannot expand
    with pytest.raises(CookieError, match="journal dirs differ"):
        make(journal_dirs=("/data/j1", "/data/j2")).verify_matches(stored, allow_expansion=True)


def test_unencodable_dirs_are_refused() -> None:
    with pytest.raises(CookieError, match="TAB"):
        make(ledger_dirs=("/a\tb",))
    with pytest.raises(CookieError, match="','"):
        make(journal_dirs=("/a,b",))
