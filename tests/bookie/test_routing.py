"""LedgerRouter (rule 13 of docs/correctness.md): a ledger is served from the ledger dir that holds it, live or
as a tombstone, whatever the number of dirs; only a ledger no dir knows goes to id % dirs."""

from __future__ import annotations

from pathlib import Path

from vellum.bookie.routing import LedgerRouter
from vellum.storage.ledger_storage import LedgerStorage


def _storage(d: Path, *, per_ledger: bool = False) -> LedgerStorage:
    return LedgerStorage(d, log_size_limit=1 << 20, write_cache_max_bytes=1 << 16, read_cache_max_bytes=1 << 16,
                         read_ahead_batch_size=4, max_throttle_time_ms=1000, preallocate=False,
                         entry_log_per_ledger=per_ledger)


def test_a_ledger_is_routed_where_its_data_is(tmp_path: Path) -> None:
    storages = [_storage(tmp_path / f"l{i}") for i in range(3)]
    try:
        storages[0].set_master_key(1, b"k")   # 1 % 3 == 1, but it lives in dir 0 (added dirs)
        storages[0].set_master_key(2, b"k")
        storages[0].delete_ledger(2)          # a tombstone counts as home too
        router = LedgerRouter(storages)
        assert router.storage_of(1) is storages[0]
        assert router.storage_of(2) is storages[0]
        assert router.storage_of(5) is storages[5 % 3]   # unknown everywhere: the default dir
        storages[2].set_master_key(5, b"k")
        assert router.storage_of(5) is storages[2]       # ... and from its first write on, there
        router.forget(1)
        assert router.storage_of(1) is storages[0]       # found again after a forget
        assert LedgerRouter(storages[:1]).storage_of(7) is storages[0]
    finally:
        for s in storages:
            s.close()


def _entry(ledger_id: int, entry_id: int, payload: bytes = b"x" * 40) -> bytes:
    import struct
    return struct.pack(">qqq", ledger_id, entry_id, -1) + b"\0" * 8 + payload


def test_a_new_ledger_goes_to_the_writable_dir_with_fewest_active_logs(tmp_path: Path) -> None:
    storages = [_storage(tmp_path / f"l{i}", per_ledger=True) for i in range(3)]
    writable = {s.ledger_dir: True for s in storages}
    try:
        router = LedgerRouter(storages, lambda d: writable[d])
        for lid in (10, 11):  # two active logs in dir 0 (placed there by hand)
            storages[0].set_master_key(lid, b"k")
            storages[0].add_entry(_entry(lid, 0))
        storages[1].set_master_key(12, b"k")
        storages[1].add_entry(_entry(12, 0))          # one in dir 1, none in dir 2
        assert router.storage_for_write(20) is storages[2]
        writable[storages[2].ledger_dir] = False       # a full dir is never chosen ...
        assert router.storage_for_write(21) is storages[1]
        writable[storages[2].ledger_dir] = True        # ... and is eligible again once writable
        assert router.storage_for_write(22) is storages[2]
    finally:
        for s in storages:
            s.close()


def test_a_ledger_continues_in_another_dir_when_its_dir_fills_and_reads_span_both(tmp_path: Path) -> None:
    storages = [_storage(tmp_path / f"l{i}") for i in range(2)]
    writable = {s.ledger_dir: True for s in storages}
    try:
        router = LedgerRouter(storages, lambda d: writable[d])
        first = router.storage_for_write(7)
        first.set_master_key(7, b"key")
        for e in range(5):
            router.storage_for_write(7).add_entry(_entry(7, e))
        first.set_explicit_lac(7, b"lac-body")
        writable[first.ledger_dir] = False
        second = router.storage_for_write(7)
        assert second is not first
        # The new home learnt the ledger's state before its first entry.
        assert second.get_master_key(7) == b"key" and second.get_explicit_lac(7) == b"lac-body"
        for e in range(5, 9):
            router.storage_for_write(7).add_entry(_entry(7, e))
        assert first.entry_ids(7) == [0, 1, 2, 3, 4] and second.entry_ids(7) == [5, 6, 7, 8]

        view = router.view(7)
        assert [bytes(view.get_entry(7, e))[8:16] for e in range(9)] == [
            e.to_bytes(8, "big") for e in range(9)]
        assert bytes(view.get_entry(7, -1))[8:16] == (8).to_bytes(8, "big")   # the last entry
        assert len(view.get_entries(7, 2, 0, 0)) == 7                          # one run across dirs
        assert len(view.get_entries(7, 2, 4, 0)) == 4
        assert len(view.get_strided(7, 1, 3, 0, 0)) == 3                       # 1, 4, 7
        assert view.entry_ids(7) == list(range(9)) and view.get_last_entry_id(7) == 8
        view.set_fenced(7)
        assert first.is_fenced(7) and second.is_fenced(7)

        # A restart finds both homes again; new entries go to the writable one with the newest.
        again = LedgerRouter(storages, lambda d: writable[d])
        assert again.homes(7) == [first, second]
        assert again.storage_for_write(7) is second
        assert again.view(7).entry_ids(7) == list(range(9))
        writable[first.ledger_dir] = True
        writable[second.ledger_dir] = False
        assert again.storage_for_write(7) is first     # back to a home that is writable again

        again.view(7).delete_ledger(7)
        assert first.is_deleted(7) and second.is_deleted(7)
    finally:
        for s in storages:
            s.close()


