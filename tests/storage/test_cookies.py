"""Cookies on disk: fresh stamp, restart, wiped / swapped / foreign dirs, storage expansion."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from vellum.errors import CookieError, CorruptionError
from vellum.format.cookie import Cookie
from vellum.storage.cookies import (
    CookieCheck,
    check_cookies,
    check_or_stamp_cookies,
    cookie_path,
    read_cookie,
    write_cookie,
)
from vellum.storage.dirs import current_dir
from vellum.storage.markers import (
    clear_integrity_check_needed,
    integrity_check_needed,
    mark_integrity_check_needed,
)

BOOKIE = "127.0.0.1:3181"
INSTANCE = "instance-1"


@pytest.fixture
def dirs(tmp_path: Path) -> dict[str, list[Path]]:
    return {
        "journal": [tmp_path / "j0"],
        "ledger": [tmp_path / "l0", tmp_path / "l1"],
        "index": [],
    }


def stamp(d: dict[str, list[Path]], **kw: object) -> Cookie:
    args: dict[str, object] = {"instance_id": INSTANCE}
    args.update(kw)
    return check_or_stamp_cookies(
        str(args.pop("bookie_id", BOOKIE)), d["journal"], d["ledger"], d["index"], **args  # type: ignore[arg-type]
    )


def test_fresh_dirs_are_stamped_everywhere(dirs: dict[str, list[Path]]) -> None:
    cookie = stamp(dirs)
    assert cookie.bookie_id == BOOKIE and cookie.instance_id == INSTANCE
    for d in dirs["journal"] + dirs["ledger"]:
        assert current_dir(d).is_dir()
        assert read_cookie(d) == cookie
        assert not (current_dir(d) / "VERSION.tmp").exists()
    assert cookie.ledger_dirs == tuple(str(p) for p in dirs["ledger"])


def test_restart_with_the_same_config_is_accepted(dirs: dict[str, list[Path]]) -> None:
    first = stamp(dirs)
    before = cookie_path(dirs["ledger"][0]).stat().st_mtime_ns
    assert stamp(dirs) == first
    assert cookie_path(dirs["ledger"][0]).stat().st_mtime_ns == before  # not rewritten


def test_wiped_ledger_dir_is_detected(dirs: dict[str, list[Path]]) -> None:
    stamp(dirs)
    shutil.rmtree(dirs["ledger"][1])
    dirs["ledger"][1].mkdir()
    with pytest.raises(CookieError) as exc:
        stamp(dirs)
    assert str(cookie_path(dirs["ledger"][1])) in str(exc.value)
    assert "wiped" in str(exc.value)
    # even with expansion allowed: the dir is listed in the stored cookie
    with pytest.raises(CookieError, match="wiped"):
        stamp(dirs, allow_storage_expansion=True)
    assert read_cookie(dirs["ledger"][1]) is None  # nothing stamped on refusal


def test_every_dir_wiped_while_the_store_holds_the_cookie_is_refused(dirs: dict[str, list[Path]]) -> None:
    """Rule 6 of docs/correctness.md: no dir has a cookie but the metadata store has one for this bookie id:
    all its disks were wiped. Refused, and nothing stamped, so the next start is refused too."""
    stored = stamp(dirs)
    for d in dirs["journal"] + dirs["ledger"]:
        shutil.rmtree(d)
        d.mkdir()
    for _ in range(2):
        with pytest.raises(CookieError, match="none of its directories") as exc:
            stamp(dirs, store_cookie=stored)
        assert "cookie_delete" in str(exc.value) and "new bookie id" in str(exc.value)
        assert all(read_cookie(d) is None for d in dirs["journal"] + dirs["ledger"])
    # A bookie id the cluster has never seen is a fresh bookie.
    assert stamp(dirs, store_cookie=None) == stored


def test_wiped_journal_dir_is_detected(dirs: dict[str, list[Path]]) -> None:
    stamp(dirs)
    shutil.rmtree(dirs["journal"][0])
    with pytest.raises(CookieError, match=str(dirs["journal"][0])):
        stamp(dirs, allow_storage_expansion=True)


def test_swapped_dir_from_another_bookie_is_detected(tmp_path: Path, dirs: dict[str, list[Path]]) -> None:
    stamp(dirs)
    other = {"journal": [tmp_path / "oj"], "ledger": [tmp_path / "ol"], "index": []}
    stamp(other, bookie_id="10.0.0.2:3181")
    # swap: our second ledger disk is replaced by the other bookie's ledger disk
    shutil.rmtree(dirs["ledger"][1])
    shutil.copytree(other["ledger"][0], dirs["ledger"][1])
    with pytest.raises(CookieError) as exc:
        stamp(dirs)
    assert "bookie id differs" in str(exc.value)
    assert str(cookie_path(dirs["ledger"][1])) in str(exc.value)


def test_instance_id_mismatch_is_refused(dirs: dict[str, list[Path]]) -> None:
    stamp(dirs)
    with pytest.raises(CookieError, match="instance id differs"):
        stamp(dirs, instance_id="instance-2")


def test_changed_ledger_dirs_refused_without_expansion(tmp_path: Path, dirs: dict[str, list[Path]]) -> None:
    stamp(dirs)
    dirs["ledger"].append(tmp_path / "l2")
    with pytest.raises(CookieError, match="allowStorageExpansion"):
        stamp(dirs)
    assert read_cookie(tmp_path / "l2") is None


def test_storage_expansion_stamps_the_new_dir_and_the_expanded_cookie(
    tmp_path: Path, dirs: dict[str, list[Path]]
) -> None:
    stamp(dirs)
    dirs["ledger"].append(tmp_path / "l2")
    cookie = stamp(dirs, allow_storage_expansion=True)
    assert cookie.ledger_dirs == tuple(str(p) for p in dirs["ledger"])
    for d in dirs["journal"] + dirs["ledger"]:
        assert read_cookie(d) == cookie
    # and the next start with the same config needs no expansion
    assert stamp(dirs) == cookie


def test_removing_a_ledger_dir_is_refused_even_with_expansion(dirs: dict[str, list[Path]]) -> None:
    stamp(dirs)
    dirs["ledger"].pop()
    with pytest.raises(CookieError, match="no longer has"):
        stamp(dirs, allow_storage_expansion=True)


def test_dir_with_data_but_no_cookie_is_refused(dirs: dict[str, list[Path]]) -> None:
    current_dir(dirs["ledger"][0]).mkdir(parents=True)
    (current_dir(dirs["ledger"][0]) / "0.log").write_bytes(b"BKLO")
    with pytest.raises(CookieError, match="holds data but has no cookie"):
        stamp(dirs)
    assert read_cookie(dirs["journal"][0]) is None


def test_separate_index_dirs_are_stamped_and_shared_dirs_once(tmp_path: Path) -> None:
    d = {"journal": [tmp_path / "j"], "ledger": [tmp_path / "l"], "index": [tmp_path / "i", tmp_path / "l"]}
    cookie = stamp(d)
    assert cookie.index_dirs == (str(tmp_path / "i"), str(tmp_path / "l"))
    assert read_cookie(tmp_path / "i") == cookie
    assert stamp(d) == cookie


def test_corrupt_cookie_names_the_file(dirs: dict[str, list[Path]]) -> None:
    stamp(dirs)
    cookie_path(dirs["ledger"][0]).write_bytes(b"not a cookie")
    with pytest.raises(CorruptionError, match=str(cookie_path(dirs["ledger"][0]))):
        stamp(dirs)


def test_older_layout_cookie_is_upgraded(dirs: dict[str, list[Path]]) -> None:
    expected = stamp(dirs)
    text = expected.encode().decode().replace("5\n", "4\n", 1)
    for d in dirs["journal"] + dirs["ledger"]:
        cookie_path(d).write_text(text)
    assert read_cookie(dirs["ledger"][0]).layout_version == 4  # type: ignore[union-attr]
    assert stamp(dirs) == expected
    assert read_cookie(dirs["ledger"][0]).layout_version == 5  # type: ignore[union-attr]


def test_write_cookie_creates_current(tmp_path: Path) -> None:
    c = Cookie(BOOKIE, ("/j",), ("/l",))
    write_cookie(tmp_path / "x", c)
    assert read_cookie(tmp_path / "x") == c


# -- dataIntegrityStampMissingCookies: stamp over wiped dirs, leave the marker first ------------


def check(d: dict[str, list[Path]], **kw: object) -> CookieCheck:
    return check_cookies(BOOKIE, d["journal"], d["ledger"], d["index"], INSTANCE, **kw)  # type: ignore[arg-type]


def test_every_dir_wiped_is_stamped_over_with_stamp_missing(dirs: dict[str, list[Path]]) -> None:
    stored = stamp(dirs)
    for d in dirs["journal"] + dirs["ledger"]:
        shutil.rmtree(d)
    with pytest.raises(CookieError, match="none of its directories"):
        check(dirs, store_cookie=stored)
    assert integrity_check_needed(dirs["ledger"]) is None
    result = check(dirs, store_cookie=stored, stamp_missing=True)
    assert result.cookie == stored
    assert set(result.stamped_over) == {str(d) for d in dirs["journal"] + dirs["ledger"]}
    assert all(read_cookie(d) == stored for d in dirs["journal"] + dirs["ledger"])
    assert "every directory lost its cookie" in (integrity_check_needed(dirs["ledger"]) or "")
    # The next start finds cookies everywhere: nothing stamped over (the marker tells the rest).
    assert check(dirs, store_cookie=stored, stamp_missing=True).stamped_over == ()


def test_a_crash_between_marker_and_stamp_is_stamped_over_again(dirs: dict[str, list[Path]]) -> None:
    stored = stamp(dirs)
    for d in dirs["journal"] + dirs["ledger"]:
        shutil.rmtree(d)
    mark_integrity_check_needed(dirs["ledger"], "crashed before the stamp")  # not counted as data
    assert check(dirs, store_cookie=stored, stamp_missing=True).stamped_over


def test_stamp_missing_still_refuses_foreign_and_data_dirs(dirs: dict[str, list[Path]]) -> None:
    stored = stamp(dirs)
    for d in dirs["journal"] + dirs["ledger"]:
        shutil.rmtree(d)
    other = Cookie("10.0.0.9:3181", stored.journal_dirs, stored.ledger_dirs, INSTANCE)
    with pytest.raises(CookieError, match="does not match"):
        check(dirs, store_cookie=other, stamp_missing=True)
    assert read_cookie(dirs["ledger"][0]) is None and integrity_check_needed(dirs["ledger"]) is None
    current_dir(dirs["ledger"][0]).mkdir(parents=True)
    (current_dir(dirs["ledger"][0]) / "0.log").write_bytes(b"x")
    with pytest.raises(CookieError, match="holds data"):
        check(dirs, store_cookie=stored, stamp_missing=True)


def test_wiped_journal_or_ledger_dir_is_stamped_over_with_stamp_missing(dirs: dict[str, list[Path]]) -> None:
    stored = stamp(dirs)
    for wiped in (dirs["journal"][0], dirs["ledger"][1]):
        shutil.rmtree(wiped)
        with pytest.raises(CookieError, match="wiped"):
            check(dirs)
        result = check(dirs, stamp_missing=True)
        assert result.cookie == stored and result.stamped_over == (str(wiped),)
        assert read_cookie(wiped) == stored
        assert str(wiped) in (integrity_check_needed(dirs["ledger"]) or "")
        clear_integrity_check_needed(dirs["ledger"])
