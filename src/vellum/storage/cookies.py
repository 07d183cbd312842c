"""Stamp and verify the cookie (``current/VERSION``) in every journal, ledger and index dir.

Rule 6 of docs/correctness.md: a cookie ties a bookie to its disks, so a wiped disk must not rejoin silently.
At start the bookie calls ``check_or_stamp_cookies``:

- every dir has no cookie and no data (fresh bookie): create ``current/`` everywhere and stamp
  the cookie in each dir, unless the metadata store already holds a cookie for this bookie id
  (``store_cookie``): then every disk of a bookie the cluster knows was wiped or replaced, and
  the bookie may have acknowledged entries it no longer has. Refused before anything is
  stamped, so a second start is refused too;
- every dir has a cookie and all match the configuration: nothing to do;
- some dirs have a cookie and others do not: a wiped or newly added disk. Refused, naming the
  dir, unless ``allow_storage_expansion`` and the empty dir is a *new* ledger/index dir (not
  listed in the stored cookie): then the expanded cookie is stamped in the new dir and re-stamped
  everywhere;
- a cookie differs from the configuration (another bookie id, other journal/ledger dirs, another
  instance id): refused (swapped disk, foreign bookie);
- a dir without a cookie that already holds files in ``current/``: refused (data whose owner
  cannot be proven).

With ``stamp_missing`` (``dataIntegrityChecking`` and ``dataIntegrityStampMissingCookies``,
as BookKeeper's ``DataIntegrityCookieValidation``) the two "wiped" refusals above become a
stamp over the missing cookies: every dir wiped while the store holds the cookie, or a journal,
ledger or index dir the stored cookie lists that lost its cookie. The dirs stamped over are
reported (``CookieCheck.stamped_over``) and, before any cookie is written, the
``INTEGRITY_CHECK_NEEDED`` marker goes to every ledger dir (``storage/markers.py``): the bookie
may have acknowledged entries it no longer holds, and must mark its ledgers limbo before it
serves (rule 12 of docs/correctness.md), even if it crashes between the stamp and that marking. A dir that holds
data without a cookie, a foreign or mismatching cookie and a new dir without
``allowStorageExpansion`` are refused as before.

Cookies of an older layout (3, 4) that match are re-stamped in the current layout (5).
Every stamp is durable (temp file, fsync, rename, fsync dir). The metadata-store copy of the
cookie (``/ledgers/cookies/<bookieId>``) is read by the layer above and passed in; after the
disks are checked, that layer compares it against the returned Cookie.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from vellum.errors import CookieError, StorageError
from vellum.format.cookie import VERSION_FILENAME, Cookie
from vellum.storage.dirs import current_dir
from vellum.storage.durable import fsync_dir, write_file_durably
from vellum.storage.markers import INTEGRITY_CHECK_FILENAME, mark_integrity_check_needed

log = logging.getLogger(__name__)

#: test flag (the simulator's ``start-wiped-bookie`` regression, docs/verification.md): False
#: lets a bookie whose every disk was wiped start empty although the store holds its cookie
_refuse_wiped_bookie = True

# Files the bookie itself may create in a fresh ``current/`` before or while cookies are
# stamped (the dir lock, the unclean-shutdown marker, a torn stamp); they do not count as data.
_IGNORED_IN_FRESH_DIR = {".lock", "DIRTY", "DIRTY.tmp", VERSION_FILENAME + ".tmp",
                         INTEGRITY_CHECK_FILENAME, INTEGRITY_CHECK_FILENAME + ".tmp"}


@dataclass(frozen=True)
class CookieCheck:
    """What ``check_cookies`` found: the cookie now on every disk, and the dirs whose missing
    cookie was stamped over (their data is lost; empty unless ``stamp_missing``)."""

    cookie: Cookie
    stamped_over: tuple[str, ...] = ()


def cookie_path(dir: Path | str) -> Path:
    """``<dir>/current/VERSION``."""
    return current_dir(dir) / VERSION_FILENAME


def read_cookie(dir: Path | str) -> Cookie | None:
    """The cookie stamped in ``dir`` (None if there is none). CorruptionError names the file."""
    path = cookie_path(dir)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise StorageError(f"cannot read cookie {path}: {e.strerror or e}") from e
    return Cookie.decode(data, where=str(path))


def write_cookie(dir: Path | str, cookie: Cookie) -> None:
    """Create ``<dir>/current`` if needed and stamp ``cookie`` durably."""
    cur = current_dir(dir)
    try:
        if not cur.is_dir():
            cur.mkdir(parents=True, exist_ok=True)
            fsync_dir(cur.parent)
    except OSError as e:
        raise StorageError(f"cannot create {cur}: {e.strerror or e}") from e
    write_file_durably(cur / VERSION_FILENAME, cookie.encode())


def _has_data(dir: Path) -> bool:
    cur = current_dir(dir)
    try:
        return any(p.name not in _IGNORED_IN_FRESH_DIR for p in cur.iterdir())
    except FileNotFoundError:
        return False
    except NotADirectoryError:
        return True
    except OSError as e:
        raise StorageError(f"cannot list {cur}: {e.strerror or e}") from e


def _unique(paths: Sequence[Path | str]) -> list[str]:
    out: list[str] = []
    for p in paths:
        s = str(p)
        if s not in out:
            out.append(s)
    return out


def check_or_stamp_cookies(
    bookie_id: str,
    journal_dirs: Sequence[Path | str],
    ledger_dirs: Sequence[Path | str],
    index_dirs: Sequence[Path | str],
    instance_id: str | None,
    *,
    allow_storage_expansion: bool = False,
    store_cookie: Cookie | None = None,
) -> Cookie:
    """Verify (or, on a fresh bookie, stamp) the cookie of every dir; return the cookie now on
    disk. ``index_dirs`` empty means the index lives in the ledger dirs. ``store_cookie`` is the
    metadata store's copy for this bookie id (None if the cluster has never seen it). Raises
    CookieError naming the offending dir; CorruptionError if a VERSION file is unreadable."""
    return check_cookies(
        bookie_id, journal_dirs, ledger_dirs, index_dirs, instance_id,
        allow_storage_expansion=allow_storage_expansion, store_cookie=store_cookie,
    ).cookie


def check_cookies(
    bookie_id: str,
    journal_dirs: Sequence[Path | str],
    ledger_dirs: Sequence[Path | str],
    index_dirs: Sequence[Path | str],
    instance_id: str | None,
    *,
    allow_storage_expansion: bool = False,
    store_cookie: Cookie | None = None,
    stamp_missing: bool = False,
) -> CookieCheck:
    """``check_or_stamp_cookies``, and with ``stamp_missing`` the wiped dirs are stamped over
    instead of refused (see the module docstring); ``CookieCheck.stamped_over`` names them."""
    journals = tuple(str(d) for d in journal_dirs)
    ledgers = tuple(str(d) for d in ledger_dirs)
    indexes = tuple(str(d) for d in index_dirs) or None
    expected = Cookie(
        bookie_id=bookie_id,
        journal_dirs=journals,
        ledger_dirs=ledgers,
        instance_id=instance_id or None,
        index_dirs=indexes,
    )
    all_dirs = _unique([*journals, *ledgers, *(indexes or ())])
    found: dict[str, Cookie | None] = {d: read_cookie(d) for d in all_dirs}
    stamped = {d: c for d, c in found.items() if c is not None}
    missing = [d for d, c in found.items() if c is None]

    for d in missing:
        if _has_data(Path(d)):
            raise CookieError(
                f"{current_dir(d)} holds data but has no cookie ({VERSION_FILENAME}): it may belong "
                "to another bookie or have lost its cookie. Refusing to use it; move the data "
                "away or restore the cookie"
            )

    if not stamped and store_cookie is not None and stamp_missing:
        # Every disk was wiped: the same bookie (the store's cookie must describe it), with
        # nothing of what it held. Marked before the first stamp (see the module docstring).
        try:
            expected.verify_matches(store_cookie, allow_expansion=allow_storage_expansion)
        except CookieError as e:
            raise CookieError(f"the metadata store's cookie of {bookie_id} does not match this bookie: {e}") from None
        log.warning("every directory of bookie %s lost its cookie while the metadata store holds it: "
                    "stamping over %s (dataIntegrityStampMissingCookies); its ledgers go limbo",
                    bookie_id, ", ".join(all_dirs))
        mark_integrity_check_needed(ledgers, f"every directory lost its cookie: {', '.join(all_dirs)}")
        for d in all_dirs:
            write_cookie(d, expected)
        return CookieCheck(expected, tuple(all_dirs))

    if not stamped and store_cookie is not None and _refuse_wiped_bookie:
        raise CookieError(
            f"the metadata store holds a cookie for bookie {bookie_id} but none of its directories "
            f"({', '.join(all_dirs)}) has one: every disk of this bookie was wiped or replaced, and "
            "it may have acknowledged entries it no longer holds. Rejoining under the same id would "
            "let ledger recovery take its empty answers as proof that those entries never existed. "
            "Nothing was stamped. If the disks can be restored, restore them. Otherwise start it "
            "under a new bookie id (bookieId or bookiePort) with empty directories and let the "
            "lost bookie's ledgers be re-replicated; only if this bookie never held data that is "
            f"not elsewhere, remove the stored cookie with `vellum shell cookie_delete {bookie_id}`"
        )

    if not stamped:
        log.info("fresh bookie %s: stamping cookies in %s", bookie_id, ", ".join(all_dirs))
        for d in all_dirs:
            write_cookie(d, expected)
        return CookieCheck(expected)

    # Every stamped dir must describe this bookie (exactly, or as a subset under expansion).
    for d, c in stamped.items():
        try:
            expected.verify_matches(c, allow_expansion=allow_storage_expansion)
        except CookieError as e:
            raise CookieError(f"cookie {cookie_path(d)} does not match this bookie: {e}") from None

    # Expansion is only legal when every stored cookie agrees on the old dir set.
    distinct = {c.with_dirs(c.ledger_dirs, c.index_dirs) for c in stamped.values()}
    if len(distinct) > 1:
        listing = "; ".join(f"{cookie_path(d)}: ledger dirs {list(c.ledger_dirs)}" for d, c in stamped.items())
        raise CookieError(f"the bookie's directories carry different cookies ({listing}); fix them by hand")
    stored = next(iter(stamped.values()))

    stamped_over: tuple[str, ...] = ()
    if missing:
        known = set(stored.ledger_dirs) | set(stored.index_dirs or ())
        wiped = [d for d in missing if d in known or d in journals]
        new_dirs = [d for d in missing if d not in wiped]
        if stamp_missing and wiped and (allow_storage_expansion or not new_dirs):
            # A wiped journal (entries acknowledged since the last checkpoint are gone) or a
            # wiped ledger/index dir (its ledgers are gone): stamped over, ledgers go limbo.
            log.warning("%s lost its cookie while %s has one: stamping over it "
                        "(dataIntegrityStampMissingCookies); the bookie's ledgers go limbo",
                        ", ".join(wiped), cookie_path(next(iter(stamped))))
            mark_integrity_check_needed(ledgers, f"directories lost their cookie: {', '.join(wiped)}")
            stamped_over = tuple(wiped)
        elif wiped or not allow_storage_expansion:
            bad = wiped or missing
            raise CookieError(
                f"no cookie in {', '.join(str(cookie_path(d)) for d in bad)} while "
                f"{cookie_path(next(iter(stamped)))} has one: the directory was wiped or is a new "
                "disk. A wiped disk must not rejoin silently: decommission the bookie and re-add it "
                "with empty dirs"
                + ("" if wiped else ", or set allowStorageExpansion=true to add a new ledger dir")
            )
        if new_dirs:
            log.warning("storage expansion: stamping new dirs %s for bookie %s", new_dirs, bookie_id)
    elif stored.ledger_dirs == expected.ledger_dirs and (stored.index_dirs or None) == indexes and (
        stored.layout_version == expected.layout_version
    ):
        return CookieCheck(stored)

    # Expansion (new dirs, or dirs added to the configuration whose cookie was re-stamped
    # elsewhere): stamp the expanded cookie everywhere; new dirs first so a crash midway leaves
    # the old dirs with the old (subset) cookie, which the next start accepts again.
    for d in missing:
        write_cookie(d, expected)
    for d in stamped:
        write_cookie(d, expected)
    return CookieCheck(expected, stamped_over)


def verify_cookie_file(dir: Path | str) -> Cookie:
    """Read a dir's cookie for inspection; CookieError if there is none."""
    cookie = read_cookie(dir)
    if cookie is None:
        raise CookieError(f"no cookie in {cookie_path(dir)}")
    return cookie