def test_a_spanning_ledger_deleted_in_one_dir_refuses_writes_in_the_other(tmp_path: Path) -> None:
    """GC runs per dir: once one home of a ledger holds its tombstone, the ledger is deleted
    for the whole bookie (a write after a delete must not be acknowledged by the other dir)."""
    storages = [_storage(tmp_path / f"l{i}") for i in range(2)]
    try:
        storages[0].set_master_key(3, b"k")
        storages[1].set_master_key(3, b"k")
        storages[0].delete_ledger(3)   # the first dir's GC got there first
        router = LedgerRouter(storages)
        assert router.storage_for_write(3) is storages[0]
        assert router.view(3) is storages[0] and not router.view(3).ledger_exists(3)
    finally:
        for s in storages:
            s.close()


def test_a_fenced_ledger_continues_fenced_and_presence_answers_in_one_call(tmp_path: Path) -> None:
    """A new write home takes the ledger's fence with its key and explicit LAC (a fenced ledger
    must stay fenced in every home, rule 3 of docs/correctness.md); ``presence`` is what routing
    learns of a dir in one call."""
    storages = [_storage(tmp_path / f"l{i}") for i in range(2)]
    writable = {s.ledger_dir: True for s in storages}
    try:
        router = LedgerRouter(storages, lambda d: writable[d])
        first = router.storage_for_write(3)
        first.set_master_key(3, b"key")
        first.add_entry(_entry(3, 0))
        first.add_entry(_entry(3, 1))
        first.set_fenced(3)
        first.set_master_key(4, b"key")
        first.delete_ledger(4)
        assert tuple(first.presence(3))[:3] == (True, False, 1)
        assert tuple(first.presence(4))[:3] == (False, True, -1)   # a tombstone
        other = storages[1] if first is storages[0] else storages[0]
        assert tuple(other.presence(3))[:3] == (False, False, -1)   # nothing of it here
        writable[first.ledger_dir] = False
        second = router.storage_for_write(3)
        assert second is other
        assert second.get_master_key(3) == b"key" and second.is_fenced(3)
        assert second.get_explicit_lac(3) is None
    finally:
        for s in storages:
            s.close()


def test_a_home_never_written_is_chosen_again_and_a_full_bookie_keeps_each_ledger_where_it_is(tmp_path: Path) -> None:
    """The decision's other rows: a write home chosen but never written whose dir fills is
    chosen again like a new ledger's (not continued); with every dir full a new ledger goes to
    its configured-order default (only recovery adds come then) and a ledger with data stays in
    its write home."""
    storages = [_storage(tmp_path / f"l{i}") for i in range(3)]
    writable = {s.ledger_dir: True for s in storages}
    try:
        router = LedgerRouter(storages, lambda d: writable[d])
        chosen = router.storage_for_write(9)
        writable[chosen.ledger_dir] = False
        again = router.storage_for_write(9)
        assert again is not chosen and writable[again.ledger_dir]
        assert router.homes(9) == [again]                   # chosen anew, not continued
        home = router.storage_for_write(11)
        home.set_master_key(11, b"k")
        home.add_entry(_entry(11, 0))
        for s in storages:
            writable[s.ledger_dir] = False
        assert router.storage_for_write(10) is storages[10 % 3]
        assert router.storage_for_write(11) is home and router.homes(11) == [home]
    finally:
        for s in storages:
            s.close()
