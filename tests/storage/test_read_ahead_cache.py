"""ReadAheadCache alone: when to read ahead, what a fill keeps, eviction by delete/trim and size."""

from __future__ import annotations

from vellum.storage.read_ahead_cache import ReadAheadCache


def run(ledger_id: int, first: int, n: int, size: int = 10) -> list[memoryview]:
    """Entries ``first .. first + n - 1`` as a read-ahead hands them over (views)."""
    return [memoryview(bytes([e % 256]) * size) for e in range(first, first + n)]


def test_a_forward_reader_claims_each_window_once_and_a_random_one_never() -> None:
    cache = ReadAheadCache(max_bytes=1 << 20, batch_size=10, batch_max_bytes=0)
    assert cache.enabled
    assert cache.claim(1, 0)  # first miss of the ledger
    assert not cache.claim(1, 5)  # inside the window claimed at 0 (still being read)
    assert cache.claim(1, 11)  # just past it: the next window
    assert not cache.claim(1, 500)  # a jump: random, no read-ahead
    assert not cache.claim(1, 20)  # backwards
    assert cache.claim(2, 7)  # ledgers are independent
    assert not ReadAheadCache(max_bytes=0, batch_size=10, batch_max_bytes=0).enabled
    assert not ReadAheadCache(max_bytes=1, batch_size=0, batch_max_bytes=0).enabled


def test_fill_keeps_copies_and_an_eviction_since_drops_the_fill() -> None:
    cache = ReadAheadCache(max_bytes=1 << 20, batch_size=10, batch_max_bytes=0)
    assert cache.claim(1, 0)
    epoch = cache.epoch
    following = run(1, 1, 3)
    cache.fill(1, 0, following, epoch)
    got = cache.get((1, 2))
    assert got == bytes([2]) * 10 and type(got) is bytes  # a copy, not a view of the read buffer
    assert cache.contains((1, 3)) and not cache.contains((1, 4))
    # A delete while a read-ahead runs: its entries are never cached.
    assert cache.claim(1, 11)
    epoch = cache.epoch
    cache.evict(1, None)
    cache.fill(1, 11, run(1, 12, 3), epoch)
    assert not any(cache.contains((1, e)) for e in range(1, 15))


def test_trim_evicts_below_and_the_window_covered_is_what_was_read() -> None:
    cache = ReadAheadCache(max_bytes=1 << 20, batch_size=10, batch_max_bytes=0)
    assert cache.claim(1, 0)
    cache.fill(1, 0, run(1, 1, 4), cache.epoch)  # the run ended early, at entry 4
    assert cache.claim(1, 5)  # so a miss at 5 is a new window, not "covered"
    cache.evict(1, below=3)
    assert [e for e in range(1, 5) if cache.contains((1, e))] == [3, 4]


def test_least_recently_used_entries_go_first_when_full() -> None:
    cache = ReadAheadCache(max_bytes=30, batch_size=10, batch_max_bytes=0)
    cache.fill(1, 0, run(1, 1, 3), cache.epoch)  # 30 bytes: full
    assert cache.get((1, 1)) is not None  # 1 is now the most recently used
    cache.fill(2, 0, run(2, 1, 1), cache.epoch)
    assert cache.contains((1, 1)) and not cache.contains((1, 2)) and cache.contains((2, 1))


def test_a_claim_grants_the_window_to_read_and_nothing_when_read_ahead_is_off() -> None:
    cache = ReadAheadCache(max_bytes=1 << 20, batch_size=4, batch_max_bytes=100)
    assert cache.claim(1, 0) == (4, 100)  # read at most 4 entries, 100 bytes, after entry 0
    assert cache.claim(1, 1) is None  # inside the window granted at 0: nothing to read
    assert cache.claim(1, 900) is None  # a jump: random, nothing to read
    off = ReadAheadCache(max_bytes=1 << 20, batch_size=0, batch_max_bytes=0)
    assert off.claim(1, 0) is None
    assert off.claim(1, 1) is None  # off: no window is ever granted, whatever the pattern
