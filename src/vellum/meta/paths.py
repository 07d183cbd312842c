"""ZooKeeper paths of BookKeeper's metadata layout, and key rules of the key-value area.

Responsibility: map ledger ids to znode paths and back for the flat and hierarchical ledger
managers, name the fixed paths under the root, and validate key-value keys. Pure functions.

Invariants:
- flat: ``{root}/L%010d``;
- hierarchical: ids below Integer.MAX_VALUE use the 2/4/4 split of ``%010d``
  (1 -> ``{root}/00/0000/L0001``: at most 10,000 ledgers per leaf node); larger ids use
  BookKeeper's 3/4/4/4/4 split of ``%019d`` (``{root}/000/0000/0000/0000/L0001``). Every level
  name is fixed-width decimal, so lexicographic order of names is numeric order of ids;
- a path that does not match its layout parses to ``None`` (never a wrong id);
- under-replicated ledger records (AutoRecovery) live at BookKeeper's
  ``{root}/underreplication/ledgers/%04x/%04x/%04x/%04x/urL%010d``: the 64-bit id split into four
  16-bit groups in lower-case hex, most significant first (so names sort in id order at every
  level), and their locks at ``{root}/underreplication/locks/urL%010d``.
"""

from __future__ import annotations

import re

from vellum.errors import IncorrectParameterError

INT32_MAX = (1 << 31) - 1

AVAILABLE = "available"
READONLY = "readonly"
COOKIES = "cookies"
LAYOUT = "LAYOUT"
INSTANCEID = "INSTANCEID"
IDGEN = "idgen"
KV = "vellum-kv"
UNDERREPLICATION = "underreplication"
#: names under the root that are never ledger nodes (BookKeeper's plus ours)
RESERVED = frozenset({AVAILABLE, COOKIES, LAYOUT, INSTANCEID, IDGEN, "idgen-long", UNDERREPLICATION, KV})

# Names under {root}/underreplication (BookKeeper's BookKeeperConstants and AuditorElector).
UR_LEDGERS = "ledgers"
UR_LOCKS = "locks"
UR_LAYOUT = "LAYOUT"
UR_DISABLE = "disable"
UR_LOST_BOOKIE_RECOVERY_DELAY = "lostBookieRecoveryDelay"
UR_AUDITOR_ELECTION = "auditorelection"
UR_CHECK_ALL_LEDGERS_CTIME = "checkallledgersctime"
UR_PLACEMENT_POLICY_CHECK_CTIME = "placementpolicycheckctime"
UR_REPLICAS_CHECK_CTIME = "replicascheckctime"
UR_PREFIX = "urL"
VOTE_PREFIX = "V_"


def flat_ledger_path(root: str, ledger_id: int) -> str:
    _check_id(ledger_id)
    return f"{root}/L{ledger_id:010d}"


def hierarchical_ledger_path(root: str, ledger_id: int) -> str:
    _check_id(ledger_id)
    if ledger_id < INT32_MAX:
        s = f"{ledger_id:010d}"
        return f"{root}/{s[0:2]}/{s[2:6]}/L{s[6:10]}"
    return long_hierarchical_ledger_path(root, ledger_id)


def long_hierarchical_ledger_path(root: str, ledger_id: int) -> str:
    """BookKeeper's LongHierarchical layout, for every id: 19 digits split 3/4/4/4/4."""
    _check_id(ledger_id)
    s = f"{ledger_id:019d}"
    return f"{root}/{s[0:3]}/{s[3:7]}/{s[7:11]}/{s[11:15]}/L{s[15:19]}"


def parse_flat_name(name: str) -> int | None:
    """``L0000000042`` -> 42; anything else -> None."""
    if len(name) == 11 and name[0] == "L" and name[1:].isdigit():
        return int(name[1:])
    return None


def ur_ledger_parent(ur_ledgers: str, ledger_id: int) -> str:
    """The leaf directory of an under-replicated record (``getParentZnodePath``): 4/4/4/4 hex."""
    _check_id(ledger_id)
    return (
        f"{ur_ledgers}/{ledger_id >> 48 & 0xFFFF:04x}/{ledger_id >> 32 & 0xFFFF:04x}"
        f"/{ledger_id >> 16 & 0xFFFF:04x}/{ledger_id & 0xFFFF:04x}"
    )


def ur_ledger_path(ur_ledgers: str, ledger_id: int) -> str:
    """``{ur_ledgers}/cafe/beef/0000/feed/urL<id>`` (BookKeeper's ``getUrLedgerZnode``)."""
    return f"{ur_ledger_parent(ur_ledgers, ledger_id)}/{UR_PREFIX}{ledger_id:010d}"


def ur_lock_path(ur_locks: str, ledger_id: int) -> str:
    _check_id(ledger_id)
    return f"{ur_locks}/{UR_PREFIX}{ledger_id:010d}"


def parse_ur_name(name: str) -> int | None:
    """``urL0000000042`` -> 42 (at least 10 digits; ids >= 10^10 have more); anything else -> None."""
    digits = name[len(UR_PREFIX):]
    if name.startswith(UR_PREFIX) and len(digits) >= 10 and digits.isascii() and digits.isdigit():
        value = int(digits)
        return value if value < (1 << 63) else None
    return None


def is_ur_level_name(name: str) -> bool:
    """A level of the under-replicated hierarchy: exactly four lower-case hex digits."""
    return len(name) == 4 and all(c in "0123456789abcdef" for c in name)


def parse_vote_seq(name: str) -> int | None:
    """``V_0000000007`` -> 7 (an auditor election vote); anything else -> None."""
    digits = name[len(VOTE_PREFIX):]
    if name.startswith(VOTE_PREFIX) and digits.isascii() and digits.isdigit():
        return int(digits)
    return None


def _check_id(ledger_id: int) -> None:
    if not 0 <= ledger_id < (1 << 63):
        raise IncorrectParameterError(f"ledger id {ledger_id} out of range 0..2^63-1")


_SEGMENT = re.compile(r"^[A-Za-z0-9._~:@=+\-]+$")


def validate_kv_key(key: str) -> str:
    """Check a key-value key (see ``KeyValueStore``); returns it unchanged."""
    if not key or len(key) > 1024:
        raise IncorrectParameterError(f"key-value key must be 1..1024 characters, got {len(key)}")
    for seg in key.split("/"):
        if seg in ("", ".", "..") or not _SEGMENT.match(seg):
            raise IncorrectParameterError(
                f"bad key-value key {key!r}: segments are non-empty [A-Za-z0-9._~:@=+-], not '.' or '..'"
            )
    return key
