"""``AddBatch``, the one batch type of the ADD path: built from rows or single requests with the
same columns the decoder fills, narrowed and joined without changing an add."""

from __future__ import annotations

from vellum.format.entry import DigestManager, DigestType
from vellum.proto.messages import FLAG_RECOVERY_ADD, AddBatch, AddRequest

KEY = bytes(range(20))


def _entry(ledger_id: int, entry_id: int, lac: int) -> bytes:
    return DigestManager(ledger_id, DigestType.CRC32C).compute(entry_id, lac, 0, b"payload %d" % entry_id)


def test_rows_become_the_columns_the_decoder_fills() -> None:
    good = _entry(5, 3, 2)
    mutable = bytearray(_entry(6, 0, -1))
    batch = AddBatch.of_entries([(good, KEY, False), (mutable, bytearray(KEY), True), (b"short", KEY, 0)])
    assert batch.ledger_ids == [5, 6, -1] and batch.entry_ids == [3, 0, -1] and batch.lacs == [2, -1, -1]
    assert batch.flags == [0, FLAG_RECOVERY_ADD, 0] and batch.recovery() == [False, True, False]
    assert batch.entries[0] is good  # bytes are kept as they are
    assert type(batch.entries[1]) is bytes and batch.entries[1] == mutable  # a writable buffer is copied
    assert batch.keys == [KEY, KEY, KEY] and all(type(k) is bytes for k in batch.keys)
    view = memoryview(good).toreadonly()
    assert AddBatch.of_entries([(view, KEY, 0)]).entries[0] is view  # a read-only view is kept too


def test_single_requests_take_and_concat_keep_every_column() -> None:
    requests = [AddRequest(KEY, _entry(9, e, e - 1), flags=FLAG_RECOVERY_ADD if e == 2 else 0) for e in range(4)]
    batch = AddBatch.of_requests(requests)
    assert batch.requests() == requests and batch.entry_ids == [0, 1, 2, 3] and batch.lacs == [-1, 0, 1, 2]
    part = batch.take([3, 1])
    assert part.requests() == [requests[3], requests[1]] and part.ledger_ids == [9, 9]
    assert part.entry_ids == [3, 1] and part.lacs == [2, 0]
    joined = AddBatch.concat([batch.take([0]), part])
    assert joined.requests() == [requests[0], requests[3], requests[1]] and joined.lacs == [-1, 2, 0]
    assert AddBatch.concat([batch]) is batch  # one batch is passed on as it is
