"""Every error Vellum raises, with BookKeeper's client codes and wire status codes.

One exception class per BookKeeper client code (``BKException.Code``), each with ``code`` and
``retryable``.  Wire status codes (v2 binary protocol ``EOK``..``EUNKNOWNLEDGERSTATE``) map to
client codes and back through one table, so a bookie answer becomes the same exception on every
path.  This module imports nothing from the project.
"""

from __future__ import annotations

from typing import ClassVar


class VellumError(Exception):
    """Base of all Vellum errors. ``code`` is BookKeeper's client code."""

    code: ClassVar[int] = -999
    retryable: ClassVar[bool] = False

    def __init__(self, message: str = "") -> None:
        super().__init__(message or self.__class__.__doc__ or self.__class__.__name__)


class ReadError(VellumError):
    """Error while reading from a bookie."""

    code = -1
    retryable = True


class QuorumError(VellumError):
    """Not enough bookies answered to form a quorum."""

    code = -2
    retryable = True


class NoBookieAvailableError(VellumError):
    """No bookie available."""

    code = -3
    retryable = True


class DigestNotInitializedError(VellumError):
    """Digest manager not initialised."""

    code = -4


class DigestMismatchError(VellumError):
    """Entry digest does not match its contents."""

    code = -5


class NotEnoughBookiesError(VellumError):
    """Not enough writable bookies to form an ensemble."""

    code = -6
    retryable = True


class NoSuchLedgerError(VellumError):
    """No such ledger."""

    code = -7


class BookieHandleNotAvailableError(VellumError):
    """Bookie connection not available."""

    code = -8
    retryable = True


class MetadataStoreUnavailableError(VellumError):
    """The metadata store (ZooKeeper or the embedded store) failed or cannot be reached."""

    code = -9
    retryable = True


class LedgerRecoveryError(VellumError):
    """Ledger recovery failed."""

    code = -10
    retryable = True


class LedgerClosedError(VellumError):
    """The ledger is closed."""

    code = -11


class WriteError(VellumError):
    """Write to bookies failed."""

    code = -12
    retryable = True


class NoSuchEntryError(VellumError):
    """No such entry."""

    code = -13


class EntriesShrunkError(NoSuchEntryError):
    """The entry is below the named ledger's start: it was shrunk away.

    Vellum's own (named ledgers); BookKeeper's code for it is that of "no such entry".
    """


class IncorrectParameterError(VellumError, ValueError):
    """Incorrect parameter."""

    code = -14


class InterruptedError_(VellumError):
    """Operation interrupted."""

    code = -15


class ProtocolVersionError(VellumError):
    """Unsupported protocol version."""

    code = -16


class MetadataVersionError(VellumError):
    """The metadata changed since it was read (compare-and-set conflict)."""

    code = -17
    retryable = True


class MetaStoreError(VellumError):
    """Metadata store error (corrupt, foreign or newer-format data)."""

    code = -18


class ClientClosedError(VellumError):
    """The client is closed."""

    code = -19


class LedgerExistsError(VellumError):
    """The ledger already exists."""

    code = -20


class AddEntryQuorumTimeoutError(VellumError):
    """Add did not reach its ack quorum in time."""

    code = -21
    retryable = True


class DuplicateEntryIdError(VellumError):
    """Entry id already written."""

    code = -22


class TimeoutError_(VellumError):
    """Operation timed out."""

    code = -23
    retryable = True


class SecurityError(VellumError):
    """Security error."""

    code = -24


class NoSuchLedgerOnMetadataServerError(VellumError):
    """The ledger does not exist in the metadata store."""

    code = -25


class OperationRejectedError(VellumError):
    """Operation rejected (back-pressure)."""

    code = -26
    retryable = True


class IllegalOpError(VellumError):
    """Illegal operation."""

    code = -100


class LedgerFencedError(VellumError):
    """The ledger is fenced: another writer opened it with recovery."""

    code = -101


class UnauthorizedAccessError(VellumError):
    """Wrong password (master key mismatch)."""

    code = -102


class UnclosedFragmentError(VellumError):
    """Attempt to replicate an unclosed fragment."""

    code = -103


class WriteOnReadOnlyBookieError(VellumError):
    """Write sent to a read-only bookie."""

    code = -104
    retryable = True


class TooManyRequestsError(VellumError):
    """The bookie has too many requests in progress."""

    code = -105
    retryable = True


class LedgerIdOverflowError(VellumError):
    """Ledger id space exhausted."""

    code = -106


class BadRequestError(VellumError):
    """Malformed or unsupported request."""

    code = -107


class UnknownLedgerStateError(VellumError):
    """The bookie cannot tell whether it holds the ledger (e.g. index in doubt)."""

    code = -108
    retryable = True


class ReplicationError(VellumError):
    """Replication failed."""

    code = -200
    retryable = True


class UnexpectedConditionError(VellumError):
    """Unexpected condition."""

    code = -999


# Errors raised by the storage layer that are not BookKeeper client codes but still need a
# stable identity. They carry -999 (unexpected) as their code: a bookie answers EIO for them.


class CorruptionError(VellumError):
    """On-disk data is corrupt. The message names the file and offset."""


class StorageError(VellumError):
    """I/O failure in the storage engine (fail-stop: nothing is acknowledged after it)."""


class DiskFullError(StorageError):
    """No writable ledger directory has room."""

    code = -104
    retryable = True


class CookieError(VellumError):
    """A bookie's directories do not match its cookie (wiped, swapped or foreign disk)."""


