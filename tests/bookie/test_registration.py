"""``BookieRegistration`` alone, over a recording registration manager: the registration ends
equal to the state whatever changes while a write waits or fails. (The real-process test is
``tests/server/test_registration_follows_state.py``.)"""

from __future__ import annotations

import threading
import time
from typing import Any

from vellum.bookie.registration import BookieRegistration
from vellum.errors import MetadataStoreUnavailableError
from vellum.ids import BookieId

BID = BookieId("127.0.0.1:3181")


class RecordingRegistration:
    """The part of ``RegistrationManager`` a ``BookieRegistration`` uses; each write can be
    held (``gate``) or made to fail (``failures``)."""

    def __init__(self) -> None:
        self.writes: list[bool] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.failures = 0

    def register_bookie(self, bookie_id: BookieId, *, read_only: bool = False, data: bytes = b"") -> None:
        self.entered.set()
        assert self.gate.wait(10)
        if self.failures:
            self.failures -= 1
            raise MetadataStoreUnavailableError("store away")
        self.writes.append(read_only)


def wait_for(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + 10
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_a_change_while_the_first_registration_waits_is_written_after_it() -> None:
    reg = RecordingRegistration()
    state = {"ro": True}
    r = BookieRegistration(reg, BID, is_read_only=lambda: state["ro"])  # type: ignore[arg-type]
    reg.gate.clear()  # the predecessor's registration has not lapsed yet
    first = threading.Thread(target=r.register)
    first.start()
    assert reg.entered.wait(10)
    state["ro"] = False  # the disk is freed meanwhile...
    r.state_changed(False)
    reg.gate.set()
    first.join(10)
    try:
        assert reg.writes == [True, False]  # ...and the stale write is corrected at once
        assert r.registered_read_only is False
    finally:
        r.close()


def test_changes_are_followed_and_a_failed_write_is_retried() -> None:
    reg = RecordingRegistration()
    state = {"ro": False}
    r = BookieRegistration(reg, BID, is_read_only=lambda: state["ro"], retry_s=0.05)  # type: ignore[arg-type]
    r.register()
    try:
        reg.failures = 2
        state["ro"] = True
        r.state_changed(True)
        wait_for(lambda: reg.writes == [False, True], "read-only written after two failures")
        r.state_changed(True)  # no change: nothing written
        state["ro"] = False
        r.session_restored()
        wait_for(lambda: reg.writes == [False, True, False], "writable written")
    finally:
        r.close()


def test_nothing_is_written_after_close() -> None:
    reg = RecordingRegistration()
    state = {"ro": False}
    r = BookieRegistration(reg, BID, is_read_only=lambda: state["ro"])  # type: ignore[arg-type]
    r.register()
    r.close()
    state["ro"] = True
    r.state_changed(True)
    time.sleep(0.1)
    assert reg.writes == [False]
