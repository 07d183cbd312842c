"""One table maps BookKeeper codes and wire statuses to exception classes, both ways."""

from __future__ import annotations

import pytest

from vellum import errors as E


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (E.ENOLEDGER, E.NoSuchLedgerError),
        (E.ENOENTRY, E.NoSuchEntryError),
        (E.EBADREQ, E.BadRequestError),
        (E.EUA, E.UnauthorizedAccessError),
        (E.EFENCED, E.LedgerFencedError),
        (E.EREADONLY, E.WriteOnReadOnlyBookieError),
        (E.ETOOMANYREQUESTS, E.TooManyRequestsError),
        (E.EUNKNOWNLEDGERSTATE, E.UnknownLedgerStateError),
    ],
)
def test_wire_status_round_trip(status: int, cls: type[E.VellumError]) -> None:
    exc = E.error_for_wire_status(status, "ledger 7")
    assert type(exc) is cls
    assert "ledger 7" in str(exc)
    assert E.wire_status_for(exc) == status


def test_client_codes_are_bookkeepers() -> None:
    assert E.LedgerFencedError.code == -101
    assert E.NoSuchLedgerError.code == -7
    assert E.MetadataVersionError.code == -17
    assert type(E.error_for_code(-101)) is E.LedgerFencedError
    assert type(E.error_for_code(12345)) is E.UnexpectedConditionError


def test_unknown_exceptions_answer_eio() -> None:
    assert E.wire_status_for(RuntimeError("boom")) == E.EIO
    assert E.wire_status_for(E.DiskFullError("full")) == E.EREADONLY


def test_eok_is_not_an_error() -> None:
    with pytest.raises(ValueError):
        E.error_for_wire_status(E.EOK)