class ConfigError(VellumError, ValueError):
    """Invalid configuration."""

    code = -14


class UnknownFormatVersionError(CorruptionError):
    """A file or record was written by an unknown (newer) format version."""


class CorruptEntryError(CorruptionError):
    """A stored entry read back from an entry log fails its checks (digest, stored ids, size).
    A bookie answers EIO, never "no such entry": it had the entry, and another replica still may."""


class FramingError(VellumError):
    """A wire frame is malformed; the connection's framing can no longer be trusted."""

    code = -107


# ---------------------------------------------------------------------------------------------
# Code tables

_CLIENT_CODES: dict[int, type[VellumError]] = {}
for _cls in (
    ReadError,
    QuorumError,
    NoBookieAvailableError,
    DigestNotInitializedError,
    DigestMismatchError,
    NotEnoughBookiesError,
    NoSuchLedgerError,
    BookieHandleNotAvailableError,
    MetadataStoreUnavailableError,
    LedgerRecoveryError,
    LedgerClosedError,
    WriteError,
    NoSuchEntryError,
    IncorrectParameterError,
    InterruptedError_,
    ProtocolVersionError,
    MetadataVersionError,
    MetaStoreError,
    ClientClosedError,
    LedgerExistsError,
    AddEntryQuorumTimeoutError,
    DuplicateEntryIdError,
    TimeoutError_,
    SecurityError,
    NoSuchLedgerOnMetadataServerError,
    OperationRejectedError,
    IllegalOpError,
    LedgerFencedError,
    UnauthorizedAccessError,
    UnclosedFragmentError,
    WriteOnReadOnlyBookieError,
    TooManyRequestsError,
    LedgerIdOverflowError,
    BadRequestError,
    UnknownLedgerStateError,
    ReplicationError,
    UnexpectedConditionError,
):
    _CLIENT_CODES[_cls.code] = _cls

# v2 wire status codes (BookieProtocol): EOK=0, ENOLEDGER=1, ENOENTRY=2, EBADREQ=100, EIO=101,
# EUA=102, EBADVERSION=103, EFENCED=104, EREADONLY=105, ETOOMANYREQUESTS=106,
# EUNKNOWNLEDGERSTATE=107.
EOK = 0
ENOLEDGER = 1
ENOENTRY = 2
EBADREQ = 100
EIO = 101
EUA = 102
EBADVERSION = 103
EFENCED = 104
EREADONLY = 105
ETOOMANYREQUESTS = 106
EUNKNOWNLEDGERSTATE = 107
#: Vellum's own status (not BookKeeper's): the bookie failed unexpectedly serving the request (a
#: bug, logged and counted there), not a disk error; a client treats it as it treats EIO
#: (another replica). Outside BookKeeper's 100..107 and clear of codes it may add next.
EINTERNAL = 199

WIRE_STATUS_NAMES: dict[int, str] = {
    EOK: "EOK",
    ENOLEDGER: "ENOLEDGER",
    ENOENTRY: "ENOENTRY",
    EBADREQ: "EBADREQ",
    EIO: "EIO",
    EUA: "EUA",
    EBADVERSION: "EBADVERSION",
    EFENCED: "EFENCED",
    EREADONLY: "EREADONLY",
    ETOOMANYREQUESTS: "ETOOMANYREQUESTS",
    EUNKNOWNLEDGERSTATE: "EUNKNOWNLEDGERSTATE",
    EINTERNAL: "EINTERNAL",
}

# One table, both directions: wire status <-> exception class.
_WIRE_TO_ERROR: dict[int, type[VellumError]] = {
    ENOLEDGER: NoSuchLedgerError,
    ENOENTRY: NoSuchEntryError,
    EBADREQ: BadRequestError,
    EIO: ReadError,
    EUA: UnauthorizedAccessError,
    EBADVERSION: ProtocolVersionError,
    EFENCED: LedgerFencedError,
    EREADONLY: WriteOnReadOnlyBookieError,
    ETOOMANYREQUESTS: TooManyRequestsError,
    EUNKNOWNLEDGERSTATE: UnknownLedgerStateError,
}
_ERROR_TO_WIRE: dict[type[VellumError], int] = {cls: st for st, cls in _WIRE_TO_ERROR.items()}
_ERROR_TO_WIRE[FramingError] = EBADREQ
_ERROR_TO_WIRE[IncorrectParameterError] = EBADREQ
_ERROR_TO_WIRE[DiskFullError] = EREADONLY
_ERROR_TO_WIRE[OperationRejectedError] = ETOOMANYREQUESTS


def error_for_code(code: int, message: str = "") -> VellumError:
    """Build the exception for a BookKeeper client code (unknown codes -> UnexpectedConditionError)."""
    cls = _CLIENT_CODES.get(code, UnexpectedConditionError)
    return cls(message)


def error_for_wire_status(status: int, message: str = "") -> VellumError:
    """Build the exception a client raises for a non-OK wire status."""
    if status == EOK:
        raise ValueError("EOK is not an error")
    cls = _WIRE_TO_ERROR.get(status, ReadError)
    name = WIRE_STATUS_NAMES.get(status, f"status {status}")
    return cls(f"{message} ({name})" if message else f"bookie answered {name}")


def wire_status_for(exc: BaseException) -> int:
    """The wire status a bookie answers for an exception (anything unknown -> EIO)."""
    for cls in type(exc).__mro__:
        status = _ERROR_TO_WIRE.get(cls)  # type: ignore[call-overload]
        if status is not None:
            return status
    return EIO
